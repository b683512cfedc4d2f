//! MIG instances as devices (issue 37, docs/mig.md).
//!
//! A GPU in MIG mode is not offered whole: each of its instances (a compute instance inside a GPU
//! instance) is a device of its own, with the profile (`1g.18gb`), memory and SMs NVML reports
//! for it. A process reaches an instance by opening its parent's `/dev/nvidia<G>` and the
//! instance's capability nodes (`/dev/nvidia-caps/nvidia-cap<N>`, minors listed in
//! `/proc/driver/nvidia-caps/mig-minors`), and subscribing its RM client to the partition whose
//! `swizzId` is the GPU instance id.
//!
//! Instances take device indexes of their own, after every physical GPU's minor, so that each
//! is counted, limited and scheduled like a GPU; the parent's minor stays the node they open.

use std::{collections::BTreeMap, path::Path};

use serde::Serialize;

use super::GpuDevice;

/// Where `mig-minors` is on a machine with the NVIDIA driver.
pub const MIG_MINORS: &str = "/proc/driver/nvidia-caps/mig-minors";

/// Where the capability nodes are on a machine with the NVIDIA driver.
pub const CAPS_DIR: &str = "/dev/nvidia-caps";

/// What makes a device a MIG instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MigInstance {
    /// The parent GPU's index (its `/dev/nvidia<N>` minor): the node the instance is opened by.
    pub parent_index: u32,
    /// The parent GPU's UUID.
    pub parent_uuid: String,
    /// The GPU instance id (NVML's; the RM partition's `swizzId`).
    pub gpu_instance: u32,
    /// The compute instance id within the GPU instance.
    pub compute_instance: u32,
    /// The profile, e.g. `1g.18gb`.
    pub profile: String,
    /// The minor of the GPU instance's capability node (`nvidia-cap<N>`), when known.
    pub gi_cap_minor: Option<u32>,
    /// The minor of the compute instance's capability node, when known.
    pub ci_cap_minor: Option<u32>,
}

impl MigInstance {
    /// The capability nodes a process on this instance opens, under `caps_dir`.
    #[must_use]
    pub fn cap_nodes(&self, caps_dir: &Path) -> Vec<std::path::PathBuf> {
        [self.gi_cap_minor, self.ci_cap_minor]
            .into_iter()
            .flatten()
            .map(|m| caps_dir.join(format!("nvidia-cap{m}")))
            .collect()
    }
}

/// The capability a `mig-minors` line names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Capability {
    /// `config`: changing the MIG layout.
    Config,
    /// `monitor`: reading every instance.
    Monitor,
    /// `gpu<G>/gi<I>/access`: a GPU instance.
    GpuInstance {
        /// The parent's `/dev/nvidia<G>` minor.
        gpu: u32,
        /// GPU instance id.
        gi: u32,
    },
    /// `gpu<G>/gi<I>/ci<C>/access`: a compute instance.
    ComputeInstance {
        /// The parent's `/dev/nvidia<G>` minor.
        gpu: u32,
        /// GPU instance id.
        gi: u32,
        /// Compute instance id.
        ci: u32,
    },
}

impl Capability {
    /// Parses a capability name; `None` for names of no known form.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "config" => return Some(Self::Config),
            "monitor" => return Some(Self::Monitor),
            _ => {}
        }
        let num = |part: &str, prefix: &str| part.strip_prefix(prefix)?.parse::<u32>().ok();
        let parts: Vec<&str> = name.split('/').collect();
        match parts.as_slice() {
            [gpu, gi, "access"] => Some(Self::GpuInstance {
                gpu: num(gpu, "gpu")?,
                gi: num(gi, "gi")?,
            }),
            [gpu, gi, ci, "access"] => Some(Self::ComputeInstance {
                gpu: num(gpu, "gpu")?,
                gi: num(gi, "gi")?,
                ci: num(ci, "ci")?,
            }),
            _ => None,
        }
    }
}

/// The capability minors `mig-minors` lists (`<name> <minor>` a line).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigMinors(pub BTreeMap<Capability, u32>);

impl MigMinors {
    /// Parses the file's text; lines of no known form are skipped (the driver may add kinds).
    #[must_use]
    pub fn parse(text: &str) -> Self {
        Self(
            text.lines()
                .filter_map(|line| {
                    let mut fields = line.split_whitespace();
                    let cap = Capability::parse(fields.next()?)?;
                    let minor = fields.next()?.parse().ok()?;
                    Some((cap, minor))
                })
                .collect(),
        )
    }

    /// Reads the file at `path`; empty when it can't be read (no MIG-capable driver).
    #[must_use]
    pub fn read(path: &Path) -> Self {
        std::fs::read_to_string(path)
            .map(|t| Self::parse(&t))
            .unwrap_or_default()
    }

    /// The GPU instance's capability minor.
    #[must_use]
    pub fn gpu_instance(&self, gpu: u32, gi: u32) -> Option<u32> {
        self.0.get(&Capability::GpuInstance { gpu, gi }).copied()
    }

    /// The compute instance's capability minor.
    #[must_use]
    pub fn compute_instance(&self, gpu: u32, gi: u32, ci: u32) -> Option<u32> {
        self.0
            .get(&Capability::ComputeInstance { gpu, gi, ci })
            .copied()
    }
}

/// The capability nodes' major in the text of `/proc/devices` (its `nvidia-caps` line among
/// the character devices).
#[must_use]
pub fn caps_major(proc_devices: &str) -> Option<u32> {
    proc_devices
        .lines()
        .take_while(|l| !l.starts_with("Block devices"))
        .find_map(|l| {
            let (major, name) = l.trim().split_once(' ')?;
            (name.trim() == "nvidia-caps").then(|| major.parse().ok())?
        })
}

/// The profile in an NVML MIG device name (`NVIDIA H200 MIG 1g.18gb` → `1g.18gb`, and
/// `… MIG 1g.18gb+me` keeps its `+me`); `None` when the name has none.
#[must_use]
pub fn profile_from_name(name: &str) -> Option<String> {
    let profile = gpuwarden_types::slot::names::mig_profile_in_model(name)?;
    is_profile(profile).then(|| profile.to_owned())
}

/// Whether `text` is a profile name as NVIDIA writes them: `<n>g.<m>gb`, optionally followed by
/// `+<attribute>` parts (`+me`, `+gfx`) or `-me` (no media engines).
#[must_use]
pub fn is_profile(text: &str) -> bool {
    let base = text.split(['+', '-']).next().unwrap_or_default();
    let Some((g, mem)) = base.split_once("g.") else {
        return false;
    };
    let Some(mem) = mem.strip_suffix("gb") else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(g)
        && digits(mem)
        && text[base.len()..]
            .split(['+', '-'])
            .all(|p| p.bytes().all(|b| b.is_ascii_lowercase()))
}

/// What NVML says of one MIG device (a compute instance), before it becomes a [`GpuDevice`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// `MIG-…` UUID.
    pub uuid: String,
    /// NVML's name (`NVIDIA H200 MIG 1g.18gb`).
    pub name: String,
    /// Its memory, bytes.
    pub memory_bytes: u64,
    /// Its SMs (0 when unknown).
    pub sm_count: u32,
    /// GPU instance id.
    pub gpu_instance: u32,
    /// Compute instance id.
    pub compute_instance: u32,
    /// GPU instance slices (the `<n>g` of a profile; 0 when unknown).
    pub slices: u32,
}

/// The device an instance found on `parent` is, numbered `index`.
#[must_use]
pub fn instance_device(
    parent: &GpuDevice,
    found: Found,
    index: u32,
    minors: &MigMinors,
) -> GpuDevice {
    // NVML names the profile; where a name lacks it, the same form from its slices and memory.
    let profile = profile_from_name(&found.name).unwrap_or_else(|| {
        format!(
            "{}g.{}gb",
            found.slices,
            found.memory_bytes.div_ceil(1_000_000_000)
        )
    });
    let gpu = parent.index;
    GpuDevice {
        uuid: found.uuid,
        model: found.name,
        memory_bytes: found.memory_bytes,
        numa_node: parent.numa_node,
        sm_count: found.sm_count,
        is_mig: true,
        index,
        device_node: parent.device_node.clone(),
        mig: Some(MigInstance {
            parent_index: gpu,
            parent_uuid: parent.uuid.clone(),
            gpu_instance: found.gpu_instance,
            compute_instance: found.compute_instance,
            profile,
            gi_cap_minor: minors.gpu_instance(gpu, found.gpu_instance),
            ci_cap_minor: minors.compute_instance(gpu, found.gpu_instance, found.compute_instance),
        }),
    }
}

pub use gpuwarden_types::slot::names::{CUDA_MIG_PREFIX as SLOT_PREFIX, mig_slot as slot_name};

/// Each MIG profile among `devices` as a slot type, with how many instances of it there are
/// (exact decimal strings, as capacities travel), sorted by name.
#[must_use]
pub fn slot_capacity(devices: &[GpuDevice]) -> Vec<(String, String)> {
    let mut count: BTreeMap<String, u64> = BTreeMap::new();
    for m in devices.iter().filter_map(|d| d.mig.as_ref()) {
        *count.entry(slot_name(&m.profile)).or_default() += 1;
    }
    count.into_iter().map(|(n, c)| (n, c.to_string())).collect()
}

/// The first device index free for instances: one past every physical GPU's minor.
#[must_use]
pub fn first_instance_index(physical: impl IntoIterator<Item = u32>) -> u32 {
    physical
        .into_iter()
        .max()
        .map_or(0, |m| m.saturating_add(1))
}

/// A MIG instance of GPU 1 (`/dev/nvidia1`, `GPU-p`) for tests: minor `index`, in GPU instance
/// `gpu_instance` and compute instance `compute_instance`, of `profile`.
#[cfg(test)]
pub(crate) fn test_instance(
    index: u32,
    gpu_instance: u32,
    compute_instance: u32,
    profile: &str,
) -> GpuDevice {
    GpuDevice {
        uuid: format!("MIG-{index}"),
        model: "M".into(),
        memory_bytes: 1,
        numa_node: 0,
        sm_count: 0,
        is_mig: true,
        index,
        device_node: "/dev/nvidia1".into(),
        mig: Some(MigInstance {
            parent_index: 1,
            parent_uuid: "GPU-p".into(),
            gpu_instance,
            compute_instance,
            profile: profile.into(),
            gi_cap_minor: None,
            ci_cap_minor: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_minors_lines_are_read_by_kind() {
        let text = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n\
                    gpu3/gi14/ci2/access 470\nsomething new 9\ngpu0/gix/access 4\n";
        let m = MigMinors::parse(text);
        assert_eq!(m.0.len(), 5);
        assert_eq!(m.0.get(&Capability::Config), Some(&1));
        assert_eq!(m.gpu_instance(0, 1), Some(12));
        assert_eq!(m.compute_instance(0, 1, 0), Some(13));
        assert_eq!(m.compute_instance(3, 14, 2), Some(470));
        assert_eq!(m.gpu_instance(0, 2), None);
        assert_eq!(
            MigMinors::read(Path::new("/nonexistent/mig-minors"))
                .0
                .len(),
            0
        );
    }

    #[test]
    fn the_caps_major_is_read_from_proc_devices() {
        let text = "Character devices:\n  1 mem\n195 nvidia\n234 nvidia-caps\n\nBlock devices:\n 7 nvidia-caps\n";
        assert_eq!(caps_major(text), Some(234));
        assert_eq!(caps_major("Character devices:\n195 nvidia\n"), None);
        assert_eq!(caps_major("Block devices:\n 7 nvidia-caps\n"), None);
    }

    #[test]
    fn profiles_come_from_nvmls_names() {
        assert_eq!(
            profile_from_name("NVIDIA H200 MIG 1g.18gb").as_deref(),
            Some("1g.18gb")
        );
        assert_eq!(
            profile_from_name("NVIDIA H100 80GB HBM3 MIG 3g.40gb").as_deref(),
            Some("3g.40gb")
        );
        assert_eq!(
            profile_from_name("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me").as_deref(),
            Some("1g.10gb+me")
        );
        assert_eq!(profile_from_name("NVIDIA H100 80GB HBM3"), None);
        assert_eq!(profile_from_name("NVIDIA X MIG whole"), None);
        assert!(is_profile("7g.141gb") && is_profile("1g.18gb-me"));
        assert!(!is_profile("g.18gb") && !is_profile("1g.gb") && !is_profile("1g.18GB"));
        assert!(!is_profile("1g.18gb+M3"));
    }

    #[test]
    fn each_profile_is_a_slot_type_counting_its_instances() {
        let instance = |profile: &str| test_instance(2, 1, 0, profile);
        let devices = [
            instance("1g.18gb"),
            instance("3g.71gb"),
            instance("1g.18gb"),
            instance("1g.18gb+me"),
        ];
        assert_eq!(
            slot_capacity(&devices),
            [
                ("cuda.mig.1g.18gb".to_owned(), "2".to_owned()),
                ("cuda.mig.1g.18gb_me".to_owned(), "1".to_owned()),
                ("cuda.mig.3g.71gb".to_owned(), "1".to_owned()),
            ]
        );
        for (name, _) in slot_capacity(&devices) {
            assert!(gpuwarden_types::slot::SlotName::is_valid(&name), "{name}");
        }
    }

    #[test]
    fn instances_are_numbered_after_every_physical_gpu() {
        assert_eq!(first_instance_index([0, 1]), 2);
        assert_eq!(first_instance_index([3, 0]), 4);
        assert_eq!(first_instance_index([]), 0);
        let inst = MigInstance {
            parent_index: 1,
            parent_uuid: "GPU-p".into(),
            gpu_instance: 1,
            compute_instance: 0,
            profile: "1g.18gb".into(),
            gi_cap_minor: Some(12),
            ci_cap_minor: Some(13),
        };
        let parent = GpuDevice {
            uuid: "GPU-p".into(),
            model: "NVIDIA H200".into(),
            memory_bytes: 141 << 30,
            numa_node: 1,
            sm_count: 132,
            is_mig: false,
            index: 1,
            device_node: "/dev/nvidia1".into(),
            mig: None,
        };
        let minors = MigMinors::parse("gpu1/gi1/access 12\ngpu1/gi1/ci0/access 13\n");
        let found = Found {
            uuid: "MIG-x".into(),
            name: "NVIDIA H200 MIG 1g.18gb".into(),
            memory_bytes: 16_625 << 20,
            sm_count: 16,
            gpu_instance: 1,
            compute_instance: 0,
            slices: 1,
        };
        let d = instance_device(&parent, found.clone(), 2, &minors);
        assert_eq!(d.mig.as_ref(), Some(&inst));
        assert_eq!((d.index, d.node_minor(), d.numa_node), (2, 1, 1));
        assert_eq!(d.device_node, "/dev/nvidia1");
        // A name without the profile: the same form from slices and memory.
        let unnamed = Found {
            name: "NVIDIA H200".into(),
            memory_bytes: 17_800_000_000,
            ..found
        };
        let d = instance_device(&parent, unnamed, 2, &minors);
        assert_eq!(d.mig.map(|m| m.profile).as_deref(), Some("1g.18gb"));
        assert_eq!(
            inst.cap_nodes(Path::new("/dev/nvidia-caps")),
            [
                Path::new("/dev/nvidia-caps/nvidia-cap12"),
                Path::new("/dev/nvidia-caps/nvidia-cap13")
            ]
        );
    }
}
