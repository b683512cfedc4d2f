//! Team quotas as configured: a guaranteed amount and a limit per queue, in exact slots, and
//! which queue each owner counts against. The store keeps them and the scheduler applies them
//! (`scheduler::quotas` chooses what to preempt); both need the nouns, so they live here, below
//! both.
//!
//! A queue's **guarantee** is what it gets whenever it asks; idle guaranteed capacity may be
//! **borrowed** by other queues up to their **limit**. Only the slots a queue names are governed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::slots::{ResourceSlot, SlotName};

/// One queue's quota.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueQuota {
    /// What the queue gets whenever it asks, per slot; others may borrow it while it is idle.
    pub guaranteed: ResourceSlot,
    /// The most the queue may hold, borrowing included; a slot it doesn't name is not capped.
    /// `None`: no cap at all beyond the cluster.
    pub limit: Option<ResourceSlot>,
}

/// Where a request stands against its queue's quota, given what the queue already holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// Every governed slot stays within the guarantee: served before anyone borrowing, and may
    /// reclaim what borrowers hold.
    WithinGuarantee,
    /// Past the guarantee in some slot but within the limit: runs on idle capacity and may be
    /// preempted when the lender needs it back.
    Borrowing,
    /// Past the limit in `slot`: waits until the queue holds less.
    OverLimit {
        /// The first slot past the limit.
        slot: SlotName,
    },
}

impl QueueQuota {
    /// Whether the quota names `slot` (in its guarantee or its limit).
    #[must_use]
    pub fn governs(&self, slot: &str) -> bool {
        !self.guaranteed.get(slot).is_zero()
            || self.limit.as_ref().is_some_and(|l| !l.get(slot).is_zero())
    }

    /// Where `request` stands when the queue already holds `held`.
    #[must_use]
    pub fn standing(&self, held: &ResourceSlot, request: &ResourceSlot) -> Standing {
        let mut within = true;
        for (slot, want) in request.iter() {
            if !self.governs(slot.as_str()) {
                continue;
            }
            // Saturating: a sum past 10^32 units is past any limit anyway.
            let after = held.get(slot.as_str()).saturating_add(want);
            if let Some(limit) = &self.limit {
                let cap = limit.get(slot.as_str());
                if !cap.is_zero() && after > cap {
                    return Standing::OverLimit { slot: slot.clone() };
                }
            }
            within &= after <= self.guaranteed.get(slot.as_str());
        }
        if within {
            Standing::WithinGuarantee
        } else {
            Standing::Borrowing
        }
    }

    /// Whether a queue holding `held` is past its guarantee in a slot that `session` holds, so
    /// that preempting `session` gives back borrowed capacity, not guaranteed.
    #[must_use]
    pub fn lends_back(&self, held: &ResourceSlot, session: &ResourceSlot) -> bool {
        session
            .iter()
            .any(|(slot, _)| held.get(slot.as_str()) > self.guaranteed.get(slot.as_str()))
    }
}

/// The quotas of every queue and which queue each owner's sessions count against.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotaConfig {
    /// Queues by name.
    pub queues: BTreeMap<String, QueueQuota>,
    /// Owner → queue. An owner not listed uses the queue of its own name if there is one;
    /// otherwise it has no quota: it only borrows, and is preempted by any queue that reclaims.
    pub members: BTreeMap<String, String>,
}

impl QuotaConfig {
    /// The queue `owner`'s sessions count against, if any.
    #[must_use]
    pub fn queue_of<'a>(&'a self, owner: &'a str) -> Option<&'a str> {
        match self.members.get(owner) {
            Some(queue) => Some(queue.as_str()),
            None => self.queues.contains_key(owner).then_some(owner),
        }
    }

    /// The quota of `queue`; a queue that isn't configured has none (guarantee zero, no limit).
    #[must_use]
    pub fn quota(&self, queue: Option<&str>) -> QueueQuota {
        queue
            .and_then(|q| self.queues.get(q))
            .cloned()
            .unwrap_or_default()
    }

    /// Where `request` stands for a session of `queue` while the queue holds `held`. Sessions
    /// of owners without a queue always borrow: nothing is guaranteed to them.
    #[must_use]
    pub fn standing(
        &self,
        queue: Option<&str>,
        held: &ResourceSlot,
        request: &ResourceSlot,
    ) -> Standing {
        match queue.and_then(|q| self.queues.get(q)) {
            Some(quota) => quota.standing(held, request),
            None => Standing::Borrowing,
        }
    }
}
