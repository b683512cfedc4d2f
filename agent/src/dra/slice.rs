//! The node's ResourceSlice (`resource.k8s.io/v1`): one pool named for the node, one device per
//! GPU offered to Kubernetes, each shared (`allowMultipleAllocations`) with consumable capacity
//! `shares` (1 per GPU, in steps of the agent's quantum, a millionth) and `memory` (bytes).
//! Published when the agent starts and again whenever the set of usable GPUs changes (a device
//! node lost or back); the pool's generation goes up with each change.

use std::path::Path;

use serde_json::{Value, json};

use super::{
    DRIVER_NAME,
    apiserver::{self, ApiError, ApiServer},
    device_name,
};
use crate::devices::GpuDevice;

/// The API path of ResourceSlices.
pub const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// The smallest share step a claim can ask: a millionth, the agent's quantum
/// (`enforcement::quota::PPM`) and the controller's slot scale.
pub const SHARE_STEP: &str = "1u";

/// The smallest GPU memory step a claim can ask.
pub const MEMORY_STEP: &str = "1Mi";

/// The slice's name for `node`.
#[must_use]
pub fn slice_name(node: &str) -> String {
    format!("{node}-{DRIVER_NAME}")
}

/// A NVIDIA driver version as semver (`580.159` → `580.159.0`, `535.54.03` → `535.54.3`), or
/// `None` when it isn't numbers.
#[must_use]
pub fn semver(version: &str) -> Option<String> {
    let mut parts: Vec<u64> = version
        .trim()
        .split('.')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    parts.resize(3, 0);
    Some(format!("{}.{}.{}", parts[0], parts[1], parts[2]))
}

/// One device entry.
#[must_use]
pub fn device(gpu: &GpuDevice, driver_version: Option<&str>) -> Value {
    let mut attributes = json!({
        "uuid": { "string": gpu.uuid },
        "model": { "string": gpu.model.chars().take(64).collect::<String>() },
        "index": { "int": gpu.index },
        "numaNode": { "int": gpu.numa_node },
        "mig": { "bool": gpu.is_mig },
    });
    if let Some(v) = driver_version.and_then(semver) {
        attributes["driverVersion"] = json!({ "version": v });
    }
    json!({
        "name": device_name(gpu),
        "attributes": attributes,
        "allowMultipleAllocations": true,
        "capacity": {
            "shares": {
                "value": "1",
                "requestPolicy": {
                    "default": "1",
                    "validRange": { "min": SHARE_STEP, "max": "1", "step": SHARE_STEP },
                },
            },
            "memory": {
                "value": gpu.memory_bytes.to_string(),
                "requestPolicy": {
                    "default": gpu.memory_bytes.to_string(),
                    "validRange": { "min": MEMORY_STEP, "step": MEMORY_STEP },
                },
            },
        },
    })
}

/// The devices of the slice: the offered GPUs whose device node is there.
#[must_use]
pub fn devices(offered: &[GpuDevice], driver_version: Option<&str>) -> Vec<Value> {
    offered
        .iter()
        .filter(|g| Path::new(&g.device_node).exists())
        .map(|g| device(g, driver_version))
        .collect()
}

/// The whole object.
#[must_use]
pub fn object(
    node: &str,
    generation: i64,
    devices: &[Value],
    resource_version: Option<&str>,
) -> Value {
    let mut metadata = json!({ "name": slice_name(node) });
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": DRIVER_NAME,
            "nodeName": node,
            "pool": { "name": node, "generation": generation, "resourceSliceCount": 1 },
            "devices": devices,
        },
    })
}

/// Makes the API server's slice for `node` hold `devices`: created when missing, replaced (with
/// the pool's generation one up) when different, deleted when no device is offered. Returns the
/// generation published (0: deleted or nothing to do).
///
/// # Errors
/// The API server refused or could not be reached.
pub async fn publish(api: &ApiServer, node: &str, devices: &[Value]) -> Result<i64, ApiError> {
    let path = format!("{SLICES}/{}", slice_name(node));
    let current = api.request(http::Method::GET, &path, None).await?;
    let existing: Option<Value> = match current.status {
        404 => None,
        _ => Some(apiserver::json(&current, "GET", &path)?),
    };
    if devices.is_empty() {
        if existing.is_some() {
            let answer = api.request(http::Method::DELETE, &path, None).await?;
            if !answer.is_success() && answer.status != 404 {
                return Err(ApiError::status(&answer, "DELETE", &path));
            }
        }
        return Ok(0);
    }
    match existing {
        None => {
            let body = object(node, 1, devices, None);
            let answer = api.request(http::Method::POST, SLICES, Some(&body)).await?;
            apiserver::json::<Value>(&answer, "POST", SLICES)?;
            Ok(1)
        }
        Some(old) => {
            let generation = old["spec"]["pool"]["generation"].as_i64().unwrap_or(0);
            let same = old["spec"]["devices"] == Value::Array(devices.to_vec())
                && old["spec"]["nodeName"] == json!(node);
            if same {
                return Ok(generation);
            }
            let rv = old["metadata"]["resourceVersion"].as_str();
            let body = object(node, generation + 1, devices, rv);
            let answer = api.request(http::Method::PUT, &path, Some(&body)).await?;
            apiserver::json::<Value>(&answer, "PUT", &path)?;
            Ok(generation + 1)
        }
    }
}
