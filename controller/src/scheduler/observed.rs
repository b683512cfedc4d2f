//! Sessions the controller observes but did not place: Kubernetes claims a node's agent prepared
//! as DRA driver (docs/kubernetes.md, "The agent as DRA driver").
//!
//! Each is kept as a Running session of origin [`Origin::Dra`], owner `k8s:<namespace>`, pinned
//! to its node, holding its device shares in that node's allocator on the GPUs the node offers to
//! Kubernetes — so the allocation map shows them, and the controller, which never hands those
//! GPUs out, cannot place a session of its own over them. Their usage reports and enforcement
//! events are recorded as any session's, and when the claim is unprepared the session ends and
//! teaches its class's profile like any other. Kubernetes admitted them: the per-owner caps and
//! the concurrency tracker do not count them, and clients cannot end them.

use super::{NewSession, Scheduler, set_state};
use crate::{
    allocator::Allocation,
    session::{KubernetesClaim, Origin, QuotaPolicy, SessionState, Target, TargetScope},
    slots::{ResourceSlot, SlotValue, names},
};

/// A session a node's agent holds that the controller did not place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Its id (`k8s-<claim uid>`).
    pub id: String,
    /// What it holds on the node.
    pub allocation: Allocation,
    /// The workload its quota binds to (the pod).
    pub target: Target,
    /// How its quota is enforced.
    pub policy: QuotaPolicy,
    /// The claim and pod it stands for.
    pub claim: KubernetesClaim,
    /// Its workload class (empty: the pod's name).
    pub class: String,
}

/// Why an observed session is not recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObserveError {
    /// The node is not registered.
    #[error("node {0:?} is not registered")]
    UnknownNode(String),
    /// The id is a session the controller placed: an agent cannot turn it into its own.
    #[error("session {0:?} was placed by the controller, not observed")]
    PlacedByController(String),
    /// The session runs on another node.
    #[error("session {id:?} is held on node {node:?}")]
    OnAnotherNode {
        /// The session.
        id: String,
        /// Where it is held.
        node: String,
    },
    /// An empty session id.
    #[error("an observed session needs an id")]
    EmptyId,
    /// More than the node offers to Kubernetes.
    #[error(
        "observed session {id:?} does not fit what node {node:?} offers to Kubernetes: {reason}"
    )]
    Exceeds {
        /// The session.
        id: String,
        /// The node.
        node: String,
        /// What does not fit.
        reason: String,
    },
}

/// The slots an observed allocation stands for: its shares and memory.
fn requested_of(allocation: &Allocation) -> ResourceSlot {
    ResourceSlot::new()
        .with(names::CUDA_SHARES, allocation.shares())
        .with(
            names::CUDA_MEM,
            SlotValue::from_int(allocation.memory_bytes()),
        )
}

impl Scheduler {
    /// Records that `node`'s agent holds `observed` (prepared, or prepared before and reported
    /// again): a new session, or the one known updated. Its shares are booked on the node's GPUs
    /// as the agent says (the agent is the source of truth for its node).
    ///
    /// # Errors
    /// See [`ObserveError`]; nothing changes then.
    pub fn observe(&mut self, node: &str, observed: Observed) -> Result<(), ObserveError> {
        if observed.id.is_empty() {
            return Err(ObserveError::EmptyId);
        }
        let Some(n) = self.nodes.get(node) else {
            return Err(ObserveError::UnknownNode(node.to_owned()));
        };
        let fits = n
            .allocator
            .fits_observed(&observed.id, &observed.allocation);
        let id = observed.id.clone();
        let live = match self.sessions.get(&id) {
            Some(s) if s.origin == Origin::Controller => {
                return Err(ObserveError::PlacedByController(id));
            }
            Some(s) if !s.state.is_final() => match s.node.as_deref() {
                Some(n) if n == node => true,
                other => {
                    return Err(ObserveError::OnAnotherNode {
                        id,
                        node: other.unwrap_or_default().to_owned(),
                    });
                }
            },
            // Unknown, or ended before (a claim prepared again): a new session.
            _ => false,
        };
        fits.map_err(|reason| ObserveError::Exceeds {
            id: id.clone(),
            node: node.to_owned(),
            reason,
        })?;
        let Observed {
            allocation,
            target,
            policy,
            claim,
            class,
            ..
        } = observed;
        let requested = requested_of(&allocation);
        let mut changed = !live;
        if live {
            if let Some(s) = self.sessions.get_mut(&id) {
                changed = s.allocation != allocation
                    || s.target != target
                    || s.policy != policy
                    || s.origin.claim() != Some(&claim)
                    || s.state != SessionState::Running;
                if changed {
                    s.allocation = allocation.clone();
                    s.requested = requested;
                    s.target = target;
                    s.policy = policy;
                    s.origin = Origin::Dra(claim);
                    set_state(s, SessionState::Running, "");
                }
            }
        } else {
            let new = NewSession {
                id: id.clone(),
                name: claim.pod_name.clone(),
                owner: claim.owner(),
                priority: 0,
                requested,
                pinned_node: Some(node.to_owned()),
                target,
                policy,
                // Kubernetes authorized the claim; the controller only observes it.
                scope: TargetScope::admin(false),
                class,
                placement: None,
                // Kubernetes' to end: never a candidate anyway (only the controller's are).
                no_preempt: false,
                preemption: None,
                gang: None,
                run_uid: None,
            };
            let mut session = self.new_session(new, Origin::Dra(claim));
            session.state = SessionState::Running;
            session.node = Some(node.to_owned());
            session.allocation = allocation.clone();
            self.sessions.insert(id.clone(), session);
        }
        // Booked again even when nothing changed: a registration rebuilds the node's allocator.
        let booked = self.nodes.get_mut(node).is_some_and(|n| {
            let same = n.allocator.allocation(&id) == Some(&allocation);
            n.allocator.restore(&id, allocation);
            !same
        });
        if changed {
            self.changes.sessions.insert(id);
        }
        if booked {
            self.changes.nodes.insert(node.to_owned());
            self.excess.clear();
            self.reindex(node);
        }
        Ok(())
    }

    /// `node`'s agent no longer holds observed session `id` (its claim was unprepared): it ends,
    /// and what it used teaches its class. Returns whether it ended (not when it is unknown,
    /// placed by the controller, held elsewhere or ended already).
    pub fn observed_ended(&mut self, node: &str, id: &str) -> bool {
        let ours = self.sessions.get(id).is_some_and(|s| {
            matches!(s.origin, Origin::Dra(_))
                && s.node.as_deref() == Some(node)
                && !s.state.is_final()
        });
        if ours {
            self.finish(id, SessionState::Terminated, "its claim was unprepared");
        }
        ours
    }

    /// Rebuilds `node`'s observed sessions from its agent's registration: those listed are
    /// recorded, those it no longer lists end. Returns what was refused, for the log.
    pub(super) fn reconcile_observed(
        &mut self,
        node: &str,
        observed: Vec<Observed>,
    ) -> Vec<ObserveError> {
        let listed: std::collections::BTreeSet<String> =
            observed.iter().map(|o| o.id.clone()).collect();
        let gone: Vec<String> = self
            .sessions
            .values()
            .filter(|s| {
                matches!(s.origin, Origin::Dra(_))
                    && s.node.as_deref() == Some(node)
                    && !s.state.is_final()
                    && !listed.contains(&s.id)
            })
            .map(|s| s.id.clone())
            .collect();
        for id in gone {
            self.finish(
                &id,
                SessionState::Terminated,
                "its node no longer holds its claim",
            );
        }
        observed
            .into_iter()
            .filter_map(|o| self.observe(node, o).err())
            .collect()
    }
}
