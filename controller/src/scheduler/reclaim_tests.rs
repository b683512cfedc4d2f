//! Reclaim by preemption through the pass: victims chosen, marked and released only when their
//! agent reports the workload gone; the waiting session placed after, never over-committing.

use super::{
    quotas::{QueueQuota, QuotaConfig},
    tests::report,
    *,
};
use crate::session::{Action, DecisionKind, EnforcementEvent};

fn slots(tokens: &[&str]) -> ResourceSlot {
    ResourceSlot::parse_any(tokens).unwrap()
}

/// Team a is guaranteed 1 GPU's shares; team b none (it only borrows). One node, 2 GPUs.
fn cluster() -> Scheduler {
    let quotas = QuotaConfig {
        queues: [
            (
                "a".to_owned(),
                QueueQuota {
                    guaranteed: slots(&["cuda.shares=1"]),
                    limit: None,
                },
            ),
            (
                "b".to_owned(),
                QueueQuota {
                    guaranteed: slots(&["cuda.shares=1"]),
                    limit: None,
                },
            ),
        ]
        .into(),
        members: BTreeMap::new(),
    };
    let mut s = Scheduler::new(SchedulerConfig {
        quotas,
        preemption_grace_ms: 5_000,
        ..SchedulerConfig::default()
    });
    s.register(report("n1", 2, &[]), &[]).unwrap();
    s
}

fn create(s: &mut Scheduler, id: &str, owner: &str, priority: i32, no_preempt: bool) {
    s.create(NewSession {
        id: id.into(),
        owner: owner.into(),
        priority,
        requested: slots(&["cuda.shares=1"]),
        no_preempt,
        ..NewSession::default()
    })
    .unwrap();
}

/// Runs a pass and acks what it placed; returns the preemptions it sent (node, session).
fn pass(s: &mut Scheduler) -> Vec<(String, String)> {
    let mut preempts = Vec::new();
    for c in s.pass() {
        match c {
            Command::Allocate { node, session, .. } => s.ack(&node, &session),
            Command::Preempt { node, session, .. } => preempts.push((node, session)),
            Command::Release { .. } | Command::Resume { .. } | Command::MakeMigInstance { .. } => {}
        }
    }
    preempts
}

fn preempted(s: &mut Scheduler, node: &str, id: &str) {
    let event = EnforcementEvent {
        action: Action::Preempted,
        ..EnforcementEvent::default()
    };
    assert!(s.record_event(node, id, event));
}

fn state(s: &Scheduler, id: &str) -> SessionState {
    s.sessions()[id].state
}

/// No GPU share is ever given twice.
fn not_overcommitted(s: &Scheduler) {
    for d in s.nodes()["n1"].allocator.devices() {
        assert!(d.allocated <= d.capacity, "{d:?}");
    }
}

#[test]
fn a_borrower_is_preempted_down_to_its_guarantee_and_the_lender_runs_after() {
    let mut s = cluster();
    // Team b borrows the whole node (its guarantee is 1; the second GPU is a's).
    create(&mut s, "b1", "b", 0, false);
    create(&mut s, "b2", "b", 0, false);
    assert!(pass(&mut s).is_empty());
    assert_eq!(state(&s, "b2"), SessionState::Running);
    // Team a asks within its guarantee: the newest borrowed session yields, and only it.
    create(&mut s, "a1", "a", 0, false);
    let preempts = pass(&mut s);
    assert_eq!(preempts, [("n1".to_owned(), "b2".to_owned())]);
    assert!(s.sessions()["b2"].reason.contains("being preempted"));
    assert_eq!(state(&s, "b2"), SessionState::Running);
    // Until the agent reports, a1 waits (the victim still holds its GPU), and nothing more is
    // preempted on the next passes.
    assert!(pass(&mut s).is_empty());
    assert_eq!(state(&s, "a1"), SessionState::Pending);
    assert!(
        s.sessions()["a1"].reason.contains("b2"),
        "{}",
        s.sessions()["a1"].reason
    );
    not_overcommitted(&s);
    preempted(&mut s, "n1", "b2");
    let b2 = &s.sessions()["b2"];
    assert_eq!(b2.state, SessionState::Preempted);
    assert!(
        b2.reason.contains("a1") && b2.reason.contains("reclaims"),
        "{}",
        b2.reason
    );
    assert!(b2.preempting.is_none());
    // The freed room goes to a1; b1 (within b's guarantee) keeps running.
    assert!(pass(&mut s).is_empty());
    assert_eq!(state(&s, "a1"), SessionState::Running);
    assert_eq!(state(&s, "b1"), SessionState::Running);
    not_overcommitted(&s);
}

#[test]
fn no_preempt_sessions_are_never_victims_and_only_run_within_their_guarantee() {
    let mut s = cluster();
    create(&mut s, "b1", "b", 0, true);
    // Past b's guarantee: a no-preempt session waits rather than borrow.
    create(&mut s, "b2", "b", 0, true);
    pass(&mut s);
    assert_eq!(state(&s, "b1"), SessionState::Running);
    assert_eq!(state(&s, "b2"), SessionState::Pending);
    assert!(s.sessions()["b2"].reason.contains("no-preempt"));
    // A preemptible borrower takes the idle GPU, and is the one preempted when a asks.
    create(&mut s, "b3", "b", 0, false);
    // (Under FIFO it goes by the waiting b2 once b2 failed `skip_after` passes.)
    for _ in 0..=s.config().skip_after {
        pass(&mut s);
    }
    assert_eq!(state(&s, "b3"), SessionState::Running);
    create(&mut s, "a1", "a", 0, false);
    assert_eq!(pass(&mut s), [("n1".to_owned(), "b3".to_owned())]);
}

#[test]
fn a_borrower_does_not_preempt_another_queue() {
    let mut s = cluster();
    create(&mut s, "a1", "a", 0, false);
    create(&mut s, "a2", "a", 0, false);
    pass(&mut s);
    // c has no quota: it only borrows, and borrowers never reclaim.
    create(&mut s, "c1", "c", 10, false);
    assert!(pass(&mut s).is_empty());
    assert_eq!(state(&s, "c1"), SessionState::Pending);
}

#[test]
fn priority_preemption_inside_a_queue_follows_the_same_path() {
    let mut s = cluster();
    create(&mut s, "a1", "a", 0, false);
    create(&mut s, "a2", "a", 5, false);
    pass(&mut s);
    create(&mut s, "a3", "a", 9, false);
    // The lowest priority yields.
    assert_eq!(pass(&mut s), [("n1".to_owned(), "a1".to_owned())]);
    preempted(&mut s, "n1", "a1");
    let a1 = &s.sessions()["a1"];
    assert_eq!(a1.state, SessionState::Preempted);
    assert!(a1.reason.contains("priority 9 over 0"), "{}", a1.reason);
    pass(&mut s);
    assert_eq!(state(&s, "a3"), SessionState::Running);
}

#[test]
fn a_node_that_returns_without_the_victim_ends_it_preempted_and_one_that_holds_it_is_asked_again() {
    let mut s = cluster();
    create(&mut s, "b1", "b", 0, false);
    create(&mut s, "b2", "b", 0, false);
    pass(&mut s);
    create(&mut s, "a1", "a", 0, false);
    assert_eq!(pass(&mut s).len(), 1);
    // The agent restarts still holding b2: the preemption is sent again.
    let again = s
        .register(report("n1", 2, &[]), &["b1".into(), "b2".into()])
        .unwrap();
    assert!(again.iter().any(
        |c| matches!(c, Command::Preempt { session, grace_ms: 5_000, .. } if session == "b2")
    ));
    // It comes back without b2: the preemption finished while its report was lost.
    s.register(report("n1", 2, &[]), &["b1".into()]).unwrap();
    assert_eq!(state(&s, "b2"), SessionState::Preempted);
    assert_eq!(state(&s, "b1"), SessionState::Running);
}

#[test]
fn without_quotas_nothing_is_preempted() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report("n1", 1, &[]), &[]).unwrap();
    create(&mut s, "low", "u", 0, false);
    pass(&mut s);
    create(&mut s, "high", "u", 9, false);
    assert!(pass(&mut s).is_empty());
    assert_eq!(state(&s, "high"), SessionState::Pending);
}

#[test]
fn the_decisions_say_why_it_waited_whom_it_preempted_and_for_whom_one_yielded() {
    let mut s = cluster();
    create(&mut s, "b1", "b", 0, false);
    create(&mut s, "b2", "b", 0, false);
    pass(&mut s);
    // Placed in the first pass, with nothing to wait for: no decision to explain.
    assert!(s.sessions()["b1"].decisions.is_empty());
    create(&mut s, "a1", "a", 0, false);
    pass(&mut s);
    let kinds = |s: &Scheduler, id: &str| -> Vec<DecisionKind> {
        s.sessions()[id].decisions.iter().map(|d| d.kind).collect()
    };
    assert_eq!(kinds(&s, "a1"), [DecisionKind::Preempted]);
    let detail = &s.sessions()["a1"].decisions[0].detail;
    assert!(
        detail.contains("b2 on n1")
            && detail.contains("queue a reclaims its guarantee from queue b"),
        "{detail}"
    );
    assert_eq!(kinds(&s, "b2"), [DecisionKind::Yielded]);
    let detail = &s.sessions()["b2"].decisions[0].detail;
    assert!(detail.starts_with("preempted for a1: queue a"), "{detail}");
    assert!(kinds(&s, "b1").is_empty(), "only the victim yields");

    preempted(&mut s, "n1", "b2");
    pass(&mut s);
    assert_eq!(state(&s, "a1"), SessionState::Running);
    assert_eq!(
        kinds(&s, "a1"),
        [DecisionKind::Preempted, DecisionKind::Waited]
    );
    let detail = &s.sessions()["a1"].decisions[1].detail;
    assert!(
        detail.contains("waits for preempted sessions to release their resources: b2"),
        "{detail}"
    );
}

#[test]
fn two_waiters_in_one_pass_each_preempt_for_themselves() {
    // Every waiting session is tried in the same pass (none blocks the queue). The first
    // waiter's victim is on its way to the first: the second does not count on that room (it
    // would wait a whole grace period for nothing) and preempts for itself, in the same pass.
    let mut config = cluster().config().clone();
    config.skip_after = 0;
    let mut s = Scheduler::new(config);
    s.register(report("n1", 2, &[]), &[]).unwrap();
    // An owner without a queue only borrows: both its sessions may yield.
    create(&mut s, "z1", "z", 0, false);
    create(&mut s, "z2", "z", 0, false);
    pass(&mut s);
    // Each of team a's asks is within its guarantee when it is tried (nothing of a's is placed).
    create(&mut s, "a1", "a", 0, false);
    create(&mut s, "a2", "a", 0, false);
    let mut preempts = pass(&mut s);
    preempts.sort();
    assert_eq!(
        preempts,
        [
            ("n1".to_owned(), "z1".to_owned()),
            ("n1".to_owned(), "z2".to_owned())
        ]
    );
    let earmarks: Vec<Option<&str>> = ["z1", "z2"]
        .iter()
        .map(|v| s.sessions()[*v].preempted_for.as_deref())
        .collect();
    assert!(
        earmarks.contains(&Some("a1")) && earmarks.contains(&Some("a2")),
        "{earmarks:?}"
    );
    // Later passes preempt nothing more: each waiter counts on its own victim.
    assert!(pass(&mut s).is_empty());
    for waiter in ["a1", "a2"] {
        let reason = &s.sessions()[waiter].reason;
        assert!(reason.contains("waits for preempted sessions"), "{reason}");
    }
    preempted(&mut s, "n1", "z1");
    preempted(&mut s, "n1", "z2");
    pass(&mut s);
    assert_eq!(state(&s, "a1"), SessionState::Running);
    assert_eq!(state(&s, "a2"), SessionState::Running);
    not_overcommitted(&s);
}

/// [`cluster`], team b's sessions suspended rather than killed when preempted.
fn suspending_cluster() -> Scheduler {
    let mut s = cluster();
    s.config.suspend_queues.insert("b".to_owned());
    s
}

/// Bytes the agent says a suspended session's GPU memory takes on the host.
const HOST_BYTES: u64 = 3 << 30;

fn event(s: &mut Scheduler, id: &str, action: Action) {
    let event = EnforcementEvent {
        used_bytes: if action == Action::Suspended {
            HOST_BYTES
        } else {
            0
        },
        action,
        ..EnforcementEvent::default()
    };
    assert!(s.record_event("n1", id, event));
}

/// b borrows the node; a reclaims its guarantee. In queue b's mode `suspend`, b2 is asked to
/// suspend, holds its GPU until its agent reports it suspended, then holds nothing and waits
/// with a home; a1 runs on that GPU; when a1 ends, b2 is resumed on the GPU it left.
#[test]
fn a_suspended_borrower_waits_at_home_and_resumes_when_room_returns() {
    let mut s = suspending_cluster();
    create(&mut s, "b1", "b", 0, false);
    create(&mut s, "b2", "b", 0, false);
    assert!(pass(&mut s).is_empty());
    let b2_gpu = s.sessions()["b2"].allocation.clone();
    create(&mut s, "a1", "a", 0, false);
    let commands = s.pass();
    assert!(
        matches!(
            commands.as_slice(),
            [Command::Preempt { session, mode: PreemptionMode::Suspend, .. }] if session == "b2"
        ),
        "{commands:?}"
    );
    assert!(s.sessions()["b2"].reason.contains("being suspended"));
    // Until its agent reports it suspended, b2 holds its GPU and a1 waits.
    assert!(pass(&mut s).is_empty());
    assert_eq!(state(&s, "a1"), SessionState::Pending);
    event(&mut s, "b2", Action::Suspended);
    let b2 = &s.sessions()["b2"];
    assert_eq!(b2.state, SessionState::Suspended);
    assert_eq!(b2.node, None);
    let home = b2.home.clone().unwrap();
    assert_eq!((home.node.as_str(), &home.allocation), ("n1", &b2_gpu));
    assert_eq!(home.yielded_to, "a1");
    // Its GPU memory is in the node's host memory now, and booked there.
    assert_eq!(home.host_bytes, HOST_BYTES);
    let mem = |s: &Scheduler| s.nodes()["n1"].allocated.get("mem").to_u64();
    assert_eq!(mem(&s), Some(HOST_BYTES));
    assert!(b2.reason.contains("waits to resume on n1"), "{}", b2.reason);
    // a1 takes the room; b2 is not resumed meanwhile (no room, then none left).
    assert!(pass(&mut s).is_empty());
    assert_eq!(state(&s, "a1"), SessionState::Running);
    assert_eq!(state(&s, "b2"), SessionState::Suspended);
    assert!(pass(&mut s).is_empty());
    not_overcommitted(&s);

    // a1 ends: b2 resumes on the GPU it left.
    assert!(s.terminate_released("a1").is_some());
    let commands = s.pass();
    assert!(
        matches!(
            commands.as_slice(),
            [Command::Resume { node, session, onto: None }] if node == "n1" && session == "b2"
        ),
        "{commands:?}"
    );
    let b2 = &s.sessions()["b2"];
    assert_eq!(b2.state, SessionState::Running);
    assert_eq!(b2.allocation, b2_gpu);
    assert!(b2.reason.contains("resuming on n1"), "{}", b2.reason);
    assert_eq!(mem(&s), Some(0), "back on the GPU");
    not_overcommitted(&s);
    event(&mut s, "b2", Action::Resumed);
    let b2 = &s.sessions()["b2"];
    let kinds: Vec<DecisionKind> = b2.decisions.iter().map(|d| d.kind).collect();
    assert_eq!(
        kinds,
        [
            DecisionKind::Yielded,
            DecisionKind::Suspended,
            DecisionKind::Resumed
        ]
    );
    assert!(
        b2.decisions[2].detail.contains("for a1"),
        "{:?}",
        b2.decisions
    );
    assert!(b2.home.is_none() && b2.reason.is_empty());
    // A suspension the controller did not ask for (an operator's, on the node) frees nothing.
    event(&mut s, "b1", Action::Suspended);
    assert_eq!(state(&s, "b1"), SessionState::Running);
    assert!(pass(&mut s).is_empty());
}

/// [`suspending_cluster`] on a node whose two GPUs are of the models `models`.
fn suspending_cluster_of(models: [&str; 2]) -> Scheduler {
    let mut s = suspending_cluster();
    let mut node = report("n1", 2, &[]);
    node.device_models = models.iter().map(|m| ((*m).to_owned(), false)).collect();
    s.register(node, &[]).unwrap();
    s
}

/// b1 and b2 borrow both GPUs; a1 reclaims and b2 is suspended, a1 taking its GPU; then b1
/// ends, so the GPU b2 left is busy and the other free. The GPU b2 left and the other one.
fn suspended_with_its_home_busy(s: &mut Scheduler) -> (u32, u32) {
    create(s, "b1", "b", 0, false);
    create(s, "b2", "b", 0, false);
    assert!(pass(s).is_empty());
    let home = s.sessions()["b2"].allocation.parts[0].index;
    create(s, "a1", "a", 0, false);
    assert_eq!(pass(s), [("n1".to_owned(), "b2".to_owned())]);
    event(s, "b2", Action::Suspended);
    assert!(pass(s).is_empty());
    assert_eq!(state(s, "a1"), SessionState::Running);
    assert_eq!(s.sessions()["a1"].allocation.parts[0].index, home);
    s.terminate_released("b1").unwrap();
    (home, 1 - home)
}

/// Issue 38: the GPU a suspended session left is busy and another GPU of the same model on its
/// node is free: it resumes there, the `Resume` naming that GPU, and its decisions say where.
#[test]
fn a_suspended_session_resumes_on_another_gpu_of_the_same_model() {
    let mut s = suspending_cluster_of(["Mock H100", "Mock H100"]);
    let (home, other) = suspended_with_its_home_busy(&mut s);
    let commands = s.pass();
    let [
        Command::Resume {
            node,
            session,
            onto: Some(onto),
        },
    ] = commands.as_slice()
    else {
        panic!("{commands:?}");
    };
    assert_eq!((node.as_str(), session.as_str()), ("n1", "b2"));
    let uuid = s.nodes()["n1"].report.devices[other as usize].uuid.clone();
    assert_eq!(onto.parts.len(), 1);
    assert_eq!((onto.parts[0].index, &onto.parts[0].uuid), (other, &uuid));
    let b2 = &s.sessions()["b2"];
    assert_eq!(b2.state, SessionState::Running);
    assert_eq!(&b2.allocation, onto);
    assert!(
        b2.reason
            .contains(&format!("GPUs {other} (suspended on {home})")),
        "{}",
        b2.reason
    );
    not_overcommitted(&s);
    // Booked on the other GPU, not on the one a1 holds.
    let devices = s.nodes()["n1"].allocator.devices();
    assert!(devices[other as usize].sessions.contains("b2"));
    assert!(!devices[home as usize].sessions.contains("b2"));
    event(&mut s, "b2", Action::Resumed);
    let b2 = &s.sessions()["b2"];
    let resumed = b2.decisions.last().unwrap();
    assert_eq!(resumed.kind, DecisionKind::Resumed);
    assert!(
        resumed.detail.contains(&format!(
            "GPUs {other} of the same model (suspended on GPUs {home})"
        )),
        "{}",
        resumed.detail
    );
}

/// The free GPU is of another model: the session stays suspended until the GPU it left has
/// room, and then resumes there.
#[test]
fn a_gpu_of_another_model_does_not_take_a_suspended_session() {
    let mut s = suspending_cluster_of(["Mock H100", "Mock A100"]);
    suspended_with_its_home_busy(&mut s);
    assert!(s.pass().is_empty());
    assert_eq!(state(&s, "b2"), SessionState::Suspended);
    s.terminate_released("a1").unwrap();
    let commands = s.pass();
    assert!(
        matches!(commands.as_slice(), [Command::Resume { onto: None, .. }]),
        "{commands:?}"
    );
}

/// A move cut short by a restart of its agent (`move_interrupted`, nothing moved): suspended
/// again and the other GPU freed, as for a refusal, but it is not held to the GPU it left: the
/// next pass moves it to the other GPU again.
#[test]
fn a_move_cut_short_by_an_agent_restart_may_be_tried_again() {
    let mut s = suspending_cluster_of(["Mock H100", "Mock H100"]);
    let (home, other) = suspended_with_its_home_busy(&mut s);
    assert!(matches!(
        s.pass().as_slice(),
        [Command::Resume { onto: Some(_), .. }]
    ));
    let cut = EnforcementEvent {
        action: Action::ResumeRefused,
        move_interrupted: true,
        ..EnforcementEvent::default()
    };
    assert!(s.record_event("n1", "b2", cut));
    let b2 = &s.sessions()["b2"];
    assert_eq!(b2.state, SessionState::Suspended);
    assert!(!b2.home.as_ref().unwrap().home_only);
    assert!(
        b2.reason.contains("cut short by an agent restart"),
        "{}",
        b2.reason
    );
    let commands = s.pass();
    let [
        Command::Resume {
            onto: Some(onto), ..
        },
    ] = commands.as_slice()
    else {
        panic!("moved again: {commands:?}");
    };
    assert_eq!(onto.parts[0].index, other);
    assert_ne!(onto.parts[0].index, home);
}

/// Its agent refuses the move (a driver whose restore takes no GPU pairs): it is suspended
/// again, the other GPU freed, and it waits for the GPU it left, resuming there.
#[test]
fn a_refused_move_leaves_the_session_waiting_for_the_gpu_it_left() {
    let mut s = suspending_cluster_of(["Mock H100", "Mock H100"]);
    let (home, other) = suspended_with_its_home_busy(&mut s);
    assert!(matches!(
        s.pass().as_slice(),
        [Command::Resume { onto: Some(_), .. }]
    ));
    event(&mut s, "b2", Action::ResumeRefused);
    let b2 = &s.sessions()["b2"];
    assert_eq!(b2.state, SessionState::Suspended);
    assert!(b2.home.as_ref().unwrap().home_only);
    assert!(b2.reason.contains(&format!("GPUs {home}")), "{}", b2.reason);
    assert!(
        s.nodes()["n1"].allocator.devices()[other as usize]
            .sessions
            .is_empty()
    );
    assert!(s.pass().is_empty(), "the other GPU does not take it again");
    assert_eq!(state(&s, "b2"), SessionState::Suspended);
    s.terminate_released("a1").unwrap();
    let commands = s.pass();
    assert!(
        matches!(commands.as_slice(), [Command::Resume { onto: None, .. }]),
        "{commands:?}"
    );
    assert_eq!(s.sessions()["b2"].allocation.parts[0].index, home);
}

/// A session that says `kill` is killed even in a suspending queue.
#[test]
fn a_session_s_own_mode_wins_over_its_queue_s() {
    let mut s = suspending_cluster();
    create(&mut s, "b1", "b", 0, false);
    s.create(NewSession {
        id: "b2".into(),
        owner: "b".into(),
        requested: slots(&["cuda.shares=1"]),
        preemption: Some(PreemptionMode::Kill),
        ..NewSession::default()
    })
    .unwrap();
    assert!(pass(&mut s).is_empty());
    create(&mut s, "a1", "a", 0, false);
    let commands = s.pass();
    assert!(
        matches!(
            commands.as_slice(),
            [Command::Preempt { session, mode: PreemptionMode::Kill, .. }] if session == "b2"
        ),
        "{commands:?}"
    );
}

/// Suspended, its agent re-registers holding it (frozen): no release for it. Then its node
/// goes silent: nothing is left to resume, and it fails saying why.
#[test]
fn a_suspended_session_is_kept_at_registration_and_fails_with_its_node() {
    let mut s = suspending_cluster();
    create(&mut s, "b1", "b", 0, false);
    create(&mut s, "b2", "b", 0, false);
    assert!(pass(&mut s).is_empty());
    create(&mut s, "a1", "a", 0, false);
    let _ = s.pass();
    event(&mut s, "b2", Action::Suspended);
    assert!(pass(&mut s).is_empty());
    let commands = s
        .register(
            report("n1", 2, &[]),
            &["a1".into(), "b1".into(), "b2".into()],
        )
        .unwrap();
    assert!(
        !commands
            .iter()
            .any(|c| matches!(c, Command::Release { session, .. } if session == "b2")),
        "{commands:?}"
    );
    assert_eq!(state(&s, "b2"), SessionState::Suspended);
    // The registration books its host memory again.
    assert_eq!(
        s.nodes()["n1"].allocated.get("mem").to_u64(),
        Some(HOST_BYTES)
    );
    let lost = s.expire(now_ms() + 3_600_000, 1_000);
    assert_eq!(lost, ["n1"]);
    let b2 = &s.sessions()["b2"];
    assert_eq!(b2.state, SessionState::Failed);
    assert!(b2.reason.contains("host memory"), "{}", b2.reason);
}

/// What a suspended session keeps survives the store's encoding (a controller restart).
#[test]
fn a_home_survives_the_stored_record() {
    let mut s = suspending_cluster();
    create(&mut s, "b1", "b", 0, false);
    create(&mut s, "b2", "b", 0, false);
    assert!(pass(&mut s).is_empty());
    create(&mut s, "a1", "a", 0, false);
    let _ = s.pass();
    event(&mut s, "b2", Action::Suspended);
    let b2 = s.sessions()["b2"].clone();
    let stored = serde_json::to_string(&b2).unwrap();
    let back: Session = serde_json::from_str(&stored).unwrap();
    assert_eq!(back, b2);
    assert_eq!(back.state, SessionState::Suspended);
}

/// A suspended session ended by its owner: its home node is told to let go (its agent ends the
/// frozen workload), and nothing it no longer held is given back twice.
#[test]
fn ending_a_suspended_session_releases_it_at_home() {
    let mut s = suspending_cluster();
    create(&mut s, "b1", "b", 0, false);
    create(&mut s, "b2", "b", 0, false);
    assert!(pass(&mut s).is_empty());
    create(&mut s, "a1", "a", 0, false);
    let _ = s.pass();
    event(&mut s, "b2", Action::Suspended);
    assert!(pass(&mut s).is_empty());
    assert_eq!(state(&s, "a1"), SessionState::Running);
    let before: Vec<_> = s.nodes()["n1"]
        .allocator
        .devices()
        .iter()
        .map(|d| d.allocated)
        .collect();
    let command = s.terminate_released("b2");
    assert!(
        matches!(&command, Some(Command::Release { node, session }) if node == "n1" && session == "b2"),
        "{command:?}"
    );
    assert_eq!(state(&s, "b2"), SessionState::Terminated);
    assert!(s.sessions()["b2"].home.is_none());
    let after: Vec<_> = s.nodes()["n1"]
        .allocator
        .devices()
        .iter()
        .map(|d| d.allocated)
        .collect();
    assert_eq!(before, after);
    assert_eq!(s.nodes()["n1"].allocated.get("mem").to_u64(), Some(0));
    assert!(pass(&mut s).is_empty(), "nothing to resume now");
}

/// Issue 40: a victim ended by its owner while it is being preempted is TERMINATING, still
/// holding its GPU (and still counted as freeing it for the waiter, so nothing more is
/// preempted); its workload's end ends it TERMINATED, no longer preempting, and the waiter runs.
#[test]
fn a_victim_terminated_mid_preemption_ends_terminated_when_its_workload_is_gone() {
    let mut s = cluster();
    create(&mut s, "b1", "b", 0, false);
    create(&mut s, "b2", "b", 0, false);
    assert!(pass(&mut s).is_empty());
    create(&mut s, "a1", "a", 0, false);
    assert_eq!(pass(&mut s), [("n1".to_owned(), "b2".to_owned())]);

    assert!(s.terminate("b2").is_some());
    assert_eq!(state(&s, "b2"), SessionState::Terminating);
    assert!(pass(&mut s).is_empty(), "nothing more is preempted");
    assert_eq!(state(&s, "a1"), SessionState::Pending);
    not_overcommitted(&s);

    preempted(&mut s, "n1", "b2");
    assert_eq!(state(&s, "b2"), SessionState::Terminated);
    let b2 = &s.sessions()["b2"];
    assert!(b2.reason.contains("terminated by request"), "{}", b2.reason);
    assert_eq!(
        (b2.preempting.as_deref(), b2.preempted_for.as_deref()),
        (None, None)
    );
    assert!(pass(&mut s).is_empty());
    assert_eq!(state(&s, "a1"), SessionState::Running);
    assert_eq!(state(&s, "b1"), SessionState::Running);
    not_overcommitted(&s);
}

/// Docs/api.md, "Conditions": a victim keeps running through its grace period, `RUNNING` with a
/// `Preempting` condition naming whom it yields to, and its waiter says it waits for it; once
/// its workload is gone it ends `PREEMPTED` with neither.
#[test]
fn a_victim_runs_with_a_preempting_condition_until_its_workload_is_gone() {
    use crate::convert::session_to_pb;
    use gpuwarden_proto::v1 as pb;
    let condition = |s: &Scheduler, id: &str, kind: &str| {
        session_to_pb(&s.sessions()[id])
            .conditions
            .into_iter()
            .find(|c| c.r#type == kind)
            .map(|c| (c.status(), c.reason, c.message))
    };
    let mut s = cluster();
    create(&mut s, "b1", "b", 0, false);
    create(&mut s, "b2", "b", 0, false);
    assert!(pass(&mut s).is_empty());
    assert_eq!(condition(&s, "b2", "Preempting"), None);
    create(&mut s, "a1", "a", 0, false);
    assert_eq!(pass(&mut s), [("n1".to_owned(), "b2".to_owned())]);
    let victim = session_to_pb(&s.sessions()["b2"]);
    assert_eq!(victim.state(), pb::SessionState::Running);
    let (status, reason, message) =
        condition(&s, "b2", "Preempting").expect("a Preempting condition");
    assert_eq!(
        (status, reason.as_str()),
        (pb::ConditionStatus::True, "Preempting")
    );
    assert!(message.contains("a1"), "{message}");
    let (status, reason, _) = condition(&s, "b2", "Scheduled").expect("still placed");
    assert_eq!(
        (status, reason.as_str()),
        (pb::ConditionStatus::True, "Placed")
    );
    let (status, reason, _) = condition(&s, "a1", "Scheduled").expect("waiting");
    assert_eq!(
        (status, reason.as_str()),
        (pb::ConditionStatus::False, "WaitingForPreemption")
    );
    preempted(&mut s, "n1", "b2");
    assert_eq!(state(&s, "b2"), SessionState::Preempted);
    assert_eq!(condition(&s, "b2", "Preempting"), None);
    assert_eq!(condition(&s, "b2", "Scheduled"), None);
}
