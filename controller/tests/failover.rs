//! Controllers sharing a real etcd: one leads, the others stand by naming it; when the leader is
//! killed a standby takes over with every acknowledged session; a leader paused past its lease
//! cannot write when it resumes, and steps down.
//!
//! The tests wait for each of these with generous deadlines; how soon a standby takes over is a
//! figure of `cargo xtask bench timings` (printed here too).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use gpuwarden_test_support::{
    Etcd,
    controller::{ControllerProcess as Member, request},
    wait::{self, PATIENCE},
};
use tonic::Code;

const TTL: Duration = Duration::from_secs(2);

/// A controller on the etcd store `store`, campaigning with a lease of [`TTL`].
fn member(store: &str) -> Member {
    Member::start(store, &["--lease-ttl-secs", &TTL.as_secs().to_string()])
}

/// What a standby says: UNAVAILABLE, naming the leader in the metadata.
async fn refusal(member: &Member) -> tonic::Status {
    member.names().await.expect_err("a standby refuses")
}

fn named_leader(status: &tonic::Status) -> Option<String> {
    status
        .metadata()
        .get("gpuwarden-leader")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_names_the_leader_and_takes_over_with_every_acknowledged_session() {
    let etcd = Etcd::start();
    let store = etcd.store_url("failover");
    let a = member(&store);
    a.until_serving(PATIENCE).await;
    let b = member(&store);
    let c = member(&store);
    for standby in [&b, &c] {
        // A standby learns the leader soon after starting.
        wait::until_async("the standby to name a leader", PATIENCE, || async {
            named_leader(&refusal(standby).await).is_some()
        })
        .await;
        let status = refusal(standby).await;
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(
            named_leader(&status),
            Some(a.addr.to_string()),
            "{status:?}"
        );
        assert!(status.message().contains("standby"), "{status:?}");
    }

    a.register_node().await;
    let mut client = a.client().await;
    let mut acknowledged = Vec::new();
    for i in 0..30 {
        let name = format!("job-{i:02}");
        client
            .create_session(request(&name))
            .await
            .expect("created");
        acknowledged.push(name);
    }

    let killed = Instant::now();
    drop(a);
    // Whichever standby wins, it leads once the lease lapses, with every session (how soon:
    // `cargo xtask bench timings`).
    let winner = tokio::select! {
        _ = b.until_serving(TTL + PATIENCE) => &b,
        _ = c.until_serving(TTL + PATIENCE) => &c,
    };
    let takeover = killed.elapsed();
    eprintln!("takeover after SIGKILL of the leader: {takeover:?} (TTL {TTL:?})");
    assert_eq!(winner.names().await.expect("leads"), acknowledged);
    // The other standby now names the new leader.
    let other = if std::ptr::eq(winner, &raw const b) {
        &c
    } else {
        &b
    };
    let winner_addr = winner.addr.to_string();
    wait::until_async(
        "the other standby to name the new leader",
        PATIENCE,
        || async { named_leader(&refusal(other).await).as_ref() == Some(&winner_addr) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_its_lease_cannot_write_and_steps_down() {
    let etcd = Etcd::start();
    let store = etcd.store_url("fencing");
    let a = member(&store);
    a.until_serving(PATIENCE).await;
    a.register_node().await;
    let mut to_a = a.client().await;
    to_a.create_session(request("before"))
        .await
        .expect("created");
    let b = member(&store);

    a.signal(libc::SIGSTOP);
    b.until_serving(TTL + PATIENCE).await;
    a.signal(libc::SIGCONT);

    // Whatever the old leader still accepts, none of it may land: the store is fenced.
    let mut late = Vec::new();
    for i in 0..10 {
        let name = format!("late-{i}");
        let answer = to_a.create_session(request(&name)).await;
        if let Err(status) = &answer {
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        }
        late.push((name, answer.is_ok()));
    }
    assert!(
        late.iter().all(|(_, acknowledged)| !acknowledged),
        "the old leader acknowledged writes after it lost office: {late:?}"
    );
    assert_eq!(b.names().await.expect("leads"), ["before"]);
    // And it steps down, naming the new leader.
    let b_addr = b.addr.to_string();
    wait::until_async(
        "the old leader to step down naming the new one",
        PATIENCE,
        || async { named_leader(&refusal(&a).await).as_ref() == Some(&b_addr) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_lost_under_load_stops_scheduling_with_the_reason_and_loses_nothing_acknowledged() {
    let mut etcd = Etcd::start();
    let store = etcd.store_url("faults");
    let a = member(&store);
    a.until_serving(PATIENCE).await;
    a.register_node().await;

    let stop = Arc::new(AtomicBool::new(false));
    // Answers so far, acknowledged and refused, for the test to wait on.
    let (acks, refusals) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let load = {
        let mut client = a.client().await;
        let (stop, acks, refusals) = (Arc::clone(&stop), Arc::clone(&acks), Arc::clone(&refusals));
        tokio::spawn(async move {
            let (mut acknowledged, mut refused) = (Vec::new(), Vec::new());
            // Whether the last answer was an acknowledgement: scheduling resumed.
            let mut resumed = false;
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("job-{i:04}");
                match client.create_session(request(&name)).await {
                    Ok(_) => {
                        acknowledged.push(name);
                        resumed = true;
                        acks.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(status) => {
                        refused.push(status);
                        resumed = false;
                        refusals.fetch_add(1, Ordering::Relaxed);
                    }
                }
                i += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (acknowledged, refused, resumed)
        })
    };
    wait::until_async(
        "creates to be acknowledged under load",
        PATIENCE,
        || async { acks.load(Ordering::Relaxed) > 0 },
    )
    .await;
    etcd.kill();
    let killed = Instant::now();
    // Until the controller notices etcd is gone and refuses; etcd stays away at least 3 s, past
    // the lease's TTL.
    let noticed = wait::until_async(
        "a create refused while etcd is down",
        TTL + PATIENCE,
        || async { refusals.load(Ordering::Relaxed) > 0 },
    )
    .await;
    eprintln!("refusing {noticed:?} after etcd was killed");
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(killed.elapsed())).await;
    etcd.resume();
    let back = a.until_serving(PATIENCE).await;
    eprintln!("leading again {back:?} after etcd came back");
    // Until the load's own creates are acknowledged again.
    let before = acks.load(Ordering::Relaxed);
    wait::until_async(
        "the load's creates to be acknowledged again",
        PATIENCE,
        || async { acks.load(Ordering::Relaxed) > before + 2 },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let (acknowledged, refused, resumed) = load.await.expect("the load ran");

    // While etcd was away, creates were refused with a reason, not acknowledged.
    assert!(
        !refused.is_empty(),
        "nothing was refused while etcd was down"
    );
    for status in &refused {
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(
            status.message().contains("store") || status.message().contains("standby"),
            "{status:?}"
        );
    }
    // Scheduling resumed: the creates after etcd returned were acknowledged.
    assert!(resumed, "the last creates were still refused");
    // Every acknowledged session is there.
    let stored = a.names().await.expect("leads");
    let missing: Vec<&String> = acknowledged
        .iter()
        .filter(|n| !stored.contains(n))
        .collect();
    assert!(missing.is_empty(), "acknowledged but lost: {missing:?}");
}
