//! The agent's OTLP metrics, received by a real OTLP/gRPC receiver built on the official
//! opentelemetry-proto definitions, checked against the agent's own snapshot; and a receiver
//! that goes away and comes back.

// Test helpers fail loudly on anything unexpected.
#![allow(clippy::unwrap_used)]

mod util;

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use opentelemetry_proto::tonic::{
    collector::metrics::v1::{
        ExportMetricsServiceRequest, ExportMetricsServiceResponse,
        metrics_service_server::{MetricsService, MetricsServiceServer},
    },
    common::v1::{AnyValue, any_value},
    metrics::v1::{Metric, metric::Data, number_data_point},
};
use util::{
    Client, Driver, TestAgent, TestCgroup, config, container_id, ioctls, memory, require_root,
    scratch,
};

const MIB: u64 = 1 << 20;

/// What the receiver got: every request, in order.
type Received = Arc<Mutex<Vec<ExportMetricsServiceRequest>>>;

struct Receiver(Received);

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// An OTLP/gRPC metrics receiver on loopback, on its own runtime; stopped when dropped.
struct TestReceiver {
    addr: SocketAddr,
    received: Received,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestReceiver {
    fn start(addr: &str) -> Self {
        let received = Received::default();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = MetricsServiceServer::new(Receiver(Arc::clone(&received)));
        let addr = addr.to_owned();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind(&addr).await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::TcpListenerStream::new(listener),
                        async {
                            let _ = stopped.await;
                        },
                    )
                    .await
                    .unwrap();
            });
        });
        Self {
            addr: addr_rx.recv().unwrap(),
            received,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The latest export's metric `name`, if any export had it.
    fn latest(&self, name: &str) -> Option<Metric> {
        let received = self.received.lock().unwrap();
        received.iter().rev().find_map(|r| {
            r.resource_metrics
                .iter()
                .flat_map(|rm| &rm.scope_metrics)
                .flat_map(|sm| &sm.metrics)
                .find(|m| m.name == name)
                .cloned()
        })
    }

    /// Resource attributes of the latest export.
    fn resource(&self) -> Vec<(String, String)> {
        let received = self.received.lock().unwrap();
        received
            .last()
            .and_then(|r| r.resource_metrics.first())
            .and_then(|rm| rm.resource.as_ref())
            .map(|res| {
                res.attributes
                    .iter()
                    .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }
}

impl Drop for TestReceiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// The data points of a gauge or sum: (attributes, value as f64).
fn points(metric: &Metric) -> Vec<(Vec<(String, String)>, f64)> {
    let points = match &metric.data {
        Some(Data::Gauge(g)) => &g.data_points,
        Some(Data::Sum(s)) => &s.data_points,
        _ => return Vec::new(),
    };
    points
        .iter()
        .map(|p| {
            let attrs = p
                .attributes
                .iter()
                .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                .collect();
            #[allow(clippy::cast_precision_loss)]
            let value = match p.value {
                Some(number_data_point::Value::AsInt(i)) => i as f64,
                Some(number_data_point::Value::AsDouble(d)) => d,
                None => f64::NAN,
            };
            (attrs, value)
        })
        .collect()
}

fn has(attrs: &[(String, String)], key: &str, value: &str) -> bool {
    attrs.iter().any(|(k, v)| k == key && v == value)
}

fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

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
fn agent_metrics_match_the_snapshot_and_survive_the_receiver_going_away() {
    require_root();
    let receiver = TestReceiver::start("127.0.0.1:0");
    let driver = Driver::mount("metrics");
    let mock = driver.dir.parent().unwrap().join("mock.toml");
    std::fs::write(&mock, MOCK_DEVICES).unwrap();
    let mut cfg = config(&[driver.glob()], &scratch("agent"));
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
