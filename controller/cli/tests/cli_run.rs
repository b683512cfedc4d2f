//! `gpuwarden run` end to end: a real controller on loopback gRPC, a fake agent on its stream
//! (registers one GPU, acks every allocation, reports one enforcement event) and a fake agent
//! socket that hands out a cgroup this test made under the cgroup v2 root.
//!
//! The end-to-end test needs root and a cgroup v2 mount: it is `#[ignore = "needs root"]`
//! (`cargo xtask test` runs it) and fails without them, saying so.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex},
    time::Duration,
};

use gpuwarden_controller::{
    scheduler::{
        SchedulerConfig,
        quotas::{QueueQuota, QuotaConfig},
    },
    slots::ResourceSlot,
};
use gpuwarden_proto::v1 as pb;
use gpuwarden_test_support::{
    TestCgroup,
    cli::{self, fake_agent_socket, wait_for_node},
    wait::{self, PATIENCE},
};
use tokio_stream::StreamExt;

const NODE: &str = "node-run";

/// The agent's confirmation of a release (issue 40): the session ends TERMINATED.
fn released(session_id: String) -> pb::agent_message::Msg {
    pb::agent_message::Msg::Event(pb::EnforcementEvent {
        session_id,
        action: "released".into(),
        reason: "released: its quota is no longer enforced".into(),
        ..Default::default()
    })
}

/// Registers one GPU, acks every `Allocate` (kept in `seen`) and reports one event for it. A
/// `Preempt` it answers as the agent does a workload that ends on SIGTERM: SIGTERM to every
/// process of `cgroup` (where the agent socket puts each session), then `preempted`.
async fn fake_agent(url: String, seen: Arc<Mutex<Vec<pb::Allocate>>>, cgroup: PathBuf) {
    let kind = |k: pb::SlotKind| i32::from(k);
    let (tx, mut inbound) = gpuwarden_test_support::node::connect(
        &url,
        pb::NodeInfo {
            node_id: NODE.into(),
            hostname: NODE.into(),
            slot_types: [
                ("cpu", pb::SlotKind::Count),
                ("mem", pb::SlotKind::Bytes),
                ("cuda.shares", pb::SlotKind::Count),
                ("cuda.mem", pb::SlotKind::Bytes),
            ]
            .iter()
            .map(|(name, k)| pb::SlotType {
                name: (*name).into(),
                kind: kind(*k),
            })
            .collect(),
            capacity: Some(pb::ResourceSlot {
                values: [
                    ("cpu".into(), "8".into()),
                    ("mem".into(), "34359738368".into()),
                ]
                .into_iter()
                .collect(),
            }),
            devices: vec![pb::Device {
                uuid: "GPU-fake-0".into(),
                model: "Fake".into(),
                memory_bytes: 16 << 30,
                sm_count: 132,
                index: 0,
                device_node: "/dev/nvidia0".into(),
                ..Default::default()
            }],
            agent_version: "test".into(),
            ..Default::default()
        },
    )
    .await;
    let heartbeat = |seq| pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Heartbeat(pb::Heartbeat {
            node_id: NODE.into(),
            seq,
            running_sessions: vec![],
        })),
    };
    let beat = tx.clone();
    tokio::spawn(async move {
        for seq in 1.. {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if beat.send(heartbeat(seq)).await.is_err() {
                return;
            }
        }
    });
    let send = |msg| tx.send(pb::AgentMessage { msg: Some(msg) });
    while let Some(Ok(message)) = inbound.next().await {
        let a = match message.msg {
            Some(pb::controller_message::Msg::Allocate(a)) => a,
            Some(pb::controller_message::Msg::Preempt(p)) => {
                terminate_all(&cgroup).await;
                let _ = send(pb::agent_message::Msg::Event(pb::EnforcementEvent {
                    session_id: p.session_id,
                    action: "preempted".into(),
                    reason: format!("preempted ({}): the workload ended", p.reason),
                    container: "managed".into(),
                    ..Default::default()
                }))
                .await;
                continue;
            }
            Some(pb::controller_message::Msg::Release(r)) => {
                let _ = send(released(r.session_id)).await;
                continue;
            }
            _ => continue,
        };
        let session_id = a.session_id.clone();
        seen.lock().expect("not poisoned").push(a);
        let _ = send(pb::agent_message::Msg::Ack(pb::AllocationAck {
            session_id: session_id.clone(),
        }))
        .await;
        let _ = send(over_its_limit(session_id)).await;
    }
}

/// The one event the fake agent reports for a session: over its limit on GPU 0.
fn over_its_limit(session_id: String) -> pb::agent_message::Msg {
    pb::agent_message::Msg::Event(pb::EnforcementEvent {
        session_id,
        action: "report".into(),
        reason: "over its GPU-memory limit".into(),
        container: "managed".into(),
        pid: 4242,
        device: 0,
        requested_bytes: 1 << 30,
        used_bytes: 5 << 30,
        limit_bytes: 4 << 30,
        at_ms: 1_700_000_000_000,
        device_index: Some(0),
        action_kind: pb::EnforcementAction::Report.into(),
        move_interrupted: false,
    })
}

/// SIGTERM to every process in `cgroup`, then waits until none is left.
async fn terminate_all(cgroup: &Path) {
    let procs = || {
        std::fs::read_to_string(cgroup.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse::<i32>().ok())
            .collect::<Vec<_>>()
    };
    for pid in procs() {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    while !procs().is_empty() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn gpuwarden(url: &str, args: &[&str]) -> std::process::Output {
    cli::command(url, &[])
        .args(args)
        .output()
        .expect("gpuwarden runs")
}

#[test]
#[ignore = "needs root"]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn run_puts_the_command_in_the_session_cgroup_and_ends_the_session() {
    gpuwarden_test_support::require_root();
    let cgroup = TestCgroup::create(&format!("gpuwarden-test-run-{}", std::process::id()));
    let scratch = gpuwarden_test_support::scratch("run");
    let scratch = scratch.path();
    let socket = scratch.join("agent.sock");
    fake_agent_socket(&socket, NODE, cgroup.dir.clone());

    let ctl =
        gpuwarden_test_support::controller::TestController::builder(&scratch.join("controller"))
            .start();
    let (rt, url) = (gpuwarden_test_support::controller::runtime(), ctl.url());
    let seen = Arc::new(Mutex::new(Vec::new()));
    rt.spawn(fake_agent(
        url.clone(),
        Arc::clone(&seen),
        cgroup.dir.clone(),
    ));
    wait_for_node(&url, NODE);

    let socket_arg = socket.to_string_lossy().into_owned();
    let out = gpuwarden(
        &url,
        &[
            "run",
            "-r",
            "cuda.shares=0.5",
            "--memory-policy",
            "report",
            "--compute-policy",
            "work-conserving",
            "--agent-socket",
            &socket_arg,
            "--",
            "sh",
            "-c",
            "cat /proc/self/cgroup; exit 7",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(7),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(
        stdout.lines().any(|l| l == format!("0::{}", cgroup.path)),
        "the command ran outside {}: {stdout}",
        cgroup.path
    );

    let allocates = seen.lock().expect("not poisoned").clone();
    // Only the first run's: later runs add their own.
    let [allocate] = allocates.as_slice() else {
        panic!("expected one Allocate, got {allocates:?}");
    };
    assert_eq!(
        allocate.target.as_ref().and_then(|t| t.kind.clone()),
        Some(pb::target::Kind::Managed(true))
    );
    assert_eq!(
        allocate.policy,
        Some(pb::QuotaPolicy {
            memory: "report".into(),
            compute: "work-conserving".into(),
            // The controller fills the enums beside the strings (issue 40).
            memory_policy: pb::MemoryPolicy::Report.into(),
            compute_policy: pb::ComputePolicy::WorkConserving.into(),
        })
    );

    let shown = gpuwarden(&url, &["--json", "session", "show", &allocate.session_id]);
    assert!(shown.status.success(), "{shown:?}");
    let json: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("JSON");
    assert_eq!(json["state"], "terminated", "{json}");
    assert_eq!(json["node"], NODE, "{json}");
    assert_eq!(
        json["target"],
        serde_json::json!({"kind": "managed", "value": null})
    );
    assert_eq!(
        json["policy"],
        serde_json::json!({"memory": "report", "compute": "work-conserving"})
    );
    let events = json["events"].as_array().expect("an events list");
    // The workload's event, then its agent's confirmation of the release (issue 40).
    assert_eq!(events.len(), 2, "{json}");
    assert_eq!(events[0]["action"], "report");
    assert_eq!(events[0]["pid"], 4242);
    assert_eq!(events[0]["limit_bytes"], 4u64 << 30);
    // GPU 0 is told apart from no GPU.
    assert_eq!(events[0]["device"], 0, "{json}");
    assert_eq!(events[1]["action"], "released");
    assert_eq!(events[1]["device"], serde_json::Value::Null, "{json}");

    let human = gpuwarden(&url, &["session", "show", &allocate.session_id]);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("target:    managed") && human.contains("over its GPU-memory limit"),
        "{human}"
    );

    // A command killed by a signal exits 128 + the signal; one that can't start, 127; both
    // end their session.
    let run = |cmd: &[&str]| {
        let mut args = vec![
            "run",
            "-r",
            "cuda.shares=0.5",
            "--agent-socket",
            &socket_arg,
            "--",
        ];
        args.extend_from_slice(cmd);
        Command::new(env!("CARGO_BIN_EXE_gpuwarden"))
            .args(args)
            .env("GPUWARDEN_CONTROLLER", &url)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("gpuwarden starts")
    };
    let killed = run(&["sh", "-c", "kill -KILL $$"])
        .wait_with_output()
        .expect("waited");
    assert_eq!(killed.status.code(), Some(128 + 9), "{killed:?}");
    let missing = run(&["/nonexistent/gpuwarden-test-cmd"])
        .wait_with_output()
        .expect("waited");
    assert_eq!(missing.status.code(), Some(127), "{missing:?}");
    // SIGTERM to gpuwarden is passed on to the command, and the session still ends. Sent once
    // the command runs (a SIGTERM while starting ends the session too, but runs nothing).
    let sleeper = run(&["sleep", "300"]);
    wait::until("gpuwarden run to start sleep", PATIENCE, || {
        runs_child(sleeper.id(), "sleep")
    });
    let pid = i32::try_from(sleeper.id()).expect("a pid");
    // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let started = std::time::Instant::now();
    let termed = sleeper.wait_with_output().expect("waited");
    assert_eq!(termed.status.code(), Some(128 + 15), "{termed:?}");
    assert!(
        started.elapsed() < Duration::from_mins(1),
        "sleep was not terminated"
    );
    let listed = gpuwarden(&url, &["--json", "session", "ls"]);
    let sessions: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    let sessions = sessions.as_array().expect("a list");
    assert_eq!(sessions.len(), 4, "{sessions:?}");
    for s in sessions {
        assert_eq!(s["state"], "terminated", "{s}");
    }

    rt.shutdown_background();
    drop(cgroup);
}

/// A `run` of a team that borrows the only GPU, and the team guaranteed it asks: the controller
/// preempts the run's session, its command gets SIGTERM, and `run` says so on stderr, naming
/// whom it yielded to, and exits 75 (`PREEMPTED_EXIT`) rather than the command's own status;
/// the session ends `preempted` and the lender's runs.
#[test]
#[ignore = "needs root"]
fn a_preempted_run_says_so_and_exits_75() {
    gpuwarden_test_support::require_root();
    let cgroup = TestCgroup::create(&format!("gpuwarden-test-preempt-{}", std::process::id()));
    let scratch = gpuwarden_test_support::scratch("preempt");
    let scratch = scratch.path();
    let socket = scratch.join("agent.sock");
    fake_agent_socket(&socket, NODE, cgroup.dir.clone());
    let lab = QueueQuota {
        guaranteed: ResourceSlot::parse_any(&["cuda.shares=1"]).expect("a slot"),
        limit: None,
    };
    let config = SchedulerConfig {
        quotas: QuotaConfig {
            queues: [("lab".to_owned(), lab)].into(),
            members: BTreeMap::new(),
        },
        preemption_grace_ms: 5_000,
        ..SchedulerConfig::default()
    };
    let ctl =
        gpuwarden_test_support::controller::TestController::builder(&scratch.join("controller"))
            .config(config)
            .start();
    let (rt, url) = (gpuwarden_test_support::controller::runtime(), ctl.url());
    rt.spawn(fake_agent(
        url.clone(),
        Arc::new(Mutex::new(Vec::new())),
        cgroup.dir.clone(),
    ));
    wait_for_node(&url, NODE);

    let socket_arg = socket.to_string_lossy().into_owned();
    let borrower = Command::new(env!("CARGO_BIN_EXE_gpuwarden"))
        .args(["run", "--owner", "burst", "-r", "cuda.shares=1"])
        .args(["--agent-socket", &socket_arg, "--", "sleep", "300"])
        .env("GPUWARDEN_CONTROLLER", &url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("gpuwarden starts");
    wait::until("gpuwarden run to start sleep", PATIENCE, || {
        runs_child(borrower.id(), "sleep")
    });
    let created = gpuwarden(
        &url,
        &[
            "--json",
            "session",
            "create",
            "--owner",
            "lab",
            "-r",
            "cuda.shares=1",
        ],
    );
    assert!(created.status.success(), "{created:?}");
    let lender: serde_json::Value = serde_json::from_slice(&created.stdout).expect("JSON");
    let lender = lender["id"].as_str().expect("an id").to_owned();

    let out = borrower.wait_with_output().expect("waited");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "stderr: {stderr}");
    // (That it is being preempted is said as well when the command outlives the moment.)
    assert!(stderr.contains("was preempted"), "{stderr}");
    assert!(
        stderr.contains(&lender),
        "names whom it yielded to: {stderr}"
    );
    wait::until("the lender to run", PATIENCE, || {
        let shown = gpuwarden(&url, &["--json", "session", "show", &lender]);
        serde_json::from_slice::<serde_json::Value>(&shown.stdout)
            .is_ok_and(|s| s["state"] == "running")
    });
    let listed = gpuwarden(&url, &["--json", "session", "ls", "--owner", "burst"]);
    let sessions: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("JSON");
    assert_eq!(sessions[0]["state"], "preempted", "{sessions}");

    rt.shutdown_background();
    drop(cgroup);
}

/// A controller whose one GPU a running session holds whole, its fake agent, and a fake agent
/// socket: a `run` or `session create` asking for any share of a GPU waits there for good. The
/// third item holds the controller and its scratch directory.
fn a_full_node() -> (tokio::runtime::Runtime, String, impl Sized, String) {
    let scratch = gpuwarden_test_support::scratch("full");
    let socket = scratch.path().join("agent.sock");
    fake_agent_socket(&socket, NODE, scratch.path().to_owned());
    let ctl = gpuwarden_test_support::controller::TestController::builder(
        &scratch.path().join("controller"),
    )
    .start();
    let (rt, url) = (gpuwarden_test_support::controller::runtime(), ctl.url());
    rt.spawn(fake_agent(
        url.clone(),
        Arc::new(Mutex::new(Vec::new())),
        scratch.path().to_owned(),
    ));
    wait_for_node(&url, NODE);
    let holder =
        gpuwarden_test_support::cli::json(&url, &["session", "create", "-r", "cuda.shares=1"]);
    let holder = holder["id"].as_str().expect("an id").to_owned();
    wait::until("the first session to run", PATIENCE, || {
        gpuwarden_test_support::cli::json(&url, &["session", "show", &holder])["state"] == "running"
    });
    let socket = socket.to_string_lossy().into_owned();
    (rt, url, (ctl, scratch), socket)
}

/// `gpuwarden` with `args`, its stderr read line by line as it comes (each line with the time
/// it came, counted from the start) into the returned channel.
fn spawn_watched(
    url: &str,
    args: &[&str],
) -> (
    std::process::Child,
    std::sync::mpsc::Receiver<(Duration, String)>,
) {
    let mut child = cli::command(url, &[])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("gpuwarden starts");
    let stderr = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel();
    let started = std::time::Instant::now();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if tx.send((started.elapsed(), line)).is_err() {
                return;
            }
        }
    });
    (child, rx)
}

/// The sessions of the controller at `url` in `state`.
fn sessions_in(url: &str, state: &str) -> Vec<serde_json::Value> {
    let all = gpuwarden_test_support::cli::json(url, &["session", "ls"]);
    all.as_array()
        .expect("a list")
        .iter()
        .filter(|s| s["state"] == state)
        .cloned()
        .collect()
}

/// The first stderr line naming the controller's reason: it must come within `within` of the
/// start, and name the reason `session show` gives.
fn reason_said(
    url: &str,
    lines: &std::sync::mpsc::Receiver<(Duration, String)>,
    within: Duration,
) -> (String, String) {
    let deadline = std::time::Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok((at, line)) = lines.recv_timeout(left) else {
            panic!("no reason on stderr within {within:?}; it said: {seen:?}");
        };
        seen.push(line.clone());
        let pending = sessions_in(url, "pending");
        let [waiting] = pending.as_slice() else {
            continue;
        };
        let reason = waiting["reason"].as_str().unwrap_or_default().to_owned();
        if !reason.is_empty() && line.contains(&reason) {
            assert!(at <= within, "said after {at:?}: {line}");
            let id = waiting["id"].as_str().expect("an id").to_owned();
            assert!(line.contains(&id), "names the session: {line}");
            return (id, reason);
        }
    }
}

/// A `run` that can't be placed says why on stderr, in the controller's words, within seconds;
/// at `--timeout` it exits 124 naming the reason, and its session is gone.
#[test]
fn a_waiting_run_says_why_and_its_timeout_ends_the_session() {
    let (rt, url, _scratch, socket) = a_full_node();
    let (child, lines) = spawn_watched(
        &url,
        &[
            "run",
            "-r",
            "cuda.shares=0.5",
            "--timeout",
            "6",
            "--agent-socket",
            &socket,
            "--",
            "true",
        ],
    );
    let (id, reason) = reason_said(&url, &lines, Duration::from_secs(4));
    let out = child.wait_with_output().expect("waited");
    // Until the reader meets the end of stderr: it may still hold the last line.
    let rest: Vec<String> = lines.iter().map(|(_, l)| l).collect();
    assert_eq!(out.status.code(), Some(124), "{rest:?}");
    let last = rest.last().cloned().unwrap_or_default();
    assert!(
        last.contains("did not start within 6s") && last.contains(&reason),
        "the timeout names the reason: {rest:?}"
    );
    assert_eq!(
        gpuwarden_test_support::cli::json(&url, &["session", "show", &id])["state"],
        "terminated"
    );
    rt.shutdown_background();
}

/// Ctrl-C while `run` waits ends the session it created (and exits 130, as SIGINT does).
#[test]
fn ctrl_c_while_run_waits_ends_its_session() {
    let (rt, url, _scratch, socket) = a_full_node();
    let (child, lines) = spawn_watched(
        &url,
        &[
            "run",
            "-r",
            "cuda.shares=0.5",
            "--timeout",
            "60",
            "--agent-socket",
            &socket,
            "--",
            "true",
        ],
    );
    let (id, _) = reason_said(&url, &lines, Duration::from_secs(4));
    let pid = i32::try_from(child.id()).expect("a pid");
    // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let out = child.wait_with_output().expect("waited");
    assert_eq!(out.status.code(), Some(128 + 2));
    assert_eq!(
        gpuwarden_test_support::cli::json(&url, &["session", "show", &id])["state"],
        "terminated"
    );
    rt.shutdown_background();
}

/// `session create --wait` says what it waits for the same way; its `--timeout` exits 124
/// naming the reason and leaves the session queued (it was asked for, not run).
#[test]
fn create_wait_says_why_and_times_out_leaving_the_session() {
    let (rt, url, _scratch, _socket) = a_full_node();
    let (child, lines) = spawn_watched(
        &url,
        &[
            "session",
            "create",
            "-r",
            "cuda.shares=0.5",
            "--wait",
            "--timeout",
            "3",
        ],
    );
    let (id, reason) = reason_said(&url, &lines, Duration::from_secs(3));
    let out = child.wait_with_output().expect("waited");
    // Until the reader meets the end of stderr: it may still hold the last line.
    let rest: Vec<String> = lines.iter().map(|(_, l)| l).collect();
    assert_eq!(out.status.code(), Some(124), "{rest:?}");
    assert!(rest.last().is_some_and(|l| l.contains(&reason)), "{rest:?}");
    assert_eq!(
        gpuwarden_test_support::cli::json(&url, &["session", "show", &id])["state"],
        "pending"
    );
    rt.shutdown_background();
}

/// Ctrl-C stops `session create --wait` but not the session: it stays queued, and stderr says
/// how to end it.
#[test]
fn ctrl_c_stops_create_wait_and_leaves_the_session() {
    let (rt, url, _scratch, _socket) = a_full_node();
    let (child, lines) = spawn_watched(
        &url,
        &["session", "create", "-r", "cuda.shares=0.5", "--wait"],
    );
    let (id, _) = reason_said(&url, &lines, Duration::from_secs(4));
    let pid = i32::try_from(child.id()).expect("a pid");
    // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let out = child.wait_with_output().expect("waited");
    let rest: Vec<String> = lines.iter().map(|(_, l)| l).collect();
    assert_eq!(out.status.code(), Some(128 + 2), "{rest:?}");
    assert!(
        rest.iter()
            .any(|l| l.contains(&format!("gpuwarden session rm {id}"))),
        "{rest:?}"
    );
    assert_eq!(
        gpuwarden_test_support::cli::json(&url, &["session", "show", &id])["state"],
        "pending"
    );
    rt.shutdown_background();
}

/// On a terminal (script(1) gives `run` one) the wait is a single status line redrawn in place
/// with the reason, cleared before the timeout's message: no line per redraw.
#[test]
fn on_a_terminal_the_wait_is_one_status_line() {
    let (rt, url, _scratch, socket) = a_full_node();
    let command = format!(
        "stty cols 200; GPUWARDEN_CONTROLLER={url} {} run -r cuda.shares=0.5 --timeout 3 \
         --agent-socket {socket} -- true",
        env!("CARGO_BIN_EXE_gpuwarden")
    );
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
        .expect("script(1) runs");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(124), "{shown:?}");
    let redraw = "\r\x1b[2K";
    let draws: Vec<&str> = shown.split(redraw).skip(1).collect();
    assert!(draws.len() > 3, "redrawn as it waits: {shown:?}");
    let (last, status) = draws.split_last().expect("drawn");
    assert!(
        status
            .iter()
            .all(|d| d.contains("pending: no node fits cuda.shares=0.5") && !d.contains('\n')),
        "every redraw one line, with the reason: {shown:?}"
    );
    assert!(
        last.starts_with("gpuwarden: session") && last.contains("did not start within 3s"),
        "the status line is cleared before the timeout is said: {shown:?}"
    );
    rt.shutdown_background();
}

#[test]
fn run_with_an_agent_but_no_controller_exits_1_naming_the_controller() {
    let scratch = gpuwarden_test_support::scratch("noctl");
    let socket = scratch.path().join("agent.sock");
    fake_agent_socket(&socket, NODE, scratch.path().to_owned());
    let out = gpuwarden(
        "http://127.0.0.1:9",
        &[
            "run",
            "-r",
            "cuda.shares=0.5",
            "--agent-socket",
            &socket.to_string_lossy(),
            "--",
            "true",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("controller") && stderr.contains("http://127.0.0.1:9"),
        "{stderr}"
    );
}

/// Whether process `pid` has a child running `comm` (its threads' `children` lists: the thread
/// that forked lists the child).
fn runs_child(pid: u32, comm: &str) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("children")).ok())
        .flat_map(|children| {
            children
                .split_whitespace()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .any(|child| {
            std::fs::read_to_string(format!("/proc/{child}/comm"))
                .is_ok_and(|name| name.trim() == comm)
        })
}
