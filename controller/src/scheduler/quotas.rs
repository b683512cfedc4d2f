//! Team quotas: a guaranteed amount and a limit per queue, in exact slots, and the choice of
//! what to preempt when a queue within its guarantee waits for room that borrowers hold.
//!
//! Owners are grouped into queues (a team, a project). A queue's **guarantee** is what it gets
//! whenever it asks; idle guaranteed capacity may be **borrowed** by other queues up to their
//! **limit**, and comes back by preemption when its queue needs it. Only the slots a queue names
//! (in its guarantee or its limit) are governed: a request's other slots are not counted against
//! it. Everything is fixed-point ([`ResourceSlot`]): 4.5 shares guaranteed is 4.5, not 4.4999.
//!
//! The module is pure: the scheduler says what each queue holds and whether a set of victims
//! would make room (placement decides that, not quotas), and gets back a standing or a list of
//! victims. Kueue's `ClusterQueue` (nominal quota, borrowing limit, reclaim within a cohort) is
//! the model; the differences are exact fractions and one cohort per cluster.

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

/// A running session that reclaim may preempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The session.
    pub id: String,
    /// Its queue (`None`: its owner has no quota).
    pub queue: Option<String>,
    /// Its priority: lower goes first.
    pub priority: i32,
    /// Its arrival: among equal priorities the newest goes first.
    pub seq: u64,
    /// What it holds.
    pub requested: ResourceSlot,
    /// Whether it may be preempted at all (`--no-preempt` clears it).
    pub preemptible: bool,
}

/// Why a candidate was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Its queue borrowed past its guarantee, and the requester reclaims its own guarantee.
    Reclaim,
    /// Same queue, lower priority.
    Priority,
}

/// One chosen victim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Victim {
    /// The session to preempt.
    pub id: String,
    /// Why it yields.
    pub cause: Cause,
}

/// Who asks for room.
#[derive(Debug, Clone, Copy)]
pub struct Requester<'a> {
    /// Its queue.
    pub queue: Option<&'a str>,
    /// Its priority.
    pub priority: i32,
    /// What it asks for.
    pub request: &'a ResourceSlot,
}

/// The fewest sessions to preempt so that `fits` (placement, given the victims' resources
/// freed) holds for `requester`, or `None` when no allowed set makes room.
///
/// Allowed: a preemptible session of another queue while that queue is past its guarantee in a
/// slot the session holds, when the requester is within its own guarantee (reclaim); and a
/// preemptible session of the requester's own queue with a lower priority. Never a session whose
/// queue would then lend back guaranteed capacity. Order: lowest priority first, then newest.
/// Once the chosen set fits, each chosen session is dropped again if the rest still fit, so no
/// more is preempted than needed.
pub fn choose_victims(
    quotas: &QuotaConfig,
    held: &BTreeMap<Option<String>, ResourceSlot>,
    requester: Requester<'_>,
    candidates: &[Candidate],
    mut fits: impl FnMut(&[&Candidate]) -> bool,
) -> Option<Vec<Victim>> {
    let own_held = held.get(&requester.queue.map(str::to_owned)).cloned();
    let reclaims = quotas.standing(
        requester.queue,
        &own_held.unwrap_or_default(),
        requester.request,
    ) == Standing::WithinGuarantee;

    let mut order: Vec<&Candidate> = candidates.iter().filter(|c| c.preemptible).collect();
    order.sort_by(|a, b| a.priority.cmp(&b.priority).then(b.seq.cmp(&a.seq)));

    let mut held = held.clone();
    let mut chosen: Vec<(&Candidate, Cause)> = Vec::new();
    for candidate in order {
        let Some(cause) = cause(quotas, &held, requester, reclaims, candidate) else {
            continue;
        };
        let queue_held = held.entry(candidate.queue.clone()).or_default();
        *queue_held = queue_held.saturating_sub(&candidate.requested);
        chosen.push((candidate, cause));
        if fits(&chosen.iter().map(|(c, _)| *c).collect::<Vec<_>>()) {
            return Some(minimal(chosen, &mut fits));
        }
    }
    None
}

/// Why `candidate` may yield to `requester` now, if it may.
fn cause(
    quotas: &QuotaConfig,
    held: &BTreeMap<Option<String>, ResourceSlot>,
    requester: Requester<'_>,
    reclaims: bool,
    candidate: &Candidate,
) -> Option<Cause> {
    let same_queue = candidate.queue.as_deref() == requester.queue;
    if same_queue {
        return (candidate.priority < requester.priority).then_some(Cause::Priority);
    }
    let quota = quotas.quota(candidate.queue.as_deref());
    let queue_held = held.get(&candidate.queue).cloned().unwrap_or_default();
    (reclaims && quota.lends_back(&queue_held, &candidate.requested)).then_some(Cause::Reclaim)
}

/// Drops, newest choice first, each chosen session the others fit without.
fn minimal(
    mut chosen: Vec<(&Candidate, Cause)>,
    fits: &mut impl FnMut(&[&Candidate]) -> bool,
) -> Vec<Victim> {
    let mut i = chosen.len();
    while i > 0 {
        i -= 1;
        let without: Vec<&Candidate> = chosen
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, (c, _))| *c)
            .collect();
        if fits(&without) {
            chosen.remove(i);
        }
    }
    chosen
        .into_iter()
        .map(|(c, cause)| Victim {
            id: c.id.clone(),
            cause,
        })
        .collect()
}

#[cfg(test)]
mod tests;
