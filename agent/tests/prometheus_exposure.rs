//! The agent's Prometheus endpoint has no authentication: `gpuwarden-agent run` refuses to
//! serve it beyond loopback without `--prometheus-insecure`, before it opens anything, naming the
//! address and the flag. (The allowed forms are the config's tests; a real agent serving on
//! loopback is `tests/tests/observability_prometheus.rs`.)

use std::process::{Command, Stdio};

/// `gpuwarden-agent run` with its state in `dir`, neither Prometheus variable inherited.
fn agent(dir: &std::path::Path) -> Command {
    let mut agent = Command::new(env!("CARGO_BIN_EXE_gpuwarden-agent"));
    agent
        .arg("run")
        .arg("--state-dir")
        .arg(dir)
        .arg("--socket")
        .arg(dir.join("agent.sock"))
        .env_remove("GPUWARDEN_PROMETHEUS_LISTEN")
        .env_remove("GPUWARDEN_PROMETHEUS_INSECURE")
        .stdout(Stdio::null());
    agent
}

fn assert_refused(out: &std::process::Output, addr: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "served on {addr}: {stderr}");
    assert!(
        stderr.contains(&format!("refusing to serve Prometheus metrics on {addr}")),
        "{stderr}"
    );
    assert!(stderr.contains("--prometheus-insecure"), "{stderr}");
}

#[test]
fn metrics_beyond_loopback_are_refused_naming_the_address_and_the_flag() {
    let dir = gpuwarden_test_support::scratch("agent-prom");
    let by_flag = agent(dir.path())
        .args(["--prometheus-listen", "10.11.12.13:9464"])
        .output()
        .expect("runs");
    assert_refused(&by_flag, "10.11.12.13:9464");
    // The DaemonSet's way: the variable, set to the pod IP.
    let by_env = agent(dir.path())
        .env("GPUWARDEN_PROMETHEUS_LISTEN", "0.0.0.0:9464")
        .output()
        .expect("runs");
    assert_refused(&by_env, "0.0.0.0:9464");
    // An explicit false refuses as well.
    let by_false = agent(dir.path())
        .args([
            "--prometheus-listen",
            "0.0.0.0:9464",
            "--prometheus-insecure=false",
        ])
        .output()
        .expect("runs");
    assert_refused(&by_false, "0.0.0.0:9464");
}
