//! The enforcer against an in-memory kernel: no root, no BPF, no cgroupfs.

use gpuwarden_agent_common::maps::{CgroupDeviceKey, quota_flags};
use gpuwarden_types::target::TargetScope;

use super::*;
use crate::{
    devices::ProcessMemory,
    enforcement::{
        cgroup_tree::CgroupTree,
        confinement::{PodLookup, PodNamespaces},
        fake::FakeKernel,
        kernel::Pinned,
        quota::{ComputePolicy, DeviceQuota, MemoryPolicy},
        suspend::{Refusal, Suspended},
    },
    sensor::MemoryTier,
};
use gpuwarden_agent_common::event::{Event, action, kind};

const GIB: u64 = 1 << 30;
const ROOT: &str = "/cg";

struct Rig {
    fake: FakeKernel,
    enforcer: Enforcer,
    upward: mpsc::Receiver<pb::EnforcementEvent>,
}

fn rig(timeout: Duration) -> Rig {
    let fake = FakeKernel::default();
    fake.cgroups.mkdir(ROOT);
    let (tx, upward) = mpsc::channel(64);
    let tree = CgroupTree::new(ROOT.into(), Box::new(fake.cgroups.clone()));
    let enforcer = Enforcer::new(fake.kernel(), tree, tx, timeout, None);
    Rig {
        fake,
        enforcer,
        upward,
    }
}

fn spec(session: &str, path: &str, policy: MemoryPolicy) -> QuotaSpec {
    QuotaSpec {
        session_id: session.into(),
        target: Target::CgroupPath(path.into()),
        // Test cgroups are no workload's: an admin's explicit word binds them.
        scope: TargetScope::admin(true),
        memory_policy: policy,
        compute_policy: ComputePolicy::Hard,
        devices: vec![DeviceQuota {
            index: 0,
            shares_ppm: 500_000,
            memory_bytes: 2 * GIB,
            mig: None,
        }],
    }
}

impl Rig {
    fn actions(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(e) = self.upward.try_recv() {
            out.push(e.action);
        }
        out
    }

    fn state(&self, session: &str) -> Option<BindState> {
        self.enforcer
            .standing()
            .bindings
            .into_iter()
            .find(|b| b.session_id == session)
            .map(|b| b.state)
    }
}

#[test]
fn the_cross_check_acts_only_on_what_the_decoder_missed() {
    let gib = 1 << 30;
    // Under the limit by both counts: nothing.
    assert!(!missed_by_decoder(2 * gib, gib, gib));
    // Over by NVML, and the kernel side saw it too: the tracepoint acted already.
    assert!(!missed_by_decoder(2 * gib, 3 * gib, 3 * gib));
    // Over by NVML only: the decoder missed an allocation path.
    assert!(missed_by_decoder(2 * gib, gib, 3 * gib));
    // Exactly at the limit is allowed.
    assert!(!missed_by_decoder(2 * gib, gib, 2 * gib));
}

#[test]
fn a_quota_binds_its_cgroup_and_children_and_counts_what_they_held() {
    let mut r = rig(Duration::from_mins(1));
    let job = r.fake.cgroups.mkdir("/cg/job");
    let child = r.fake.cgroups.mkdir("/cg/job/worker");
    // The child held 64 MiB on GPU 0 before the bind.
    r.fake.cgroup_memory.0.lock().unwrap().insert(
        CgroupDeviceKey {
            cgroup: child,
            device: 0,
            kind: 0,
        },
        64 << 20,
    );
    r.enforcer.apply(spec("s-1", "/job", MemoryPolicy::Kill));

    assert_eq!(r.state("s-1"), Some(BindState::Bound));
    let quota = r
        .fake
        .quotas
        .at(&job)
        .expect("quota written at the bound cgroup");
    assert_eq!(quota.limit[0], 2 * GIB);
    assert_eq!(quota.devices, 1);
    assert_eq!(quota.flags, quota_flags::DEVICES);
    assert_eq!(quota.used[0], 64 << 20);
    assert_eq!(r.fake.cgroup_quota.at(&job), Some(job));
    assert_eq!(r.fake.cgroup_quota.at(&child), Some(job));
    assert!(r.fake.devices.attached.lock().unwrap().contains(&job));
    assert_eq!(r.actions(), ["bound"]);
    let (dir, bound) = r.enforcer.session_cgroup("s-1").unwrap();
    assert_eq!((dir, bound), (PathBuf::from("/cg/job"), true));

    // A container appears later below it: mapped at the next reconcile.
    let late = r.fake.cgroups.mkdir("/cg/job/late");
    r.enforcer.reconcile();
    assert_eq!(r.fake.cgroup_quota.at(&late), Some(job));
    // The same quota again changes nothing.
    r.enforcer.apply(spec("s-1", "/job", MemoryPolicy::Kill));
    assert!(r.actions().is_empty());
}

#[test]
fn a_quota_whose_cgroup_never_appears_expires() {
    let mut r = rig(Duration::ZERO);
    r.enforcer.apply(spec("s-1", "/absent", MemoryPolicy::Kill));
    assert_eq!(r.state("s-1"), Some(BindState::Expired));
    assert_eq!(r.actions(), ["expired"]);
    let history = r.enforcer.standing().history;
    assert!(history[0].reason.contains("/absent"), "{history:?}");
    // Expired stays expired, even when the cgroup turns up.
    r.fake.cgroups.mkdir("/cg/absent");
    r.enforcer.reconcile();
    assert_eq!(r.state("s-1"), Some(BindState::Expired));
    assert!(r.fake.quotas.len() == 0);
}

#[test]
fn pending_then_bound_then_unbound_when_the_cgroup_goes_then_bound_again() {
    let mut r = rig(Duration::from_mins(1));
    r.enforcer.apply(spec("s-1", "/job", MemoryPolicy::Kill));
    assert_eq!(r.state("s-1"), Some(BindState::Pending));
    assert!(
        r.enforcer
            .session_cgroup("s-1")
            .is_ok_and(|(_, bound)| !bound)
    );

    let job = r.fake.cgroups.mkdir("/cg/job");
    r.enforcer.reconcile();
    assert_eq!(r.state("s-1"), Some(BindState::Bound));

    r.fake.cgroups.rmdir("/cg/job");
    r.enforcer.reconcile();
    assert_eq!(r.state("s-1"), Some(BindState::Pending));
    assert_eq!(r.fake.quotas.at(&job), None);
    assert_eq!(r.fake.cgroup_quota.len(), 0);
    assert!(r.fake.devices.attached.lock().unwrap().is_empty());
    assert_eq!(r.actions(), ["bound", "unbound"]);

    let again = r.fake.cgroups.mkdir("/cg/job");
    r.enforcer.reconcile();
    assert_eq!(r.state("s-1"), Some(BindState::Bound));
    assert!(r.fake.quotas.at(&again).is_some());
}

#[test]
fn release_removes_everything_and_the_managed_cgroup() {
    let mut r = rig(Duration::from_mins(1));
    let mut managed = spec("s-9", "", MemoryPolicy::Kill);
    managed.target = Target::Managed;
    r.enforcer.apply(managed);
    let dir = PathBuf::from("/cg/gpuwarden/s-9");
    let id = r.fake.cgroups.id_of(&dir).expect("managed cgroup made");
    assert_eq!(r.state("s-9"), Some(BindState::Bound));
    assert!(r.fake.quotas.at(&id).is_some());

    r.enforcer.release("s-9");
    assert_eq!(r.state("s-9"), None);
    assert_eq!(r.fake.quotas.len(), 0);
    assert_eq!(r.fake.cgroup_quota.len(), 0);
    assert!(r.fake.devices.attached.lock().unwrap().is_empty());
    assert_eq!(r.fake.cgroups.id_of(&dir), None);
    assert_eq!(r.actions(), ["bound", "unbound"]);
    // Releasing what is not held is a no-op.
    r.enforcer.release("s-9");
    assert!(matches!(
        r.enforcer.session_cgroup("s-9"),
        Err(ControlError::NoSession(_))
    ));
}

#[test]
fn a_sweep_after_a_lost_store_removes_what_no_held_quota_owns() {
    let mut r = rig(Duration::from_mins(1));
    let kept = r.fake.cgroups.mkdir("/cg/kept");
    // An earlier agent left two quotas, their mappings and links; the store only holds one.
    let lost = 77;
    for (cgroup, key) in [(kept, kept), (lost, lost), (lost + 1, lost)] {
        r.fake.cgroup_quota.0.lock().unwrap().insert(cgroup, key);
    }
    for key in [kept, lost] {
        r.fake
            .quotas
            .0
            .lock()
            .unwrap()
            .insert(key, Quota::default());
        r.fake.devices.attached.lock().unwrap().insert(key);
    }
    r.enforcer.apply(spec("held", "/kept", MemoryPolicy::Kill));
    r.enforcer.sweep_stale();

    assert!(r.fake.quotas.at(&kept).is_some());
    assert_eq!(r.fake.quotas.at(&lost), None);
    assert_eq!(r.fake.cgroup_quota.at(&lost), None);
    assert_eq!(r.fake.cgroup_quota.at(&(lost + 1)), None);
    assert_eq!(r.fake.cgroup_quota.at(&kept), Some(kept));
    assert_eq!(
        *r.fake.devices.attached.lock().unwrap(),
        BTreeSet::from([kept])
    );
}

#[test]
fn the_nvml_cross_check_acts_once_per_crossing_by_policy() {
    let mut r = rig(Duration::from_mins(1));
    let job = r.fake.cgroups.mkdir("/cg/job");
    r.fake.cgroups.put(4242, "/job");
    r.fake.cgroups.put(4243, "/job");
    r.fake.cgroups.put(1, "/");
    r.enforcer.apply(spec("s-1", "/job", MemoryPolicy::Stop));
    r.actions();
    let sample = |pid, bytes| ProcessMemory {
        index: 0,
        pid,
        bytes,
    };
    // Under the limit: nothing. A process outside the workload is not counted.
    r.enforcer
        .cross_check(&[sample(4242, GIB), sample(1, 10 * GIB)]);
    assert!(r.fake.signals.sent.lock().unwrap().is_empty());

    // Over by NVML (1.5 + 1 GiB, listed twice counts once), not by the kernel: the largest
    // process is stopped.
    let over = [
        sample(4242, GIB + GIB / 2),
        sample(4242, GIB + GIB / 2),
        sample(4243, GIB),
    ];
    r.enforcer.cross_check(&over);
    assert_eq!(
        *r.fake.signals.sent.lock().unwrap(),
        [(4242, libc::SIGSTOP)]
    );
    assert_eq!(r.actions(), ["stop"]);
    // Still over: not again.
    r.enforcer.cross_check(&over);
    assert_eq!(r.fake.signals.sent.lock().unwrap().len(), 1);
    // Back under, then over again: a new crossing.
    r.enforcer.cross_check(&[sample(4242, GIB)]);
    r.enforcer.cross_check(&over);
    assert_eq!(r.fake.signals.sent.lock().unwrap().len(), 2);

    // The kernel side saw it (its count is over too): the tracepoint acted, not the check.
    let mut quota = r.fake.quotas.at(&job).unwrap();
    quota.used[0] = 3 * GIB;
    r.fake.quotas.0.lock().unwrap().insert(job, quota);
    r.enforcer.cross_check(&[sample(4242, GIB)]);
    r.enforcer.cross_check(&over);
    assert_eq!(r.fake.signals.sent.lock().unwrap().len(), 2);

    // Resume by request: only processes of a bound workload.
    assert_eq!(
        r.enforcer.signal(&Pinned::unpinned(4242), true).unwrap(),
        "s-1"
    );
    assert_eq!(
        r.fake.signals.sent.lock().unwrap().last(),
        Some(&(4242, libc::SIGCONT))
    );
    assert!(matches!(
        r.enforcer.signal(&Pinned::unpinned(1), false),
        Err(ControlError::NotBound(1))
    ));
}

/// A user's quota: no explicit word, no grants.
fn users(session: &str, target: Target) -> QuotaSpec {
    QuotaSpec {
        target,
        scope: TargetScope::default(),
        ..spec(session, "/unused", MemoryPolicy::Kill)
    }
}

#[test]
fn a_quota_never_binds_the_root_a_system_slice_or_a_cgroup_another_session_binds() {
    let mut r = rig(Duration::from_mins(1));
    let pod = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod123e4567_e89b_12d3_a456_426614174000.slice";
    r.fake.cgroups.mkdir(format!("/cg{pod}"));
    r.fake.cgroups.mkdir("/cg/kubepods.slice");
    r.fake.cgroups.mkdir("/cg/system.slice");
    r.fake.cgroups.mkdir("/cg/h1victim.slice");

    // Even an admin's explicit word binds neither the root nor a system slice.
    for (session, path) in [
        ("root", "/"),
        ("all-pods", "/kubepods.slice"),
        ("system", "/system.slice"),
    ] {
        r.enforcer.apply(spec(session, path, MemoryPolicy::Kill));
        assert_eq!(r.state(session), Some(BindState::Refused), "{path}");
    }
    // A slice that is no workload's needs that word.
    r.enforcer.apply(users(
        "victim",
        Target::CgroupPath("/h1victim.slice".into()),
    ));
    assert_eq!(r.state("victim"), Some(BindState::Refused));
    let reasons: Vec<String> = r
        .enforcer
        .standing()
        .history
        .iter()
        .map(|h| h.reason.clone())
        .collect();
    assert!(reasons[0].contains("cgroup root"), "{reasons:?}");
    assert!(
        reasons[1].contains("/kubepods.slice is a system cgroup"),
        "{reasons:?}"
    );
    assert!(reasons[3].contains("not a container's"), "{reasons:?}");
    assert_eq!(r.actions(), ["refused"; 4]);
    assert_eq!(r.fake.quotas.len(), 0, "nothing reached the kernel side");

    // The pod binds; a second quota on the same pod, or on the slice above it, does not.
    r.enforcer.apply(spec("pod", pod, MemoryPolicy::Kill));
    assert_eq!(r.state("pod"), Some(BindState::Bound));
    r.enforcer.apply(spec("again", pod, MemoryPolicy::Kill));
    assert_eq!(r.state("again"), Some(BindState::Refused));
    let last = r.enforcer.standing().history.last().cloned().unwrap();
    // It says why without naming the other session (whose owner may be another tenant).
    assert!(
        last.reason
            .contains("overlaps a workload another session holds a quota on")
            && !last.reason.contains("session pod"),
        "{}",
        last.reason
    );
    // Above or below another session's cgroup is refused the same way.
    r.fake.cgroups.mkdir("/cg/job/worker");
    r.enforcer.apply(spec("job", "/job", MemoryPolicy::Kill));
    assert_eq!(r.state("job"), Some(BindState::Bound));
    r.enforcer
        .apply(spec("worker", "/job/worker", MemoryPolicy::Kill));
    assert_eq!(r.state("worker"), Some(BindState::Refused));
    assert_eq!(r.fake.quotas.len(), 2);
}

#[test]
fn a_users_pod_binds_only_in_a_granted_namespace() {
    struct Pods;
    impl PodNamespaces for Pods {
        fn lookup(&self, uid: &str) -> PodLookup {
            match uid {
                "123e4567-e89b-12d3-a456-426614174000" => PodLookup::Known {
                    namespace: "team-a".into(),
                    name: "train-0".into(),
                },
                "223e4567-e89b-12d3-a456-426614174000" => PodLookup::Known {
                    namespace: "team-b".into(),
                    name: "victim".into(),
                },
                _ => PodLookup::Unknown,
            }
        }
    }
    let mut r = rig(Duration::from_mins(1));
    r.enforcer = std::mem::replace(
        &mut r.enforcer,
        Enforcer::new(
            r.fake.kernel(),
            CgroupTree::new(ROOT.into(), Box::new(r.fake.cgroups.clone())),
            mpsc::channel(1).0,
            Duration::from_mins(1),
            None,
        ),
    )
    .with_rules(Rules::new(None, Box::new(Pods)));
    for uid in [
        "123e4567_e89b_12d3_a456_426614174000",
        "223e4567_e89b_12d3_a456_426614174000",
        "323e4567_e89b_12d3_a456_426614174000",
    ] {
        r.fake
            .cgroups
            .mkdir(format!("/cg/kubepods.slice/kubepods-pod{uid}.slice"));
    }
    let alice = |session: &str, uid: &str| QuotaSpec {
        scope: TargetScope {
            namespaces: vec!["team-a".into()],
            ..TargetScope::default()
        },
        ..users(session, Target::PodUid(uid.into()))
    };
    r.enforcer
        .apply(alice("mine", "123e4567-e89b-12d3-a456-426614174000"));
    assert_eq!(r.state("mine"), Some(BindState::Bound));
    r.enforcer
        .apply(alice("theirs", "223e4567-e89b-12d3-a456-426614174000"));
    assert_eq!(r.state("theirs"), Some(BindState::Refused));
    let last = r.enforcer.standing().history.last().cloned().unwrap();
    // It names what alice named and was granted, nothing of the other tenant's pod.
    assert!(
        last.reason.contains("223e4567") && last.reason.contains("team-a"),
        "{}",
        last.reason
    );
    assert!(
        !last.reason.contains("team-b") && !last.reason.contains("victim"),
        "{}",
        last.reason
    );
    // A pod the kubelet has not reported yet waits for it.
    r.enforcer
        .apply(alice("unknown", "323e4567-e89b-12d3-a456-426614174000"));
    assert_eq!(r.state("unknown"), Some(BindState::Pending));
}

#[test]
fn a_flood_of_workload_events_is_counted_not_sent_one_by_one() {
    let mut r = rig(Duration::from_mins(1));
    let job = r.fake.cgroups.mkdir("/cg/job");
    r.enforcer.apply(spec("s-1", "/job", MemoryPolicy::Report));
    assert_eq!(r.actions(), ["bound"]);
    let over = Event {
        kind: kind::QUOTA_EXCEEDED,
        cgroup: job,
        code: action::REPORT,
        bytes: 1 << 20,
        used: 2 * GIB,
        limit: 2 * GIB,
        ..Event::default()
    };
    for _ in 0..10_000 {
        r.enforcer
            .on_kernel_event(&over, MemoryTier::TracepointSignal);
    }
    // The burst goes up; the rest is counted (the loop takes well under the refill time of
    // 10,000 events, so most are held back whatever the machine's speed).
    let sent = r.actions().len();
    assert!(
        (20..1_000).contains(&sent),
        "{sent} sent (burst {EVENT_BURST})"
    );
    let standing = r.enforcer.standing();
    assert_eq!(standing.suppressed_events, 10_000 - sent as u64);
    assert!(standing.history.len() <= HISTORY);
    // The next event that goes names what was held back.
    std::thread::sleep(Duration::from_millis(300));
    r.enforcer
        .on_kernel_event(&over, MemoryTier::TracepointSignal);
    let last = r.enforcer.standing().history.last().cloned().unwrap();
    assert!(
        last.reason.contains("more like it from this session"),
        "{}",
        last.reason
    );
}

/// Where the node has the driver's own limit, binding sets it for every GPU of the quota with a
/// memory limit, the binding reports that tier, and unbinding lifts it.
#[test]
fn the_drivers_own_limit_is_set_on_bind_and_lifted_on_release() {
    let fake = FakeKernel::default();
    fake.cgroups.mkdir(ROOT);
    let driver = crate::enforcement::fake::FakeDriverLimits::default();
    let mut kernel = fake.kernel();
    kernel.driver_limits = Some(Box::new(driver.clone()));
    let (tx, _upward) = mpsc::channel(64);
    let tree = CgroupTree::new(ROOT.into(), Box::new(fake.cgroups.clone()));
    let mut enforcer = Enforcer::new(kernel, tree, tx, Duration::from_mins(1), None);
    fake.cgroups.mkdir("/cg/job");
    let mut quota = spec("s-1", "/job", MemoryPolicy::Kill);
    // A compute-only part has no memory limit to hand the driver.
    quota.devices.push(DeviceQuota {
        index: 1,
        shares_ppm: 500_000,
        memory_bytes: 0,
        mig: None,
    });
    enforcer.apply(quota);
    let dir = PathBuf::from("/cg/job");
    assert_eq!(*driver.set.lock().unwrap(), [(dir.clone(), 0, 2 * GIB)]);
    let report = enforcer.standing().bindings.remove(0);
    assert_eq!(report.driver_tier, Some("driver_dmem"));

    enforcer.release("s-1");
    assert_eq!(*driver.lifted.lock().unwrap(), [(dir, 0)]);
}

#[test]
fn a_stopped_workload_is_held_once_it_has_stopped_and_stopped_again_if_continued() {
    let mut r = rig(Duration::from_mins(1));
    let job = r.fake.cgroups.mkdir("/cg/job");
    r.enforcer.apply(spec("s-1", "/job", MemoryPolicy::Stop));
    assert_eq!(r.actions(), ["bound"]);
    let stop = Event {
        kind: kind::QUOTA_EXCEEDED,
        cgroup: job,
        code: action::STOP,
        tgid: 42,
        bytes: 1 << 20,
        used: 2 * GIB,
        limit: 2 * GIB,
        ..Event::default()
    };
    // Still on its way to stopping (or continued from inside): signalled again, not held, since
    // a cgroup frozen before the stop settles leaves the process asleep rather than stopped.
    r.fake.signals.running.lock().unwrap().insert(42);
    r.enforcer
        .on_kernel_event(&stop, MemoryTier::TracepointSignal);
    r.enforcer.reconcile();
    assert_eq!(r.actions(), ["stop"]);
    assert_eq!(*r.fake.signals.sent.lock().unwrap(), [(42, libc::SIGSTOP)]);
    // Stopped: held, once.
    r.fake.signals.running.lock().unwrap().clear();
    r.enforcer.reconcile();
    r.enforcer.reconcile();
    assert_eq!(r.actions(), ["hold"]);
}

/// A bound session with processes 41 (in its cgroup) and 42 (in a child cgroup).
fn preemptible_rig() -> Rig {
    let mut r = rig(Duration::from_mins(1));
    r.fake.cgroups.mkdir("/cg/job");
    r.fake.cgroups.mkdir("/cg/job/worker");
    {
        let mut procs = r.fake.cgroups.procs.lock().unwrap();
        procs.insert("/cg/job".into(), vec![41]);
        procs.insert("/cg/job/worker".into(), vec![42]);
    }
    r.enforcer.apply(spec("s", "/job", MemoryPolicy::Kill));
    assert_eq!(r.state("s"), Some(BindState::Bound));
    r.actions();
    r
}

#[test]
fn a_preemption_signals_the_workload_and_kills_it_at_the_deadline() {
    let mut r = preemptible_rig();
    r.enforcer
        .preempt("s", Duration::from_secs(30), "yields to t (reclaim)");
    let sent = r.fake.signals.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 2);
    assert!(
        sent.iter().all(|&(_, sig)| sig == libc::SIGTERM),
        "{sent:?}"
    );
    assert_eq!(r.actions(), ["preempt"]);
    // Before the deadline, with processes left, nothing more happens.
    r.enforcer.advance_preemptions(Instant::now());
    assert!(r.fake.cgroups.killed.lock().unwrap().is_empty());
    assert_eq!(r.state("s"), Some(BindState::Bound));
    // A second preempt of the same session changes nothing.
    r.enforcer.preempt("s", Duration::ZERO, "again");
    assert!(r.actions().is_empty());
    // At the deadline: cgroup.kill on the bound cgroup, the quota released, `preempted` up.
    r.enforcer
        .advance_preemptions(Instant::now() + Duration::from_secs(31));
    assert_eq!(
        *r.fake.cgroups.killed.lock().unwrap(),
        [PathBuf::from("/cg/job")]
    );
    assert_eq!(r.state("s"), None);
    assert!(r.fake.cgroup_quota.0.lock().unwrap().is_empty());
    assert_eq!(r.actions(), ["unbound", "preempted"]);
}

#[test]
fn without_cgroup_kill_each_process_gets_sigkill() {
    let mut r = preemptible_rig();
    *r.fake.cgroups.no_kill_file.lock().unwrap() = true;
    r.enforcer.preempt("s", Duration::ZERO, "yields");
    r.enforcer.advance_preemptions(Instant::now());
    let kills: Vec<u32> = r
        .fake
        .signals
        .sent
        .lock()
        .unwrap()
        .iter()
        .filter(|&&(_, sig)| sig == libc::SIGKILL)
        .map(|&(pid, _)| pid)
        .collect();
    assert_eq!(kills.len(), 2);
    assert!(kills.contains(&41) && kills.contains(&42));
    assert_eq!(r.state("s"), None);
}

#[test]
fn a_workload_that_ends_within_the_grace_is_not_killed() {
    let mut r = preemptible_rig();
    r.enforcer.preempt("s", Duration::from_secs(30), "yields");
    // Its processes exit on SIGTERM.
    r.fake.cgroups.procs.lock().unwrap().clear();
    r.enforcer.advance_preemptions(Instant::now());
    assert!(r.fake.cgroups.killed.lock().unwrap().is_empty());
    assert_eq!(r.state("s"), None);
    let actions = r.actions();
    assert_eq!(actions.last().map(String::as_str), Some("preempted"));
}

#[test]
fn a_session_with_nothing_bound_is_preempted_at_once() {
    let mut r = rig(Duration::from_mins(1));
    // Its cgroup never appeared: the quota waits, nothing to signal.
    r.enforcer.apply(spec("s", "/absent", MemoryPolicy::Kill));
    r.enforcer.preempt("s", Duration::from_secs(30), "yields");
    assert!(r.fake.signals.sent.lock().unwrap().is_empty());
    assert_eq!(r.state("s"), None);
    assert_eq!(r.actions(), ["preempted"]);
    // Nor a session it holds no quota for at all.
    r.enforcer
        .preempt("unknown", Duration::from_secs(30), "yields");
    assert_eq!(r.actions(), ["preempted"]);
}

#[test]
fn a_share_deviation_goes_up_and_into_the_history_and_touches_nothing() {
    let mut r = rig(Duration::from_mins(1));
    r.fake.cgroups.mkdir("/cg/job");
    r.fake.cgroups.put(4242, "/job");
    r.enforcer.apply(spec("s-1", "/job", MemoryPolicy::Stop));
    r.actions();
    r.enforcer.share_deviation(
        "s-1",
        "/job".into(),
        "below_entitled: achieved 0.100 of entitled 0.500 compute share for 300s".into(),
    );
    let sent: Vec<pb::EnforcementEvent> = std::iter::from_fn(|| r.upward.try_recv().ok()).collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].action, "share_deviation");
    assert_eq!(sent[0].session_id, "s-1");
    assert_eq!(sent[0].container, "/job");
    assert!(sent[0].reason.starts_with("below_entitled"), "{sent:?}");
    let history = r.enforcer.standing().history;
    assert_eq!(
        history.last().map(|h| h.action.as_str()),
        Some("share_deviation")
    );
    assert!(r.fake.signals.sent.lock().unwrap().is_empty());
    // A session this node no longer holds: nothing.
    r.enforcer
        .share_deviation("gone", "/other".into(), "below_entitled".into());
    assert!(r.actions().is_empty());
}

/// [`preemptible_rig`] with a checkpoint helper configured (never run: the tests play its
/// outcomes).
fn suspendable_rig() -> Rig {
    let mut r = preemptible_rig();
    let enforcer = std::mem::replace(
        &mut r.enforcer,
        Enforcer::new(
            r.fake.kernel(),
            CgroupTree::new(ROOT.into(), Box::new(r.fake.cgroups.clone())),
            mpsc::channel(1).0,
            Duration::from_mins(1),
            None,
        ),
    );
    r.enforcer = enforcer.with_suspend(Some(crate::enforcement::SuspendConfig {
        helper: crate::checkpoint::helper::Helper {
            program: "/nonexistent/helper".into(),
            library: None,
        },
        step_timeout: Duration::from_secs(1),
        host_reserve: 0,
    }));
    r
}

#[test]
fn without_a_helper_a_suspension_is_a_kill() {
    let mut r = preemptible_rig();
    assert!(
        r.enforcer
            .begin_suspend("s", Duration::from_secs(30), "for t")
            .is_none()
    );
    assert_eq!(r.actions(), ["preempt"]);
    let sent = r.fake.signals.sent.lock().unwrap().clone();
    assert!(sent.iter().all(|&(_, sig)| sig == libc::SIGTERM) && sent.len() == 2);
}

#[test]
fn a_suspension_is_reported_then_resumed_once() {
    let mut r = suspendable_rig();
    let job = r
        .enforcer
        .begin_suspend("s", Duration::from_secs(30), "for t")
        .expect("a job");
    assert_eq!(job.dir, PathBuf::from("/cg/job"));
    assert_eq!(r.actions(), ["suspend"]);
    // Under way: neither a second suspension nor a resumption starts.
    assert!(
        r.enforcer
            .begin_suspend("s", Duration::ZERO, "again")
            .is_none()
    );
    assert!(r.enforcer.begin_resume("s").is_none());
    r.enforcer.end_suspend(
        "s",
        Ok(Suspended {
            pids: vec![41],
            took: Duration::from_millis(5),
        }),
    );
    assert_eq!(r.actions(), ["suspended"]);
    assert!(r.fake.signals.sent.lock().unwrap().is_empty(), "no signal");
    let job = r.enforcer.begin_resume("s").expect("a resumption");
    assert_eq!(job.pids, [41]);
    assert!(r.enforcer.begin_resume("s").is_none(), "one at a time");
    r.enforcer.end_resume("s", Ok(Duration::from_millis(3)));
    assert_eq!(r.actions(), ["resuming", "resumed"]);
    assert_eq!(r.state("s"), Some(BindState::Bound));
}

#[test]
fn a_resume_the_agent_does_not_remember_asks_the_driver() {
    // Suspended by an earlier agent: this one has no record, and resumes what is bound.
    let mut r = suspendable_rig();
    let job = r.enforcer.begin_resume("s").expect("a resumption");
    assert_eq!(job.dir, PathBuf::from("/cg/job"));
    assert_eq!(r.actions(), ["resuming"]);
    r.enforcer.end_resume("s", Ok(Duration::from_millis(3)));
    assert_eq!(r.actions(), ["resumed"]);
    // Nothing bound: nothing to resume.
    assert!(r.enforcer.begin_resume("unknown").is_none());
}

#[test]
fn a_refused_suspension_takes_the_kill_path_and_says_why() {
    let mut r = suspendable_rig();
    r.enforcer
        .begin_suspend("s", Duration::from_secs(30), "for t")
        .expect("a job");
    r.actions();
    r.enforcer.end_suspend(
        "s",
        Err(Refusal {
            pid: 41,
            source: crate::checkpoint::CheckpointError::Driver {
                function: "cuCheckpointProcessCheckpoint",
                pid: 41,
                code: crate::checkpoint::CuResult::NOT_SUPPORTED,
            },
        }),
    );
    assert_eq!(r.actions(), ["suspend_refused", "preempt"]);
    let sent = r.fake.signals.sent.lock().unwrap().clone();
    assert!(sent.iter().all(|&(_, sig)| sig == libc::SIGTERM) && sent.len() == 2);
    let history = r.enforcer.standing().history;
    let refused = history
        .iter()
        .find(|h| h.action.as_str() == "suspend_refused")
        .unwrap();
    assert!(
        refused.reason.contains("CUDA_ERROR_NOT_SUPPORTED (801)"),
        "{}",
        refused.reason
    );
}

#[test]
fn a_session_released_while_suspended_is_killed() {
    let mut r = suspendable_rig();
    r.enforcer
        .begin_suspend("s", Duration::from_secs(30), "for t")
        .expect("a job");
    r.enforcer.end_suspend(
        "s",
        Ok(Suspended {
            pids: vec![41],
            took: Duration::ZERO,
        }),
    );
    r.enforcer.release("s");
    assert_eq!(
        *r.fake.cgroups.killed.lock().unwrap(),
        [PathBuf::from("/cg/job")]
    );
    assert_eq!(r.state("s"), None);
}

/// `quota` on MIG instance index 3 of GPU 1 alone (1 GiB), with capability nodes 84 and 85.
fn on_instance(mut quota: QuotaSpec) -> QuotaSpec {
    quota.devices = vec![DeviceQuota {
        index: 3,
        shares_ppm: 1_000_000,
        memory_bytes: GIB,
        mig: Some(crate::enforcement::quota::MigAccess {
            node_minor: 1,
            cap_minors: vec![84, 85],
        }),
    }];
    quota
}

#[test]
fn a_quota_on_a_mig_instance_opens_its_parent_and_its_capability_nodes_only() {
    let mut r = rig(Duration::from_mins(1));
    let job = r.fake.cgroups.mkdir("/cg/job");
    let quota = on_instance(spec("s-1", "/job", MemoryPolicy::Kill));
    r.enforcer.apply(quota);
    let kernel = r.fake.quotas.at(&job).unwrap();
    assert_eq!(kernel.devices, 1 << 1, "the parent's node, not nvidia3");
    assert_eq!(kernel.limit[3], GIB, "the limit is the instance's");
    assert_eq!(
        r.fake.devices.caps.lock().unwrap().get(&job),
        Some(&vec![84, 85])
    );
    r.enforcer.release("s-1");
    assert!(r.fake.devices.caps.lock().unwrap().is_empty());
}

#[test]
fn the_nvml_cross_check_acts_on_an_instance_quota_by_the_instances_count() {
    let mut r = rig(Duration::from_mins(1));
    let job = r.fake.cgroups.mkdir("/cg/job");
    r.fake.cgroups.put(4242, "/job");
    let quota = on_instance(spec("s-1", "/job", MemoryPolicy::Kill));
    r.enforcer.apply(quota);
    r.actions();
    let on = |index| {
        [ProcessMemory {
            index,
            pid: 4242,
            bytes: 2 * GIB,
        }]
    };
    // The kernel side counted half a GiB on the instance.
    let mut kernel = r.fake.quotas.at(&job).unwrap();
    kernel.used[3] = GIB / 2;
    r.fake.quotas.0.lock().unwrap().insert(job, kernel);
    // NVML's 2 GiB counted on the parent GPU is not the instance's: no quota there.
    r.enforcer.cross_check(&on(1));
    assert!(r.fake.signals.sent.lock().unwrap().is_empty());
    assert!(r.actions().is_empty());
    // Counted on the instance: over its limit, which the decoder did not see: killed.
    r.enforcer.cross_check(&on(3));
    assert_eq!(
        *r.fake.signals.sent.lock().unwrap(),
        [(4242, libc::SIGKILL)]
    );
    assert_eq!(r.actions(), ["kill"]);
    // Once the kernel side's count of the instance is over too, the check leaves it to the
    // tracepoint.
    r.enforcer.cross_check(&on(1));
    kernel.used[3] = 3 * GIB;
    r.fake.quotas.0.lock().unwrap().insert(job, kernel);
    r.enforcer.cross_check(&on(3));
    assert_eq!(r.fake.signals.sent.lock().unwrap().len(), 1);
}

/// Issue 38: a suspended session asked to resume on another GPU. Nothing moves until the
/// driver's version is known: an older driver leaves the quota on the GPU it left
/// (`resume_refused`), still suspended; a driver with GPU pairs gets the quota moved to the new
/// GPU (its device rule and limit there) before the resumption starts, with the pairs.
#[test]
fn a_move_to_another_gpu_waits_for_the_driver_then_moves_the_quota() {
    use crate::{
        checkpoint::{CheckpointError, GpuPair},
        enforcement::suspend::Move,
    };
    let mut r = suspendable_rig();
    r.enforcer
        .begin_suspend("s", Duration::from_secs(30), "for t")
        .expect("a job");
    r.enforcer.end_suspend(
        "s",
        Ok(Suspended {
            pids: vec![41],
            took: Duration::from_millis(5),
        }),
    );
    r.actions();
    let mut moved = spec("s", "/job", MemoryPolicy::Kill);
    moved.devices[0].index = 1;
    let pairs = vec![GpuPair {
        old: "GPU-00000000-0000-0000-0000-000000000000".into(),
        new: "GPU-00000000-0000-0000-0000-000000000001".into(),
    }];
    let moving = Move {
        spec: moved,
        pairs: pairs.clone(),
    };
    let job = r.fake.cgroups.mkdir("/cg/job");
    let devices_now = |r: &Rig| r.fake.quotas.at(&job).expect("a quota").devices;

    r.enforcer
        .begin_move("s", moving.clone())
        .expect("a driver check");
    // Under way: neither a plain resumption nor a second move starts.
    assert!(r.enforcer.begin_resume("s").is_none());
    assert!(r.enforcer.begin_move("s", moving.clone()).is_none());
    let old = CheckpointError::NoGpuPairs {
        driver_version: 12_080,
    };
    assert!(r.enforcer.end_move_check("s", Err(old)).is_none());
    assert_eq!(r.actions(), ["resume_refused"]);
    assert_eq!(devices_now(&r), 1, "the quota stays on GPU 0");

    r.enforcer.begin_move("s", moving).expect("a driver check");
    let resumption = r
        .enforcer
        .end_move_check("s", Ok(13_000))
        .expect("a resumption");
    assert_eq!(resumption.pairs, pairs);
    assert_eq!(devices_now(&r), 1 << 1, "the quota is on GPU 1 now");
    // Its limit there; GPU 0 is outside the quota's devices (the bit above), whatever its slot.
    assert_eq!(r.fake.quotas.at(&job).unwrap().limit[1], 2 * GIB);
    assert_eq!(r.actions(), ["unbound", "bound", "resuming"]);
    r.enforcer.end_resume("s", Ok(Duration::from_millis(3)));
    assert_eq!(r.actions(), ["resumed"]);
}

#[test]
fn suspensions_under_way_count_against_the_host_memory_check() {
    let mut r = suspendable_rig();
    let other = r.fake.cgroups.mkdir("/cg/other");
    r.fake
        .cgroups
        .procs
        .lock()
        .unwrap()
        .insert("/cg/other".into(), vec![43]);
    // Each holds 1 GiB of GPU memory: what a suspension copies to host memory. "s" is bound
    // already (its quota's count set); "u" counts what its cgroup held when it binds.
    let job = r.fake.cgroups.id_of("/cg/job").unwrap();
    r.fake.quotas.0.lock().unwrap().get_mut(&job).unwrap().used[0] = GIB;
    r.fake.cgroup_memory.0.lock().unwrap().insert(
        CgroupDeviceKey {
            cgroup: other,
            device: 0,
            kind: 0,
        },
        GIB,
    );
    let scratch = tempfile::tempdir().unwrap();
    let meminfo = scratch.path().join("meminfo");
    // 2.5 GiB available, 1 GiB of it reserved: room for one suspension's bytes, not two.
    std::fs::write(
        &meminfo,
        format!("MemAvailable: {} kB\n", 5 * GIB / 2 / 1024),
    )
    .unwrap();
    let mut config = r.enforcer.suspend.clone().unwrap();
    config.host_reserve = GIB;
    r.enforcer = std::mem::replace(
        &mut r.enforcer,
        Enforcer::new(
            r.fake.kernel(),
            CgroupTree::new(ROOT.into(), Box::new(r.fake.cgroups.clone())),
            mpsc::channel(1).0,
            Duration::from_mins(1),
            None,
        ),
    )
    .with_suspend(Some(config))
    .with_meminfo(meminfo);
    r.enforcer.apply(spec("u", "/other", MemoryPolicy::Kill));
    assert_eq!(r.actions(), ["bound"]);

    let first = r
        .enforcer
        .begin_suspend("s", Duration::from_secs(30), "for t");
    assert!(first.is_some(), "{:?}", r.actions());
    assert_eq!(r.actions(), ["suspend"]);
    // While the first copies out, a second would take the host below its reserve.
    assert!(
        r.enforcer
            .begin_suspend("u", Duration::from_secs(30), "for t")
            .is_none()
    );
    let events = r.upward.try_recv().unwrap();
    assert_eq!(events.action, "preempt");
    assert!(events.reason.contains("under way"), "{}", events.reason);
}
