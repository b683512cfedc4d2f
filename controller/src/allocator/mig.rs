//! Where a new MIG instance goes (issue 37 §3, docs/mig.md "Instances made on demand").
//!
//! An agent reports, for each GPU whose MIG layout the operator lets gpuwarden change, the
//! memory slices its instances hold and, for each profile, the starts the hardware allows and
//! those free now. When a request for a profile finds no idle instance of it, the controller
//! chooses a free placement on one of those GPUs so as not to fragment them:
//!
//! **The rule.** Among the free placements of the profile on every reconfigurable GPU of the
//! node, take the one after which the node could still hold the most instances of its largest
//! profiles: compare, profile by profile from the most memory slices to the fewest, how many
//! instances of it could still be made side by side (summed over the node's GPUs); the first
//! difference decides. Ties go to the GPU with the fewest free slices (an emptier GPU is kept
//! whole), then to the lower GPU index, then to the higher start.
//!
//! On an empty H100 a `1g.10gb` thus goes to slice 6, not 0: at 0 it would leave no room for
//! the `4g.40gb`, whose only start is 0. (No NVIDIA document found states a rule of its own;
//! docs/mig.md says what was checked.)
//!
//! The count of instances side by side is exact for these layouts: every placement of one
//! profile has the same size, so taking the free placements lowest start first fits the most.

use std::cmp::Reverse;

use gpuwarden_types::mig::slice_mask;
pub use gpuwarden_types::mig::{MigGpuLayout, MigProfilePlacements};

/// A placement chosen for a new instance.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MigPlacement {
    /// The GPU's UUID.
    pub gpu_uuid: String,
    /// Its index on the node.
    pub gpu_index: u32,
    /// The profile.
    pub profile: String,
    /// The first memory slice.
    pub start: u32,
    /// How many slices.
    pub size: u32,
}

/// How many instances of `p` could be made side by side with `occupied` held.
fn side_by_side(p: &MigProfilePlacements, occupied: u64) -> u32 {
    let mut taken = occupied;
    let mut count = 0;
    let mut starts = p.starts.clone();
    starts.sort_unstable();
    for s in starts {
        let m = slice_mask(s, p.size);
        if m != 0 && taken & m == 0 {
            taken |= m;
            count += 1;
        }
    }
    count
}

/// The most instances of `profile` a GPU of `layout` holds side by side, from empty.
#[must_use]
pub fn most_instances(layout: &MigGpuLayout, profile: &str) -> u32 {
    layout
        .profiles
        .iter()
        .find(|p| p.profile == profile)
        .map_or(0, |p| side_by_side(p, 0))
}

/// The profiles of the node's layouts, by name, largest first (the order the rule reads them).
fn profile_order(layouts: &[MigGpuLayout]) -> Vec<(String, u32)> {
    let mut names: Vec<(String, u32)> = Vec::new();
    for p in layouts.iter().flat_map(|l| &l.profiles) {
        if !names.iter().any(|(n, _)| *n == p.profile) {
            names.push((p.profile.clone(), p.size));
        }
    }
    names.sort_by_key(|(name, size)| (Reverse(*size), name.clone()));
    names
}

/// What the node could still hold, profile by profile (largest first), with `extra` slices
/// also held on the GPU at position `on`.
fn capacity(layouts: &[MigGpuLayout], order: &[(String, u32)], on: usize, extra: u64) -> Vec<u32> {
    order
        .iter()
        .map(|(name, _)| {
            layouts
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    let held = l.occupied_mask() | if i == on { extra } else { 0 };
                    l.profiles
                        .iter()
                        .find(|p| p.profile == *name)
                        .map_or(0, |p| side_by_side(p, held))
                })
                .sum()
        })
        .collect()
}

/// What decides between two placements, compared in this order (the module's rule): what the
/// node could still hold, then fewer free slices on the GPU, then the lower GPU index, then the
/// higher start.
type Rank = (Vec<u32>, Reverse<u32>, Reverse<u32>, u32);

/// Where a new instance of `profile` goes among the node's reconfigurable GPUs, by the rule
/// of this module; `None` when no free placement of it is left on any of them.
#[must_use]
pub fn choose_placement(layouts: &[MigGpuLayout], profile: &str) -> Option<MigPlacement> {
    let order = profile_order(layouts);
    let mut best: Option<(Rank, MigPlacement)> = None;
    for (i, l) in layouts.iter().enumerate() {
        let Some(p) = l.profiles.iter().find(|p| p.profile == profile) else {
            continue;
        };
        for &start in &p.free {
            let m = slice_mask(start, p.size);
            // The agent's list is checked again: a start it calls free but that overlaps is
            // skipped, so no slice is handed out twice.
            if m == 0 || l.occupied_mask() & m != 0 || !p.starts.contains(&start) {
                continue;
            }
            let rank: Rank = (
                capacity(layouts, &order, i, m),
                Reverse(l.free_slices()),
                Reverse(l.gpu_index),
                start,
            );
            if best.as_ref().is_none_or(|(r, _)| rank > *r) {
                best = Some((
                    rank,
                    MigPlacement {
                        gpu_uuid: l.gpu_uuid.clone(),
                        gpu_index: l.gpu_index,
                        profile: profile.to_owned(),
                        start,
                        size: p.size,
                    },
                ));
            }
        }
    }
    best.map(|(_, placement)| placement)
}

#[cfg(test)]
mod tests;
