//! The node's GPUs, behind one trait with two backends: NVML on real machines, and mock devices
//! from a TOML file where there is no GPU.
//!
//! Each backend declares the slot types it provides (`cuda.device`, `cuda.shares`, `cuda.mem`);
//! the agent offers them to the controller at registration and accepts allocations only of
//! slots it knows.

pub mod changes;
pub mod health;
pub mod mig;
pub mod mock;
pub mod nvml;
pub mod ondemand;
pub mod placement;
pub mod samples;

use std::path::Path;

use serde::Serialize;

use self::samples::SampleDriver;

/// A GPU (or MIG instance): what the node offers as one device.
///
/// A GPU in MIG mode is not one: its instances are, each with `mig` set and an index of its own
/// (after every physical GPU's minor); their `device_node` is the parent's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuDevice {
    /// UUID.
    pub uuid: String,
    /// Model name.
    pub model: String,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// NUMA node (-1 when unknown).
    pub numa_node: i32,
    /// Streaming multiprocessors (0 when unknown).
    pub sm_count: u32,
    /// A MIG instance.
    pub is_mig: bool,
    /// Index on the node.
    pub index: u32,
    /// The device node the eBPF side watches.
    pub device_node: String,
    /// Where the device is a MIG instance: its place on its parent GPU.
    pub mig: Option<mig::MigInstance>,
}

impl GpuDevice {
    /// The minor of the `/dev/nvidia<N>` node a process opens to use the device: its own index,
    /// or a MIG instance's parent's.
    #[must_use]
    pub fn node_minor(&self) -> u32 {
        self.mig.as_ref().map_or(self.index, |m| m.parent_index)
    }
}

/// GPU memory one process holds on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory {
    /// GPU index (`nvidiaN`).
    pub index: u32,
    /// The process.
    pub pid: u32,
    /// Bytes.
    pub bytes: u64,
}

/// A device's memory as its driver counts it (NVML's `nvmlMemory_v2_t`; on a MIG instance,
/// that instance's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverMemory {
    /// Allocated memory, bytes: every process's, including those the agent does not see, and
    /// the driver's own.
    pub used: u64,
    /// Memory reserved for the driver or firmware, bytes (part of `used` by NVML's R525 notes;
    /// later references do not say).
    pub reserved: u64,
}

pub use gpuwarden_types::slot::SlotKind;

/// A source of GPUs.
pub trait GpuBackend: Send + Sync {
    /// Backend name for logs (`nvml`, `mock`, `none`).
    fn name(&self) -> &'static str;
    /// The devices.
    fn devices(&self) -> Vec<GpuDevice>;
    /// GPU memory each process holds, as the driver's management library counts it (NVML), on
    /// the device index the driver counts it on (a process on a MIG instance on the instance's);
    /// empty where the backend can't tell (mock devices).
    fn process_memory(&self) -> Vec<ProcessMemory> {
        Vec::new()
    }

    /// Each device's memory as the driver counts it, by index (a whole GPU's, a MIG instance's);
    /// empty where the backend can't tell (mock devices). Beside the kernel side's count it shows
    /// what the agent does not see.
    fn driver_memory(&self) -> std::collections::BTreeMap<u32, DriverMemory> {
        std::collections::BTreeMap::new()
    }

    /// The device indexes the driver counts a process on: a GPU, a MIG instance, or a GPU in
    /// MIG mode's own index where the driver names no instance (or can't list them). Checked
    /// before a MIG layout change ([`ondemand::Reconfigurer`]); by default the indexes of
    /// [`Self::process_memory`].
    fn busy_devices(&self) -> std::collections::BTreeSet<u32> {
        self.process_memory().iter().map(|p| p.index).collect()
    }

    /// Each GPU's utilization (`0..=1`, by index) as the driver measures it; `None` where the
    /// backend can't tell (mock devices), and then the throttle's stand-in is reported instead.
    fn utilization(&self) -> Option<std::collections::BTreeMap<u32, f64>> {
        None
    }

    /// The driver's own utilization samples for these GPUs, which the compute-share throttle
    /// turns into its usage signal; `None` where the backend has none (mock devices: the
    /// throttle falls back to its CPU-time stand-in). Processes' cgroups are read under
    /// `cgroup_root`.
    fn sample_driver(&self, _cgroup_root: &std::path::Path) -> Option<Box<dyn SampleDriver>> {
        None
    }

    /// Capacity of slots other than the GPU ones (those follow from [`Self::devices`]), as
    /// exact decimal strings.
    fn extra_capacity(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// The GPU driver's version as the driver reports it (`580.159`); `None` where the backend
    /// can't tell (mock devices). Published in the DRA ResourceSlice.
    fn driver_version(&self) -> Option<String> {
        None
    }

    /// Each GPU's health (state, errors, power, energy, memory utilization) as far as the
    /// backend can read it; empty where it reads none.
    fn health(&self) -> Vec<health::GpuHealth> {
        Vec::new()
    }

    /// The major of the MIG capability nodes (`/dev/nvidia-caps/nvidia-cap<N>`), where the node
    /// has them: the device-access program then lets a quota on an instance open only that
    /// instance's.
    fn caps_major(&self) -> Option<u32> {
        None
    }

    /// Each GPU in MIG mode whose layout the backend can read and change: its UUID, its index
    /// and its instances' placements (issue 37 §3). None by default (mock GPUs without MIG,
    /// no GPUs); NVML reports the GPUs whose driver's profile table agrees with the placement
    /// rules ([`nvml::layout::compare`]).
    fn mig_layouts(&self) -> Vec<(String, u32, placement::Layout)> {
        Vec::new()
    }

    /// Creates a GPU instance of `profile` at memory slice `start` of GPU `gpu` (a UUID) and a
    /// compute instance of the whole of it; the new device, listed by [`Self::devices`] from
    /// then on. Callers go through [`ondemand::Reconfigurer`], which checks the operator's
    /// list and that no process is on the GPU.
    ///
    /// # Errors
    /// The backend can't, or the driver refuses (a placement taken or not allowed).
    fn create_instance(
        &self,
        _gpu: &str,
        _profile: &str,
        _start: u32,
    ) -> Result<GpuDevice, ondemand::MigChangeError> {
        Err(ondemand::MigChangeError::Unsupported {
            backend: self.name(),
        })
    }

    /// Destroys the MIG instance `uuid` (its compute instance, then its GPU instance).
    ///
    /// # Errors
    /// The backend can't, or the driver refuses (a process in it).
    fn destroy_instance(&self, _uuid: &str) -> Result<(), ondemand::MigChangeError> {
        Err(ondemand::MigChangeError::Unsupported {
            backend: self.name(),
        })
    }

    /// The slot types the backend provides.
    /// Each MIG profile among the devices is a slot type of its own (`cuda.mig.1g.18gb`, see
    /// [`mig::slot_name`]), which the controller merges into the types it knows.
    fn slot_types(&self) -> Vec<(String, SlotKind)> {
        if self.devices().is_empty() {
            return Vec::new();
        }
        gpuwarden_types::slot::names::GPU_SLOTS
            .iter()
            .map(|&(name, kind)| (name.to_owned(), kind))
            .chain(
                mig::slot_capacity(&self.devices())
                    .into_iter()
                    .map(|(name, _)| (name, SlotKind::Count)),
            )
            .collect()
    }
}

/// No GPUs: the node offers CPU and memory only.
#[derive(Debug, Default)]
pub struct NoGpus;

impl GpuBackend for NoGpus {
    fn name(&self) -> &'static str {
        "none"
    }

    fn devices(&self) -> Vec<GpuDevice> {
        Vec::new()
    }
}

/// Errors finding devices.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The mock device file is unusable.
    #[error(transparent)]
    Mock(#[from] mock::MockError),
}

/// The mock file if one is given, else NVML if it finds GPUs, else no GPUs, logging which.
///
/// # Errors
/// The mock file is given but unusable.
pub fn discover(mock_file: Option<&Path>) -> Result<Box<dyn GpuBackend>, DeviceError> {
    if let Some(path) = mock_file {
        let backend = mock::MockBackend::from_file(path)?;
        tracing::info!(devices = backend.devices().len(), file = %path.display(), "using mock GPUs");
        return Ok(Box::new(backend));
    }
    match nvml::NvmlBackend::probe() {
        Ok(backend) if !backend.devices().is_empty() => {
            tracing::info!(devices = backend.devices().len(), "using NVML GPUs");
            Ok(Box::new(backend))
        }
        Ok(_) => {
            tracing::warn!("NVML found no GPUs: this node offers no GPU slots");
            Ok(Box::new(NoGpus))
        }
        Err(e) => {
            tracing::warn!(
                "no NVML ({e}) and no --mock-devices file: this node offers no GPU slots"
            );
            Ok(Box::new(NoGpus))
        }
    }
}
