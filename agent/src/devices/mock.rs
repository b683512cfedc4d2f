//! Mock GPUs from a TOML device list, in the format of Backend.AI's mock accelerator so its users
//! feel at home:
//!
//! ```toml
//! [[devices]]
//! uuid = "GPU-00000000-0000-0000-0000-000000000000"   # or mother_uuid
//! model_name = "Mock H100"
//! numa_node = 0
//! sm_count = 132                                     # or subproc_count
//! memory_size = "80G"
//! is_mig_device = false
//! device_node = "/dev/nvidia0"                       # optional: what the eBPF side watches
//! # Optional health, read again from the file at each reading (so a test can change it):
//! health = "degraded"                                # ok (default), degraded, failed
//! power_watts = 350.5
//! energy_joules = 123456.0
//! memory_utilization = 0.25
//! ecc_corrected = 4
//! ecc_uncorrected = 1
//! xid = [{ code = 79, pid = 4242 }, { code = 13 }]   # pid: attributed to its cgroup
//! ```

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Mutex,
};

use gpuwarden_types::slot::parse_bytes;
use serde::Deserialize;

use super::{
    GpuBackend, GpuDevice,
    health::{self, GpuHealth, HealthState, Xid},
};

/// Errors reading a mock device file.
#[derive(Debug, thiserror::Error)]
pub enum MockError {
    /// The file can't be read.
    #[error("cannot read mock device file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file isn't valid TOML of the expected shape.
    #[error("invalid mock device file {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What and where.
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A device's memory size doesn't parse.
    #[error(
        "mock device file {path}: device {index}: invalid memory_size {value:?} (e.g. \"16G\", \"512M\")"
    )]
    MemorySize {
        /// The file.
        path: PathBuf,
        /// Device position.
        index: usize,
        /// The value.
        value: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    devices: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    #[serde(alias = "mother_uuid")]
    uuid: String,
    #[serde(default = "default_model")]
    model_name: String,
    #[serde(default)]
    numa_node: i32,
    #[serde(default, alias = "subproc_count")]
    sm_count: u32,
    memory_size: MemorySize,
    #[serde(default)]
    is_mig_device: bool,
    device_node: Option<String>,
    // Health: see [`HealthEntry`].
    health: Option<String>,
    power_watts: Option<f64>,
    energy_joules: Option<f64>,
    memory_utilization: Option<f64>,
    ecc_corrected: Option<u64>,
    ecc_uncorrected: Option<u64>,
    #[serde(default)]
    xid: Vec<XidEntry>,
}

impl Entry {
    fn health(&self) -> HealthEntry {
        HealthEntry {
            health: self.health.clone(),
            power_watts: self.power_watts,
            energy_joules: self.energy_joules,
            memory_utilization: self.memory_utilization,
            ecc_corrected: self.ecc_corrected,
            ecc_uncorrected: self.ecc_uncorrected,
            xid: self.xid.clone(),
        }
    }
}

/// A mock device's health figures.
#[derive(Debug, Clone, Default)]
struct HealthEntry {
    health: Option<String>,
    power_watts: Option<f64>,
    energy_joules: Option<f64>,
    memory_utilization: Option<f64>,
    ecc_corrected: Option<u64>,
    ecc_uncorrected: Option<u64>,
    xid: Vec<XidEntry>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct XidEntry {
    code: u64,
    pid: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum MemorySize {
    Bytes(u64),
    Text(String),
}

fn default_model() -> String {
    "Mock GPU".to_owned()
}

/// Parses `16G`, `512M`, `1.5G`, `1024`, `16 GiB` (binary units, as slot values take them:
/// `gpuwarden_types::slot::parse_bytes`); `None` unless a whole number of bytes that fits a
/// `u64`.
#[must_use]
pub fn parse_size(text: &str) -> Option<u64> {
    parse_bytes(text.trim()).ok()?.to_u64()
}

/// Mock GPUs.
#[derive(Debug)]
pub struct MockBackend {
    devices: Vec<GpuDevice>,
    /// The file, read again for health; `None` when parsed from text.
    path: Option<PathBuf>,
    /// The health figures last read.
    health: Mutex<Vec<HealthEntry>>,
    /// The cgroup each XID's pid was in when first seen, by (GPU, position): kept after the
    /// process exits.
    xid_cgroups: Mutex<HashMap<(u32, usize), Option<String>>>,
}

impl MockBackend {
    /// Reads a device list.
    ///
    /// # Errors
    /// The file can't be read or is malformed (the message says where).
    pub fn from_file(path: &Path) -> Result<Self, MockError> {
        let text = std::fs::read_to_string(path).map_err(|source| MockError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut backend = Self::from_toml(&text, path)?;
        backend.path = Some(path.to_owned());
        Ok(backend)
    }

    /// Parses a device list; `path` is for messages.
    ///
    /// # Errors
    /// Malformed TOML or memory sizes.
    pub fn from_toml(text: &str, path: &Path) -> Result<Self, MockError> {
        let file: File = toml::from_str(text).map_err(|source| MockError::Parse {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
        let health = file.devices.iter().map(Entry::health).collect();
        let devices = file
            .devices
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                let memory_bytes = match &e.memory_size {
                    MemorySize::Bytes(b) => Some(*b),
                    MemorySize::Text(t) => parse_size(t),
                }
                .ok_or_else(|| MockError::MemorySize {
                    path: path.to_owned(),
                    index: i,
                    value: match &e.memory_size {
                        MemorySize::Bytes(b) => b.to_string(),
                        MemorySize::Text(t) => t.clone(),
                    },
                })?;
                let index = u32::try_from(i).unwrap_or(u32::MAX);
                Ok(GpuDevice {
                    uuid: e.uuid,
                    model: e.model_name,
                    memory_bytes,
                    numa_node: e.numa_node,
                    sm_count: e.sm_count,
                    is_mig: e.is_mig_device,
                    index,
                    device_node: e
                        .device_node
                        .unwrap_or_else(|| format!("/dev/nvidia{index}")),
                })
            })
            .collect::<Result<_, MockError>>()?;
        Ok(Self {
            devices,
            path: None,
            health: Mutex::new(health),
            xid_cgroups: Mutex::new(HashMap::new()),
        })
    }

    /// The health figures in the file now (the last good ones when it can't be read).
    fn read_health(&self) -> Vec<HealthEntry> {
        let mut last = self.health.locked();
        if let Some(path) = &self.path
            && let Ok(file) = std::fs::read_to_string(path)
                .map_err(|e| e.to_string())
                .and_then(|t| toml::from_str::<File>(&t).map_err(|e| e.to_string()))
        {
            *last = file.devices.iter().map(Entry::health).collect();
        }
        last.clone()
    }
}

impl GpuBackend for MockBackend {
    fn name(&self) -> &'static str {
        "mock"
    }

    fn devices(&self) -> &[GpuDevice] {
        &self.devices
    }

    fn health(&self) -> Vec<GpuHealth> {
        let entries = self.read_health();
        let mut cgroups = self.xid_cgroups.locked();
        self.devices
            .iter()
            .zip(entries)
            .map(|(d, e)| GpuHealth {
                index: d.index,
                state: e
                    .health
                    .as_deref()
                    .and_then(HealthState::parse)
                    .unwrap_or_default(),
                power_watts: e.power_watts,
                energy_joules: e.energy_joules,
                memory_utilization: e.memory_utilization,
                ecc_corrected: e.ecc_corrected,
                ecc_uncorrected: e.ecc_uncorrected,
                xids: e
                    .xid
                    .iter()
                    .enumerate()
                    .map(|(i, x)| Xid {
                        code: x.code,
                        cgroup: cgroups
                            .entry((d.index, i))
                            .or_insert_with(|| {
                                x.pid
                                    .and_then(|pid| health::cgroup_of(Path::new("/proc"), pid))
                            })
                            .clone(),
                    })
                    .collect(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
