//! Team quotas: a guaranteed amount and a limit per queue, in exact slots, and the choice of
//! what to preempt when a queue within its guarantee waits for room that borrowers hold. The
//! configured quotas ([`QuotaConfig`]) are [`crate::quota`]'s, which the store also keeps.
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

pub use crate::quota::{QueueQuota, QuotaConfig, Standing};
use crate::slots::ResourceSlot;

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
