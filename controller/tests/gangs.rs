//! A gang whose member does not start, over real gRPC on loopback: two fake agents of one GPU
//! each, one acknowledging every allocation and the other refusing every allocation (`Nack`) or
//! answering nothing. A gang of two whole GPUs is placed across both; the refusal, or the
//! silence past `gang_start_timeout_ms`, fails the whole gang, and the node that accepted its
//! member is told to let it go.

use std::time::Duration;

use gpuwarden_controller::{
    limits::{Bounds, Limits},
    server::Transport,
};
use gpuwarden_proto::v1::{self as pb, scheduler_service_client::SchedulerServiceClient};
use tokio_stream::StreamExt as _;

/// How a fake agent answers an allocation.
#[derive(Clone, Copy)]
enum Answer {
    Ack,
    Refuse,
    /// Nothing: its node stays alive (its stream open) but never says whether it started.
    Silent,
}

/// Runs a fake agent of one GPU named `node` answering each allocation as `answer` says; every
/// message from the controller goes to `seen`.
async fn agent(
    url: String,
    node: &'static str,
    answer: Answer,
    seen: tokio::sync::mpsc::Sender<pb::ControllerMessage>,
) {
    let (tx, mut inbound) = gpuwarden_test_support::node::connect(
        &url,
        gpuwarden_test_support::node::with_fake_gpus(node, 1),
    )
    .await;
    while let Some(Ok(message)) = inbound.next().await {
        if let Some(pb::controller_message::Msg::Allocate(a)) = &message.msg {
            let session_id = a.session_id.clone();
            let reply = match answer {
                Answer::Ack => Some(pb::agent_message::Msg::Ack(pb::AllocationAck {
                    session_id,
                })),
                Answer::Refuse => Some(pb::agent_message::Msg::Nack(pb::AllocationNack {
                    session_id,
                    reason: "InvalidQuota".into(),
                    message: "no such cgroup".into(),
                })),
                Answer::Silent => None,
            };
            if let Some(msg) = reply {
                let _ = tx.send(pb::AgentMessage { msg: Some(msg) }).await;
            }
        }
        let _ = seen.send(message).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_refused_at_the_start_fails_its_gang_and_the_other_node_lets_go() {
    let scratch = gpuwarden_test_support::scratch("gang-refused");
    let addr = gpuwarden_test_support::controller::serve_in_process(
        scratch.path(),
        Transport::PlainText,
        Bounds::new(Limits::default()),
    )
    .await;
    let reason =
        gang_fails_and_the_accepting_node_lets_go(&format!("http://{addr}"), Answer::Refuse).await;
    assert!(
        reason.contains("gang pair could not start whole") && reason.contains("no such cgroup"),
        "{reason}"
    );
}

/// The controller binary with `gang_start_timeout_ms = 1000` in its config file: the silent
/// node's member is still unacknowledged a second after the gang was placed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_its_node_never_answers_for_fails_its_gang_after_the_start_timeout() {
    let dir = gpuwarden_test_support::scratch("gang-silent");
    let config = dir.path().join("controller.toml");
    std::fs::write(&config, "[scheduler]\ngang_start_timeout_ms = 1000\n").expect("written");
    let store = format!("sled:{}", dir.path().join("store").display());
    let controller = gpuwarden_test_support::controller::ControllerProcess::start(
        &store,
        &["--config", &config.to_string_lossy()],
    );
    controller.until_serving(Duration::from_secs(30)).await;
    let reason = gang_fails_and_the_accepting_node_lets_go(
        &format!("http://{}", controller.addr),
        Answer::Silent,
    )
    .await;
    assert!(
        reason.contains("gang pair did not start whole within 1 s")
            && reason.contains("was not acknowledged by its node n-no"),
        "{reason}"
    );
}

/// Two fake agents on `url`, one acknowledging and one answering as `other`; a gang of two whole
/// GPUs spans both. Waits until the accepting node is told to release its member, checks every
/// member FAILED, and returns the released member's reason.
async fn gang_fails_and_the_accepting_node_lets_go(url: &str, other: Answer) -> String {
    let url = url.to_owned();
    let (accepted_tx, mut accepted) = tokio::sync::mpsc::channel(16);
    let (refused_tx, _refused) = tokio::sync::mpsc::channel(16);
    tokio::spawn(agent(url.clone(), "n-ok", Answer::Ack, accepted_tx));
    tokio::spawn(agent(url.clone(), "n-no", other, refused_tx));
    let channel = tonic::transport::Endpoint::from_shared(url)
        .expect("a URL")
        .connect()
        .await
        .expect("connects");
    let mut client = SchedulerServiceClient::new(channel);
    gpuwarden_test_support::node::wait_nodes(&client, 2).await;

    let mut ids = Vec::new();
    for _ in 0..2 {
        let s = client
            .create_session(pb::CreateSessionRequest {
                requested: Some(pb::ResourceSlot {
                    values: [("cuda.shares".to_owned(), "1".to_owned())].into(),
                }),
                gang: Some(pb::Gang {
                    name: "pair".into(),
                    size: 2,
                }),
                ..Default::default()
            })
            .await
            .expect("created")
            .into_inner();
        ids.push(s.id);
    }

    // The accepting node is sent its member, then told to let it go.
    let mut allocated = None;
    let released = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(message) = accepted.recv().await {
            match message.msg {
                Some(pb::controller_message::Msg::Allocate(a)) => allocated = Some(a.session_id),
                Some(pb::controller_message::Msg::Release(r)) => return r.session_id,
                _ => {}
            }
        }
        String::new()
    })
    .await
    .expect("a release within 20 s");
    assert_eq!(Some(&released), allocated.as_ref());
    let mut reason = String::new();
    for id in &ids {
        let s = client
            .get_session(pb::GetSessionRequest { id: id.clone() })
            .await
            .expect("shown")
            .into_inner();
        assert_eq!(s.state, pb::SessionState::Failed as i32, "{s:?}");
        if *id == released {
            reason = s.reason;
        }
    }
    reason
}
