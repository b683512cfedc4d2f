//! CDI specs (Container Device Interface, spec version 1.1.0): the device nodes a prepared claim
//! gives its containers, which the container runtime injects. Nothing else is injected: no
//! library, no environment, no hook — enforcement is in the kernel, not in the workload.

use std::{
    io,
    path::{Path, PathBuf},
};

use serde_json::json;

use super::DRIVER_NAME;
use crate::devices::GpuDevice;

/// The CDI kind of the devices this driver describes (`vendor/class`).
pub const CDI_KIND: &str = "gpu.gpuwarden.io/gpu";

/// The CDI spec version written.
pub const CDI_VERSION: &str = "1.1.0";

/// The NVIDIA control nodes a CUDA process opens besides its GPUs; those present beside the
/// GPU's node are listed.
const CONTROL_NODES: [&str; 4] = [
    "nvidiactl",
    "nvidia-uvm",
    "nvidia-uvm-tools",
    "nvidia-modeset",
];

/// The spec file of a claim.
#[must_use]
pub fn spec_path(dir: &Path, claim_uid: &str) -> PathBuf {
    dir.join(format!("{DRIVER_NAME}-{claim_uid}.json"))
}

/// The fully qualified CDI device id of a claim (`gpu.gpuwarden.io/gpu=<claim uid>`).
#[must_use]
pub fn device_id(claim_uid: &str) -> String {
    format!("{CDI_KIND}={claim_uid}")
}

/// The spec of a claim that holds `gpus`: one CDI device named for the claim, listing each GPU's
/// node and the control nodes present beside them. A node outside `/dev` (mock devices) is
/// mapped to `/dev/<name>` in the container.
#[must_use]
pub fn spec(claim_uid: &str, gpus: &[&GpuDevice]) -> serde_json::Value {
    let mut nodes: Vec<PathBuf> = gpus.iter().map(|g| PathBuf::from(&g.device_node)).collect();
    let dirs: std::collections::BTreeSet<PathBuf> = nodes
        .iter()
        .filter_map(|n| n.parent().map(Path::to_owned))
        .collect();
    for dir in dirs {
        for name in CONTROL_NODES {
            let node = dir.join(name);
            if node.exists() && !nodes.contains(&node) {
                nodes.push(node);
            }
        }
    }
    let device_nodes: Vec<serde_json::Value> = nodes
        .iter()
        .map(|host| {
            let name = host.file_name().map_or_else(
                || host.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
            let path = format!("/dev/{name}");
            if Path::new(&path) == host {
                json!({ "path": path })
            } else {
                json!({ "path": path, "hostPath": host.display().to_string() })
            }
        })
        .collect();
    json!({
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [{
            "name": claim_uid,
            "containerEdits": { "deviceNodes": device_nodes },
        }],
    })
}

/// Writes `spec` for `claim_uid` into `dir` (made if missing), atomically.
///
/// # Errors
/// The directory or file can't be written.
pub fn write(dir: &Path, claim_uid: &str, spec: &serde_json::Value) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = spec_path(dir, claim_uid);
    let tmp = dir.join(format!(".{DRIVER_NAME}-{claim_uid}.json.tmp"));
    std::fs::write(
        &tmp,
        serde_json::to_vec_pretty(spec).map_err(io::Error::other)?,
    )?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Removes the spec of `claim_uid`; a missing one is fine.
///
/// # Errors
/// It exists and can't be removed.
pub fn remove(dir: &Path, claim_uid: &str) -> io::Result<()> {
    match std::fs::remove_file(spec_path(dir, claim_uid)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
