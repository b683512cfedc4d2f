//! How each of a given set of nodes answers a GPU request that someone else places: the
//! scheduler extender asks this for a pod (kube-scheduler binds, the controller only scores).
//!
//! The answer comes from the same filter (`can_fit` on a ready node) and the same
//! `interference-aware` scorer, with the same profiles, as the controller's own sessions get
//! in a pass; nothing is reserved.

use super::Scheduler;
use crate::{
    allocator::GpuRequest,
    node::NodeState,
    placement::{Candidate, ExcessCache},
    slots::SlotValue,
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
    /// How each node in `nodes` answers `gpu` for a workload of `class`, in the order given.
    #[must_use]
    pub fn fit_nodes(&self, class: &str, gpu: &GpuRequest, nodes: &[String]) -> Vec<NodeFit> {
        let scorer = self.scorer(class, ExcessCache::new());
        nodes
            .iter()
            .map(|name| {
                let Some(node) = self.nodes.get(name) else {
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

    /// The share quantum requests must be whole multiples of.
    #[must_use]
    pub fn share_quantum(&self) -> SlotValue {
        self.config.allocator.effective_quantum()
    }
}
