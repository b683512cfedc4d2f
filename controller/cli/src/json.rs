//! The `--json` documents. Key names are an interface: add keys, never rename them.
//!
//! - session: `id`, `name`, `owner`, `priority`, `state`, `node`, `requested` (slot → exact
//!   decimal string), `devices` (`index`, `uuid`, `shares`, `memory_bytes`, `exclusive`),
//!   `reason`, `created_at_ms`, `updated_at_ms`, `target` (null when the quota binds to nothing,
//!   else `kind`: `container_id`, `pod_uid`, `cgroup_path` or `managed`, and `value`: the id,
//!   UID or path, null for `managed`), `policy` (`memory`: `kill`, `stop` or `report`;
//!   `compute`: `hard` or `work-conserving`), `events` (the newest enforcement events, newest
//!   last, at most 32: `action`, `reason`, `container`, `pid`, `device` (null: none),
//!   `requested_bytes`, `used_bytes`, `limit_bytes`, `at_ms`), `class` (its workload class), `placement` (the
//!   mode it asked for, null for the controller's), `explanation` (null until placed, else
//!   `mode`, `considered`, `candidates`: `node`, `devices`, `total`, `chosen`, `over_cap`,
//!   `predicted_utilization`, `terms` (`name`, `value`, `weight`, `contribution`)), `origin`
//!   (`controller`, or `dra` for a Kubernetes claim its node's agent prepared), `kubernetes`
//!   (null unless `dra`: `namespace`, `claim_name`, `claim_uid`, `pod_name`, `pod_uid`),
//!   `revision` (of its latest change; see docs/architecture.md, "Watching sessions"),
//!   `share` (null from a controller that doesn't report it, else `entitled_compute` (its share
//!   of each GPU, averaged over its GPUs), `entitled_memory_bytes`, `samples` (usage reports
//!   received), `achieved` (null when no usage was reported yet, else `mean` and
//!   `window_samples`: the GPU time share over the newest reports, `last`, `last_memory_bytes`,
//!   `peak_memory_bytes`); see docs/metrics.md, "Achieved against entitled"), `decisions`
//!   (the scheduler's, newest last, at most 16: `at_ms`, `kind` (`waited`, `preempted` or
//!   `yielded`), `detail`), `gang` (null
//!   unless a member of one: `name`, `size`; see docs/teams.md, "Gangs");
//! - profile: `class`, `runs`, `samples`, `deciles` (utilization at the 5th … 95th
//!   percentiles), `mean`, `peak_memory_bytes`, `mean_ioctls_per_sec`, `updated_at_ms`;
//! - node: `id`, `hostname`, `state`, `capacity`, `allocated`, `devices` (`index`, `uuid`,
//!   `model`, `memory_bytes`, `numa_node`, `sm_count`, `is_mig`), `kubernetes_devices` (the GPUs
//!   offered to Kubernetes, the same keys), `hooks`, `last_heartbeat_ms`; `node show` adds
//!   `allocation_map` (`index`, `uuid`, `capacity_shares`, `allocated_shares`, `memory_bytes`,
//!   `allocated_memory_bytes`, `sessions`, `kubernetes`: offered to Kubernetes);
//! - slot type: `name`, `kind` (`count`, `bytes`, `unique`);
//! - queue: `name`, `guaranteed`, `limit` (null: no limit), `held`, `borrowed` (each slot →
//!   exact decimal string, bytes as whole numbers), `members`.

use std::collections::BTreeMap;

use gpuwarden_proto::v1 as pb;
use serde::Serialize;

use crate::wire::{kind, mean, node_state, state};
use gpuwarden_types::{event::EnforcementEvent, policy::QuotaPolicy};

/// A session.
#[derive(Debug, Serialize)]
pub struct Session {
    id: String,
    name: String,
    owner: String,
    priority: i32,
    state: &'static str,
    node: Option<String>,
    requested: BTreeMap<String, String>,
    devices: Vec<DeviceShare>,
    reason: String,
    created_at_ms: i64,
    updated_at_ms: i64,
    target: Option<Target>,
    policy: QuotaPolicy,
    events: Vec<EnforcementEvent>,
    class: String,
    placement: Option<String>,
    explanation: Option<Explanation>,
    origin: String,
    kubernetes: Option<KubernetesClaim>,
    /// The revision of its latest change (resume a watch after it).
    revision: u64,
    /// Its entitled share next to what its agent measured it getting.
    share: Option<Share>,
    /// Why it waited, whom it preempted, whom it yielded to.
    decisions: Vec<Decision>,
    /// The gang it belongs to.
    gang: Option<Gang>,
}

/// A session's gang.
#[derive(Debug, Serialize)]
pub struct Gang {
    name: String,
    size: u32,
}

/// A scheduling decision about a session.
#[derive(Debug, Serialize)]
pub struct Decision {
    at_ms: i64,
    kind: String,
    detail: String,
}

/// A session's entitled share and the achieved one.
#[derive(Debug, Serialize)]
pub struct Share {
    entitled_compute: f64,
    entitled_memory_bytes: u64,
    samples: u64,
    /// `None`: no usage reported yet.
    achieved: Option<Achieved>,
}

/// What a session's agent measured it getting.
#[derive(Debug, Serialize)]
pub struct Achieved {
    mean: f64,
    window_samples: u32,
    last: f64,
    last_memory_bytes: u64,
    peak_memory_bytes: u64,
}

impl From<&pb::SessionShare> for Share {
    fn from(s: &pb::SessionShare) -> Self {
        Self {
            entitled_compute: s.entitled_compute,
            entitled_memory_bytes: s.entitled_memory_bytes,
            samples: s.samples,
            achieved: (s.samples > 0).then_some(Achieved {
                mean: s.achieved_mean,
                window_samples: s.window_samples,
                last: s.achieved_last,
                last_memory_bytes: s.last_memory_bytes,
                peak_memory_bytes: s.peak_memory_bytes,
            }),
        }
    }
}

/// The Kubernetes claim and pod a `dra` session stands for.
#[derive(Debug, Serialize)]
pub struct KubernetesClaim {
    namespace: String,
    claim_name: String,
    claim_uid: String,
    pod_name: String,
    pod_uid: String,
}

/// Why a session went where it went.
#[derive(Debug, Serialize)]
pub struct Explanation {
    mode: String,
    considered: u32,
    candidates: Vec<Candidate>,
}

/// One scored placement.
#[derive(Debug, Serialize)]
pub struct Candidate {
    node: String,
    devices: Vec<u32>,
    total: f64,
    chosen: bool,
    over_cap: bool,
    predicted_utilization: f64,
    terms: Vec<Term>,
}

/// One term of a score.
#[derive(Debug, Serialize)]
pub struct Term {
    name: String,
    value: f64,
    weight: f64,
    contribution: f64,
}

impl From<&pb::PlacementExplanation> for Explanation {
    fn from(e: &pb::PlacementExplanation) -> Self {
        Self {
            mode: e.mode.clone(),
            considered: e.considered,
            candidates: e
                .candidates
                .iter()
                .map(|c| Candidate {
                    node: c.node_id.clone(),
                    devices: c.devices.clone(),
                    total: c.total,
                    chosen: c.chosen,
                    over_cap: c.over_cap,
                    predicted_utilization: c.predicted_utilization,
                    terms: c
                        .terms
                        .iter()
                        .map(|t| Term {
                            name: t.name.clone(),
                            value: t.value,
                            weight: t.weight,
                            contribution: t.contribution,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// A workload class's profile.
#[derive(Debug, Serialize)]
pub struct Profile {
    class: String,
    runs: u32,
    samples: u64,
    deciles: Vec<f64>,
    mean: f64,
    peak_memory_bytes: u64,
    mean_ioctls_per_sec: f64,
    updated_at_ms: i64,
}

impl From<&pb::Profile> for Profile {
    fn from(p: &pb::Profile) -> Self {
        Self {
            class: p.class.clone(),
            runs: p.runs,
            samples: p.samples,
            mean: mean(&p.deciles),
            deciles: p.deciles.clone(),
            peak_memory_bytes: p.peak_memory_bytes,
            mean_ioctls_per_sec: p.mean_ioctls_per_sec,
            updated_at_ms: p.updated_at_ms,
        }
    }
}

/// The workload a session's quota binds to.
#[derive(Debug, Serialize)]
pub struct Target {
    kind: &'static str,
    value: Option<String>,
}

fn target(t: Option<&pb::Target>) -> Option<Target> {
    let target = gpuwarden_proto::convert::target_from_pb(t);
    (!target.is_none()).then(|| Target {
        kind: target.kind(),
        value: target.value().map(str::to_owned),
    })
}

fn policy(p: Option<&pb::QuotaPolicy>) -> QuotaPolicy {
    // Empty on the wire is the default: show what is in force. The controller only sends names
    // it parsed itself.
    gpuwarden_proto::convert::policy_from_pb(p).unwrap_or_default()
}

/// One device part of a session.
#[derive(Debug, Serialize)]
pub struct DeviceShare {
    index: u32,
    uuid: String,
    shares: String,
    memory_bytes: u64,
    exclusive: bool,
}

impl From<&pb::Session> for Session {
    fn from(s: &pb::Session) -> Self {
        Self {
            id: s.id.clone(),
            name: s.name.clone(),
            owner: s.owner.clone(),
            priority: s.priority,
            state: state(s.state),
            node: (!s.node_id.is_empty()).then(|| s.node_id.clone()),
            requested: slots(s.requested.as_ref()),
            devices: s
                .devices
                .iter()
                .map(|d| DeviceShare {
                    index: d.index,
                    uuid: d.uuid.clone(),
                    shares: d.shares.clone(),
                    memory_bytes: d.memory_bytes,
                    exclusive: d.exclusive,
                })
                .collect(),
            reason: s.reason.clone(),
            created_at_ms: s.created_at_ms,
            updated_at_ms: s.updated_at_ms,
            target: target(s.target.as_ref()),
            policy: policy(s.policy.as_ref()),
            // The stored event has exactly the documented keys.
            events: s
                .events
                .iter()
                .map(gpuwarden_proto::convert::event_from_pb)
                .collect(),
            class: s.class.clone(),
            placement: (!s.placement.is_empty()).then(|| s.placement.clone()),
            explanation: s.explanation.as_ref().map(Explanation::from),
            origin: if s.origin.is_empty() {
                "controller".to_owned()
            } else {
                s.origin.clone()
            },
            kubernetes: s.kubernetes.as_ref().map(|k| KubernetesClaim {
                namespace: k.namespace.clone(),
                claim_name: k.claim_name.clone(),
                claim_uid: k.claim_uid.clone(),
                pod_name: k.pod_name.clone(),
                pod_uid: k.pod_uid.clone(),
            }),
            revision: s.revision,
            share: s.share.as_ref().map(Share::from),
            decisions: s
                .decisions
                .iter()
                .map(|d| Decision {
                    at_ms: d.at_ms,
                    kind: d.kind.clone(),
                    detail: d.detail.clone(),
                })
                .collect(),
            gang: s.gang.as_ref().map(|g| Gang {
                name: g.name.clone(),
                size: g.size,
            }),
        }
    }
}

fn slots(s: Option<&pb::ResourceSlot>) -> BTreeMap<String, String> {
    s.map(|s| {
        s.values
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    })
    .unwrap_or_default()
}

/// A node.
#[derive(Debug, Serialize)]
pub struct Node {
    id: String,
    hostname: String,
    state: &'static str,
    capacity: BTreeMap<String, String>,
    allocated: BTreeMap<String, String>,
    devices: Vec<Device>,
    kubernetes_devices: Vec<Device>,
    hooks: Vec<String>,
    last_heartbeat_ms: i64,
}

/// A device of a node.
#[derive(Debug, Serialize)]
pub struct Device {
    index: u32,
    uuid: String,
    model: String,
    memory_bytes: u64,
    numa_node: i32,
    sm_count: u32,
    is_mig: bool,
}

impl From<&pb::Device> for Device {
    fn from(d: &pb::Device) -> Self {
        Self {
            index: d.index,
            uuid: d.uuid.clone(),
            model: d.model.clone(),
            memory_bytes: d.memory_bytes,
            numa_node: d.numa_node,
            sm_count: d.sm_count,
            is_mig: d.is_mig,
        }
    }
}

impl From<&pb::Node> for Node {
    fn from(n: &pb::Node) -> Self {
        let info = n.info.clone().unwrap_or_default();
        Self {
            id: info.node_id,
            hostname: info.hostname,
            state: node_state(n.state),
            capacity: slots(info.capacity.as_ref()),
            allocated: slots(n.allocated.as_ref()),
            devices: info.devices.iter().map(Device::from).collect(),
            kubernetes_devices: info.kubernetes_devices.iter().map(Device::from).collect(),
            hooks: info.hooks,
            last_heartbeat_ms: n.last_heartbeat_ms,
        }
    }
}

/// `node show`: the node and its allocation map.
#[derive(Debug, Serialize)]
pub struct NodeDetail {
    #[serde(flatten)]
    node: Node,
    allocation_map: Vec<DeviceAllocation>,
}

/// One device of the allocation map.
#[derive(Debug, Serialize)]
pub struct DeviceAllocation {
    index: u32,
    uuid: String,
    capacity_shares: String,
    allocated_shares: String,
    memory_bytes: u64,
    allocated_memory_bytes: u64,
    sessions: Vec<String>,
    kubernetes: bool,
    /// For a MIG instance, its GPU's UUID.
    #[serde(skip_serializing_if = "String::is_empty")]
    parent_uuid: String,
}

impl NodeDetail {
    /// The node with its map.
    #[must_use]
    pub fn new(node: &pb::Node, devices: &[pb::DeviceAllocation]) -> Self {
        Self {
            node: Node::from(node),
            allocation_map: devices
                .iter()
                .map(|d| DeviceAllocation {
                    index: d.index,
                    uuid: d.uuid.clone(),
                    capacity_shares: d.capacity_shares.clone(),
                    allocated_shares: d.allocated_shares.clone(),
                    memory_bytes: d.memory_bytes,
                    allocated_memory_bytes: d.allocated_memory_bytes,
                    sessions: d.sessions.clone(),
                    kubernetes: d.kubernetes,
                    parent_uuid: d.parent_uuid.clone(),
                })
                .collect(),
        }
    }
}

/// A slot type.
#[derive(Debug, Serialize)]
pub struct SlotType {
    name: String,
    kind: &'static str,
}

impl From<&pb::SlotType> for SlotType {
    fn from(t: &pb::SlotType) -> Self {
        Self {
            name: t.name.clone(),
            kind: kind(t.kind),
        }
    }
}

/// A team queue.
#[derive(Debug, Serialize)]
pub struct Queue {
    name: String,
    guaranteed: BTreeMap<String, String>,
    limit: Option<BTreeMap<String, String>>,
    held: BTreeMap<String, String>,
    borrowed: BTreeMap<String, String>,
    members: Vec<String>,
}

impl From<&pb::Queue> for Queue {
    fn from(q: &pb::Queue) -> Self {
        Self {
            name: q.name.clone(),
            guaranteed: slots(q.guaranteed.as_ref()),
            limit: q.limit.as_ref().map(|l| slots(Some(l))),
            held: slots(q.held.as_ref()),
            borrowed: slots(q.borrowed.as_ref()),
            members: q.members.clone(),
        }
    }
}
