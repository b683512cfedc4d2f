//! The node's ResourceSlice (`resource.k8s.io/v1`): one pool named for the node, one device per
//! GPU offered to Kubernetes, each shared (`allowMultipleAllocations`) with consumable capacity
//! `milli` (thousandths of the GPU's compute, 1000 per GPU, steps of 1) and `memory` (the GPU's
//! memory in whole MiB, steps of 1 MiB).
//!
//! Why whole units: kube-scheduler's allocator rounds a request inside a `validRange` with
//! integer arithmetic on `Quantity.Value()` (`k8s.io/dynamic-resource-allocation`,
//! `structured/internal/experimental/consumable_capacity.go`, `roundUpRange`, v0.34–v0.36), which
//! rounds up to a whole unit: a capacity of `1` in steps of `1u` charges `0.5` as `1`. In
//! thousandths every request is a whole number and is charged exactly (docs/kubernetes.md,
//! "Capacities the scheduler computes exactly").
//!
//! A capacity a claim does not name is charged at its `requestPolicy.default`, the whole device
//! here: the webhook names both (docs/kubernetes.md), and so should hand-written claims.
//!
//! Published when the agent starts, and checked again at every tick: made again when the kubelet
//! (or anyone) deleted it, put back when it was changed, and replaced when a GPU turns unusable
//! (its device node lost: tainted `NoSchedule`, or left out where the API server drops taints)
//! or usable again; the pool's generation goes up with each change.

use std::path::Path;

use serde_json::{Value, json};

use gpuwarden_types::quantity::Quantity;

use super::{
    DRIVER_NAME,
    apiserver::{self, ApiError, ApiServer},
    device_name,
};
use crate::devices::GpuDevice;

/// The API path of ResourceSlices.
pub const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// The capacity of a GPU's compute, in thousandths.
pub const MILLI: &str = "milli";

/// The capacity of a GPU's memory.
pub const MEMORY: &str = "memory";

/// Thousandths of compute one GPU has.
pub const MILLI_PER_GPU: u64 = 1000;

/// Bytes in the memory capacity's unit and step.
pub const MIB: u64 = 1 << 20;

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
    // A MIG instance says which, and of what (docs/mig.md).
    if let Some(m) = &gpu.mig {
        attributes["migProfile"] = json!({ "string": m.profile });
        attributes["parentUUID"] = json!({ "string": m.parent_uuid });
        attributes["gpuInstance"] = json!({ "int": m.gpu_instance });
        attributes["computeInstance"] = json!({ "int": m.compute_instance });
        attributes["multiprocessors"] = json!({ "int": gpu.sm_count });
    }
    json!({
        "name": device_name(gpu),
        "attributes": attributes,
        "allowMultipleAllocations": true,
        "capacity": capacity(gpu),
    })
}

/// A GPU's consumable capacity: `milli` (1000) and `memory` (whole MiB, the odd bytes past the
/// last MiB left out), each in steps of one unit, a claim naming neither charged the whole GPU.
#[must_use]
pub fn capacity(gpu: &GpuDevice) -> Value {
    let whole = MILLI_PER_GPU.to_string();
    let memory = binary_quantity(gpu.memory_bytes / MIB * MIB);
    json!({
        MILLI: {
            "value": whole,
            "requestPolicy": {
                "default": whole,
                "validRange": { "min": "1", "max": whole, "step": "1" },
            },
        },
        MEMORY: {
            "value": memory,
            "requestPolicy": {
                "default": memory,
                "validRange": { "min": MEMORY_STEP, "max": memory, "step": MEMORY_STEP },
            },
        },
    })
}

/// `bytes` in the largest binary unit that divides it (`80Gi`, `15258Mi`): the form the API
/// server gives a quantity back in (`Quantity.String()`, binary SI), so what is read back
/// looks like what was written.
#[must_use]
pub fn binary_quantity(bytes: u64) -> String {
    if bytes < 1024 {
        return bytes.to_string();
    }
    let mut n = bytes;
    let mut unit = 0;
    while n.is_multiple_of(1024) && unit < 6 {
        n /= 1024;
        unit += 1;
    }
    format!("{n}{}", ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][unit])
}

/// The taint key of a GPU the agent finds unusable (its device node gone).
pub const UNHEALTHY_TAINT: &str = "gpu.gpuwarden.io/unhealthy";

/// The taint on an unusable GPU: no new claim is allocated it (`NoSchedule`); pods already
/// using it are left to their owners.
#[must_use]
pub fn unhealthy_taint() -> Value {
    json!({ "key": UNHEALTHY_TAINT, "value": "device-node-missing", "effect": "NoSchedule" })
}

/// The devices of the slice: the offered GPUs, those whose device node is gone tainted
/// ([`unhealthy_taint`]) — or left out when `drop_unhealthy` (an API server that drops taints,
/// the `DRADeviceTaints` gate off, would publish them as healthy).
#[must_use]
pub fn devices(
    offered: &[GpuDevice],
    driver_version: Option<&str>,
    drop_unhealthy: bool,
) -> Vec<Value> {
    offered
        .iter()
        .filter_map(|g| {
            let healthy = Path::new(&g.device_node).exists();
            let mut d = device(g, driver_version);
            if !healthy {
                if drop_unhealthy {
                    return None;
                }
                d["taints"] = json!([unhealthy_taint()]);
            }
            Some(d)
        })
        .collect()
}

/// The watch on the slice of `node` (its name as field selector).
#[must_use]
pub fn watch_path(node: &str) -> String {
    format!(
        "{SLICES}?watch=true&fieldSelector=metadata.name%3D{}",
        slice_name(node)
    )
}

/// The Node's API path.
fn node_path(node: &str) -> String {
    format!("/api/v1/nodes/{node}")
}

/// The owner reference to `node` (`v1` Node, its UID read from the API server), as the upstream
/// `resourceslice` controller sets it: the slice of a deleted Node is then collected with it.
///
/// # Errors
/// The Node can't be read (no RBAC for `nodes get`, or no such Node).
pub async fn node_owner(api: &ApiServer, node: &str) -> Result<Value, ApiError> {
    let path = node_path(node);
    let answer = api.request(http::Method::GET, &path, None).await?;
    let object: Value = apiserver::json(&answer, "GET", &path)?;
    let uid = object
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
        .ok_or_else(|| ApiError::Body(format!("{path}: no metadata.uid")))?;
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "name": node,
        "uid": uid,
        "controller": true,
    }))
}

/// The whole object.
#[must_use]
pub fn object(
    node: &str,
    generation: i64,
    devices: &[Value],
    resource_version: Option<&str>,
    owner: Option<&Value>,
) -> Value {
    let mut metadata = json!({ "name": slice_name(node) });
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    if let Some(owner) = owner {
        metadata["ownerReferences"] = json!([owner]);
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

/// The devices of a slice the API server returned, without what it adds itself (a taint's
/// `timeAdded`), for comparing with what is published.
#[must_use]
pub fn as_published(devices: &Value) -> Value {
    let mut devices = devices.clone();
    for taint in devices
        .as_array_mut()
        .into_iter()
        .flatten()
        .filter_map(|d| d.get_mut("taints").and_then(Value::as_array_mut))
        .flatten()
    {
        if let Some(t) = taint.as_object_mut() {
            t.remove("timeAdded");
        }
    }
    devices
}

/// Whether a slice the API server returned lost the taints written (the `DRADeviceTaints` gate
/// off in kube-apiserver): a tainted GPU would then look healthy.
#[must_use]
pub fn lost_taints(written: &[Value], returned: &Value) -> bool {
    let tainted = |d: &Value| {
        d.get("taints")
            .and_then(Value::as_array)
            .is_some_and(|t| !t.is_empty())
    };
    written.iter().any(tainted)
        && !returned
            .pointer("/spec/devices")
            .and_then(Value::as_array)
            .is_some_and(|ds| ds.iter().any(tainted))
}

/// Whether two JSON values are the same, a quantity equal to its other spellings (`1000` and
/// `1k`, `85899345920` and `80Gi`): the API server gives quantities back in its canonical form.
#[must_use]
pub fn same(left: &Value, right: &Value) -> bool {
    match (left, right) {
        (Value::String(l), Value::String(r)) => {
            l == r || matches!((Quantity::parse(l), Quantity::parse(r)), (Ok(p), Ok(q)) if p == q)
        }
        (Value::Array(l), Value::Array(r)) => {
            l.len() == r.len() && l.iter().zip(r).all(|(p, q)| same(p, q))
        }
        (Value::Object(l), Value::Object(r)) => {
            l.len() == r.len() && l.iter().all(|(k, v)| r.get(k).is_some_and(|w| same(v, w)))
        }
        _ => left == right,
    }
}

/// `devices` as an API server with the `DRAConsumableCapacity` gate off keeps them: without
/// `allowMultipleAllocations` and the capacities' `requestPolicy`
/// (`pkg/registry/resource/resourceslice/strategy.go`, `dropDisabledFields`).
#[must_use]
pub fn without_consumable_capacity(devices: &[Value]) -> Vec<Value> {
    devices
        .iter()
        .map(|d| {
            let mut d = d.clone();
            if let Some(o) = d.as_object_mut() {
                o.remove("allowMultipleAllocations");
            }
            if let Some(capacity) = d.get_mut("capacity").and_then(Value::as_object_mut) {
                for c in capacity.values_mut() {
                    if let Some(o) = c.as_object_mut() {
                        o.remove("requestPolicy");
                    }
                }
            }
            d
        })
        .collect()
}

/// Whether a slice the API server returned lost the consumable-capacity fields we wrote (the
/// `DRAConsumableCapacity` gate is off in kube-apiserver): every claim then gets a whole GPU.
#[must_use]
pub fn lost_consumable_capacity(written: &[Value], returned: &Value) -> bool {
    let shared_written = written
        .iter()
        .any(|d| d["allowMultipleAllocations"] == Value::Bool(true));
    let shared_returned = returned
        .pointer("/spec/devices")
        .and_then(Value::as_array)
        .is_some_and(|ds| {
            ds.iter()
                .any(|d| d["allowMultipleAllocations"] == Value::Bool(true))
        });
    shared_written && !shared_returned
}

/// What [`publish`] did to the slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// It was missing (never made, or deleted — as the kubelet does at its start) and was made.
    Created,
    /// It differed (GPUs changed, or edited by someone else) and was replaced.
    Replaced,
    /// It was as it should be.
    Kept,
    /// No GPU is offered: it was deleted, or was not there.
    Deleted,
}

/// What the API server holds after [`publish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// What was done.
    pub action: Action,
    /// The pool's generation now (0 when deleted).
    pub generation: i64,
    /// Whether the API server dropped `allowMultipleAllocations` (the `DRAConsumableCapacity`
    /// gate is off in kube-apiserver); `None` when the slice wasn't seen this time.
    pub gate_off: Option<bool>,
    /// The API server dropped the devices' taints (the `DRADeviceTaints` gate is off).
    pub taints_dropped: bool,
}

/// Makes the API server's slice for `node` hold `devices`, owned by `owner` (the Node) when
/// given: created when missing (with a generation above `last_generation`), replaced (with the
/// pool's generation one up) when different, deleted when no device is offered. Called at every
/// tick, so a slice the kubelet deleted at its start is back within a tick.
///
/// # Errors
/// The API server refused or could not be reached.
pub async fn publish(
    api: &ApiServer,
    node: &str,
    devices: &[Value],
    owner: Option<&Value>,
    last_generation: i64,
) -> Result<Published, ApiError> {
    let path = format!("{SLICES}/{}", slice_name(node));
    // `resourceVersion=0`: served from the API server's watch cache, so a check at every tick
    // of every node costs it little; a read a moment stale is corrected at the next tick.
    let current = api
        .request(
            http::Method::GET,
            &format!("{path}?resourceVersion=0"),
            None,
        )
        .await?;
    let existing: Option<Value> = match current.status {
        404 => None,
        _ => Some(apiserver::json(&current, "GET", &path)?),
    };
    let done = |action, generation, gate_off| Published {
        action,
        generation,
        gate_off: Some(gate_off),
        taints_dropped: false,
    };
    if devices.is_empty() {
        if existing.is_some() {
            let answer = api.request(http::Method::DELETE, &path, None).await?;
            if !answer.is_success() && answer.status != 404 {
                return Err(ApiError::status(&answer, "DELETE", &path));
            }
        }
        return Ok(done(Action::Deleted, 0, false));
    }
    let desired = Value::Array(devices.to_vec());
    match existing {
        None => {
            let generation = last_generation + 1;
            let body = object(node, generation, devices, None, owner);
            let answer = api.request(http::Method::POST, SLICES, Some(&body)).await?;
            if answer.status == 409 {
                // Made already, and the cached read was behind: looked at again next tick.
                return Ok(Published {
                    gate_off: None,
                    ..done(Action::Kept, last_generation, false)
                });
            }
            let made: Value = apiserver::json(&answer, "POST", SLICES)?;
            Ok(Published {
                taints_dropped: lost_taints(devices, &made),
                ..done(
                    Action::Created,
                    generation,
                    lost_consumable_capacity(devices, &made),
                )
            })
        }
        Some(old) => {
            let generation = old["spec"]["pool"]["generation"]
                .as_i64()
                .unwrap_or(0)
                .max(last_generation);
            let old_devices = &as_published(&old["spec"]["devices"]);
            let gate_off = same(
                old_devices,
                &Value::Array(without_consumable_capacity(devices)),
            );
            let has_owner_ref = owner.is_none_or(|o| {
                old.pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .is_some_and(|refs| refs.iter().any(|r| r["uid"] == o["uid"]))
            });
            if (same(old_devices, &desired) || gate_off)
                && old["spec"]["nodeName"] == json!(node)
                && has_owner_ref
            {
                return Ok(done(Action::Kept, generation, gate_off));
            }
            let rv = old["metadata"]["resourceVersion"].as_str();
            let body = object(node, generation + 1, devices, rv, owner);
            let answer = api.request(http::Method::PUT, &path, Some(&body)).await?;
            let replaced: Value = apiserver::json(&answer, "PUT", &path)?;
            Ok(Published {
                taints_dropped: lost_taints(devices, &replaced),
                ..done(
                    Action::Replaced,
                    generation + 1,
                    lost_consumable_capacity(devices, &replaced),
                )
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(memory_bytes: u64) -> GpuDevice {
        GpuDevice {
            mig: None,
            uuid: "GPU-0".into(),
            model: "Mock".into(),
            memory_bytes,
            numa_node: 0,
            sm_count: 0,
            is_mig: false,
            index: 0,
            device_node: "/dev/gpuwarden-test-no-such-node".into(),
        }
    }

    #[test]
    fn a_mig_instance_says_its_profile_parent_and_ids() {
        let mut instance = gpu(16 << 30);
        instance.is_mig = true;
        instance.index = 2;
        instance.sm_count = 16;
        instance.mig = Some(crate::devices::mig::MigInstance {
            parent_index: 1,
            parent_uuid: "GPU-p".into(),
            gpu_instance: 9,
            compute_instance: 0,
            profile: "1g.18gb".into(),
            gi_cap_minor: Some(84),
            ci_cap_minor: Some(85),
        });
        let d = device(&instance, None);
        assert_eq!(d["name"], "gpu-2");
        let a = &d["attributes"];
        assert_eq!(a["mig"], json!({ "bool": true }));
        assert_eq!(a["migProfile"], json!({ "string": "1g.18gb" }));
        assert_eq!(a["parentUUID"], json!({ "string": "GPU-p" }));
        assert_eq!(a["gpuInstance"], json!({ "int": 9 }));
        assert_eq!(a["computeInstance"], json!({ "int": 0 }));
        assert_eq!(a["multiprocessors"], json!({ "int": 16 }));
        // Attribute names are C identifiers of at most 32 characters (DRA's rule).
        for name in a.as_object().unwrap().keys() {
            assert!(name.len() <= 32 && name.chars().all(|c| c.is_ascii_alphanumeric()));
        }
        // A whole GPU carries none of them.
        assert!(
            device(&gpu(1 << 30), None)["attributes"]
                .get("migProfile")
                .is_none()
        );
    }

    #[test]
    fn memory_is_published_in_whole_mib_as_the_api_server_writes_it() {
        assert_eq!(binary_quantity(80 << 30), "80Gi");
        assert_eq!(binary_quantity(15_258 << 20), "15258Mi");
        assert_eq!(binary_quantity(1000), "1000");
        let c = capacity(&gpu(16_000_000_000));
        assert_eq!(c[MEMORY]["value"], "15258Mi");
        assert_eq!(c[MEMORY]["requestPolicy"]["validRange"]["max"], "15258Mi");
        assert_eq!(c[MILLI]["value"], "1000");
    }

    #[test]
    fn quantities_compare_by_value_and_server_fields_are_no_difference() {
        assert!(same(&json!({"v": "1k"}), &json!({"v": "1000"})));
        assert!(same(&json!(["85899345920"]), &json!(["80Gi"])));
        assert!(!same(&json!({"v": "1k"}), &json!({"v": "1001"})));
        assert!(!same(&json!({"v": "gpu-0"}), &json!({"v": "gpu-1"})));
        assert!(!same(&json!({"a": "1"}), &json!({"a": "1", "b": "2"})));
        let published = json!([{"name": "gpu-1", "taints": [unhealthy_taint()]}]);
        let mut returned = published.clone();
        returned[0]["taints"][0]["timeAdded"] = json!("2026-01-01T00:00:00Z");
        assert!(!same(&returned, &published));
        assert!(same(&as_published(&returned), &published));
    }

    #[test]
    fn an_unusable_gpu_is_tainted_or_left_out() {
        let lost = gpu(1 << 30);
        let tainted = devices(std::slice::from_ref(&lost), None, false);
        assert_eq!(tainted[0]["taints"], json!([unhealthy_taint()]));
        assert!(devices(std::slice::from_ref(&lost), None, true).is_empty());
        let returned = json!({"spec": {"devices": [device(&lost, None)]}});
        assert!(lost_taints(&tainted, &returned));
        assert!(!lost_taints(
            &tainted,
            &json!({"spec": {"devices": tainted}})
        ));
    }

    #[test]
    fn a_slice_without_the_gate_is_recognised() {
        let written = vec![device(&gpu(1 << 30), None)];
        let stripped = without_consumable_capacity(&written);
        assert!(stripped[0].get("allowMultipleAllocations").is_none());
        assert!(
            stripped[0]["capacity"][MILLI]
                .get("requestPolicy")
                .is_none()
        );
        assert!(stripped[0]["capacity"][MILLI].get("value").is_some());
        assert!(lost_consumable_capacity(
            &written,
            &json!({"spec": {"devices": stripped}})
        ));
        assert!(!lost_consumable_capacity(
            &written,
            &json!({"spec": {"devices": written}})
        ));
    }
}
