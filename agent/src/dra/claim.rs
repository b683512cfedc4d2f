//! A ResourceClaim as the API server returns it (`resource.k8s.io/v1`), reduced to the fields
//! the driver reads, and what it asks this node to enforce.
//!
//! The kubelet passes only a claim's namespace, name and UID; the allocation is in the claim's
//! `status`: `allocation.devices.results` (driver, pool, device, `consumedCapacity`,
//! `shareID`), `allocation.devices.config` (opaque driver parameters) and `reservedFor` (the
//! pod). [`plan`] turns that into the same quota a controller `Allocate` makes.

use std::collections::BTreeMap;

use serde::Deserialize;

use gpuwarden_proto::{convert, v1 as pb};
use gpuwarden_types::{
    policy::{MemoryPolicy, QuotaPolicy},
    target::{Target, TargetScope},
};

use gpuwarden_types::quantity::Quantity;

use super::{
    DRIVER_NAME, device_name,
    slice::{MEMORY, MILLI, MILLI_PER_GPU},
};
#[cfg(test)]
use crate::enforcement::quota::QuotaSpec;
use crate::{devices::GpuDevice, enforcement::quota::PPM};

/// The claim, as far as the driver reads it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResourceClaim {
    /// `metadata`.
    #[serde(default)]
    pub metadata: Metadata,
    /// `status`.
    #[serde(default)]
    pub status: Option<Status>,
}

/// `metadata`: name, namespace, UID.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Metadata {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Namespace.
    #[serde(default)]
    pub namespace: String,
    /// UID.
    #[serde(default)]
    pub uid: String,
}

/// `status`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// `allocation`.
    #[serde(default)]
    pub allocation: Option<Allocation>,
    /// `reservedFor`: the consumers (pods) the claim is reserved for.
    #[serde(default)]
    pub reserved_for: Vec<Consumer>,
}

/// `status.allocation`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Allocation {
    /// `devices`.
    #[serde(default)]
    pub devices: Option<DeviceAllocation>,
}

/// `status.allocation.devices`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct DeviceAllocation {
    /// `results`.
    #[serde(default)]
    pub results: Vec<DeviceResult>,
    /// `config`: class and claim configuration.
    #[serde(default)]
    pub config: Vec<DeviceConfig>,
}

/// One allocated device.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceResult {
    /// The request it serves.
    #[serde(default)]
    pub request: String,
    /// The driver.
    #[serde(default)]
    pub driver: String,
    /// The pool.
    #[serde(default)]
    pub pool: String,
    /// The device's name in the pool.
    #[serde(default)]
    pub device: String,
    /// Capacity consumed from a shared device (KEP-5075): name → quantity.
    #[serde(default)]
    pub consumed_capacity: Option<BTreeMap<String, String>>,
    /// The share's id on a shared device.
    #[serde(default, rename = "shareID")]
    pub share_id: Option<String>,
    /// Administrative access (monitoring, management): the device without its ordinary claims'
    /// limits, in a namespace an admin labelled `resource.kubernetes.io/admin-access: "true"`.
    #[serde(default)]
    pub admin_access: Option<bool>,
}

/// One configuration entry.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct DeviceConfig {
    /// `FromClass` or `FromClaim`.
    #[serde(default)]
    pub source: String,
    /// The requests it applies to; empty: all.
    #[serde(default)]
    pub requests: Vec<String>,
    /// Driver-specific parameters.
    #[serde(default)]
    pub opaque: Option<OpaqueConfig>,
}

/// `opaque`: parameters for one driver.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct OpaqueConfig {
    /// The driver they are for.
    #[serde(default)]
    pub driver: String,
    /// The parameters (an embedded object).
    #[serde(default)]
    pub parameters: serde_json::Value,
}

/// This driver's parameters in an opaque config:
/// `{"apiVersion": "gpu.gpuwarden.io/v1alpha1", "kind": "GpuConfig", "memoryPolicy": "kill",
/// "computePolicy": "hard"}`. A DeviceClass's config (an admin's) may also say which memory
/// policies its claims may pick: `"allowedMemoryPolicies": ["kill", "stop", "report"]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuConfig {
    /// `kill`, `stop` or `report`.
    #[serde(default)]
    pub memory_policy: Option<String>,
    /// `hard` or `work-conserving`.
    #[serde(default)]
    pub compute_policy: Option<String>,
    /// The memory policies a claim's own config may pick; read from a class's config only.
    #[serde(default)]
    pub allowed_memory_policies: Option<Vec<String>>,
}

/// The memory policies a claim may pick when its class allows none explicitly: a tenant can't
/// turn its limit into a mere `report` on a shared GPU.
pub const DEFAULT_CLAIM_MEMORY_POLICIES: [MemoryPolicy; 2] =
    [MemoryPolicy::Kill, MemoryPolicy::Stop];

/// A consumer in `reservedFor`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Consumer {
    /// API group (`""` for pods).
    #[serde(default)]
    pub api_group: Option<String>,
    /// Resource (`pods`).
    #[serde(default)]
    pub resource: String,
    /// Name.
    #[serde(default)]
    pub name: String,
    /// UID.
    #[serde(default)]
    pub uid: String,
}

/// Why a claim can't be prepared on this node; the text is the kubelet's per-claim error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// The UID is not the one the kubelet asked for (the claim was deleted and made again).
    #[error("ResourceClaim {namespace}/{name} has UID {found}, not {wanted}")]
    Uid {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// UID asked for.
        wanted: String,
        /// UID found.
        found: String,
    },
    /// No allocation yet.
    #[error("ResourceClaim {0} is not allocated")]
    NotAllocated(String),
    /// No device of this driver in this node's pool.
    #[error("ResourceClaim {claim} has no device of driver {DRIVER_NAME} in pool {pool}")]
    NotThisNode {
        /// `namespace/name`.
        claim: String,
        /// This node's pool.
        pool: String,
    },
    /// A MIG partition device asked for with administrative access: a partition is an
    /// instance made for the claim, which administrative access (to existing devices) is not.
    #[error(
        "device {0} is a MIG partition: administrative access is to existing devices, not to \
         an instance made for the claim"
    )]
    PartitionAdminAccess(String),
    /// A device name this node doesn't have.
    #[error("device {0}: this node has no such GPU")]
    NoSuchDevice(String),
    /// A GPU the node keeps for the controller.
    #[error("device {0} is offered to the gpuwarden controller, not to Kubernetes")]
    NotOffered(String),
    /// A consumed capacity that can't be read.
    #[error("device {device}: consumed {capacity}: {why}")]
    Capacity {
        /// Device.
        device: String,
        /// `milli`, `shares` or `memory`.
        capacity: &'static str,
        /// What is wrong.
        why: String,
    },
    /// Unreadable driver parameters.
    #[error("opaque config for {DRIVER_NAME}: {0}")]
    Config(String),
    /// A claim's own config picks a memory policy its DeviceClass does not allow.
    #[error(
        "the claim's config picks memory policy {policy}, which its DeviceClass does not allow \
         (allowed: {allowed}; a class config's allowedMemoryPolicies says more)"
    )]
    PolicyNotAllowed {
        /// What the claim picked.
        policy: MemoryPolicy,
        /// What it may pick.
        allowed: String,
    },
    /// No pod reserves the claim.
    #[error("ResourceClaim {0} is reserved for no pod")]
    NoPod(String),
    /// A claim mixing administrative and ordinary access on this node: one quota binds one pod,
    /// and it can't both limit and not limit it.
    #[error(
        "ResourceClaim {0} mixes adminAccess and ordinary requests on this node; ask for them in two claims"
    )]
    MixedAdminAccess(String),
    /// Several pods share the claim.
    #[error(
        "ResourceClaim {claim} is reserved for {pods} pods; {DRIVER_NAME} enforces a claim for one pod"
    )]
    SharedClaim {
        /// `namespace/name`.
        claim: String,
        /// How many.
        pods: usize,
    },
    /// The pod's UID is not a UUID.
    #[error("ResourceClaim {claim}: pod UID {uid:?} is not a UUID")]
    PodUid {
        /// `namespace/name`.
        claim: String,
        /// The UID.
        uid: String,
    },
}

/// One allocated device as the kubelet is answered.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PlannedDevice {
    /// The request it serves.
    pub request: String,
    /// The pool (this node's name).
    pub pool: String,
    /// The device's name (`gpu-0`).
    pub device: String,
    /// The share id, when shared.
    pub share_id: Option<String>,
}

/// What a claim asks of this node.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The pod the quota binds to.
    pub pod_uid: String,
    /// The pod's name, for logs.
    pub pod_name: String,
    /// The allocation, as the controller would send it (session `k8s-<claim uid>`); no devices
    /// for administrative access (nothing to enforce).
    pub allocate: pb::Allocate,
    /// The devices, for the kubelet's answer.
    pub devices: Vec<PlannedDevice>,
    /// The devices of the node's partition pool (`<node>/mig`): each a MIG instance to make
    /// at prepare, held whole by the claim; not in `allocate` (their indexes are known once
    /// made).
    pub partitions: Vec<PlannedDevice>,
}

impl Plan {
    /// Whether kube-scheduler allocated a device of this node whole: no `shareID`, which it
    /// gives every allocation of a shared device. The slice publishes every GPU shared, so the
    /// allocator ran with the `DRAConsumableCapacity` gate off (in kube-scheduler; off in
    /// kube-apiserver the slice itself shows it), and the claim holds the GPU alone.
    #[must_use]
    pub fn held_whole(&self) -> bool {
        self.devices.iter().any(|d| d.share_id.is_none())
    }
}

/// The session id a claim's quota runs under.
#[must_use]
pub fn session_id(claim_uid: &str) -> String {
    format!("k8s-{claim_uid}")
}

/// What `claim` (asked for by `uid`) asks this node (pool `pool`) to enforce; `offered` are the
/// GPUs offered to Kubernetes, `all` every GPU of the node; `defaults` the node's policies.
///
/// # Errors
/// See [`ClaimError`]: each is the kubelet's per-claim error text.
pub fn plan(
    claim: &ResourceClaim,
    uid: &str,
    pool: &str,
    offered: &[GpuDevice],
    all: &[GpuDevice],
    defaults: QuotaPolicy,
) -> Result<Plan, ClaimError> {
    let m = &claim.metadata;
    let id = format!("{}/{}", m.namespace, m.name);
    if m.uid != uid {
        return Err(ClaimError::Uid {
            namespace: m.namespace.clone(),
            name: m.name.clone(),
            wanted: uid.to_owned(),
            found: m.uid.clone(),
        });
    }
    let status = claim.status.clone().unwrap_or_default();
    let Some(devices) = status.allocation.and_then(|a| a.devices) else {
        return Err(ClaimError::NotAllocated(id));
    };
    let partitions = partition_results(&devices.results, pool)?;
    let ours: Vec<&DeviceResult> = devices
        .results
        .iter()
        .filter(|r| r.driver == DRIVER_NAME && r.pool == pool)
        .collect();
    if ours.is_empty() && partitions.is_empty() {
        return Err(ClaimError::NotThisNode {
            claim: id,
            pool: pool.to_owned(),
        });
    }
    let pod = reserving_pod(&status.reserved_for, &id)?;
    // Pods from the API always have dashed UUIDs (a static pod's bare hash never reserves a
    // claim: static pods can't reference API objects).
    let target = Target::PodUid(pod.uid.clone());
    if target.check_form().is_err() {
        return Err(ClaimError::PodUid {
            claim: id,
            uid: pod.uid.clone(),
        });
    }

    // Per GPU index: summed shares (ppm) and memory (bytes; 0 = the share of the device's).
    let mut per_gpu: BTreeMap<u32, (u64, u64, String)> = BTreeMap::new();
    let mut planned = Vec::new();
    let mut policy = defaults;
    let mut configs: Vec<&DeviceConfig> = devices.config.iter().collect();
    // The claim's own configuration wins over its class's.
    configs.sort_by_key(|c| c.source == "FromClaim");
    // Administrative access ignores the device's ordinary claims and their limits (the
    // `adminAccess` field's API doc): the pod gets the device nodes and no quota.
    let admin = ours.iter().filter(|r| r.admin_access == Some(true)).count();
    if admin > 0 && (admin < ours.len() || !partitions.is_empty()) {
        return Err(ClaimError::MixedAdminAccess(id));
    }
    for r in &ours {
        let gpu = offered.iter().find(|g| device_name(g) == r.device);
        let Some(gpu) = gpu else {
            return Err(if all.iter().any(|g| device_name(g) == r.device) {
                ClaimError::NotOffered(r.device.clone())
            } else {
                ClaimError::NoSuchDevice(r.device.clone())
            });
        };
        policy = configured(&configs, r, policy)?;
        if admin == 0 {
            let (shares, memory) = consumed(r, gpu)?;
            let entry = per_gpu.entry(gpu.index).or_insert((0, 0, gpu.uuid.clone()));
            entry.0 += shares;
            entry.1 += memory;
        }
        planned.push(planned_device(r));
    }
    for r in &partitions {
        policy = configured(&configs, r, policy)?;
    }
    let partitions = partitions.iter().map(|r| planned_device(r)).collect();
    let allocate = pb::Allocate {
        session_id: session_id(uid),
        slots: None,
        devices: per_gpu
            .into_iter()
            .map(|(index, (ppm, memory_bytes, uuid))| pb::DeviceShare {
                uuid,
                index,
                shares: decimal(ppm),
                memory_bytes,
                exclusive: false,
            })
            .collect(),
        target: convert::target_to_pb(&target),
        policy: Some(convert::policy_to_pb(policy)),
        // Kubernetes authorized the claim for its pod: the agent binds it as an admin's.
        scope: Some(convert::scope_to_pb(&TargetScope::admin(false))),
        // A pod's, not a `gpuwarden run`'s.
        run_caller: None,
    };
    Ok(Plan {
        pod_uid: pod.uid.clone(),
        pod_name: pod.name.clone(),
        allocate,
        devices: planned,
        partitions,
    })
}

/// The results of `results` in the partition pool of this node (pool `pool`); refused when
/// one asks for administrative access.
fn partition_results<'a>(
    results: &'a [DeviceResult],
    pool: &str,
) -> Result<Vec<&'a DeviceResult>, ClaimError> {
    let partition_pool = super::partition::pool_name(pool);
    let partitions: Vec<&DeviceResult> = results
        .iter()
        .filter(|r| r.driver == DRIVER_NAME && r.pool == partition_pool)
        .collect();
    if let Some(r) = partitions.iter().find(|r| r.admin_access == Some(true)) {
        return Err(ClaimError::PartitionAdminAccess(r.device.clone()));
    }
    Ok(partitions)
}

/// A result as the kubelet is answered.
fn planned_device(r: &DeviceResult) -> PlannedDevice {
    PlannedDevice {
        request: r.request.clone(),
        pool: r.pool.clone(),
        device: r.device.clone(),
        share_id: r.share_id.clone(),
    }
}

/// The one pod of `reserved_for` the claim `id` is reserved for.
fn reserving_pod<'a>(reserved_for: &'a [Consumer], id: &str) -> Result<&'a Consumer, ClaimError> {
    let pods: Vec<&Consumer> = reserved_for
        .iter()
        .filter(|c| c.resource == "pods" && c.api_group.as_deref().unwrap_or("").is_empty())
        .collect();
    match pods.as_slice() {
        [] => Err(ClaimError::NoPod(id.to_owned())),
        [pod] => Ok(*pod),
        more => Err(ClaimError::SharedClaim {
            claim: id.to_owned(),
            pods: more.len(),
        }),
    }
}

/// The share (ppm) and memory (bytes; 0: the share's fraction of the device) `r` consumes of
/// `gpu`. No consumed capacity at all is the whole device (an exclusive allocation).
fn consumed(r: &DeviceResult, gpu: &GpuDevice) -> Result<(u64, u64), ClaimError> {
    let consumed = r.consumed_capacity.clone().unwrap_or_default();
    let capacity_err = |capacity, why: String| ClaimError::Capacity {
        device: r.device.clone(),
        capacity,
        why,
    };
    // Non-negative and within 64 bits, or refused naming the capacity.
    let read = |capacity: &'static str, convert: fn(Quantity) -> Option<u64>| {
        consumed
            .get(capacity)
            .map(|q| {
                Quantity::parse(q)
                    .map_err(|e| e.to_string())
                    .and_then(|v| {
                        convert(v).ok_or_else(|| format!("{q:?} is negative or too large"))
                    })
                    .map_err(|why| capacity_err(capacity, why))
            })
            .transpose()
    };
    // `milli` is what the slice publishes (whole thousandths, which the scheduler charges
    // exactly); `shares` (a fraction of 1) is read from allocations made on an older slice.
    let milli = read(MILLI, Quantity::whole)?;
    if let Some(m) = milli
        && m > MILLI_PER_GPU
    {
        return Err(capacity_err(
            MILLI,
            format!("{m} is more than the {MILLI_PER_GPU} a GPU has"),
        ));
    }
    let shares = match milli {
        Some(m) => Some(m * (u64::from(PPM) / MILLI_PER_GPU)),
        None => read("shares", Quantity::micros_u64)?,
    };
    let memory = read(MEMORY, Quantity::whole_ceil)?.unwrap_or(if shares.is_some() {
        0
    } else {
        gpu.memory_bytes
    });
    Ok((shares.unwrap_or(u64::from(PPM)), memory))
}

/// `policy` with what this driver's opaque configs for `r`'s request say, in order.
fn configured(
    configs: &[&DeviceConfig],
    r: &DeviceResult,
    mut policy: QuotaPolicy,
) -> Result<QuotaPolicy, ClaimError> {
    let mut allowed: Option<Vec<MemoryPolicy>> = None;
    let mut claim_picked = None;
    for c in configs {
        let Some(opaque) = c.opaque.as_ref().filter(|o| o.driver == DRIVER_NAME) else {
            continue;
        };
        // A config names requests, or subrequests as `<request>/<subrequest>`.
        if !c.requests.is_empty()
            && !c
                .requests
                .iter()
                .any(|q| q == &r.request || r.request.starts_with(&format!("{q}/")))
        {
            continue;
        }
        let params: GpuConfig = serde_json::from_value(opaque.parameters.clone())
            .map_err(|e| ClaimError::Config(e.to_string()))?;
        policy = super::config::policy_with(
            policy,
            params.memory_policy.as_deref(),
            params.compute_policy.as_deref(),
        )
        .map_err(|e| ClaimError::Config(e.to_string()))?;
        // Only the class (the admin) widens what a claim may pick; a claim saying so is ignored.
        if c.source == "FromClass" {
            if let Some(list) = &params.allowed_memory_policies {
                allowed = Some(
                    list.iter()
                        .map(|p| p.parse::<MemoryPolicy>())
                        .collect::<Result<_, _>>()
                        .map_err(|e| ClaimError::Config(e.to_string()))?,
                );
            }
        } else if params.memory_policy.is_some() {
            claim_picked = Some(policy.memory);
        }
    }
    if let Some(picked) = claim_picked {
        let allowed = allowed.unwrap_or_else(|| DEFAULT_CLAIM_MEMORY_POLICIES.to_vec());
        if !allowed.contains(&picked) {
            return Err(ClaimError::PolicyNotAllowed {
                policy: picked,
                allowed: allowed
                    .iter()
                    .map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    Ok(policy)
}

/// Parts per million as an exact decimal (`500000` → `0.5`).
pub(crate) fn decimal(ppm: u64) -> String {
    let whole = ppm / u64::from(PPM);
    let frac = ppm % u64::from(PPM);
    if frac == 0 {
        whole.to_string()
    } else {
        let digits = format!("{frac:06}");
        format!("{whole}.{}", digits.trim_end_matches('0'))
    }
}

#[cfg(test)]
mod tests;
