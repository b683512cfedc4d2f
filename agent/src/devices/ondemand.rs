//! MIG instances made on demand (issue 37 §3, docs/mig.md "Instances made on demand").
//!
//! The operator lists the GPUs whose MIG layout gpuwarden may change (`mig_reconfigurable`,
//! none by default). For those the agent reports each profile's free placements, so the
//! controller can choose where a new instance goes; the agent then creates it through its
//! backend (a GPU instance at that placement and a compute instance of the whole of it), and
//! destroys it once the session on it is released. It never touches a GPU it was not given,
//! an instance it did not make, or a GPU with a process on it: each of those is refused with
//! the reason.
//!
//! Which instances it made is kept in the agent's store (a sled tree, [`TREE`], beside the
//! controller's holdings), so an agent restarted still destroys them once idle; entries whose
//! instance is gone are dropped when read, and a record that does not decode is reported and
//! left as it is: its instance is then never taken for one gpuwarden made.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use gpuwarden_runtime::sync::Lock as _;
use gpuwarden_types::mig::{MigGpuLayout, MigProfilePlacements};
use serde::{Deserialize, Serialize};

use super::{GpuBackend, GpuDevice, placement::Layout};

/// What the reconfigurable GPU `gpu_uuid` (index `gpu_index`) with `layout` allows now, as
/// reported to the controller: the placements its instances hold, and for each profile of the
/// model the starts the hardware allows and those free now (no overlap, under its instance
/// count).
#[must_use]
pub fn layout_report(gpu_uuid: &str, gpu_index: u32, layout: &Layout) -> MigGpuLayout {
    MigGpuLayout {
        gpu_uuid: gpu_uuid.to_owned(),
        gpu_index,
        slices: super::placement::MEMORY_SLICES,
        occupied: layout
            .instances
            .iter()
            .map(|(_, p)| (p.start, p.size))
            .collect(),
        profiles: layout
            .model
            .profiles
            .iter()
            .map(|p| MigProfilePlacements {
                profile: p.name.to_owned(),
                size: p.size,
                starts: p.starts.to_vec(),
                free: layout
                    .free_placements(p)
                    .into_iter()
                    .map(|pl| pl.start)
                    .collect(),
            })
            .collect(),
    }
}

/// Why a MIG layout change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MigChangeError {
    /// The backend can't change layouts.
    #[error("the {backend} backend does not create or destroy MIG instances")]
    Unsupported {
        /// Its name.
        backend: &'static str,
    },
    /// The operator did not list the GPU as reconfigurable.
    #[error("GPU {gpu} is not among the agent's mig_reconfigurable GPUs")]
    NotAllowed {
        /// The GPU.
        gpu: String,
    },
    /// No GPU in MIG mode of that UUID whose layout the backend knows.
    #[error("no GPU {gpu} in MIG mode with a known layout")]
    UnknownGpu {
        /// The GPU.
        gpu: String,
    },
    /// The GPU has no such profile.
    #[error("GPU {gpu} has no MIG profile {profile}")]
    UnknownProfile {
        /// The GPU.
        gpu: String,
        /// The profile asked.
        profile: String,
    },
    /// A process runs on the GPU: it is never reconfigured then.
    #[error("GPU {gpu} has a process on device {index}: its MIG layout is not changed")]
    Busy {
        /// The GPU.
        gpu: String,
        /// The device (the GPU or one of its instances) a process is on.
        index: u32,
    },
    /// The driver refused the change.
    #[error("GPU {gpu}: the driver refused: {reason}")]
    Refused {
        /// The GPU.
        gpu: String,
        /// What it said.
        reason: String,
    },
    /// No instance of that UUID.
    #[error("no MIG instance {uuid}")]
    NoInstance {
        /// The UUID.
        uuid: String,
    },
    /// The instance was made by the operator, not by gpuwarden: it stays.
    #[error("MIG instance {uuid} was not made by gpuwarden: it is not destroyed")]
    NotMadeHere {
        /// The UUID.
        uuid: String,
    },
}

/// The sled tree of the instances the agent made, by instance UUID.
pub const TREE: &str = "mig_made";

/// Errors reading the instances made from the agent's store.
#[derive(Debug, thiserror::Error)]
pub enum MadeStoreError {
    /// The store can't be read.
    #[error("agent store: MIG instances made: {0}")]
    Io(#[from] sled::Error),
    /// A record doesn't decode: its instance is not taken for one gpuwarden made.
    #[error(
        "agent store: the record of MIG instance {key} made is corrupt ({source}); it is left \
         as it is and the instance is not destroyed"
    )]
    Corrupt {
        /// Its key (the instance's UUID, as far as it reads).
        key: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// The agent's side of on-demand instances: the operator's list, and the instances it made.
#[derive(Debug, Default)]
pub struct Reconfigurer {
    allowed: BTreeSet<String>,
    made: std::sync::Mutex<BTreeMap<String, Made>>,
    /// Where the instances made are kept; `None`: in memory only.
    tree: Option<sled::Tree>,
}

/// An instance gpuwarden made: when (since this agent started, for one made before), and
/// whether a session has held it since.
#[derive(Debug, Clone)]
struct Made {
    at: Instant,
    record: MadeRecord,
}

/// What the store keeps of an instance made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct MadeRecord {
    /// Its GPU's UUID.
    gpu: String,
    /// Its profile.
    profile: String,
    /// Its GPU instance id.
    gpu_instance: u32,
    /// Whether a session has held it.
    held: bool,
}

impl Reconfigurer {
    /// May change the layout of the GPUs whose UUIDs are `allowed` (none: nothing changes).
    #[must_use]
    pub fn new(allowed: impl IntoIterator<Item = String>) -> Self {
        Self {
            allowed: allowed.into_iter().collect(),
            made: std::sync::Mutex::default(),
            tree: None,
        }
    }

    /// As [`Self::new`], keeping the instances made in `tree` and taking back those a previous
    /// run made: an entry whose instance `backend` no longer lists is dropped; one on a GPU
    /// not allowed now is left in the store but not destroyed. The records that don't decode
    /// are returned (each left as it is, its instance not taken for one made here).
    ///
    /// # Errors
    /// The tree can't be read.
    pub fn open(
        allowed: impl IntoIterator<Item = String>,
        tree: sled::Tree,
        backend: &dyn GpuBackend,
    ) -> Result<(Self, Vec<MadeStoreError>), MadeStoreError> {
        let mut this = Self::new(allowed);
        let devices = backend.devices();
        let mut problems = Vec::new();
        let mut made = BTreeMap::new();
        for item in &tree {
            let (k, v) = item?;
            let key = String::from_utf8_lossy(&k).into_owned();
            let record: MadeRecord = match serde_json::from_slice(&v) {
                Ok(r) => r,
                Err(source) => {
                    problems.push(MadeStoreError::Corrupt { key, source });
                    continue;
                }
            };
            let there = devices.iter().any(|d| {
                d.uuid == key && d.mig.as_ref().is_some_and(|m| m.parent_uuid == record.gpu)
            });
            if !there {
                tracing::info!(instance = %key, gpu = %record.gpu, "MIG instance made before is gone; forgotten");
                tree.remove(&k)?;
                continue;
            }
            if !this.allows(&record.gpu) {
                tracing::warn!(instance = %key, gpu = %record.gpu, "MIG instance made before on a GPU no longer listed: kept, never destroyed");
                continue;
            }
            made.insert(
                key,
                Made {
                    at: Instant::now(),
                    record,
                },
            );
        }
        tree.flush()?;
        tracing::info!(
            instances = made.len(),
            "MIG instances made before taken back"
        );
        this.made = std::sync::Mutex::new(made);
        this.tree = Some(tree);
        Ok((this, problems))
    }

    /// Writes or removes the record of `uuid` (`None`: removed); a failure is logged, the
    /// change kept in memory (the instance is then forgotten at the next restart, never
    /// destroyed by mistake).
    fn store(&self, uuid: &str, record: Option<&MadeRecord>) {
        let Some(tree) = &self.tree else {
            return;
        };
        let written = match record {
            Some(r) => serde_json::to_vec(r)
                .map_err(|e| e.to_string())
                .and_then(|v| tree.insert(uuid, v).map_err(|e| e.to_string())),
            None => tree.remove(uuid).map_err(|e| e.to_string()),
        };
        let flushed = written.and_then(|_| tree.flush().map_err(|e| e.to_string()));
        if let Err(e) = flushed {
            tracing::error!(instance = %uuid, "MIG instance made not recorded in the agent store: {e}");
        }
    }

    /// Whether the operator gave gpuwarden the GPU `uuid`.
    #[must_use]
    pub fn allows(&self, uuid: &str) -> bool {
        self.allowed.contains(uuid)
    }

    /// The layouts of the allowed GPUs the backend can change, by GPU index.
    #[must_use]
    pub fn layouts(&self, backend: &dyn GpuBackend) -> Vec<MigGpuLayout> {
        let mut out: Vec<MigGpuLayout> = backend
            .mig_layouts()
            .into_iter()
            .filter(|(uuid, _, _)| self.allows(uuid))
            .map(|(uuid, index, layout)| layout_report(&uuid, index, &layout))
            .collect();
        out.sort_by_key(|r| r.gpu_index);
        out
    }

    /// Creates an instance of `profile` at slice `start` of GPU `gpu`, unless the operator did
    /// not give it, or a process is on it or one of its instances (`busy`: device indexes with
    /// a process). The new device.
    ///
    /// # Errors
    /// [`MigChangeError`]: not allowed, busy, or refused by the backend.
    pub fn create(
        &self,
        backend: &dyn GpuBackend,
        busy: &BTreeSet<u32>,
        gpu: &str,
        profile: &str,
        start: u32,
    ) -> Result<GpuDevice, MigChangeError> {
        if !self.allows(gpu) {
            return Err(MigChangeError::NotAllowed {
                gpu: gpu.to_owned(),
            });
        }
        check_idle(backend, busy, gpu)?;
        let device = backend.create_instance(gpu, profile, start)?;
        let record = MadeRecord {
            gpu: gpu.to_owned(),
            profile: profile.to_owned(),
            gpu_instance: device.mig.as_ref().map_or(0, |m| m.gpu_instance),
            held: false,
        };
        self.store(&device.uuid, Some(&record));
        self.made.locked().insert(
            device.uuid.clone(),
            Made {
                at: Instant::now(),
                record,
            },
        );
        tracing::info!(%gpu, profile, start, instance = %device.uuid, index = device.index, "MIG instance created");
        Ok(device)
    }

    /// Destroys the instance `uuid` if gpuwarden made it, its GPU is still listed and no
    /// process is on it; `Ok(false)` when it was not made here (the operator's instances stay)
    /// or is gone already (then forgotten).
    ///
    /// # Errors
    /// [`MigChangeError`]: busy, unknown, or refused by the backend.
    pub fn release(
        &self,
        backend: &dyn GpuBackend,
        busy: &BTreeSet<u32>,
        uuid: &str,
    ) -> Result<bool, MigChangeError> {
        let Some(gpu) = self.made.locked().get(uuid).map(|m| m.record.gpu.clone()) else {
            return Ok(false);
        };
        let devices = backend.devices();
        let Some(parent) = devices
            .iter()
            .find(|d| d.uuid == uuid)
            .and_then(|d| d.mig.as_ref())
            .map(|m| m.parent_uuid.clone())
        else {
            // Gone already (destroyed behind the agent's back, or its compute instance gone
            // with its GPU instance left): nothing to destroy, nothing to remember.
            self.forget(uuid);
            tracing::info!(%gpu, instance = %uuid, "MIG instance made here is gone; forgotten");
            return Ok(false);
        };
        if !self.allows(&gpu) || parent != gpu {
            return Err(MigChangeError::NotAllowed { gpu: parent });
        }
        check_idle(backend, busy, &parent)?;
        backend.destroy_instance(uuid)?;
        self.forget(uuid);
        tracing::info!(gpu = %parent, instance = %uuid, "MIG instance destroyed");
        Ok(true)
    }

    fn forget(&self, uuid: &str) {
        self.made.locked().remove(uuid);
        self.store(uuid, None);
    }

    /// Whether gpuwarden made the instance `uuid`.
    #[must_use]
    pub fn made(&self, uuid: &str) -> bool {
        self.made.locked().contains_key(uuid)
    }

    /// Notes that the instances made here among `held` are held by a session now, so they are
    /// due as soon as it lets go ([`Reconfigurer::idle`]) even where no check saw them held
    /// before (a session let go between two heartbeats).
    pub fn mark_held(&self, held: &BTreeSet<String>) {
        for (uuid, m) in self.made.locked().iter_mut() {
            if held.contains(uuid) && !m.record.held {
                m.record.held = true;
                self.store(uuid, Some(&m.record));
            }
        }
    }

    /// The instances made here that are due to be destroyed, `held` being the devices the
    /// node's sessions hold now: those a session held and let go, and those no session took
    /// within `grace` of their making (the session they were made for went elsewhere or
    /// ended). An instance made moments ago stays for the session it was made for.
    #[must_use]
    pub fn idle(&self, held: &BTreeSet<String>, grace: Duration) -> Vec<String> {
        let mut made = self.made.locked();
        let mut out = Vec::new();
        for (uuid, m) in made.iter_mut() {
            if held.contains(uuid) {
                if !m.record.held {
                    m.record.held = true;
                    self.store(uuid, Some(&m.record));
                }
            } else if m.record.held || m.at.elapsed() >= grace {
                out.push(uuid.clone());
            }
        }
        out
    }
}

/// Refuses when a process is on GPU `gpu`: on its own index or one of its instances', as the
/// agent saw it (`busy`) or as the driver counts it ([`GpuBackend::busy_devices`]).
fn check_idle(
    backend: &dyn GpuBackend,
    busy: &BTreeSet<u32>,
    gpu: &str,
) -> Result<(), MigChangeError> {
    let parent_index = backend
        .mig_layouts()
        .into_iter()
        .find(|(uuid, _, _)| uuid == gpu)
        .map(|(_, index, _)| index)
        .ok_or_else(|| MigChangeError::UnknownGpu {
            gpu: gpu.to_owned(),
        })?;
    let driver_busy = backend.busy_devices();
    let on_gpu = std::iter::once(parent_index)
        .chain(
            backend
                .devices()
                .into_iter()
                .filter(|d| d.mig.as_ref().is_some_and(|m| m.parent_uuid == gpu))
                .map(|d| d.index),
        )
        .find(|i| busy.contains(i) || driver_busy.contains(i));
    match on_gpu {
        Some(index) => Err(MigChangeError::Busy {
            gpu: gpu.to_owned(),
            index,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::devices::{NoGpus, mock::MockBackend};

    /// A whole GPU; GPU-1, an H200 in MIG mode with the operator's 3g.71gb at slices 4-7;
    /// GPU-2, an H200 in MIG mode with no instance.
    const FILE: &str = include_str!("../../../deploy/mock-devices-mig-on-demand.toml");

    fn free(reports: &[MigGpuLayout], gpu: &str, profile: &str) -> Vec<u32> {
        reports
            .iter()
            .find(|r| r.gpu_uuid == gpu)
            .and_then(|r| r.profiles.iter().find(|p| p.profile == profile))
            .map(|p| p.free.clone())
            .unwrap()
    }

    #[test]
    fn an_instance_is_made_where_allowed_and_destroyed_once_released() {
        let b = MockBackend::from_toml(FILE, Path::new("m.toml")).unwrap();
        let r = Reconfigurer::new(["GPU-1".to_owned()]);
        let idle = BTreeSet::new();
        // Only the listed GPU is reported; the operator's 3g holds slices 4-7.
        let layouts = r.layouts(&b);
        assert_eq!(layouts.len(), 1);
        assert_eq!(layouts[0].gpu_index, 1);
        assert_eq!(free(&layouts, "GPU-1", "2g.35gb"), [0, 2]);
        assert_eq!(free(&layouts, "GPU-1", "4g.71gb"), [0]);
        assert!(free(&layouts, "GPU-1", "7g.141gb").is_empty());
        let before = b.devices();

        let made = r.create(&b, &idle, "GPU-1", "2g.35gb", 0).unwrap();
        let m = made.mig.clone().unwrap();
        assert_eq!((m.parent_index, m.profile.as_str()), (1, "2g.35gb"));
        assert!(
            before
                .iter()
                .all(|d| d.index != made.index && d.uuid != made.uuid)
        );
        assert!(b.devices().contains(&made));
        assert!(r.made(&made.uuid));
        assert_eq!(
            crate::devices::mig::slot_capacity(&b.devices()),
            [
                ("cuda.mig.2g.35gb".to_owned(), "1".to_owned()),
                ("cuda.mig.3g.71gb".to_owned(), "1".to_owned())
            ]
        );
        let layouts = r.layouts(&b);
        assert_eq!(free(&layouts, "GPU-1", "2g.35gb"), [2]);
        assert!(free(&layouts, "GPU-1", "4g.71gb").is_empty());

        // The fake refuses an overlap; nothing changes.
        let err = r.create(&b, &idle, "GPU-1", "1g.18gb", 1).unwrap_err();
        assert!(matches!(err, MigChangeError::Refused { .. }), "{err}");
        // Not the operator's to give: refused before the driver is asked.
        let err = r.create(&b, &idle, "GPU-2", "1g.18gb", 0).unwrap_err();
        assert_eq!(
            err,
            MigChangeError::NotAllowed {
                gpu: "GPU-2".into()
            }
        );
        // A process on one of the GPU's instances: neither create nor destroy.
        let busy = BTreeSet::from([made.index]);
        let err = r.create(&b, &busy, "GPU-1", "1g.18gb", 2).unwrap_err();
        assert!(matches!(err, MigChangeError::Busy { index, .. } if index == made.index));
        assert!(matches!(
            r.release(&b, &busy, &made.uuid),
            Err(MigChangeError::Busy { .. })
        ));
        assert_eq!(b.devices().len(), before.len() + 1);

        // Released and idle: destroyed, its slices free again.
        assert_eq!(r.release(&b, &idle, &made.uuid), Ok(true));
        assert_eq!(b.devices(), before);
        assert_eq!(free(&r.layouts(&b), "GPU-1", "2g.35gb"), [0, 2]);
        // The operator's instance is never destroyed.
        assert_eq!(r.release(&b, &idle, "MIG-ops"), Ok(false));
        assert!(b.devices().iter().any(|d| d.uuid == "MIG-ops"));
    }

    #[test]
    fn the_driver_refuses_to_destroy_an_instance_a_process_runs_in() {
        // The agent's own view may miss a process (one not traced yet): the driver still
        // refuses, and the instance stays.
        let b = MockBackend::from_toml(FILE, Path::new("m.toml")).unwrap();
        let r = Reconfigurer::new(["GPU-1".to_owned()]);
        let idle = BTreeSet::new();
        let made = r.create(&b, &idle, "GPU-1", "1g.18gb", 3).unwrap();
        b.set_instance_processes(&made.uuid, 1).unwrap();
        let err = r.release(&b, &idle, &made.uuid).unwrap_err();
        assert!(matches!(err, MigChangeError::Refused { .. }), "{err}");
        assert!(b.devices().contains(&made) && r.made(&made.uuid));
        b.set_instance_processes(&made.uuid, 0).unwrap();
        assert_eq!(r.release(&b, &idle, &made.uuid), Ok(true));
    }

    #[test]
    fn an_instance_is_due_once_let_go_or_never_taken() {
        let b = MockBackend::from_toml(FILE, Path::new("m.toml")).unwrap();
        let r = Reconfigurer::new(["GPU-1".to_owned()]);
        let idle = BTreeSet::new();
        let taken = r.create(&b, &idle, "GPU-1", "2g.35gb", 0).unwrap();
        let waiting = r.create(&b, &idle, "GPU-1", "1g.18gb", 2).unwrap();
        let hour = Duration::from_hours(1);
        // Just made, no session on either yet: both stay for the session they were made for.
        assert!(r.idle(&BTreeSet::new(), hour).is_empty());
        // One held: it stays while held.
        let held = BTreeSet::from([taken.uuid.clone()]);
        assert!(r.idle(&held, hour).is_empty());
        // Let go: due; the one never taken is not, within its grace.
        assert_eq!(
            r.idle(&BTreeSet::new(), hour),
            std::slice::from_ref(&taken.uuid)
        );
        // Marked held, then let go: due at once, though no check saw it held.
        r.mark_held(&BTreeSet::from([waiting.uuid.clone()]));
        let mut due = r.idle(&BTreeSet::new(), hour);
        due.sort();
        let mut both = vec![taken.uuid.clone(), waiting.uuid.clone()];
        both.sort();
        assert_eq!(due, both);
        // Past its grace, the one never taken is due too; the operator's never is.
        let mut due = r.idle(&BTreeSet::new(), Duration::ZERO);
        due.sort();
        let mut both = vec![taken.uuid, waiting.uuid];
        both.sort();
        assert_eq!(due, both);
        assert!(!due.contains(&"MIG-ops".to_owned()));
    }

    /// The agent's store in `dir`, as a restarted agent opens it: the tree of instances made.
    /// Tried for a few seconds: the previous opening's flusher thread may still hold sled's
    /// lock for a moment after it was dropped.
    fn store(dir: &Path) -> (sled::Db, sled::Tree) {
        let mut tries = 0;
        let db = loop {
            match sled::open(dir) {
                Ok(db) => break db,
                Err(_) if tries < 50 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("{e}"),
            }
        };
        let tree = db.open_tree(TREE).unwrap();
        (db, tree)
    }

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    #[test]
    fn instances_made_are_taken_back_after_a_restart_and_destroyed_once_idle() {
        let scratch = gpuwarden_test_support::scratch("mig-made");
        let dir = scratch.path().join("store");
        let b = MockBackend::from_toml(FILE, Path::new("m.toml")).unwrap();
        let allowed = || ["GPU-1".to_owned()];
        let idle = BTreeSet::new();
        let hour = Duration::from_hours(1);
        let (held, waiting, gone) = {
            let (_db, tree) = store(&dir);
            let (r, problems) = Reconfigurer::open(allowed(), tree, &b).unwrap();
            assert!(problems.is_empty());
            let held = r.create(&b, &idle, "GPU-1", "2g.35gb", 0).unwrap();
            let waiting = r.create(&b, &idle, "GPU-1", "1g.18gb", 2).unwrap();
            let gone = r.create(&b, &idle, "GPU-1", "1g.18gb", 3).unwrap();
            // A session holds one; none holds the others yet.
            assert!(
                r.idle(&BTreeSet::from([held.uuid.clone()]), hour)
                    .is_empty()
            );
            (held.uuid, waiting.uuid, gone.uuid)
        };
        // Behind the agent's back, while it is down: one of them destroyed.
        b.destroy_instance(&gone).unwrap();

        // Restarted: the two still there are its own again, the one gone is forgotten.
        let (_db, tree) = store(&dir);
        let (r, problems) = Reconfigurer::open(allowed(), tree.clone(), &b).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        assert!(r.made(&held) && r.made(&waiting) && !r.made(&gone));
        assert!(!tree.contains_key(&gone).unwrap());
        // The one a session held and no longer does is due at once; the one never held waits
        // out its grace (counted again from the restart), then is due too.
        assert_eq!(r.idle(&BTreeSet::new(), hour), std::slice::from_ref(&held));
        assert_eq!(
            sorted(r.idle(&BTreeSet::new(), Duration::ZERO)),
            sorted(vec![held.clone(), waiting.clone()])
        );
        // Released once idle: destroyed, and no longer in the store.
        assert_eq!(r.release(&b, &idle, &held), Ok(true));
        assert_eq!(r.release(&b, &idle, &waiting), Ok(true));
        assert!(
            b.devices()
                .iter()
                .all(|d| d.uuid != held && d.uuid != waiting)
        );
        assert!(tree.is_empty());
        // The operator's instance was never among them.
        assert!(b.devices().iter().any(|d| d.uuid == "MIG-ops"));
    }

    #[test]
    fn a_corrupt_record_is_reported_and_makes_nothing_up() {
        let scratch = gpuwarden_test_support::scratch("mig-made-corrupt");
        let dir = scratch.path().join("store");
        let b = MockBackend::from_toml(FILE, Path::new("m.toml")).unwrap();
        let idle = BTreeSet::new();
        let made = {
            let (_db, tree) = store(&dir);
            let (r, _) = Reconfigurer::open(["GPU-1".to_owned()], tree.clone(), &b).unwrap();
            let made = r.create(&b, &idle, "GPU-1", "2g.35gb", 0).unwrap();
            // The operator's instance under a record that does not decode, and the made
            // one's record cut short.
            tree.insert("MIG-ops", &b"{\"gpu\": \"GPU-1\", \"prof"[..])
                .unwrap();
            let whole = tree.get(&made.uuid).unwrap().unwrap();
            tree.insert(made.uuid.as_str(), &whole[..whole.len() / 2])
                .unwrap();
            made.uuid
        };
        let (_db, tree) = store(&dir);
        let (r, problems) = Reconfigurer::open(["GPU-1".to_owned()], tree.clone(), &b).unwrap();
        let keys: Vec<String> = problems
            .iter()
            .map(|p| match p {
                MadeStoreError::Corrupt { key, .. } => key.clone(),
                MadeStoreError::Io(e) => panic!("{e}"),
            })
            .collect();
        assert_eq!(
            sorted(keys),
            sorted(vec![made.clone(), "MIG-ops".to_owned()])
        );
        assert!(
            problems[0].to_string().contains("corrupt"),
            "{}",
            problems[0]
        );
        // Neither is taken for one made here: neither is due nor destroyed, both records stay.
        assert!(!r.made(&made) && !r.made("MIG-ops"));
        assert!(r.idle(&BTreeSet::new(), Duration::ZERO).is_empty());
        assert_eq!(r.release(&b, &idle, "MIG-ops"), Ok(false));
        assert_eq!(r.release(&b, &idle, &made), Ok(false));
        assert!(b.devices().iter().any(|d| d.uuid == "MIG-ops"));
        assert!(b.devices().iter().any(|d| d.uuid == made));
        assert_eq!(tree.len(), 2);
    }

    #[test]
    fn an_instance_made_on_a_gpu_no_longer_listed_is_kept_not_destroyed() {
        let scratch = gpuwarden_test_support::scratch("mig-made-unlisted");
        let dir = scratch.path().join("store");
        let b = MockBackend::from_toml(FILE, Path::new("m.toml")).unwrap();
        let idle = BTreeSet::new();
        let made = {
            let (_db, tree) = store(&dir);
            let (r, _) = Reconfigurer::open(["GPU-1".to_owned()], tree, &b).unwrap();
            r.create(&b, &idle, "GPU-1", "2g.35gb", 0).unwrap().uuid
        };
        // The operator took GPU-1 off the list before the restart.
        let (_db, tree) = store(&dir);
        let (r, _) = Reconfigurer::open(Vec::<String>::new(), tree.clone(), &b).unwrap();
        assert!(!r.made(&made));
        assert_eq!(r.release(&b, &idle, &made), Ok(false));
        assert!(b.devices().iter().any(|d| d.uuid == made));
        // Its record stays: listed again, it is gpuwarden's to destroy again.
        assert!(tree.contains_key(&made).unwrap());
    }

    #[test]
    fn a_backend_without_layouts_changes_nothing() {
        let r = Reconfigurer::new(["GPU-1".to_owned()]);
        assert!(r.layouts(&NoGpus).is_empty());
        assert!(matches!(
            r.create(&NoGpus, &BTreeSet::new(), "GPU-1", "1g.18gb", 0),
            Err(MigChangeError::UnknownGpu { .. })
        ));
        assert!(matches!(
            NoGpus.create_instance("GPU-1", "1g.18gb", 0),
            Err(MigChangeError::Unsupported { backend: "none" })
        ));
    }

    #[test]
    fn a_mock_file_with_an_impossible_layout_is_refused() {
        let gpu = |model: &str, instances: &str| {
            format!(
                "[[devices]]\nuuid = \"GPU-x\"\nmodel_name = \"{model}\"\nmemory_size = \"141G\"\n\
                 mig_enabled = true\n{instances}"
            )
        };
        let inst = |gi: u32, profile: &str, start: Option<u32>| {
            let start = start
                .map(|s| format!("placement_start = {s}\n"))
                .unwrap_or_default();
            format!(
                "[[devices.instances]]\nuuid = \"MIG-{gi}\"\nprofile = \"{profile}\"\n\
                 gpu_instance = {gi}\nmemory_size = \"16G\"\n{start}"
            )
        };
        let err = |text: String| {
            MockBackend::from_toml(&text, Path::new("m.toml"))
                .unwrap_err()
                .to_string()
        };
        assert!(err(gpu("Mock A100", "")).contains("no known MIG placements"));
        let two = inst(1, "3g.71gb", Some(0)) + &inst(2, "2g.35gb", Some(2));
        assert!(err(gpu("Mock H200", &two)).contains("overlaps"));
        assert!(err(gpu("Mock H200", &inst(1, "3g.71gb", Some(2)))).contains("placements start"));
        assert!(err(gpu("Mock H200", &inst(1, "1g.18gb", None))).contains("placement_start"));
        // A good layout: 4g at 0 and 3g at 4 fill the GPU.
        let full = inst(1, "4g.71gb", Some(0)) + &inst(2, "3g.71gb", Some(4));
        let b = MockBackend::from_toml(&gpu("Mock H200", &full), Path::new("m.toml")).unwrap();
        assert_eq!(b.mig_layouts()[0].2.occupied(), 0xff);
    }
}
