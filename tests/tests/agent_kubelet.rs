//! Pod names from the kubelet: a fake kubelet on loopback serves a `PodList` whose UID matches a
//! cgroup made under the kubepods layout; the agent's snapshot and its OTLP metrics carry the
//! pod's name and namespace. A kubelet that isn't there leaves them absent and the agent healthy.

use std::{net::TcpListener, time::Duration};

use gpuwarden_agent::attribution::kubelet::KubeletConfig;
use gpuwarden_test_support::{
    agent::{TestAgent, config, memory},
    ids::{container_id, pod_uid},
    kubelet::{FakeKubelet, pod_cgroup, pod_list},
    otlp::{TestReceiver, has, points},
    require_root, scratch,
    wait::wait_for,
};
use gpuwarden_tests::harness::{Client, Driver};

const MIB: u64 = 1 << 20;

const MOCK_DEVICES: &str = r#"
[[devices]]
uuid = "GPU-kubelet-0"
model_name = "Mock H100"
memory_size = "16G"
"#;

/// The pod's name and namespace reach the snapshot and the OTLP data, asked for with the
/// service account's bearer token; a pod that the last list lacked is asked for again at once
/// instead of at the 30 s refresh.
#[test]
#[ignore = "needs root"]
fn pod_names_from_the_kubelet_reach_the_snapshot_and_the_metrics() {
    require_root();
    let (uid, id) = (pod_uid("kubelet"), container_id("kubelet"));
    // At first the kubelet doesn't list the pod yet.
    let kubelet = FakeKubelet::start(pod_list("11111111-1111-1111-1111-111111111111", "a", "b"));
    let receiver = TestReceiver::start("127.0.0.1:0");
    let driver = Driver::mount("kubelet");
    let dir = driver.dir.parent().unwrap().to_owned();
    let mock = dir.join("mock.toml");
    std::fs::write(&mock, MOCK_DEVICES).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, "test-token\n").unwrap();

    let state = scratch("agent");
    let mut cfg = config(&[driver.glob()], state.path());
    cfg.mock_devices = Some(mock);
    cfg.otlp_endpoint = Some(format!("http://{}", receiver.addr));
    cfg.metric_interval = Some(Duration::from_millis(300));
    cfg.kubelet = Some(KubeletConfig {
        token_file: Some(token),
        ..KubeletConfig::plain(&kubelet.url())
    });
    let agent = TestAgent::start_with(cfg);
    // The first list is asked for at start.
    wait_for("the first pod list", || {
        agent.snapshot().kubelet.is_some_and(|k| k.state == "ok")
    });
    let first = kubelet.requests();
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(first[0].starts_with("GET /pods HTTP/1.1\r\n"), "{first:?}");
    assert!(
        first[0].contains("authorization: Bearer test-token\r\n"),
        "{first:?}"
    );

    kubelet.serve(pod_list(&uid, "train-0", "ml-team"));
    let cg = pod_cgroup(&uid, &id);
    let mut a = Client::spawn(&driver.dir, Some(&cg));
    let h = a.value("client", "client");
    let dev = a.value(&format!("device {h:#x} 0"), "handle");
    a.ok(&format!("alloc {h:#x} {dev:#x} 4m"));

    wait_for("the pod's name in the snapshot", || {
        agent
            .container(&cg.path)
            .is_some_and(|c| c.pod_name.is_some())
    });
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(memory(&c, "nvidia0"), 4 * MIB);
    assert_eq!(c.pod_uid.as_deref(), Some(uid.as_str()));
    assert_eq!(c.pod_name.as_deref(), Some("train-0"));
    assert_eq!(c.pod_namespace.as_deref(), Some("ml-team"));
    // The miss asked again, well before the 30 s refresh.
    assert!(kubelet.requests().len() >= 2);
    let status = agent.snapshot().kubelet.unwrap();
    assert_eq!(status.state, "ok");
    assert_eq!(status.pods, 2);
    assert_eq!(status.error, None);

    // The same names on the container's metrics.
    wait_for("the pod's names in an export", || {
        receiver
            .latest("gpuwarden.container.gpu.memory.usage")
            .is_some_and(|m| {
                points(&m).iter().any(|(attrs, _)| {
                    has(attrs, "container.id", &id)
                        && has(attrs, "k8s.pod.uid", &uid)
                        && has(attrs, "k8s.pod.name", "train-0")
                        && has(attrs, "k8s.namespace.name", "ml-team")
                })
            })
    });
    let ioctls = receiver.latest("gpuwarden.container.ioctls").unwrap();
    assert!(
        points(&ioctls)
            .iter()
            .filter(|(attrs, _)| has(attrs, "container.id", &id))
            .all(|(attrs, _)| has(attrs, "k8s.pod.name", "train-0")),
        "every series of the container carries the pod name"
    );
    wait_for("the kubelet requests counted", || {
        receiver
            .latest("gpuwarden.agent.kubelet.requests")
            .is_some_and(|m| {
                points(&m)
                    .iter()
                    .any(|(attrs, v)| has(attrs, "gpuwarden.result", "ok") && *v >= 2.0)
            })
    });
    a.exit();
    drop(agent);
}

/// A kubelet that isn't there: the pod keeps its UID, gets no name, the agent answers as usual,
/// and the failed requests are counted by result.
#[test]
#[ignore = "needs root"]
fn an_unreachable_kubelet_leaves_names_absent_and_the_agent_healthy() {
    require_root();
    let (uid, id) = (pod_uid("nokubelet"), container_id("nokubelet"));
    // A port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let receiver = TestReceiver::start("127.0.0.1:0");
    let driver = Driver::mount("nokubelet");
    let state = scratch("agent");
    let mut cfg = config(&[driver.glob()], state.path());
    cfg.otlp_endpoint = Some(format!("http://{}", receiver.addr));
    cfg.metric_interval = Some(Duration::from_millis(300));
    cfg.kubelet = Some(KubeletConfig::plain(&format!(
        "http://127.0.0.1:{port}/pods"
    )));
    let agent = TestAgent::start_with(cfg);

    let cg = pod_cgroup(&uid, &id);
    let mut a = Client::spawn(&driver.dir, Some(&cg));
    let h = a.value("client", "client");
    let dev = a.value(&format!("device {h:#x} 0"), "handle");
    a.ok(&format!("alloc {h:#x} {dev:#x} 2m"));

    wait_for("a failed request for the pod's name", || {
        agent.snapshot().kubelet.is_some_and(|k| {
            k.state == "unreachable" && k.requests.get("unreachable").copied().unwrap_or(0) >= 2
        })
    });
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(memory(&c, "nvidia0"), 2 * MIB);
    assert_eq!(c.pod_uid.as_deref(), Some(uid.as_str()));
    assert_eq!((c.pod_name, c.pod_namespace), (None, None));
    let status = agent.snapshot().kubelet.unwrap();
    assert!(
        status
            .error
            .as_deref()
            .is_some_and(|e| e.contains("cannot connect")),
        "{status:?}"
    );
    assert_eq!(status.requests.get("ok"), None);

    wait_for("the pod's UID without a name in an export", || {
        receiver
            .latest("gpuwarden.container.gpu.memory.usage")
            .is_some_and(|m| {
                points(&m)
                    .iter()
                    .any(|(attrs, _)| has(attrs, "k8s.pod.uid", &uid))
            })
    });
    let m = receiver
        .latest("gpuwarden.container.gpu.memory.usage")
        .unwrap();
    let (attrs, _) = points(&m)
        .into_iter()
        .find(|(attrs, _)| has(attrs, "k8s.pod.uid", &uid))
        .unwrap();
    assert!(
        attrs
            .iter()
            .all(|(k, _)| k != "k8s.pod.name" && k != "k8s.namespace.name"),
        "{attrs:?}"
    );
    wait_for("the failed requests counted", || {
        receiver
            .latest("gpuwarden.agent.kubelet.requests")
            .is_some_and(|m| {
                points(&m)
                    .iter()
                    .any(|(attrs, v)| has(attrs, "gpuwarden.result", "unreachable") && *v >= 1.0)
            })
    });
    // Still healthy: more allocations are counted as usual.
    a.ok(&format!("alloc {h:#x} {dev:#x} 2m"));
    assert_eq!(
        memory(&agent.container(&cg.path).unwrap(), "nvidia0"),
        4 * MIB
    );
    a.exit();
    agent.stop().unwrap();
}
