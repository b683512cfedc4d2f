//! Where MIG GPU instances may sit on an H100 or H200 (issue 37 §3, docs/mig.md "Instances
//! made on demand"): the layout of one GPU, and why a placement is refused.
//!
//! The table of models, profiles, sizes, allowed starts and memory is
//! [`gpuwarden_types::mig`]'s (re-exported here), the one the simulator's agents read too. A GPU
//! instance of a profile occupies `size` consecutive memory slices from one of the starts its
//! profile allows; two instances may not share a slice, and a profile has at most
//! `max_instances` on one GPU (only `+me` reaches it before its starts run out).

pub use gpuwarden_types::mig::{
    GiProfile, GpuModel, H100_80GB, H200_141GB, MEMORY_SLICES, Placement, model_of,
};

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
}
