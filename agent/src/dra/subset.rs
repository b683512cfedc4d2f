//! The controller's share of the node's GPUs when some are offered to Kubernetes.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::Arc,
};

use crate::devices::{
    DriverMemory, GpuBackend, GpuDevice, health::GpuHealth, ondemand::MigChangeError,
    placement::Layout, samples::SampleDriver,
};

/// A backend that shows only some of another's GPUs: the controller sees the GPUs not offered
/// to Kubernetes, so no GPU is offered to both. Its devices are the inner backend's as they are
/// now (an instance made on demand appears), and the MIG layouts it may change are those of the
/// GPUs it keeps (issue 37 §3).
pub struct Subset {
    inner: Arc<dyn GpuBackend>,
    /// The devices kept.
    keep: KeepDevice,
    /// The GPUs in MIG mode kept, by UUID and index (no device themselves).
    keep_gpu: KeepGpu,
}

type KeepDevice = Box<dyn Fn(&GpuDevice) -> bool + Send + Sync>;
type KeepGpu = Box<dyn Fn(&str, u32) -> bool + Send + Sync>;

impl Subset {
    /// The GPUs of `inner` that `dra` does not offer to Kubernetes: the controller's.
    #[must_use]
    pub fn not_offered(inner: Arc<dyn GpuBackend>, dra: &super::config::DraConfig) -> Self {
        let (devices, gpus) = (dra.clone(), dra.clone());
        Self::new(
            inner,
            move |g| !devices.offers(g),
            move |uuid, index| !gpus.offers_gpu(uuid, index),
        )
    }

    /// The devices of `inner` that `keep` keeps, and the MIG layouts of the GPUs `keep_gpu`
    /// keeps.
    #[must_use]
    pub fn new(
        inner: Arc<dyn GpuBackend>,
        keep: impl Fn(&GpuDevice) -> bool + Send + Sync + 'static,
        keep_gpu: impl Fn(&str, u32) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self {
            inner,
            keep: Box::new(keep),
            keep_gpu: Box::new(keep_gpu),
        }
    }

    /// The indexes of the devices kept now.
    fn kept(&self) -> BTreeSet<u32> {
        self.devices().iter().map(|g| g.index).collect()
    }
}

// Every method of `GpuBackend` the inner backend answers is forwarded, narrowed to the devices
// kept where its answer is by device; `slot_types` keeps its default, which follows from the
// devices kept (the inner backend's would name MIG profiles of GPUs not kept).

impl GpuBackend for Subset {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn devices(&self) -> Vec<GpuDevice> {
        self.inner
            .devices()
            .into_iter()
            .filter(|g| (self.keep)(g))
            .collect()
    }

    fn process_memory(&self) -> Vec<crate::devices::ProcessMemory> {
        let kept = self.kept();
        self.inner
            .process_memory()
            .into_iter()
            .filter(|p| kept.contains(&p.index))
            .collect()
    }

    fn driver_memory(&self) -> BTreeMap<u32, DriverMemory> {
        let kept = self.kept();
        let mut all = self.inner.driver_memory();
        all.retain(|index, _| kept.contains(index));
        all
    }

    fn utilization(&self) -> Option<BTreeMap<u32, f64>> {
        let kept = self.kept();
        let mut all = self.inner.utilization()?;
        all.retain(|index, _| kept.contains(index));
        Some(all)
    }

    fn sample_driver(&self, cgroup_root: &Path) -> Option<Box<dyn SampleDriver>> {
        // Asked GPU by GPU: the caller asks only of the GPUs it was given.
        self.inner.sample_driver(cgroup_root)
    }

    fn health(&self) -> Vec<GpuHealth> {
        let kept = self.kept();
        let mut all = self.inner.health();
        all.retain(|h| kept.contains(&h.index));
        all
    }

    fn caps_major(&self) -> Option<u32> {
        // The node's, whichever GPUs are kept.
        self.inner.caps_major()
    }

    fn extra_capacity(&self) -> Vec<(String, String)> {
        self.inner.extra_capacity()
    }

    fn driver_version(&self) -> Option<String> {
        self.inner.driver_version()
    }

    fn busy_devices(&self) -> std::collections::BTreeSet<u32> {
        // A layout change asks of the GPUs kept; the inner backend answers for each index.
        self.inner.busy_devices()
    }

    fn mig_layouts(&self) -> Vec<(String, u32, Layout)> {
        self.inner
            .mig_layouts()
            .into_iter()
            .filter(|(uuid, index, _)| (self.keep_gpu)(uuid, *index))
            .collect()
    }

    fn create_instance(
        &self,
        gpu: &str,
        profile: &str,
        start: u32,
    ) -> Result<GpuDevice, MigChangeError> {
        // Only on a GPU kept: one offered to Kubernetes is not there for the controller.
        if !self.mig_layouts().iter().any(|(uuid, ..)| uuid == gpu) {
            return Err(MigChangeError::UnknownGpu {
                gpu: gpu.to_owned(),
            });
        }
        self.inner.create_instance(gpu, profile, start)
    }

    fn destroy_instance(&self, uuid: &str) -> Result<(), MigChangeError> {
        if !self.devices().iter().any(|g| g.uuid == uuid) {
            return Err(MigChangeError::UnknownGpu {
                gpu: uuid.to_owned(),
            });
        }
        self.inner.destroy_instance(uuid)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::devices::{
        health::HealthState,
        mock::MockBackend,
        samples::{DeviceSample, DriverError, ProcessSample},
    };

    /// The two whole mock GPUs of `deploy/mock-devices.toml` (0 and 1), whose backend answers
    /// every question the trait has a default for, each answer naming the GPU it is about.
    struct Answering(MockBackend);

    impl Answering {
        fn new() -> Self {
            let file = include_str!("../../../deploy/mock-devices.toml");
            Self(MockBackend::from_toml(file, Path::new("m.toml")).unwrap())
        }
    }

    /// Samples of no GPU: only whether one is handed over is looked at.
    struct NoSamples;

    impl SampleDriver for NoSamples {
        fn device_samples(&mut self, _: u32, _: u64) -> Result<Vec<DeviceSample>, DriverError> {
            Ok(Vec::new())
        }

        fn process_samples(&mut self, _: u32, _: u64) -> Result<Vec<ProcessSample>, DriverError> {
            Ok(Vec::new())
        }

        fn now(&self) -> (std::time::Instant, u64) {
            (std::time::Instant::now(), 0)
        }

        fn cgroup_of(&self, _: u32) -> Option<std::path::PathBuf> {
            None
        }

        fn cgroup_exists(&self, _: &Path) -> bool {
            false
        }
    }

    impl GpuBackend for Answering {
        fn name(&self) -> &'static str {
            "answering"
        }

        fn devices(&self) -> Vec<GpuDevice> {
            self.0.devices()
        }

        fn driver_memory(&self) -> BTreeMap<u32, DriverMemory> {
            (0..2)
                .map(|i| {
                    let m = DriverMemory {
                        used: (u64::from(i) + 1) << 30,
                        reserved: 1 << 20,
                    };
                    (i, m)
                })
                .collect()
        }

        fn utilization(&self) -> Option<BTreeMap<u32, f64>> {
            Some(BTreeMap::from([(0, 0.25), (1, 0.75)]))
        }

        fn sample_driver(&self, _: &Path) -> Option<Box<dyn SampleDriver>> {
            Some(Box::new(NoSamples))
        }

        fn health(&self) -> Vec<GpuHealth> {
            (0..2)
                .map(|index| GpuHealth {
                    index,
                    state: HealthState::Degraded,
                    ..GpuHealth::default()
                })
                .collect()
        }

        fn caps_major(&self) -> Option<u32> {
            Some(237)
        }
    }

    #[test]
    fn what_the_inner_backend_answers_is_answered_for_the_gpus_kept() {
        let inner: Arc<dyn GpuBackend> = Arc::new(Answering::new());
        let indexes: Vec<u32> = inner.devices().iter().map(|g| g.index).collect();
        assert_eq!(indexes, [0, 1]);
        let subset = Subset::new(Arc::clone(&inner), |g| g.index == 1, |_, index| index == 1);
        assert_eq!(
            subset.driver_memory(),
            BTreeMap::from([(1, inner.driver_memory()[&1])])
        );
        assert_eq!(subset.utilization(), Some(BTreeMap::from([(1, 0.75)])));
        let health: Vec<u32> = subset.health().iter().map(|h| h.index).collect();
        assert_eq!(health, [1]);
        assert_eq!(subset.caps_major(), inner.caps_major());
        assert!(subset.sample_driver(Path::new("/sys/fs/cgroup")).is_some());
        // The slot types follow from the devices kept.
        assert_eq!(subset.slot_types(), inner.slot_types());
    }

    /// GPU-0 whole, GPU-1 and GPU-2 in MIG mode (GPU-1 with the operator's 3g.71gb).
    const FILE: &str = include_str!("../../../deploy/mock-devices-mig-on-demand.toml");

    #[test]
    fn the_controller_cuts_only_the_gpus_not_offered_to_kubernetes() {
        let inner: Arc<dyn GpuBackend> =
            Arc::new(MockBackend::from_toml(FILE, Path::new("m.toml")).unwrap());
        let all: Vec<String> = inner.mig_layouts().into_iter().map(|(u, ..)| u).collect();
        assert_eq!(all, ["GPU-1", "GPU-2"]);
        // GPU-2 is Kubernetes': neither it nor what it holds is the controller's.
        let offered = |uuid: &str| uuid == "GPU-2";
        let subset = Subset::new(
            Arc::clone(&inner),
            move |g| !offered(g.mig.as_ref().map_or(&g.uuid, |m| &m.parent_uuid)),
            move |uuid, _| !offered(uuid),
        );
        let kept: Vec<String> = subset.mig_layouts().into_iter().map(|(u, ..)| u).collect();
        assert_eq!(kept, ["GPU-1"]);
        let before = inner.devices().len();
        assert!(matches!(
            subset.create_instance("GPU-2", "1g.18gb", 0),
            Err(MigChangeError::UnknownGpu { .. })
        ));
        assert_eq!(inner.devices().len(), before, "nothing made on GPU-2");

        // One made on GPU-1 is the controller's at once, and can be destroyed through it.
        let made = subset.create_instance("GPU-1", "1g.18gb", 0).unwrap();
        assert!(subset.devices().iter().any(|d| d.uuid == made.uuid));
        subset.destroy_instance(&made.uuid).unwrap();
        assert!(!inner.devices().iter().any(|d| d.uuid == made.uuid));
    }
}
