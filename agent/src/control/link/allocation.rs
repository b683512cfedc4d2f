//! The answer to an allocation: refused when it names slots the node lacks or a quota that
//! can't be enforced; otherwise held on disk, acknowledged, and its quota passed down.
//!
//! The agent accepts an allocation naming slots it doesn't have only when their values are zero;
//! otherwise it answers `UnsupportedResource` (docs/architecture.md, "Slot types are merged").

use std::collections::BTreeSet;

use gpuwarden_proto::v1 as pb;

use super::{LinkChannels, LinkConfig, registration::node_info};
use crate::{
    control::holdings::{SharedHoldings, lock},
    devices::GpuBackend,
    enforcement::{QuotaCommand, confinement, quota::QuotaSpec},
};

/// The slot names this node has now.
pub(super) fn known_slots(config: &LinkConfig, backend: &dyn GpuBackend) -> BTreeSet<String> {
    node_info(config, backend, vec![], None)
        .slot_types
        .into_iter()
        .map(|t| t.name)
        .collect()
}

/// The answer to an allocation: `None` to accept it, or the nack.
#[must_use]
pub fn check_allocation(
    known: &BTreeSet<String>,
    allocate: &pb::Allocate,
) -> Option<pb::AllocationNack> {
    let unknown: Vec<&str> = allocate
        .slots
        .iter()
        .flat_map(|s| &s.values)
        .filter(|(name, value)| {
            !known.contains(*name) && !value.chars().all(|c| c == '0' || c == '.')
        })
        .map(|(name, _)| name.as_str())
        .collect();
    if !unknown.is_empty() {
        return Some(pb::AllocationNack {
            session_id: allocate.session_id.clone(),
            reason: "UnsupportedResource".to_owned(),
            message: format!("this node has no slot type {}", unknown.join(", ")),
        });
    }
    // A MIG profile is held on an instance: counted without one (a controller that doesn't
    // know profiles), it would be held nowhere.
    let unplaced: Vec<&str> = allocate
        .slots
        .iter()
        .flat_map(|s| &s.values)
        .filter(|(name, value)| {
            name.starts_with(crate::devices::mig::SLOT_PREFIX)
                && !value.chars().all(|c| c == '0' || c == '.')
        })
        .map(|(name, _)| name.as_str())
        .collect();
    (!unplaced.is_empty() && allocate.devices.is_empty()).then(|| pb::AllocationNack {
        session_id: allocate.session_id.clone(),
        reason: "UnsupportedResource".to_owned(),
        message: format!(
            "{} names no MIG instance to hold it on (a controller places a profile on an \
             instance of it)",
            unplaced.join(", ")
        ),
    })
}

/// Answers an allocation: refused when it names slots the node lacks or a quota that can't be
/// enforced; otherwise held on disk, acknowledged, and its quota passed down.
pub(super) fn accept(
    config: &LinkConfig,
    backend: &dyn GpuBackend,
    holdings: &SharedHoldings,
    channels: Option<&LinkChannels>,
    a: pb::Allocate,
) -> pb::agent_message::Msg {
    let nack = |session_id: String, reason: &str, message: String| {
        pb::agent_message::Msg::Nack(pb::AllocationNack {
            session_id,
            reason: reason.to_owned(),
            message,
        })
    };
    if let Some(n) = check_allocation(&known_slots(config, backend), &a) {
        return pb::agent_message::Msg::Nack(n);
    }
    // The id names a cgroup directory and a store key: checked before either is touched.
    if let Err(e) = confinement::check_session_id(&a.session_id) {
        let id = a.session_id.chars().take(80).collect();
        return nack(id, "InvalidQuota", e.to_string());
    }
    let spec = match QuotaSpec::from_allocate(&a, &backend.devices()) {
        Ok(spec) => spec,
        Err(e) => return nack(a.session_id, "InvalidQuota", e.to_string()),
    };
    if let Some(spec) = &spec {
        // Without enforcement (no channels) nothing binds: no pod is known either.
        let pods: &dyn confinement::PodNamespaces =
            channels.map_or(&confinement::NoPods, |c| c.pods.as_ref());
        let held: Vec<QuotaSpec> = {
            let h = lock(holdings);
            h.sessions()
                .iter()
                .filter_map(|s| h.get(s))
                .filter_map(|other| {
                    QuotaSpec::from_allocate(other, &backend.devices())
                        .ok()
                        .flatten()
                })
                .filter(|other| confinement::counts_at_arrival(spec, other, pods))
                .collect()
        };
        let checked = confinement::authorize_at_arrival(spec, pods).and_then(|()| {
            confinement::check_allocation(spec, &held, confinement::own_cgroup().as_deref())
        });
        if let Err(e) = checked {
            // The log names the other session; the answer, which its owner reads, does not.
            if let confinement::Refusal::Overlap {
                other, other_path, ..
            } = &e
            {
                tracing::warn!(session = %a.session_id, target = %spec.target, %other, %other_path, "allocation refused: {e}");
            } else {
                tracing::warn!(session = %a.session_id, target = %spec.target, "allocation refused: {e}");
            }
            return nack(a.session_id, "InvalidQuota", e.to_string());
        }
    }
    let session_id = a.session_id.clone();
    // Acknowledge only what is on disk; a failed write refuses instead.
    if let Err(e) = lock(holdings).hold(a) {
        return nack(session_id, "StoreFailed", e.to_string());
    }
    if let (Some(spec), Some(c)) = (spec, channels) {
        let _ = c.quotas.send(QuotaCommand::Apply(spec));
    }
    pb::agent_message::Msg::Ack(pb::AllocationAck { session_id })
}
