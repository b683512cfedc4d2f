//! Controllers sharing a real etcd, with the real agent link given the list of them: it follows
//! the leader from a standby, keeps what it holds while no leader exists, and finds the new
//! leader by itself after the old one is killed, which then runs what is asked.

use std::time::{Duration, Instant};

use gpuwarden_controller::store::StoreSpec;
use gpuwarden_proto::v1::{self as pb, SessionState};
use gpuwarden_test_support::{
    Etcd,
    cluster::{TestBackend, TestNode, alloc_map, create, wait_nodes, wait_state},
    controller::{TestController, fast_timing},
    wait::{self, PATIENCE, eventually},
};

const TTL: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_follows_the_leader_through_a_failover_and_keeps_what_it_holds() {
    let etcd = Etcd::start();
    let store: StoreSpec = etcd.store_url("ha").parse().unwrap();
    let timing = fast_timing(Duration::from_secs(30));
    let a = TestController::elected(&store, TTL).timing(timing).start();
    eventually("the first controller to lead", || a.leads()).await;
    let b = TestController::elected(&store, TTL).timing(timing).start();

    // The standby comes first in the agent's list: it is told where the leader is.
    let node = TestNode::start(
        &format!("{},{}", b.url(), a.url()),
        "n1",
        TestBackend::gpus(2),
    );
    let mut to_a = a.client().await;
    wait_nodes(&to_a, 1).await;
    let mut before = Vec::new();
    for _ in 0..5 {
        let s = create(&mut to_a, "u", &["cuda.shares=0.3"]).await.unwrap();
        wait_state(&to_a, &s.id, SessionState::Running).await;
        before.push(s.id);
    }
    assert_eq!(alloc_map(&mut to_a, "n1").await, ["0.9", "0.6"]);

    let killed = Instant::now();
    a.kill();
    // It leads once the lease lapses (how soon: `cargo xtask bench timings`).
    wait::until_async("the standby to lead", TTL + PATIENCE, || b.leads()).await;
    eprintln!(
        "takeover after the leader was killed: {:?} (TTL {TTL:?})",
        killed.elapsed()
    );
    // While no leader existed, and after, the node kept what it held.
    let mut held = node.held();
    held.sort();
    before.sort();
    assert_eq!(held, before);

    // The new leader has every session, over-commits nothing, and the agent reconnects to it by
    // itself: a new session runs, which takes the agent's acknowledgement.
    let mut to_b = b.client().await;
    for id in &before {
        wait_state(&to_b, id, SessionState::Running).await;
    }
    let after = create(&mut to_b, "u", &["cuda.shares=0.4"]).await.unwrap();
    wait_state(&to_b, &after.id, SessionState::Running).await;
    assert_eq!(alloc_map(&mut to_b, "n1").await, ["0.9", "1"]);
    let refused = create(&mut to_b, "u", &["cuda.shares=0.2"]).await.unwrap();
    // Many scheduling passes later it still waits: the GPUs are full.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pending = to_b
        .get_session(pb::GetSessionRequest { id: refused.id })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        pending.state,
        i32::from(SessionState::Pending),
        "no room left"
    );
    assert!(node.held().contains(&after.id));
}
