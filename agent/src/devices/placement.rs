//! Where MIG GPU instances may sit on an H100 or H200 (issue 37 §3, docs/mig.md "Instances
//! made on demand").
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
//! Compute slices need no rule of their own here: on these GPUs no layout whose memory slices
//! fit exceeds the 7 compute slices (`7g` is the only profile with fewer compute than memory
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
    /// Its memory in MiB (what the fake reports for an instance of it).
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
/// Profiles"); memory scaled from the names, SMs as on the H100.
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

/// The instances on one GPU, by placement, and what still fits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The model.
    pub model: &'static GpuModel,
    /// The GPU instances there: profile and placement.
    pub instances: Vec<(&'static GiProfile, Placement)>,
}

impl Layout {
    /// An empty GPU of `model`.
    #[must_use]
    pub fn empty(model: &'static GpuModel) -> Self {
        Self {
            model,
            instances: Vec::new(),
        }
    }

    /// The occupied slices as a bit mask.
    #[must_use]
    pub fn occupied(&self) -> u32 {
        self.instances.iter().fold(0, |m, (_, p)| m | p.mask())
    }

    /// Why `profile` can't be placed at `placement` now, or `None` when it can.
    #[must_use]
    pub fn refusal(&self, profile: &GiProfile, placement: Placement) -> Option<PlacementRefusal> {
        if profile.placement_at(placement.start) != Some(placement) {
            return Some(PlacementRefusal::BadStart {
                profile: profile.name,
                placement,
                allowed: profile.starts,
            });
        }
        if let Some((other, at)) = self.instances.iter().find(|(_, at)| at.overlaps(placement)) {
            return Some(PlacementRefusal::Overlap {
                placement,
                other: other.name,
                at: *at,
            });
        }
        let count = self.instances.iter().filter(|(p, _)| p.id == profile.id);
        if u32::try_from(count.count()).unwrap_or(u32::MAX) >= profile.max_instances {
            return Some(PlacementRefusal::TooMany {
                profile: profile.name,
                max: profile.max_instances,
            });
        }
        None
    }

    /// The placements of `profile` free now, lowest start first.
    #[must_use]
    pub fn free_placements(&self, profile: &GiProfile) -> Vec<Placement> {
        profile
            .placements()
            .filter(|&p| self.refusal(profile, p).is_none())
            .collect()
    }
}

/// Why a GPU instance can't be placed where asked (NVML: `INVALID_ARGUMENT` for a start the
/// profile doesn't allow, `INSUFFICIENT_RESOURCES` for the others).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementRefusal {
    /// The profile does not start there, or the size is not the profile's.
    #[error("{profile} can't be placed at {placement}: its placements start at {allowed:?}")]
    BadStart {
        /// The profile.
        profile: &'static str,
        /// Asked.
        placement: Placement,
        /// Its starts.
        allowed: &'static [u32],
    },
    /// Another instance holds one of its slices.
    #[error("{placement} overlaps the {other} instance at {at}")]
    Overlap {
        /// Asked.
        placement: Placement,
        /// The instance in the way.
        other: &'static str,
        /// Where it is.
        at: Placement,
    },
    /// The profile's instance count is reached.
    #[error("at most {max} {profile} instances fit one GPU")]
    TooMany {
        /// The profile.
        profile: &'static str,
        /// Its limit.
        max: u32,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(model: &'static GpuModel, name: &str, start: u32) -> (&'static GiProfile, Placement) {
        let p = model.profile(name).unwrap();
        (p, p.placement_at(start).unwrap())
    }

    #[test]
    fn each_profile_fits_where_the_user_guide_says_and_nowhere_else() {
        // The table as `nvidia-smi mig -lgipp` prints it, written out here by hand.
        let expected: [(u32, &[u32], u32); 7] = [
            (19, &[0, 1, 2, 3, 4, 5, 6], 1),
            (20, &[0, 1, 2, 3, 4, 5, 6], 1),
            (15, &[0, 2, 4, 6], 2),
            (14, &[0, 2, 4], 2),
            (9, &[0, 4], 4),
            (5, &[0], 4),
            (0, &[0], 8),
        ];
        for model in [&H100_80GB, &H200_141GB] {
            for (id, starts, size) in expected {
                let p = model.profile_by_id(id).unwrap();
                let empty = Layout::empty(model);
                for start in 0..MEMORY_SLICES {
                    let fits = empty.refusal(p, Placement { start, size }).is_none();
                    assert_eq!(fits, starts.contains(&start), "{} at {start}", p.name);
                }
                // The right start with the wrong size is no placement of it either.
                let wrong = Placement {
                    start: starts[0],
                    size: size + 1,
                };
                assert!(matches!(
                    empty.refusal(p, wrong),
                    Some(PlacementRefusal::BadStart { .. })
                ));
                // Every placement lies within the GPU's slices.
                assert!(p.placements().all(|pl| pl.start + pl.size <= MEMORY_SLICES));
            }
        }
        assert_eq!(model_of("NVIDIA H200").map(|m| m.name), Some("H200"));
        assert_eq!(
            model_of("Mock H100 80GB HBM3").map(|m| m.name),
            Some("H100")
        );
        assert_eq!(model_of("NVIDIA A100-SXM4-80GB"), None);
    }

    #[test]
    fn overlap_and_instance_counts_are_refused() {
        let m = &H200_141GB;
        let mut layout = Layout::empty(m);
        layout.instances.push(at(m, "3g.71gb", 4));
        // 2g.35gb at 4 shares slices 4-5 with the 3g.
        let two = m.profile("2g.35gb").unwrap();
        assert!(matches!(
            layout.refusal(two, two.placement_at(4).unwrap()),
            Some(PlacementRefusal::Overlap {
                other: "3g.71gb",
                ..
            })
        ));
        assert_eq!(
            layout.free_placements(two),
            [
                Placement { start: 0, size: 2 },
                Placement { start: 2, size: 2 }
            ]
        );
        // 4g fits only at 0, which is free; 7g nowhere.
        assert_eq!(
            layout.free_placements(m.profile("4g.71gb").unwrap()).len(),
            1
        );
        assert!(
            layout
                .free_placements(m.profile("7g.141gb").unwrap())
                .is_empty()
        );
        // One +me instance per GPU, though six 1g starts are free.
        layout.instances.push(at(m, "1g.18gb+me", 0));
        let me = m.profile("1g.18gb+me").unwrap();
        assert!(matches!(
            layout.refusal(me, me.placement_at(1).unwrap()),
            Some(PlacementRefusal::TooMany { max: 1, .. })
        ));
        assert_eq!(layout.occupied(), 0b1111_0001);
        // Seven 1g instances fill seven slices; the eighth slice takes no 1g.
        let mut ones = Layout::empty(m);
        for s in 0..7 {
            ones.instances.push(at(m, "1g.18gb", s));
        }
        assert!(
            ones.free_placements(m.profile("1g.18gb").unwrap())
                .is_empty()
        );
        assert_eq!(ones.occupied(), 0b0111_1111);
    }

    #[test]
    fn placements_are_masks_of_their_slices() {
        assert_eq!(Placement { start: 0, size: 8 }.mask(), 0xff);
        assert_eq!(Placement { start: 6, size: 2 }.mask(), 0b1100_0000);
        assert!(!Placement { start: 0, size: 4 }.overlaps(Placement { start: 4, size: 4 }));
        assert!(Placement { start: 2, size: 2 }.overlaps(Placement { start: 3, size: 1 }));
        assert_eq!(Placement { start: 4, size: 2 }.to_string(), "{4}:2");
    }
}
