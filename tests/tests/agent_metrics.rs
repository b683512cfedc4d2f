//! The agent's OTLP metrics, received by a real OTLP/gRPC receiver built on the official
//! opentelemetry-proto definitions, checked against the agent's own snapshot; and a receiver
//! that goes away and comes back.

// Test helpers fail loudly on anything unexpected.

use std::time::Duration;

use gpuwarden_test_support::{
    TestCgroup,
    agent::{TestAgent, config, ioctls, memory},
    ids::container_id,
    otlp::{TestReceiver, has, points},
    require_root, scratch,
    wait::wait_for,
};
use gpuwarden_tests::harness::{Client, Driver};

const MIB: u64 = 1 << 20;

const MOCK_DEVICES: &str = r#"
[[devices]]
uuid = "GPU-metrics-0"
model_name = "Mock H100"
memory_size = "16G"
[[devices]]
uuid = "GPU-metrics-1"
model_name = "Mock H100"
memory_size = "16G"
"#;

/// Names, units, attributes and values of the agent's metrics match its snapshot; the receiver
/// going away loses only exports (counted) and crashes nothing.
#[test]
#[ignore = "needs root"]
#[expect(
    clippy::many_single_char_names,
    clippy::too_many_lines,
    reason = "one letter per actor of the scenario"
)]
fn agent_metrics_match_the_snapshot_and_survive_the_receiver_going_away() {
    require_root();
    let receiver = TestReceiver::start("127.0.0.1:0");
    let driver = Driver::mount("metrics");
    let mock = driver.dir.parent().unwrap().join("mock.toml");
    std::fs::write(&mock, MOCK_DEVICES).unwrap();
    let state = scratch("agent");
    let mut cfg = config(&[driver.glob()], state.path());
    cfg.mock_devices = Some(mock);
    cfg.otlp_endpoint = Some(format!("http://{}", receiver.addr));
    cfg.metric_interval = Some(Duration::from_millis(300));
    let agent = TestAgent::start_with(cfg);

    let id = container_id("metrics");
    let cg = TestCgroup::create(&format!("/system.slice/docker-{id}.scope"));
    let mut a = Client::spawn(&driver.dir, Some(&cg));
    let h = a.value("client", "client");
    let dev = a.value(&format!("device {h:#x} 0"), "handle");
    a.ok(&format!("alloc {h:#x} {dev:#x} 4m"));
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(memory(&c, "nvidia0"), 4 * MIB);

    // Per-container memory: unit, attributes and the snapshot's value.
    wait_for("the container's GPU memory in an export", || {
        receiver
            .latest("gpuwarden.container.gpu.memory.usage")
            .is_some_and(|m| {
                points(&m).iter().any(|(attrs, v)| {
                    has(attrs, "container.id", &id) && (*v - (4 * MIB) as f64).abs() < 0.5
                })
            })
    });
    let m = receiver
        .latest("gpuwarden.container.gpu.memory.usage")
        .unwrap();
    assert_eq!(m.unit, "By");
    let (attrs, _) = points(&m)
        .into_iter()
        .find(|(attrs, _)| has(attrs, "container.id", &id))
        .unwrap();
    assert!(has(&attrs, "gpuwarden.gpu.index", "0"), "{attrs:?}");
    assert!(has(&attrs, "hw.id", "GPU-metrics-0"), "{attrs:?}");
    assert!(has(&attrs, "gpuwarden.cgroup.path", &cg.path), "{attrs:?}");
    assert!(
        attrs.iter().all(|(k, _)| !k.contains("pid")),
        "no per-pid attributes: {attrs:?}"
    );

    // Per-GPU memory and capacity with the semantic-convention attributes.
    let limit = receiver.latest("hw.gpu.memory.limit").unwrap();
    assert_eq!(limit.unit, "By");
    let gpu0 = points(&limit)
        .into_iter()
        .find(|(attrs, _)| has(attrs, "hw.id", "GPU-metrics-0"))
        .unwrap();
    assert!(has(&gpu0.0, "hw.vendor", "NVIDIA") && has(&gpu0.0, "hw.name", "Mock H100"));
    assert!((gpu0.1 - (16u64 << 30) as f64).abs() < 0.5);
    let usage = receiver.latest("hw.gpu.memory.usage").unwrap();
    let used0 = points(&usage)
        .into_iter()
        .find(|(attrs, _)| has(attrs, "hw.id", "GPU-metrics-0"))
        .unwrap();
    assert!(used0.1 >= (4 * MIB) as f64);
    // Utilization per GPU: mock devices report the throttle's stand-in, 0 with no share held.
    let utilization = receiver.latest("hw.gpu.utilization").unwrap();
    assert_eq!(utilization.unit, "1");
    for uuid in ["GPU-metrics-0", "GPU-metrics-1"] {
        let (attrs, v) = points(&utilization)
            .into_iter()
            .find(|(attrs, _)| has(attrs, "hw.id", uuid))
            .unwrap_or_else(|| panic!("no utilization for {uuid}"));
        assert!(has(&attrs, "hw.vendor", "NVIDIA") && has(&attrs, "hw.name", "Mock H100"));
        assert!(
            has(&attrs, "gpuwarden.utilization.source", "throttle_stand_in"),
            "{attrs:?}"
        );
        assert!(v.abs() < f64::EPSILON, "{uuid}: {v}");
    }

    // ioctls by class equal the snapshot's counts.
    let expected = ioctls(&agent.container(&cg.path).unwrap(), "nvidiactl", "rm_alloc");
    assert_eq!(expected, 3);
    wait_for("the ioctl counter to catch up", || {
        receiver
            .latest("gpuwarden.container.ioctls")
            .is_some_and(|m| {
                points(&m).iter().any(|(attrs, v)| {
                    has(attrs, "container.id", &id)
                        && has(attrs, "gpuwarden.ioctl.class", "rm_alloc")
                        && has(attrs, "gpuwarden.device", "nvidiactl")
                        && (*v - expected as f64).abs() < 0.5
                })
            })
    });
    let resource = receiver.resource();
    assert!(
        resource
            .iter()
            .any(|(k, v)| k == "k8s.node.name" && v == "test-node"),
        "{resource:?}"
    );
    assert!(receiver.latest("gpuwarden.agent.hook.tier").is_some());

    // The receiver goes away: the agent keeps working; exports fail and are counted.
    let addr = receiver.addr;
    drop(receiver);
    std::thread::sleep(Duration::from_secs(2));
    a.ok(&format!("alloc {h:#x} {dev:#x} 2m"));
    assert_eq!(
        memory(&agent.container(&cg.path).unwrap(), "nvidia0"),
        6 * MIB
    );

    // It comes back on the same address: exports resume with the current values.
    let receiver = TestReceiver::start(&addr.to_string());
    wait_for("exports to resume", || receiver.count() > 0);
    wait_for("the new value in an export", || {
        receiver
            .latest("gpuwarden.container.gpu.memory.usage")
            .is_some_and(|m| {
                points(&m).iter().any(|(attrs, v)| {
                    has(attrs, "container.id", &id) && (*v - (6 * MIB) as f64).abs() < 0.5
                })
            })
    });
    let failed = receiver
        .latest("gpuwarden.telemetry.exports.failed")
        .map(|m| points(&m).first().map_or(0.0, |p| p.1))
        .unwrap();
    assert!(failed >= 1.0, "failed exports while away: {failed}");
    a.exit();
    drop(agent);
}

/// The controller's metrics: queue, sessions and nodes by state, capacity and allocation per
/// slot type, fragmentation and decision latency, checked against its API.
#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn controller_metrics_match_its_api() {
    use gpuwarden_controller::api::Timing;
    use gpuwarden_test_support::cluster::{TestBackend, TestNode, create, wait_nodes, wait_state};
    use gpuwarden_test_support::controller::TestController;

    let receiver = TestReceiver::start("127.0.0.1:0");
    let timing = Timing {
        heartbeat_interval: Duration::from_millis(200),
        heartbeat_timeout: Duration::from_secs(5),
        pass_interval: Duration::from_millis(50),
    };
    let state = scratch("ctlm");
    let ctl = TestController::builder(state.path())
        .timing(timing)
        .otlp(format!("http://{}", receiver.addr))
        .start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let _node = rt.block_on(async {
        let node = TestNode::start(&ctl.url(), "n1", TestBackend::gpus(2));
        let mut c = ctl.client().await;
        wait_nodes(&c, 1).await;
        let a = create(&mut c, "u", &["cuda.shares=0.3"]).await.unwrap();
        wait_state(&c, &a.id, gpuwarden_proto::v1::SessionState::Running).await;
        // Fits the node's capacity (2.0) but not what is free (0.7 + 1.0): it waits.
        let waiting = create(&mut c, "u", &["cuda.shares=1.8"]).await.unwrap();
        assert_eq!(
            waiting.state,
            gpuwarden_proto::v1::SessionState::Pending as i32
        );
        node
    });

    let value = |name: &str, key: Option<(&str, &str)>| {
        receiver.latest(name).and_then(|m| {
            points(&m)
                .into_iter()
                .find(|(attrs, _)| key.is_none_or(|(k, v)| has(attrs, k, v)))
                .map(|p| p.1)
        })
    };
    wait_for("the controller's metrics", || {
        value(
            "gpuwarden.sessions",
            Some(("gpuwarden.session.state", "running")),
        ) == Some(1.0)
            && value("gpuwarden.scheduler.queue.length", None) == Some(1.0)
    });
    assert_eq!(
        value("gpuwarden.nodes", Some(("gpuwarden.node.state", "ready"))),
        Some(1.0)
    );
    // Every session here was placed by the controller (no Kubernetes claim).
    let sessions = receiver.latest("gpuwarden.sessions").unwrap();
    assert!(
        points(&sessions).iter().all(|(attrs, _)| has(
            attrs,
            "gpuwarden.session.origin",
            "controller"
        )),
        "{:?}",
        points(&sessions)
    );
    // One controller on sled leads from the start, for one term.
    assert_eq!(value("gpuwarden.controller.leader", None), Some(1.0));
    assert_eq!(value("gpuwarden.controller.terms", None), Some(1.0));
    assert_eq!(
        value(
            "gpuwarden.slot.capacity",
            Some(("gpuwarden.slot", "cuda.shares"))
        ),
        Some(2.0)
    );
    let allocated = value(
        "gpuwarden.slot.allocated",
        Some(("gpuwarden.slot", "cuda.shares")),
    );
    assert!(
        allocated.is_some_and(|v| (v - 0.3).abs() < 1e-9),
        "{allocated:?}"
    );
    // 0.7 free on the GPU the 0.3 session is on: no whole-GPU request can use it.
    let fragmented = value("gpuwarden.gpu.shares.fragmented", None);
    assert!(
        fragmented.is_some_and(|v| (v - 0.7).abs() < 1e-9),
        "{fragmented:?}"
    );
    let latency = receiver
        .latest("gpuwarden.scheduler.decision.duration")
        .unwrap();
    assert_eq!(latency.unit, "s");
    let Some(opentelemetry_proto::tonic::metrics::v1::metric::Data::Histogram(h)) = latency.data
    else {
        panic!("decision latency is not a histogram");
    };
    assert!(h.data_points.iter().map(|p| p.count).sum::<u64>() >= 2);

    // A refusal for a bound is counted by its reason.
    let oversized = gpuwarden_controller::limits::Refusal::Oversized;
    let before = ctl.bounds.refusals().count_of(oversized);
    let status = rt
        .block_on(async {
            ctl.client()
                .await
                .create_session(gpuwarden_proto::v1::CreateSessionRequest {
                    name: "x".repeat(1_000),
                    ..Default::default()
                })
                .await
        })
        .expect_err("a 1,000-byte name is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    wait_for("the refusal's count", || {
        value(
            "gpuwarden.limits.refused",
            Some(("gpuwarden.limits.reason", oversized.as_str())),
        )
        .is_some_and(|n| n > before as f64)
    });
    drop(rt);
}
