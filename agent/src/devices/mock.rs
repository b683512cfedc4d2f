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
//!
//! A GPU in MIG mode lists its instances (and is then not offered whole; its instances take
//! device indexes after every GPU's, in file order, and share its health):
//!
//! ```toml
//! mig_minors = "/proc/driver/nvidia-caps/mig-minors"  # optional, top level: capability minors
//! mig_caps_major = 234                                # optional: the capability nodes' major
//!
//! [[devices]]
//! uuid = "GPU-00000000-0000-0000-0000-000000000001"
//! model_name = "Mock H200"
//! memory_size = "141G"
//! [[devices.instances]]
//! uuid = "MIG-00000000-0000-0000-0000-000000000011"
//! profile = "1g.18gb"
//! gpu_instance = 9                                   # the partition's swizzId
//! compute_instance = 0                               # default 0
//! memory_size = "16G"
//! sm_count = 16
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
    mig::{self, MigInstance, MigMinors},
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
    /// A MIG instance is malformed.
    #[error("mock device file {path}: device {index}: MIG instance {instance}: {why}")]
    Instance {
        /// The file.
        path: PathBuf,
        /// Device position.
        index: usize,
        /// Instance position.
        instance: usize,
        /// What is wrong.
        why: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    /// The capability minors (`mig-minors`), relative to the file's directory.
    mig_minors: Option<PathBuf>,
    /// The capability nodes' major.
    mig_caps_major: Option<u32>,
    #[serde(default)]
    devices: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InstanceEntry {
    uuid: String,
    profile: String,
    gpu_instance: u32,
    #[serde(default)]
    compute_instance: u32,
    memory_size: MemorySize,
    #[serde(default, alias = "subproc_count")]
    sm_count: u32,
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
    /// MIG instances: the GPU is in MIG mode and offered as these.
    #[serde(default, alias = "mig_instances")]
    instances: Vec<InstanceEntry>,
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

impl MemorySize {
    fn bytes(&self) -> Option<u64> {
        match self {
            Self::Bytes(b) => Some(*b),
            Self::Text(t) => parse_size(t),
        }
    }

    fn text(&self) -> String {
        match self {
            Self::Bytes(b) => b.to_string(),
            Self::Text(t) => t.clone(),
        }
    }
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
    caps_major: Option<u32>,
    /// The file entry each device's health is read from (an instance shares its parent's).
    entry_of: Vec<usize>,
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
        let minors = file
            .mig_minors
            .as_ref()
            .map_or_else(MigMinors::default, |m| {
                MigMinors::read(&path.parent().unwrap_or(Path::new(".")).join(m))
            });
        let (devices, entry_of) = devices_of(file.devices, &minors, path)?;
        Ok(Self {
            devices,
            caps_major: file.mig_caps_major,
            entry_of,
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

    fn caps_major(&self) -> Option<u32> {
        self.caps_major
    }

    fn health(&self) -> Vec<GpuHealth> {
        let entries = self.read_health();
        let mut cgroups = self.xid_cgroups.locked();
        self.devices
            .iter()
            .zip(&self.entry_of)
            .filter_map(|(d, &i)| Some((d, entries.get(i)?.clone())))
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

/// The devices a file's entries offer, and the entry of each: whole GPUs first (index = the
/// entry's position), then the instances of GPUs in MIG mode (indexes after every GPU's).
fn devices_of(
    entries: Vec<Entry>,
    minors: &MigMinors,
    path: &Path,
) -> Result<(Vec<GpuDevice>, Vec<usize>), MockError> {
    let mut whole = Vec::new();
    let mut instances = Vec::new();
    let count = u32::try_from(entries.len()).unwrap_or(u32::MAX);
    let mut next = mig::first_instance_index(0..count);
    for (i, e) in entries.into_iter().enumerate() {
        let memory_bytes = e.memory_size.bytes().ok_or_else(|| MockError::MemorySize {
            path: path.to_owned(),
            index: i,
            value: e.memory_size.text(),
        })?;
        let index = u32::try_from(i).unwrap_or(u32::MAX);
        let device_node = e
            .device_node
            .unwrap_or_else(|| format!("/dev/nvidia{index}"));
        if e.instances.is_empty() {
            whole.push((
                GpuDevice {
                    uuid: e.uuid,
                    model: e.model_name,
                    memory_bytes,
                    numa_node: e.numa_node,
                    sm_count: e.sm_count,
                    is_mig: e.is_mig_device,
                    index,
                    device_node,
                    mig: None,
                },
                i,
            ));
            continue;
        }
        for (k, inst) in e.instances.into_iter().enumerate() {
            let bad = |why: String| MockError::Instance {
                path: path.to_owned(),
                index: i,
                instance: k,
                why,
            };
            let bytes = inst
                .memory_size
                .bytes()
                .ok_or_else(|| bad(format!("invalid memory_size {:?}", inst.memory_size.text())))?;
            if !mig::is_profile(&inst.profile) {
                return Err(bad(format!(
                    "profile {:?} is not of the form 1g.18gb",
                    inst.profile
                )));
            }
            if bytes > memory_bytes {
                return Err(bad(format!(
                    "{bytes} bytes exceed its GPU's {memory_bytes}"
                )));
            }
            instances.push((
                GpuDevice {
                    uuid: inst.uuid,
                    model: format!("{} MIG {}", e.model_name, inst.profile),
                    memory_bytes: bytes,
                    numa_node: e.numa_node,
                    sm_count: inst.sm_count,
                    is_mig: true,
                    index: next,
                    device_node: device_node.clone(),
                    mig: Some(MigInstance {
                        parent_index: index,
                        parent_uuid: e.uuid.clone(),
                        gpu_instance: inst.gpu_instance,
                        compute_instance: inst.compute_instance,
                        profile: inst.profile,
                        gi_cap_minor: minors.gpu_instance(index, inst.gpu_instance),
                        ci_cap_minor: minors.compute_instance(
                            index,
                            inst.gpu_instance,
                            inst.compute_instance,
                        ),
                    }),
                },
                i,
            ));
            next = next.saturating_add(1);
        }
    }
    Ok(whole.into_iter().chain(instances).unzip())
}

#[cfg(test)]
mod tests;
