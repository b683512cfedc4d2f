//! The Prometheus endpoint has no authentication, so the controller serves it beyond loopback
//! only when told to: `--prometheus-insecure` (the metrics alone) or `--insecure` (all plain
//! text). Over the real binary: the refusal names the address and the flag; loopback and both
//! flags serve `GET /metrics`.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

const CONTROLLER: &str = env!("CARGO_BIN_EXE_gpuwarden-controller");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `GET /metrics` on `addr`: the whole answer, or `None` while nothing answers.
fn scrape(addr: SocketAddr) -> Option<String> {
    let mut tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    tcp.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).ok()?;
    Some(answer)
}

/// Kills the controller when the test ends, passed or not.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn metrics_beyond_loopback_are_refused_naming_the_address_and_the_flag() {
    let dir = gpuwarden_test_support::scratch("prom-exposed");
    let metrics = format!("0.0.0.0:{}", free_port());
    let refused = Command::new(CONTROLLER)
        .args([
            "run",
            "--listen",
            "127.0.0.1:0",
            "--prometheus-listen",
            &metrics,
        ])
        .arg("--state-dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "served: {stderr}");
    assert!(stderr.contains(&metrics), "names the address: {stderr}");
    assert!(
        stderr.contains("--prometheus-insecure"),
        "names the flag: {stderr}"
    );
    // The variable likewise, and an explicit false.
    let refused = Command::new(CONTROLLER)
        .args(["run", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(dir.path())
        .env("GPUWARDEN_PROMETHEUS_LISTEN", &metrics)
        .env("GPUWARDEN_PROMETHEUS_INSECURE", "false")
        .stdout(Stdio::null())
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "served: {stderr}");
    assert!(stderr.contains(&metrics), "names the address: {stderr}");
    // The config file's key refuses likewise.
    let config = dir.path().join("controller.toml");
    std::fs::write(&config, format!("prometheus_listen = \"{metrics}\"\n")).expect("writes");
    let refused = Command::new(CONTROLLER)
        .args(["run", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "served: {stderr}");
    assert!(stderr.contains(&metrics), "names the address: {stderr}");
}

/// One way to start the controller serving its metrics.
struct Case {
    /// The address the endpoint binds (the port is picked).
    host: &'static str,
    /// `--prometheus-listen`, else `GPUWARDEN_PROMETHEUS_LISTEN`.
    by_flag: bool,
    flags: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
}

impl Case {
    fn flag(host: &'static str, flags: &'static [&'static str]) -> Self {
        Self {
            host,
            by_flag: true,
            flags,
            env: &[],
        }
    }
}

#[test]
fn loopback_and_either_flag_serve_the_metrics() {
    // The address by flag, or by variable (as the manifests in deploy/kubernetes/prometheus set
    // it); the allowance by flag or by variable.
    let cases = [
        Case::flag("127.0.0.1", &[]),
        Case::flag("0.0.0.0", &["--prometheus-insecure"]),
        Case::flag("0.0.0.0", &["--insecure"]),
        Case {
            host: "0.0.0.0",
            by_flag: false,
            flags: &[],
            env: &[("GPUWARDEN_PROMETHEUS_INSECURE", "true")],
        },
    ];
    for Case {
        host,
        by_flag,
        flags,
        env,
    } in cases
    {
        let dir = gpuwarden_test_support::scratch("prom-served");
        let port = free_port();
        let mut command = Command::new(CONTROLLER);
        command
            .args(["run", "--listen", "127.0.0.1:0"])
            .args(flags)
            .envs(env.iter().copied())
            .arg("--state-dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if by_flag {
            command
                .arg("--prometheus-listen")
                .arg(format!("{host}:{port}"));
        } else {
            command.env("GPUWARDEN_PROMETHEUS_LISTEN", format!("{host}:{port}"));
        }
        let controller = Running(command.spawn().expect("starts"));
        // A wildcard address is reached over loopback too.
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let started = Instant::now();
        let answer = loop {
            if let Some(answer) = scrape(addr).filter(|a| a.contains("gpuwarden_")) {
                break answer;
            }
            assert!(
                started.elapsed() < gpuwarden_test_support::wait::PATIENCE,
                "no metrics on {host}:{port} with {flags:?} {env:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        drop(controller);
    }
}
