//! Real GPUs through NVML (nvml-wrapper loads `libnvidia-ml.so.1` at run time, so the agent
//! builds and runs on machines without it).
//!
//! On a GPU in MIG mode whose driver's profile table agrees with gpuwarden's placement rules
//! ([`layout::compare`]), the backend reads the layout and creates and destroys instances
//! through the MIG calls nvml-wrapper does not wrap ([`sys`]; docs/mig.md, "Instances made on
//! demand").

#[cfg(test)]
mod fake_tests;
pub mod layout;
mod samples;
mod sys;

pub use samples::NvmlSamples;

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::HashMap,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use nvml_wrapper::{
    Nvml,
    bitmasks::event::EventTypes,
    enum_wrappers::device::{EccCounter, MemoryError},
    enums::{device::UsedGpuMemory, event::XidError},
    error::NvmlError,
    struct_wrappers::device::ProcessInfo,
};

use self::layout::{DriverProfile, MigReadError};
use super::samples::SampleDriver;
use super::{
    DriverMemory, GpuBackend, GpuDevice, ProcessMemory,
    health::{self, GpuHealth, HealthState, Xid},
    mig,
    ondemand::MigChangeError,
    placement::{self, GpuModel, Layout},
};

/// `NVML_DEVICE_MIG_ENABLE`: the current MIG mode of a GPU in MIG mode.
const MIG_ENABLED: u32 = 1;

/// The MIG devices (compute instances) of a GPU in MIG mode, as NVML lists them; a slot NVML
/// finds empty, or an instance it can't read, is left out (logged).
fn mig_instances(nvml: &Nvml, parent: &nvml_wrapper::Device<'_>) -> Vec<mig::Found> {
    let slots = parent.mig_device_count().unwrap_or(0);
    (0..slots)
        .filter_map(|slot| {
            let d = match parent.mig_device_by_index(slot) {
                Ok(d) => d,
                Err(NvmlError::NotFound) => return None,
                Err(e) => {
                    tracing::warn!(slot, "MIG device not read: {e}");
                    return None;
                }
            };
            let read = || -> Result<mig::Found, NvmlError> {
                let attributes = d.attributes().ok();
                Ok(mig::Found {
                    uuid: d.uuid()?,
                    name: d.name().unwrap_or_default(),
                    memory_bytes: d.memory_info()?.total,
                    sm_count: attributes.as_ref().map_or(0, |a| a.multiprocessor_count),
                    gpu_instance: instance_id(nvml, &d, InstanceLevel::Gpu)?,
                    compute_instance: instance_id(nvml, &d, InstanceLevel::Compute)?,
                    slices: attributes.map_or(0, |a| a.gpu_instance_slice_count),
                })
            };
            read()
                .inspect_err(|e| tracing::warn!(slot, "MIG device not read: {e}"))
                .ok()
        })
        .collect()
}

/// Which id of a MIG device to read.
#[derive(Debug, Clone, Copy)]
enum InstanceLevel {
    Gpu,
    Compute,
}

/// A MIG device's GPU or compute instance id: calls nvml-wrapper does not wrap, made on its
/// library directly.
fn instance_id(
    nvml: &Nvml,
    d: &nvml_wrapper::Device<'_>,
    level: InstanceLevel,
) -> Result<u32, NvmlError> {
    let lib = nvml.lib();
    let mut id: std::ffi::c_uint = 0;
    // SAFETY: the handle is a live MIG device handle of this NVML; `id` is a valid out pointer.
    let status = unsafe {
        let handle = d.handle();
        match level {
            InstanceLevel::Gpu => lib.nvmlDeviceGetGpuInstanceId(handle, &raw mut id),
            InstanceLevel::Compute => lib.nvmlDeviceGetComputeInstanceId(handle, &raw mut id),
        }
    };
    nvml_wrapper::error::nvml_try(status)?;
    Ok(id)
}

/// Compute and graphics processes on a device handle (a whole GPU, a GPU in MIG mode, a MIG
/// device). A graphics list the device does not support is empty: MIG supports no graphics
/// APIs (NVIDIA's MIG user guide), and a MIG device handle may refuse the question.
fn processes_on(d: &nvml_wrapper::Device<'_>) -> Result<Vec<ProcessInfo>, NvmlError> {
    let mut all = d.running_compute_processes()?;
    match d.running_graphics_processes() {
        Ok(graphics) => all.extend(graphics),
        Err(NvmlError::NotSupported) => {}
        Err(e) => return Err(e),
    }
    Ok(all)
}

/// The MIG devices of the GPU in MIG mode `handle` now, each with its GPU instance id.
fn mig_devices<'n>(
    nvml: &'n Nvml,
    handle: &nvml_wrapper::Device<'n>,
) -> Result<Vec<(u32, nvml_wrapper::Device<'n>)>, NvmlError> {
    let mut out = Vec::new();
    for slot in 0..handle.mig_device_count()? {
        let d = match handle.mig_device_by_index(slot) {
            Ok(d) => d,
            Err(NvmlError::NotFound) => continue,
            Err(e) => return Err(e),
        };
        out.push((instance_id(nvml, &d, InstanceLevel::Gpu)?, d));
    }
    Ok(out)
}

/// The processes on the GPU in MIG mode `parent` (handle `handle`), each on the device index
/// of its instance among `devices`: from each MIG device's own process list where the driver
/// answers for every one, else from the GPU's list by the GPU instance id each process names
/// (nvml.h: in MIG mode the GPU's handle answers for all instances only to a privileged
/// caller; a MIG device's handle answers for its instance).
fn mig_processes(
    nvml: &Nvml,
    handle: &nvml_wrapper::Device<'_>,
    parent: &GpuDevice,
    devices: &[GpuDevice],
) -> Result<Vec<(u32, ProcessInfo)>, NvmlError> {
    let per_instance = || -> Result<Vec<(u32, ProcessInfo)>, NvmlError> {
        let mut out = Vec::new();
        for (gi, d) in mig_devices(nvml, handle)? {
            let index = layout::busy_index(devices, parent, Some(gi));
            out.extend(processes_on(&d)?.into_iter().map(|p| (index, p)));
        }
        Ok(out)
    };
    match per_instance() {
        Ok(out) => Ok(out),
        Err(e) => {
            tracing::debug!(gpu = %parent.uuid, "processes not listed per MIG device ({e}): the GPU's list is read");
            Ok(processes_on(handle)?
                .into_iter()
                .map(|p| (layout::busy_index(devices, parent, p.gpu_instance_id), p))
                .collect())
        }
    }
}

/// The memory each MIG device of the GPU in MIG mode `parent` (handle `handle`) has in use, by
/// its device index among `devices` (a GPU instance with several compute instances once, at
/// its first one's index); a MIG device not among them, or whose memory is not read, is left
/// out.
fn mig_memory(
    nvml: &Nvml,
    handle: &nvml_wrapper::Device<'_>,
    parent: &GpuDevice,
    devices: &[GpuDevice],
) -> std::collections::BTreeMap<u32, DriverMemory> {
    let mut out = std::collections::BTreeMap::new();
    let found = mig_devices(nvml, handle).unwrap_or_else(|e| {
        tracing::debug!(gpu = %parent.uuid, "MIG devices not listed ({e}): no memory read");
        Vec::new()
    });
    for (gi, d) in found {
        let Some(index) = layout::instance_index(devices, parent, gi) else {
            continue;
        };
        if let Ok(m) = d.memory_info() {
            out.entry(index).or_insert(DriverMemory {
                used: m.used,
                reserved: m.reserved,
            });
        }
    }
    out
}

/// The processes the driver lists, each on the device index it counts it on.
#[derive(Debug, Default)]
struct Listing {
    /// (device index, process).
    processes: Vec<(u32, ProcessInfo)>,
    /// The GPUs (their index) whose processes could not be listed, and why.
    unlisted: Vec<(u32, NvmlError)>,
}

/// A GPU in MIG mode: offered as its instances.
struct MigParent {
    /// The GPU as it would be offered whole (its instances' parent).
    parent: GpuDevice,
    /// NVML's index of it.
    nvml_index: u32,
    /// Where its driver's profile table agrees with its model's placement rules, those rules:
    /// its layout is then one the backend reports and may change. `None`: read only.
    rules: Option<MigRules>,
}

/// The placement rules of a GPU in MIG mode whose layout the backend may change.
struct MigRules {
    model: &'static GpuModel,
    /// Every profile the driver lists (the model's and any others).
    profiles: Vec<DriverProfile>,
}

impl MigParent {
    /// The GPU with its rules, where its layout may be changed.
    fn changeable(&self) -> Option<(&Self, &MigRules)> {
        self.rules.as_ref().map(|r| (self, r))
    }
}

/// The profiles the driver lists for `device`, with their possible placements.
fn driver_table(
    nvml: &Nvml,
    device: &nvml_wrapper::Device<'_>,
) -> Result<Vec<DriverProfile>, layout::CallError> {
    let mut out = Vec::new();
    for index in 0..layout::GI_PROFILE_INDEXES {
        let Some(info) = sys::gi_profile(nvml, device, index)? else {
            continue;
        };
        let placements = sys::possible_placements(nvml, device, info.id)?;
        out.push(DriverProfile { info, placements });
    }
    Ok(out)
}

/// The placement rules of the GPU `parent` (NVML index `nvml_index`), or why its layout is not
/// gpuwarden's to read and change.
fn mig_rules(nvml: &Nvml, parent: &GpuDevice, nvml_index: u32) -> Result<MigRules, MigReadError> {
    let model = placement::model_of(&parent.model).ok_or_else(|| MigReadError::UnknownModel {
        model: parent.model.clone(),
    })?;
    let device = nvml.device_by_index(nvml_index)?;
    let profiles = driver_table(nvml, &device)?;
    let disagreements = layout::compare(model, &profiles);
    if !disagreements.is_empty() {
        return Err(MigReadError::Disagree(disagreements));
    }
    Ok(MigRules { model, profiles })
}

/// One GPU's MIG profile table as the driver lists it, against gpuwarden's placement rules for
/// its model: what `gpuwarden-agent mig-table` prints (read only: nothing is created or
/// destroyed, gpu-check's "MIG placements" row).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MigTable {
    /// The GPU's UUID.
    pub uuid: String,
    /// NVML's name for it.
    pub name: String,
    /// Whether its current MIG mode is enabled.
    pub mig_enabled: bool,
    /// The model whose rules it was compared with (`H100`, `H200`); `None`: none known.
    pub model: Option<&'static str>,
    /// The profiles the driver lists: `<name> id <id> ×<instances> <placements>`.
    pub profiles: Vec<String>,
    /// Where the driver and the rules disagree (empty: they agree, or nothing was compared).
    pub disagreements: Vec<String>,
    /// Why the table could not be read, if it could not.
    pub error: Option<String>,
}

/// Each GPU's MIG profile table against gpuwarden's placement rules, read only.
///
/// # Errors
/// NVML can't be loaded, initialised, or list its GPUs.
pub fn mig_tables() -> Result<Vec<MigTable>, NvmlError> {
    mig_tables_of(None)
}

/// As [`mig_tables`], with the NVML library at `path` (`None`: the system's).
///
/// # Errors
/// NVML can't be loaded, initialised, or list its GPUs.
pub fn mig_tables_of(path: Option<&std::ffi::OsStr>) -> Result<Vec<MigTable>, NvmlError> {
    let nvml = match path {
        Some(path) => Nvml::builder().lib_path(path).init()?,
        None => Nvml::init()?,
    };
    let mut out = Vec::new();
    for i in 0..nvml.device_count()? {
        let d = nvml.device_by_index(i)?;
        let name = d.name().unwrap_or_default();
        let model = placement::model_of(&name);
        let mut t = MigTable {
            uuid: d.uuid().unwrap_or_default(),
            mig_enabled: d.mig_mode().is_ok_and(|m| m.current == MIG_ENABLED),
            name,
            model: model.map(|m| m.name),
            profiles: Vec::new(),
            disagreements: Vec::new(),
            error: None,
        };
        match driver_table(&nvml, &d) {
            Ok(profiles) => {
                t.profiles = profiles
                    .iter()
                    .map(|p| {
                        let at: Vec<String> =
                            p.placements.iter().map(ToString::to_string).collect();
                        format!(
                            "{} id {} x{} {}",
                            p.name(),
                            p.info.id,
                            p.info.instance_count,
                            at.join(" ")
                        )
                    })
                    .collect();
                if let (Some(model), false) = (model, profiles.is_empty()) {
                    t.disagreements = layout::compare(model, &profiles)
                        .iter()
                        .map(ToString::to_string)
                        .collect();
                }
            }
            Err(e) => t.error = Some(e.to_string()),
        }
        out.push(t);
    }
    Ok(out)
}

/// GPUs NVML lists.
pub struct NvmlBackend {
    /// The devices offered: whole GPUs and MIG instances (made instances join, destroyed
    /// ones leave).
    devices: Mutex<Vec<GpuDevice>>,
    /// Every GPU in MIG mode, with the rules of those whose layout may be read and changed.
    mig_parents: Vec<MigParent>,
    /// The first device index instances take (past every GPU's minor).
    first_instance: u32,
    /// NVML's index of each GPU, by the GPU's minor number (our index).
    nvml_index: HashMap<u32, u32>,
    nvml: Arc<Nvml>,
    /// XID errors seen since start, by GPU index (filled by the event thread).
    xids: Arc<Mutex<HashMap<u32, Vec<Xid>>>>,
    /// Set on drop: the event thread stops within a second.
    stop: Arc<AtomicBool>,
}

impl Drop for NvmlBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl NvmlBackend {
    /// Initialises NVML and lists the GPUs.
    ///
    /// # Errors
    /// NVML can't be loaded or initialised.
    pub fn probe() -> Result<Self, NvmlError> {
        Self::probe_library(None)
    }

    /// As [`Self::probe`], with the NVML library at `path` (`None`: the system's).
    ///
    /// # Errors
    /// NVML can't be loaded or initialised.
    pub fn probe_library(path: Option<&std::ffi::OsStr>) -> Result<Self, NvmlError> {
        let nvml = match path {
            Some(path) => Nvml::builder().lib_path(path).init()?,
            None => Nvml::init()?,
        };
        let count = nvml.device_count()?;
        let mut physical = Vec::new();
        for i in 0..count {
            let d = nvml.device_by_index(i)?;
            let index = d.minor_number().unwrap_or(i);
            let mig_mode = d.mig_mode().is_ok_and(|m| m.current == MIG_ENABLED);
            let device = GpuDevice {
                uuid: d.uuid()?,
                model: d.name().unwrap_or_else(|_| "NVIDIA GPU".to_owned()),
                memory_bytes: d.memory_info()?.total,
                numa_node: d
                    .numa_node_id()
                    .ok()
                    .and_then(|n| i32::try_from(n).ok())
                    .unwrap_or(-1),
                sm_count: d.attributes().map_or(0, |a| a.multiprocessor_count),
                is_mig: false,
                index,
                device_node: format!("/dev/nvidia{index}"),
                mig: None,
            };
            physical.push((i, device, mig_mode));
        }
        // A GPU in MIG mode is offered as its instances, numbered after every GPU's minor.
        let minors = mig::MigMinors::read(Path::new(mig::MIG_MINORS));
        let first_instance = mig::first_instance_index(physical.iter().map(|(_, d, _)| d.index));
        let mut next = first_instance;
        let mut devices = Vec::new();
        let mut instances = Vec::new();
        let mut nvml_index = HashMap::new();
        let mut mig_parents = Vec::new();
        for (i, device, mig_mode) in physical {
            if !mig_mode {
                nvml_index.insert(device.index, i);
                devices.push(device);
                continue;
            }
            let parent = nvml.device_by_index(i)?;
            for found in mig_instances(&nvml, &parent) {
                instances.push(mig::instance_device(&device, found, next, &minors));
                next = next.saturating_add(1);
            }
            let rules = mig_rules(&nvml, &device, i)
                .inspect_err(|e| {
                    tracing::info!(
                        gpu = %device.uuid,
                        "MIG layout not changeable by gpuwarden: {e}"
                    );
                })
                .ok();
            mig_parents.push(MigParent {
                parent: device,
                nvml_index: i,
                rules,
            });
        }
        devices.extend(instances);
        let backend = Self {
            devices: Mutex::new(devices),
            mig_parents,
            first_instance,
            nvml_index,
            nvml: Arc::new(nvml),
            xids: Arc::default(),
            stop: Arc::default(),
        };
        backend.watch_xids();
        Ok(backend)
    }

    /// Starts the thread that waits for XID events and records each, attributed to the cgroup
    /// of the GPU's only process when it has exactly one (NVML's event names no process).
    /// Where the driver offers no such events, there is no thread and no XID counts.
    fn watch_xids(&self) {
        let (nvml, xids, stop) = (
            Arc::clone(&self.nvml),
            Arc::clone(&self.xids),
            Arc::clone(&self.stop),
        );
        let by_uuid: HashMap<String, u32> = self
            .devices
            .locked()
            .iter()
            .map(|d| (d.uuid.clone(), d.index))
            .collect();
        let indexes: Vec<u32> = self.nvml_index.values().copied().collect();
        let spawned = std::thread::Builder::new()
            .name("nvml-xid".to_owned())
            .spawn(move || {
                let Ok(mut set) = nvml.create_event_set() else {
                    return;
                };
                let mut registered = 0;
                for i in indexes {
                    let Ok(device) = nvml.device_by_index(i) else {
                        continue;
                    };
                    match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                        Ok(s) => {
                            set = s;
                            registered += 1;
                        }
                        Err(e) => {
                            tracing::info!("XID events unavailable: {}", e.error);
                            return;
                        }
                    }
                }
                if registered == 0 {
                    return;
                }
                while !stop.load(Ordering::Relaxed) {
                    let event = match set.wait(1000) {
                        Ok(event) => event,
                        Err(NvmlError::Timeout) => continue,
                        Err(e) => {
                            tracing::warn!("XID events: {e}; no longer watched");
                            return;
                        }
                    };
                    let Some(index) = event
                        .device
                        .uuid()
                        .ok()
                        .and_then(|u| by_uuid.get(&u).copied())
                    else {
                        continue;
                    };
                    let code = match event.event_data {
                        Some(XidError::Value(code)) => code,
                        _ => 0,
                    };
                    let processes = event.device.running_compute_processes().unwrap_or_default();
                    let cgroup = match processes.as_slice() {
                        [only] => health::cgroup_of(Path::new("/proc"), only.pid),
                        _ => None,
                    };
                    tracing::warn!(gpu = index, xid = code, cgroup = ?cgroup, "GPU XID error");
                    xids.locked()
                        .entry(index)
                        .or_default()
                        .push(Xid { code, cgroup });
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("XID events not watched: {e}");
        }
    }
}

impl NvmlBackend {
    /// The GPU `uuid` among those whose layout may be changed, with its rules.
    fn mig_gpu(&self, uuid: &str) -> Result<(&MigParent, &MigRules), MigChangeError> {
        self.mig_parents
            .iter()
            .filter_map(MigParent::changeable)
            .find(|(g, _)| g.parent.uuid == uuid)
            .ok_or_else(|| MigChangeError::UnknownGpu {
                gpu: uuid.to_owned(),
            })
    }

    fn parent_handle(&self, g: &MigParent) -> Result<nvml_wrapper::Device<'_>, MigChangeError> {
        self.nvml
            .device_by_index(g.nvml_index)
            .map_err(|e| MigChangeError::Refused {
                gpu: g.parent.uuid.clone(),
                reason: format!("NVML: {e}"),
            })
    }

    /// The processes on every GPU, each on the device index the driver counts it on: a whole
    /// GPU's own, an instance's for a process on a GPU in MIG mode (one path for the
    /// cross-check's memory and the layout change's idleness).
    fn listing(&self) -> Listing {
        let mut out = Listing::default();
        for (&index, &nvml_index) in &self.nvml_index {
            match self
                .nvml
                .device_by_index(nvml_index)
                .and_then(|d| processes_on(&d))
            {
                Ok(found) => out.processes.extend(found.into_iter().map(|p| (index, p))),
                Err(e) => out.unlisted.push((index, e)),
            }
        }
        let devices = self.devices();
        for m in &self.mig_parents {
            let listed = self
                .nvml
                .device_by_index(m.nvml_index)
                .and_then(|handle| mig_processes(&self.nvml, &handle, &m.parent, &devices));
            match listed {
                Ok(found) => out.processes.extend(found),
                Err(e) => out.unlisted.push((m.parent.index, e)),
            }
        }
        out
    }

    /// The GPU instances on `g` now, of every profile its driver lists (`rules`).
    fn read_layout(&self, g: &MigParent, rules: &MigRules) -> Result<Layout, MigReadError> {
        let device = self.nvml.device_by_index(g.nvml_index)?;
        let mut there = Vec::new();
        for p in &rules.profiles {
            let found = sys::gpu_instances(&self.nvml, &device, p.info.id, p.info.instance_count)?;
            there.extend(found.into_iter().map(|(_, gi)| gi));
        }
        Ok(layout::layout_of(rules.model, &there)?)
    }
}

impl GpuBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn devices(&self) -> Vec<GpuDevice> {
        self.devices.locked().clone()
    }

    fn busy_devices(&self) -> std::collections::BTreeSet<u32> {
        let listing = self.listing();
        let mut out: std::collections::BTreeSet<u32> =
            listing.processes.iter().map(|(index, _)| *index).collect();
        for (index, e) in listing.unlisted {
            // Not knowing is not idle: a GPU in MIG mode keeps its layout.
            tracing::warn!(
                gpu = index,
                "processes on the GPU not listed ({e}): taken as busy"
            );
            out.insert(index);
        }
        out
    }

    fn mig_layouts(&self) -> Vec<(String, u32, Layout)> {
        self.mig_parents
            .iter()
            .filter_map(MigParent::changeable)
            .filter_map(|(g, rules)| match self.read_layout(g, rules) {
                Ok(layout) => Some((g.parent.uuid.clone(), g.parent.index, layout)),
                Err(e) => {
                    tracing::warn!(gpu = %g.parent.uuid, "MIG layout not read: {e}");
                    None
                }
            })
            .collect()
    }

    fn create_instance(
        &self,
        gpu: &str,
        profile: &str,
        start: u32,
    ) -> Result<GpuDevice, MigChangeError> {
        let (g, rules) = self.mig_gpu(gpu)?;
        let unknown = || MigChangeError::UnknownProfile {
            gpu: gpu.to_owned(),
            profile: profile.to_owned(),
        };
        let p = rules.model.profile(profile).ok_or_else(unknown)?;
        let driver = layout::driver_profile(&rules.profiles, p).ok_or_else(unknown)?;
        // A start the profile may not take is refused here, as the driver would
        // (`INVALID_ARGUMENT`), naming the starts it may.
        let at = placement::Layout::empty(rules.model);
        let placement = placement::Placement {
            start,
            size: p.size,
        };
        if let Some(refusal) = at.refusal(p, placement) {
            return Err(MigChangeError::Refused {
                gpu: gpu.to_owned(),
                reason: refusal.to_string(),
            });
        }
        let device = self.parent_handle(g)?;
        let nvml = &*self.nvml;
        let gi =
            sys::create_gpu_instance(nvml, &device, p.id, placement).map_err(|e| e.refusal(gpu))?;
        // From here a failure destroys what was made, so nothing is left half made.
        let undo = |ci: Option<sys::CiHandle>, why: MigChangeError| {
            if let Some(ci) = ci
                && let Err(e) = sys::destroy_compute_instance(nvml, ci)
            {
                tracing::warn!(%gpu, "compute instance made and not destroyed again: {e}");
            }
            if let Err(e) = sys::destroy_gpu_instance(nvml, gi) {
                tracing::warn!(%gpu, "GPU instance made and not destroyed again: {e}");
            }
            why
        };
        let mut candidates = Vec::new();
        for index in 0..layout::CI_PROFILE_INDEXES {
            match sys::ci_profile(nvml, gi, index) {
                Ok(Some(c)) => candidates.push(c),
                Ok(None) => {}
                Err(e) => return Err(undo(None, e.refusal(gpu))),
            }
        }
        let Some(whole) = layout::whole_compute_profile(&driver.info, &candidates) else {
            return Err(undo(
                None,
                MigChangeError::Refused {
                    gpu: gpu.to_owned(),
                    reason: format!(
                        "the driver lists no compute profile of {} slices for {profile}",
                        driver.info.slice_count
                    ),
                },
            ));
        };
        let ci = sys::create_compute_instance(nvml, gi, whole.id)
            .map_err(|e| undo(None, e.refusal(gpu)))?;
        let gi_id = sys::gpu_instance_info(nvml, gi)
            .map_err(|e| undo(Some(ci), e.refusal(gpu)))?
            .id;
        // The new compute instance as NVML lists it: a MIG device of the GPU instance made.
        let Some(found) = mig_instances(nvml, &device)
            .into_iter()
            .find(|f| f.gpu_instance == gi_id)
        else {
            return Err(undo(
                Some(ci),
                MigChangeError::Refused {
                    gpu: gpu.to_owned(),
                    reason: format!("NVML lists no MIG device for GPU instance {gi_id} made"),
                },
            ));
        };
        let minors = mig::MigMinors::read(Path::new(mig::MIG_MINORS));
        let mut devices = self.devices.locked();
        let next = devices
            .iter()
            .map(|d| d.index.saturating_add(1))
            .chain([self.first_instance])
            .max()
            .unwrap_or(self.first_instance);
        let made = mig::instance_device(&g.parent, found, next, &minors);
        devices.push(made.clone());
        Ok(made)
    }

    fn destroy_instance(&self, uuid: &str) -> Result<(), MigChangeError> {
        let m = self
            .devices
            .locked()
            .iter()
            .find(|d| d.uuid == uuid)
            .and_then(|d| d.mig.clone())
            .ok_or_else(|| MigChangeError::NoInstance {
                uuid: uuid.to_owned(),
            })?;
        let gpu = m.parent_uuid.as_str();
        let (g, _) = self.mig_gpu(gpu)?;
        let device = self.parent_handle(g)?;
        let nvml = &*self.nvml;
        let refused = |e: layout::CallError| e.refusal(gpu);
        let gi = sys::gpu_instance_by_id(nvml, &device, m.gpu_instance).map_err(refused)?;
        let ci = sys::compute_instance_by_id(nvml, gi, m.compute_instance).map_err(refused)?;
        // The driver refuses (`IN_USE`) while a process runs in it.
        sys::destroy_compute_instance(nvml, ci).map_err(refused)?;
        // Its compute instance gone, the device is no more, whatever becomes of the GPU
        // instance.
        self.devices.locked().retain(|d| d.uuid != uuid);
        sys::destroy_gpu_instance(nvml, gi).map_err(refused)
    }

    fn caps_major(&self) -> Option<u32> {
        mig::caps_major(&std::fs::read_to_string("/proc/devices").ok()?)
    }

    fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    fn process_memory(&self) -> Vec<ProcessMemory> {
        // A GPU whose processes can't be listed this time is left out of the cross-check.
        self.listing()
            .processes
            .into_iter()
            .filter_map(|(index, p)| match p.used_gpu_memory {
                UsedGpuMemory::Used(bytes) => Some(ProcessMemory {
                    index,
                    pid: p.pid,
                    bytes,
                }),
                UsedGpuMemory::Unavailable => None,
            })
            .collect()
    }

    fn driver_memory(&self) -> std::collections::BTreeMap<u32, DriverMemory> {
        let mut out = std::collections::BTreeMap::new();
        for (&index, &nvml_index) in &self.nvml_index {
            if let Ok(m) = self
                .nvml
                .device_by_index(nvml_index)
                .and_then(|d| d.memory_info())
            {
                out.insert(
                    index,
                    DriverMemory {
                        used: m.used,
                        reserved: m.reserved,
                    },
                );
            }
        }
        let devices = self.devices();
        for m in &self.mig_parents {
            if let Ok(handle) = self.nvml.device_by_index(m.nvml_index) {
                out.extend(mig_memory(&self.nvml, &handle, &m.parent, &devices));
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

    fn health(&self) -> Vec<GpuHealth> {
        let xids = self.xids.locked();
        self.nvml_index
            .iter()
            .map(|(&index, &nvml_index)| {
                let xids = xids.get(&index).cloned().unwrap_or_default();
                let Ok(device) = self.nvml.device_by_index(nvml_index) else {
                    // Fallen off the bus, or otherwise out of NVML's reach.
                    return GpuHealth {
                        index,
                        state: HealthState::Failed,
                        xids,
                        ..GpuHealth::default()
                    };
                };
                let ecc = |kind| device.total_ecc_errors(kind, EccCounter::Aggregate).ok();
                let ecc_uncorrected = ecc(MemoryError::Uncorrected);
                let state = match device.utilization_rates() {
                    Err(NvmlError::GpuLost) => HealthState::Failed,
                    // Uncorrected memory errors or an XID: it works, with faults.
                    _ if ecc_uncorrected.is_some_and(|n| n > 0) || !xids.is_empty() => {
                        HealthState::Degraded
                    }
                    _ => HealthState::Ok,
                };
                GpuHealth {
                    index,
                    state,
                    power_watts: device.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
                    energy_joules: device
                        .total_energy_consumption()
                        .ok()
                        .map(|mj| mj as f64 / 1000.0),
                    memory_utilization: device
                        .utilization_rates()
                        .ok()
                        .map(|u| f64::from(u.memory.min(100)) / 100.0),
                    ecc_corrected: ecc(MemoryError::Corrected),
                    ecc_uncorrected,
                    xids,
                }
            })
            .collect()
    }

    fn sample_driver(&self, cgroup_root: &Path) -> Option<Box<dyn SampleDriver>> {
        Some(Box::new(NvmlSamples::new(
            Arc::clone(&self.nvml),
            self.nvml_index.clone(),
            (!self.mig_parents.is_empty()).then_some(self.first_instance),
            cgroup_root.to_owned(),
        )))
    }
}
