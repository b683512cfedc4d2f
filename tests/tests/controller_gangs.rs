//! Gangs end to end (issue 24 §3): a controller on loopback gRPC and two real agent links on
//! mock GPUs (two each). A gang's members wait until the last one is created, then all run at
//! once; a gang that does not fit holds nothing, even where some of its members would fit; a
//! member ending leaves the others running; the gang's membership survives a controller
//! restart. With team quotas, a running gang is preempted whole, and a waiting gang within its
//! guarantee takes back room for all its members at once. No device is ever over-committed, and
//! the agents hold exactly what runs.

#![expect(
    clippy::unwrap_used,
    reason = "a test's helpers unwrap: a failure there is the test failing"
)]

use std::{collections::BTreeSet, time::Duration};

use gpuwarden_controller::{scheduler::SchedulerConfig, slots::ResourceSlot};
use gpuwarden_proto::v1::{
    self as pb, SessionState, scheduler_service_client::SchedulerServiceClient,
};
use gpuwarden_test_support::{
    cluster::{
        self, TestBackend, TestNode, assert_not_overcommitted, state_of, wait_nodes, wait_state,
    },
    controller::{TestController, fast_timing},
    scratch,
    wait::eventually,
};
use tonic::transport::Channel;

type Client = SchedulerServiceClient<Channel>;

/// Creates a session of `owner` asking for `shares` of GPU, not in a gang.
async fn single(c: &mut Client, owner: &str, shares: &str) -> String {
    let requested = ResourceSlot::parse_any(&[&format!("cuda.shares={shares}")]).unwrap();
    c.create_session(pb::CreateSessionRequest {
        requested: Some(gpuwarden_controller::api::convert::slots_to_pb(&requested)),
        owner: owner.into(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
    .id
}

/// A controller whose team `lab` is guaranteed two GPUs' shares (any other owner only borrows),
/// and one agent link on two mock GPUs (it has nothing to signal: a preemption releases at once).
async fn with_quotas(tag: &str) -> (tempfile::TempDir, TestController, TestNode, Client) {
    let state = scratch(tag);
    let config = SchedulerConfig {
        quotas: cluster::one_team("lab", "2"),
        ..SchedulerConfig::default()
    };
    let ctl = TestController::builder(state.path())
        .config(config)
        .timing(fast_timing(Duration::from_millis(1500)))
        .start();
    let node = TestNode::start(&ctl.url(), "n1", TestBackend::gpus(2));
    let c = ctl.client().await;
    wait_nodes(&c, 1).await;
    (state, ctl, node, c)
}

/// Creates a session of `owner` asking for `shares` of GPU, a member of gang `name` of `size`.
async fn member(
    c: &mut Client,
    owner: &str,
    shares: &str,
    name: &str,
    size: u32,
) -> Result<pb::Session, tonic::Status> {
    let requested = ResourceSlot::parse_any(&[&format!("cuda.shares={shares}")]).unwrap();
    c.create_session(pb::CreateSessionRequest {
        requested: Some(gpuwarden_controller::api::convert::slots_to_pb(&requested)),
        owner: owner.into(),
        gang: Some(pb::Gang {
            name: name.into(),
            size,
        }),
        ..Default::default()
    })
    .await
    .map(tonic::Response::into_inner)
}

async fn get(c: &mut Client, id: &str) -> pb::Session {
    c.get_session(pb::GetSessionRequest { id: id.into() })
        .await
        .unwrap()
        .into_inner()
}

/// Every session the controller has.
async fn list(c: &mut Client) -> Vec<pb::Session> {
    c.list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sessions
}

/// Asserts no device holds more than a whole GPU's shares; the shares held in all.
async fn shares_held(c: &mut Client) -> String {
    assert_not_overcommitted(&list(c).await)
        .get("cuda.shares")
        .to_string()
}

/// Scheduling passes a waiting gang must outlast: each tries it again.
const PASSES: u64 = 10;

/// Waits until session `id`'s reason holds `words`.
async fn wait_reason(c: &Client, id: &str, words: &str) {
    eventually(&format!("session {id} to say {words:?}"), || {
        let (mut c, id, words) = (c.clone(), id.to_owned(), words.to_owned());
        async move { get(&mut c, &id).await.reason.contains(&words) }
    })
    .await;
}

/// The sessions the agents hold.
fn held(nodes: &[&TestNode]) -> BTreeSet<String> {
    nodes.iter().flat_map(|n| n.held()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_runs_all_at_once_or_not_at_all() {
    let state = scratch("gangs");
    let ctl = TestController::builder(state.path())
        .timing(fast_timing(Duration::from_millis(1500)))
        .start();
    let n1 = TestNode::start(&ctl.url(), "n1", TestBackend::gpus(2));
    let n2 = TestNode::start(&ctl.url(), "n2", TestBackend::gpus(2));
    let mut c = ctl.client().await;
    wait_nodes(&c, 2).await;

    // Malformed gangs are refused naming the field.
    for (name, size, field) in [("t", 1, "gang.size"), ("no spaces", 2, "gang.name")] {
        let err = member(&mut c, "u", "1", name, size).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(field), "{err:?}");
    }

    // Two of three members: neither runs, and no agent holds anything.
    let mut train = Vec::new();
    for _ in 0..2 {
        train.push(member(&mut c, "u", "1", "train", 3).await.unwrap().id);
    }
    wait_reason(&c, &train[1], "gang train 2/3 members").await;
    ctl.passes(PASSES).await;
    for id in &train {
        let s = get(&mut c, id).await;
        assert_eq!(s.state, SessionState::Pending as i32, "{s:?}");
        assert_eq!(s.reason, "gang train 2/3 members");
        assert_eq!(
            s.gang,
            Some(pb::Gang {
                name: "train".into(),
                size: 3
            })
        );
    }
    assert!(held(&[&n1, &n2]).is_empty());
    // A member naming another size is refused; another owner's gang of the name is its own.
    let err = member(&mut c, "u", "1", "train", 4).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("gang.size"), "{err:?}");

    // The third member: all three run, on the agents too.
    train.push(member(&mut c, "u", "1", "train", 3).await.unwrap().id);
    for id in &train {
        wait_state(&c, id, SessionState::Running).await;
    }
    let expected: BTreeSet<String> = train.iter().cloned().collect();
    eventually("the agents hold the gang", || {
        let (a, b) = (n1.held(), n2.held());
        let expected = expected.clone();
        async move { a.into_iter().chain(b).collect::<BTreeSet<_>>() == expected }
    })
    .await;
    assert_eq!(shares_held(&mut c).await, "3");

    // One GPU is left: a gang of two whole GPUs holds nothing, though one member would fit.
    let pair = [
        member(&mut c, "v", "1", "train", 2).await.unwrap().id,
        member(&mut c, "v", "1", "train", 2).await.unwrap().id,
    ];
    wait_reason(&c, &pair[1], "does not fit at once").await;
    ctl.passes(PASSES).await;
    for id in &pair {
        let s = get(&mut c, id).await;
        assert_eq!(s.state, SessionState::Pending as i32, "{s:?}");
        assert!(s.reason.contains("does not fit at once"), "{}", s.reason);
    }
    assert_eq!(shares_held(&mut c).await, "3");
    assert_eq!(held(&[&n1, &n2]), expected);

    // A member of a placed gang ends: the others keep running, and the room it frees lets the
    // pair run, both at once.
    c.terminate_session(pb::TerminateSessionRequest {
        id: train[0].clone(),
    })
    .await
    .unwrap();
    for id in &pair {
        wait_state(&c, id, SessionState::Running).await;
    }
    for id in &train[1..] {
        assert_eq!(state_of(&mut c, id).await, SessionState::Running);
    }
    assert_eq!(shares_held(&mut c).await, "4");
    n1.stop().await;
    n2.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gangs_members_survive_a_controller_restart() {
    let dir = scratch("gang-restart");
    let start = || {
        TestController::builder(dir.path())
            .timing(fast_timing(Duration::from_millis(1500)))
            .start()
    };
    let ctl = start();
    let node = TestNode::start(&ctl.url(), "n1", TestBackend::gpus(2));
    let mut c = ctl.client().await;
    wait_nodes(&c, 1).await;
    let first = member(&mut c, "u", "0.5", "pair", 2).await.unwrap().id;
    wait_reason(&c, &first, "gang pair 1/2 members").await;
    assert_eq!(state_of(&mut c, &first).await, SessionState::Pending);
    ctl.kill();
    drop(c);

    let ctl = start();
    let (holdings, backend) = node.stop().await;
    let node = TestNode::start_with(&ctl.url(), "n1", backend, holdings);
    let mut c = ctl.client().await;
    wait_nodes(&c, 1).await;
    // The restarted controller knows the gang: its size is checked, and it still waits.
    let err = member(&mut c, "u", "0.5", "pair", 3).await.unwrap_err();
    assert!(err.message().contains("gang.size"), "{err:?}");
    wait_reason(&c, &first, "gang pair 1/2 members").await;
    ctl.passes(PASSES).await;
    let s = get(&mut c, &first).await;
    assert_eq!(s.state, SessionState::Pending as i32, "{s:?}");
    assert_eq!(s.reason, "gang pair 1/2 members");
    let second = member(&mut c, "u", "0.5", "pair", 2).await.unwrap().id;
    for id in [&first, &second] {
        wait_state(&c, id, SessionState::Running).await;
    }
    shares_held(&mut c).await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_gang_is_preempted_whole() {
    let (_state, _ctl, node, mut c) = with_quotas("gang-victim").await;
    // `burst` borrows both GPUs with a gang of two.
    let pair = [
        member(&mut c, "burst", "1", "pair", 2).await.unwrap().id,
        member(&mut c, "burst", "1", "pair", 2).await.unwrap().id,
    ];
    for id in &pair {
        wait_state(&c, id, SessionState::Running).await;
    }
    // `lab` asks for one GPU within its guarantee: one member's would do, the gang yields whole.
    let lab = single(&mut c, "lab", "1").await;
    wait_state(&c, &lab, SessionState::Running).await;
    for id in &pair {
        let s = get(&mut c, id).await;
        assert_eq!(s.state, SessionState::Preempted as i32, "{s:?}");
        assert!(s.reason.contains(&lab), "{}", s.reason);
    }
    assert_eq!(shares_held(&mut c).await, "1");
    eventually("the agent holds only lab's session", || {
        let held = node.held();
        let lab = lab.clone();
        async move { held == [lab] }
    })
    .await;
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_gang_reclaims_room_for_all_its_members() {
    let (_state, _ctl, node, mut c) = with_quotas("gang-reclaim").await;
    let burst = [
        single(&mut c, "burst", "1").await,
        single(&mut c, "burst", "1").await,
    ];
    for id in &burst {
        wait_state(&c, id, SessionState::Running).await;
    }
    // `lab`'s gang is within its guarantee: room for both members is taken back, then both run.
    let pair = [
        member(&mut c, "lab", "1", "pair", 2).await.unwrap().id,
        member(&mut c, "lab", "1", "pair", 2).await.unwrap().id,
    ];
    for id in &pair {
        wait_state(&c, id, SessionState::Running).await;
    }
    for id in &burst {
        assert_eq!(state_of(&mut c, id).await, SessionState::Preempted);
    }
    assert_eq!(shares_held(&mut c).await, "2");
    let expected: BTreeSet<String> = pair.iter().cloned().collect();
    eventually("the agent holds the gang", || {
        let held: BTreeSet<String> = node.held().into_iter().collect();
        let expected = expected.clone();
        async move { held == expected }
    })
    .await;
    node.stop().await;
}
