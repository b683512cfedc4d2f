//! The queue: the order pending sessions are tried in (priority and arrival, or dominant-resource
//! fairness, sessions within their team's guarantee first) and the per-owner slot limit.

use std::collections::BTreeMap;

use super::{QueuePolicy, Scheduler, quotas::Standing};
use crate::{
    node::NodeState,
    session::{Session, SessionState},
    slots::{ResourceSlot, SlotLimits},
};

impl Scheduler {
    /// Puts `session` (just made Pending) in the queue.
    pub(super) fn queue(&mut self, session: &Session) {
        self.pending.insert((
            std::cmp::Reverse(session.priority),
            session.seq,
            session.id.clone(),
        ));
    }

    /// Pending sessions in the order the policy tries them, those within their team queue's
    /// guarantee first when queues are configured (`held`: what each queue holds, from
    /// [`Self::queue_holdings`]); drops queue entries of sessions that left Pending (placed,
    /// ended) since the last pass.
    pub(super) fn queue_order(
        &mut self,
        held: &BTreeMap<Option<String>, ResourceSlot>,
    ) -> Vec<String> {
        let sessions = &self.sessions;
        self.pending.retain(|(_, _, id)| {
            sessions
                .get(id)
                .is_some_and(|s| s.state == SessionState::Pending)
        });
        // Already in FIFO order: priority, then arrival.
        let mut pending: Vec<&Session> = self
            .pending
            .iter()
            .filter_map(|(_, _, id)| self.sessions.get(id))
            .collect();
        if self.config.queue == QueuePolicy::Drf {
            let shares = self.dominant_shares();
            pending.sort_by(|a, b| {
                let sa = shares.get(&a.owner).copied().unwrap_or(0.0);
                let sb = shares.get(&b.owner).copied().unwrap_or(0.0);
                b.priority
                    .cmp(&a.priority)
                    .then(sa.total_cmp(&sb))
                    .then(a.seq.cmp(&b.seq))
            });
        }
        if !self.config.quotas.queues.is_empty() {
            // Sessions within their queue's guarantee go before any that would borrow; the
            // policy's order holds within each group (a stable sort).
            let quotas = &self.config.quotas;
            let nothing = ResourceSlot::new();
            // Each session's standing once, not once per comparison.
            pending.sort_by_cached_key(|s| {
                let queue = quotas.queue_of(&s.owner);
                let held = held.get(&queue.map(str::to_owned)).unwrap_or(&nothing);
                quotas.standing(queue, held, &s.requested) != Standing::WithinGuarantee
            });
        }
        pending.into_iter().map(|s| s.id.clone()).collect()
    }

    /// What the sessions holding resources hold, by queue (`None`: owners without a queue).
    pub(super) fn queue_holdings(&self) -> BTreeMap<Option<String>, ResourceSlot> {
        let mut held: BTreeMap<Option<String>, ResourceSlot> = BTreeMap::new();
        for s in self.sessions.values().filter(|s| s.state.holds_resources()) {
            let queue = self.config.quotas.queue_of(&s.owner).map(str::to_owned);
            let entry = held.entry(queue).or_default();
            *entry = entry
                .checked_add(&s.requested)
                .unwrap_or_else(|| entry.clone());
        }
        held
    }

    /// Each owner's dominant share: the largest fraction of any slot's cluster capacity it holds.
    fn dominant_shares(&self) -> BTreeMap<String, f64> {
        let total = self
            .nodes
            .values()
            .filter(|n| n.state == NodeState::Ready)
            .fold(ResourceSlot::new(), |acc, n| {
                acc.checked_add(&n.capacity()).unwrap_or(acc)
            });
        let mut held: BTreeMap<String, ResourceSlot> = BTreeMap::new();
        for s in self.sessions.values().filter(|s| s.state.holds_resources()) {
            let entry = held.entry(s.owner.clone()).or_default();
            *entry = entry
                .checked_add(&s.requested)
                .unwrap_or_else(|| entry.clone());
        }
        held.into_iter()
            .map(|(owner, slots)| {
                // Ratios only order owners; a float is fine here, the slots stay exact.
                let share = slots
                    .iter()
                    .map(|(k, v)| {
                        let cap = total.get(k.as_str());
                        if cap.is_zero() {
                            0.0
                        } else {
                            v.micros() as f64 / cap.micros() as f64
                        }
                    })
                    .fold(0.0, f64::max);
                (owner, share)
            })
            .collect()
    }

    pub(super) fn within_slot_limit(
        &self,
        owner: &str,
        requested: &ResourceSlot,
        max: Option<&SlotLimits>,
    ) -> bool {
        let Some(max) = max else { return true };
        let held = self
            .sessions
            .values()
            .filter(|s| s.owner == owner && s.state.holds_resources())
            .fold(ResourceSlot::new(), |acc, s| {
                acc.checked_add(&s.requested).unwrap_or(acc)
            });
        held.checked_add(requested)
            .is_some_and(|total| max.admits(&total))
    }
}
