//! The controller and real agent links over loopback gRPC, with mock GPUs: scheduling, merged
//! slot types, refusals, limits, restarts and node loss.

use std::{sync::atomic::Ordering, time::Duration};

use tokio_stream::StreamExt as _;

use gpuwarden_controller::scheduler::SchedulerConfig;
use gpuwarden_proto::v1::{self as pb, SessionState};
use gpuwarden_test_support::{
    cluster::{TestBackend, TestNode, alloc_map, create, state_of, wait_nodes, wait_state},
    controller::{TestController, fast_timing},
    scratch,
    wait::eventually,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_ai_case_over_grpc() {
    let state = scratch("ctl");
    let ctl = TestController::builder(state.path())
        .timing(fast_timing(Duration::from_millis(1500)))
        .start();
    let node = TestNode::start(&ctl.url(), "n1", TestBackend::gpus(2));
    let mut c = ctl.client().await;
    wait_nodes(&c, 1).await;
    let a = create(&mut c, "u", &["cuda.shares=0.2"]).await.unwrap();
    wait_state(&c, &a.id, SessionState::Running).await;
    let b = create(&mut c, "u", &["cuda.shares=1.2"]).await.unwrap();
    wait_state(&c, &b.id, SessionState::Running).await;
    assert_eq!(alloc_map(&mut c, "n1").await, ["0.8", "0.6"]);
    let b = c
        .get_session(pb::GetSessionRequest { id: b.id })
        .await
        .unwrap()
        .into_inner();
    let parts: Vec<&str> = b.devices.iter().map(|d| d.shares.as_str()).collect();
    assert_eq!(parts, ["0.6", "0.6"]);
    // The agent holds both.
    let mut held = node.held();
    held.sort();
    let mut expected = vec![a.id.clone(), b.id.clone()];
    expected.sort();
    assert_eq!(held, expected);

    // Terminating releases on both sides: TERMINATING until the agent confirms (issue 40),
    // which a watcher sees before TERMINATED.
    let mut watch = c
        .watch_sessions(pb::WatchSessionsRequest {
            start: pb::WatchStart::Now.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let ended = c
        .terminate_session(pb::TerminateSessionRequest { id: a.id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ended.state(), SessionState::Terminating, "{ended:?}");
    let mut seen = Vec::new();
    while seen.last() != Some(&SessionState::Terminated) {
        let s = tokio::time::timeout(Duration::from_secs(20), watch.next())
            .await
            .expect("a change within 20 s")
            .expect("open")
            .expect("a session");
        if s.id == a.id {
            seen.push(s.state());
        }
    }
    assert_eq!(
        seen,
        [SessionState::Terminating, SessionState::Terminated],
        "as the watcher saw {}",
        a.id
    );
    let a_now = c
        .get_session(pb::GetSessionRequest { id: a.id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert!(
        a_now.reason.contains("node n1 released it"),
        "{}",
        a_now.reason
    );
    assert_eq!(alloc_map(&mut c, "n1").await, ["0.6", "0.6"]);
    assert!(!node.held().contains(&a.id));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_fleet_merges_slot_types_and_unknown_slots_are_nacked() {
    let state = scratch("mix");
    let ctl = TestController::builder(state.path())
        .timing(fast_timing(Duration::from_millis(1500)))
        .start();
    let mut accel = TestBackend::gpus(1);
    accel.extra = Some(("mock.accel", "4"));
    let plain = TestNode::start(&ctl.url(), "plain", TestBackend::gpus(1));
    let special = TestNode::start(&ctl.url(), "special", accel);
    let mut c = ctl.client().await;
    wait_nodes(&c, 2).await;
    let types = c
        .list_slot_types(pb::ListSlotTypesRequest {})
        .await
        .unwrap()
        .into_inner()
        .slot_types;
    assert!(
        types
            .iter()
            .any(|t| t.name == "mock.accel" && t.kind == i32::from(pb::SlotKind::Count))
    );
    // The union shows the extra slot as zero on the node that lacks it.
    let plain_node = c
        .get_node(pb::GetNodeRequest {
            node_id: "plain".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let capacity = plain_node.info.unwrap().capacity.unwrap().values;
    assert_eq!(capacity.get("mock.accel").map_or("0", String::as_str), "0");

    // The plugin goes away on the node; the controller still places there and is refused.
    special.backend.extra_gone.store(true, Ordering::Relaxed);
    let s = create(&mut c, "u", &["mock.accel=1"]).await.unwrap();
    wait_state(&c, &s.id, SessionState::Failed).await;
    let s = c
        .get_session(pb::GetSessionRequest { id: s.id })
        .await
        .unwrap()
        .into_inner();
    assert!(s.reason.starts_with("UnsupportedResource"), "{}", s.reason);
    assert!(s.reason.contains("mock.accel"), "{}", s.reason);
    assert_eq!(s.node_id, "special");
    plain.stop().await;
    special.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_rejected_with_reasons() {
    let state = scratch("bad");
    let ctl = TestController::builder(state.path())
        .timing(fast_timing(Duration::from_millis(1500)))
        .start();
    let node = TestNode::start(&ctl.url(), "n1", TestBackend::gpus(2));
    let mut c = ctl.client().await;
    wait_nodes(&c, 1).await;
    let cases: &[(&[&str], tonic::Code, &str)] = &[
        (
            &["tpu=1"],
            tonic::Code::FailedPrecondition,
            "unknown slot type \"tpu\"",
        ),
        (
            &["cuda.device=1", "cuda.shares=0.5"],
            tonic::Code::InvalidArgument,
            "can't be combined",
        ),
        (
            &["cuda.shares=2.5"],
            tonic::Code::FailedPrecondition,
            "larger than every node",
        ),
        (
            &["cuda.shares=0.005"],
            tonic::Code::InvalidArgument,
            "not a multiple of the quantum",
        ),
    ];
    for (tokens, code, needle) in cases {
        let err = create(&mut c, "u", tokens)
            .await
            .expect_err(&format!("{tokens:?} accepted"));
        assert_eq!(err.code(), *code, "{tokens:?}: {}", err.message());
        assert!(
            err.message().contains(needle),
            "{tokens:?}: {}",
            err.message()
        );
    }
    // A raw value that isn't a number.
    let err = c
        .create_session(pb::CreateSessionRequest {
            requested: Some(pb::ResourceSlot {
                values: [("cpu".to_owned(), "lots".to_owned())].into(),
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("\"lots\""), "{}", err.message());
    let sessions = c
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sessions;
    assert!(
        sessions.is_empty(),
        "refused requests left sessions behind: {sessions:?}"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_limits_count_sessions_not_passes() {
    let mut config = SchedulerConfig::default();
    config.default_limits.max_concurrent = Some(1);
    config.skip_after = 0;
    let state = scratch("lim");
    let ctl = TestController::builder(state.path())
        .config(config)
        .timing(fast_timing(Duration::from_millis(1500)))
        .start();
    let node = TestNode::start(&ctl.url(), "n1", TestBackend::gpus(2));
    let mut c = ctl.client().await;
    wait_nodes(&c, 1).await;
    let a = create(&mut c, "alice", &["cuda.shares=0.1"]).await.unwrap();
    let b = create(&mut c, "alice", &["cuda.shares=0.1"]).await.unwrap();
    let other = create(&mut c, "bob", &["cuda.shares=0.1"]).await.unwrap();
    eventually("a and bob's run", || {
        let (mut c, a, o) = (c.clone(), a.id.clone(), other.id.clone());
        async move {
            state_of(&mut c, &a).await == SessionState::Running
                && state_of(&mut c, &o).await == SessionState::Running
        }
    })
    .await;
    // Many passes later (every 50 ms), alice's second is still held back by her limit.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b_now = c
        .get_session(pb::GetSessionRequest { id: b.id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(b_now.state, i32::from(SessionState::Pending));
    assert!(b_now.reason.contains("limit"), "{}", b_now.reason);
    c.terminate_session(pb::TerminateSessionRequest { id: a.id })
        .await
        .unwrap();
    wait_state(&c, &b.id, SessionState::Running).await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_restart_keeps_sessions_and_allocations() {
    let dir = scratch("restart");
    let ctl = TestController::builder(dir.path())
        .timing(fast_timing(Duration::from_millis(1500)))
        .start();
    let node = TestNode::start(&ctl.url(), "n1", TestBackend::gpus(2));
    let mut c = ctl.client().await;
    wait_nodes(&c, 1).await;
    let running = create(&mut c, "u", &["cuda.shares=1.2"]).await.unwrap();
    wait_state(&c, &running.id, SessionState::Running).await;
    // Created and acknowledged, then the controller dies at once.
    let pending = create(&mut c, "u", &["cuda.shares=1"]).await.unwrap();
    ctl.kill();
    drop(c);

    let ctl = TestController::builder(dir.path())
        .timing(fast_timing(Duration::from_millis(1500)))
        .start();
    let (holdings, backend) = node.stop().await;
    let mut c = ctl.client().await;
    let sessions = c
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sessions;
    let ids: Vec<&str> = sessions.iter().map(|s| s.id.as_str()).collect();
    assert!(
        ids.contains(&running.id.as_str()) && ids.contains(&pending.id.as_str()),
        "{ids:?}"
    );
    // The agent comes back holding what it held; its report rebuilds the allocation map.
    let node = TestNode::start_with(&ctl.url(), "n1", backend, holdings);
    eventually("the map is rebuilt", || {
        let mut c = c.clone();
        async move {
            c.get_allocation_map(pb::GetAllocationMapRequest {
                node_id: "n1".into(),
                ..Default::default()
            })
            .await
            .is_ok_and(|m| {
                m.into_inner().nodes[0]
                    .devices
                    .iter()
                    .any(|d| d.allocated_shares != "0")
            })
        }
    })
    .await;
    assert_eq!(state_of(&mut c, &running.id).await, SessionState::Running);
    let map = alloc_map(&mut c, "n1").await;
    let total: f64 = map.iter().map(|s| s.parse::<f64>().unwrap()).sum();
    assert!(
        (total - 1.2).abs() < 1e-9 || (total - 2.2).abs() < 1e-9,
        "{map:?}"
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_loss_and_return() {
    let state = scratch("loss");
    let ctl = TestController::builder(state.path())
        .timing(fast_timing(Duration::from_millis(1500)))
        .start();
    let node = TestNode::start(&ctl.url(), "n1", TestBackend::gpus(1));
    let mut c = ctl.client().await;
    wait_nodes(&c, 1).await;
    let s = create(&mut c, "u", &["cuda.shares=0.5"]).await.unwrap();
    wait_state(&c, &s.id, SessionState::Running).await;
    let (holdings, backend) = node.stop().await;
    eventually("the node is lost", || {
        let mut c = c.clone();
        async move {
            c.get_node(pb::GetNodeRequest {
                node_id: "n1".into(),
            })
            .await
            .is_ok_and(|n| n.into_inner().state == i32::from(pb::NodeState::Lost))
        }
    })
    .await;
    assert_eq!(state_of(&mut c, &s.id).await, SessionState::Lost);
    // A lost node takes no new work.
    let waiting = create(&mut c, "u", &["cuda.shares=0.2"]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(state_of(&mut c, &waiting.id).await, SessionState::Pending);
    // It comes back with its session: both sides agree again.
    let node = TestNode::start_with(&ctl.url(), "n1", backend, holdings);
    wait_state(&c, &s.id, SessionState::Running).await;
    wait_state(&c, &waiting.id, SessionState::Running).await;
    assert_eq!(alloc_map(&mut c, "n1").await, ["0.7"]);
    node.stop().await;
}
