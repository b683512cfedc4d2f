//! A controller and agents (the real agent link with mock devices) on loopback gRPC.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use gpuwarden_agent::{
    control::{
        holdings::{Holdings, SharedHoldings},
        link::{self as controller_link, LinkConfig},
    },
    devices::{GpuBackend, GpuDevice, SlotKind},
};
use gpuwarden_controller::{
    api::Timing,
    limits::{Bounds, Limits},
    scheduler::SchedulerConfig,
    server,
    store::StoreSpec,
};
use gpuwarden_proto::v1::{self as pb, scheduler_service_client::SchedulerServiceClient};
use tonic::transport::Channel;

/// Short heartbeats and scheduling passes, so tests wait milliseconds rather than seconds; a
/// node is lost after `heartbeat_timeout` of silence.
pub fn fast_timing(heartbeat_timeout: Duration) -> Timing {
    Timing {
        heartbeat_interval: Duration::from_millis(200),
        heartbeat_timeout,
        pass_interval: Duration::from_millis(50),
    }
}

/// A controller on its own runtime: dropping that runtime is as abrupt as killing the process.
pub struct TestController {
    pub addr: SocketAddr,
    pub state_dir: PathBuf,
    /// Its bounds, which count what it refuses (the metrics it exports read them).
    pub bounds: Arc<Bounds>,
    stop: Option<std::sync::mpsc::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestController {
    pub fn start(state_dir: &Path, config: SchedulerConfig, timing: Timing) -> Self {
        Self::start_with_metrics(state_dir, config, timing, None)
    }

    /// [`Self::start`], exporting OTLP metrics to `otlp` every 300 ms when given.
    pub fn start_with_metrics(
        state_dir: &Path,
        config: SchedulerConfig,
        timing: Timing,
        otlp: Option<String>,
    ) -> Self {
        Self::start_with_exporters(
            state_dir,
            config,
            timing,
            gpuwarden_runtime::otlp::Exporters {
                otlp,
                interval: Some(Duration::from_millis(300)),
                prometheus: None,
            },
        )
    }

    /// [`Self::start`], with its metrics going to `exporters`.
    pub fn start_with_exporters(
        state_dir: &Path,
        config: SchedulerConfig,
        timing: Timing,
        exporters: gpuwarden_runtime::otlp::Exporters,
    ) -> Self {
        let dir = state_dir.to_owned();
        Self::on_own_runtime(state_dir.to_owned(), move |rt, bounds, shutdown| {
            rt.block_on(async {
                let controller = server::open(&server::sled_in(&dir), config, timing)
                    .await
                    .unwrap();
                let metrics =
                    gpuwarden_controller::metrics::start(&controller, &bounds, &exporters).unwrap();
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = listener.local_addr().unwrap();
                tokio::spawn(server::serve_bounded(
                    controller,
                    listener,
                    server::Transport::PlainText,
                    bounds,
                    None,
                    async {
                        let _ = shutdown.await;
                    },
                ));
                // The metrics' callbacks hold the controller (and its store): kept until the
                // controller stops, let go of before its runtime.
                (addr, metrics)
            })
        })
    }

    /// A controller on the etcd store `store`, campaigning with a lease of `ttl`: a standby
    /// until it wins. Killed, its lease's keep-alive stops with everything else.
    pub fn start_elected(store: &StoreSpec, timing: Timing, ttl: Duration) -> Self {
        let store = store.clone();
        Self::on_own_runtime(PathBuf::new(), move |rt, bounds, shutdown| {
            let addr = rt
                .block_on(server::spawn_elected(
                    &store,
                    SchedulerConfig::default(),
                    timing,
                    ttl,
                    bounds,
                    async {
                        let _ = shutdown.await;
                    },
                ))
                .unwrap();
            (addr, ())
        })
    }

    /// Runs `start` on a runtime of its own in a thread of its own, with the bounds the
    /// controller is to be held to; what it returns besides the address is kept until the
    /// controller stops. Stopping gracefully lets the server shut down first; killing drops the
    /// runtime with every task mid-flight.
    fn on_own_runtime<G>(
        state_dir: PathBuf,
        start: impl FnOnce(
            &tokio::runtime::Runtime,
            Arc<Bounds>,
            tokio::sync::oneshot::Receiver<()>,
        ) -> (SocketAddr, G)
        + Send
        + 'static,
    ) -> Self {
        let bounds = Bounds::new(Limits::default());
        let held = Arc::clone(&bounds);
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<bool>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
            let (addr, kept) = start(&rt, held, shutdown_rx);
            addr_tx.send(addr).unwrap();
            if stopped.recv().unwrap_or(false) {
                let _ = shutdown_tx.send(());
                rt.block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
            }
            drop(kept);
            // Dropping the runtime drops every task, its store handle with them.
            rt.shutdown_background();
        });
        Self {
            addr: addr_rx.recv().unwrap(),
            state_dir,
            bounds,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Whether it answers as the leader.
    pub async fn leads(&self) -> bool {
        let Ok(channel) = tonic::transport::Endpoint::from_shared(self.url())
            .unwrap()
            .connect()
            .await
        else {
            return false;
        };
        SchedulerServiceClient::new(channel)
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .is_ok()
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn client(&self) -> SchedulerServiceClient<Channel> {
        let channel = tonic::transport::Endpoint::from_shared(self.url())
            .unwrap()
            .connect()
            .await
            .unwrap();
        SchedulerServiceClient::new(channel)
    }

    /// Stops abruptly: no graceful shutdown, tasks dropped mid-flight.
    pub fn kill(mut self) {
        self.halt(false);
    }

    fn halt(&mut self, graceful: bool) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(graceful);
        }
        if let Some(t) = self.thread.take() {
            // A panic there was already reported by its thread.
            let _ = t.join();
        }
        // The store's lock is released once its last handle drops; give the OS a moment.
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for TestController {
    fn drop(&mut self) {
        self.halt(true);
    }
}

/// Mock GPUs, optionally with an extra slot type that can vanish (a device plugin going away).
pub struct TestBackend {
    pub devices: Vec<GpuDevice>,
    pub extra: Option<(&'static str, &'static str)>,
    pub extra_gone: AtomicBool,
}

impl TestBackend {
    pub fn gpus(n: u32) -> Self {
        Self {
            devices: (0..n)
                .map(|i| GpuDevice {
                    uuid: format!("GPU-test-{i}"),
                    model: "Mock".into(),
                    memory_bytes: 16 << 30,
                    numa_node: 0,
                    sm_count: 132,
                    is_mig: false,
                    index: i,
                    device_node: format!("/dev/nvidia{i}"),
                })
                .collect(),
            extra: None,
            extra_gone: AtomicBool::new(false),
        }
    }
}

impl GpuBackend for TestBackend {
    fn name(&self) -> &'static str {
        "test"
    }

    fn devices(&self) -> &[GpuDevice] {
        &self.devices
    }

    fn extra_capacity(&self) -> Vec<(String, String)> {
        self.extra
            .map(|(name, cap)| vec![(name.to_owned(), cap.to_owned())])
            .unwrap_or_default()
    }

    fn slot_types(&self) -> Vec<(String, SlotKind)> {
        let mut types = vec![
            ("cuda.device".to_owned(), SlotKind::Count),
            ("cuda.shares".to_owned(), SlotKind::Count),
            ("cuda.mem".to_owned(), SlotKind::Bytes),
        ];
        if let Some((name, _)) = self.extra
            && !self.extra_gone.load(Ordering::Relaxed)
        {
            types.push((name.to_owned(), SlotKind::Count));
        }
        types
    }
}

/// The real agent link running against a controller.
pub struct TestNode {
    pub holdings: SharedHoldings,
    pub backend: Arc<TestBackend>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestNode {
    pub fn start(controller: &str, node: &str, backend: TestBackend) -> Self {
        Self::start_with(
            controller,
            node,
            Arc::new(backend),
            SharedHoldings::default(),
        )
    }

    pub fn start_with(
        controller: &str,
        node: &str,
        backend: Arc<TestBackend>,
        holdings: SharedHoldings,
    ) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let config = LinkConfig {
            controller: controller.to_owned(),
            tls: gpuwarden_runtime::tls::ClientTls::default(),
            node_id: node.to_owned(),
            hostname: node.to_owned(),
            hooks: vec!["tracepoint:syscalls/sys_enter_ioctl".into()],
        };
        let dyn_backend: Arc<dyn GpuBackend> = backend.clone();
        let task = tokio::spawn(controller_link::run(
            config,
            dyn_backend,
            Arc::clone(&holdings),
            None,
            async {
                let _ = stopped.await;
            },
        ));
        Self {
            holdings,
            backend,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the link (the node goes silent); returns what it held.
    pub async fn stop(mut self) -> (SharedHoldings, Arc<TestBackend>) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        (Arc::clone(&self.holdings), Arc::clone(&self.backend))
    }

    pub fn held(&self) -> Vec<String> {
        gpuwarden_agent::control::holdings::lock(&self.holdings).sessions()
    }
}

/// Waits until `check` holds, polling, or fails naming `what` ([`gpuwarden_test_support::wait`]).
pub async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    gpuwarden_test_support::wait::until_async(what, gpuwarden_test_support::wait::PATIENCE, check)
        .await;
}

/// Waits until the controller lists `n` nodes.
pub async fn wait_nodes(client: &SchedulerServiceClient<Channel>, n: usize) {
    eventually(&format!("{n} nodes to register"), || {
        let mut c = client.clone();
        async move {
            c.list_nodes(pb::ListNodesRequest {})
                .await
                .is_ok_and(|r| r.into_inner().nodes.len() == n)
        }
    })
    .await;
}

/// Waits until session `id` is in `state`.
pub async fn wait_state(
    client: &SchedulerServiceClient<Channel>,
    id: &str,
    state: pb::SessionState,
) {
    eventually(&format!("session {id} to be {state:?}"), || {
        let (mut c, id) = (client.clone(), id.to_owned());
        async move { state_of(&mut c, &id).await == state }
    })
    .await;
}

/// Creates a session from `name=value` tokens.
pub async fn create(
    client: &mut SchedulerServiceClient<Channel>,
    owner: &str,
    tokens: &[&str],
) -> Result<pb::Session, tonic::Status> {
    let requested = gpuwarden_controller::slots::ResourceSlot::parse_any(tokens).unwrap();
    client
        .create_session(pb::CreateSessionRequest {
            requested: Some(gpuwarden_controller::api::convert::slots_to_pb(&requested)),
            owner: owner.into(),
            name: String::new(),
            priority: 0,
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

/// A session's state now.
pub async fn state_of(client: &mut SchedulerServiceClient<Channel>, id: &str) -> pb::SessionState {
    let s = client
        .get_session(pb::GetSessionRequest { id: id.into() })
        .await
        .unwrap()
        .into_inner();
    pb::SessionState::try_from(s.state).unwrap()
}

/// Allocated shares per GPU of `node`, as printed.
pub async fn alloc_map(client: &mut SchedulerServiceClient<Channel>, node: &str) -> Vec<String> {
    let map = client
        .get_allocation_map(pb::GetAllocationMapRequest {
            node_id: node.into(),
        })
        .await
        .unwrap()
        .into_inner();
    map.nodes[0]
        .devices
        .iter()
        .map(|d| d.allocated_shares.clone())
        .collect()
}

/// Holdings of nobody (for a fresh link).
pub fn no_holdings() -> SharedHoldings {
    Arc::new(std::sync::Mutex::new(Holdings::default()))
}
