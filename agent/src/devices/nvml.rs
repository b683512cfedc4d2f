//! Real GPUs through NVML (nvml-wrapper loads `libnvidia-ml.so.1` at run time, so the agent
//! builds and runs on machines without it).

use nvml_wrapper::{Nvml, error::NvmlError};

use super::{GpuBackend, GpuDevice};

/// GPUs NVML lists.
pub struct NvmlBackend {
    devices: Vec<GpuDevice>,
    /// Kept for later queries (per-process memory, utilization).
    _nvml: Nvml,
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
        for i in 0..count {
            let d = nvml.device_by_index(i)?;
            let index = d.minor_number().unwrap_or(i);
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
            _nvml: nvml,
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
}
