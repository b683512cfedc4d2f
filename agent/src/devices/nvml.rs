//! Real GPUs through NVML (nvml-wrapper loads `libnvidia-ml.so.1` at run time, so the agent
//! builds and runs on machines without it).

use std::{
    collections::HashMap,
    io,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use nvml_wrapper::{Nvml, error::NvmlError};

use nvml_wrapper::enums::device::UsedGpuMemory;

use super::{GpuBackend, GpuDevice, ProcessMemory};
use crate::enforcement::throttle::UsageSource;

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
        Some(Box::new(NvmlUsage {
            nvml: Arc::clone(&self.nvml),
            nvml_index: self.nvml_index.clone(),
            cgroup_root: cgroup_root.to_owned(),
            gpus: HashMap::new(),
        }))
    }
}

/// Don't ask NVML more often than this (it samples at a few Hz anyway).
const REFRESH: Duration = Duration::from_millis(50);

/// The longest gap one utilization sample is taken to cover.
const MAX_SAMPLE_US: u64 = 1_000_000;

/// The throttle's usage signal on real GPUs: NVML's per-process SM utilization, integrated over
/// time and summed per cgroup (a process's share is charged to the cgroup it is in when seen).
pub struct NvmlUsage {
    nvml: Arc<Nvml>,
    nvml_index: HashMap<u32, u32>,
    cgroup_root: PathBuf,
    gpus: HashMap<u32, GpuUsage>,
}

/// What has been read from one GPU.
#[derive(Default)]
struct GpuUsage {
    refreshed: Option<Instant>,
    last_timestamp: u64,
    pid_timestamp: HashMap<u32, u64>,
    /// Busy microseconds by cgroup directory.
    busy_us: HashMap<PathBuf, u64>,
}

impl NvmlUsage {
    fn refresh(&mut self, gpu: u32) {
        let usage = self.gpus.entry(gpu).or_default();
        if usage.refreshed.is_some_and(|t| t.elapsed() < REFRESH) {
            return;
        }
        usage.refreshed = Some(Instant::now());
        let Some(index) = self.nvml_index.get(&gpu) else {
            return;
        };
        let Ok(device) = self.nvml.device_by_index(*index) else {
            return;
        };
        // NotFound means no new samples since the timestamp.
        let Ok(samples) = device.process_utilization_stats(usage.last_timestamp) else {
            return;
        };
        for s in samples {
            let since = usage
                .pid_timestamp
                .get(&s.pid)
                .copied()
                .unwrap_or(usage.last_timestamp);
            let span = if since == 0 {
                0
            } else {
                s.timestamp.saturating_sub(since).min(MAX_SAMPLE_US)
            };
            usage.pid_timestamp.insert(s.pid, s.timestamp);
            usage.last_timestamp = usage.last_timestamp.max(s.timestamp);
            if span == 0 || s.sm_util == 0 {
                continue;
            }
            if let Some(dir) = cgroup_dir_of(&self.cgroup_root, s.pid) {
                *usage.busy_us.entry(dir).or_default() += span * u64::from(s.sm_util) / 100;
            }
        }
    }
}

impl UsageSource for NvmlUsage {
    fn busy(&mut self, gpu: u32, cgroup_dir: &Path) -> io::Result<Duration> {
        if !cgroup_dir.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} is gone", cgroup_dir.display()),
            ));
        }
        self.refresh(gpu);
        let total: u64 = self.gpus.get(&gpu).map_or(0, |u| {
            u.busy_us
                .iter()
                .filter(|(dir, _)| dir.starts_with(cgroup_dir))
                .map(|(_, us)| *us)
                .sum()
        });
        Ok(Duration::from_micros(total))
    }
}

/// The cgroup v2 directory of a process.
fn cgroup_dir_of(root: &Path, pid: u32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(root.join(rel.trim().trim_start_matches('/')))
}
