use std::collections::BTreeMap;

use super::*;
use crate::slots::SlotName;

fn slots(text: &str) -> ResourceSlot {
    let tokens: Vec<&str> = text.split(',').filter(|t| !t.is_empty()).collect();
    ResourceSlot::parse_any(&tokens).expect("test slots parse")
}

fn quota(guaranteed: &str, limit: Option<&str>) -> QueueQuota {
    QueueQuota {
        guaranteed: slots(guaranteed),
        limit: limit.map(slots),
    }
}

fn config(queues: &[(&str, QueueQuota)]) -> QuotaConfig {
    QuotaConfig {
        queues: queues
            .iter()
            .map(|(n, q)| ((*n).to_owned(), q.clone()))
            .collect(),
        members: BTreeMap::new(),
    }
}

fn session(id: &str, queue: Option<&str>, priority: i32, seq: u64, shares: &str) -> Candidate {
    Candidate {
        id: id.to_owned(),
        queue: queue.map(str::to_owned),
        priority,
        seq,
        requested: slots(&format!("cuda.shares={shares}")),
        preemptible: true,
    }
}

/// What each queue holds, summed from the candidates (as the scheduler would).
fn held_by(candidates: &[Candidate]) -> BTreeMap<Option<String>, ResourceSlot> {
    let mut held: BTreeMap<Option<String>, ResourceSlot> = BTreeMap::new();
    for c in candidates {
        let entry = held.entry(c.queue.clone()).or_default();
        *entry = entry.checked_add(&c.requested).expect("no overflow");
    }
    held
}

/// Room for `need` shares once the victims' shares are freed, on a full cluster.
fn frees(need: &str) -> impl FnMut(&[&Candidate]) -> bool {
    let need = slots(&format!("cuda.shares={need}"));
    move |victims: &[&Candidate]| {
        let freed = victims.iter().fold(ResourceSlot::new(), |acc, c| {
            acc.checked_add(&c.requested).expect("no overflow")
        });
        need.fits_in(&freed)
    }
}

fn ids(victims: &[Victim]) -> Vec<&str> {
    victims.iter().map(|v| v.id.as_str()).collect()
}

/// [`choose_victims`] for a session of queue `a` at `priority` asking for `shares`, among
/// `running`, on a cluster that is full: room is what the victims free.
fn victims_for(
    quotas: &QuotaConfig,
    priority: i32,
    shares: &str,
    running: &[Candidate],
) -> Option<Vec<Victim>> {
    let request = slots(&format!("cuda.shares={shares}"));
    let requester = Requester {
        queue: Some("a"),
        priority,
        request: &request,
    };
    choose_victims(quotas, &held_by(running), requester, running, frees(shares))
}

#[test]
fn standing_is_exact_in_fractions() {
    let q = quota("cuda.shares=0.3", Some("cuda.shares=0.5"));
    // 0.1 + 0.2 is 0.3 exactly: within the guarantee, not a hair past it.
    assert_eq!(
        q.standing(&slots("cuda.shares=0.1"), &slots("cuda.shares=0.2")),
        Standing::WithinGuarantee
    );
    assert_eq!(
        q.standing(&slots("cuda.shares=0.1"), &slots("cuda.shares=0.3")),
        Standing::Borrowing
    );
    assert_eq!(
        q.standing(&slots("cuda.shares=0.3"), &slots("cuda.shares=0.3")),
        Standing::OverLimit {
            slot: SlotName::new("cuda.shares").expect("a name")
        }
    );
}

#[test]
fn slots_a_queue_does_not_name_are_not_counted() {
    let q = quota("cuda.shares=1", None);
    assert_eq!(
        q.standing(
            &ResourceSlot::new(),
            &slots("cuda.shares=1,cpu=64,mem=200g")
        ),
        Standing::WithinGuarantee
    );
    // No limit: past the guarantee is borrowing, however far.
    assert_eq!(
        q.standing(&slots("cuda.shares=1"), &slots("cuda.shares=100")),
        Standing::Borrowing
    );
    // A limit that names one slot caps only that slot.
    let capped = quota("cuda.shares=1", Some("cuda.mem=10g"));
    assert_eq!(
        capped.standing(&ResourceSlot::new(), &slots("cuda.shares=5,cuda.mem=10g")),
        Standing::Borrowing
    );
    assert!(matches!(
        capped.standing(&slots("cuda.mem=1"), &slots("cuda.mem=10g")),
        Standing::OverLimit { .. }
    ));
}

#[test]
fn owners_count_against_their_queue_or_the_queue_of_their_name() {
    let mut c = config(&[("team-a", quota("cuda.shares=4", None))]);
    c.members.insert("alice".into(), "team-a".into());
    assert_eq!(c.queue_of("alice"), Some("team-a"));
    assert_eq!(c.queue_of("team-a"), Some("team-a"));
    assert_eq!(c.queue_of("bob"), None);
    assert_eq!(c.quota(None), QueueQuota::default());
}

#[test]
fn a_queue_within_its_guarantee_reclaims_from_borrowers_lowest_priority_then_newest() {
    let quotas = config(&[
        ("a", quota("cuda.shares=4", None)),
        ("b", quota("cuda.shares=2", None)),
    ]);
    // b holds 6 shares, 4 of them borrowed.
    let running = vec![
        session("b-high", Some("b"), 5, 1, "1"),
        session("b-old", Some("b"), 0, 2, "1"),
        session("b-new", Some("b"), 0, 3, "1"),
        session("b-newest", Some("b"), 0, 4, "1"),
        session("b-mid", Some("b"), 1, 5, "2"),
    ];
    let victims = victims_for(&quotas, 0, "2", &running).expect("room can be made");
    assert_eq!(ids(&victims), ["b-newest", "b-new"]);
    assert!(victims.iter().all(|v| v.cause == Cause::Reclaim));
}

#[test]
fn reclaim_stops_at_the_lenders_guarantee() {
    let quotas = config(&[
        ("a", quota("cuda.shares=4", None)),
        ("b", quota("cuda.shares=2", None)),
    ]);
    // b borrows 2 of its 4 shares: only those two come back, so 3 can't be freed.
    let running: Vec<Candidate> = (0..4)
        .map(|i| session(&format!("b{i}"), Some("b"), 0, i, "1"))
        .collect();
    assert_eq!(victims_for(&quotas, 0, "3", &running), None);
    let victims = victims_for(&quotas, 0, "2", &running).expect("the borrowed two");
    assert_eq!(ids(&victims), ["b3", "b2"]);
}

#[test]
fn a_borrowing_requester_preempts_only_lower_priority_in_its_own_queue() {
    let quotas = config(&[
        ("a", quota("cuda.shares=1", None)),
        ("b", quota("cuda.shares=0", None)),
    ]);
    let running = vec![
        session("a-low", Some("a"), 0, 1, "1"),
        session("a-same", Some("a"), 3, 2, "1"),
        session("b-borrower", Some("b"), 0, 3, "1"),
        session("nobody", None, 0, 4, "1"),
    ];
    // a already holds 2 > its guarantee of 1: this request borrows, so it reclaims nothing.
    let victims =
        victims_for(&quotas, 3, "1", &running).expect("the lower-priority one of its own");
    assert_eq!(ids(&victims), ["a-low"]);
    assert_eq!(victims[0].cause, Cause::Priority);
}

#[test]
fn sessions_without_a_quota_and_borrowers_yield_but_opted_out_ones_never() {
    let quotas = config(&[("a", quota("cuda.shares=2", None))]);
    let mut kept = session("kept", None, -10, 9, "2");
    kept.preemptible = false;
    let running = vec![kept, session("free-rider", None, 0, 1, "2")];
    let victims = victims_for(&quotas, 0, "2", &running).expect("the free rider");
    assert_eq!(ids(&victims), ["free-rider"]);
}

#[test]
fn no_more_is_preempted_than_needed() {
    let quotas = config(&[("a", quota("cuda.shares=8", None))]);
    // The small one comes first in the order (lower priority), but the big one alone makes room:
    // once both are chosen, the small one is given back.
    let running = vec![
        session("small", None, 0, 1, "1"),
        session("big", None, 1, 2, "4"),
    ];
    let victims = victims_for(&quotas, 0, "4", &running).expect("room");
    assert_eq!(ids(&victims), ["big"]);
}

#[test]
fn owners_without_a_queue_always_borrow() {
    let c = config(&[("a", quota("cuda.shares=4", None))]);
    let request = slots("cuda.shares=1");
    assert_eq!(
        c.standing(None, &ResourceSlot::new(), &request),
        Standing::Borrowing
    );
    assert_eq!(
        c.standing(Some("a"), &ResourceSlot::new(), &request),
        Standing::WithinGuarantee
    );
}
