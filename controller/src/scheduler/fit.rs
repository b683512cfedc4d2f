//! How each of a given set of nodes answers a GPU request that someone else places: the
//! scheduler extender asks this for a pod (kube-scheduler binds, the controller only scores).
//!
//! The answer comes from the same filter (`can_fit` on a ready node) and the same
//! `interference-aware` scorer, with the same profiles, as the controller's own sessions get
//! in a pass; nothing is reserved.

use std::collections::BTreeMap;

use super::{Command, Scheduler};
use crate::{
    allocator::GpuRequest,
    node::{Node, NodeState},
    placement::{Candidate, ExcessCache, Scorer},
    session::Session,
    slots::{ResourceSlot, SlotValue},
};

/// How one node answers a request.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeFit {
    /// No agent reports a node of this name.
    Unknown,
    /// Its agent is not ready (lost or draining).
    NotReady(NodeState),
    /// Ready, but its GPUs can't hold the request now.
    NoRoom,
    /// It holds the request; the best placement there, scored.
    Fits(Candidate),
}

impl Scheduler {
    /// How each node in `nodes` answers `gpu` for a workload of `class`, in the order given. A
    /// pod goes to GPUs its node offers to Kubernetes, so a node that reports some is judged on
    /// those (with the claims prepared on them) and never on the controller's, and, as DRA gives
    /// a claim's request one device, only a placement on one device counts there; a node that
    /// reports none (an agent before that report, or no DRA driver) on its GPUs, as before.
    #[must_use]
    pub fn fit_nodes(&self, class: &str, gpu: &GpuRequest, nodes: &[String]) -> Vec<NodeFit> {
        let mut one_device: BTreeMap<String, bool> = BTreeMap::new();
        let judged: BTreeMap<String, Node> = nodes
            .iter()
            .filter_map(|name| {
                let node = self.nodes.get(name)?;
                let mut judged = node.clone();
                let view = node.allocator.kubernetes_view();
                one_device.insert(name.clone(), view.is_some());
                if let Some(view) = view {
                    judged.allocator = view;
                }
                Some((name.clone(), judged))
            })
            .collect();
        let scorer = Scorer::new(
            &self.config.scoring,
            &self.profiles,
            &self.sessions,
            &judged,
            class,
            ExcessCache::new(),
        );
        nodes
            .iter()
            .map(|name| {
                let Some(node) = judged.get(name) else {
                    return NodeFit::Unknown;
                };
                if node.state != NodeState::Ready {
                    return NodeFit::NotReady(node.state);
                }
                if !node.allocator.can_fit(gpu) {
                    return NodeFit::NoRoom;
                }
                scorer.choose(std::iter::once(name), gpu).map_or(
                    NodeFit::NoRoom,
                    |(_, _, explanation)| {
                        explanation
                            .candidates
                            .into_iter()
                            .next()
                            .filter(|c| c.devices.len() <= 1 || one_device.get(name) != Some(&true))
                            .map_or(NodeFit::NoRoom, NodeFit::Fits)
                    },
                )
            })
            .collect()
    }

    /// The most memory any one known device has, `None` while no agent reported a GPU.
    #[must_use]
    pub fn largest_device_memory(&self) -> Option<u64> {
        self.nodes
            .values()
            .flat_map(|n| n.report.devices.iter().map(|d| d.memory_bytes))
            .max()
    }

    /// The least and the most memory one GPU offered to Kubernetes has, else one GPU of any
    /// kind (agents from before `kubernetes_devices`), `None` while no agent reported a GPU:
    /// what the admission webhook sizes an ask of compute only (or memory only) by, and the
    /// most memory a pod may ask.
    #[must_use]
    pub fn kubernetes_device_memory(&self) -> Option<(u64, u64)> {
        let range = |kubernetes: bool| {
            self.nodes
                .values()
                .flat_map(|n| {
                    if kubernetes {
                        n.report.kubernetes_devices.iter()
                    } else {
                        n.report.devices.iter()
                    }
                })
                .map(|d| d.memory_bytes)
                .filter(|m| *m > 0)
                .fold(None, |acc: Option<(u64, u64)>, m| {
                    Some(acc.map_or((m, m), |(lo, hi)| (lo.min(m), hi.max(m))))
                })
        };
        range(true).or_else(|| range(false))
    }

    /// The share quantum requests must be whole multiples of.
    #[must_use]
    pub fn share_quantum(&self) -> SlotValue {
        self.config.allocator.effective_quantum()
    }
}

/// What the predicates and placement made of one session.
pub(super) enum Verdict {
    /// Placed: the command for its agent.
    Placed(Command),
    /// A team-queue or per-owner predicate keeps it waiting.
    Refused(String),
    /// No node fits it now (reclaim may make room).
    NoRoom(String),
}

/// What `members` ask for together: a gang asks, and yields, as one session.
pub(super) fn summed(members: &[&Session]) -> ResourceSlot {
    members.iter().fold(ResourceSlot::new(), |acc, m| {
        acc.checked_add(&m.requested).unwrap_or(acc)
    })
}
