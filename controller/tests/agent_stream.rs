//! An agent's stream over real gRPC: acknowledgements that arrive together are committed
//! together (the stream reads on while earlier ones commit), and every one of them lands.

use std::{sync::Arc, time::Duration};

use gpuwarden_controller::{
    api::{Hub, Timing, convert},
    node::NodeReport,
    scheduler::{Scheduler, SchedulerConfig},
    server,
    store::{Store, StoreSpec},
};
use gpuwarden_proto::v1::{
    self as pb, agent_service_client::AgentServiceClient,
    scheduler_service_client::SchedulerServiceClient,
};
use tokio_stream::StreamExt as _;

const SESSIONS: usize = 16;

/// `n1` with eight GPUs, as the tests' and simulations' one test node.
fn node() -> pb::NodeInfo {
    convert::report_to_pb(&NodeReport::with_gpus("n1", 8, 80 << 30, 8))
}

#[tokio::test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
async fn acks_sent_together_share_commits_and_all_reach_running() {
    let scratch = gpuwarden_test_support::scratch("agent-stream");
    let store = Store::open(&StoreSpec::Sled(scratch.path().join("store")))
        .await
        .expect("opens");
    let timing = Timing {
        pass_interval: Duration::from_millis(20),
        ..Timing::default()
    };
    let controller = Hub::new(
        Scheduler::new(SchedulerConfig::default()),
        store.clone(),
        timing,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let url = format!("http://{}", listener.local_addr().expect("bound"));
    tokio::spawn(
        server::GrpcServer::new(Arc::clone(&controller), listener).serve(std::future::pending()),
    );
    let channel = tonic::transport::Endpoint::from_shared(url)
        .expect("a URL")
        .connect()
        .await
        .expect("connects");

    let mut agent = AgentServiceClient::new(channel.clone());
    agent.register(node()).await.expect("registers");
    let (tx, rx) = tokio::sync::mpsc::channel::<pb::AgentMessage>(64);
    tx.send(pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Heartbeat(pb::Heartbeat {
            node_id: "n1".into(),
            ..Default::default()
        })),
    })
    .await
    .expect("first heartbeat");
    let mut inbound = agent
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();

    let mut client = SchedulerServiceClient::new(channel);
    for i in 0..SESSIONS {
        client
            .create_session(pb::CreateSessionRequest {
                requested: Some(pb::ResourceSlot {
                    values: [("cuda.shares".to_owned(), "0.5".to_owned())].into(),
                }),
                owner: "alice".into(),
                name: format!("job-{i}"),
                ..Default::default()
            })
            .await
            .expect("created");
    }
    // Hold every allocation, then acknowledge them all at once.
    let mut allocated = Vec::new();
    while allocated.len() < SESSIONS {
        let message = tokio::time::timeout(Duration::from_secs(10), inbound.next())
            .await
            .expect("every session is allocated within 10 s")
            .expect("the stream stays open")
            .expect("a message");
        if let Some(pb::controller_message::Msg::Allocate(a)) = message.msg {
            allocated.push(a.session_id);
        }
    }
    let (commits_before, changes_before) = store.commit_counts();
    for session_id in allocated {
        let ack = pb::agent_message::Msg::Ack(pb::AllocationAck { session_id });
        tx.send(pb::AgentMessage { msg: Some(ack) })
            .await
            .expect("sent");
    }

    let running = || async {
        client
            .clone()
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .expect("lists")
            .into_inner()
            .sessions
            .iter()
            .filter(|s| s.state == i32::from(pb::SessionState::Running))
            .count()
    };
    let deadline = tokio::time::Instant::now() + gpuwarden_test_support::wait::PATIENCE;
    while running().await < SESSIONS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {SESSIONS} sessions running after {:?}",
            running().await,
            gpuwarden_test_support::wait::PATIENCE
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Memory says RUNNING before the store does: wait for the acks' commits to complete.
    let (commits, changes) = loop {
        let (commits, changes) = store.commit_counts();
        let (commits, changes) = (commits - commits_before, changes - changes_before);
        if changes >= SESSIONS as u64 {
            break (commits, changes);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{changes} of {SESSIONS} acks committed after {:?}",
            gpuwarden_test_support::wait::PATIENCE
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        commits < SESSIONS as u64,
        "{SESSIONS} acks ({changes} changes) sent together took {commits} commits: each waited for the one before"
    );
}
