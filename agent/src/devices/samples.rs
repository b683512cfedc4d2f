//! What a GPU's driver samples of its own activity (NVML's device and per-process utilization
//! samples), behind a trait the compute-share throttle reads its usage signal through: NVML on
//! real GPUs ([`super::nvml::NvmlSamples`]), a simulated GPU in tests.

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

/// One device-level utilization sample (`nvmlDeviceGetSamples`, `NVML_GPU_UTILIZATION_SAMPLES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSample {
    /// CPU timestamp, µs.
    pub timestamp_us: u64,
    /// Percent of the sample period during which one or more kernels ran.
    pub util_percent: u32,
}

/// One process utilization sample (`nvmlDeviceGetProcessUtilization`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessSample {
    /// The process.
    pub pid: u32,
    /// CPU timestamp, µs.
    pub timestamp_us: u64,
    /// SM (3D/compute) utilization percent over the sample period.
    pub sm_util_percent: u32,
}

/// Why a driver could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The GPU does not keep this kind of sample.
    #[error("not supported")]
    NotSupported,
    /// Any other failure (logged once per GPU).
    #[error("{0}")]
    Other(String),
}

/// Where samples come from: NVML on real GPUs, a simulated GPU in tests.
pub trait SampleDriver: Send {
    /// Device utilization samples of `gpu` newer than `last_seen_us`; empty when there are none
    /// (NVML's `NotFound`).
    ///
    /// # Errors
    /// The samples can't be read.
    fn device_samples(
        &mut self,
        gpu: u32,
        last_seen_us: u64,
    ) -> Result<Vec<DeviceSample>, DriverError>;

    /// Process utilization samples of `gpu` newer than `last_seen_us`; empty when there are none.
    ///
    /// # Errors
    /// The samples can't be read.
    fn process_samples(
        &mut self,
        gpu: u32,
        last_seen_us: u64,
    ) -> Result<Vec<ProcessSample>, DriverError>;

    /// Now, as an `Instant` and as the CPU time in µs that samples are stamped with.
    fn now(&self) -> (Instant, u64);

    /// The cgroup v2 directory process `pid` is in; `None` when it is gone.
    fn cgroup_of(&self, pid: u32) -> Option<PathBuf>;

    /// Whether the cgroup at `dir` exists.
    fn cgroup_exists(&self, dir: &Path) -> bool;
}

impl<D: SampleDriver + ?Sized> SampleDriver for Box<D> {
    fn device_samples(
        &mut self,
        gpu: u32,
        last_seen_us: u64,
    ) -> Result<Vec<DeviceSample>, DriverError> {
        (**self).device_samples(gpu, last_seen_us)
    }

    fn process_samples(
        &mut self,
        gpu: u32,
        last_seen_us: u64,
    ) -> Result<Vec<ProcessSample>, DriverError> {
        (**self).process_samples(gpu, last_seen_us)
    }

    fn now(&self) -> (Instant, u64) {
        (**self).now()
    }

    fn cgroup_of(&self, pid: u32) -> Option<PathBuf> {
        (**self).cgroup_of(pid)
    }

    fn cgroup_exists(&self, dir: &Path) -> bool {
        (**self).cgroup_exists(dir)
    }
}
