//! The device-access program (`cgroup_device`), attached to each bound cgroup: a workload opens
//! only its GPUs and the control nodes (docs/architecture.md, "Enforcement tiers").

use std::{
    collections::{BTreeSet, HashMap},
    os::fd::{AsFd as _, OwnedFd},
    path::Path,
};

use aya::{
    maps::{HashMap as BpfMap, MapData},
    programs::ProgramFd,
};
use gpuwarden_agent_common::mig::CapKey;

use super::pins::{self, Pins};

/// The loaded program and the links it holds: pinned where the agent pins (so enforcement
/// outlives it), otherwise owned here until detached.
pub(crate) struct DeviceProgram {
    program: Option<ProgramFd>,
    pins: Option<Pins>,
    owned: HashMap<u64, OwnedFd>,
    /// The MIG capability nodes each quota may open (`CAP_ACCESS`).
    caps: Option<BpfMap<MapData, CapKey, u32>>,
}

impl DeviceProgram {
    pub(crate) fn new(
        program: Option<ProgramFd>,
        pins: Option<Pins>,
        caps: Option<BpfMap<MapData, CapKey, u32>>,
    ) -> Self {
        Self {
            program,
            pins,
            owned: HashMap::new(),
            caps,
        }
    }

    /// Lets quota `key`'s cgroups open exactly the capability nodes `minors` (replacing what it
    /// was let open before).
    pub(crate) fn allow_caps(&mut self, key: u64, minors: &[u32]) {
        let Some(caps) = self.caps.as_mut() else {
            if !minors.is_empty() {
                tracing::warn!(key, "MIG capability nodes not enforced: no CAP_ACCESS map");
            }
            return;
        };
        remove_caps(caps, |quota| quota == key);
        for &minor in minors {
            let entry = CapKey {
                quota: key,
                minor,
                _pad: 0,
            };
            if let Err(e) = caps.insert(entry, 1, 0) {
                tracing::warn!(key, minor, "MIG capability node not granted: {e}");
            }
        }
    }

    /// Lets the cgroup at `dir`, bound under quota `key`, open only its GPUs (adopting an earlier
    /// agent's pinned link). Failures are logged: memory and compute are still enforced without
    /// it.
    pub(crate) fn attach(&mut self, key: u64, dir: &Path) {
        let Some(program) = self.program.as_ref() else {
            return;
        };
        let pin = self.pins.as_ref().map(|p| p.device_link(key));
        // An earlier agent's link is there: adopt it.
        if pin.as_deref().is_some_and(pins::is_pinned) {
            return;
        }
        let cgroup = match std::fs::File::open(dir) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), "device access not enforced: {e}");
                return;
            }
        };
        let link = match pins::attach_cgroup_device(program.as_fd(), cgroup.as_fd()) {
            Ok(link) => link,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), "device access not enforced: attaching refused: {e}");
                return;
            }
        };
        if let Some(path) = pin {
            match pins::pin(link.as_fd(), &path) {
                // The pin holds it now.
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(path = %path.display(), "device link not pinned (ends with the agent): {e}");
                }
            }
        }
        self.owned.insert(key, link);
    }

    /// Lets go of quota `key`'s cgroup (and its pin).
    pub(crate) fn detach(&mut self, key: u64) {
        self.owned.remove(&key);
        if let Some(caps) = self.caps.as_mut() {
            remove_caps(caps, |quota| quota == key);
        }
        if let Some(pins) = &self.pins {
            let path = pins.device_link(key);
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %path.display(), "device link left pinned: {e}");
            }
        }
    }

    /// Removes the pinned links of keys not in `owned`; returns how many.
    pub(crate) fn sweep(&mut self, owned: &BTreeSet<u64>) -> usize {
        if let Some(caps) = self.caps.as_mut() {
            remove_caps(caps, |quota| !owned.contains(&quota));
        }
        let Some(pins) = &self.pins else {
            return 0;
        };
        let Ok(entries) = std::fs::read_dir(pins.dir().join("devices")) else {
            return 0;
        };
        let mut removed = 0;
        for entry in entries.flatten() {
            let key = entry.file_name().to_string_lossy().parse::<u64>().ok();
            if key.is_some_and(|k| !owned.contains(&k))
                && std::fs::remove_file(entry.path()).is_ok()
            {
                removed += 1;
            }
        }
        removed
    }
}

/// Removes the capability grants of the quotas `doomed` picks.
fn remove_caps(caps: &mut BpfMap<MapData, CapKey, u32>, doomed: impl Fn(u64) -> bool) {
    let gone: Vec<CapKey> = caps
        .keys()
        .filter_map(Result::ok)
        .filter(|k| doomed(k.quota))
        .collect();
    for k in gone {
        let _ = caps.remove(&k);
    }
}
