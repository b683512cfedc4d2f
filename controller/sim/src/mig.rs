//! MIG nodes in the replay (issue 37, docs/simulation.md "MIG nodes"): H200s in MIG mode, some
//! cut by their operator in NVIDIA's "balanced" layout, the others handed to gpuwarden with no
//! instance at start, and the simulator playing each node's agent for them.
//!
//! What the simulated agent does is what `agent/src/control/link/mig.rs` does on a node whose
//! operator lists GPUs in `mig_reconfigurable` (docs/mig.md, "Instances made on demand"):
//!
//! - It reports each instance as a device of its own (numbered after every physical GPU, the
//!   parent GPU never offered whole), each profile as a count slot type with its number of
//!   instances, and for each reconfigurable GPU its layout: the placements its instances hold,
//!   and for each profile the starts the hardware allows and those free now.
//! - On the controller's `MakeMigInstance` it makes the instance at the placement the
//!   controller chose — refusing, as the driver would, a start the profile may not take, an
//!   overlap, a GPU not handed over — and registers again.
//! - It destroys an instance it made once no session it holds names it: one a session held and
//!   let go, or one no session took within [`GRACE_SECS`] of its making; then registers again.
//!   The operator's instances are never destroyed.
//!
//! The simulator's nodes hold no process of their own, so the agent's refusal of a GPU with a
//! process on it never comes up here.

use std::collections::{BTreeMap, BTreeSet};

use gpuwarden_controller::{
    allocator::{
        DeviceSpec,
        mig::{MigGpuLayout, MigProfilePlacements},
    },
    node::NodeReport,
    slots::{SlotKind, SlotName, SlotValue, names},
};
use gpuwarden_types::mig::{GiProfile, H200_141GB, MEMORY_SLICES, Placement};

/// The model of the simulated GPUs in MIG mode (as NVML names it; an instance is
/// `NVIDIA H200 MIG <profile>`).
pub const MODEL: &str = "NVIDIA H200";

/// Seconds a made instance waits for a session before it is destroyed untaken (the agent's
/// grace, `agent/src/control/link/mig.rs`: two minutes).
pub const GRACE_SECS: f64 = 120.0;

/// The H200's profiles the simulated agent offers, largest first (as the agent lists them):
/// the table the agent reads ([`H200_141GB`], docs/mig.md "The placement rules and where they
/// come from"), less a profile allowed fewer instances than it has starts (`+me`): the
/// simulated agent checks overlap only, and the simulator never asks for it.
pub fn profiles() -> impl Iterator<Item = &'static GiProfile> {
    H200_141GB
        .profiles
        .iter()
        .filter(|p| usize::try_from(p.max_instances).is_ok_and(|m| m >= p.starts.len()))
}

/// NVIDIA's "balanced" layout of an H200 (mig-parted's `all-balanced`): two `1g.18gb`, a
/// `2g.35gb` and a `3g.71gb`, as `(profile, start)`.
pub const BALANCED: [(&str, u32); 4] = [
    ("1g.18gb", 0),
    ("1g.18gb", 1),
    ("2g.35gb", 2),
    ("3g.71gb", 4),
];

/// The profile named `name`, among those the simulated agent offers.
#[must_use]
pub fn profile(name: &str) -> Option<&'static GiProfile> {
    profiles().find(|p| p.name == name)
}

/// An instance on a simulated GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    /// Its device index on the node.
    pub index: u32,
    /// Its UUID.
    pub uuid: String,
    /// Its profile.
    pub profile: &'static GiProfile,
    /// Its first memory slice.
    pub start: u32,
    /// Made by the agent (`Some`), or the operator's.
    made: Option<Made>,
}

/// What the agent keeps of an instance it made.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Made {
    /// Virtual time of its making.
    at: f64,
    /// Whether a session has held it.
    held: bool,
}

impl Instance {
    /// The memory slices it holds.
    #[must_use]
    pub fn placement(&self) -> Placement {
        Placement {
            start: self.start,
            size: self.profile.size,
        }
    }

    /// Whether the agent made it (the operator's are never destroyed).
    #[must_use]
    pub fn made_here(&self) -> bool {
        self.made.is_some()
    }
}

/// A GPU in MIG mode.
#[derive(Debug, Clone, PartialEq)]
pub struct MigGpu {
    /// Its UUID.
    pub uuid: String,
    /// Its index on the node (its minor).
    pub index: u32,
    /// Its NUMA node.
    pub numa_node: i32,
    /// Whether the operator handed its layout to gpuwarden (`mig_reconfigurable`).
    pub reconfigurable: bool,
    /// Its instances.
    pub instances: Vec<Instance>,
}

impl MigGpu {
    /// Starts of `p` free now: no overlap with an instance.
    fn free_starts(&self, p: &GiProfile) -> Vec<u32> {
        p.placements()
            .filter(|&at| !self.instances.iter().any(|i| i.placement().overlaps(at)))
            .map(|at| at.start)
            .collect()
    }

    /// Its layout as the agent reports it.
    fn layout(&self) -> MigGpuLayout {
        MigGpuLayout {
            gpu_uuid: self.uuid.clone(),
            gpu_index: self.index,
            slices: MEMORY_SLICES,
            occupied: self
                .instances
                .iter()
                .map(|i| (i.start, i.profile.size))
                .collect(),
            profiles: profiles()
                .map(|p| MigProfilePlacements {
                    profile: p.name.to_owned(),
                    size: p.size,
                    starts: p.starts.to_vec(),
                    free: self.free_starts(p),
                })
                .collect(),
        }
    }
}

/// An instance the simulated agent (as the driver would) refuses to make.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MakeError {
    /// The node has no such GPU in MIG mode.
    #[error("no GPU {gpu} in MIG mode on this node")]
    NoGpu {
        /// The UUID asked for.
        gpu: String,
    },
    /// The operator did not hand the GPU over.
    #[error("GPU {gpu} is not listed in mig_reconfigurable")]
    NotListed {
        /// The GPU.
        gpu: String,
    },
    /// Not a profile of the model.
    #[error("no MIG profile {profile} on an {MODEL}")]
    NoProfile {
        /// The profile asked for.
        profile: String,
    },
    /// A start the profile may not take.
    #[error("{profile} may not start at memory slice {start}")]
    Start {
        /// The profile.
        profile: String,
        /// The start asked for.
        start: u32,
    },
    /// The slices are held by another instance.
    #[error("{profile} at memory slice {start} overlaps the instance at {other}")]
    Overlap {
        /// The profile.
        profile: String,
        /// The start asked for.
        start: u32,
        /// The start of the instance in the way.
        other: u32,
    },
    /// Ordered again for the same session in one round, after the instance was made.
    #[error("ordered again after it was made")]
    Again,
}

/// A simulated node with GPUs in MIG mode (and perhaps whole ones), and its agent's state.
#[derive(Debug, Clone, PartialEq)]
pub struct MigNode {
    /// Node id.
    pub id: String,
    /// Its whole GPUs (not in MIG mode): indexes `0..whole`, before those in MIG mode.
    pub whole: u32,
    /// Its GPUs in MIG mode.
    pub gpus: Vec<MigGpu>,
    /// NUMA nodes' size, in GPUs.
    gpus_per_numa: u32,
    /// The next instance's device index (indexes are not reused within a run).
    next_index: u32,
    /// Instances made and destroyed so far.
    made: u64,
    destroyed: u64,
}

impl MigNode {
    /// Node `id` with `gpus` H200s in MIG mode, `gpus_per_numa` to a NUMA node: the first half
    /// (rounded down) cut in the [`BALANCED`] layout by the operator, the others reconfigurable
    /// and empty.
    #[must_use]
    pub fn new(id: &str, gpus: u32, gpus_per_numa: u32) -> Self {
        Self::build(id, 0, gpus / 2, gpus - gpus / 2, gpus_per_numa)
    }

    /// Node `id` with `whole` H200s offered whole, then `reconfigurable` in MIG mode with no
    /// instance at start (the bench's fleet for instances made on demand).
    #[must_use]
    pub fn mixed(id: &str, whole: u32, reconfigurable: u32, gpus_per_numa: u32) -> Self {
        Self::build(id, whole, 0, reconfigurable, gpus_per_numa)
    }

    /// Node `id` with `whole` H200s offered whole, then `balanced` in MIG mode cut by their
    /// operator in the [`BALANCED`] layout, none reconfigurable (the bench's fleet for static
    /// MIG).
    #[must_use]
    pub fn cut(id: &str, whole: u32, balanced: u32, gpus_per_numa: u32) -> Self {
        Self::build(id, whole, balanced, 0, gpus_per_numa)
    }

    fn build(id: &str, whole: u32, balanced: u32, reconfigurable: u32, gpus_per_numa: u32) -> Self {
        let gpus = whole + balanced + reconfigurable;
        let per_numa = gpus_per_numa.max(1);
        let mut node = Self {
            id: id.to_owned(),
            whole,
            gpus: Vec::new(),
            gpus_per_numa: per_numa,
            next_index: gpus,
            made: 0,
            destroyed: 0,
        };
        for g in whole..gpus {
            let mut gpu = MigGpu {
                uuid: format!("{id}-GPU-{g}"),
                index: g,
                numa_node: i32::try_from(g / per_numa).unwrap_or(0),
                reconfigurable: g >= whole + balanced,
                instances: Vec::new(),
            };
            if !gpu.reconfigurable {
                for (name, start) in BALANCED {
                    let Some(p) = profile(name) else { continue };
                    let index = node.next_index;
                    node.next_index += 1;
                    gpu.instances.push(Instance {
                        index,
                        uuid: format!("{id}-MIG-{index}"),
                        profile: p,
                        start,
                        made: None,
                    });
                }
            }
            node.gpus.push(gpu);
        }
        node
    }

    /// Every instance with its GPU.
    pub fn instances(&self) -> impl Iterator<Item = (&MigGpu, &Instance)> {
        self.gpus
            .iter()
            .flat_map(|g| g.instances.iter().map(move |i| (g, i)))
    }

    /// The instance at device `index`.
    #[must_use]
    pub fn instance(&self, index: u32) -> Option<&Instance> {
        self.instances().map(|(_, i)| i).find(|i| i.index == index)
    }

    /// Instances made and destroyed so far.
    #[must_use]
    pub fn changes(&self) -> (u64, u64) {
        (self.made, self.destroyed)
    }

    /// What the agent reports when it registers.
    #[must_use]
    pub fn report(&self) -> NodeReport {
        let mut node = NodeReport {
            agent_version: "sim".into(),
            ..NodeReport::with_gpus(&self.id, self.whole, 141 << 30, self.gpus_per_numa)
        };
        node.device_models = vec![(MODEL.to_owned(), false); node.devices.len()];
        let mut count: BTreeMap<&str, u64> = BTreeMap::new();
        for (gpu, i) in self.instances() {
            node.devices.push(DeviceSpec {
                uuid: i.uuid.clone(),
                index: i.index,
                memory_bytes: i.profile.memory_bytes(),
                // 16 SMs a compute slice: the simulator's own round figure.
                sm_count: 16 * i.profile.compute_slices().unwrap_or(0),
                numa_node: gpu.numa_node,
                parent_uuid: gpu.uuid.clone(),
            });
            node.device_models
                .push((format!("{MODEL} MIG {}", i.profile.name), true));
            *count.entry(i.profile.name).or_default() += 1;
        }
        // Each profile a slot type, with its number of instances (none yet on a node whose
        // reconfigurable GPUs could hold one: the controller knows it can be made).
        for p in profiles() {
            let n = count.get(p.name).copied().unwrap_or(0);
            let Ok(slot) = SlotName::new(&names::mig_slot(p.name)) else {
                continue;
            };
            node.slot_types.push((slot.clone(), SlotKind::Count));
            node.capacity.set(slot, SlotValue::from_int(n));
        }
        node.mig_layouts = self
            .gpus
            .iter()
            .filter(|g| g.reconfigurable)
            .map(MigGpu::layout)
            .collect();
        node
    }

    /// Makes an instance of `profile` at memory slice `start` of GPU `gpu` at virtual time
    /// `now`, as the controller ordered; its device index.
    ///
    /// # Errors
    /// What the agent or the driver would refuse: see [`MakeError`].
    pub fn make(
        &mut self,
        gpu: &str,
        profile_name: &str,
        start: u32,
        now: f64,
    ) -> Result<u32, MakeError> {
        let Some(g) = self.gpus.iter_mut().find(|g| g.uuid == gpu) else {
            return Err(MakeError::NoGpu {
                gpu: gpu.to_owned(),
            });
        };
        if !g.reconfigurable {
            return Err(MakeError::NotListed {
                gpu: gpu.to_owned(),
            });
        }
        let Some(p) = profile(profile_name) else {
            return Err(MakeError::NoProfile {
                profile: profile_name.to_owned(),
            });
        };
        let Some(at) = p.placement_at(start) else {
            return Err(MakeError::Start {
                profile: p.name.to_owned(),
                start,
            });
        };
        if let Some(other) = g.instances.iter().find(|i| i.placement().overlaps(at)) {
            return Err(MakeError::Overlap {
                profile: p.name.to_owned(),
                start,
                other: other.start,
            });
        }
        let index = self.next_index;
        self.next_index += 1;
        g.instances.push(Instance {
            index,
            uuid: format!("{}-MIG-{index}", self.id),
            profile: p,
            start,
            made: Some(Made {
                at: now,
                held: false,
            }),
        });
        self.made += 1;
        Ok(index)
    }

    /// The agent's heartbeat and release path at virtual time `now`, `held` the device indexes
    /// its sessions hold: notes the instances held, and destroys those it made that none holds
    /// and that were held before or are past their grace. Whether any was destroyed.
    pub fn sweep(&mut self, held: &BTreeSet<u32>, now: f64) -> bool {
        let mut destroyed = 0;
        for g in &mut self.gpus {
            g.instances.retain_mut(|i| {
                let Some(made) = &mut i.made else {
                    return true;
                };
                if held.contains(&i.index) {
                    made.held = true;
                    return true;
                }
                let due = made.held || now - made.at >= GRACE_SECS;
                destroyed += u64::from(due);
                !due
            });
        }
        self.destroyed += destroyed;
        destroyed > 0
    }

    /// The share of its GPU device `index` stands for (its compute slices over the GPU's), for
    /// the utilization averaged over the cluster's GPUs.
    #[must_use]
    pub fn weight(&self, index: u32) -> Option<f64> {
        self.instance(index).map(|i| {
            f64::from(i.profile.compute_slices().unwrap_or(0))
                / f64::from(H200_141GB.compute_slices())
        })
    }
}

#[cfg(test)]
mod tests;
