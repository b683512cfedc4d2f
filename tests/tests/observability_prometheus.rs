//! The Prometheus endpoints, the dashboard and the alert rules, checked against a real
//! Prometheus (Debian's `prometheus`, installed by `cargo xtask setup`).
//!
//! A controller and an agent (mock GPUs, the fake driver, real cgroups and eBPF) serve their
//! metrics on loopback; a Prometheus started here scrapes both every second and evaluates
//! `deploy/observability/alerts.yaml`. The test asks Prometheus' HTTP API for the series, their
//! labels and values (compared with the agent's snapshot and the session asked for), checks that
//! `gpuwarden session show` gives the session's entitled share and the usage its agent reported,
//! runs every
//! panel query of `deploy/observability/dashboard.json` and every alert expression there, then
//! stops the controller and sees the two alerts that should fire fire. `promtool` checks the
//! rule file and runs its unit tests, and the `PrometheusRule` manifest is held to the same
//! groups.

// Test helpers fail loudly on anything unexpected. Byte counts, counters and 0/1 gauges come
// back from Prometheus as exact integers (far below 2^53), so they compare exactly.
#![expect(
    clippy::unwrap_used,
    clippy::float_cmp,
    reason = "a test's helpers unwrap: a failure there is the test failing"
)]

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use gpuwarden_runtime::otlp::Exporters;
use gpuwarden_test_support::{
    agent::TestAgent,
    controller::{TestController, fast_timing},
    require_root, scratch,
    wait::until as wait_for,
};
use gpuwarden_tests::harness::{self, Driver};
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// `deploy/observability/NAME`.
fn observability(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/observability")
        .join(name)
}

/// A loopback port nobody listens on now (the binaries and Prometheus take fixed addresses).
fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A Prometheus server of its own, killed when dropped.
struct Prometheus {
    addr: SocketAddr,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scrapes `agent` and `controller` every second and evaluates the alert rules every second.
    fn start(agent: SocketAddr, controller: SocketAddr) -> Self {
        let dir = scratch("prometheus");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {rules}\n\
                 scrape_configs:\n\
                 \x20 - job_name: gpuwarden-agent\n    static_configs:\n      - targets: ['{agent}']\n\
                 \x20 - job_name: gpuwarden-controller\n    static_configs:\n      - targets: ['{controller}']\n",
                rules = observability("alerts.yaml").display(),
            ),
        )
        .unwrap();
        let addr = free_port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus (Debian's `prometheus`; `cargo xtask setup` installs it)");
        let prometheus = Self {
            addr,
            child,
            _dir: dir,
        };
        wait_for("Prometheus to answer", Duration::from_mins(1), || {
            prometheus.try_get("/-/ready").is_some()
        });
        prometheus
    }

    /// The body of `GET path`, when the answer is 200.
    fn try_get(&self, path: &str) -> Option<String> {
        let mut tcp = TcpStream::connect(self.addr).ok()?;
        tcp.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        // HTTP/1.0: the answer ends with the connection, never chunked.
        write!(tcp, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.addr).ok()?;
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).ok()?;
        let (head, body) = answer.split_once("\r\n\r\n")?;
        (head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"))
            .then(|| body.to_owned())
    }

    /// `data` of an API call that must succeed.
    fn api(&self, path: &str) -> Value {
        let body = self
            .try_get(path)
            .unwrap_or_else(|| panic!("GET {path} failed"));
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{path}: {v}");
        v["data"].clone()
    }

    /// The instant vector `query` evaluates to now: each element's labels and value.
    fn query(&self, query: &str) -> Vec<(serde_json::Map<String, Value>, f64)> {
        let data = self.api(&format!("/api/v1/query?query={}", encode(query)));
        data["result"]
            .as_array()
            .unwrap_or_else(|| panic!("{query}: not a vector: {data}"))
            .iter()
            .map(|r| {
                let value = r["value"][1].as_str().unwrap();
                let value = match value {
                    "NaN" => f64::NAN,
                    v => v.parse().unwrap(),
                };
                (r["metric"].as_object().unwrap().clone(), value)
            })
            .collect()
    }

    /// The one element of `query`, waiting for it (a series appears with the scrape after the
    /// state that makes it).
    fn one(&self, query: &str) -> (serde_json::Map<String, Value>, f64) {
        let mut last = Vec::new();
        wait_for(query, Duration::from_secs(30), || {
            last = self.query(query);
            last.len() == 1
        });
        last.remove(0)
    }

    /// The labels of the one element of `query`, once its value is `value` (a change reaches
    /// Prometheus with the agent's next published snapshot and the scrape after it).
    fn equals(&self, query: &str, value: f64) -> serde_json::Map<String, Value> {
        let mut last = Vec::new();
        wait_for(
            &format!("{query} == {value}"),
            Duration::from_secs(30),
            || {
                last = self.query(query);
                last.len() == 1 && last[0].1 == value
            },
        );
        last.remove(0).0
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encodes a query parameter.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn label<'a>(labels: &'a serde_json::Map<String, Value>, key: &str) -> &'a str {
    labels.get(key).and_then(Value::as_str).unwrap_or_default()
}

/// The dashboard's panel queries with Grafana's variables filled in as "All" would.
fn dashboard_queries() -> Vec<(String, String)> {
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(observability("dashboard.json")).unwrap())
            .unwrap();
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$node", ".*")
                .replace("$namespace", ".*")
                .replace("$__rate_interval", "30s");
            out.push((panel["title"].as_str().unwrap().to_owned(), expr));
        }
    }
    out
}

/// Each alert of a rule file with its expression (`expr: …` on one line, or `expr: |` and the
/// lines below it).
fn alert_expressions(rules: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut lines = rules.lines().peekable();
    let mut alert = None;
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if let Some(name) = trimmed.strip_prefix("- alert: ") {
            alert = Some(name.trim().to_owned());
        } else if let Some(expr) = trimmed.strip_prefix("expr: ") {
            let indent = line.len() - trimmed.len();
            let expr = if expr.trim() == "|" {
                let mut block = Vec::new();
                while let Some(next) = lines.peek() {
                    if next.trim().is_empty() || next.len() - next.trim_start().len() <= indent {
                        break;
                    }
                    block.push(next.trim().to_owned());
                    lines.next();
                }
                block.join(" ")
            } else {
                expr.trim().to_owned()
            };
            out.push((alert.take().unwrap(), expr));
        }
    }
    out
}

/// The metric names an expression reads (gpuwarden's and the hardware conventions').
fn metric_names(expr: &str) -> Vec<String> {
    let mut names: Vec<String> = expr
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("gpuwarden_") || w.starts_with("hw_"))
        // Label names inside braces start the same way: a metric name is not followed by `=`.
        .filter(|w| {
            let at = expr.find(w).unwrap_or(0) + w.len();
            !expr[at..].trim_start().starts_with(['=', '!'])
        })
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The agent's and the controller's series in a real Prometheus: names, labels and values;
/// every dashboard query and alert expression evaluates there; the link-down and no-leader
/// alerts fire once the controller stops.
#[test]
#[ignore = "needs root"]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn prometheus_scrapes_both_binaries_and_the_dashboard_and_alerts_work_on_their_series() {
    require_root();
    let driver = Driver::mount("obs");
    let ctl_dir = scratch("ctl");
    let ctl_metrics = free_port();
    let ctl = TestController::builder(ctl_dir.path())
        .timing(fast_timing(Duration::from_secs(5)))
        .exporters(Exporters {
            prometheus: Some(ctl_metrics),
            ..Exporters::default()
        })
        .start();
    let agent_dir = scratch("agent");
    let agent_metrics = free_port();
    let mut cfg = harness::mock_gpu_config(&driver, ctl.url(), agent_dir.path());
    let mock_file = cfg.mock_devices.clone().unwrap();
    cfg.usage_report_interval = Some(Duration::from_millis(200));
    cfg.prometheus_listen = Some(agent_metrics);
    let agent = TestAgent::start_with(cfg);
    let cli = |args: &[&str]| -> Value {
        let out = Command::new(env!("CARGO_BIN_EXE_gpuwarden-under-test"))
            .arg("--controller")
            .arg(ctl.url())
            .arg("--json")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    wait_for("the node to register", Duration::from_secs(20), || {
        cli(&["node", "ls"])
            .as_array()
            .is_some_and(|n| n.len() == 1)
    });

    // A session with half a GPU and 1 GiB, running a GPU client that holds 64 MiB.
    let script = "client\\ndevice 0xc1d00001 0\\nalloc 0xc1d00001 0xcaf00001 64m\\nsleep 600000\\n";
    let mut workload = Command::new(env!("CARGO_BIN_EXE_gpuwarden-under-test"))
        .arg("--controller")
        .arg(ctl.url())
        .args(["run", "--class", "obs", "--agent-socket"])
        .arg(&agent.socket)
        .args(["-r", "cuda.shares=0.5", "-r", "cuda.mem=1g", "--"])
        // `timeout` ends the whole process group, should the test fail before it kills them.
        .args([
            "timeout",
            "300",
            "sh",
            "-c",
            &format!(
                "printf '{script}' | {} --dir {}",
                env!("CARGO_BIN_EXE_gpu-client"),
                driver.dir.display()
            ),
        ])
        // The workload outlives `gpuwarden run` when that is killed: it must hold none of the
        // test's pipes.
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut session = String::new();
    wait_for("the session to run", Duration::from_secs(30), || {
        let sessions = cli(&["session", "ls"]);
        if let Some(s) = sessions
            .as_array()
            .and_then(|a| a.iter().find(|s| s["state"] == "running"))
        {
            session = s["id"].as_str().unwrap().to_owned();
        }
        !session.is_empty()
    });
    let mut container = None;
    wait_for(
        "the client's 64 MiB in the snapshot",
        Duration::from_secs(30),
        || {
            container = agent.snapshot().containers.into_iter().find(|c| {
                c.session_id.as_deref() == Some(session.as_str())
                    && c.devices.iter().any(|d| d.memory_bytes == 64 * MIB)
            });
            container.is_some()
        },
    );
    let container = container.unwrap();
    let device = container
        .devices
        .iter()
        .find(|d| d.memory_bytes == 64 * MIB)
        .unwrap();
    let gpu_index = device.device.trim_start_matches("nvidia").to_owned();
    let gpu: usize = gpu_index.parse().unwrap();

    let prometheus = Prometheus::start(agent_metrics, ctl_metrics);
    wait_for("both targets up", Duration::from_secs(30), || {
        let targets = prometheus.api("/api/v1/targets");
        let active = targets["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        active.len() == 2 && active.iter().all(|t| t["health"] == "up")
    });

    // Health for the mock GPUs (the file is read again at each reading), written once Prometheus
    // scrapes (so it sees the XID count rise): the client's GPU is degraded with an XID naming
    // one of the session's processes; the other is healthy.
    let pid = container.pids[0];
    let mut devices = [0, 1].map(|i| {
        format!(
            "[[devices]]\nuuid = \"GPU-test-{i}\"\nmodel_name = \"Mock\"\nmemory_size = \"16G\"\n\
             power_watts = 100.0\nenergy_joules = 1000.0\nmemory_utilization = 0.0\n"
        )
    });
    devices[gpu] = devices[gpu].replace(
        "power_watts = 100.0",
        &format!(
            "power_watts = 312.5\nhealth = \"degraded\"\necc_corrected = 4\n\
             ecc_uncorrected = 1\nxid = [{{ code = 79, pid = {pid} }}]"
        ),
    );
    std::fs::write(&mock_file, devices.concat()).unwrap();
    wait_for("the XID on the container", Duration::from_secs(30), || {
        agent
            .container(&container.cgroup_path)
            .is_some_and(|c| c.xid_errors.get(&device.device) == Some(&1))
    });

    // The agent: per-GPU series with the hardware conventions' labels, per node.
    let gpus = {
        let mut v = Vec::new();
        wait_for("both GPUs' memory", Duration::from_secs(30), || {
            v = prometheus.query("hw_gpu_memory_limit_bytes");
            v.len() == 2
        });
        v
    };
    for (labels, value) in &gpus {
        assert_eq!(label(labels, "job"), "gpuwarden-agent", "{labels:?}");
        assert_eq!(label(labels, "k8s_node_name"), "test-node", "{labels:?}");
        assert_eq!(label(labels, "hw_vendor"), "NVIDIA", "{labels:?}");
        assert_eq!(label(labels, "hw_name"), "Mock", "{labels:?}");
        assert!(
            label(labels, "hw_id").starts_with("GPU-test-"),
            "{labels:?}"
        );
        assert_eq!(*value, (16u64 << 30) as f64);
    }
    // The session's container: its memory where the snapshot has it, its limit and share.
    let selector =
        format!("{{gpuwarden_session_id=\"{session}\",gpuwarden_gpu_index=\"{gpu_index}\"}}");
    let (labels, used) = prometheus.one(&format!(
        "gpuwarden_container_gpu_memory_usage_bytes{selector}"
    ));
    assert_eq!(used, (64 * MIB) as f64);
    assert_eq!(
        label(&labels, "gpuwarden_cgroup_path"),
        container.cgroup_path,
        "{labels:?}"
    );
    assert!(
        label(&labels, "hw_id").starts_with("GPU-test-"),
        "{labels:?}"
    );
    assert!(labels.keys().all(|k| !k.contains("pid")), "{labels:?}");
    let (_, limit) = prometheus.one(&format!(
        "gpuwarden_container_gpu_memory_limit_bytes{selector}"
    ));
    assert_eq!(limit, (1u64 << 30) as f64);
    let (_, share) = prometheus.one(&format!(
        "gpuwarden_container_compute_share_ratio{selector}"
    ));
    assert!((share - 0.5).abs() < 1e-9, "{share}");
    // Entitled and achieved side by side, with the compute policy.
    let session_selector = format!("{{gpuwarden_session_id=\"{session}\"}}");
    let (labels, entitled) = prometheus.one(&format!(
        "gpuwarden_container_compute_entitled_ratio{session_selector}"
    ));
    assert!((entitled - 0.5).abs() < 1e-9, "{entitled}");
    assert_eq!(
        label(&labels, "gpuwarden_compute_policy"),
        "hard",
        "{labels:?}"
    );
    let (_, achieved) = prometheus.one(&format!(
        "gpuwarden_container_compute_achieved_ratio{session_selector}"
    ));
    // The client sleeps: its cgroup's CPU time (the mock devices' stand-in) is next to none.
    assert!((0.0..0.2).contains(&achieved), "{achieved}");
    // Not flagged: the share watch needs minutes out of bounds, and an idle client is not starved.
    for deviation in ["below_entitled", "above_hard_share"] {
        prometheus.equals(
            &format!(
                "gpuwarden_container_compute_deviation{{gpuwarden_session_id=\"{session}\",gpuwarden_share_deviation=\"{deviation}\"}}"
            ),
            0.0,
        );
    }
    let (_, throttled) = prometheus.one(&format!(
        "gpuwarden_container_throttled_seconds_total{session_selector}"
    ));
    assert!(throttled >= 0.0);
    // The GPU time counter, whose rate() is the achieved share over any window: the sleeping
    // client used next to none of it.
    let (_, gpu_time) = prometheus.one(&format!(
        "gpuwarden_container_gpu_time_seconds_total{session_selector}"
    ));
    assert!((0.0..5.0).contains(&gpu_time), "{gpu_time}");
    // Counters end in _total, with the snapshot's figures.
    let rm_alloc = container
        .devices
        .iter()
        .find(|d| d.device == "nvidiactl")
        .unwrap()
        .ioctls["rm_alloc"];
    let (_, ioctls) = prometheus.one(&format!(
        "gpuwarden_container_ioctls_total{{gpuwarden_session_id=\"{session}\",gpuwarden_device=\"nvidiactl\",gpuwarden_ioctl_class=\"rm_alloc\"}}"
    ));
    assert_eq!(ioctls, rm_alloc as f64);
    // GPU health per the hardware conventions, and the XID on the container it is attributed to.
    let uuid = format!("GPU-test-{gpu}");
    let labels = prometheus.equals(
        &format!("hw_status_ratio{{hw_id=\"{uuid}\",hw_state=\"degraded\"}}"),
        1.0,
    );
    assert_eq!(label(&labels, "hw_type"), "gpu", "{labels:?}");
    assert_eq!(label(&labels, "hw_model"), "Mock", "{labels:?}");
    prometheus.equals(
        &format!("hw_status_ratio{{hw_id=\"{uuid}\",hw_state=\"ok\"}}"),
        0.0,
    );
    prometheus.equals(
        &format!("hw_status_ratio{{hw_id!=\"{uuid}\",hw_state=\"ok\"}}"),
        1.0,
    );
    for (kind, n) in [
        ("xid", 1.0),
        ("ecc_corrected", 4.0),
        ("ecc_uncorrected", 1.0),
    ] {
        prometheus.equals(
            &format!("hw_errors_total{{hw_id=\"{uuid}\",error_type=\"{kind}\"}}"),
            n,
        );
    }
    prometheus.equals(&format!("hw_power_watts{{hw_id=\"{uuid}\"}}"), 312.5);
    prometheus.equals(
        &format!("hw_energy_joules_total{{hw_id=\"{uuid}\"}}"),
        1000.0,
    );
    prometheus.equals(
        &format!("hw_gpu_memory_utilization_ratio{{hw_id=\"{uuid}\"}}"),
        0.0,
    );
    let labels = prometheus.equals(
        &format!(
            "gpuwarden_container_gpu_errors_total{{gpuwarden_session_id=\"{session}\",error_type=\"xid\"}}"
        ),
        1.0,
    );
    assert_eq!(label(&labels, "hw_id"), uuid, "{labels:?}");
    assert_eq!(
        label(&labels, "gpuwarden_cgroup_path"),
        container.cgroup_path,
        "{labels:?}"
    );

    let (_, connected) = prometheus.one("gpuwarden_agent_controller_connected");
    assert_eq!(connected, 1.0);
    let (_, drops) = prometheus.one("gpuwarden_agent_ringbuf_drops_total");
    assert_eq!(drops, agent.snapshot().stats.ringbuf_drops as f64);
    let (labels, _) = prometheus.one("target_info{job=\"gpuwarden-agent\"}");
    assert_eq!(
        label(&labels, "service_name"),
        "gpuwarden-agent",
        "{labels:?}"
    );
    assert_eq!(label(&labels, "host_name"), "test-node", "{labels:?}");

    // The controller.
    let (_, leader) = prometheus.one("gpuwarden_controller_leader");
    assert_eq!(leader, 1.0);
    let (_, ready) = prometheus.one("gpuwarden_nodes{gpuwarden_node_state=\"ready\"}");
    assert_eq!(ready, 1.0);
    let (_, running) = prometheus.one(
        "gpuwarden_sessions{gpuwarden_session_state=\"running\",gpuwarden_session_origin=\"controller\"}",
    );
    assert_eq!(running, 1.0);
    let (_, shares) = prometheus.one("gpuwarden_slot_allocated{gpuwarden_slot=\"cuda.shares\"}");
    assert!((shares - 0.5).abs() < 1e-9, "{shares}");
    let (_, started) = prometheus.one(
        "gpuwarden_session_start_duration_seconds_count{gpuwarden_session_origin=\"controller\"}",
    );
    assert_eq!(started, 1.0);
    let (labels, entitled) = prometheus.one(&format!(
        "gpuwarden_session_compute_entitled_ratio{session_selector}"
    ));
    assert!((entitled - 0.5).abs() < 1e-9, "{entitled}");
    assert_eq!(label(&labels, "gpuwarden_node"), "test-node", "{labels:?}");
    assert_eq!(
        label(&labels, "gpuwarden_session_class"),
        "obs",
        "{labels:?}"
    );
    let (_, achieved) = prometheus.one(&format!(
        "gpuwarden_session_compute_achieved_ratio{session_selector}"
    ));
    assert!((0.0..0.2).contains(&achieved), "{achieved}");
    // `session show`: the entitlement the metric gives, and what the agent reported: the
    // memory its client holds, a GPU time share like the metric's.
    let mut shown = Value::Null;
    wait_for(
        "the client's 64 MiB in session show",
        Duration::from_secs(30),
        || {
            shown = cli(&["session", "show", &session]);
            shown["share"]["achieved"]["last_memory_bytes"] == 64 * MIB
        },
    );
    let share = &shown["share"];
    let shown_entitled = share["entitled_compute"].as_f64().unwrap();
    assert!((shown_entitled - entitled).abs() < 1e-9, "{share}");
    assert_eq!(share["entitled_memory_bytes"], 1_u64 << 30, "{share}");
    assert!(share["samples"].as_u64().unwrap() >= 1, "{share}");
    let shown_achieved = share["achieved"]["mean"].as_f64().unwrap();
    assert!((0.0..0.2).contains(&shown_achieved), "{share}");
    prometheus.one("gpuwarden_limits_refused_total{gpuwarden_limits_reason=\"oversized\"}");

    // Every panel of the dashboard has data, and its template variables have values.
    for (panel, expr) in dashboard_queries() {
        let mut result = Vec::new();
        wait_for(
            &format!("data for panel {panel:?}: {expr}"),
            Duration::from_secs(40),
            || {
                result = prometheus.query(&expr);
                !result.is_empty()
            },
        );
    }
    for (label, metric) in [
        ("k8s_node_name", "hw_gpu_memory_limit_bytes"),
        (
            "k8s_node_name",
            "gpuwarden_container_gpu_memory_usage_bytes",
        ),
    ] {
        let values = prometheus.api(&format!("/api/v1/label/{label}/values?match[]={metric}"));
        assert_eq!(
            values,
            serde_json::json!(["test-node"]),
            "{label} of {metric}"
        );
    }

    // Every alert: each series it reads exists here; the degraded GPU and its XID fire, the
    // rest stay quiet.
    let rules = std::fs::read_to_string(observability("alerts.yaml")).unwrap();
    let alerts = alert_expressions(&rules);
    assert_eq!(alerts.len(), 10, "{alerts:?}");
    let firing_now = ["GpuwardenGpuUnhealthy", "GpuwardenGpuXid"];
    for (alert, expr) in &alerts {
        for name in metric_names(expr) {
            assert!(
                !prometheus.query(&name).is_empty(),
                "{alert} reads {name}, which no endpoint serves"
            );
        }
        if firing_now.contains(&alert.as_str()) {
            let mut result = Vec::new();
            wait_for(
                &format!("{alert} to fire: {expr}"),
                Duration::from_secs(30),
                || {
                    result = prometheus.query(expr);
                    !result.is_empty()
                },
            );
            assert_eq!(result.len(), 1, "{alert}: {result:?}");
            assert_eq!(label(&result[0].0, "hw_id"), uuid, "{alert}: {result:?}");
        } else {
            assert!(
                prometheus.query(expr).is_empty(),
                "{alert} fires with all well: {expr}"
            );
        }
    }
    let rules_loaded = prometheus.api("/api/v1/rules");
    let loaded: usize = rules_loaded["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["rules"].as_array().unwrap().len())
        .sum();
    assert_eq!(loaded, alerts.len(), "Prometheus loaded {rules_loaded}");

    // The controller goes away: the agent's link is down and no controller leads.
    drop(ctl);
    let expr = |name: &str| &alerts.iter().find(|(a, _)| a == name).unwrap().1;
    let mut firing = Vec::new();
    wait_for(
        "the agent to report its link down",
        Duration::from_mins(1),
        || {
            firing = prometheus.query(expr("GpuwardenAgentCannotReachController"));
            firing.len() == 1
        },
    );
    assert_eq!(label(&firing[0].0, "k8s_node_name"), "test-node");
    wait_for("no leader", Duration::from_mins(1), || {
        prometheus.query(expr("GpuwardenNoLeader")).len() == 1
    });
    // Prometheus' own rule evaluation agrees: both pending (their `for` has not passed).
    wait_for(
        "both alerts pending in Prometheus",
        Duration::from_secs(30),
        || {
            let alerts = prometheus.api("/api/v1/alerts");
            let names: Vec<&str> = alerts["alerts"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|a| a["labels"]["alertname"].as_str())
                .collect();
            names.contains(&"GpuwardenAgentCannotReachController")
                && names.contains(&"GpuwardenNoLeader")
        },
    );

    // The workload's processes (its shell and the client), then `gpuwarden run` itself.
    for pid in agent
        .container(&container.cgroup_path)
        .map(|c| c.pids)
        .unwrap_or_default()
    {
        // SAFETY: a plain syscall on processes this test started.
        unsafe { libc::kill(i32::try_from(pid).unwrap(), libc::SIGKILL) };
    }
    let _ = workload.kill();
    let _ = workload.wait();
}

/// `promtool check rules` accepts the rule file, `promtool test rules` passes every alert's
/// fires-and-stays-quiet cases, and the `PrometheusRule` carries the very same groups.
#[test]
fn the_alert_rules_pass_promtool_and_the_prometheus_rule_matches_them() {
    let dir = observability("");
    for args in [
        ["check", "rules", "alerts.yaml"],
        ["test", "rules", "alerts.test.yaml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("promtool (Debian's `prometheus`; `cargo xtask setup` installs it)");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Every alert has a test that expects it to fire.
    let rules = std::fs::read_to_string(dir.join("alerts.yaml")).unwrap();
    let tests = std::fs::read_to_string(dir.join("alerts.test.yaml")).unwrap();
    for (alert, _) in alert_expressions(&rules) {
        let fires = tests
            .split("alertname: ")
            .skip(1)
            .any(|t| t.starts_with(&format!("{alert}\n")) && t.contains("exp_labels"));
        assert!(fires, "no test expects {alert} to fire");
    }
    // The PrometheusRule's spec is the rule file's groups, indented under `spec:`.
    let manifest = std::fs::read_to_string(dir.join("prometheusrule.yaml")).unwrap();
    let spec = manifest.split_once("\nspec:\n").unwrap().1;
    let spec: Vec<&str> = spec
        .lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect();
    let groups: Vec<&str> = rules
        .lines()
        .skip_while(|l| !l.starts_with("groups:"))
        .collect();
    assert_eq!(
        spec, groups,
        "prometheusrule.yaml's spec differs from alerts.yaml"
    );
}

#[test]
fn alert_expressions_and_their_metrics_are_read_from_the_rule_file() {
    let rules = "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up{job=\"x\"} == 0\n        for: 1m\n      - alert: B\n        expr: |\n          gpuwarden_x_total{hw_id=\"g\"}\n          > hw_y\n        labels: {}\n";
    let alerts = alert_expressions(rules);
    assert_eq!(
        alerts,
        [
            ("A".to_owned(), "up{job=\"x\"} == 0".to_owned()),
            (
                "B".to_owned(),
                "gpuwarden_x_total{hw_id=\"g\"} > hw_y".to_owned()
            )
        ]
    );
    assert_eq!(metric_names(&alerts[1].1), ["gpuwarden_x_total", "hw_y"]);
}
