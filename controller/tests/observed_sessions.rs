//! Sessions the controller observes but did not place, over real gRPC: an agent (played here from
//! the proto) registers a node with one GPU for the controller and one offered to Kubernetes,
//! holding a claim prepared through DRA, and reports another on its stream. Both are listed with
//! their namespace, pod and claim, fill the Kubernetes GPU's row of the allocation map, keep the
//! controller's own sessions off that GPU, can't be ended by a client, end when the agent says
//! the claim was unprepared (teaching their class's profile), and come back from the agent's
//! registration after a controller restart.

use std::{net::SocketAddr, path::Path, time::Duration};

use gpuwarden_controller::{api::Timing, scheduler::SchedulerConfig, server};
use gpuwarden_proto::v1::{
    self as pb, agent_message::Msg, agent_service_client::AgentServiceClient,
    scheduler_service_client::SchedulerServiceClient,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const NODE: &str = "gpu-node-1";
const POD: &str = "0b7a4c56-2f3e-4d1a-9c8b-7e6f5a4b3c2d";

/// A controller on a runtime of its own: dropping it is as abrupt as killing the process.
struct Incarnation {
    addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Incarnation {
    fn start(dir: &Path) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let addr = runtime.block_on(async {
            let timing = Timing {
                pass_interval: Duration::from_millis(20),
                ..Timing::default()
            };
            // A killed predecessor's store lock goes with its last handle, a moment later.
            let mut tries = 0;
            let controller = loop {
                match server::open(&server::sled_in(dir), SchedulerConfig::default(), timing).await
                {
                    Ok(controller) => break controller,
                    Err(e) => {
                        tries += 1;
                        assert!(tries < 100, "opens: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            };
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("binds");
            let addr = listener.local_addr().expect("bound");
            tokio::spawn(
                server::GrpcServer::new(controller, listener).serve(std::future::pending()),
            );
            addr
        });
        Self {
            addr,
            runtime: Some(runtime),
        }
    }

    fn kill(mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }

    async fn channel(&self) -> Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("a URL")
            .connect()
            .await
            .expect("connects")
    }
}

fn gpu(index: u32) -> pb::Device {
    pb::Device {
        uuid: format!("GPU-{index}"),
        model: "Fake".into(),
        memory_bytes: 16 << 30,
        sm_count: 132,
        index,
        device_node: format!("/dev/nvidia{index}"),
        ..Default::default()
    }
}

/// Claim `name` in namespace `ml`, prepared for pod `train-0`, holding `shares` of GPU 1.
fn claim(name: &str, shares: &str) -> pb::ObservedSession {
    pb::ObservedSession {
        session_id: format!("k8s-uid-{name}"),
        devices: vec![pb::DeviceShare {
            uuid: "GPU-1".into(),
            index: 1,
            shares: shares.into(),
            memory_bytes: 1 << 30,
            exclusive: false,
        }],
        target: Some(pb::Target {
            kind: Some(pb::target::Kind::PodUid(POD.into())),
        }),
        policy: Some(pb::QuotaPolicy {
            memory: "kill".into(),
            compute: "hard".into(),
            ..Default::default()
        }),
        claim: Some(pb::KubernetesClaim {
            namespace: "ml".into(),
            claim_name: name.into(),
            claim_uid: format!("uid-{name}"),
            pod_name: "train-0".into(),
            pod_uid: POD.into(),
        }),
        class: "train".into(),
        ended: false,
    }
}

/// GPU 0 for the controller, GPU 1 offered to Kubernetes, holding `observed`.
fn node(observed: Vec<pb::ObservedSession>) -> pb::NodeInfo {
    let slot = |name: &str, kind: pb::SlotKind| pb::SlotType {
        name: name.into(),
        kind: kind.into(),
    };
    pb::NodeInfo {
        node_id: NODE.into(),
        hostname: NODE.into(),
        slot_types: vec![
            slot("cuda.shares", pb::SlotKind::Count),
            slot("cuda.device", pb::SlotKind::Count),
            slot("cuda.mem", pb::SlotKind::Bytes),
        ],
        devices: vec![gpu(0)],
        kubernetes_devices: vec![gpu(1)],
        observed_sessions: observed,
        agent_version: "test".into(),
        ..Default::default()
    }
}

/// Registers `info` and opens its stream; the sender for what the agent says next.
async fn agent(channel: Channel, info: pb::NodeInfo) -> mpsc::Sender<pb::AgentMessage> {
    let mut agent = AgentServiceClient::new(channel);
    agent.register(info).await.expect("registers");
    let (tx, rx) = mpsc::channel(64);
    tx.send(pb::AgentMessage {
        msg: Some(Msg::Heartbeat(pb::Heartbeat {
            node_id: NODE.into(),
            ..Default::default()
        })),
    })
    .await
    .expect("first heartbeat");
    let inbound = agent
        .connect(ReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    // Kept reading so the controller's sends never block.
    tokio::spawn(async move {
        let mut inbound = inbound;
        while let Ok(Some(_)) = inbound.message().await {}
    });
    tx
}

async fn session(client: &mut SchedulerServiceClient<Channel>, id: &str) -> pb::Session {
    client
        .get_session(pb::GetSessionRequest { id: id.into() })
        .await
        .expect("known")
        .into_inner()
}

/// Waits until `check` holds for session `id`.
async fn until(
    client: &mut SchedulerServiceClient<Channel>,
    id: &str,
    what: &str,
    check: impl Fn(&pb::Session) -> bool,
) -> pb::Session {
    let started = std::time::Instant::now();
    while started.elapsed() < gpuwarden_test_support::wait::PATIENCE {
        if let Ok(s) = client
            .get_session(pb::GetSessionRequest { id: id.into() })
            .await
        {
            let s = s.into_inner();
            if check(&s) {
                return s;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("timed out waiting for {id}: {what}");
}

/// The node's allocation map: per GPU index, (allocated shares, sessions, offered to Kubernetes).
async fn map(
    client: &mut SchedulerServiceClient<Channel>,
) -> Vec<(u32, String, Vec<String>, bool)> {
    let map = client
        .get_allocation_map(pb::GetAllocationMapRequest {
            node_id: NODE.into(),
            ..Default::default()
        })
        .await
        .expect("a map")
        .into_inner();
    map.nodes[0]
        .devices
        .iter()
        .map(|d| {
            (
                d.index,
                d.allocated_shares.clone(),
                d.sessions.clone(),
                d.kubernetes,
            )
        })
        .collect()
}

fn create(shares: &str, name: &str) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        requested: Some(pb::ResourceSlot {
            values: [("cuda.shares".to_owned(), shares.to_owned())].into(),
        }),
        owner: "alice".into(),
        name: name.into(),
        ..Default::default()
    }
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn claims_an_agent_prepared_are_observed_counted_and_rebuilt_after_a_restart() {
    let scratch = gpuwarden_test_support::scratch("observed-sessions");
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let first = Incarnation::start(scratch.path());
    client_rt.block_on(async {
        let channel = first.channel().await;
        let mut client = SchedulerServiceClient::new(channel.clone());
        // Registered holding claim `a`; claim `b` is prepared afterwards.
        let tx = agent(channel, node(vec![claim("a", "0.5")])).await;
        tx.send(pb::AgentMessage {
            msg: Some(Msg::Observed(claim("b", "0.25"))),
        })
        .await
        .expect("sent");
        let b = until(&mut client, "k8s-uid-b", "observed", |s| {
            s.state() == pb::SessionState::Running
        })
        .await;
        let a = session(&mut client, "k8s-uid-a").await;
        for s in [&a, &b] {
            assert_eq!(s.state(), pb::SessionState::Running, "{s:?}");
            assert_eq!(s.origin, "dra");
            assert_eq!(s.owner, "k8s:ml");
            // The pod's label, filed within its namespace.
            assert_eq!(s.class, "k8s:ml/train");
            assert_eq!(s.node_id, NODE);
            let k = s.kubernetes.as_ref().expect("its claim");
            assert_eq!(
                (
                    k.namespace.as_str(),
                    k.pod_name.as_str(),
                    k.pod_uid.as_str()
                ),
                ("ml", "train-0", POD)
            );
        }
        assert_eq!(
            b.kubernetes.as_ref().map(|k| k.claim_name.as_str()),
            Some("b")
        );
        // Both in the Kubernetes GPU's row; none on the controller's.
        assert_eq!(
            map(&mut client).await,
            [
                (0, "0".to_owned(), vec![], false),
                (
                    1,
                    "0.75".to_owned(),
                    vec!["k8s-uid-a".to_owned(), "k8s-uid-b".to_owned()],
                    true
                ),
            ]
        );
        // The node's capacity and holdings are the controller's GPU's.
        let n = client
            .get_node(pb::GetNodeRequest {
                node_id: NODE.into(),
            })
            .await
            .expect("the node")
            .into_inner();
        assert_eq!(
            n.capacity
                .as_ref()
                .map(|c| c.values["cuda.shares"].as_str()),
            Some("1")
        );
        assert_eq!(n.info.as_ref().map(|i| i.kubernetes_devices.len()), Some(1));

        // The controller's own sessions go to GPU 0 only: a whole share fits there, a quarter
        // waits although GPU 1 has a quarter free.
        let whole = client
            .create_session(create("1", "whole"))
            .await
            .expect("created")
            .into_inner();
        let whole = until(&mut client, &whole.id, "placed", |s| {
            s.state() == pb::SessionState::Scheduled
        })
        .await;
        assert_eq!(
            whole.devices.iter().map(|d| d.index).collect::<Vec<_>>(),
            [0]
        );
        let quarter = client
            .create_session(create("0.25", "quarter"))
            .await
            .expect("created")
            .into_inner();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            session(&mut client, &quarter.id).await.state(),
            pb::SessionState::Pending
        );

        // A client can't end a claim's session.
        let refused = client
            .terminate_session(pb::TerminateSessionRequest {
                id: "k8s-uid-a".into(),
            })
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        assert!(
            refused.message().contains("owned by Kubernetes claim ml/a")
                && refused.message().contains("delete the pod"),
            "{refused:?}"
        );
        assert_eq!(
            session(&mut client, "k8s-uid-a").await.state(),
            pb::SessionState::Running
        );

        // Usage for `b` is recorded as for any session; its end teaches class `train`.
        for _ in 0..4 {
            tx.send(pb::AgentMessage {
                msg: Some(Msg::Usage(pb::SessionUsage {
                    session_id: "k8s-uid-b".into(),
                    utilization: 0.8,
                    memory_bytes: 512 << 20,
                    ioctls_per_sec: 5.0,
                    at_ms: 1,
                })),
            })
            .await
            .expect("sent");
        }
        tx.send(pb::AgentMessage {
            msg: Some(Msg::Observed(pb::ObservedSession {
                session_id: "k8s-uid-b".into(),
                ended: true,
                ..Default::default()
            })),
        })
        .await
        .expect("sent");
        let ended = until(&mut client, "k8s-uid-b", "ended", |s| {
            s.state() == pb::SessionState::Terminated
        })
        .await;
        assert_eq!(ended.reason, "its claim was unprepared");
        let profile = client
            .get_profile(pb::GetProfileRequest {
                class: "k8s:ml/train".into(),
            })
            .await
            .expect("a profile for class train of namespace ml")
            .into_inner();
        assert_eq!(profile.runs, 1);
        assert_eq!(profile.peak_memory_bytes, 512 << 20);
        assert_eq!(map(&mut client).await[1].1, "0.5");
    });

    // The controller dies; the agent registers with its successor, still holding `a` and a claim
    // `c` prepared meanwhile.
    first.kill();
    let second = Incarnation::start(scratch.path());
    client_rt.block_on(async {
        let channel = second.channel().await;
        let mut client = SchedulerServiceClient::new(channel.clone());
        let _tx = agent(channel, node(vec![claim("a", "0.5"), claim("c", "0.125")])).await;
        let a = session(&mut client, "k8s-uid-a").await;
        assert_eq!(a.state(), pb::SessionState::Running);
        assert_eq!(a.origin, "dra");
        assert_eq!(
            session(&mut client, "k8s-uid-c").await.state(),
            pb::SessionState::Running
        );
        assert_eq!(
            session(&mut client, "k8s-uid-b").await.state(),
            pb::SessionState::Terminated
        );
        let row = map(&mut client).await.remove(1);
        assert_eq!(
            (row.1.as_str(), row.2, row.3),
            (
                "0.625",
                vec!["k8s-uid-a".to_owned(), "k8s-uid-c".to_owned()],
                true
            )
        );
    });
    second.kill();
}
