//! Quotas enforced on the real kernel: a controller on loopback gRPC places sessions whose quotas
//! bind to test cgroups; synthetic GPU clients in those cgroups allocate through the fake driver
//! and open device nodes, and the eBPF programs act on them.

// Test helpers fail loudly on anything unexpected.
#![expect(
    clippy::unwrap_used,
    reason = "a test's helpers unwrap: a failure there is the test failing"
)]

use std::{
    os::unix::process::ExitStatusExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use gpuwarden_agent_api::{
    Request, Response, Signalled, client,
    snapshot::{Container, Snapshot},
};
use gpuwarden_proto::v1 as pb;
use gpuwarden_test_support::{
    TestCgroup,
    agent::{self, TestAgent, memory, pin_dir, used},
    devnode::{mknod, mknod_in, open_in},
    ids::container_id,
    require_root, scratch, wait,
};
use gpuwarden_tests::harness::{self, Client, rig::Rig};

const MIB: u64 = 1 << 20;

fn cgroup_target(cg: &TestCgroup) -> pb::target::Kind {
    pb::target::Kind::CgroupPath(cg.path.clone())
}

fn actions(c: &Container) -> u64 {
    c.enforcement.as_ref().map_or(0, |e| e.actions)
}

/// Opens a client on GPU 0 of the fake driver: returns (client handle, device handle).
fn gpu0(client: &mut Client) -> (u64, u64) {
    let h = client.value("client", "client");
    let dev = client.value(&format!("device {h:#x} 0"), "handle");
    (h, dev)
}

/// Under the limit allocations pass and count; the one that would cross it gets the process
/// killed (tracepoint tier here) with an event; once its bytes are released the container
/// allocates up to the limit again.
#[test]
#[ignore = "needs root"]
fn crossing_the_memory_limit_kills_and_the_container_recovers() {
    require_root();
    let rig = Rig::start("qkill");
    let cg = TestCgroup::create(&format!("/system.slice/docker-{}.scope", container_id("k")));
    let session = rig.session(
        &["cuda.shares=0.5", "cuda.mem=16m"],
        cgroup_target(&cg),
        "kill",
    );
    let snap = rig.wait_binding(&session.id, "bound");
    assert_eq!(snap.memory_tier.as_deref(), Some("tracepoint_signal"));

    let mut a = Client::spawn(&rig.driver.dir, Some(&cg));
    let (h, dev) = gpu0(&mut a);
    a.ok(&format!("alloc {h:#x} {dev:#x} 4m"));
    a.ok(&format!("alloc {h:#x} {dev:#x} 8m"));
    let c = rig.entry(&cg);
    assert_eq!(c.session_id.as_deref(), Some(session.id.as_str()));
    let quota = c.quota.as_ref().unwrap();
    assert_eq!(
        (quota.memory_bytes, quota.policy.as_str()),
        (16 * MIB, "kill")
    );
    assert_eq!(used(&c), 12 * MIB);
    assert_eq!(memory(&c, "nvidia0"), 12 * MIB);
    assert_eq!(actions(&c), 0);

    // 12 + 8 > 16: killed at the ioctl.
    a.send_only(&format!("alloc {h:#x} {dev:#x} 8m"));
    let status = a.wait();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    rig.wait_for("the kill to be recorded", |r| {
        r.agent()
            .container(&cg.path)
            .is_some_and(|c| c.events.iter().any(|e| e.action == "kill"))
    });
    let c = rig.entry(&cg);
    let kill = c.events.iter().find(|e| e.action == "kill").unwrap();
    assert_eq!(
        (kill.requested_bytes, kill.used_bytes, kill.limit_bytes),
        (8 * MIB, 12 * MIB, 16 * MIB)
    );
    assert_eq!(kill.device, Some(0));
    assert_eq!(actions(&c), 1);
    // The process's exit released what it held.
    assert_eq!(used(&c), 0);

    // The container allocates again, up to the limit exactly.
    let mut b = Client::spawn(&rig.driver.dir, Some(&cg));
    let (h, dev) = gpu0(&mut b);
    b.ok(&format!("alloc {h:#x} {dev:#x} 16m"));
    let c = rig.entry(&cg);
    assert_eq!(used(&c), 16 * MIB);
    assert_eq!(actions(&c), 1, "an allocation up to the limit was acted on");

    // The action went up the stream to the controller.
    rig.wait_for("the controller to list the kill", |r| {
        r.get(&session.id).events.iter().any(|e| e.action == "kill")
    });
    b.exit();
}

/// The `stop` policy stops the process at the crossing allocation; resuming it by request lets
/// it go on, and after it frees, the container allocates up to the limit without an action.
#[test]
#[ignore = "needs root"]
fn the_stop_policy_stops_and_a_request_resumes() {
    require_root();
    let rig = Rig::start("qstop");
    let cg = TestCgroup::create(&format!("/system.slice/docker-{}.scope", container_id("s")));
    let session = rig.session(
        &["cuda.shares=0.5", "cuda.mem=16m"],
        cgroup_target(&cg),
        "stop",
    );
    rig.wait_binding(&session.id, "bound");

    let mut a = Client::spawn(&rig.driver.dir, Some(&cg));
    let (h, dev) = gpu0(&mut a);
    a.ok(&format!("alloc {h:#x} {dev:#x} 12m"));
    a.send_only(&format!("alloc {h:#x} {dev:#x} 8m"));
    rig.wait_for("the client to be stopped", |_| a.state() == 'T');
    rig.wait_for("the stop to be recorded", |r| {
        r.agent().container(&cg.path).is_some_and(|c| {
            c.events
                .iter()
                .any(|e| e.action == "stop" && e.pid == a.pid)
        })
    });
    // The stop holds: the container's cgroup is frozen, so a `kill -CONT` from inside (sent
    // here from outside, as a sibling in the container would) does not let it run.
    let frozen = |cg: &TestCgroup| {
        std::fs::read_to_string(cg.dir.join("cgroup.events"))
            .is_ok_and(|e| e.lines().any(|l| l == "frozen 1"))
    };
    // Frozen by the agent's hold, not by the throttle's off-time (the share is 0.5): the hold
    // comes on the reconcile tick after every stopped process has stopped.
    rig.wait_for("the agent to hold the stop", |r| {
        r.agent()
            .container(&cg.path)
            .is_some_and(|c| c.events.iter().any(|e| e.action == "hold"))
    });
    rig.wait_for("the container's cgroup to be frozen", |_| frozen(&cg));
    // SAFETY: a signal to the test's own child, by its pid.
    assert_eq!(unsafe { libc::kill(a.pid.cast_signed(), libc::SIGCONT) }, 0);
    // Several of the throttle's periods: nothing thaws it but the agent.
    gpuwarden_test_support::wait::holds(
        "the stopped workload staying frozen after a SIGCONT from inside",
        Duration::from_secs(1),
        || frozen(&cg),
    );

    let answer = rig
        .rt
        .block_on(client::ask(
            &rig.agent().socket,
            &Request::Resume { pid: a.pid },
        ))
        .unwrap();
    assert_eq!(
        answer,
        Response::Signalled(Signalled {
            pid: a.pid,
            session_id: session.id.clone()
        })
    );
    // Stop does not refuse: once resumed, the driver's answer arrives.
    let second = gpuwarden_tests::gpu_client::reply_value(&a.reply(), "handle").unwrap();
    assert_eq!(used(&rig.entry(&cg)), 20 * MIB);
    a.ok(&format!("free {h:#x} {dev:#x} {second:#x}"));
    a.ok(&format!("alloc {h:#x} {dev:#x} 4m"));
    let c = rig.entry(&cg);
    assert_eq!(used(&c), 16 * MIB);
    assert_eq!(actions(&c), 1);
    assert!(c.events.iter().any(|e| e.action == "resume"));

    // Only processes of bound workloads can be signalled through the agent.
    let err = rig
        .rt
        .block_on(client::ask(&rig.agent().socket, &Request::Kill { pid: 1 }))
        .unwrap_err();
    assert!(
        err.to_string().contains("not in a workload with a quota"),
        "{err}"
    );
    a.exit();
}

/// Device nodes made with the NVIDIA major: the allocated GPU and the control node pass the
/// cgroup check (and fail with ENXIO: there is no driver here), the other GPU fails with EPERM.
#[test]
#[ignore = "needs root"]
fn only_the_allocated_gpu_node_opens() {
    require_root();
    let rig = Rig::start("qdev");
    let scratch = scratch("nodes");
    let nodes = scratch.path();
    for (name, minor) in [("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)] {
        mknod(&nodes.join(name), 195, minor);
    }
    let cg = TestCgroup::create(&format!("/system.slice/docker-{}.scope", container_id("d")));
    let session = rig.session(&["cuda.shares=0.5"], cgroup_target(&cg), "");
    rig.wait_binding(&session.id, "bound");
    let mine = session.devices[0].index;
    let other = 1 - mine;

    let open = |name: &str| open_in(&cg, &nodes.join(name));
    assert_eq!(open(&format!("nvidia{mine}")), libc::ENXIO);
    assert_eq!(open("nvidiactl"), libc::ENXIO);
    assert_eq!(open(&format!("nvidia{other}")), libc::EPERM);
    // Making the other GPU's node inside the cgroup is allowed (a runtime creating the nodes of
    // its spec must not fail for a quota that bound meanwhile); opening it is not.
    let made = nodes.join("made").join(format!("nvidia{other}"));
    std::fs::create_dir(made.parent().unwrap()).unwrap();
    assert_eq!(mknod_in(&cg, &made, 195, other), 0);
    assert_eq!(open_in(&cg, &made), libc::EPERM);
    // Outside the bound cgroup nothing changes.
    assert_eq!(
        std::fs::File::open(nodes.join(format!("nvidia{other}")))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ENXIO)
    );

    rig.wait_for("the refusal to be recorded", |r| {
        r.agent().snapshot().containers.iter().any(|c| {
            c.session_id.as_deref() == Some(session.id.as_str())
                && c.enforcement.as_ref().is_some_and(|e| e.denied_opens == 2)
                && c.events
                    .iter()
                    .any(|e| e.action == "device_denied" && e.device == Some(other))
        })
    });

    // Released: the device program lets go.
    rig.rt.block_on(async {
        let mut c = rig.client().await;
        c.terminate_session(pb::TerminateSessionRequest {
            id: session.id.clone(),
        })
        .await
        .unwrap();
    });
    rig.wait_for("the quota to be released", |r| {
        r.agent().snapshot().bindings.is_empty()
    });
    // The binding leaves the snapshot a moment before the device program is detached.
    rig.wait_for("the other GPU node to open again", |_| {
        open(&format!("nvidia{other}")) == libc::ENXIO
    });
}

/// A quota whose cgroup never appears expires with an event the controller sees; quotas the
/// node can't enforce are refused with their reason.
#[test]
#[ignore = "needs root"]
fn a_quota_without_its_cgroup_expires_and_bad_quotas_are_refused() {
    require_root();
    let rig = Rig::start_with_binding_timeout("qexp", Duration::from_secs(1));
    let never = format!("/system.slice/docker-{}.scope", container_id("never-there"));
    let session = rig.session(
        &["cuda.shares=0.5"],
        pb::target::Kind::CgroupPath(never.clone()),
        "",
    );
    rig.wait_binding(&session.id, "expired");
    rig.wait_for("the controller to list the expiry", |r| {
        r.get(&session.id)
            .events
            .iter()
            .any(|e| e.action == "expired" && e.reason.contains(&never))
    });

    // An unknown policy is refused by the controller with the accepted ones.
    let err = rig.rt.block_on(async {
        let mut c = rig.client().await;
        c.create_session(pb::CreateSessionRequest {
            requested: Some(pb::ResourceSlot {
                values: [("cuda.shares".to_owned(), "0.5".to_owned())].into(),
            }),
            target: Some(pb::Target {
                kind: Some(pb::target::Kind::CgroupPath("/x".into())),
            }),
            policy: Some(pb::QuotaPolicy {
                memory: "freeze".into(),
                compute: String::new(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err()
    });
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("freeze"), "{}", err.message());
    // The agent is still serving.
    assert!(rig.agent().try_snapshot().is_ok());
}

/// Whoever asks (here an admin), the agent binds no quota to the cgroup root, over a cgroup
/// another session binds, or to a slice no workload owns without an admin's explicit word: the
/// session fails with the agent's `InvalidQuota` reason, and the first session's workload keeps
/// its quota alone. With the word, the slice binds.
#[test]
#[ignore = "needs root"]
fn the_agent_refuses_the_root_overlaps_and_slices_without_an_admins_word() {
    require_root();
    let rig = Rig::start("qconf");
    let cg = TestCgroup::create(&format!("/system.slice/docker-{}.scope", container_id("o")));
    let first = rig.session(&["cuda.shares=0.25"], cgroup_target(&cg), "kill");
    rig.wait_binding(&first.id, "bound");
    let request = |path: &str, unconfined: bool| pb::CreateSessionRequest {
        requested: Some(pb::ResourceSlot {
            values: [("cuda.shares".to_owned(), "0.25".to_owned())].into(),
        }),
        target: Some(pb::Target {
            kind: Some(pb::target::Kind::CgroupPath(path.into())),
        }),
        unconfined_target: unconfined,
        ..Default::default()
    };
    let again = rig.create(request(&cg.path, false));
    let again = rig.wait_failed(&again.id, "InvalidQuota");
    assert!(
        // Named without the other session: its owner may be another tenant (issue 33).
        again.reason.contains("overlaps") && !again.reason.contains(&first.id),
        "{}",
        again.reason
    );
    let root = rig.create(request("/", true));
    rig.wait_failed(&root.id, "the cgroup root");
    let slice = TestCgroup::create(&format!("/gw-slice-{}", std::process::id()));
    let bare = rig.create(request(&slice.path, false));
    rig.wait_failed(&bare.id, "not a container's");
    let said = rig.create(request(&slice.path, true));
    rig.wait_binding(&said.id, "bound");
    // Only the first and the explicit slice hold quotas; the first's is untouched.
    let snap = rig.agent().snapshot();
    let bound: Vec<&str> = snap
        .bindings
        .iter()
        .filter(|b| b.state == "bound")
        .map(|b| b.session_id.as_str())
        .collect();
    assert_eq!(bound.len(), 2, "{bound:?}");
    assert!(bound.contains(&first.id.as_str()) && bound.contains(&said.id.as_str()));
}

/// `kill -9` the agent: the pinned programs keep enforcing while it is down (an over-limit
/// allocation is still killed), and the restarted agent finds the counters and the event.
#[test]
#[ignore = "needs root"]
#[expect(
    clippy::many_single_char_names,
    reason = "one letter per actor of the scenario"
)]
fn enforcement_outlives_a_killed_agent() {
    require_root();
    let own = OwnAgent::start("qrst");
    let (rig, snapshot) = (&own.rig, || own.snapshot());
    let mut agent = own.spawn_agent();

    let cg = TestCgroup::create(&format!("/system.slice/docker-{}.scope", container_id("r")));
    let session = rig.session(
        &["cuda.shares=0.5", "cuda.mem=16m"],
        cgroup_target(&cg),
        "kill",
    );
    rig.wait_for("the quota to bind", |_| {
        snapshot().is_ok_and(|s| s.bindings.iter().any(|b| b.state == "bound"))
    });
    let mut a = Client::spawn(&rig.driver.dir, Some(&cg));
    let (h, dev) = gpu0(&mut a);
    a.ok(&format!("alloc {h:#x} {dev:#x} 12m"));

    // SIGKILL: no clean-up runs.
    agent.kill9();
    let mut b = Client::spawn(&rig.driver.dir, Some(&cg));
    let (hb, devb) = gpu0(&mut b);
    b.ok(&format!("alloc {hb:#x} {devb:#x} 2m"));
    a.send_only(&format!("alloc {h:#x} {dev:#x} 8m"));
    let killed = a.pid;
    assert_eq!(a.wait().signal(), Some(libc::SIGKILL));

    let mut agent = own.spawn_agent();
    rig.wait_for("the restarted agent to show the quota", |_| {
        snapshot().is_ok_and(|s| {
            s.containers
                .iter()
                .any(|c| c.cgroup_path == cg.path && c.quota.is_some())
        })
    });
    let s = snapshot().unwrap();
    let c = s
        .containers
        .iter()
        .find(|c| c.cgroup_path == cg.path)
        .unwrap();
    // Client b's 2 MiB is all that is held; the killed client's exit released its bytes.
    assert_eq!(used(c), 2 * MIB);
    assert_eq!(memory(c, "nvidia0"), 2 * MIB);
    assert_eq!(actions(c), 1);
    // Counted while the agent was down: a's client, device, 12m, 8m; b's client, device, 2m.
    assert_eq!(agent::ioctls(c, "nvidiactl", "rm_alloc"), 7);
    // The kill happened while no agent ran; its event waited in the pinned ring buffer, and it
    // names the client that was killed, not client b.
    assert!(
        c.events
            .iter()
            .any(|e| e.action == "kill" && e.pid == killed),
        "no kill event for client a (pid {killed}): {:?}",
        c.events
    );
    b.exit();
    agent.kill9();
    let _ = session;
}

/// A child process (an agent, a spinner), killed with SIGKILL when dropped (a failing test
/// leaves none behind).
struct KilledOnDrop(Child);

impl KilledOnDrop {
    /// `kill -9`, and reap it.
    fn kill9(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The agent as its own process (so it can be `kill -9`ed), with its state in `state`.
fn agent_process(rig: &Rig, state: &Path) -> KilledOnDrop {
    let child = Command::new(env!("CARGO_BIN_EXE_agent-under-test"))
        .args(["run", "--node-name", "test-node", "--gpu-devices"])
        .arg(rig.driver.glob())
        .arg("--state-dir")
        .arg(state)
        .arg("--socket")
        .arg(state.join("agent.sock"))
        .arg("--bpf-pin-dir")
        .arg(pin_dir(state))
        .arg("--controller")
        .arg(rig.ctl.url())
        .arg("--mock-devices")
        .arg(&rig.mock)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    KilledOnDrop(child)
}

/// A rig whose agent runs as its own process, so it can be `kill -9`ed for real, with its state
/// (store and pins) in a scratch folder that outlives each agent.
struct OwnAgent {
    rig: Rig,
    state: tempfile::TempDir,
}

impl OwnAgent {
    fn start(tag: &str) -> Self {
        let mut rig = Rig::start(tag);
        drop(rig.agent.take());
        Self {
            rig,
            state: scratch("agents"),
        }
    }

    fn state(&self) -> &Path {
        self.state.path()
    }

    fn pins(&self) -> PathBuf {
        pin_dir(self.state())
    }

    fn snapshot(&self) -> Result<Snapshot, gpuwarden_agent_api::ClientError> {
        self.rig
            .rt
            .block_on(client::snapshot(&self.state().join("agent.sock")))
    }

    /// Starts an agent on the state and waits until it answers.
    fn spawn_agent(&self) -> KilledOnDrop {
        let agent = agent_process(&self.rig, self.state());
        self.rig
            .wait_for("the agent to answer", |_| self.snapshot().is_ok());
        agent
    }
}

impl Drop for OwnAgent {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.pins());
    }
}

/// A restarted agent that no longer holds a session (its store was lost) removes the pinned
/// enforcement it finds for it, instead of leaving the workload limited by nobody's quota.
#[test]
#[ignore = "needs root"]
fn a_restarted_agent_removes_enforcement_it_no_longer_holds() {
    require_root();
    let own = OwnAgent::start("qswp");
    let (rig, snapshot) = (&own.rig, || own.snapshot());
    let device_links = || std::fs::read_dir(own.pins().join("devices")).map_or(0, Iterator::count);
    let mut agent = own.spawn_agent();
    let cg = TestCgroup::create(&format!("/system.slice/docker-{}.scope", container_id("w")));
    rig.session(
        &["cuda.shares=0.5", "cuda.mem=16m"],
        cgroup_target(&cg),
        "kill",
    );
    rig.wait_for("the quota to bind", |_| {
        snapshot().is_ok_and(|s| s.bindings.iter().any(|b| b.state == "bound"))
    });
    assert_eq!(device_links(), 1);

    agent.kill9();
    std::fs::remove_dir_all(own.state().join("store")).unwrap();
    let mut agent = own.spawn_agent();
    assert!(snapshot().unwrap().bindings.is_empty());
    assert_eq!(device_links(), 0, "the stale device link was kept");
    // Past the old limit, and nothing acts.
    let mut a = Client::spawn(&rig.driver.dir, Some(&cg));
    let (h, dev) = gpu0(&mut a);
    a.ok(&format!("alloc {h:#x} {dev:#x} 32m"));
    a.exit();
    agent.kill9();
}

/// An agent killed while its throttle held a tenant frozen, and restarted without its store,
/// thaws the tenant: the throttle marked the cgroup before freezing it, and the new agent finds
/// the mark. Without it nothing would: the store that listed the binding is gone.
#[test]
#[ignore = "needs root"]
fn a_tenant_frozen_by_a_killed_agent_is_thawed_by_the_next_one_without_its_store() {
    require_root();
    let own = OwnAgent::start("qfrz");
    let rig = &own.rig;
    let cg = TestCgroup::create(&format!("/system.slice/docker-{}.scope", container_id("f")));
    let frozen =
        || std::fs::read_to_string(cg.dir.join("cgroup.freeze")).is_ok_and(|s| s.trim() == "1");
    // Killed however the test ends (a frozen spinner left behind would hold the harness's
    // output open).
    let _spinner = KilledOnDrop(
        Command::new("sh")
            .args([
                "-c",
                &format!("echo $$ > {} && while :; do :; done", cg.procs().display()),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut agent = own.spawn_agent();
    rig.session(&["cuda.shares=0.1"], cgroup_target(&cg), "");
    // Held to 0.1, the busy tenant is frozen most of the time: kill the agent in such a moment
    // (it may thaw between the look and the kill; then try again).
    let mut killed_frozen = false;
    for _ in 0..20 {
        rig.wait_for("the throttle to freeze the tenant", |_| frozen());
        agent.kill9();
        if frozen() {
            killed_frozen = true;
            break;
        }
        agent = own.spawn_agent();
    }
    assert!(
        killed_frozen,
        "never killed the agent while the tenant was frozen"
    );
    wait::holds(
        "the tenant left frozen with no agent (nothing but an agent thaws it)",
        Duration::from_millis(300),
        frozen,
    );
    std::fs::remove_dir_all(own.state().join("store")).unwrap();
    let _agent = own.spawn_agent();
    rig.wait_for("the tenant to be thawed", |_| !frozen());
}

/// `gpuwarden run` creates a session pinned to this node, runs the command in the session's
/// cgroup and returns its exit code; the session ends with it.
#[test]
#[ignore = "needs root"]
fn gpuwarden_run_executes_inside_the_bound_cgroup() {
    require_root();
    let rig = Rig::start("qrun");
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwarden-under-test"))
        .arg("--controller")
        .arg(rig.ctl.url())
        .args([
            "run",
            "-r",
            "cuda.shares=0.5",
            "-r",
            "cuda.mem=1g",
            "--agent-socket",
        ])
        .arg(&rig.agent().socket)
        .args(["--", "sh", "-c", "cat /proc/self/cgroup; exit 7"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(7),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("0::"))
        .unwrap_or_else(|| panic!("no cgroup v2 line in {stdout}"));
    let session = line
        .strip_prefix("0::/gpuwarden/")
        .unwrap_or_else(|| panic!("not in a managed cgroup: {line}"));
    rig.wait_for("the session to end", |r| {
        r.get(session).state == pb::SessionState::Terminated as i32
    });
    rig.wait_for("the agent to let go", |r| {
        r.agent().snapshot().bindings.is_empty()
    });
}

/// A bound session's compute share reaches the throttle: a CPU-bound workload (the mock
/// devices' stand-in signal) in a cgroup held to 0.3 is frozen part of the time, and the
/// snapshot reports it.
#[test]
#[ignore = "needs root"]
fn a_compute_share_throttles_the_bound_cgroup() {
    require_root();
    let rig = Rig::start("qthr");
    let cg = TestCgroup::create(&format!("/system.slice/docker-{}.scope", container_id("t")));
    let session = rig.session(&["cuda.shares=0.3"], cgroup_target(&cg), "");
    rig.wait_binding(&session.id, "bound");
    let procs = cg.procs();
    let mut spinner = Command::new("sh")
        .args([
            "-c",
            &format!("echo $$ > {} && while :; do :; done", procs.display()),
        ])
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    // Held to 0.3 it spends about 70 % of its time frozen: once it has been held 600 ms the
    // throttle acted on this cgroup through the binding (however busy the machine is).
    let mut c = None;
    rig.wait_for("the throttle to hold the cgroup frozen 600 ms", |r| {
        let now = r.entry(&cg);
        let held = now
            .enforcement
            .as_ref()
            .is_some_and(|e| e.throttled_ms >= 600);
        c = Some(now);
        held
    });
    let wall_ms = started.elapsed().as_millis();
    let c = c.expect("an entry");
    let gpus = rig.agent().snapshot().gpus;
    let _ = spinner.kill();
    let _ = spinner.wait();
    let e = c.enforcement.expect("enforcement on the bound cgroup");
    // But not all the time: a share of 0.3 runs some of it.
    assert!(
        u128::from(e.throttled_ms) * 100 <= wall_ms * 95,
        "throttled {} ms of {wall_ms} ms at share 0.3",
        e.throttled_ms
    );
    let quota = c.quota.unwrap();
    assert_eq!(quota.compute_policy, "hard");
    // The mock GPU's utilization is the throttle's stand-in: the spinner's running fraction on
    // the GPU of its share, nothing on the other. How much it ran depends on how busy the
    // machine is (0.04 on two loaded cores), so only "some, on the right GPU" is asked here;
    // the share's accuracy is `throttle.rs`'s, judged by the cgroup's own CPU time.
    let bound = &quota.devices[0].device;
    for g in &gpus {
        assert_eq!(g.source, "throttle_stand_in");
        let u = g.utilization.unwrap();
        if &g.device == bound {
            assert!(u > 0.0 && u <= 1.0, "{}: {u}", g.device);
        } else {
            assert!(u.abs() < f64::EPSILON, "{}: {u}", g.device);
        }
    }
    assert_eq!(gpus.len(), 2, "{gpus:?}");
}

/// A quota waits for a container that starts later, binds when its cgroup appears, reports (the
/// `report` policy lets the allocation through), and lets go when the cgroup is removed.
#[test]
#[ignore = "needs root"]
fn a_quota_binds_when_its_container_appears_and_lets_go_when_it_goes() {
    require_root();
    let rig = Rig::start("qlate");
    let id = container_id("late");
    let path = format!("/system.slice/docker-{id}.scope");
    let session = rig.session(
        &["cuda.shares=0.5", "cuda.mem=8m"],
        pb::target::Kind::ContainerId(id.clone()),
        "report",
    );
    rig.wait_binding(&session.id, "pending");

    let cg = TestCgroup::create(&path);
    let snap = rig.wait_binding(&session.id, "bound");
    let b = snap
        .bindings
        .iter()
        .find(|b| b.session_id == session.id)
        .unwrap();
    assert_eq!(b.cgroup_path.as_deref(), Some(path.as_str()));

    let mut a = Client::spawn(&rig.driver.dir, Some(&cg));
    let (h, dev) = gpu0(&mut a);
    a.ok(&format!("alloc {h:#x} {dev:#x} 6m"));
    // Over the limit, reported only: the allocation goes through.
    a.ok(&format!("alloc {h:#x} {dev:#x} 4m"));
    // The event comes through the ring buffer, after the ioctl returned.
    rig.wait_for("the report event", |r| {
        r.entry(&cg).events.iter().any(|e| e.action == "report")
    });
    let c = rig.entry(&cg);
    assert_eq!(used(&c), 10 * MIB);
    let report = c.events.iter().find(|e| e.action == "report").unwrap();
    assert_eq!(
        (report.requested_bytes, report.limit_bytes),
        (4 * MIB, 8 * MIB)
    );
    a.exit();

    drop(cg);
    let snap = rig.wait_binding(&session.id, "pending");
    assert!(
        snap.bindings
            .iter()
            .all(|b| b.session_id != session.id || b.cgroup_path.is_none())
    );
    rig.wait_for("the controller to list the unbinding", |r| {
        r.get(&session.id)
            .events
            .iter()
            .any(|e| e.action == "unbound" && e.reason.contains("removed"))
    });
}

/// An agent that lost its pinned maps and starts after the workload made its client and device
/// handles still charges the workload's later allocations to its quota (the GPU resolved from the
/// node the process holds) and acts on the one that crosses the limit.
#[test]
#[ignore = "needs root"]
fn a_late_agent_still_enforces_the_memory_limit() {
    require_root();
    let mut rig = Rig::start("qlate");
    let cg = TestCgroup::create(&format!("/system.slice/docker-{}.scope", container_id("l")));
    let session = rig.session(
        &["cuda.shares=0.5", "cuda.mem=16m"],
        cgroup_target(&cg),
        "kill",
    );
    rig.wait_binding(&session.id, "bound");
    // The agent goes with its pinned maps (an upgrade that lost them); the workload starts.
    drop(rig.agent.take());
    let mut a = Client::spawn(&rig.driver.dir, Some(&cg));
    let (h, dev) = gpu0(&mut a);
    let cfg = harness::mock_gpu_config(&rig.driver, rig.ctl.url(), rig.state[1].path());
    rig.agent = Some(TestAgent::start_with(cfg));
    rig.wait_binding(&session.id, "bound");

    a.ok(&format!("alloc {h:#x} {dev:#x} 8m"));
    let c = rig.entry(&cg);
    assert_eq!(memory(&c, "nvidia0"), 8 * MIB);
    assert_eq!(used(&c), 8 * MIB, "charged to the quota");
    a.send_only(&format!("alloc {h:#x} {dev:#x} 12m"));
    assert_eq!(a.wait().signal(), Some(libc::SIGKILL));
    let c = rig.entry(&cg);
    assert_eq!(actions(&c), 1);
    assert_eq!(used(&c), 0, "the killed process's bytes are released");
}
