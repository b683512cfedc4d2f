//! The `interference-aware` scorer: each candidate placement of a session as the four terms
//! of [`Terms`], against the cluster as it is.

use std::{
    cell::RefCell,
    collections::{BTreeMap, BTreeSet, HashMap},
};

use super::{Candidate, EXPLAINED, Explanation, Placement, ScoringConfig, Terms, Weights};
use crate::{
    allocator::{Allocation, DeviceState, GpuRequest, Strategy},
    colocation,
    node::Node,
    profile::{POINTS, ProfileBook},
    session::Session,
    slots::SlotValue,
};

/// Predicted `Σ(slowdown − 1)` of a device's tenants, by (node, device index), with the
/// tenants it was predicted for.
pub(crate) type ExcessCache = HashMap<(String, u32), (BTreeSet<String>, f64)>;

/// Scores candidate placements of one session against the cluster as it is.
pub(crate) struct Scorer<'a> {
    scoring: &'a ScoringConfig,
    profiles: &'a ProfileBook,
    sessions: &'a BTreeMap<String, Session>,
    nodes: &'a BTreeMap<String, Node>,
    /// The session's utilization distribution (its class's profile, or the prior).
    candidate: [f64; POINTS],
    excess: RefCell<ExcessCache>,
}

impl<'a> Scorer<'a> {
    /// A scorer of `class`'s placements; `excess` is the cache of earlier predictions.
    pub(crate) fn new(
        scoring: &'a ScoringConfig,
        profiles: &'a ProfileBook,
        sessions: &'a BTreeMap<String, Session>,
        nodes: &'a BTreeMap<String, Node>,
        class: &str,
        excess: ExcessCache,
    ) -> Self {
        Self {
            scoring,
            profiles,
            sessions,
            nodes,
            candidate: profiles.deciles(class),
            excess: RefCell::new(excess),
        }
    }

    /// The cache, for the next scorer.
    pub(crate) fn into_cache(self) -> ExcessCache {
        self.excess.into_inner()
    }

    /// The interference among `device`'s tenants as they are (`tenants`: their profiles).
    fn excess_now(&self, node_id: &str, device: &DeviceState, tenants: &[[f64; POINTS]]) -> f64 {
        let key = (node_id.to_owned(), device.spec.index);
        if let Some((who, excess)) = self.excess.borrow().get(&key)
            && *who == device.sessions
        {
            return *excess;
        }
        let refs: Vec<&[f64; POINTS]> = tenants.iter().collect();
        let excess = colocation::predict(&refs).total_excess();
        self.excess
            .borrow_mut()
            .insert(key, (device.sessions.clone(), excess));
        excess
    }

    fn weights(&self) -> &Weights {
        &self.scoring.weights
    }

    /// The utilization distributions of a device's tenants.
    fn tenants(&self, device: &DeviceState) -> Vec<[f64; POINTS]> {
        device
            .sessions
            .iter()
            .map(|sid| {
                let class = self
                    .sessions
                    .get(sid)
                    .map_or(sid.as_str(), |s| s.class.as_str());
                self.profiles.deciles(class)
            })
            .collect()
    }

    /// Scores `allocation` on `node`.
    fn score(&self, node_id: &str, node: &Node, allocation: &Allocation) -> Candidate {
        let cap = self.scoring.packing_cap;
        let mut terms = Terms::default();
        let mut summed = 0.0;
        let mut over_cap = false;
        let mut numa = BTreeSet::new();
        let devices = node.allocator.devices();
        for part in &allocation.parts {
            let Some(device) = devices.iter().find(|d| d.spec.index == part.index) else {
                continue;
            };
            if device.spec.numa_node >= 0 {
                numa.insert(device.spec.numa_node);
            }
            let tenants = self.tenants(device);
            let before = self.excess_now(node_id, device, &tenants);
            let mut with: Vec<&[f64; POINTS]> = tenants.iter().collect();
            with.push(&self.candidate);
            let after = colocation::predict(&with);
            terms.interference += after.total_excess() - before;
            let unusable = |allocated_after: bool, free: SlotValue| {
                if allocated_after && !part.exclusive {
                    free.as_f64()
                } else {
                    0.0
                }
            };
            let free = device.free();
            let before_frag = unusable(!device.allocated.is_zero(), free);
            let after_frag = unusable(
                !device.allocated.saturating_add(part.shares).is_zero(),
                free.saturating_sub(part.shares),
            );
            terms.fragmentation += after_frag - before_frag;
            terms.packing += after.summed.min(1.0);
            summed += after.summed;
            over_cap |= !tenants.is_empty() && after.summed > cap;
        }
        let parts = allocation.parts.len().max(1) as f64;
        terms.packing /= parts;
        terms.topology = numa.len().saturating_sub(1) as f64;
        Candidate {
            node: node_id.to_owned(),
            devices: allocation.parts.iter().map(|p| p.index).collect(),
            total: terms.total(self.weights()),
            terms,
            predicted_utilization: summed / parts,
            over_cap,
            chosen: false,
        }
    }

    /// The explanation of a placement another mode chose.
    pub(crate) fn explain_one(
        &self,
        mode: Placement,
        node_id: &str,
        node: &Node,
        allocation: &Allocation,
    ) -> Explanation {
        let mut candidate = self.score(node_id, node, allocation);
        candidate.chosen = true;
        Explanation {
            mode,
            weights: *self.weights(),
            candidates: vec![candidate],
            considered: 1,
        }
    }

    /// The best placement over `nodes` (ids of nodes that fit): the lowest total among
    /// candidates under the packing cap, else among all; ties go to the first scored.
    pub(crate) fn choose<'n>(
        &self,
        nodes: impl Iterator<Item = &'n String>,
        gpu: &GpuRequest,
    ) -> Option<(String, Allocation, Explanation)> {
        let mut scored: Vec<(Candidate, Allocation)> = Vec::new();
        for nid in nodes {
            let Some(node) = self.nodes.get(nid) else {
                continue;
            };
            let mut plans = node.allocator.single_device_plans(gpu);
            if plans.is_empty() {
                plans.extend(node.allocator.plan(gpu, Strategy::Binpack).ok());
            }
            // Idle devices of a node score alike: one of them per NUMA node is enough.
            let mut idle_seen = BTreeSet::new();
            for plan in plans {
                if let [part] = plan.parts.as_slice()
                    && let Some(d) = node
                        .allocator
                        .devices()
                        .iter()
                        .find(|d| d.spec.index == part.index)
                    && d.is_idle()
                    && !idle_seen.insert(d.spec.numa_node)
                {
                    continue;
                }
                scored.push((self.score(nid, node, &plan), plan));
            }
        }
        let considered = u32::try_from(scored.len()).unwrap_or(u32::MAX);
        // Stable: equal keys keep the order scored.
        scored.sort_by(|(a, _), (b, _)| {
            a.over_cap
                .cmp(&b.over_cap)
                .then(a.total.total_cmp(&b.total))
        });
        let mut iter = scored.into_iter();
        let (mut best, plan) = iter.next()?;
        best.chosen = true;
        let node = best.node.clone();
        let mut candidates = vec![best];
        candidates.extend(iter.take(EXPLAINED - 1).map(|(c, _)| c));
        Some((
            node,
            plan,
            Explanation {
                mode: Placement::InterferenceAware,
                weights: *self.weights(),
                candidates,
                considered,
            },
        ))
    }
}
