//! What NVML says of a GPU's MIG profiles and instances, checked against the placement rules
//! of its model ([`crate::devices::placement`]) and turned into a [`Layout`]; and NVML's
//! return codes turned into the reasons a layout change is refused (issue 37 §3,
//! docs/mig.md "Instances made on demand").
//!
//! gpuwarden changes a GPU's layout only where the driver's own profile table agrees with the
//! rules it places by: a GPU whose driver lists another table (another model, a driver that
//! renames profiles) is not reported as reconfigurable, and says why.

use std::fmt;

use nvml_wrapper_sys::bindings as b;

use crate::devices::{
    ondemand::MigChangeError,
    placement::{GiProfile, GpuModel, Layout, Placement},
};

/// `NVML_GPU_INSTANCE_PROFILE_COUNT`: the GPU instance profile indexes asked for are `0..` it.
pub(super) const GI_PROFILE_INDEXES: u32 = b::NVML_GPU_INSTANCE_PROFILE_COUNT;
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT`.
pub(super) const CI_PROFILE_INDEXES: u32 = b::NVML_COMPUTE_INSTANCE_PROFILE_COUNT;

/// An NVML return code, shown with its name (`NVML_ERROR_IN_USE (19)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmlCode(pub u32);

impl NvmlCode {
    /// nvml.h's name for the code.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self.0 {
            b::nvmlReturn_enum_NVML_SUCCESS => "NVML_SUCCESS",
            b::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => "NVML_ERROR_UNINITIALIZED",
            b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => "NVML_ERROR_INVALID_ARGUMENT",
            b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => "NVML_ERROR_NOT_SUPPORTED",
            b::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => "NVML_ERROR_NO_PERMISSION",
            b::nvmlReturn_enum_NVML_ERROR_NOT_FOUND => "NVML_ERROR_NOT_FOUND",
            b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => "NVML_ERROR_INSUFFICIENT_SIZE",
            b::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND => "NVML_ERROR_FUNCTION_NOT_FOUND",
            b::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => "NVML_ERROR_GPU_IS_LOST",
            b::nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED => "NVML_ERROR_RESET_REQUIRED",
            b::nvmlReturn_enum_NVML_ERROR_IN_USE => "NVML_ERROR_IN_USE",
            b::nvmlReturn_enum_NVML_ERROR_MEMORY => "NVML_ERROR_MEMORY",
            b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => {
                "NVML_ERROR_INSUFFICIENT_RESOURCES"
            }
            b::nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => {
                "NVML_ERROR_ARGUMENT_VERSION_MISMATCH"
            }
            b::nvmlReturn_enum_NVML_ERROR_INVALID_STATE => "NVML_ERROR_INVALID_STATE",
            _ => "NVML_ERROR_UNKNOWN",
        }
    }

    /// What the code means for a MIG layout change, in the agent's words.
    #[must_use]
    pub fn meaning(self) -> &'static str {
        match self.0 {
            b::nvmlReturn_enum_NVML_ERROR_IN_USE => {
                "a process or a compute instance still uses the instance"
            }
            b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => {
                "the placement is taken, or the profile has no instance left on the GPU"
            }
            b::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => {
                "the agent may not change the MIG layout (it needs root, or the nvidia-caps \
                 config capability)"
            }
            b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => "the profile may not be placed there",
            b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
            | b::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND => {
                "this GPU or driver does not support the call"
            }
            b::nvmlReturn_enum_NVML_ERROR_NOT_FOUND => "no such instance",
            b::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => "the GPU fell off the bus",
            _ => "the driver refused",
        }
    }
}

impl fmt::Display for NvmlCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// An NVML call that did not succeed: which call, and its code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} returned {code}: {}", code.meaning())]
pub struct CallError {
    /// The NVML function.
    pub call: &'static str,
    /// What it returned.
    pub code: NvmlCode,
}

impl CallError {
    /// `call` returned `code`.
    #[must_use]
    pub fn new(call: &'static str, code: u32) -> Self {
        Self {
            call,
            code: NvmlCode(code),
        }
    }

    /// The refusal of a layout change on GPU `gpu` this error is, naming the call and code.
    #[must_use]
    pub fn refusal(&self, gpu: &str) -> MigChangeError {
        MigChangeError::Refused {
            gpu: gpu.to_owned(),
            reason: self.to_string(),
        }
    }
}

/// `nvmlGpuInstanceProfileInfo_v2_t`, the fields used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawGiProfile {
    /// The profile index asked (`NVML_GPU_INSTANCE_PROFILE_1_SLICE` …).
    pub index: u32,
    /// The profile id the creation calls take (19 for an H100's `1g.10gb`).
    pub id: u32,
    /// Its compute (GPU) slices: the `<n>g` of its name.
    pub slice_count: u32,
    /// At most this many instances of it on the GPU.
    pub instance_count: u32,
    /// Its memory, MiB.
    pub memory_mib: u64,
    /// NVML's name (`MIG 1g.10gb`).
    pub name: String,
}

/// `nvmlComputeInstanceProfileInfo_t`, the fields used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawCiProfile {
    /// The compute profile index asked.
    pub index: u32,
    /// The profile id the creation call takes.
    pub id: u32,
    /// Its compute slices.
    pub slice_count: u32,
}

/// `nvmlGpuInstanceInfo_t`, the fields used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawGpuInstance {
    /// The GPU instance id.
    pub id: u32,
    /// Its profile id.
    pub profile_id: u32,
    /// Its memory slices.
    pub placement: Placement,
}

/// One GPU instance profile as the driver lists it, with its possible placements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverProfile {
    /// What the profile-info call said.
    pub info: RawGiProfile,
    /// What the possible-placements call said.
    pub placements: Vec<Placement>,
}

impl DriverProfile {
    /// The profile's name without NVML's `MIG ` prefix (`1g.10gb`).
    #[must_use]
    pub fn name(&self) -> &str {
        self.info
            .name
            .strip_prefix("MIG ")
            .unwrap_or(&self.info.name)
    }
}

/// Where the driver's profile table and the model's rules part.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Disagreement {
    /// A profile of the model the driver does not list.
    #[error("the driver lists no profile {id} ({name})")]
    Missing {
        /// Its id.
        id: u32,
        /// The model's name for it.
        name: &'static str,
    },
    /// The driver names the profile otherwise.
    #[error("profile {id} is {driver} to the driver, {model} to gpuwarden")]
    Name {
        /// The id.
        id: u32,
        /// The driver's name.
        driver: String,
        /// The model's.
        model: &'static str,
    },
    /// The driver allows other placements.
    #[error("profile {name} may be placed at {driver} to the driver, at {model} to gpuwarden")]
    Placements {
        /// The profile.
        name: &'static str,
        /// The driver's, as `{start}:size` items.
        driver: String,
        /// The model's.
        model: String,
    },
    /// Another instance count.
    #[error("profile {name} fits {driver} times to the driver, {model} to gpuwarden")]
    Count {
        /// The profile.
        name: &'static str,
        /// The driver's count.
        driver: u32,
        /// The model's.
        model: u32,
    },
    /// An instance of a profile the model lacks, or not where its profile may be.
    #[error(
        "GPU instance {id} (profile {profile_id} at {placement}) is none of gpuwarden's placements"
    )]
    Instance {
        /// The GPU instance id.
        id: u32,
        /// Its profile id.
        profile_id: u32,
        /// Where it is.
        placement: Placement,
    },
}

/// Why a GPU's MIG layout is not read, or not gpuwarden's to change.
#[derive(Debug, thiserror::Error)]
pub enum MigReadError {
    /// No placement rules for the model.
    #[error("no MIG placement rules for a {model}")]
    UnknownModel {
        /// NVML's name for the GPU.
        model: String,
    },
    /// The driver's profile table is not the model's.
    #[error("the driver's MIG profiles differ from gpuwarden's rules: {}", join(.0))]
    Disagree(Vec<Disagreement>),
    /// An instance there is none of the rules' placements.
    #[error(transparent)]
    Instance(#[from] Disagreement),
    /// A MIG call failed.
    #[error(transparent)]
    Call(#[from] CallError),
    /// nvml-wrapper failed.
    #[error("NVML: {0}")]
    Nvml(#[from] nvml_wrapper::error::NvmlError),
}

fn join(d: &[Disagreement]) -> String {
    let items: Vec<String> = d.iter().map(ToString::to_string).collect();
    items.join("; ")
}

fn list(placements: impl IntoIterator<Item = Placement>) -> String {
    let items: Vec<String> = placements.into_iter().map(|p| p.to_string()).collect();
    items.join(" ")
}

/// Where the driver's table (`driver`) and `model`'s rules disagree; empty when gpuwarden may
/// place instances on the GPU by its rules. Profiles the driver lists beyond the model's are
/// not compared (gpuwarden never makes them; an instance of one makes the layout unreadable,
/// [`layout_of`]).
#[must_use]
pub fn compare(model: &GpuModel, driver: &[DriverProfile]) -> Vec<Disagreement> {
    let mut out = Vec::new();
    for p in model.profiles {
        let Some(d) = driver.iter().find(|d| d.info.id == p.id) else {
            out.push(Disagreement::Missing {
                id: p.id,
                name: p.name,
            });
            continue;
        };
        if d.name() != p.name {
            out.push(Disagreement::Name {
                id: p.id,
                driver: d.name().to_owned(),
                model: p.name,
            });
        }
        let mut theirs = d.placements.clone();
        theirs.sort_unstable();
        let ours: Vec<Placement> = p.placements().collect();
        if theirs != ours {
            out.push(Disagreement::Placements {
                name: p.name,
                driver: list(theirs),
                model: list(ours),
            });
        }
        if d.info.instance_count != p.max_instances {
            out.push(Disagreement::Count {
                name: p.name,
                driver: d.info.instance_count,
                model: p.max_instances,
            });
        }
    }
    out
}

/// The layout the GPU instances `instances` make on a GPU of `model`.
///
/// # Errors
/// An instance of a profile the model lacks, or at a placement its profile may not take.
pub fn layout_of(
    model: &'static GpuModel,
    instances: &[RawGpuInstance],
) -> Result<Layout, Disagreement> {
    let mut layout = Layout::empty(model);
    for gi in instances {
        let profile = model
            .profile_by_id(gi.profile_id)
            .filter(|p| p.placement_at(gi.placement.start) == Some(gi.placement))
            .ok_or(Disagreement::Instance {
                id: gi.id,
                profile_id: gi.profile_id,
                placement: gi.placement,
            })?;
        layout.instances.push((profile, gi.placement));
    }
    Ok(layout)
}

/// The compute profile of the whole of a GPU instance of `gi`: the one with as many compute
/// slices as the GPU instance profile has (`7g` → the 7-slice compute profile).
#[must_use]
pub fn whole_compute_profile(
    gi: &RawGiProfile,
    candidates: &[RawCiProfile],
) -> Option<RawCiProfile> {
    candidates
        .iter()
        .find(|c| c.slice_count == gi.slice_count)
        .copied()
}

/// The driver profile for the model's `profile`, once [`compare`] found them in agreement.
#[must_use]
pub fn driver_profile<'a>(
    driver: &'a [DriverProfile],
    profile: &GiProfile,
) -> Option<&'a DriverProfile> {
    driver.iter().find(|d| d.info.id == profile.id)
}

/// The device index of GPU instance `gpu_instance` of GPU `parent` among `devices` (its first
/// compute instance's), if one of them is it.
#[must_use]
pub fn instance_index(
    devices: &[crate::devices::GpuDevice],
    parent: &crate::devices::GpuDevice,
    gpu_instance: u32,
) -> Option<u32> {
    devices
        .iter()
        .find(|d| {
            d.mig
                .as_ref()
                .is_some_and(|m| m.parent_uuid == parent.uuid && m.gpu_instance == gpu_instance)
        })
        .map(|d| d.index)
}

/// The device index a process on GPU `parent` in MIG mode is counted on: the instance of GPU
/// instance `gpu_instance` among `devices`, or the parent's own index where the driver names no
/// instance or none of `devices` is it.
#[must_use]
pub fn busy_index(
    devices: &[crate::devices::GpuDevice],
    parent: &crate::devices::GpuDevice,
    gpu_instance: Option<u32>,
) -> u32 {
    gpu_instance
        .and_then(|gi| instance_index(devices, parent, gi))
        .unwrap_or(parent.index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::placement::{H100_80GB, H200_141GB};

    /// NVML's answers on an H100 80GB as `nvidia-smi mig -lgip` and `-lgipp` print them
    /// (docs/mig.md, "The placement rules and where they come from"): profile index, id, name,
    /// compute slices, instances, memory MiB, and the `{starts}:size` placements. Written out
    /// here by hand from that listing, not from `placement.rs`.
    fn h100_driver() -> Vec<DriverProfile> {
        type Row = (u32, u32, &'static str, u32, u32, u64, &'static [u32], u32);
        let rows: [Row; 7] = [
            (0, 19, "MIG 1g.10gb", 1, 7, 9_984, &[0, 1, 2, 3, 4, 5, 6], 1),
            (
                7,
                20,
                "MIG 1g.10gb+me",
                1,
                1,
                9_984,
                &[0, 1, 2, 3, 4, 5, 6],
                1,
            ),
            (9, 15, "MIG 1g.20gb", 1, 4, 20_096, &[0, 2, 4, 6], 2),
            (1, 14, "MIG 2g.20gb", 2, 3, 20_096, &[0, 2, 4], 2),
            (2, 9, "MIG 3g.40gb", 3, 2, 40_448, &[0, 4], 4),
            (3, 5, "MIG 4g.40gb", 4, 1, 40_448, &[0], 4),
            (4, 0, "MIG 7g.80gb", 7, 1, 81_152, &[0], 8),
        ];
        rows.iter()
            .map(
                |&(index, id, name, slices, count, mib, starts, size)| DriverProfile {
                    info: RawGiProfile {
                        index,
                        id,
                        slice_count: slices,
                        instance_count: count,
                        memory_mib: mib,
                        name: name.to_owned(),
                    },
                    // The driver's order is its own: reversed here, so the comparison may not
                    // depend on it.
                    placements: starts
                        .iter()
                        .rev()
                        .map(|&start| Placement { start, size })
                        .collect(),
                },
            )
            .collect()
    }

    #[test]
    fn the_documented_h100_table_agrees_with_the_placement_rules() {
        assert_eq!(compare(&H100_80GB, &h100_driver()), []);
        // The same table under H100 names is not an H200's: every profile's name differs.
        let h200 = compare(&H200_141GB, &h100_driver());
        assert_eq!(h200.len(), 7, "{h200:?}");
        assert!(h200.iter().all(|d| matches!(d, Disagreement::Name { .. })));
    }

    #[test]
    fn another_table_is_a_disagreement_naming_the_profile() {
        // NVIDIA's go-nvml mock of an H200 sizes placements in compute slices (`3g` at 0 and 4
        // with size 3): a driver answering so is not placed by these rules.
        let mut d = h100_driver();
        let three = d.iter_mut().find(|p| p.info.id == 9).unwrap();
        three.placements = vec![
            Placement { start: 0, size: 3 },
            Placement { start: 4, size: 3 },
        ];
        // One more 2g start, one fewer 1g instance, and no 7g at all.
        d.iter_mut()
            .find(|p| p.info.id == 14)
            .unwrap()
            .placements
            .push(Placement { start: 6, size: 2 });
        d.iter_mut()
            .find(|p| p.info.id == 19)
            .unwrap()
            .info
            .instance_count = 6;
        d.retain(|p| p.info.id != 0);
        let got = compare(&H100_80GB, &d);
        assert!(
            got.contains(&Disagreement::Placements {
                name: "3g.40gb",
                driver: "{0}:3 {4}:3".into(),
                model: "{0}:4 {4}:4".into(),
            }),
            "{got:?}"
        );
        assert!(got.iter().any(|g| matches!(
            g,
            Disagreement::Placements {
                name: "2g.20gb",
                ..
            }
        )));
        assert!(got.contains(&Disagreement::Count {
            name: "1g.10gb",
            driver: 6,
            model: 7
        }));
        assert!(got.contains(&Disagreement::Missing {
            id: 0,
            name: "7g.80gb"
        }));
        assert_eq!(got.len(), 4, "{got:?}");
        // A profile beyond the model's (a driver's `1g.10gb-me`) is not compared.
        let mut more = h100_driver();
        more.push(DriverProfile {
            info: RawGiProfile {
                index: 13,
                id: 21,
                slice_count: 1,
                instance_count: 7,
                memory_mib: 9_984,
                name: "MIG 1g.10gb-me".into(),
            },
            placements: vec![Placement { start: 0, size: 1 }],
        });
        assert_eq!(compare(&H100_80GB, &more), []);
    }

    #[test]
    fn the_instances_there_are_make_the_layout_or_say_what_they_are() {
        let gi = |id, profile_id, start, size| RawGpuInstance {
            id,
            profile_id,
            placement: Placement { start, size },
        };
        // GPU instance ids as the driver numbers them (3g at 4 is 2, a 1g at 0 is 7).
        let layout = layout_of(&H100_80GB, &[gi(2, 9, 4, 4), gi(7, 19, 0, 1)]).unwrap();
        assert_eq!(layout.occupied(), 0b1111_0001);
        let two = H100_80GB.profile("2g.20gb").unwrap();
        assert_eq!(
            layout.free_placements(two),
            [Placement { start: 2, size: 2 }]
        );
        // An instance of a profile the model lacks, or where its profile may not be, makes no
        // layout (the GPU is then not offered for reconfiguration).
        for bad in [gi(3, 21, 1, 1), gi(3, 9, 2, 4), gi(3, 9, 0, 3)] {
            assert_eq!(
                layout_of(&H100_80GB, &[bad]),
                Err(Disagreement::Instance {
                    id: 3,
                    profile_id: bad.profile_id,
                    placement: bad.placement
                })
            );
        }
    }

    #[test]
    fn a_whole_gpu_instance_gets_the_compute_profile_of_its_slices() {
        let d = h100_driver();
        // The compute profiles an H100 GPU instance lists (index, id, slices): 1, 2, 3, 4, 7.
        let cis: Vec<RawCiProfile> = [(0, 0, 1), (1, 1, 2), (2, 2, 3), (3, 3, 4), (4, 4, 7)]
            .iter()
            .map(|&(index, id, slice_count)| RawCiProfile {
                index,
                id,
                slice_count,
            })
            .collect();
        let of = |name: &str| {
            let p = d.iter().find(|p| p.name() == name).unwrap();
            whole_compute_profile(&p.info, &cis).map(|c| c.slice_count)
        };
        assert_eq!(of("7g.80gb"), Some(7));
        assert_eq!(of("3g.40gb"), Some(3));
        // Two memory slices, one compute slice.
        assert_eq!(of("1g.20gb"), Some(1));
        assert_eq!(whole_compute_profile(&d[0].info, &cis[1..]), None);
    }

    #[test]
    fn a_process_counts_on_its_instance_or_else_on_its_gpu() {
        use crate::devices::{GpuDevice, mig::MigInstance};
        let gpu = |uuid: &str, index| GpuDevice {
            uuid: uuid.into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            memory_bytes: 80 << 30,
            numa_node: 0,
            sm_count: 132,
            is_mig: false,
            index,
            device_node: format!("/dev/nvidia{index}"),
            mig: None,
        };
        let instance = |parent: &GpuDevice, gi, index| GpuDevice {
            uuid: format!("MIG-{}-{gi}", parent.uuid),
            is_mig: true,
            index,
            device_node: parent.device_node.clone(),
            mig: Some(MigInstance {
                parent_index: parent.index,
                parent_uuid: parent.uuid.clone(),
                gpu_instance: gi,
                compute_instance: 0,
                profile: "1g.10gb".into(),
                gi_cap_minor: None,
                ci_cap_minor: None,
            }),
            ..gpu("unused", 0)
        };
        let (g0, g1) = (gpu("GPU-0", 0), gpu("GPU-1", 1));
        // GPU instance 7 on both GPUs: devices 2 (on GPU-0) and 3 (on GPU-1).
        let devices = [
            instance(&g0, 7, 2),
            instance(&g1, 7, 3),
            instance(&g1, 9, 4),
        ];
        assert_eq!(busy_index(&devices, &g1, Some(7)), 3);
        assert_eq!(busy_index(&devices, &g1, Some(9)), 4);
        assert_eq!(busy_index(&devices, &g0, Some(7)), 2);
        // No instance named, or one not among the devices: the GPU itself.
        assert_eq!(busy_index(&devices, &g1, None), 1);
        assert_eq!(busy_index(&devices, &g0, Some(9)), 0);
    }

    #[test]
    fn each_refusal_names_the_call_and_the_code() {
        let cases = [
            (
                b::nvmlReturn_enum_NVML_ERROR_IN_USE,
                "NVML_ERROR_IN_USE (19)",
                "still uses",
            ),
            (
                b::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES,
                "NVML_ERROR_INSUFFICIENT_RESOURCES (23)",
                "taken",
            ),
            (
                b::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
                "NVML_ERROR_NO_PERMISSION (4)",
                "root",
            ),
            (
                b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
                "NVML_ERROR_INVALID_ARGUMENT (2)",
                "may not be placed",
            ),
            (
                b::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND,
                "NVML_ERROR_FUNCTION_NOT_FOUND (13)",
                "does not support",
            ),
            (4242, "NVML_ERROR_UNKNOWN (4242)", "refused"),
        ];
        for (code, named, meaning) in cases {
            let e = CallError::new("nvmlGpuInstanceDestroy", code).refusal("GPU-1");
            let MigChangeError::Refused { gpu, reason } = &e else {
                panic!("{e:?}");
            };
            assert_eq!(gpu, "GPU-1");
            assert!(
                reason.starts_with("nvmlGpuInstanceDestroy returned "),
                "{reason}"
            );
            assert!(reason.contains(named), "{reason}");
            assert!(reason.contains(meaning), "{reason}");
        }
    }
}
