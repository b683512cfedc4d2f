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
//!
//! An H100 or H200 whose layout may change (issue 37 §3) sets `mig_enabled = true` (in MIG
//! mode even with no instance) and gives each instance its `placement_start` (its first memory
//! slice); its layout is then kept by a fake of NVML's MIG calls ([`fake_mig`]) that refuses
//! what the driver refuses, and [`GpuBackend::create_instance`] / `destroy_instance` change it.

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
    ondemand::MigChangeError,
    placement::{self, Layout},
};

pub mod fake_mig;

use fake_mig::FakeMigGpu;

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
    /// Its first memory slice, on a GPU whose layout the fake MIG layer keeps.
    placement_start: Option<u32>,
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
    /// In MIG mode with a layout the fake MIG layer keeps (even with no instance).
    #[serde(default)]
    mig_enabled: bool,
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
    /// The devices and the file entry each one's health is read from (an instance shares its
    /// parent's), with the GPUs whose MIG layout the fake keeps: all changed together.
    state: Mutex<State>,
    caps_major: Option<u32>,
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
        let state = devices_of(file.devices, &minors, path)?;
        Ok(Self {
            state: Mutex::new(state),
            caps_major: file.mig_caps_major,
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

    fn devices(&self) -> Vec<GpuDevice> {
        self.state.locked().devices.clone()
    }

    fn mig_layouts(&self) -> Vec<(String, u32, Layout)> {
        self.state
            .locked()
            .fakes
            .iter()
            .map(|f| (f.uuid.clone(), f.index, f.gpu.layout()))
            .collect()
    }

    fn create_instance(
        &self,
        gpu: &str,
        profile: &str,
        start: u32,
    ) -> Result<GpuDevice, MigChangeError> {
        self.state.locked().create(gpu, profile, start)
    }

    fn destroy_instance(&self, uuid: &str) -> Result<(), MigChangeError> {
        self.state.locked().destroy(uuid)
    }

    fn caps_major(&self) -> Option<u32> {
        self.caps_major
    }

    fn health(&self) -> Vec<GpuHealth> {
        let entries = self.read_health();
        let mut cgroups = self.xid_cgroups.locked();
        let state = self.state.locked();
        state
            .devices
            .iter()
            .zip(&state.entry_of)
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

/// A GPU whose MIG layout the fake keeps, and what its new instances take from it.
#[derive(Debug)]
struct FakeParent {
    uuid: String,
    index: u32,
    /// Its file entry (its instances share its health).
    entry: usize,
    model_name: String,
    numa_node: i32,
    device_node: String,
    gpu: FakeMigGpu,
    /// Instances made so far (for their UUIDs).
    made: u32,
}

/// The devices, the file entry of each, and the GPUs whose layout the fake keeps.
#[derive(Debug, Default)]
struct State {
    devices: Vec<GpuDevice>,
    entry_of: Vec<usize>,
    fakes: Vec<FakeParent>,
    /// The capability minors the file's `mig_minors` lists, read once as the driver's list is
    /// (it names every instance a GPU could hold): an instance made later finds its own there.
    minors: MigMinors,
}

impl State {
    /// A GPU instance and its compute instance on `gpu`; the new device, numbered after every
    /// device there is.
    fn create(
        &mut self,
        gpu: &str,
        profile: &str,
        start: u32,
    ) -> Result<GpuDevice, MigChangeError> {
        let next = self
            .devices
            .iter()
            .map(|d| d.index)
            .chain(self.fakes.iter().map(|f| f.index))
            .max()
            .map_or(0, |m| m.saturating_add(1));
        let parent = self
            .fakes
            .iter_mut()
            .find(|f| f.uuid == gpu)
            .ok_or_else(|| MigChangeError::UnknownGpu {
                gpu: gpu.to_owned(),
            })?;
        let refused = |e: fake_mig::FakeMigError| MigChangeError::Refused {
            gpu: gpu.to_owned(),
            reason: e.to_string(),
        };
        let p =
            parent
                .gpu
                .model()
                .profile(profile)
                .ok_or_else(|| MigChangeError::UnknownProfile {
                    gpu: gpu.to_owned(),
                    profile: profile.to_owned(),
                })?;
        let placement = placement::Placement {
            start,
            size: p.size,
        };
        let gi = parent
            .gpu
            .create_gpu_instance_with_placement(p.id, placement)
            .map_err(refused)?;
        let ci = match parent.gpu.create_compute_instance(gi) {
            Ok(ci) => ci,
            Err(e) => {
                let _ = parent.gpu.destroy_gpu_instance(gi);
                return Err(refused(e));
            }
        };
        parent.made = parent.made.saturating_add(1);
        let device = GpuDevice {
            uuid: format!(
                "MIG-{}-gi{gi}-{}",
                parent.uuid.trim_start_matches("GPU-"),
                parent.made
            ),
            model: format!("{} MIG {}", parent.model_name, p.name),
            memory_bytes: p.memory_mib << 20,
            numa_node: parent.numa_node,
            sm_count: p.sm_count,
            is_mig: true,
            index: next,
            device_node: parent.device_node.clone(),
            mig: Some(MigInstance {
                parent_index: parent.index,
                parent_uuid: parent.uuid.clone(),
                gpu_instance: gi,
                compute_instance: ci,
                profile: p.name.to_owned(),
                gi_cap_minor: self.minors.gpu_instance(parent.index, gi),
                ci_cap_minor: self.minors.compute_instance(parent.index, gi, ci),
            }),
        };
        self.devices.push(device.clone());
        self.entry_of.push(parent.entry);
        Ok(device)
    }

    /// Destroys instance `uuid`: its compute instance, then its GPU instance.
    fn destroy(&mut self, uuid: &str) -> Result<(), MigChangeError> {
        let (pos, m) = self
            .devices
            .iter()
            .enumerate()
            .find_map(|(i, d)| Some((i, d.mig.clone()?)).filter(|_| d.uuid == uuid))
            .ok_or_else(|| MigChangeError::NoInstance {
                uuid: uuid.to_owned(),
            })?;
        let parent = self
            .fakes
            .iter_mut()
            .find(|f| f.uuid == m.parent_uuid)
            .ok_or_else(|| MigChangeError::UnknownGpu {
                gpu: m.parent_uuid.clone(),
            })?;
        let refused = |e: fake_mig::FakeMigError| MigChangeError::Refused {
            gpu: m.parent_uuid.clone(),
            reason: e.to_string(),
        };
        parent
            .gpu
            .destroy_compute_instance(m.gpu_instance)
            .map_err(refused)?;
        parent
            .gpu
            .destroy_gpu_instance(m.gpu_instance)
            .map_err(refused)?;
        self.devices.remove(pos);
        self.entry_of.remove(pos);
        Ok(())
    }
}

impl MockBackend {
    /// Marks `count` processes running in the instance `uuid` on a GPU the fake keeps (the
    /// mock has no real processes): the fake then refuses to destroy it, as the driver would.
    ///
    /// # Errors
    /// No such instance on such a GPU.
    pub fn set_instance_processes(&self, uuid: &str, count: u32) -> Result<(), MigChangeError> {
        let mut state = self.state.locked();
        let m = state
            .devices
            .iter()
            .find(|d| d.uuid == uuid)
            .and_then(|d| d.mig.clone())
            .ok_or_else(|| MigChangeError::NoInstance {
                uuid: uuid.to_owned(),
            })?;
        state
            .fakes
            .iter_mut()
            .find(|f| f.uuid == m.parent_uuid)
            .ok_or(MigChangeError::UnknownGpu { gpu: m.parent_uuid })?
            .gpu
            .set_processes(m.gpu_instance, count)
            .map_err(|e| MigChangeError::NoInstance {
                uuid: format!("{uuid} ({e})"),
            })
    }
}

/// The fake MIG layer of a file entry, where it asks for one (`mig_enabled`, or an instance
/// with a `placement_start`): the model's placements must be known.
fn fake_layer(
    mig_enabled: bool,
    instances: &[InstanceEntry],
    model_name: &str,
    (i, path): (usize, &Path),
) -> Result<Option<FakeMigGpu>, MockError> {
    if !mig_enabled && instances.iter().all(|x| x.placement_start.is_none()) {
        return Ok(None);
    }
    let model = placement::model_of(model_name).ok_or_else(|| MockError::Instance {
        path: path.to_owned(),
        index: i,
        instance: 0,
        why: format!("model {model_name:?} has no known MIG placements (H100, H200)"),
    })?;
    Ok(Some(FakeMigGpu::new(model)))
}

/// An instance entry's memory, checked: a profile's form, within its GPU's memory, and, on a
/// GPU whose layout the fake keeps, a placement the rules allow (then held there).
fn check_instance(
    inst: &InstanceEntry,
    gpu_bytes: u64,
    fake: Option<&mut FakeMigGpu>,
) -> Result<u64, String> {
    let bytes = inst
        .memory_size
        .bytes()
        .ok_or_else(|| format!("invalid memory_size {:?}", inst.memory_size.text()))?;
    if !mig::is_profile(&inst.profile) {
        return Err(format!(
            "profile {:?} is not of the form 1g.18gb",
            inst.profile
        ));
    }
    if bytes > gpu_bytes {
        return Err(format!("{bytes} bytes exceed its GPU's {gpu_bytes}"));
    }
    if let Some(fake) = fake {
        let start = inst
            .placement_start
            .ok_or("a GPU with mig_enabled needs each instance's placement_start")?;
        fake.insert_existing(inst.gpu_instance, &inst.profile, start)
            .map_err(|e| e.to_string())?;
    }
    Ok(bytes)
}

/// The devices a file's entries offer, and the entry of each: whole GPUs first (index = the
/// entry's position), then the instances of GPUs in MIG mode (indexes after every GPU's); and
/// the GPUs whose layout the fake keeps.
fn devices_of(entries: Vec<Entry>, minors: &MigMinors, path: &Path) -> Result<State, MockError> {
    let mut whole = Vec::new();
    let mut instances = Vec::new();
    let mut fakes = Vec::new();
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
        if e.instances.is_empty() && !e.mig_enabled {
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
        let mut fake = fake_layer(e.mig_enabled, &e.instances, &e.model_name, (i, path))?;
        for (k, inst) in e.instances.into_iter().enumerate() {
            let bad = |why: String| MockError::Instance {
                path: path.to_owned(),
                index: i,
                instance: k,
                why,
            };
            let bytes = check_instance(&inst, memory_bytes, fake.as_mut()).map_err(bad)?;
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
        if let Some(gpu) = fake {
            fakes.push(FakeParent {
                uuid: e.uuid,
                index,
                entry: i,
                model_name: e.model_name,
                numa_node: e.numa_node,
                device_node,
                gpu,
                made: 0,
            });
        }
    }
    let (devices, entry_of) = whole.into_iter().chain(instances).unzip();
    Ok(State {
        devices,
        entry_of,
        fakes,
        minors: minors.clone(),
    })
}

#[cfg(test)]
mod tests;
