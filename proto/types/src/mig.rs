//! A GPU whose MIG layout gpuwarden may change, as its agent reports it and the controller
//! places new instances on it (issue 37 §3, docs/mig.md "Instances made on demand"): its
//! memory slices, the placements its instances hold, and for each profile the starts the
//! hardware allows and those free now. One type for both sides; the wire form is
//! `gpuwarden_proto::v1::MigLayout` (`gpuwarden_proto::convert::mig_layout_to_pb` and back).
//!
//! Beside it, the one table of the H100's and H200's MIG profiles (sizes, allowed starts,
//! memory: [`H100_80GB`], [`H200_141GB`]) that the agent and the simulator's agents both read.

mod table;

pub use table::{GiProfile, GpuModel, H100_80GB, H200_141GB, MEMORY_SLICES, Placement, model_of};

use serde::{Deserialize, Serialize};

/// One reconfigurable GPU's MIG layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigGpuLayout {
    /// The GPU's UUID.
    pub gpu_uuid: String,
    /// Its index on the node.
    pub gpu_index: u32,
    /// Its memory slices.
    pub slices: u32,
    /// The placements its instances hold: `(start, size)` in memory slices.
    pub occupied: Vec<(u32, u32)>,
    /// Each profile of the model, largest first as the agent lists them.
    pub profiles: Vec<MigProfilePlacements>,
}

/// Where one profile may go on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigProfilePlacements {
    /// The profile (`1g.18gb`).
    pub profile: String,
    /// Memory slices it takes.
    pub size: u32,
    /// Every start the hardware allows it.
    pub starts: Vec<u32>,
    /// The starts free now, as the agent checked them (overlap and instance counts).
    pub free: Vec<u32>,
}

impl MigGpuLayout {
    /// The occupied slices as a bit mask (slice `i` is bit `i`).
    #[must_use]
    pub fn occupied_mask(&self) -> u64 {
        self.occupied
            .iter()
            .fold(0, |m, &(start, size)| m | slice_mask(start, size))
    }

    /// Free slices.
    #[must_use]
    pub fn free_slices(&self) -> u32 {
        let all = slice_mask(0, self.slices);
        (all & !self.occupied_mask()).count_ones()
    }
}

/// The slices `[start, start + size)` as a bit mask (empty past 64 slices).
#[must_use]
pub fn slice_mask(start: u32, size: u32) -> u64 {
    let ones = 1u64.checked_shl(size).map_or(u64::MAX, |b| b - 1);
    ones.checked_shl(start).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occupied_slices_are_counted_once() {
        let layout = MigGpuLayout {
            gpu_uuid: "GPU-1".into(),
            gpu_index: 0,
            slices: 8,
            // A 3g at 4-7 and a 1g at 0: slices 1-3 free.
            occupied: vec![(4, 4), (0, 1)],
            profiles: vec![],
        };
        assert_eq!(layout.occupied_mask(), 0b1111_0001);
        assert_eq!(layout.free_slices(), 3);
        assert_eq!(slice_mask(0, 64), u64::MAX);
        assert_eq!(slice_mask(64, 1), 0);
    }
}
