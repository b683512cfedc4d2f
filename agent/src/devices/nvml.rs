//! Real GPUs through NVML (nvml-wrapper loads `libnvidia-ml.so.1` at run time, so the agent
//! builds and runs on machines without it).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use nvml_wrapper::{
    Nvml,
    enum_wrappers::device::Sampling,
    enums::device::{SampleValue, UsedGpuMemory},
    error::NvmlError,
};

use super::{GpuBackend, GpuDevice, ProcessMemory};
use crate::enforcement::throttle::{
    UsageSource,
    sampled::{DeviceSample, DriverError, ProcessSample, SampleDriver, SampledSource},
};

/// GPUs NVML lists.
pub struct NvmlBackend {
    devices: Vec<GpuDevice>,
    /// NVML's index of each GPU, by the GPU's minor number (our index).
    nvml_index: HashMap<u32, u32>,
    nvml: Arc<Nvml>,
}

impl NvmlBackend {
    /// Initialises NVML and lists the GPUs.
    ///
    /// # Errors
    /// NVML can't be loaded or initialised.
    pub fn probe() -> Result<Self, NvmlError> {
        let nvml = Nvml::init()?;
        let count = nvml.device_count()?;
        let mut devices = Vec::new();
        let mut nvml_index = HashMap::new();
        for i in 0..count {
            let d = nvml.device_by_index(i)?;
            let index = d.minor_number().unwrap_or(i);
            nvml_index.insert(index, i);
            devices.push(GpuDevice {
                uuid: d.uuid()?,
                model: d.name().unwrap_or_else(|_| "NVIDIA GPU".to_owned()),
                memory_bytes: d.memory_info()?.total,
                numa_node: d
                    .numa_node_id()
                    .ok()
                    .and_then(|n| i32::try_from(n).ok())
                    .unwrap_or(-1),
                sm_count: 0,
                is_mig: false,
                index,
                device_node: format!("/dev/nvidia{index}"),
            });
        }
        Ok(Self {
            devices,
            nvml_index,
            nvml: Arc::new(nvml),
        })
    }
}

impl GpuBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn devices(&self) -> &[GpuDevice] {
        &self.devices
    }

    fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    fn process_memory(&self) -> Vec<ProcessMemory> {
        let mut out = Vec::new();
        for (&index, &nvml_index) in &self.nvml_index {
            let Ok(device) = self.nvml.device_by_index(nvml_index) else {
                continue;
            };
            let compute = device.running_compute_processes().unwrap_or_default();
            let graphics = device.running_graphics_processes().unwrap_or_default();
            for p in compute.into_iter().chain(graphics) {
                if let UsedGpuMemory::Used(bytes) = p.used_gpu_memory {
                    out.push(ProcessMemory {
                        index,
                        pid: p.pid,
                        bytes,
                    });
                }
            }
        }
        out
    }

    fn utilization(&self) -> Option<std::collections::BTreeMap<u32, f64>> {
        // A GPU NVML can't read this time is left out (reported as unknown), not zero.
        Some(
            self.nvml_index
                .iter()
                .filter_map(|(&index, &nvml_index)| {
                    let rates = self
                        .nvml
                        .device_by_index(nvml_index)
                        .ok()?
                        .utilization_rates()
                        .ok()?;
                    Some((index, f64::from(rates.gpu.min(100)) / 100.0))
                })
                .collect(),
        )
    }

    fn usage_source(&self, cgroup_root: &Path) -> Option<Box<dyn UsageSource>> {
        Some(Box::new(NvmlUsage::new(NvmlSamples {
            nvml: Arc::clone(&self.nvml),
            nvml_index: self.nvml_index.clone(),
            cgroup_root: cgroup_root.to_owned(),
        })))
    }
}

/// NVML as the throttle's [`SampleDriver`]: each GPU's device utilization samples and its
/// per-process SM utilization samples (see [`crate::enforcement::throttle::sampled`] for how they
/// become each cgroup's busy time).
pub struct NvmlSamples {
    nvml: Arc<Nvml>,
    nvml_index: HashMap<u32, u32>,
    cgroup_root: PathBuf,
}

/// The throttle's usage signal on real GPUs: each GPU's busy time from NVML's device utilization
/// samples, apportioned among the processes NVML reports active in each sample period by their
/// SM utilization, and summed per cgroup.
pub type NvmlUsage = SampledSource<NvmlSamples>;

impl NvmlSamples {
    fn device(&self, gpu: u32) -> Result<nvml_wrapper::Device<'_>, DriverError> {
        let index = self
            .nvml_index
            .get(&gpu)
            .ok_or_else(|| DriverError::Other(format!("no GPU {gpu}")))?;
        self.nvml.device_by_index(*index).map_err(driver_error)
    }
}

fn driver_error(e: NvmlError) -> DriverError {
    match e {
        NvmlError::NotSupported => DriverError::NotSupported,
        e => DriverError::Other(e.to_string()),
    }
}

impl SampleDriver for NvmlSamples {
    fn device_samples(
        &mut self,
        gpu: u32,
        last_seen_us: u64,
    ) -> Result<Vec<DeviceSample>, DriverError> {
        match self
            .device(gpu)?
            .samples(Sampling::GpuUtilization, last_seen_us)
        {
            Ok(samples) => Ok(samples
                .iter()
                .map(|s| DeviceSample {
                    timestamp_us: s.timestamp,
                    util_percent: percent(&s.value),
                })
                .collect()),
            // No samples newer than the last seen.
            Err(NvmlError::NotFound) => Ok(Vec::new()),
            Err(e) => Err(driver_error(e)),
        }
    }

    fn process_samples(
        &mut self,
        gpu: u32,
        last_seen_us: u64,
    ) -> Result<Vec<ProcessSample>, DriverError> {
        match self.device(gpu)?.process_utilization_stats(last_seen_us) {
            Ok(samples) => Ok(samples
                .iter()
                .map(|s| ProcessSample {
                    pid: s.pid,
                    timestamp_us: s.timestamp,
                    sm_util_percent: s.sm_util,
                })
                .collect()),
            Err(NvmlError::NotFound) => Ok(Vec::new()),
            Err(e) => Err(driver_error(e)),
        }
    }

    fn now(&self) -> (Instant, u64) {
        (Instant::now(), realtime_us())
    }

    fn cgroup_of(&self, pid: u32) -> Option<PathBuf> {
        cgroup_dir_of(&self.cgroup_root, pid)
    }

    fn cgroup_exists(&self, dir: &Path) -> bool {
        dir.is_dir()
    }
}

/// A sample's value as a percentage.
fn percent(value: &SampleValue) -> u32 {
    let v = match *value {
        SampleValue::U32(v) => u64::from(v),
        SampleValue::U64(v) => v,
        SampleValue::I64(v) => u64::try_from(v).unwrap_or(0),
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "clamped to 0..=100"
        )]
        SampleValue::F64(v) => v.clamp(0.0, 100.0).round() as u64,
    };
    u32::try_from(v.min(100)).unwrap_or(100)
}

/// NVML stamps its samples with the CPU's real time (µs since the epoch).
fn realtime_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The cgroup v2 directory of a process.
fn cgroup_dir_of(root: &Path, pid: u32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(root.join(rel.trim().trim_start_matches('/')))
}
