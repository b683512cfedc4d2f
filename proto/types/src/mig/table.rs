//! Where MIG GPU instances may sit on an H100 or H200: the one table of models, profiles, sizes,
//! allowed starts and memory that the agent's placement rules, its fake NVML layer and the
//! simulator's agents all read (issue 37 §3, docs/mig.md "The placement rules and where they
//! come from").
//!
//! A GPU in MIG mode has 8 memory slices. A GPU instance of a profile occupies `size`
//! consecutive slices starting at one of the starts the hardware allows for that profile; two
//! instances may not share a slice. The table below is what `nvidia-smi mig -lgipp` prints on
//! an H100 (NVIDIA's MIG user guide, "Getting Started with MIG › List GPU Instance Profiles",
//! gives the notation `{starts}:size` and the same table; the sources and what was checked are
//! in docs/mig.md): profile ids 19 and 20 (`1g`, `1g+me`) at `{0..6}:1`, 15 (`1g` with two
//! memory slices) at `{0,2,4,6}:2`, 14 (`2g`) at `{0,2,4}:2`, 9 (`3g`) at `{0,4}:4`, 5 (`4g`) at
//! `{0}:4`, 0 (`7g`) at `{0}:8`. The H200 has the same slices and profile shapes (the user
//! guide's "Supported MIG Profiles" gives both the same fractions of memory and the same
//! instance counts) with larger memory; its placements are taken to be the H100's.
//!
//! Compute slices need no rule of their own: on these GPUs no layout whose memory slices fit
//! exceeds the 7 compute slices (`7g` is the only profile with fewer compute than memory
//! slices, and it takes the whole GPU).

use std::fmt;

/// Memory slices of an H100 or H200 in MIG mode.
pub const MEMORY_SLICES: u32 = 8;

/// A GPU instance profile of a GPU model: its name, NVML's profile id, and where it fits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiProfile {
    /// NVML's GPU instance profile id, as `nvidia-smi mig -lgip` lists it (19 for `1g.10gb`).
    pub id: u32,
    /// The profile's name (`1g.18gb`).
    pub name: &'static str,
    /// Memory slices it occupies.
    pub size: u32,
    /// The memory slices it may start at.
    pub starts: &'static [u32],
    /// At most this many instances of it on one GPU (only `+me` has fewer than its starts).
    pub max_instances: u32,
    /// Its memory in MiB (what a fake or simulated instance of it reports).
    pub memory_mib: u64,
    /// Its SMs.
    pub sm_count: u32,
}

impl GiProfile {
    /// The placement starting at `start`, if the profile may start there.
    #[must_use]
    pub fn placement_at(&self, start: u32) -> Option<Placement> {
        self.starts.contains(&start).then_some(Placement {
            start,
            size: self.size,
        })
    }

    /// Every placement the hardware allows for the profile, free or not.
    pub fn placements(&self) -> impl Iterator<Item = Placement> + '_ {
        self.starts.iter().map(|&start| Placement {
            start,
            size: self.size,
        })
    }

    /// Its compute slices: the `g` of its name (`3g.71gb` → 3); `None` for a name without one.
    #[must_use]
    pub fn compute_slices(&self) -> Option<u32> {
        self.name.split_once('g')?.0.parse().ok()
    }

    /// Its memory in bytes.
    #[must_use]
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib << 20
    }
}

/// Memory slices `[start, start + size)` of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Placement {
    /// The first slice.
    pub start: u32,
    /// How many slices.
    pub size: u32,
}

impl Placement {
    /// The slices as a bit mask (bit `i` is slice `i`); slices past 31 are dropped.
    #[must_use]
    pub fn mask(self) -> u32 {
        let ones = 1u32.checked_shl(self.size).map_or(u32::MAX, |b| b - 1);
        ones.checked_shl(self.start).unwrap_or(0)
    }

    /// Whether the two share a slice.
    #[must_use]
    pub fn overlaps(self, other: Self) -> bool {
        self.mask() & other.mask() != 0
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{{}}}:{}", self.start, self.size)
    }
}

/// A GPU model's MIG profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuModel {
    /// What the model's name contains (`H100`, `H200`).
    pub name: &'static str,
    /// Its profiles, largest first.
    pub profiles: &'static [GiProfile],
}

impl GpuModel {
    /// The profile named `name` (`1g.18gb`, `1g.18gb+me`).
    #[must_use]
    pub fn profile(&self, name: &str) -> Option<&'static GiProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// The profile with NVML id `id`.
    #[must_use]
    pub fn profile_by_id(&self, id: u32) -> Option<&'static GiProfile> {
        self.profiles.iter().find(|p| p.id == id)
    }

    /// The whole GPU's compute slices: the largest `g` among its profiles (7).
    #[must_use]
    pub fn compute_slices(&self) -> u32 {
        self.profiles
            .iter()
            .filter_map(GiProfile::compute_slices)
            .max()
            .unwrap_or(0)
    }
}

const ONE_SLICE: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const TWO_SLICES_1G: &[u32] = &[0, 2, 4, 6];
const TWO_SLICES_2G: &[u32] = &[0, 2, 4];
const FOUR_SLICES_3G: &[u32] = &[0, 4];
const AT_ZERO: &[u32] = &[0];

/// Declares a model's seven profiles from their names, memory and SMs; ids, sizes and starts
/// are the same on both models.
macro_rules! profiles {
    ($( $id:literal $name:literal $size:literal $starts:ident $max:literal $mib:literal $sms:literal ;)*) => {
        &[$( GiProfile {
            id: $id,
            name: $name,
            size: $size,
            starts: $starts,
            max_instances: $max,
            memory_mib: $mib,
            sm_count: $sms,
        }, )*]
    };
}

/// H100 80GB (`SXM5` and `PCIe`). Memory and SMs as `nvidia-smi mig -lgip` reports them on one
/// (a public listing; they are figures the fake reports, no rule depends on them).
pub const H100_80GB: GpuModel = GpuModel {
    name: "H100",
    profiles: profiles! {
        0 "7g.80gb" 8 AT_ZERO 1 81_152 132;
        5 "4g.40gb" 4 AT_ZERO 1 40_448 64;
        9 "3g.40gb" 4 FOUR_SLICES_3G 2 40_448 60;
        14 "2g.20gb" 2 TWO_SLICES_2G 3 20_096 32;
        15 "1g.20gb" 2 TWO_SLICES_1G 4 20_096 26;
        19 "1g.10gb" 1 ONE_SLICE 7 9_984 16;
        20 "1g.10gb+me" 1 ONE_SLICE 1 9_984 16;
    },
};

/// H200 141GB: the H100's shapes with the H200's profile names (user guide, "H200 MIG
/// Profiles"); memory scaled from the names (whole GiB), SMs as on the H100.
pub const H200_141GB: GpuModel = GpuModel {
    name: "H200",
    profiles: profiles! {
        0 "7g.141gb" 8 AT_ZERO 1 144_384 132;
        5 "4g.71gb" 4 AT_ZERO 1 72_704 64;
        9 "3g.71gb" 4 FOUR_SLICES_3G 2 72_704 60;
        14 "2g.35gb" 2 TWO_SLICES_2G 3 35_840 32;
        15 "1g.35gb" 2 TWO_SLICES_1G 4 35_840 26;
        19 "1g.18gb" 1 ONE_SLICE 7 18_432 16;
        20 "1g.18gb+me" 1 ONE_SLICE 1 18_432 16;
    },
};

/// The MIG model of a GPU by its name (`NVIDIA H200`, `Mock H100 80GB HBM3`); `None` for a
/// model whose placements this module does not know (gpuwarden then never reconfigures it).
#[must_use]
pub fn model_of(name: &str) -> Option<&'static GpuModel> {
    [&H200_141GB, &H100_80GB]
        .into_iter()
        .find(|m| name.contains(m.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_are_masks_of_their_slices() {
        assert_eq!(Placement { start: 0, size: 8 }.mask(), 0xff);
        assert_eq!(Placement { start: 6, size: 2 }.mask(), 0b1100_0000);
        assert!(!Placement { start: 0, size: 4 }.overlaps(Placement { start: 4, size: 4 }));
        assert!(Placement { start: 2, size: 2 }.overlaps(Placement { start: 3, size: 1 }));
        assert_eq!(Placement { start: 4, size: 2 }.to_string(), "{4}:2");
    }

    #[test]
    fn a_profiles_compute_slices_are_the_g_of_its_name() {
        let g = |name: &'static str| {
            GiProfile {
                name,
                ..H200_141GB.profiles[0]
            }
            .compute_slices()
        };
        assert_eq!(g("3g.71gb"), Some(3));
        assert_eq!(g("1g.18gb+me"), Some(1));
        assert_eq!(g("7g.141gb"), Some(7));
        assert_eq!(g("gpu"), None);
        assert_eq!(g("x.5gb"), None);
        for model in [&H100_80GB, &H200_141GB] {
            assert_eq!(model.compute_slices(), 7, "{}", model.name);
        }
    }

    #[test]
    fn a_gpu_is_known_by_its_models_name() {
        assert_eq!(model_of("NVIDIA H200").map(|m| m.name), Some("H200"));
        assert_eq!(
            model_of("Mock H100 80GB HBM3").map(|m| m.name),
            Some("H100")
        );
        assert_eq!(model_of("NVIDIA A100-SXM4-80GB"), None);
        // The memory of an H200 profile is the whole GiB its name gives.
        for p in H200_141GB.profiles {
            let base = p.name.split('+').next().unwrap_or_default();
            let gb: u64 = base
                .split_once('.')
                .and_then(|(_, m)| m.strip_suffix("gb")?.parse().ok())
                .unwrap();
            assert_eq!(p.memory_bytes(), gb << 30, "{}", p.name);
        }
    }
}
