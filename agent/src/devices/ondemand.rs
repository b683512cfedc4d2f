//! MIG instances made on demand (issue 37 §3, docs/mig.md "Instances made on demand").
//!
//! The operator lists the GPUs whose MIG layout gpuwarden may change (`mig_reconfigurable`,
//! none by default). For those the agent reports each profile's free placements, so the
//! controller can choose where a new instance goes; the agent then creates it through its
//! backend (a GPU instance at that placement and a compute instance of the whole of it), and
//! destroys it once the session on it is released. It never touches a GPU it was not given,
//! an instance it did not make, or a GPU with a process on it: each of those is refused with
//! the reason.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use gpuwarden_runtime::sync::Lock as _;

use super::{
    GpuBackend, GpuDevice,
    placement::{Layout, Placement},
};

/// What a reconfigurable GPU's layout allows now, as reported to the controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutReport {
    /// The GPU's UUID.
    pub gpu_uuid: String,
    /// Its index on the node.
    pub gpu_index: u32,
    /// Its memory slices.
    pub slices: u32,
    /// The placements taken by instances.
    pub occupied: Vec<Placement>,
    /// Each profile of the model, largest first.
    pub profiles: Vec<ProfileReport>,
}

/// One profile on a reconfigurable GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileReport {
    /// The profile (`1g.18gb`).
    pub profile: String,
    /// Memory slices it takes.
    pub size: u32,
    /// Every start the hardware allows it.
    pub starts: Vec<u32>,
    /// The starts free now (no overlap, under its instance count).
    pub free: Vec<u32>,
}

impl LayoutReport {
    /// The report of `layout` on GPU `gpu_uuid` (index `gpu_index`).
    #[must_use]
    pub fn of(gpu_uuid: &str, gpu_index: u32, layout: &Layout) -> Self {
        Self {
            gpu_uuid: gpu_uuid.to_owned(),
            gpu_index,
            slices: super::placement::MEMORY_SLICES,
            occupied: layout.instances.iter().map(|(_, p)| *p).collect(),
            profiles: layout
                .model
                .profiles
                .iter()
                .map(|p| ProfileReport {
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

/// The agent's side of on-demand instances: the operator's list, and the instances it made.
#[derive(Debug, Default)]
pub struct Reconfigurer {
    allowed: BTreeSet<String>,
    made: std::sync::Mutex<BTreeMap<String, Made>>,
}

/// An instance gpuwarden made: when, and whether a session has held it since.
#[derive(Debug, Clone, Copy)]
struct Made {
    at: Instant,
    held: bool,
}

impl Reconfigurer {
    /// May change the layout of the GPUs whose UUIDs are `allowed` (none: nothing changes).
    #[must_use]
    pub fn new(allowed: impl IntoIterator<Item = String>) -> Self {
        Self {
            allowed: allowed.into_iter().collect(),
            made: std::sync::Mutex::default(),
        }
    }

    /// Whether the operator gave gpuwarden the GPU `uuid`.
    #[must_use]
    pub fn allows(&self, uuid: &str) -> bool {
        self.allowed.contains(uuid)
    }

    /// The layouts of the allowed GPUs the backend can change, by GPU index.
    #[must_use]
    pub fn layouts(&self, backend: &dyn GpuBackend) -> Vec<LayoutReport> {
        let mut out: Vec<LayoutReport> = backend
            .mig_layouts()
            .into_iter()
            .filter(|(uuid, _, _)| self.allows(uuid))
            .map(|(uuid, index, layout)| LayoutReport::of(&uuid, index, &layout))
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
        self.made.locked().insert(
            device.uuid.clone(),
            Made {
                at: Instant::now(),
                held: false,
            },
        );
        tracing::info!(%gpu, profile, start, instance = %device.uuid, index = device.index, "MIG instance created");
        Ok(device)
    }

    /// Destroys the instance `uuid` if gpuwarden made it and no process is on its GPU;
    /// `Ok(false)` when it was not made here (the operator's instances stay).
    ///
    /// # Errors
    /// [`MigChangeError`]: busy, unknown, or refused by the backend.
    pub fn release(
        &self,
        backend: &dyn GpuBackend,
        busy: &BTreeSet<u32>,
        uuid: &str,
    ) -> Result<bool, MigChangeError> {
        if !self.made.locked().contains_key(uuid) {
            return Ok(false);
        }
        let devices = backend.devices();
        let parent = devices
            .iter()
            .find(|d| d.uuid == uuid)
            .and_then(|d| d.mig.as_ref())
            .map(|m| m.parent_uuid.clone())
            .ok_or_else(|| MigChangeError::NoInstance {
                uuid: uuid.to_owned(),
            })?;
        check_idle(backend, busy, &parent)?;
        backend.destroy_instance(uuid)?;
        self.made.locked().remove(uuid);
        tracing::info!(gpu = %parent, instance = %uuid, "MIG instance destroyed");
        Ok(true)
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
            if held.contains(uuid) {
                m.held = true;
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
                m.held = true;
            } else if m.held || m.at.elapsed() >= grace {
                out.push(uuid.clone());
            }
        }
        out
    }
}

/// Refuses when a process is on GPU `gpu`: on its own index or one of its instances', as the
/// agent saw it (`busy`) or as the driver counts it ([`GpuBackend::process_memory`]).
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
    let driver_busy: BTreeSet<u32> = backend.process_memory().iter().map(|p| p.index).collect();
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

    fn free(reports: &[LayoutReport], gpu: &str, profile: &str) -> Vec<u32> {
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
