//! Which paths are GPU device nodes, and what the programs call each of them.
//!
//! The agent expands the configured globs (default `/dev/nvidia[0-9]*`, `/dev/nvidiactl`,
//! `/dev/nvidia-uvm*`) into the exact paths the eBPF side matches at `openat`. A node is known by
//! its file name, so a fake driver mounted elsewhere (`/tmp/x/nvidia0`) is numbered like the real
//! one.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use gpuwarden_agent_common::maps::{
    DEVICE_CTL, DEVICE_MODESET, DEVICE_UNKNOWN, DEVICE_UVM, DEVICE_UVM_TOOLS, GpuNode, node_kind,
};

/// The globs watched when none are configured.
pub const DEFAULT_GLOBS: &[&str] = &["/dev/nvidia[0-9]*", "/dev/nvidiactl", "/dev/nvidia-uvm*"];

/// Errors from the node configuration.
#[derive(Debug, thiserror::Error)]
pub enum GpuNodeError {
    /// A glob doesn't parse.
    #[error("invalid GPU device glob {glob:?}: {source}")]
    Glob {
        /// The glob as given.
        glob: String,
        /// Why it doesn't parse.
        #[source]
        source: glob::PatternError,
    },
    /// A glob is not absolute (the programs match absolute paths).
    #[error("GPU device glob {glob:?} must be an absolute path")]
    Relative {
        /// The glob as given.
        glob: String,
    },
}

/// Checked GPU device-node globs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuNodeGlobs {
    globs: Vec<String>,
}

impl GpuNodeGlobs {
    /// Checks `globs`; an empty list means [`DEFAULT_GLOBS`].
    ///
    /// # Errors
    /// A glob that is relative or doesn't parse.
    pub fn new<S: AsRef<str>>(globs: &[S]) -> Result<Self, GpuNodeError> {
        let globs: Vec<String> = if globs.is_empty() {
            DEFAULT_GLOBS.iter().map(|g| (*g).to_owned()).collect()
        } else {
            globs.iter().map(|g| g.as_ref().trim().to_owned()).collect()
        };
        for g in &globs {
            if !g.starts_with('/') {
                return Err(GpuNodeError::Relative { glob: g.clone() });
            }
            glob::Pattern::new(g).map_err(|source| GpuNodeError::Glob {
                glob: g.clone(),
                source,
            })?;
        }
        Ok(Self { globs })
    }

    /// The globs.
    #[must_use]
    pub fn as_slice(&self) -> &[String] {
        &self.globs
    }

    /// The existing paths the globs match, each with its node, plus their canonical forms (a
    /// process may open the node through either). Paths whose names are not NVIDIA node names
    /// are returned in `skipped` with the reason.
    #[must_use]
    pub fn expand(&self) -> Expansion {
        let mut expansion = Expansion::default();
        for g in &self.globs {
            let Ok(paths) = glob::glob(g) else { continue };
            for path in paths.flatten() {
                let Some(node) = classify(&path) else {
                    expansion
                        .skipped
                        .push((path, "not an NVIDIA device node name"));
                    continue;
                };
                let canonical = std::fs::canonicalize(&path).ok();
                // A path too long for the path table is still matched by its file (where the
                // kernel has BTF).
                for p in std::iter::once(path).chain(canonical) {
                    expansion.nodes.insert(p, node);
                }
            }
        }
        expansion
    }
}

/// The result of [`GpuNodeGlobs::expand`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Expansion {
    /// Paths to watch.
    pub nodes: BTreeMap<PathBuf, GpuNode>,
    /// Paths matched but not watched, with why.
    pub skipped: Vec<(PathBuf, &'static str)>,
}

/// The node a path names, from its file name: `nvidiaN`, `nvidiactl`, `nvidia-modeset`,
/// `nvidia-uvm`, `nvidia-uvm-tools`.
#[must_use]
pub fn classify(path: &Path) -> Option<GpuNode> {
    let name = path.file_name()?.to_str()?;
    let rm = |device| GpuNode {
        device,
        kind: node_kind::RM,
    };
    let uvm = |device| GpuNode {
        device,
        kind: node_kind::UVM,
    };
    match name {
        "nvidiactl" => Some(rm(DEVICE_CTL)),
        "nvidia-modeset" => Some(rm(DEVICE_MODESET)),
        "nvidia-uvm" => Some(uvm(DEVICE_UVM)),
        "nvidia-uvm-tools" => Some(uvm(DEVICE_UVM_TOOLS)),
        _ => {
            let index = name.strip_prefix("nvidia")?;
            if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            // Minors 0–247 are GPUs; the rest are reserved for control nodes.
            index.parse::<u32>().ok().filter(|n| *n < 248).map(rm)
        }
    }
}

/// The names device ids are reported under: a MIG instance's device index after its parent's
/// node and GPU instance (`nvidia1/gi9`, as `mig-minors` names it `gpu1/gi9`), every other id by
/// its node ([`node_name`]). Built from the device list ([`DeviceNames::new`]) and handed to
/// whatever reports a device; cheap to clone. The default names no instance.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DeviceNames {
    /// The names of the device indexes that are MIG instances.
    instances: std::sync::Arc<BTreeMap<u32, String>>,
}

impl DeviceNames {
    /// The names of `devices`' MIG instances (the memory the programs count as an instance is
    /// reported under its name).
    #[must_use]
    pub fn new(devices: &[crate::devices::GpuDevice]) -> Self {
        Self {
            instances: std::sync::Arc::new(
                devices
                    .iter()
                    .filter_map(|d| Some((d.index, instance_name(d)?)))
                    .collect(),
            ),
        }
    }

    /// The name device id `device` is reported under.
    #[must_use]
    pub fn name(&self, device: u32) -> String {
        self.instances
            .get(&device)
            .cloned()
            .unwrap_or_else(|| node_name(device))
    }
}

/// The name `device` is reported under: a MIG instance's after its parent's node and GPU
/// instance (`nvidia1/gi9`), a GPU's by its node (`nvidia0`).
#[must_use]
pub fn gpu_name(device: &crate::devices::GpuDevice) -> String {
    instance_name(device).unwrap_or_else(|| node_name(device.index))
}

/// A MIG instance's name (`nvidia1/gi9`); `None` for a GPU.
fn instance_name(device: &crate::devices::GpuDevice) -> Option<String> {
    let m = device.mig.as_ref()?;
    Some(format!("nvidia{}/gi{}", m.parent_index, m.gpu_instance))
}

/// The name of the node device id `device` stands for (`nvidia0`, `nvidiactl`, `unknown`): what
/// it is reported under unless it is a MIG instance's index ([`DeviceNames`]).
#[must_use]
pub fn node_name(device: u32) -> String {
    match device {
        DEVICE_CTL => "nvidiactl".to_owned(),
        DEVICE_MODESET => "nvidia-modeset".to_owned(),
        DEVICE_UVM => "nvidia-uvm".to_owned(),
        DEVICE_UVM_TOOLS => "nvidia-uvm-tools".to_owned(),
        DEVICE_UNKNOWN => "unknown".to_owned(),
        n => format!("nvidia{n}"),
    }
}

#[cfg(test)]
mod tests;
