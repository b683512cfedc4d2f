//! A node as the controller's tests present it: the `NodeInfo` an agent registers, and a fake
//! agent's registration and stream.

use gpuwarden_proto::v1::{
    self as pb, agent_service_client::AgentServiceClient,
    scheduler_service_client::SchedulerServiceClient,
};
use tonic::transport::Channel;

/// A node named `id` (its host name too) with nothing else: no slots, no devices.
#[must_use]
pub fn bare(id: &str) -> pb::NodeInfo {
    pb::NodeInfo {
        node_id: id.to_owned(),
        hostname: id.to_owned(),
        ..pb::NodeInfo::default()
    }
}

/// A node named `id` with `cpus` CPUs (slot `cpu`, a count), so sessions asking for `cpu` are
/// valid.
#[must_use]
pub fn with_cpus(id: &str, cpus: u32) -> pb::NodeInfo {
    pb::NodeInfo {
        slot_types: vec![pb::SlotType {
            name: "cpu".into(),
            kind: pb::SlotKind::Count.into(),
        }],
        capacity: Some(pb::ResourceSlot {
            values: [("cpu".to_owned(), cpus.to_string())].into(),
        }),
        ..bare(id)
    }
}

/// The GPU slot types an agent reports: `cuda.shares` (a count) and `cuda.mem` (bytes).
#[must_use]
pub fn gpu_slot_types() -> Vec<pb::SlotType> {
    vec![
        pb::SlotType {
            name: "cuda.shares".into(),
            kind: pb::SlotKind::Count.into(),
        },
        pb::SlotType {
            name: "cuda.mem".into(),
            kind: pb::SlotKind::Bytes.into(),
        },
    ]
}

/// A node named `id` with two 16 GiB GPUs (`GPU-0`, `GPU-1`) and the GPU slot types.
#[must_use]
pub fn with_two_gpus(id: &str) -> pb::NodeInfo {
    pb::NodeInfo {
        slot_types: gpu_slot_types(),
        devices: (0..2)
            .map(|i| pb::Device {
                uuid: format!("GPU-{i}"),
                memory_bytes: 16 << 30,
                index: i,
                ..Default::default()
            })
            .collect(),
        ..bare(id)
    }
}

/// A node named `id` as an agent on `n` 16 GiB GPUs registers it (`GPU-fake-0`, …, with a
/// model, SM count and device node), with the GPU slot types: what a fake agent in a CLI test
/// presents.
#[must_use]
pub fn with_fake_gpus(id: &str, n: u32) -> pb::NodeInfo {
    pb::NodeInfo {
        slot_types: gpu_slot_types(),
        devices: (0..n)
            .map(|i| pb::Device {
                uuid: format!("GPU-fake-{i}"),
                model: "Fake".into(),
                memory_bytes: 16 << 30,
                sm_count: 132,
                index: i,
                device_node: format!("/dev/nvidia{i}"),
                ..Default::default()
            })
            .collect(),
        agent_version: "test".into(),
        ..bare(id)
    }
}

/// Registers `info` with the controller at `url` (`http://…`), as an agent would.
///
/// # Panics
/// The controller can't be reached or refuses.
pub async fn register(url: &str, info: pb::NodeInfo) {
    agent_client(url)
        .await
        .register(info)
        .await
        .expect("registers");
}

/// Registers `info` with the controller at `url` as an agent would and opens its stream with a
/// first heartbeat; returns the sender for further agent messages and the controller's
/// messages.
///
/// # Panics
/// The controller can't be reached, or refuses the registration or the stream.
pub async fn connect(
    url: &str,
    info: pb::NodeInfo,
) -> (
    tokio::sync::mpsc::Sender<pb::AgentMessage>,
    tonic::Streaming<pb::ControllerMessage>,
) {
    connect_with(agent_client(url).await, info).await
}

/// [`connect`] through `agent`, a client on a channel of the caller's making (TLS, a node's
/// certificate).
///
/// # Panics
/// The controller refuses the registration or the stream.
pub async fn connect_with(
    mut agent: AgentServiceClient<tonic::transport::Channel>,
    info: pb::NodeInfo,
) -> (
    tokio::sync::mpsc::Sender<pb::AgentMessage>,
    tonic::Streaming<pb::ControllerMessage>,
) {
    let node_id = info.node_id.clone();
    agent.register(info).await.expect("registers");
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tx.send(pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Heartbeat(pb::Heartbeat {
            node_id,
            ..Default::default()
        })),
    })
    .await
    .expect("queued");
    // `AgentServiceClient::connect` is the rpc here, not the constructor.
    let inbound = agent
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("stream opens")
        .into_inner();
    (tx, inbound)
}

/// Plays an agent that starts everything it is given: acknowledges every `Allocate` on
/// `inbound` through `tx`, then tells `allocated` of it, and confirms every `Release` (the
/// `released` event of issue 40), until the stream ends.
pub async fn acknowledge_all(
    tx: tokio::sync::mpsc::Sender<pb::AgentMessage>,
    mut inbound: tonic::Streaming<pb::ControllerMessage>,
    mut allocated: impl FnMut(&pb::Allocate),
) {
    use tokio_stream::StreamExt as _;
    while let Some(Ok(message)) = inbound.next().await {
        let a = match message.msg {
            Some(pb::controller_message::Msg::Allocate(a)) => a,
            Some(pb::controller_message::Msg::Release(r)) => {
                let released = pb::agent_message::Msg::Event(pb::EnforcementEvent {
                    session_id: r.session_id,
                    action: "released".into(),
                    ..Default::default()
                });
                if tx
                    .send(pb::AgentMessage {
                        msg: Some(released),
                    })
                    .await
                    .is_err()
                {
                    break;
                }
                continue;
            }
            _ => continue,
        };
        let ack = pb::agent_message::Msg::Ack(pb::AllocationAck {
            session_id: a.session_id.clone(),
        });
        if tx.send(pb::AgentMessage { msg: Some(ack) }).await.is_err() {
            break;
        }
        allocated(&a);
    }
}

async fn agent_client(url: &str) -> AgentServiceClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
        .expect("a URL")
        .connect()
        .await
        .expect("connects");
    AgentServiceClient::new(channel)
}

/// Waits until the controller lists `n` nodes.
pub async fn wait_nodes(client: &SchedulerServiceClient<Channel>, n: usize) {
    crate::wait::eventually(&format!("{n} nodes to register"), || {
        let mut c = client.clone();
        async move {
            c.list_nodes(pb::ListNodesRequest::default())
                .await
                .is_ok_and(|r| r.into_inner().nodes.len() == n)
        }
    })
    .await;
}
