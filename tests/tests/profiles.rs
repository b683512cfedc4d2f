//! Workload profiles learned end to end: a real controller and an agent (mock GPUs, the fake
//! driver, real cgroups and eBPF) with a short usage report interval; `gpuwarden run` runs
//! workloads of a class in the session's cgroup, the agent reports what they used, and when the
//! session ends the controller folds the reports into the class's profile, read back with
//! `gpuwarden profile show CLASS --json`.
//!
//! With mock devices utilization is the stand-in signal (the cgroup's CPU time per wall
//! second), so a CPU spinner is a "busy" workload and a process that sleeps is an idle one.

// Test helpers fail loudly on anything unexpected.
#![expect(
    clippy::unwrap_used,
    reason = "a test's helpers unwrap: a failure there is the test failing"
)]

use std::{
    process::{Command, Output},
    time::{Duration, Instant},
};

use gpuwarden_test_support::{
    agent::TestAgent,
    controller::{TestController, fast_timing},
    require_root, scratch,
    wait::until as wait_for,
};
use gpuwarden_tests::harness::{self, Driver};
use tempfile::TempDir;

/// The agent's usage report interval here (5 s by default).
const REPORT_INTERVAL: Duration = Duration::from_millis(200);

/// A single-threaded CPU spinner for `secs` seconds. It gets a session of its own with a raised
/// priority (as in the throttle tests): other builds share this two-CPU machine, and what is
/// under test is the measurement, not the scheduler.
fn spinner(secs: u32) -> Vec<String> {
    [
        "timeout",
        &secs.to_string(),
        "setsid",
        "nice",
        "-n",
        "-10",
        "sh",
        "-c",
        "echo -10 > /proc/self/autogroup 2>/dev/null; while :; do :; done",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

/// A controller, the fake driver, and an agent reporting usage to the controller.
struct Rig {
    driver: Driver,
    ctl: Option<TestController>,
    ctl_dir: TempDir,
    agent: TestAgent,
    /// The agent's state, removed after it stopped.
    _agent_dir: TempDir,
}

impl Rig {
    fn start() -> Self {
        let driver = Driver::mount("prof");
        let ctl_dir = scratch("ctl");
        let ctl = TestController::builder(ctl_dir.path())
            .timing(fast_timing(Duration::from_secs(5)))
            .start();
        let agent_dir = scratch("agent");
        let mut cfg = harness::mock_gpu_config(&driver, ctl.url(), agent_dir.path());
        cfg.usage_report_interval = Some(REPORT_INTERVAL);
        let agent = TestAgent::start_with(cfg);
        let rig = Self {
            driver,
            ctl: Some(ctl),
            ctl_dir,
            agent,
            _agent_dir: agent_dir,
        };
        wait_for("the node to register", Duration::from_secs(20), || {
            rig.cli(&["node", "ls"])
                .is_ok_and(|nodes| nodes.as_array().is_some_and(|n| n.len() == 1))
        });
        rig
    }

    fn url(&self) -> String {
        self.ctl.as_ref().unwrap().url()
    }

    /// Stops the controller and starts it again on the same store.
    fn restart_controller(&mut self) {
        drop(self.ctl.take());
        self.ctl = Some(
            TestController::builder(self.ctl_dir.path())
                .timing(fast_timing(Duration::from_secs(5)))
                .start(),
        );
    }

    /// `gpuwarden --json ARGS`, parsed; the error output when it fails.
    fn cli(&self, args: &[&str]) -> Result<serde_json::Value, String> {
        let out = Command::new(env!("CARGO_BIN_EXE_gpuwarden-under-test"))
            .arg("--controller")
            .arg(self.url())
            .arg("--json")
            .args(args)
            .output()
            .unwrap();
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("{e}: {out:?}"))
    }

    /// `gpuwarden run --class CLASS -r … [policy…] -- command` on this node.
    fn run(&self, class: &str, args: &[&str], command: &[String]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuwarden-under-test"));
        cmd.arg("--controller")
            .arg(self.url())
            .args(["run", "--class", class, "--agent-socket"])
            .arg(&self.agent.socket)
            .args(args)
            .arg("--")
            .args(command);
        let started = Instant::now();
        let out = cmd.output().unwrap();
        eprintln!(
            "run of class {class} took {:.1} s",
            started.elapsed().as_secs_f64()
        );
        out
    }

    /// The profile of `class` once it has folded `runs` runs.
    fn profile_after(&self, class: &str, runs: u64) -> serde_json::Value {
        let mut last = Err(String::new());
        wait_for(
            &format!("profile {class} with {runs} runs"),
            Duration::from_secs(10),
            || {
                last = self.cli(&["profile", "show", class]);
                last.as_ref().is_ok_and(|p| p["runs"] == runs)
            },
        );
        let p = last.unwrap();
        eprintln!("profile {class}: {p}");
        p
    }
}

fn mean(p: &serde_json::Value) -> f64 {
    p["mean"].as_f64().unwrap()
}

fn samples(p: &serde_json::Value) -> u64 {
    p["samples"].as_u64().unwrap()
}

/// An idle workload that holds GPU memory and issues a steady trickle of ioctls learns a low
/// utilization with its memory and ioctl rate; a spinner learns a high one; a second run of the
/// same class under a hard share of 0.3 moves the profile toward it; profiles outlive a
/// controller restart.
#[test]
#[ignore = "needs root"]
fn profiles_learn_what_sessions_used() {
    require_root();
    let mut rig = Rig::start();

    // Idle: a GPU client that allocates 64 MiB, then asks for the GPU ids every 50 ms for about
    // 2.5 s (about 20 ioctls a second) and otherwise sleeps.
    let mut script = String::from("client\ndevice 0xc1d00001 0\nalloc 0xc1d00001 0xcaf00001 64m\n");
    for _ in 0..50 {
        script.push_str("gpu-ids 0xc1d00001\nsleep 50\n");
    }
    let idle_cmd = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        format!(
            "printf '{}' | {} --dir {}",
            script.replace('\n', "\\n"),
            env!("CARGO_BIN_EXE_gpu-client"),
            rig.driver.dir.display()
        ),
    ];
    let out = rig.run(
        "idle",
        &["-r", "cuda.shares=0.5", "-r", "cuda.mem=1g"],
        &idle_cmd,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !stdout.contains("err"),
        "{out:?}\n{stdout}"
    );
    let idle = rig.profile_after("idle", 1);
    assert!(samples(&idle) >= 3, "{idle}");
    assert!(mean(&idle) < 0.2, "an idle workload learned {idle}");
    assert!(
        idle["peak_memory_bytes"].as_u64().unwrap() >= 64 << 20,
        "{idle}"
    );
    let ioctl_rate = idle["mean_ioctls_per_sec"].as_f64().unwrap();
    assert!(
        (3.0..=40.0).contains(&ioctl_rate),
        "about 20 ioctls a second, learned {ioctl_rate}"
    );

    // Busy: a spinner alone on its GPU under a work-conserving share, so nothing holds it back
    // (a hard share would cap it near 0.5).
    let out = rig.run(
        "busy",
        &[
            "-r",
            "cuda.shares=0.5",
            "--compute-policy",
            "work-conserving",
        ],
        &spinner(3),
    );
    // `timeout` ends the spinner: 124.
    assert_eq!(out.status.code(), Some(124), "{out:?}");
    let busy = rig.profile_after("busy", 1);
    assert!(samples(&busy) >= 3, "{busy}");
    let first = mean(&busy);
    assert!(first > 0.6, "a spinner learned {busy}");

    // The same class again under a hard 0.3 share: the throttle holds it near 0.3, the reports
    // see that, and the profile moves halfway toward it (the second run weighs 1/2).
    let out = rig.run("busy", &["-r", "cuda.shares=0.3"], &spinner(3));
    assert_eq!(out.status.code(), Some(124), "{out:?}");
    let busy2 = rig.profile_after("busy", 2);
    assert!(samples(&busy2) >= samples(&busy) + 3, "{busy2}");
    let second = mean(&busy2);
    let second_run = 2.0 * second - first;
    eprintln!("busy: first run {first:.3}, second run {second_run:.3}, profile {second:.3}");
    assert!(
        second < first - 0.15,
        "the profile did not move toward the throttled run: {first} → {second}"
    );
    assert!(
        (0.1..=0.45).contains(&second_run),
        "a spinner held to 0.3 measured {second_run}"
    );

    // The profiles are in the controller's store.
    rig.restart_controller();
    let after = rig.cli(&["profile", "show", "busy"]).unwrap();
    assert_eq!(after["runs"], 2, "{after}");
    assert_eq!(after["deciles"], busy2["deciles"], "{after}");
    let all = rig.cli(&["profile", "ls"]).unwrap();
    let classes: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["class"].as_str())
        .collect();
    assert_eq!(classes, ["busy", "idle"], "{all}");
    let stats = rig.agent.snapshot().stats;
    assert!(stats.usage_reports >= 20, "{stats:?}");
    assert_eq!(stats.usage_reports_dropped, 0, "{stats:?}");
}
