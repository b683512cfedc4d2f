//! Between the API's messages and the controller's own records (sessions, nodes, allocations,
//! explanations, profiles, observed sessions). The shared domain types convert in
//! `gpuwarden_proto::convert`; this module re-exports those it uses and wraps their errors in
//! `InvalidArgument`. Below both the API's services and the hub, which announces sessions to
//! watchers as messages.

pub use gpuwarden_proto::convert::{
    event_from_pb, event_to_pb, kind_from_pb, kind_to_pb, node_state_to_pb, placement_from_pb,
    placement_mode_to_pb, placement_request_from_pb, placement_to_pb, policy_to_pb, scope_to_pb,
    slots_to_pb, state_to_pb, target_from_pb, target_to_pb,
};
use gpuwarden_proto::v1 as pb;
use tonic::Status;

use crate::{
    allocator::{Allocation, DevicePart, DeviceSpec},
    node::{Node, NodeReport},
    placement::Explanation,
    profile::{Profile, UsageSample},
    scheduler::{NewSession, Observed},
    session::{
        DecisionKind, Gang, KubernetesClaim, Origin, QuotaPolicy, Session, SessionState,
        TargetScope, WaitKind,
    },
    slots::{ResourceSlot, SlotName},
};

/// A `ResourceSlot` message to slots, naming a bad entry.
///
/// # Errors
/// `InvalidArgument` naming the bad name or value.
pub fn slots_from_pb(slot: Option<&pb::ResourceSlot>) -> Result<ResourceSlot, Status> {
    gpuwarden_proto::convert::slots_from_pb(slot)
        .map_err(|e| Status::invalid_argument(e.to_string()))
}

/// A create request to the session it asks for: `id` is the new session's, `owner` whom the
/// caller creates it for. Lengths are checked before ([`crate::limits::Limits::create`]); this
/// checks what the fields say.
///
/// # Errors
/// `InvalidArgument` naming the bad slot, policy or placement.
pub fn new_session_from_pb(
    id: String,
    owner: String,
    r: pb::CreateSessionRequest,
) -> Result<NewSession, Status> {
    let placement = placement_request_from_pb(&r.placement, r.placement_mode)
        .map_err(Status::invalid_argument)?;
    Ok(NewSession {
        id,
        name: r.name,
        owner,
        priority: r.priority,
        requested: slots_from_pb(r.requested.as_ref())?,
        pinned_node: (!r.node_id.is_empty()).then_some(r.node_id),
        target: target_from_pb(r.target.as_ref()),
        policy: policy_from_pb(r.policy.as_ref())?,
        // The narrowest until the caller is authorized for more (`auth::grants::authorize`).
        scope: TargetScope::default(),
        class: r.class,
        placement,
        no_preempt: r.no_preempt,
        preemption: match r.preemption.as_str() {
            "" => None,
            word => Some(
                word.parse::<crate::session::PreemptionMode>()
                    .map_err(Status::invalid_argument)?,
            ),
        },
        gang: r.gang.map(gang_from_pb),
        run_uid: r.run_caller.map(|c| c.uid),
    })
}

/// A gang's message to the gang (checked when the session is created).
#[must_use]
pub fn gang_from_pb(g: pb::Gang) -> Gang {
    Gang {
        name: g.name,
        size: g.size,
    }
}

/// A gang to its message.
#[must_use]
pub fn gang_to_pb(g: &Gang) -> pb::Gang {
    pb::Gang {
        name: g.name.clone(),
        size: g.size,
    }
}

/// What an agent registers, checked.
///
/// # Errors
/// `InvalidArgument` naming the bad slot type or device.
pub fn report_from_pb(info: &pb::NodeInfo) -> Result<NodeReport, Status> {
    let slot_types = info
        .slot_types
        .iter()
        .map(|t| {
            let name =
                SlotName::new(&t.name).map_err(|e| Status::invalid_argument(e.to_string()))?;
            let kind = kind_from_pb(t.kind).ok_or_else(|| {
                Status::invalid_argument(format!("slot type {:?} has no kind", t.name))
            })?;
            Ok((name, kind))
        })
        .collect::<Result<Vec<_>, Status>>()?;
    Ok(NodeReport {
        node_id: info.node_id.clone(),
        hostname: info.hostname.clone(),
        slot_types,
        capacity: slots_from_pb(info.capacity.as_ref())?,
        devices: info.devices.iter().map(device_from_pb).collect(),
        device_models: info
            .devices
            .iter()
            .map(|d| (d.model.clone(), d.is_mig))
            .collect(),
        hooks: info.hooks.clone(),
        agent_version: info.agent_version.clone(),
        kubernetes_devices: info.kubernetes_devices.iter().map(device_from_pb).collect(),
        kubernetes_device_models: info
            .kubernetes_devices
            .iter()
            .map(|d| (d.model.clone(), d.is_mig))
            .collect(),
        mig_layouts: info
            .mig_layouts
            .iter()
            .map(gpuwarden_proto::convert::mig_layout_from_pb)
            .collect(),
    })
}

fn device_from_pb(d: &pb::Device) -> DeviceSpec {
    DeviceSpec {
        uuid: d.uuid.clone(),
        index: d.index,
        memory_bytes: d.memory_bytes,
        sm_count: d.sm_count,
        numa_node: d.numa_node,
        parent_uuid: d.parent_uuid.clone(),
    }
}

fn devices_to_pb(devices: &[DeviceSpec], models: &[(String, bool)]) -> Vec<pb::Device> {
    devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let (model, is_mig) = models.get(i).cloned().unwrap_or_default();
            pb::Device {
                uuid: d.uuid.clone(),
                model,
                memory_bytes: d.memory_bytes,
                numa_node: d.numa_node,
                sm_count: d.sm_count,
                is_mig,
                index: d.index,
                device_node: format!("/dev/nvidia{}", d.index),
                parent_uuid: d.parent_uuid.clone(),
            }
        })
        .collect()
}

/// A Kubernetes claim to its message.
#[must_use]
pub fn claim_to_pb(c: &KubernetesClaim) -> pb::KubernetesClaim {
    pb::KubernetesClaim {
        namespace: c.namespace.clone(),
        claim_name: c.claim_name.clone(),
        claim_uid: c.claim_uid.clone(),
        pod_name: c.pod_name.clone(),
        pod_uid: c.pod_uid.clone(),
    }
}

/// A Kubernetes claim message to the claim (absent: all empty).
#[must_use]
pub fn claim_from_pb(c: Option<&pb::KubernetesClaim>) -> KubernetesClaim {
    c.map(|c| KubernetesClaim {
        namespace: c.namespace.clone(),
        claim_name: c.claim_name.clone(),
        claim_uid: c.claim_uid.clone(),
        pod_name: c.pod_name.clone(),
        pod_uid: c.pod_uid.clone(),
    })
    .unwrap_or_default()
}

/// A session an agent observed (not `ended`), checked. Lengths are checked before
/// ([`crate::limits::Limits::observed`]).
///
/// # Errors
/// `InvalidArgument` for a malformed share or policy, or a claim without a namespace.
pub fn observed_from_pb(o: &pb::ObservedSession) -> Result<Observed, Status> {
    let claim = claim_from_pb(o.claim.as_ref());
    if claim.namespace.is_empty() {
        return Err(Status::invalid_argument(format!(
            "observed session {:?}: its claim has no namespace",
            o.session_id
        )));
    }
    Ok(Observed {
        id: o.session_id.clone(),
        allocation: parts_from_pb(&o.devices)?,
        target: target_from_pb(o.target.as_ref()),
        policy: policy_from_pb(o.policy.as_ref())?,
        claim,
        class: o.class.clone(),
    })
}

/// A node's report back to its message.
#[must_use]
pub fn report_to_pb(report: &NodeReport) -> pb::NodeInfo {
    pb::NodeInfo {
        node_id: report.node_id.clone(),
        hostname: report.hostname.clone(),
        slot_types: report
            .slot_types
            .iter()
            .map(|(n, k)| pb::SlotType {
                name: n.to_string(),
                kind: kind_to_pb(*k).into(),
            })
            .collect(),
        capacity: Some(slots_to_pb(&report.capacity)),
        devices: devices_to_pb(&report.devices, &report.device_models),
        hooks: report.hooks.clone(),
        agent_version: report.agent_version.clone(),
        running_sessions: vec![],
        kubernetes_devices: devices_to_pb(
            &report.kubernetes_devices,
            &report.kubernetes_device_models,
        ),
        observed_sessions: vec![],
        mig_layouts: report
            .mig_layouts
            .iter()
            .map(gpuwarden_proto::convert::mig_layout_to_pb)
            .collect(),
    }
}

/// A node to its message.
#[must_use]
pub fn node_to_pb(node: &Node) -> pb::Node {
    pb::Node {
        info: Some(report_to_pb(&node.report)),
        state: node_state_to_pb(node.state).into(),
        allocated: Some(slots_to_pb(&node.holding())),
        capacity: Some(slots_to_pb(&node.capacity())),
        last_heartbeat_ms: node.last_heartbeat_ms,
    }
}

/// Parts of an allocation to their messages.
#[must_use]
pub fn parts_to_pb(allocation: &Allocation) -> Vec<pb::DeviceShare> {
    allocation
        .parts
        .iter()
        .map(|p| pb::DeviceShare {
            uuid: p.uuid.clone(),
            index: p.index,
            shares: p.shares.to_string(),
            memory_bytes: p.memory_bytes,
            exclusive: p.exclusive,
        })
        .collect()
}

/// Device-share messages back to an allocation.
///
/// # Errors
/// `InvalidArgument` for a malformed share.
pub fn parts_from_pb(parts: &[pb::DeviceShare]) -> Result<Allocation, Status> {
    Ok(Allocation {
        parts: parts
            .iter()
            .map(|p| {
                Ok(DevicePart {
                    index: p.index,
                    uuid: p.uuid.clone(),
                    shares: p
                        .shares
                        .parse()
                        .map_err(|e| Status::invalid_argument(format!("device share: {e}")))?,
                    memory_bytes: p.memory_bytes,
                    exclusive: p.exclusive,
                })
            })
            .collect::<Result<_, Status>>()?,
    })
}

/// A session to its message.
#[must_use]
pub fn session_to_pb(s: &Session) -> pb::Session {
    pb::Session {
        id: s.id.clone(),
        name: s.name.clone(),
        owner: s.owner.clone(),
        priority: s.priority,
        requested: Some(slots_to_pb(&s.requested)),
        state: state_to_pb(s.state).into(),
        node_id: s.node.clone().unwrap_or_default(),
        devices: parts_to_pb(&s.allocation),
        reason: s.reason.clone(),
        created_at_ms: s.created_at_ms,
        updated_at_ms: s.updated_at_ms,
        target: target_to_pb(&s.target),
        policy: Some(policy_to_pb(s.policy)),
        events: s.events.iter().map(|e| event_to_pb(&s.id, e)).collect(),
        class: s.class.clone(),
        placement: placement_to_pb(s.placement),
        explanation: s.explanation.as_ref().map(explanation_to_pb),
        origin: s.origin.as_str().to_owned(),
        kubernetes: s.origin.claim().map(claim_to_pb),
        revision: s.revision,
        no_preempt: s.no_preempt,
        gang: s.gang.as_ref().map(gang_to_pb),
        decisions: s
            .decisions
            .iter()
            .map(|d| pb::SchedulingDecision {
                at_ms: d.at_ms,
                kind: d.kind.as_str().to_owned(),
                decision_kind: match d.kind {
                    DecisionKind::Waited => pb::DecisionKind::Waited,
                    DecisionKind::Preempted => pb::DecisionKind::Preempted,
                    DecisionKind::Yielded => pb::DecisionKind::Yielded,
                    DecisionKind::Suspended => pb::DecisionKind::Suspended,
                    DecisionKind::Resumed => pb::DecisionKind::Resumed,
                }
                .into(),
                detail: d.detail.clone(),
            })
            .collect(),
        share: Some(share_to_pb(s)),
        request_id: s.request_id.clone().unwrap_or_default(),
        placement_mode: placement_mode_to_pb(s.placement).into(),
        conditions: conditions(s),
        origin_kind: match s.origin {
            Origin::Controller => pb::SessionOrigin::Controller,
            Origin::Dra(_) => pb::SessionOrigin::Dra,
        }
        .into(),
    }
}

/// A session's conditions (docs/api.md, "Conditions"): `Scheduled` while it waits or holds a
/// place (none once it ended), and `Preempting` while it yields.
fn conditions(s: &Session) -> Vec<pb::SessionCondition> {
    let condition =
        |kind: &str, status: pb::ConditionStatus, reason: &str, message, at| pb::SessionCondition {
            r#type: kind.to_owned(),
            status: status.into(),
            reason: reason.to_owned(),
            message,
            last_transition_ms: at,
        };
    let mut all = Vec::new();
    match s.state {
        // False since it was created: its status has not changed, only why it waits.
        SessionState::Pending => all.push(condition(
            "Scheduled",
            pb::ConditionStatus::False,
            s.wait.map_or("NotTriedYet", WaitKind::reason),
            s.reason.clone(),
            s.created_at_ms,
        )),
        SessionState::Scheduled
        | SessionState::Running
        | SessionState::Lost
        | SessionState::Terminating => {
            all.push(condition(
                "Scheduled",
                pb::ConditionStatus::True,
                "Placed",
                format!("on node {}", s.node.as_deref().unwrap_or("-")),
                // Observed sessions were placed by Kubernetes as they were created; records from
                // before placements were timed say when they last changed.
                s.placed_at_ms.unwrap_or(if s.origin == Origin::Controller {
                    s.updated_at_ms
                } else {
                    s.created_at_ms
                }),
            ));
        }
        _ => {}
    }
    if s.state == SessionState::Terminating {
        // Its place stays booked until its node confirms the release (issue 40).
        all.push(condition(
            "Releasing",
            pb::ConditionStatus::True,
            "WaitingForNode",
            s.reason.clone(),
            s.releasing_since_ms.unwrap_or(s.updated_at_ms),
        ));
    }
    if let Some(why) = &s.preempting {
        let since = s
            .decisions
            .iter()
            .rev()
            .find(|d| d.kind == DecisionKind::Yielded)
            .map_or(s.updated_at_ms, |d| d.at_ms);
        all.push(condition(
            "Preempting",
            pb::ConditionStatus::True,
            "Preempting",
            why.clone(),
            since,
        ));
    }
    all
}

/// A session's entitled share (from its allocation) next to what its agent reported it got.
pub(crate) fn share_to_pb(s: &Session) -> pb::SessionShare {
    let parts = &s.allocation.parts;
    // The agent's utilization is each GPU's fraction averaged over the session's GPUs: the
    // entitlement is averaged the same way so the two compare.
    let entitled_compute = if parts.is_empty() {
        0.0
    } else {
        parts.iter().map(|p| p.shares.as_f64()).sum::<f64>() / parts.len() as f64
    };
    let (achieved_mean, window) = s.usage.recent_mean().unwrap_or((0.0, 0));
    let last = s.usage.last.unwrap_or_default();
    pb::SessionShare {
        entitled_compute,
        entitled_memory_bytes: parts.iter().map(|p| p.memory_bytes).sum(),
        samples: s.usage.samples,
        achieved_mean,
        window_samples: u32::try_from(window).unwrap_or(u32::MAX),
        achieved_last: last.utilization,
        last_memory_bytes: last.memory_bytes,
        peak_memory_bytes: s.usage.peak_memory_bytes,
    }
}

/// A placement explanation to its message.
#[must_use]
pub fn explanation_to_pb(e: &Explanation) -> pb::PlacementExplanation {
    pb::PlacementExplanation {
        mode: e.mode.to_string(),
        placement_mode: placement_mode_to_pb(Some(e.mode)).into(),
        candidates: e
            .candidates
            .iter()
            .map(|c| pb::PlacementCandidate {
                node_id: c.node.clone(),
                devices: c.devices.clone(),
                terms: c
                    .terms
                    .rows(&e.weights)
                    .into_iter()
                    .map(|(name, value, weight, contribution)| pb::ScoreTerm {
                        name: name.to_owned(),
                        value,
                        weight,
                        contribution,
                    })
                    .collect(),
                total: c.total,
                chosen: c.chosen,
                predicted_utilization: c.predicted_utilization,
                over_cap: c.over_cap,
            })
            .collect(),
        considered: e.considered,
    }
}

/// A usage report to a sample.
#[must_use]
pub fn usage_from_pb(u: &pb::SessionUsage) -> UsageSample {
    UsageSample {
        utilization: u.utilization,
        memory_bytes: u.memory_bytes,
        ioctls_per_sec: u.ioctls_per_sec,
    }
}

/// A profile to its message.
#[must_use]
pub fn profile_to_pb(p: &Profile) -> pb::Profile {
    pb::Profile {
        class: p.class.clone(),
        runs: p.runs,
        samples: p.samples,
        deciles: p.deciles.to_vec(),
        peak_memory_bytes: p.peak_memory_bytes,
        mean_ioctls_per_sec: p.mean_ioctls_per_sec,
        updated_at_ms: p.updated_at_ms,
    }
}

/// A `QuotaPolicy` message to a policy, from its enums or its deprecated strings; an absent
/// message, or a half given neither way, is the default.
///
/// # Errors
/// `InvalidArgument` (reason `INVALID_POLICY`, a `BadRequest` violation of the field) naming
/// the unknown policy and the accepted ones, or the string and enum that disagree.
pub fn policy_from_pb(policy: Option<&pb::QuotaPolicy>) -> Result<QuotaPolicy, Status> {
    gpuwarden_proto::convert::policy_from_pb(policy).map_err(|e| {
        let message = e.to_string();
        gpuwarden_proto::details::Details::new("INVALID_POLICY")
            .field(&format!("policy.{}", e.field()), &message)
            .status(tonic::Code::InvalidArgument, message)
    })
}

#[cfg(test)]
mod tests;
