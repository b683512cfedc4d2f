//! Reclaim by preemption end to end (issue 24 §2): a controller with team quotas on loopback
//! gRPC, an agent on two mock GPUs. A team without a guarantee borrows the whole node with two
//! sessions whose quotas bind test cgroups holding real processes; a team guaranteed the node
//! asks, and both borrowers are preempted: the agent sends SIGTERM to their cgroups (a process
//! that traps it writes a file and exits; one that ignores it is killed at the deadline), the
//! sessions end PREEMPTED naming whom they yielded to, and the waiting session then runs on the
//! freed GPUs. No device is ever over-committed meanwhile.

#![expect(
    clippy::unwrap_used,
    reason = "a test's helpers unwrap: a failure there is the test failing"
)]

use std::{
    os::unix::process::ExitStatusExt as _,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use gpuwarden_controller::{scheduler::SchedulerConfig, slots::ResourceSlot, store::StoreSpec};
use gpuwarden_proto::v1 as pb;
use gpuwarden_test_support::{
    Etcd, TestCgroup, agent,
    cluster::{self, assert_not_overcommitted},
    controller::TestController,
    ids::container_id,
    require_root, scratch,
    wait::{PATIENCE, wait_for},
};
use gpuwarden_tests::harness::rig::{self, Rig};

/// Between SIGTERM and the kill.
const GRACE: Duration = Duration::from_secs(3);

/// A shell in a cgroup, killed when dropped (a failing test leaves no process behind).
struct Workload(Child);

impl Workload {
    /// A shell in `cg` that, on SIGTERM, runs `on_term` (`trap`; empty: ignores it). Its
    /// output is not the test's, so no process outlives the test holding the test's pipes.
    fn start(cg: &TestCgroup, on_term: &str) -> Self {
        let mut command = Command::new("sh");
        command
            .args([
                "-c",
                &format!("trap '{on_term}' TERM; while :; do sleep 0.05; done"),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        gpuwarden_runtime::cgroup::spawn_inside(&mut command, &cg.dir).unwrap();
        Self(command.spawn().unwrap())
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        self.0.wait().unwrap()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The enforcement tests' rig with team quotas ([`config`]).
fn start() -> Rig {
    Rig::start_with("preempt", config(), Duration::from_mins(1))
}

/// Team quotas: team `lab` is guaranteed both GPUs; any other owner has no queue, so it only
/// borrows. Preempted workloads get [`GRACE`].
fn config() -> SchedulerConfig {
    SchedulerConfig {
        quotas: cluster::one_team("lab", "2"),
        preemption_grace_ms: u32::try_from(GRACE.as_millis()).unwrap(),
        ..SchedulerConfig::default()
    }
}

/// Creates a session of `owner` for `shares` on the node, bound to `target`; its id. (The rig's
/// own `create` makes every session `t`'s: here the owner decides the queue.)
fn create(rig: &Rig, owner: &str, shares: &str, target: Option<&TestCgroup>) -> String {
    let slots = ResourceSlot::parse_any(&[&format!("cuda.shares={shares}")]).unwrap();
    rig.rt.block_on(async {
        let mut c = rig.client().await;
        c.create_session(pb::CreateSessionRequest {
            requested: Some(gpuwarden_controller::api::convert::slots_to_pb(&slots)),
            owner: owner.into(),
            node_id: "test-node".into(),
            target: target.map(|cg| pb::Target {
                kind: Some(pb::target::Kind::CgroupPath(cg.path.clone())),
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .id
    })
}

fn container_cgroup(seed: &str) -> TestCgroup {
    TestCgroup::create(&format!(
        "/system.slice/docker-{}.scope",
        container_id(seed)
    ))
}

#[test]
#[ignore = "needs root"]
fn a_borrowing_team_is_preempted_and_the_lender_runs_on_its_gpus() {
    require_root();
    let rig = start();
    // `burst` borrows the whole node: two sessions, each a workload in its own cgroup.
    let polite = container_cgroup("polite");
    let stubborn = container_cgroup("stubborn");
    let marker = rig.state[1].path().join("got-sigterm");
    let mut polite_child = Workload::start(
        &polite,
        &format!("echo term > {}; exit 0", marker.display()),
    );
    let mut stubborn_child = Workload::start(&stubborn, "");
    let b1 = create(&rig, "burst", "1", Some(&polite));
    let b2 = create(&rig, "burst", "1", Some(&stubborn));
    for id in [&b1, &b2] {
        agent::wait_binding(rig.agent(), id, "bound");
    }
    wait_for("the borrowers to run", || {
        rig.sessions()
            .iter()
            .all(|s| s.state == pb::SessionState::Running as i32)
    });

    // `lab` asks for the whole node, within its guarantee.
    let asked = Instant::now();
    let a1 = create(&rig, "lab", "2", None);
    wait_for("the lender to run", || {
        let sessions = rig.sessions();
        assert_not_overcommitted(&sessions);
        sessions
            .iter()
            .any(|s| s.id == a1 && s.state == pb::SessionState::Running as i32)
    });
    let took = asked.elapsed();

    // The polite workload got SIGTERM and exited on its own; the stubborn one was killed.
    assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "term");
    assert_eq!(polite_child.wait().code(), Some(0));
    let status = stubborn_child.wait();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    // Within the grace period plus a few passes and agent ticks.
    assert!(
        took >= GRACE,
        "the stubborn workload had its grace: {took:?}"
    );
    assert!(took < GRACE + Duration::from_secs(5), "{took:?}");

    for id in [&b1, &b2] {
        let s = rig.get(id);
        assert_eq!(s.state, pb::SessionState::Preempted as i32, "{s:?}");
        assert!(s.reason.contains(&a1), "{}", s.reason);
        assert!(
            s.events.iter().any(|e| e.action == "preempt"),
            "{:?}",
            s.events
        );
        assert!(s.events.iter().any(|e| e.action == "preempted"));
    }
    // The lender holds both GPUs now, and no one else does.
    let lab = rig.get(&a1);
    assert_eq!(lab.devices.len(), 2, "{lab:?}");
    // Its decisions say whom it preempted, and that it then waited for them.
    let kinds: Vec<&str> = lab.decisions.iter().map(|d| d.kind.as_str()).collect();
    assert_eq!(kinds, ["preempted", "waited"], "{:?}", lab.decisions);
    for id in [&b1, &b2] {
        assert!(lab.decisions[0].detail.contains(id.as_str()));
        let yielded = &rig.get(id).decisions;
        assert!(
            yielded
                .iter()
                .any(|d| d.kind == "yielded" && d.detail.contains(&a1)),
            "{yielded:?}"
        );
    }
    assert_not_overcommitted(&rig.sessions());
}

/// `burst` borrows the whole node with one session whose workload ignores SIGTERM, and `lab`
/// asks for it: returns the workload, the borrower's id and the lender's, once the agent has
/// signalled the workload (the preemption is under way: decided, stored, acted on, not ended).
fn preemption_under_way(rig: &Rig, seed: &str) -> (Workload, TestCgroup, String, String) {
    let cg = container_cgroup(seed);
    let workload = Workload::start(&cg, "");
    let borrower = create(rig, "burst", "2", Some(&cg));
    agent::wait_binding(rig.agent(), &borrower, "bound");
    rig.wait_for("the borrower to run", |r| {
        r.get(&borrower).state == pb::SessionState::Running as i32
    });
    let lender = create(rig, "lab", "2", None);
    rig.wait_for("the agent to signal the borrower's workload", |r| {
        r.get(&borrower)
            .events
            .iter()
            .any(|e| e.action == "preempt")
    });
    (workload, cg, borrower, lender)
}

/// After a controller went away mid-preemption: the borrower ends PREEMPTED naming the lender,
/// which runs on both GPUs, and no device is over-committed on the way.
fn assert_the_preemption_completes(rig: &Rig, borrower: &str, lender: &str) {
    rig.wait_for("the lender to run", |r| {
        let sessions = r.sessions();
        assert_not_overcommitted(&sessions);
        sessions
            .iter()
            .any(|s| s.id == lender && s.state == pb::SessionState::Running as i32)
    });
    let s = rig.get(borrower);
    assert_eq!(s.state, pb::SessionState::Preempted as i32, "{s:?}");
    assert!(s.reason.contains(lender), "{}", s.reason);
    assert!(s.reason.contains("reclaims its guarantee"), "{}", s.reason);
    assert_eq!(rig.get(lender).devices.len(), 2);
    assert_not_overcommitted(&rig.sessions());
}

/// The controller (on sled) is killed once the agent has signalled a preempted workload, and
/// started again on its store only after the agent killed the workload at the deadline: the
/// agent's `preempted` report went to no one, yet nothing decided is lost. The restarted
/// controller still has the borrower being preempted and the lender waiting; the agent's
/// registration no longer lists the borrower, which ends PREEMPTED, and the lender runs.
#[test]
#[ignore = "needs root"]
fn a_controller_killed_mid_preemption_finishes_it_after_a_restart() {
    require_root();
    let mut rig = start();
    let (mut workload, _cg, borrower, lender) = preemption_under_way(&rig, "restart");
    let (addr, dir) = (rig.ctl.addr, rig.state[0].path().to_owned());
    rig.ctl.crash();
    // While no controller runs, the agent ends the workload at the deadline.
    let status = workload.wait();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");

    rig.ctl = TestController::builder(&dir)
        .config(config())
        .timing(rig::timing())
        .addr(addr)
        .start();
    assert_the_preemption_completes(&rig, &borrower, &lender);
}

/// Two controllers on a real etcd; the leader is killed once the agent has signalled a
/// preempted workload. The standby takes over with the same decisions: the agent follows it,
/// the preemption completes there (the workload killed at its deadline) and the lender runs.
#[test]
#[ignore = "needs root"]
fn a_failover_mid_preemption_completes_it_on_the_new_leader() {
    require_root();
    let etcd = Etcd::start();
    let store: StoreSpec = etcd.store_url("preempt").parse().unwrap();
    let ttl = Duration::from_secs(2);
    let first = TestController::elected(&store, ttl)
        .config(config())
        .timing(rig::timing())
        .start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    gpuwarden_test_support::wait::until("the first controller to lead", PATIENCE, || {
        rt.block_on(first.leads())
    });
    let standby = TestController::elected(&store, ttl)
        .config(config())
        .timing(rig::timing())
        .start();
    // The standby first in the agent's list: it is told where the leader is.
    let urls = format!("{},{}", standby.url(), first.url());
    let mut rig = Rig::around(
        "preempt-ha",
        first,
        &urls,
        [scratch("ctl"), scratch("agent")],
        Duration::from_mins(1),
    );
    let (mut workload, _cg, borrower, lender) = preemption_under_way(&rig, "failover");

    std::mem::replace(&mut rig.ctl, standby).kill();
    rig.wait_for("the standby to lead", |r| r.rt.block_on(r.ctl.leads()));
    assert_the_preemption_completes(&rig, &borrower, &lender);
    let status = workload.wait();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
}
