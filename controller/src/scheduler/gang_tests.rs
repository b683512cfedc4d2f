//! Gangs through the pass (issue 24 §3): all members placed in one pass or none, members wait
//! until all exist, a gang that does not fit holds the queue no longer than `skip_after`, it
//! counts against its team queue as the sum of its members, survives a restart, and is
//! preempted as a unit.

use super::{
    quotas::{QueueQuota, QuotaConfig},
    tests::report,
    *,
};
use crate::session::{Action, EnforcementEvent, GangError};

fn slots(tokens: &[&str]) -> ResourceSlot {
    ResourceSlot::parse_any(tokens).unwrap()
}

fn gang(name: &str, size: u32) -> Gang {
    Gang {
        name: name.into(),
        size,
    }
}

/// Creates session `id` of `owner` asking for `tokens`, a member of `g`.
fn member(
    s: &mut Scheduler,
    id: &str,
    owner: &str,
    tokens: &[&str],
    g: Option<Gang>,
) -> Result<Session, RequestError> {
    s.create(NewSession {
        id: id.into(),
        owner: owner.into(),
        requested: slots(tokens),
        gang: g,
        ..NewSession::default()
    })
}

/// Creates the members `ids` of `owner`'s gang `name` of `size`, one whole GPU each.
fn members(s: &mut Scheduler, owner: &str, name: &str, size: u32, ids: &[&str]) {
    for id in ids {
        member(s, id, owner, &["cuda.shares=1"], Some(gang(name, size))).unwrap();
    }
}

fn state(s: &Scheduler, id: &str) -> SessionState {
    s.sessions()[id].state
}

fn reason<'a>(s: &'a Scheduler, id: &str) -> &'a str {
    &s.sessions()[id].reason
}

/// Runs a pass and acks what it placed; returns the sessions it placed.
fn pass(s: &mut Scheduler) -> Vec<String> {
    let mut placed = Vec::new();
    for c in s.pass() {
        if let Command::Allocate { node, session, .. } = c {
            s.ack(&node, &session);
            placed.push(session);
        }
    }
    placed.sort();
    placed
}

/// GPU shares allocated on `node`, over all its devices.
/// The (node, session) of each `Allocate` among `commands`.
fn allocations(commands: Vec<Command>) -> Vec<(String, String)> {
    commands
        .into_iter()
        .filter_map(|c| match c {
            Command::Allocate { node, session, .. } => Some((node, session)),
            _ => None,
        })
        .collect()
}

/// The (node, session) of each `Release` among `commands`, sorted.
fn released(commands: Vec<Command>) -> Vec<(String, String)> {
    let mut told: Vec<(String, String)> = commands
        .into_iter()
        .filter_map(|c| match c {
            Command::Release { node, session } => Some((node, session)),
            _ => None,
        })
        .collect();
    told.sort();
    told
}

/// `u`'s gang `train` of three one-GPU members (`g1`..`g3`) placed over two nodes of two GPUs,
/// not yet acknowledged; where each went.
fn gang_of_three_placed(config: SchedulerConfig) -> (Scheduler, Vec<(String, String)>) {
    let mut s = Scheduler::new(config);
    s.register(report("n1", 2, &[]), &[]).unwrap();
    s.register(report("n2", 2, &[]), &[]).unwrap();
    members(&mut s, "u", "train", 3, &["g1", "g2", "g3"]);
    let placed = allocations(s.pass());
    assert_eq!(placed.len(), 3, "{placed:?}");
    (s, placed)
}

/// The node `placed` put session `id` on.
fn node_of(placed: &[(String, String)], id: &str) -> String {
    let Some((node, _)) = placed.iter().find(|(_, s)| s == id) else {
        panic!("{id} was not placed: {placed:?}");
    };
    node.clone()
}

fn allocated(s: &Scheduler, node: &str) -> String {
    let total = s.nodes()[node]
        .allocator
        .devices()
        .iter()
        .fold(ResourceSlot::new(), |acc, d| {
            assert!(d.allocated <= d.capacity, "over-committed: {d:?}");
            acc.checked_add(&slots(&[&format!("cuda.shares={}", d.allocated)]))
                .unwrap()
        });
    total.get("cuda.shares").to_string()
}

#[test]
fn a_gang_of_four_on_room_for_three_places_none() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report("n1", 3, &[]), &[]).unwrap();
    members(&mut s, "u", "train", 4, &["g1", "g2", "g3", "g4"]);
    for _ in 0..5 {
        assert!(pass(&mut s).is_empty());
    }
    for id in ["g1", "g2", "g3", "g4"] {
        assert_eq!(state(&s, id), SessionState::Pending);
        assert!(s.sessions()[id].node.is_none());
        assert!(
            reason(&s, id).contains("does not fit at once"),
            "{}",
            reason(&s, id)
        );
    }
    // Three of them would have fit: nothing is held.
    assert_eq!(allocated(&s, "n1"), "0");
}

#[test]
fn a_gang_of_four_with_room_is_placed_in_one_pass() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report("n1", 2, &[]), &[]).unwrap();
    s.register(report("n2", 2, &[]), &[]).unwrap();
    members(&mut s, "u", "train", 4, &["g1", "g2", "g3", "g4"]);
    assert_eq!(pass(&mut s), ["g1", "g2", "g3", "g4"]);
    for id in ["g1", "g2", "g3", "g4"] {
        assert_eq!(state(&s, id), SessionState::Running);
    }
    assert_eq!(allocated(&s, "n1"), "2");
    assert_eq!(allocated(&s, "n2"), "2");
}

#[test]
fn members_wait_until_all_exist_without_holding_up_the_queue() {
    let mut s = Scheduler::new(SchedulerConfig {
        skip_after: 100,
        ..SchedulerConfig::default()
    });
    s.register(report("n1", 4, &[]), &[]).unwrap();
    members(&mut s, "u", "train", 4, &["g1", "g2", "g3"]);
    member(&mut s, "solo", "u", &["cuda.shares=0.5"], None).unwrap();
    // An incomplete gang is not ready to run: the session behind it goes by at once.
    assert_eq!(pass(&mut s), ["solo"]);
    for id in ["g1", "g2", "g3"] {
        assert_eq!(state(&s, id), SessionState::Pending);
        assert_eq!(reason(&s, id), "gang train 3/4 members");
    }
    assert_eq!(allocated(&s, "n1"), "0.5");
    // The solo session left room for three whole GPUs, not four: the fourth member completes
    // the gang, which then waits for room as a whole.
    members(&mut s, "u", "train", 4, &["g4"]);
    assert!(pass(&mut s).is_empty());
    assert!(reason(&s, "g4").contains("does not fit at once"));
    assert_eq!(allocated(&s, "n1"), "0.5");
    s.terminate_released("solo");
    assert_eq!(pass(&mut s), ["g1", "g2", "g3", "g4"]);
    assert_eq!(allocated(&s, "n1"), "4");
}

#[test]
fn a_gang_that_does_not_fit_holds_the_queue_for_skip_after_passes_then_lets_smaller_work_by() {
    let mut s = Scheduler::new(SchedulerConfig {
        skip_after: 2,
        ..SchedulerConfig::default()
    });
    s.register(report("n1", 2, &[]), &[]).unwrap();
    member(&mut s, "hold", "u", &["cuda.shares=1"], None).unwrap();
    assert_eq!(pass(&mut s), ["hold"]);
    // One GPU is free: either member alone would fit, the gang does not.
    members(&mut s, "u", "pair", 2, &["p1", "p2"]);
    member(&mut s, "small", "u", &["cuda.shares=0.5"], None).unwrap();
    // As a single session would, the gang at the head blocks what comes after it...
    for _ in 0..2 {
        assert!(pass(&mut s).is_empty());
        assert_eq!(state(&s, "small"), SessionState::Pending);
        assert_eq!(allocated(&s, "n1"), "1");
    }
    // ...until it failed `skip_after` passes; then the smaller session goes by it, and the gang
    // still holds nothing.
    assert_eq!(pass(&mut s), ["small"]);
    assert_eq!(state(&s, "p1"), SessionState::Pending);
    assert_eq!(state(&s, "p2"), SessionState::Pending);
    assert_eq!(s.sessions()["p1"].failed_passes, 3);
    assert_eq!(allocated(&s, "n1"), "1.5");
    // Once there is room for both members, both go together.
    s.terminate_released("hold");
    s.terminate_released("small");
    assert_eq!(pass(&mut s), ["p1", "p2"]);
}

#[test]
fn a_gang_counts_against_its_queue_as_the_sum_of_its_members() {
    let quotas = QuotaConfig {
        queues: [(
            "team".to_owned(),
            QueueQuota {
                guaranteed: slots(&["cuda.shares=1"]),
                limit: Some(slots(&["cuda.shares=1.5"])),
            },
        )]
        .into(),
        members: [("alice".to_owned(), "team".to_owned())].into(),
    };
    let mut s = Scheduler::new(SchedulerConfig {
        quotas,
        skip_after: 0,
        ..SchedulerConfig::default()
    });
    s.register(report("n1", 4, &[]), &[]).unwrap();
    // Each member alone is within the limit; both together (2 shares) are past it.
    members(&mut s, "alice", "pair", 2, &["p1", "p2"]);
    assert!(pass(&mut s).is_empty());
    for id in ["p1", "p2"] {
        assert_eq!(state(&s, id), SessionState::Pending);
        assert!(reason(&s, id).contains("limit"), "{}", reason(&s, id));
    }
    assert_eq!(allocated(&s, "n1"), "0");
    // A gang within the limit runs whole.
    for id in ["q1", "q2"] {
        member(
            &mut s,
            id,
            "alice",
            &["cuda.shares=0.5"],
            Some(gang("halves", 2)),
        )
        .unwrap();
    }
    assert_eq!(pass(&mut s), ["q1", "q2"]);
    assert_eq!(allocated(&s, "n1"), "1");
}

#[test]
fn gang_requests_are_checked_at_creation() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report("n1", 4, &[]), &[]).unwrap();
    let create = |s: &mut Scheduler, id: &str, owner: &str, name: &str, size: u32| {
        member(s, id, owner, &["cuda.shares=1"], Some(gang(name, size)))
    };
    assert!(matches!(
        create(&mut s, "x", "u", "g", 1),
        Err(RequestError::Gang(GangError::TooSmall(1)))
    ));
    for bad in ["", "-g", "a b", "ü", &"x".repeat(64)] {
        let err = create(&mut s, "x", "u", bad, 2).unwrap_err();
        assert!(err.to_string().contains("gang.name"), "{bad:?}: {err}");
    }
    let err = create(&mut s, "x", "u", "g", Gang::MAX_SIZE + 1).unwrap_err();
    assert!(err.to_string().contains("gang.size"), "{err}");
    create(&mut s, "a1", "u", "g", 2).unwrap();
    let err = create(&mut s, "a2", "u", "g", 3).unwrap_err();
    assert!(
        matches!(
            &err,
            RequestError::Gang(GangError::SizeMismatch { existing: 2, .. })
        ),
        "{err}"
    );
    // Scoped to its owner: another owner's gang of the same name is another gang.
    create(&mut s, "b1", "v", "g", 3).unwrap();
    create(&mut s, "a2", "u", "g", 2).unwrap();
    assert!(matches!(
        create(&mut s, "a3", "u", "g", 2),
        Err(RequestError::Gang(GangError::Full { size: 2, .. }))
    ));
    assert!(!s.sessions().contains_key("x") && !s.sessions().contains_key("a3"));
    // Once its members ended, the name may be used again, with another size.
    s.terminate_released("a1");
    s.terminate_released("a2");
    create(&mut s, "c1", "u", "g", 3).unwrap();
}

#[test]
fn deleting_a_pending_member_makes_the_rest_wait() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report("n1", 4, &[]), &[]).unwrap();
    members(&mut s, "u", "train", 3, &["g1", "g2", "g3"]);
    s.terminate_released("g2");
    assert!(pass(&mut s).is_empty());
    assert_eq!(reason(&s, "g1"), "gang train 2/3 members");
    assert_eq!(allocated(&s, "n1"), "0");
    // A replacement completes it again.
    members(&mut s, "u", "train", 3, &["g4"]);
    assert_eq!(pass(&mut s), ["g1", "g3", "g4"]);
}

#[test]
fn a_restart_keeps_the_gangs_members() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report("n1", 4, &[]), &[]).unwrap();
    members(&mut s, "u", "train", 3, &["g1", "g2"]);
    assert!(pass(&mut s).is_empty());
    // Through the store's encoding, as a restart reads it.
    let stored: Vec<Session> = s
        .sessions()
        .values()
        .map(|x| serde_json::from_slice(&serde_json::to_vec(x).unwrap()).unwrap())
        .collect();
    assert_eq!(stored[0].gang, Some(gang("train", 3)));
    let mut s = Scheduler::restore(
        SchedulerConfig::default(),
        crate::store::Snapshot {
            sessions: stored,
            ..Default::default()
        },
    );
    s.register(report("n1", 4, &[]), &[]).unwrap();
    let err = member(&mut s, "x", "u", &["cuda.shares=1"], Some(gang("train", 4))).unwrap_err();
    assert!(
        matches!(err, RequestError::Gang(GangError::SizeMismatch { .. })),
        "{err}"
    );
    assert!(pass(&mut s).is_empty());
    assert_eq!(reason(&s, "g1"), "gang train 2/3 members");
    members(&mut s, "u", "train", 3, &["g3"]);
    assert_eq!(pass(&mut s), ["g1", "g2", "g3"]);
}

#[test]
fn a_record_without_a_gang_reads_as_none() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report("n1", 1, &[]), &[]).unwrap();
    member(&mut s, "a", "u", &["cuda.shares=1"], None).unwrap();
    let mut json: serde_json::Value = serde_json::to_value(&s.sessions()["a"]).unwrap();
    assert!(json.get("gang").is_none(), "no gang: not written");
    json.as_object_mut().unwrap().remove("gang");
    let read: Session = serde_json::from_value(json).unwrap();
    assert_eq!(read.gang, None);
}

#[test]
fn a_running_gang_is_preempted_as_a_unit() {
    let quota = |shares: &str| QueueQuota {
        guaranteed: slots(&[&format!("cuda.shares={shares}")]),
        limit: None,
    };
    let quotas = QuotaConfig {
        queues: [("a".to_owned(), quota("1")), ("b".to_owned(), quota("1"))].into(),
        members: BTreeMap::new(),
    };
    let mut s = Scheduler::new(SchedulerConfig {
        quotas,
        ..SchedulerConfig::default()
    });
    s.register(report("n1", 2, &[]), &[]).unwrap();
    // Team b's gang borrows the GPU team a is guaranteed.
    members(&mut s, "b", "pair", 2, &["b1", "b2"]);
    assert_eq!(pass(&mut s), ["b1", "b2"]);
    member(&mut s, "a1", "a", &["cuda.shares=1"], None).unwrap();
    let mut preempts: Vec<String> = s
        .pass()
        .into_iter()
        .filter_map(|c| match c {
            Command::Preempt { session, .. } => Some(session),
            _ => None,
        })
        .collect();
    preempts.sort();
    // One member's GPU would do; the gang yields whole, so no partial gang keeps a GPU.
    assert_eq!(preempts, ["b1", "b2"]);
    for id in ["b1", "b2"] {
        let event = EnforcementEvent {
            action: Action::Preempted,
            ..EnforcementEvent::default()
        };
        assert!(s.record_event("n1", id, event));
        assert_eq!(state(&s, id), SessionState::Preempted);
    }
    assert_eq!(pass(&mut s), ["a1"]);
    assert_eq!(allocated(&s, "n1"), "1");
}

#[test]
fn a_waiting_gang_within_its_guarantee_reclaims_room_for_all_its_members() {
    let quotas = QuotaConfig {
        queues: [(
            "a".to_owned(),
            QueueQuota {
                guaranteed: slots(&["cuda.shares=2"]),
                limit: None,
            },
        )]
        .into(),
        members: BTreeMap::new(),
    };
    let mut s = Scheduler::new(SchedulerConfig {
        quotas,
        ..SchedulerConfig::default()
    });
    s.register(report("n1", 2, &[]), &[]).unwrap();
    // `burst` has no queue: it borrows the whole node.
    for id in ["b1", "b2"] {
        member(&mut s, id, "burst", &["cuda.shares=1"], None).unwrap();
    }
    assert_eq!(pass(&mut s), ["b1", "b2"]);
    // Team a's gang is within its guarantee: one GPU freed would do for a single member, the
    // gang needs both.
    members(&mut s, "a", "pair", 2, &["a1", "a2"]);
    let preempts = |s: &mut Scheduler| {
        let mut ids: Vec<String> = s
            .pass()
            .into_iter()
            .filter_map(|c| match c {
                Command::Preempt { session, .. } => Some(session),
                Command::Allocate { .. } => panic!("nothing is placed before the room is free"),
                Command::Release { .. }
                | Command::Resume { .. }
                | Command::MakeMigInstance { .. } => None,
            })
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(preempts(&mut s), ["b1", "b2"]);
    assert!(
        reason(&s, "a1").contains("waits for preempted"),
        "{}",
        reason(&s, "a1")
    );
    // While the victims are on their way out, nothing more is preempted or placed.
    assert!(preempts(&mut s).is_empty());
    assert_eq!(allocated(&s, "n1"), "2");
    for id in ["b1", "b2"] {
        let event = EnforcementEvent {
            action: Action::Preempted,
            ..EnforcementEvent::default()
        };
        assert!(s.record_event("n1", id, event));
    }
    assert_eq!(pass(&mut s), ["a1", "a2"]);
    assert_eq!(allocated(&s, "n1"), "2");
}

#[test]
fn a_member_refused_by_its_node_before_it_ran_fails_its_whole_gang() {
    let (mut s, placed) = gang_of_three_placed(SchedulerConfig::default());
    let node_of = |id: &str| node_of(&placed, id);
    // Placed, not yet acknowledged: g1 runs, g3's node refuses it.
    s.ack(&node_of("g1"), "g1");
    let releases = s.nack(&node_of("g3"), "g3", "InvalidQuota", "no such cgroup");
    assert_eq!(state(&s, "g3"), SessionState::Failed);
    for id in ["g1", "g2"] {
        assert_eq!(state(&s, id), SessionState::Failed);
        assert!(
            reason(&s, id).contains("gang train could not start whole")
                && reason(&s, id).contains("g3")
                && reason(&s, id).contains("no such cgroup"),
            "{}",
            reason(&s, id)
        );
    }
    let told = released(releases);
    let mut expected = vec![
        (node_of("g1"), "g1".to_owned()),
        (node_of("g2"), "g2".to_owned()),
    ];
    expected.sort();
    assert_eq!(told, expected);
    // Nothing of the gang is held any more.
    assert_eq!(allocated(&s, "n1"), "0");
    assert_eq!(allocated(&s, "n2"), "0");
}

#[test]
fn a_member_refused_after_its_gang_ran_fails_alone() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report("n1", 2, &[]), &[]).unwrap();
    members(&mut s, "u", "pair", 2, &["p1", "p2"]);
    assert_eq!(pass(&mut s), ["p1", "p2"]);
    // Both ran: a later refusal (say, after its agent restarted) ends only that member.
    let releases = s.nack("n1", "p2", "InvalidQuota", "");
    assert!(releases.is_empty());
    assert_eq!(state(&s, "p2"), SessionState::Failed);
    assert_eq!(state(&s, "p1"), SessionState::Running);
}

#[test]
fn a_gang_whose_node_never_answers_for_a_member_fails_whole_after_the_start_timeout() {
    let (mut s, placed) = gang_of_three_placed(SchedulerConfig {
        gang_start_timeout_ms: 60_000,
        ..SchedulerConfig::default()
    });
    let node_of = |id: &str| node_of(&placed, id);
    // Two members start; g3's node says nothing.
    s.ack(&node_of("g1"), "g1");
    s.ack(&node_of("g2"), "g2");
    let placed_at = s.sessions()["g3"].updated_at_ms;
    assert!(s.expire_gangs(placed_at + 59_000, 60_000).is_empty());
    assert_eq!(state(&s, "g1"), SessionState::Running);
    let releases = s.expire_gangs(placed_at + 61_000, 60_000);
    for id in ["g1", "g2", "g3"] {
        assert_eq!(state(&s, id), SessionState::Failed, "{id}");
        assert!(
            reason(&s, id).contains("gang train did not start whole within 60 s")
                && reason(&s, id).contains("member g3 was not acknowledged"),
            "{}",
            reason(&s, id)
        );
    }
    let told = released(releases);
    let mut expected: Vec<(String, String)> = ["g1", "g2", "g3"]
        .iter()
        .map(|id| (node_of(id), (*id).to_owned()))
        .collect();
    expected.sort();
    assert_eq!(told, expected);
    assert_eq!(allocated(&s, "n1"), "0");
    assert_eq!(allocated(&s, "n2"), "0");
    // Expired once: nothing more to release.
    assert!(s.expire_gangs(placed_at + 120_000, 60_000).is_empty());
}

#[test]
fn a_gang_that_started_whole_and_a_timeout_of_zero_are_never_expired() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report("n1", 4, &[]), &[]).unwrap();
    members(&mut s, "u", "pair", 2, &["p1", "p2"]);
    members(&mut s, "u", "slow", 2, &["q1", "q2"]);
    let placed = s.pass();
    assert_eq!(placed.len(), 4, "{placed:?}");
    s.ack("n1", "p1");
    s.ack("n1", "p2");
    let later = s.sessions()["q1"].updated_at_ms + 3_600_000;
    assert!(s.expire_gangs(later, 0).is_empty());
    assert_eq!(state(&s, "q1"), SessionState::Scheduled);
    let releases = s.expire_gangs(later, 60_000);
    assert_eq!(
        releases.len(),
        2,
        "only the gang that never started: {releases:?}"
    );
    assert_eq!(state(&s, "p1"), SessionState::Running);
    assert_eq!(state(&s, "p2"), SessionState::Running);
    assert_eq!(state(&s, "q2"), SessionState::Failed);
}
