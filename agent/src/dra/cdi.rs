//! CDI specs (Container Device Interface): the device nodes a prepared claim gives its
//! containers, which the container runtime injects. Nothing else is injected: no library, no
//! environment, no hook — enforcement is in the kernel, not in the workload.
//!
//! Each spec says the lowest `cdiVersion` that carries what it holds ([`required_version`]): a
//! runtime refuses a spec whose version its CDI library does not know, and containerd 1.7's
//! library knows versions up to 0.5.0 only.

use std::{
    io,
    path::{Path, PathBuf},
};

use serde_json::json;

use super::DRIVER_NAME;
use crate::devices::GpuDevice;

/// The CDI kind of the devices this driver describes (`vendor/class`).
pub const CDI_KIND: &str = "gpu.gpuwarden.io/gpu";

/// The oldest CDI spec version (`vEarliest`), enough for plain device nodes.
pub const CDI_EARLIEST: &str = "0.3.0";

/// The version that added a device node's `hostPath` and device names starting with a digit.
pub const CDI_HOST_PATH: &str = "0.5.0";

/// The lowest CDI spec version that carries `spec` as this driver writes it (a kind, devices
/// with names and `deviceNodes`), by the rules of the CDI library itself
/// (cncf-tags/container-device-interface `specs-go/version.go`, v1.1.0, `requiresV050` and
/// the rest): `hostPath` on a device node or a device name starting with a digit (a claim UID
/// may) needs 0.5.0; a dot in the kind's class, or annotations, 0.6.0 — which this driver never
/// writes; nothing else here needs more than 0.3.0.
#[must_use]
pub fn required_version(spec: &serde_json::Value) -> &'static str {
    let devices = spec["devices"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let digit_name = devices.iter().any(|d| {
        d["name"]
            .as_str()
            .and_then(|n| n.bytes().next())
            .is_some_and(|b| b.is_ascii_digit())
    });
    let host_path = devices
        .iter()
        .map(|d| &d["containerEdits"])
        .chain(std::iter::once(&spec["containerEdits"]))
        .filter_map(|e| e["deviceNodes"].as_array())
        .flatten()
        .any(|n| n["hostPath"].as_str().is_some_and(|p| !p.is_empty()));
    if digit_name || host_path {
        CDI_HOST_PATH
    } else {
        CDI_EARLIEST
    }
}

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
    // A MIG instance is used through its capability nodes too, at the same path in the
    // container (`/dev/nvidia-caps/nvidia-cap<N>`, where the driver's tools look for them).
    let caps: Vec<PathBuf> = gpus
        .iter()
        .filter_map(|g| g.mig.as_ref())
        .flat_map(|m| m.cap_nodes(Path::new(crate::devices::mig::CAPS_DIR)))
        .collect();
    let mut device_nodes: Vec<serde_json::Value> = nodes
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
    device_nodes.extend(
        caps.iter()
            .map(|c| json!({ "path": c.display().to_string() })),
    );
    let mut spec = json!({
        "cdiVersion": CDI_EARLIEST,
        "kind": CDI_KIND,
        "devices": [{
            "name": claim_uid,
            "containerEdits": { "deviceNodes": device_nodes },
        }],
    });
    spec["cdiVersion"] = json!(required_version(&spec));
    spec
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn gpu(node: &str) -> GpuDevice {
        GpuDevice {
            mig: None,
            uuid: "GPU-0".into(),
            model: "Mock".into(),
            memory_bytes: 1 << 30,
            numa_node: 0,
            sm_count: 0,
            is_mig: false,
            index: 0,
            device_node: node.into(),
        }
    }

    #[test]
    fn a_mig_instance_brings_its_parent_and_its_capability_nodes() {
        let mut instance = gpu("/dev/nvidia1");
        instance.mig = Some(crate::devices::mig::MigInstance {
            parent_index: 1,
            parent_uuid: "GPU-p".into(),
            gpu_instance: 9,
            compute_instance: 0,
            profile: "1g.18gb".into(),
            gi_cap_minor: Some(84),
            ci_cap_minor: Some(85),
        });
        let s = spec("a1b2c3d4-0000-4000-8000-000000000001", &[&instance]);
        let nodes: Vec<&str> = s["devices"][0]["containerEdits"]["deviceNodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|n| n["path"].as_str())
            .collect();
        assert!(nodes.contains(&"/dev/nvidia1"), "{nodes:?}");
        assert!(
            nodes.contains(&"/dev/nvidia-caps/nvidia-cap84"),
            "{nodes:?}"
        );
        assert!(
            nodes.contains(&"/dev/nvidia-caps/nvidia-cap85"),
            "{nodes:?}"
        );
        assert_eq!(s["cdiVersion"], "0.3.0");
    }

    #[test]
    fn the_spec_says_the_lowest_version_that_carries_it() {
        // Device nodes in /dev, a name starting with a letter: the earliest version.
        let at_dev = gpu("/dev/gpuwarden-test-no-such-node");
        let s = spec("a1b2c3d4-0000-4000-8000-000000000001", &[&at_dev]);
        assert_eq!(s["cdiVersion"], "0.3.0");
        // A claim UID starting with a digit: 0.5.0 (`requiresV050`).
        let s = spec("0f9e8d7c-6b5a-4948-8372-615243342516", &[&at_dev]);
        assert_eq!(s["cdiVersion"], "0.5.0");
        // A node outside /dev is mapped with hostPath: 0.5.0.
        let s = spec(
            "a1b2c3d4-0000-4000-8000-000000000001",
            &[&gpu("/tmp/nvidia0")],
        );
        assert_eq!(
            s["devices"][0]["containerEdits"]["deviceNodes"][0],
            json!({"path": "/dev/nvidia0", "hostPath": "/tmp/nvidia0"})
        );
        assert_eq!(s["cdiVersion"], "0.5.0");
        assert_eq!(
            required_version(
                &json!({"containerEdits": {"deviceNodes": [{"path": "/dev/x",
                "hostPath": "/y"}]}})
            ),
            "0.5.0",
            "edits at the spec's level count too"
        );
    }
}
