//! Agents as the controller sees them (the real agent link with mock devices, [`TestNode`]) on
//! loopback gRPC, and reading and changing the cluster through the controller's client.
#![expect(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "test helpers: a failed set-up step should fail the test where it happened"
)]

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use gpuwarden_agent::{
    control::{
        holdings::{Holdings, SharedHoldings},
        link::{self as controller_link, LinkConfig},
    },
    devices::{GpuBackend, GpuDevice, SlotKind},
};
use gpuwarden_proto::v1::{self as pb, scheduler_service_client::SchedulerServiceClient};
use tonic::transport::Channel;

use crate::wait::eventually;

pub use crate::node::wait_nodes;

/// Mock GPUs, optionally with an extra slot type that can vanish (a device plugin going away).
pub struct TestBackend {
    /// The GPUs it reports.
    pub devices: Vec<GpuDevice>,
    /// An extra slot type and its capacity, if any.
    pub extra: Option<(&'static str, &'static str)>,
    /// Set: the extra slot type is gone from what it reports.
    pub extra_gone: AtomicBool,
}

impl TestBackend {
    /// `n` mock 16 GiB GPUs, `GPU-test-0`…, and no extra slot type.
    #[must_use]
    pub fn gpus(n: u32) -> Self {
        Self {
            devices: (0..n)
                .map(|i| GpuDevice {
                    mig: None,
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

    fn devices(&self) -> Vec<GpuDevice> {
        self.devices.clone()
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
    /// What the node holds for its sessions.
    pub holdings: SharedHoldings,
    /// Its GPUs.
    pub backend: Arc<TestBackend>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestNode {
    /// Starts the link of node `node` with `backend`'s GPUs to the controller at `controller`,
    /// on the calling runtime.
    pub fn start(controller: &str, node: &str, backend: TestBackend) -> Self {
        Self::start_with(
            controller,
            node,
            Arc::new(backend),
            SharedHoldings::default(),
        )
    }

    /// [`Self::start`] with `holdings` (what a node that went silent held) and a shared backend.
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
            mig_reconfigurable: vec![],
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

    /// The sessions the node holds.
    #[must_use]
    pub fn held(&self) -> Vec<String> {
        gpuwarden_agent::control::holdings::lock(&self.holdings).sessions()
    }
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
///
/// # Errors
/// The status the controller refused it with.
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
            ..Default::default()
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
#[must_use]
pub fn no_holdings() -> SharedHoldings {
    Arc::new(std::sync::Mutex::new(Holdings::default()))
}

/// Team quotas with one queue, `queue`, guaranteed `shares` GPUs' worth of `cuda.shares`: its
/// owner asks within its guarantee; any other owner has no queue, so it only borrows.
#[must_use]
pub fn one_team(queue: &str, shares: &str) -> gpuwarden_controller::scheduler::quotas::QuotaConfig {
    use gpuwarden_controller::{scheduler::quotas::QueueQuota, slots::ResourceSlot};
    gpuwarden_controller::scheduler::quotas::QuotaConfig {
        queues: [(
            queue.to_owned(),
            QueueQuota {
                guaranteed: ResourceSlot::parse_any(&[&format!("cuda.shares={shares}")]).unwrap(),
                limit: None,
            },
        )]
        .into(),
        members: std::collections::BTreeMap::new(),
    }
}

/// The shares the sessions that hold resources hold in all; panics where one device (a node's
/// GPU) holds more than a whole GPU's.
#[expect(
    clippy::must_use_candidate,
    reason = "a test may call it for its assertion alone"
)]
pub fn assert_not_overcommitted(
    sessions: &[gpuwarden_proto::v1::Session],
) -> gpuwarden_controller::slots::ResourceSlot {
    use gpuwarden_controller::slots::ResourceSlot;
    use gpuwarden_proto::v1::SessionState;
    let mut per_device: std::collections::BTreeMap<String, ResourceSlot> =
        std::collections::BTreeMap::new();
    for s in sessions {
        let holds =
            s.state == SessionState::Scheduled as i32 || s.state == SessionState::Running as i32;
        if !holds {
            continue;
        }
        for d in &s.devices {
            let shares = ResourceSlot::parse_any(&[&format!("cuda.shares={}", d.shares)]).unwrap();
            let entry = per_device
                .entry(format!("{}/{}", s.node_id, d.uuid))
                .or_default();
            *entry = entry.checked_add(&shares).unwrap();
        }
    }
    let whole = ResourceSlot::parse_any(&["cuda.shares=1"]).unwrap();
    let mut total = ResourceSlot::new();
    for (device, held) in per_device {
        assert!(
            held.fits_in(&whole),
            "device {device} over-committed: {held}"
        );
        total = total.checked_add(&held).unwrap();
    }
    total
}
