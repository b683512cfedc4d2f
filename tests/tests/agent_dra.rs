//! The agent as a DRA kubelet plugin, against a fake kubelet built from the vendored kubelet
//! protos (over the real Unix sockets) and a fake API server on loopback serving ResourceClaims
//! written as the `resource.k8s.io/v1` API reference shows them; the ResourceSlices the agent
//! writes are checked against the API's published JSON schema (strict variant: no field the API
//! doesn't define). A controller on loopback hears of each prepared claim as a session it
//! observes (with its namespace, pod, claim and the pod's workload class) and shows it in its
//! allocation map. End to end, the prepared claim is enforced on the real kernel with the fake
//! NVIDIA driver, across a `kill -9` of the agent.

// Test helpers fail loudly on anything unexpected.
#![expect(
    clippy::unwrap_used,
    reason = "a test's helpers unwrap: a failure there is the test failing"
)]

#[path = "k8s_capacity_counters/counters.rs"]
#[expect(dead_code, reason = "the oracle's rollback is not used here")]
mod counters;
#[path = "dra_plugin/harness.rs"]
#[expect(
    dead_code,
    reason = "shared with the dra_* files; only the claims, names and ticks are used here"
)]
mod dra;
#[path = "agent_dra/fake_api.rs"]
mod fake_api;
#[path = "agent_dra/fake_kubelet.rs"]
mod fake_kubelet;
#[path = "agent_dra/schema.rs"]
mod schema;

use std::{
    fmt::Write as _,
    os::unix::process::ExitStatusExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use dra::{DRIVER, NODE, NODE_UID, POOL, partition_claim, shared_claim, wait_ticks};
use fake_api::FakeApi;
use fake_kubelet::{
    discover, notify, prepare_v1, prepare_v1beta1, unprepare_v1, unprepare_v1beta1,
};
use gpuwarden_agent::dra::{
    DraConfig,
    config::{ApiServerConfig, GpuSelection},
};
use gpuwarden_agent_api::{client, snapshot::Snapshot};
use gpuwarden_proto::v1 as pb;
use gpuwarden_test_support::{
    TestCgroup,
    agent::{self, TestAgent, pin_dir},
    controller::{TestController, fast_timing},
    devnode::{mknod, open_in},
    ids::{container_id, pod_uid},
    require_root, scratch,
    wait::{eventually, wait_for},
};
use gpuwarden_tests::harness::{Client, Driver};
use schema::Schema;
use serde_json::{Value, json};

const MIB: u64 = 1 << 20;

/// The pod `train-0` as `GET /api/v1/namespaces/ml/pods/train-0` returns it: a replica of
/// Deployment `train` (its `ReplicaSet` `train-7d9f8c6b5` with the matching `pod-template-hash`).
fn pod(uid: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "train-0", "namespace": "ml", "uid": uid, "resourceVersion": "5151",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"app": "train", "pod-template-hash": "7d9f8c6b5"},
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train-7d9f8c6b5",
                "uid": "0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6", "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "train", "image": "registry.example/train:1.0",
                            "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "half"}],
        },
    })
}

/// Mock GPUs whose device nodes are `nodes` (files the agent checks are there).
fn mock_file(dir: &Path, nodes: &[PathBuf]) -> PathBuf {
    let mut toml = String::new();
    for (i, node) in nodes.iter().enumerate() {
        writeln!(
            toml,
            "[[devices]]\nuuid = \"GPU-dra-{i}\"\nmodel_name = \"Mock H100\"\nnuma_node = {}\nmemory_size = \"16G\"\ndevice_node = \"{}\"",
            i % 2,
            node.display()
        )
        .unwrap();
    }
    let path = dir.join("mock.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// The kubelet's directories, the CDI directory and the API token, in a scratch directory.
struct KubeletDirs {
    registry: PathBuf,
    plugins: PathBuf,
    cdi: PathBuf,
    token: PathBuf,
}

impl KubeletDirs {
    fn new(root: &Path) -> Self {
        let token = root.join("token");
        std::fs::write(&token, "test-token\n").unwrap();
        Self {
            registry: root.join("plugins_registry"),
            plugins: root.join("plugins"),
            cdi: root.join("cdi"),
            token,
        }
    }

    fn endpoint(&self) -> PathBuf {
        self.plugins.join(DRIVER).join("dra.sock")
    }
}

/// The ResourceSlice writes (POST, PUT) the fake API server saw, in order.
fn slice_writes(api: &FakeApi) -> Vec<Value> {
    api.seen()
        .into_iter()
        .filter(|s| (s.method == "POST" || s.method == "PUT") && s.path.contains("resourceslices"))
        .filter_map(|s| s.body)
        .collect()
}

/// Registration, prepare and unprepare over the sockets (v1 and v1beta1; repeats, an unknown
/// claim, a device the node lacks, a GPU kept for the controller, another node's claim), the
/// slice the agent publishes (checked against the API schema), and a lost GPU leaving it.
#[test]
#[ignore = "needs root"]
#[expect(
    clippy::many_single_char_names,
    clippy::too_many_lines,
    reason = "one letter per actor of the scenario"
)]
fn the_kubelet_registers_the_plugin_and_prepares_claims() {
    require_root();
    let rt = fake_api::runtime();
    let api = FakeApi::with_node(&rt, NODE, NODE_UID);
    let schema = Schema::load();
    let root = scratch("dra");
    let dev = root.path().join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    let nodes: Vec<PathBuf> = (0..3).map(|i| dev.join(format!("nvidia{i}"))).collect();
    for n in nodes.iter().chain([&dev.join("nvidiactl")]) {
        std::fs::write(n, "").unwrap();
    }
    let dirs = KubeletDirs::new(root.path());
    let state = scratch("dra-agent");
    let controller_state = scratch("dra-controller");
    let controller = TestController::builder(controller_state.path())
        .timing(fast_timing(Duration::from_secs(5)))
        .start();
    let mut cfg = agent::config(&[format!("{}/nvidia*", dev.display())], state.path());
    cfg.controller = Some(controller.url());
    cfg.mock_devices = Some(mock_file(root.path(), &nodes));
    cfg.rescan_interval = Duration::from_millis(200);
    cfg.dra = Some(DraConfig {
        gpus: GpuSelection::Indexes(vec![0, 1]),
        plugins_registry_dir: dirs.registry.clone(),
        plugins_dir: dirs.plugins.clone(),
        cdi_dir: dirs.cdi.clone(),
        policy: gpuwarden_agent::enforcement::quota::QuotaPolicy::default(),
        api: ApiServerConfig {
            url: api.url(),
            token_file: Some(dirs.token.clone()),
            ca_file: None,
        },
    });
    let agent = TestAgent::start_with(cfg);

    // The plugin watcher finds the registration socket; GetInfo names the endpoint.
    let (reg_socket, info) = rt.block_on(discover(&dirs.registry));
    assert_eq!(reg_socket, dirs.registry.join(format!("{DRIVER}-reg.sock")));
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(PathBuf::from(&info.endpoint), dirs.endpoint());
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    rt.block_on(notify(&reg_socket, true, ""));
    let endpoint = PathBuf::from(info.endpoint);

    // The slice: GPUs 0 and 1 (2 is the controller's), valid for the API.
    wait_for("the ResourceSlice", || !slice_writes(&api).is_empty());
    let slice = slice_writes(&api).remove(0);
    let errors = schema.check("io.k8s.api.resource.v1.ResourceSlice", &slice);
    assert!(errors.is_empty(), "{errors:#?}\n{slice:#}");
    // The check can fail: a field the API doesn't define, or a capacity of the wrong type.
    let mut wrong = slice.clone();
    wrong["spec"]["devices"][0]["shared"] = json!(true);
    wrong["spec"]["pool"]["generation"] = json!("1");
    assert_eq!(
        schema
            .check("io.k8s.api.resource.v1.ResourceSlice", &wrong)
            .len(),
        2
    );
    assert_eq!(slice["spec"]["driver"], DRIVER);
    assert_eq!(slice["spec"]["nodeName"], NODE);
    assert_eq!(
        slice["spec"]["pool"],
        json!({"name": NODE, "generation": 1, "resourceSliceCount": 1})
    );
    let devices = slice["spec"]["devices"].as_array().unwrap();
    let names: Vec<&str> = devices
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gpu-0", "gpu-1"]);
    for (i, d) in devices.iter().enumerate() {
        assert_eq!(d["attributes"]["uuid"]["string"], format!("GPU-dra-{i}"));
        assert_eq!(d["attributes"]["index"]["int"], i);
        assert_eq!(d["attributes"]["numaNode"]["int"], i % 2);
        assert_eq!(d["attributes"]["mig"]["bool"], false);
        assert_eq!(d["allowMultipleAllocations"], true);
        // Whole units, which kube-scheduler's allocator charges exactly (tests/k8s_capacity.rs).
        assert_eq!(d["capacity"]["milli"]["value"], "1000");
        assert_eq!(
            d["capacity"]["milli"]["requestPolicy"]["validRange"],
            json!({"min": "1", "max": "1000", "step": "1"})
        );
        // The mock file's `16G` is 16 GiB.
        assert_eq!(d["capacity"]["memory"]["value"], "16Gi");
        assert_eq!(
            d["capacity"]["memory"]["requestPolicy"]["validRange"]["step"],
            "1Mi"
        );
    }
    // Owned by its Node, so a deleted Node's slice is collected with it.
    assert_eq!(
        slice["metadata"]["ownerReferences"],
        json!([{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE_UID,
                "controller": true}])
    );

    // The kubelet restarts: it deletes its node's slices; the agent puts it back within a tick.
    let writes = slice_writes(&api).len();
    assert_eq!(api.kubelet_starts(NODE), 1);
    wait_for("the slice made again", || {
        api.slices().contains_key(&format!("{NODE}-{DRIVER}"))
    });
    let again = slice_writes(&api).pop().unwrap();
    assert_eq!(slice_writes(&api).len(), writes + 1);
    assert_eq!(again["spec"]["devices"], slice["spec"]["devices"]);
    assert_eq!(again["spec"]["pool"]["generation"], 2, "a generation up");
    // Left alone, it is checked at each tick (read) and not written again.
    wait_ticks(&api, 3);
    assert_eq!(slice_writes(&api).len(), writes + 1);

    // An API server with DRAConsumableCapacity off keeps the slice without
    // allowMultipleAllocations: the agent notices (and logs it loudly) rather than writing the
    // slice again at every tick; with the gate back on, the next restart's slice is whole again.
    api.set_gate_off(true);
    assert_eq!(api.kubelet_starts(NODE), 1);
    wait_for("the slice made again, gate off", || {
        api.slices().contains_key(&format!("{NODE}-{DRIVER}"))
    });
    let stored = &api.slices()[&format!("{NODE}-{DRIVER}")];
    assert!(
        stored["spec"]["devices"][0]
            .get("allowMultipleAllocations")
            .is_none()
    );
    wait_ticks(&api, 3);
    assert_eq!(
        slice_writes(&api).len(),
        writes + 2,
        "kept as the API server holds it"
    );
    api.set_gate_off(false);
    assert_eq!(api.kubelet_starts(NODE), 1);
    wait_for("the slice made again, gate on", || {
        api.slices().contains_key(&format!("{NODE}-{DRIVER}"))
    });
    let stored = &api.slices()[&format!("{NODE}-{DRIVER}")];
    assert_eq!(
        stored["spec"]["devices"][0]["allowMultipleAllocations"],
        true
    );
    assert_eq!(stored["spec"]["pool"]["generation"], 4);
    assert!(
        api.seen()
            .iter()
            .all(|s| s.authorization.as_deref() == Some("Bearer test-token")),
        "a request went without the token"
    );
    let claim_errors = schema.check(
        "io.k8s.api.resource.v1.ResourceClaim",
        &shared_claim("c", "u", NODE, "gpu-0", "p", "kill"),
    );
    assert!(
        claim_errors.is_empty(),
        "the fixture itself: {claim_errors:#?}"
    );

    // Claims: one to prepare, and each way one can't be.
    let pod = pod_uid("dra-pod");
    let half = ("ml", "11111111-1111-4111-8111-111111111111", "half");
    let ghost = ("ml", "22222222-2222-4222-8222-222222222222", "ghost");
    let far = ("ml", "33333333-3333-4333-8333-333333333333", "far");
    let kept = ("ml", "44444444-4444-4444-8444-444444444444", "kept");
    let other = ("ml", "55555555-5555-4555-8555-555555555555", "other");
    let beta = ("ml", "66666666-6666-4666-8666-666666666666", "beta");
    api.put_claim(shared_claim(half.2, half.1, NODE, "gpu-0", &pod, "kill"));
    api.put_claim(shared_claim(far.2, far.1, NODE, "gpu-7", &pod, "kill"));
    api.put_claim(shared_claim(kept.2, kept.1, NODE, "gpu-2", &pod, "kill"));
    api.put_claim(shared_claim(
        other.2, other.1, "node-b", "gpu-0", &pod, "kill",
    ));
    api.put_claim(shared_claim(beta.2, beta.1, NODE, "gpu-1", &pod, "stop"));
    api.put_pod(self::pod(&pod));
    let pod_errors = schema.check(
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        &self::pod(&pod)["metadata"],
    );
    assert!(pod_errors.is_empty(), "the pod fixture: {pod_errors:#?}");

    let answer = rt.block_on(prepare_v1(&endpoint, &[half, ghost, far, kept, other]));
    assert_eq!(answer.claims.len(), 5);
    let ok = &answer.claims[half.1];
    assert_eq!(ok.error, "");
    assert_eq!(ok.devices.len(), 1);
    let d = &ok.devices[0];
    assert_eq!(
        (d.pool_name.as_str(), d.device_name.as_str()),
        (NODE, "gpu-0")
    );
    assert_eq!(d.request_names, ["gpu"]);
    assert_eq!(d.cdi_device_ids, [format!("{DRIVER}/gpu={}", half.1)]);
    assert_eq!(
        d.share_id.as_deref(),
        Some("9d0c6f1e-3b7a-4f2e-8c5d-1a2b3c4d5e6f")
    );
    for (claim, words) in [
        (ghost, "ResourceClaim ml/ghost not found"),
        (far, "device gpu-7: this node has no such GPU"),
        (kept, "device gpu-2 is offered to the gpuwarden controller"),
        (
            other,
            "no device of driver gpu.gpuwarden.io in pool test-node",
        ),
    ] {
        let a = &answer.claims[claim.1];
        assert!(a.error.contains(words), "{}: {:?}", claim.2, a.error);
        assert!(a.devices.is_empty());
    }

    // The CDI spec lists the GPU's node and the control node, nothing else.
    let spec_path = dirs.cdi.join(format!("{DRIVER}-{}.json", half.1));
    let spec: Value = serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
    assert_eq!(
        spec,
        // 0.5.0: the lowest version with `hostPath` (and names starting with a digit).
        json!({"cdiVersion": "0.5.0", "kind": "gpu.gpuwarden.io/gpu", "devices": [{
            "name": half.1,
            "containerEdits": {"deviceNodes": [
                {"path": "/dev/nvidia0", "hostPath": nodes[0].display().to_string()},
                {"path": "/dev/nvidiactl", "hostPath": dev.join("nvidiactl").display().to_string()},
            ]},
        }]})
    );

    // The quota reached enforcement, bound to the pod (whose cgroup doesn't exist here).
    let session = format!("k8s-{}", half.1);
    let binding = |s: &Snapshot| s.bindings.iter().any(|b| b.session_id == session);
    wait_for("the claim's quota", || binding(&agent.snapshot()));
    let s = agent.snapshot();
    let b = s.bindings.iter().find(|b| b.session_id == session).unwrap();
    assert_eq!(b.state, "pending", "{b:?}");

    // The controller observes the claim as a session it did not place: Kubernetes' namespace,
    // pod and claim, the Deployment's class, its shares in the allocation map of GPU 0 (offered
    // to Kubernetes), none on GPU 2 (the controller's).
    let observed = rt.block_on(observed_session(&controller, &session));
    assert_eq!(observed.origin, "dra");
    assert_eq!(observed.owner, "k8s:ml");
    assert_eq!(observed.state(), pb::SessionState::Running);
    assert_eq!(observed.node_id, NODE);
    // The Deployment's class, filed within its namespace.
    assert_eq!(observed.class, "k8s:ml/train");
    let k = observed.kubernetes.clone().unwrap();
    assert_eq!(
        (
            k.namespace.as_str(),
            k.claim_name.as_str(),
            k.claim_uid.as_str(),
            k.pod_name.as_str(),
            k.pod_uid.as_str()
        ),
        ("ml", "half", half.1, "train-0", pod.as_str())
    );
    let shares: Vec<(u32, &str, u64)> = observed
        .devices
        .iter()
        .map(|d| (d.index, d.shares.as_str(), d.memory_bytes))
        .collect();
    assert_eq!(shares, [(0, "0.5", 256 * MIB)]);
    let map = rt.block_on(allocation_map(&controller));
    let row = |i: u32| map.iter().find(|d| d.index == i).unwrap();
    assert!(row(0).kubernetes && !row(2).kubernetes);
    assert_eq!(row(0).allocated_shares, "0.5");
    assert_eq!(row(0).allocated_memory_bytes, 256 * MIB);
    assert_eq!(row(0).sessions, std::slice::from_ref(&session));
    assert_eq!(row(2).allocated_shares, "0");
    // Nobody but Kubernetes ends it.
    let refused = rt
        .block_on(async {
            controller
                .client()
                .await
                .terminate_session(pb::TerminateSessionRequest {
                    id: session.clone(),
                })
                .await
        })
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("Kubernetes claim ml/half"),
        "{refused:?}"
    );

    // Repeated: the same answer, from the agent's record (no second read of the claim).
    let gets = |api: &FakeApi| {
        api.seen()
            .iter()
            .filter(|s| s.path.ends_with("/half"))
            .count()
    };
    let before = gets(&api);
    let again = rt.block_on(prepare_v1(&endpoint, &[half]));
    assert_eq!(again.claims[half.1], answer.claims[half.1]);
    assert_eq!(gets(&api), before);

    // v1beta1: the same service without share ids.
    let b1 = rt.block_on(prepare_v1beta1(&endpoint, &[beta, ghost]));
    let ok = &b1.claims[beta.1];
    assert_eq!(ok.error, "");
    assert_eq!(ok.devices[0].device_name, "gpu-1");
    assert_eq!(
        ok.devices[0].cdi_device_ids,
        [format!("{DRIVER}/gpu={}", beta.1)]
    );
    assert!(b1.claims[ghost.1].error.contains("not found"));

    // Unprepare: quota, spec and record gone; again, and for an unknown claim, still success.
    for _ in 0..2 {
        let u = rt.block_on(unprepare_v1(&endpoint, &[half, ghost]));
        assert_eq!(u.claims.len(), 2);
        assert!(u.claims.values().all(|c| c.error.is_empty()), "{u:?}");
    }
    assert!(!spec_path.exists());
    wait_for("the quota to be lifted", || !binding(&agent.snapshot()));
    // The controller's session ended with the claim, its shares back.
    rt.block_on(eventually("the observed session to end", || async {
        observed_session(&controller, &session).await.state() == pb::SessionState::Terminated
    }));
    let map = rt.block_on(allocation_map(&controller));
    let gpu0 = map.iter().find(|d| d.index == 0).unwrap();
    assert_eq!(
        (gpu0.allocated_shares.as_str(), gpu0.sessions.len()),
        ("0", 0)
    );
    let u = rt.block_on(unprepare_v1beta1(&endpoint, &[beta]));
    assert_eq!(u.claims[beta.1].error, "");
    // Prepared again after unprepare: read from the API again.
    let re = rt.block_on(prepare_v1(&endpoint, &[half]));
    assert_eq!(re.claims[half.1], answer.claims[half.1]);
    assert_eq!(gets(&api), before + 1);

    // A GPU lost (its device node gone): tainted, so no new claim is allocated it.
    std::fs::remove_file(&nodes[1]).unwrap();
    let before_loss = slice_writes(&api).len();
    wait_for("the slice with gpu-1 tainted", || {
        slice_writes(&api).len() > before_loss
    });
    let slice = slice_writes(&api).pop().unwrap();
    let errors = schema.check("io.k8s.api.resource.v1.ResourceSlice", &slice);
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(slice["spec"]["pool"]["generation"], 5);
    let names = |slice: &Value| -> Vec<String> {
        slice["spec"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(&slice), ["gpu-0", "gpu-1"]);
    assert!(slice["spec"]["devices"][0].get("taints").is_none());
    assert_eq!(
        slice["spec"]["devices"][1]["taints"],
        json!([{"key": "gpu.gpuwarden.io/unhealthy", "value": "device-node-missing",
                "effect": "NoSchedule"}])
    );
    // The API server adds the taint's timeAdded: still the same slice, not written again.
    let key = format!("{NODE}-{DRIVER}");
    api.edit_slice(&key, |s| {
        s["spec"]["devices"][1]["taints"][0]["timeAdded"] = json!("2026-01-01T00:00:00Z");
    });
    let writes = slice_writes(&api).len();
    wait_ticks(&api, 3);
    assert_eq!(slice_writes(&api).len(), writes);
    // An API server without DRADeviceTaints drops taints, which would show gpu-1 healthy: the
    // agent leaves it out instead.
    api.set_taints_off(true);
    assert_eq!(api.kubelet_starts(NODE), 1);
    wait_for("the slice without gpu-1", || {
        api.slices()
            .get(&key)
            .is_some_and(|s| names(s) == ["gpu-0"])
    });
    assert_eq!(api.slices()[&key]["spec"]["pool"]["generation"], 7);
    assert!(api.slices()[&key]["metadata"]["resourceVersion"].is_string());

    agent.stop().unwrap();
    // Stopped: the sockets are gone, so the kubelet unregisters the plugin.
    assert!(!reg_socket.exists());
    assert!(!endpoint.exists());
}

/// The agent watches its slice: one deleted while the agent's tick is far away (ten minutes)
/// and no kubelet registers is back at once, through the watch alone.
#[test]
#[ignore = "needs root"]
fn a_deleted_slice_is_back_through_the_watch_before_the_tick() {
    require_root();
    let rt = fake_api::runtime();
    let api = FakeApi::with_node(&rt, NODE, NODE_UID);
    let root = scratch("dra-watch");
    let dev = root.path().join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    let nodes = vec![dev.join("nvidia0")];
    std::fs::write(&nodes[0], "").unwrap();
    let dirs = KubeletDirs::new(root.path());
    let state = scratch("dra-watch-agent");
    let mut cfg = agent::config(&[format!("{}/nvidia*", dev.display())], state.path());
    cfg.mock_devices = Some(mock_file(root.path(), &nodes));
    cfg.rescan_interval = Duration::from_mins(10);
    cfg.dra = Some(DraConfig {
        gpus: GpuSelection::Indexes(vec![0]),
        plugins_registry_dir: dirs.registry.clone(),
        plugins_dir: dirs.plugins.clone(),
        cdi_dir: dirs.cdi.clone(),
        policy: gpuwarden_agent::enforcement::quota::QuotaPolicy::default(),
        api: ApiServerConfig {
            url: api.url(),
            token_file: Some(dirs.token.clone()),
            ca_file: None,
        },
    });
    let agent = TestAgent::start_with(cfg);
    let key = format!("{NODE}-{DRIVER}");
    wait_for("the slice", || api.slices().contains_key(&key));
    wait_for("the watch", || api.slice_watches() == 1);
    assert_eq!(api.kubelet_starts(NODE), 1);
    let deleted = Instant::now();
    wait_for("the slice made again", || api.slices().contains_key(&key));
    assert!(
        deleted.elapsed() < Duration::from_mins(1),
        "long before the tick"
    );
    assert_eq!(api.slices()[&key]["spec"]["pool"]["generation"], 2);
    agent.stop().unwrap();
}

/// Session `id` as the controller lists it, once it does.
async fn observed_session(controller: &TestController, id: &str) -> pb::Session {
    let mut client = controller.client().await;
    let deadline = Instant::now() + gpuwarden_test_support::wait::PATIENCE;
    loop {
        let list = client
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .unwrap()
            .into_inner();
        if let Some(s) = list.sessions.into_iter().find(|s| s.id == id) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for the controller to list {id}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The controller's allocation map of the node.
async fn allocation_map(controller: &TestController) -> Vec<pb::DeviceAllocation> {
    let map = controller
        .client()
        .await
        .get_allocation_map(pb::GetAllocationMapRequest {
            node_id: NODE.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    map.nodes.into_iter().next().unwrap().devices
}

/// An agent process (so it can be `kill -9`ed), killed when dropped.
struct AgentProcess(Child);

impl AgentProcess {
    fn spawn(config: &Path) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_agent-under-test"))
            .arg("run")
            .arg("--config")
            .arg(config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Self(child)
    }

    fn kill9(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A client in `cg` on GPU 0 of the fake driver: (client, client handle, device handle).
fn client_on_gpu0(driver: &Driver, cg: &TestCgroup) -> (Client, u64, u64) {
    let mut c = Client::spawn(&driver.dir, Some(cg));
    let h = c.value("client", "client");
    let dev = c.value(&format!("device {h:#x} 0"), "handle");
    (c, h, dev)
}

/// A claim for 0.5 of GPU 0 and 256 MiB, prepared by the kubelet for a pod whose container
/// cgroup exists: past 256 MiB the container's process is killed, the other GPU does not open;
/// `kill -9` of the agent changes neither, and the restarted agent answers the repeated prepare
/// the same; unprepared, both limits are lifted.
#[test]
#[ignore = "needs root"]
#[expect(
    clippy::many_single_char_names,
    clippy::too_many_lines,
    reason = "one letter per actor of the scenario"
)]
fn a_prepared_claim_is_enforced_on_the_pod_across_an_agent_kill() {
    require_root();
    let rt = fake_api::runtime();
    let api = FakeApi::start(&rt);
    let driver = Driver::mount("dra-e2e");
    let root = scratch("dra-e2e");
    let dirs = KubeletDirs::new(root.path());
    let mock = mock_file(
        root.path(),
        &[driver.dir.join("nvidia0"), driver.dir.join("nvidia1")],
    );
    let state = scratch("dra-e2e-agent");
    let pins = pin_dir(state.path());
    let config = root.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            r#"gpu_devices = ["{glob}"]
socket = "{state}/agent.sock"
state_dir = "{state}"
node_name = "{NODE}"
bpf_pin_dir = "{pins}"
mock_devices = "{mock}"
rescan_interval_secs = 1

[dra]
enabled = true
gpus = "all"
plugins_registry_dir = "{registry}"
plugins_dir = "{plugins}"
cdi_dir = "{cdi}"
api_server = "{api}"
api_token_file = "{token}"
"#,
            glob = driver.glob(),
            state = state.path().display(),
            pins = pins.display(),
            mock = mock.display(),
            registry = dirs.registry.display(),
            plugins = dirs.plugins.display(),
            cdi = dirs.cdi.display(),
            api = api.url(),
            token = dirs.token.display(),
        ),
    )
    .unwrap();
    let socket = state.path().join("agent.sock");
    let snapshot = || rt.block_on(client::snapshot(&socket));

    // The pod's container, in the systemd cgroup layout of the kubelet.
    let pod = pod_uid("dra-e2e");
    let cg = TestCgroup::create(&format!(
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{}.scope",
        pod.replace('-', "_"),
        container_id("dra-e2e")
    ));
    let claim_id = ("ml", "77777777-7777-4777-8777-777777777777", "half");
    api.put_claim(shared_claim(
        claim_id.2, claim_id.1, NODE, "gpu-0", &pod, "kill",
    ));
    let nodes = scratch("dra-nodes");
    for (name, minor) in [("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)] {
        mknod(&nodes.path().join(name), 195, minor);
    }
    let open = |name: &str| open_in(&cg, &nodes.path().join(name));

    let mut agent = AgentProcess::spawn(&config);
    let (_, info) = rt.block_on(discover(&dirs.registry));
    let endpoint = PathBuf::from(info.endpoint);
    let first = rt.block_on(prepare_v1(&endpoint, &[claim_id]));
    assert_eq!(first.claims[claim_id.1].error, "");
    let session = format!("k8s-{}", claim_id.1);
    wait_for("the claim's quota to bind to the pod", || {
        snapshot().is_ok_and(|s| {
            s.bindings
                .iter()
                .any(|b| b.session_id == session && b.state == "bound")
        })
    });

    // Past 256 MiB: killed. The other GPU: refused.
    let (mut a, h, dev) = client_on_gpu0(&driver, &cg);
    a.ok(&format!("alloc {h:#x} {dev:#x} 200m"));
    a.send_only(&format!("alloc {h:#x} {dev:#x} 100m"));
    assert_eq!(a.wait().signal(), Some(libc::SIGKILL));
    assert_eq!(open("nvidia0"), libc::ENXIO);
    assert_eq!(open("nvidia1"), libc::EPERM);

    // kill -9: the pinned programs keep enforcing the claim.
    agent.kill9();
    let (mut b, h, dev) = client_on_gpu0(&driver, &cg);
    b.ok(&format!("alloc {h:#x} {dev:#x} 200m"));
    b.send_only(&format!("alloc {h:#x} {dev:#x} 100m"));
    assert_eq!(b.wait().signal(), Some(libc::SIGKILL));
    assert_eq!(open("nvidia1"), libc::EPERM);

    // Restarted: the kubelet registers it again and repeats the prepare; same answer.
    let mut agent = AgentProcess::spawn(&config);
    wait_for("the restarted agent", || snapshot().is_ok());
    let (_, info) = rt.block_on(discover(&dirs.registry));
    assert_eq!(PathBuf::from(&info.endpoint), endpoint);
    let again = rt.block_on(prepare_v1(&endpoint, &[claim_id]));
    assert_eq!(again, first);
    wait_for("the restarted agent to hold the quota", || {
        snapshot().is_ok_and(|s| {
            s.bindings
                .iter()
                .any(|b| b.session_id == session && b.state == "bound")
        })
    });
    let s = snapshot().unwrap();
    let c = s
        .containers
        .iter()
        .find(|c| c.cgroup_path == cg.path)
        .unwrap();
    let quota = c.quota.as_ref().unwrap();
    assert_eq!(
        (quota.memory_bytes, quota.policy.as_str()),
        (256 * MIB, "kill")
    );

    // Unprepared: both limits lifted.
    let u = rt.block_on(unprepare_v1(&endpoint, &[claim_id]));
    assert_eq!(u.claims[claim_id.1].error, "");
    wait_for("the quota to be lifted", || {
        snapshot().is_ok_and(|s| s.bindings.iter().all(|b| b.session_id != session))
    });
    // The device rule goes with it, a moment after the binding: ENXIO is the node's own answer,
    // past the cgroup's device check (EPERM while the rule holds).
    wait_for("the other GPU to be reachable again", || {
        open("nvidia1") == libc::ENXIO
    });
    let (c, h, dev) = client_on_gpu0(&driver, &cg);
    let mut c = c;
    c.ok(&format!("alloc {h:#x} {dev:#x} 300m"));
    c.exit();
    agent.kill9();
    let _ = std::fs::remove_dir_all(&pins);
}

/// A MIG instance's device entry (its profile, parent and ids as attributes) is one the API
/// accepts, by its published schema.
#[test]
fn a_mig_instance_device_passes_the_api_schema() {
    let instance = gpuwarden_agent::devices::GpuDevice {
        uuid: "MIG-6a4c2f9e-0000-4000-8000-000000000011".into(),
        model: "NVIDIA H200 MIG 1g.18gb".into(),
        memory_bytes: 16 << 30,
        numa_node: 0,
        sm_count: 16,
        is_mig: true,
        index: 2,
        device_node: "/dev/nvidia1".into(),
        mig: Some(gpuwarden_agent::devices::mig::MigInstance {
            parent_index: 1,
            parent_uuid: "GPU-6a4c2f9e-0000-4000-8000-000000000001".into(),
            gpu_instance: 13,
            compute_instance: 0,
            profile: "1g.18gb".into(),
            gi_cap_minor: Some(120),
            ci_cap_minor: Some(121),
        }),
    };
    let device = gpuwarden_agent::dra::slice::device(&instance, Some("580.159"));
    assert_eq!(device["attributes"]["migProfile"]["string"], "1g.18gb");
    let errors = Schema::load().check("io.k8s.api.resource.v1.Device", &device);
    assert!(errors.is_empty(), "{errors:#?}");
}

/// The slices of the node's MIG partition pool the fake API server holds.
fn partition_slices(api: &FakeApi) -> Vec<Value> {
    api.slices()
        .into_values()
        .filter(|s| s["spec"]["pool"]["name"] == POOL)
        .collect()
}

/// The partition pool of reconfigurable GPUs on the API server (docs/mig.md, "DRA"): written
/// whole at one generation (schema-valid, each slice of the pool there), kept when unchanged,
/// written again at the next generation when a GPU's layout or the GPUs change (slices no longer
/// wanted deleted), made again when one is deleted, refused on Kubernetes before 1.35, and
/// backed out of where the API server drops the counters (`DRAPartitionableDevices` off).
#[test]
#[expect(clippy::too_many_lines, reason = "one scenario, step by step")]
fn the_partition_pool_is_written_whole_and_backs_out_without_the_gate() {
    use gpuwarden_agent::{
        devices::placement::{H100_80GB, H200_141GB, Layout},
        dra::{
            apiserver::ApiServer,
            partition::{self, Outcome, PartitionedGpu, Unsupported},
        },
    };
    let rt = fake_api::runtime();
    let api = FakeApi::start(&rt);
    let client = ApiServer::new(&ApiServerConfig {
        url: api.url(),
        token_file: None,
        ca_file: None,
    })
    .unwrap();
    let schema = Schema::load();
    let gpu = |index: u32, layout: Layout| {
        (
            PartitionedGpu {
                uuid: format!("GPU-part-{index}"),
                index,
                layout,
            },
            format!("model-{index}"),
        )
    };
    let publish = |wanted: &[partition::PartitionSlice], last: i64| {
        rt.block_on(partition::publish(&client, NODE, wanted, None, last))
            .unwrap()
    };

    // The version gate: 1.35 and later.
    assert_eq!(rt.block_on(partition::supported(&client)).unwrap(), Ok(()));
    api.set_version("v1.34.3");
    assert_eq!(
        rt.block_on(partition::supported(&client)).unwrap(),
        Err(Unsupported::Version(Some((1, 34))))
    );
    api.set_version("v1.35.1");

    // Three empty H200s: one counter slice, devices over two slices (25 each, 64 at most).
    let three: Vec<_> = (0..3).map(|i| gpu(i, Layout::empty(&H200_141GB))).collect();
    let wanted = partition::slices(NODE, &three);
    assert_eq!(
        publish(&wanted, 0),
        Outcome::Published {
            generation: 1,
            changed: true
        }
    );
    let stored = partition_slices(&api);
    assert_eq!(stored.len(), wanted.len());
    let mut devices = 0;
    for s in &stored {
        let errors = schema.check("io.k8s.api.resource.v1.ResourceSlice", s);
        assert!(errors.is_empty(), "{errors:#?}");
        assert_eq!(
            s["spec"]["pool"],
            json!({"name": POOL, "generation": 1, "resourceSliceCount": stored.len()})
        );
        assert_eq!(s["spec"]["nodeName"], NODE);
        devices += s["spec"]["devices"].as_array().map_or(0, Vec::len);
    }
    // Every start of every profile on each GPU, as NVIDIA's MIG user guide lists the H200's
    // placements (not the agent's table): 1g.18gb and 1g.18gb+me at 0-6, 1g.35gb at 0, 2, 4,
    // 6, 2g.35gb at 0, 2, 4, 3g.71gb at 0, 4, 4g.71gb and 7g.141gb at 0.
    let per_gpu = 7 + 7 + 4 + 3 + 2 + 1 + 1;
    assert_eq!(devices, 3 * per_gpu);
    // The node's own pool is not touched.
    assert!(api.slices().keys().all(|k| k.contains("-mig-")));

    // Unchanged: nothing written.
    let writes = slice_writes(&api).len();
    assert_eq!(
        publish(&wanted, 1),
        Outcome::Published {
            generation: 1,
            changed: false
        }
    );
    assert_eq!(slice_writes(&api).len(), writes);

    // A layout changed (a 7g on GPU 2), one GPU fewer: the next generation everywhere, the
    // slices no longer needed gone.
    let seven = H200_141GB.profile("7g.141gb").unwrap();
    let mut full = Layout::empty(&H200_141GB);
    full.instances.push((seven, seven.placement_at(0).unwrap()));
    let two = vec![gpu(0, Layout::empty(&H100_80GB)), gpu(2, full)];
    let smaller = partition::slices(NODE, &two);
    assert!(smaller.len() < wanted.len());
    assert_eq!(
        publish(&smaller, 1),
        Outcome::Published {
            generation: 2,
            changed: true
        }
    );
    let stored = partition_slices(&api);
    assert_eq!(stored.len(), smaller.len());
    assert!(stored.iter().all(|s| s["spec"]["pool"]["generation"] == 2
        && s["spec"]["pool"]["resourceSliceCount"] == smaller.len()));
    let names: Vec<String> = stored
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(names.iter().all(|n| n.starts_with("gpu-0-")), "{names:?}");

    // A slice deleted by someone: the pool written again.
    let victim = smaller[0].name.clone();
    rt.block_on(client.request(
        hyper::Method::DELETE,
        &format!("{}/{victim}", gpuwarden_agent::dra::slice::SLICES),
        None,
    ))
    .unwrap();
    assert_eq!(
        publish(&smaller, 2),
        Outcome::Published {
            generation: 3,
            changed: true
        }
    );
    assert_eq!(partition_slices(&api).len(), smaller.len());

    // No reconfigurable GPU left: the pool is deleted.
    publish(&[], 3);
    assert!(partition_slices(&api).is_empty());

    // The gate off in kube-apiserver: the counters are dropped, nothing stays.
    api.set_partitions_off(true);
    let before = slice_writes(&api).len();
    assert_eq!(
        publish(&wanted, 3),
        Outcome::Unsupported(Unsupported::GateOff)
    );
    assert!(partition_slices(&api).is_empty());
    // The counters went first: no device slice was ever written without them.
    let written: Vec<Value> = slice_writes(&api).split_off(before);
    assert!(
        written
            .iter()
            .all(|s| s["spec"]["devices"].as_array().is_none_or(Vec::is_empty)),
        "{written:#?}"
    );
}

/// The agent itself, on mock GPUs (`deploy/mock-devices-mig-on-demand.toml`: GPU-1 an H200 with
/// the operator's `3g.71gb` at slices 4-7 and listed in `mig_reconfigurable`, GPU-2 an empty
/// H200 not listed): its plugin publishes the partition pool of GPU-1 alone, the held slices
/// left out, beside the node's slice; a claim allocated a partition there is prepared (the
/// pool republished without the placements its instance overlaps) and unprepared (every
/// placement back).
#[test]
#[ignore = "needs root"]
#[expect(clippy::too_many_lines, reason = "one scenario, step by step")]
fn the_agent_publishes_partitions_of_the_reconfigurable_gpu_only() {
    require_root();
    let rt = fake_api::runtime();
    let api = FakeApi::with_node(&rt, NODE, NODE_UID);
    let root = scratch("dra-partitions");
    let dev = root.path().join("dev");
    std::fs::create_dir_all(&dev).unwrap();
    let dirs = KubeletDirs::new(root.path());
    let state = scratch("dra-partitions-agent");
    let mut cfg = agent::config(&[format!("{}/nvidia*", dev.display())], state.path());
    cfg.mock_devices = Some(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/mock-devices-mig-on-demand.toml"),
    );
    cfg.mig_reconfigurable = vec!["GPU-1".into()];
    cfg.rescan_interval = Duration::from_millis(200);
    cfg.dra = Some(DraConfig {
        gpus: GpuSelection::Keyword("all".into()),
        plugins_registry_dir: dirs.registry.clone(),
        plugins_dir: dirs.plugins.clone(),
        cdi_dir: dirs.cdi.clone(),
        policy: gpuwarden_agent::enforcement::quota::QuotaPolicy::default(),
        api: ApiServerConfig {
            url: api.url(),
            token_file: Some(dirs.token.clone()),
            ca_file: None,
        },
    });
    let agent = TestAgent::start_with(cfg);
    wait_for("the partition pool", || {
        let s = partition_slices(&api);
        !s.is_empty() && s.iter().any(|s| s["spec"]["devices"].is_array())
    });
    assert!(api.slices().contains_key(&format!("{NODE}-{DRIVER}")));
    let schema = Schema::load();
    let stored = partition_slices(&api);
    for s in &stored {
        let errors = schema.check("io.k8s.api.resource.v1.ResourceSlice", s);
        assert!(errors.is_empty(), "{errors:#?}");
    }
    let sets: Vec<&Value> = stored
        .iter()
        .filter_map(|s| s["spec"]["sharedCounters"].as_array())
        .flatten()
        .collect();
    assert_eq!(sets.len(), 1, "{sets:#?}");
    let counters = &sets[0]["counters"];
    for i in 0..8 {
        let want = if i < 4 { "1" } else { "0" };
        assert_eq!(
            counters[format!("memory-slice-{i}")]["value"],
            want,
            "slice {i}"
        );
    }
    let devices: Vec<&Value> = stored
        .iter()
        .filter_map(|s| s["spec"]["devices"].as_array())
        .flatten()
        .collect();
    assert!(!devices.is_empty());
    for d in &devices {
        assert_eq!(d["attributes"]["parentUUID"]["string"], "GPU-1");
        let start = d["attributes"]["memorySliceStart"]["int"].as_u64().unwrap();
        let size = d["attributes"]["memorySlices"]["int"].as_u64().unwrap();
        assert!(start + size <= 4, "{d:#}");
    }

    // A claim allocated a partition, picked by the scheduler's arithmetic on what was
    // published: prepared by the agent, the pool republished without the placements its
    // instance overlaps; unprepared, every placement offered again.
    let first: std::collections::BTreeSet<String> = devices
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .collect();
    let gathered = counters::gather(&stored, true);
    let counters::Pool::Ready {
        devices: offered, ..
    } = &gathered
    else {
        panic!("pool not ready: {gathered:?}")
    };
    let mut scheduler = counters::Allocator::new(&gathered, &[], true);
    let chosen = offered
        .iter()
        .find(|d| {
            d.value["attributes"]["migProfile"]["string"] == "2g.35gb"
                && scheduler.allocate(&d.name)
        })
        .unwrap();
    let start = chosen.value["attributes"]["memorySliceStart"]["int"]
        .as_u64()
        .unwrap();
    let uid = "0a000000-0000-4000-8000-00000000000a";
    api.put_claim(partition_claim("mig", uid, &chosen.name));
    let answer = rt.block_on(prepare_v1(&dirs.endpoint(), &[("ml", uid, "mig")]));
    assert_eq!(answer.claims[uid].error, "");
    assert_eq!(answer.claims[uid].devices[0].device_name, chosen.name);
    let overlapping = |d: &Value| {
        let s = d["attributes"]["memorySliceStart"]["int"].as_u64().unwrap();
        let n = d["attributes"]["memorySlices"]["int"].as_u64().unwrap();
        s < start + 2 && start < s + n
    };
    wait_for("the pool without the instance's placements", || {
        let s = partition_slices(&api);
        let counters = s
            .iter()
            .filter_map(|s| s["spec"]["sharedCounters"].as_array())
            .flatten()
            .next()
            .map(|set| set["counters"].clone());
        let devices: Vec<&Value> = s
            .iter()
            .filter_map(|s| s["spec"]["devices"].as_array())
            .flatten()
            .collect();
        !devices.is_empty()
            && !devices.iter().any(|d| overlapping(d))
            && counters.is_some_and(|c| {
                (start..start + 2).all(|i| c[format!("memory-slice-{i}")]["value"] == "0")
            })
    });
    let done = rt.block_on(unprepare_v1(&dirs.endpoint(), &[("ml", uid, "mig")]));
    assert_eq!(done.claims[uid].error, "");
    wait_for("every placement offered again", || {
        let names: std::collections::BTreeSet<String> = partition_slices(&api)
            .iter()
            .filter_map(|s| s["spec"]["devices"].as_array())
            .flatten()
            .map(|d| d["name"].as_str().unwrap().to_owned())
            .collect();
        names == first
    });
    agent.stop().unwrap();
}
