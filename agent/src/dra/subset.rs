//! The controller's share of the node's GPUs when some are offered to Kubernetes.

use std::sync::Arc;

use crate::devices::{GpuBackend, GpuDevice, ondemand::MigChangeError, placement::Layout};

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
}

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
        let devices = self.devices();
        self.inner
            .process_memory()
            .into_iter()
            .filter(|p| devices.iter().any(|g| g.index == p.index))
            .collect()
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
    use crate::devices::mock::MockBackend;

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
