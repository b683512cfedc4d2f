//! The DRA plugin in process, as the DRA tests run it: on the on-demand mock GPUs (GPU-1 an
//! H200 with the operator's `3g.71gb`, GPU-2 an H200 in MIG mode with no instance), behind the
//! fake API server and kubelet of `agent_dra/`; the claims that API server serves; and the
//! plugin's ticks as that server counts them. Included by `#[path]` in each DRA test file,
//! beside `fake_api` and `fake_kubelet`.

use std::{fmt::Write as _, path::Path, sync::Arc, time::Duration};

use gpuwarden_agent::{
    control::Observed,
    devices::{GpuBackend, mock::MockBackend},
    dra::{
        self, DraConfig,
        config::{ApiServerConfig, GpuSelection},
    },
    enforcement::{QuotaCommand, quota::QuotaSpec},
};
use serde_json::{Value, json};

use gpuwarden_test_support::{scratch, wait::wait_for};

use super::fake_api::FakeApi;

pub const DRIVER: &str = "gpu.gpuwarden.io";
pub const NODE: &str = "test-node";
/// The node's partition pool.
pub const POOL: &str = "test-node/mig";
pub const POD: &str = "6b1e3f0c-2d4a-4c5b-9e8f-0a1b2c3d4e5f";
pub const NODE_UID: &str = "5e0f2a7c-9b1d-4e3f-8a6b-7c8d9e0f1a2b";

/// A ResourceClaim as `GET /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}`
/// returns it once kube-scheduler allocated it (consumable capacity: `consumedCapacity`,
/// `shareID`) and the pod `pod` reserved it, its `GpuConfig` asking `memory_policy`. A claim
/// allocated a partition is [`partition_claim`].
pub fn shared_claim(
    name: &str,
    uid: &str,
    pool: &str,
    device: &str,
    pod: &str,
    memory_policy: &str,
) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": claim_metadata(name, uid),
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 1,
                "capacity": {"requests": {"milli": "500", "memory": "256Mi"}},
            }}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "gpu.gpuwarden.io/v1alpha1", "kind": "GpuConfig",
                "memoryPolicy": memory_policy,
            }}}],
        }},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{
                        "request": "gpu", "driver": DRIVER, "pool": pool, "device": device,
                        // As the oracle of tests/k8s_capacity.rs charges it on the slice.
                        "consumedCapacity": {"milli": "500", "memory": "256Mi"},
                        "shareID": "9d0c6f1e-3b7a-4f2e-8c5d-1a2b3c4d5e6f",
                    }],
                    "config": [{"source": "FromClaim", "requests": ["gpu"], "opaque": {
                        "driver": DRIVER, "parameters": {
                            "apiVersion": "gpu.gpuwarden.io/v1alpha1", "kind": "GpuConfig",
                            "memoryPolicy": memory_policy,
                        }}}],
                },
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [pool]}]}]},
            },
            "reservedFor": [{"resource": "pods", "name": "train-0", "uid": pod}],
        },
    })
}

/// A claim's `metadata` as the API server returns it: namespace `ml`, a resource version and a
/// creation time.
fn claim_metadata(name: &str, uid: &str) -> Value {
    json!({
        "name": name, "namespace": "ml", "uid": uid, "resourceVersion": "4242",
        "creationTimestamp": "2026-01-01T00:00:00Z",
    })
}

/// A claim allocated `device` of the partition pool, as the API server returns it: no
/// `shareID` (a partition is not shared) and no consumed capacity.
pub fn partition_claim(name: &str, uid: &str, device: &str) -> Value {
    partition_claim_of(name, uid, &[device])
}

/// A claim allocated each of `devices` of the partition pool, one request each.
pub fn partition_claim_of(name: &str, uid: &str, devices: &[&str]) -> Value {
    let requests: Vec<Value> = (0..devices.len())
        .map(|i| {
            json!({"name": format!("mig{i}"), "exactly": {
                "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": 1,
            }})
        })
        .collect();
    let results: Vec<Value> = devices
        .iter()
        .enumerate()
        .map(|(i, device)| {
            json!({"request": format!("mig{i}"), "driver": DRIVER, "pool": POOL, "device": device})
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": claim_metadata(name, uid),
        "spec": {"devices": {"requests": requests}},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": "train-0", "uid": POD}],
        },
    })
}

/// The on-demand mock layout (GPU-0 whole; GPU-1 an H200 with the operator's `3g.71gb`
/// `MIG-ops`; GPU-2 an H200 in MIG mode with no instance), capability minors listed for the
/// instances of GPU-1 and GPU-2.
pub fn mock_backend(dir: &Path) -> Arc<MockBackend> {
    let mut minors = String::new();
    for gpu in 1..=2 {
        for gi in 0..15 {
            let base = 100 * gpu + gi * 10;
            writeln!(minors, "gpu{gpu}/gi{gi}/access {base}").unwrap();
            for ci in 0..8 {
                writeln!(minors, "gpu{gpu}/gi{gi}/ci{ci}/access {}", base + 1 + ci).unwrap();
            }
        }
    }
    std::fs::write(dir.join("mig-minors"), minors).unwrap();
    let text = format!(
        "mig_minors = \"mig-minors\"\n{}",
        include_str!("../../../deploy/mock-devices-mig-on-demand.toml")
    );
    let path = dir.join("mock.toml");
    Arc::new(MockBackend::from_toml(&text, &path).unwrap())
}

/// The node's slice, as the plugin names it.
pub fn node_slice_name() -> String {
    format!("{NODE}-{DRIVER}")
}

/// Waits until the plugin has run `n` whole ticks of its publisher from now, as the fake API
/// server counts them: each tick first tries again to destroy the instances left to destroy
/// (`Driver::destroy_doomed`), then reads the node's slice (`GET`, `slice::publish`), then
/// writes it when it differs and publishes the partition pool. A tick under way now may have
/// begun before the call, so `n + 1` reads from now span `n` whole ticks begun after it: what
/// a check made then sees is what those ticks did, not a tick that has not come yet.
///
/// # Panics
/// The plugin does not tick `n` times within [`PATIENCE`](gpuwarden_test_support::wait::PATIENCE).
pub fn wait_ticks(api: &FakeApi, n: usize) {
    let name = node_slice_name();
    let from = api.slice_reads(&name);
    wait_for(&format!("{n} ticks of the plugin"), || {
        api.slice_reads(&name) > from + n
    });
}

/// The DRA settings of a plugin under `root`, talking to `api`.
pub fn dra_config(root: &Path, api: &FakeApi) -> DraConfig {
    DraConfig {
        gpus: GpuSelection::Keyword("all".into()),
        plugins_registry_dir: root.join("plugins_registry"),
        plugins_dir: root.join("plugins"),
        cdi_dir: root.join("cdi"),
        policy: gpuwarden_agent::enforcement::quota::QuotaPolicy::default(),
        api: ApiServerConfig {
            url: api.url(),
            token_file: None,
            ca_file: None,
        },
    }
}

/// The plugin running on `rt`, and what stops it.
pub struct Running {
    pub stop: tokio::sync::oneshot::Sender<()>,
    pub task: tokio::task::JoinHandle<()>,
    /// What the plugin hands enforcement.
    pub quotas: tokio::sync::mpsc::UnboundedReceiver<QuotaCommand>,
    /// The quotas of claims prepared before, as the daemon enforces them at start.
    pub held: Vec<QuotaSpec>,
    /// The claims the controller link would report.
    pub observed: Arc<Observed>,
    /// The driver.
    pub driver: Arc<dra::plugin::Driver>,
}

impl Running {
    /// The plugin on `backend`, its claims in `db`'s `claims` tree (the same across restarts),
    /// publishing every 100 ms.
    pub fn start(
        rt: &tokio::runtime::Runtime,
        config: &DraConfig,
        backend: &Arc<MockBackend>,
        db: &sled::Db,
    ) -> Self {
        let tree = db.open_tree("claims").unwrap();
        let (to_enforcement, quotas) = tokio::sync::mpsc::unbounded_channel();
        let backend: Arc<dyn GpuBackend> = Arc::clone(backend) as Arc<dyn GpuBackend>;
        let plugin = {
            let _guard = rt.enter();
            dra::Plugin::open(
                config.clone(),
                NODE.to_owned(),
                backend,
                Some(tree),
                to_enforcement,
                &["GPU-1".to_owned()],
            )
            .unwrap()
        };
        let held = plugin.held.clone();
        let observed = Arc::clone(&plugin.observed);
        let driver = Arc::clone(&plugin.driver);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = rt.spawn(plugin.run(Duration::from_millis(100), async {
            let _ = stopped.await;
        }));
        Self {
            stop,
            task,
            quotas,
            held,
            observed,
            driver,
        }
    }

    pub fn stop(self, rt: &tokio::runtime::Runtime) {
        let _ = self.stop.send(());
        rt.block_on(self.task).unwrap();
    }

    /// The UUIDs the controller link's next registration names as offered to Kubernetes.
    pub fn registered(&self) -> Vec<String> {
        let mut u: Vec<String> = self
            .observed
            .kubernetes_devices()
            .iter()
            .map(|d| d.uuid.clone())
            .collect();
        u.sort();
        u
    }
}

/// What each DRA plugin test starts from: the fake API server with this node, mock GPUs (the
/// operator's instances made), the claim store's database and the plugin's configuration, in a
/// scratch directory tagged `tag`.
pub struct Scene {
    pub rt: tokio::runtime::Runtime,
    pub api: FakeApi,
    pub root: tempfile::TempDir,
    pub backend: Arc<MockBackend>,
    pub db: sled::Db,
    pub config: DraConfig,
    pub endpoint: std::path::PathBuf,
}

impl Scene {
    pub fn new(tag: &str) -> Self {
        let rt = super::fake_api::runtime();
        let api = FakeApi::with_node(&rt, NODE, NODE_UID);
        let root = scratch(tag);
        let backend = mock_backend(root.path());
        let db = sled::Config::new()
            .path(root.path().join("store"))
            .open()
            .unwrap();
        let config = dra_config(root.path(), &api);
        let endpoint = config.plugin_socket();
        Self {
            rt,
            api,
            root,
            backend,
            db,
            config,
            endpoint,
        }
    }
}
