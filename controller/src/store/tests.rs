//! The store's contract, run against both backends: sled in a scratch directory and a real etcd.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use gpuwarden_runtime::tls::ClientTls;
use gpuwarden_test_support::{Etcd, scratch};

use super::*;
use crate::{
    allocator::Allocation,
    session::SessionState,
    slots::{ResourceSlot, SlotKind, SlotName},
};

fn session(id: &str) -> Session {
    Session {
        id: id.into(),
        request_id: None,
        wait: None,
        placed_at_ms: None,
        releasing_since_ms: None,
        name: id.into(),
        owner: "u".into(),
        priority: 0,
        requested: ResourceSlot::parse_any(&["cuda.shares=0.2"]).unwrap(),
        pinned_node: None,
        state: SessionState::Pending,
        node: None,
        allocation: Allocation::default(),
        reason: String::new(),
        seq: 0,
        failed_passes: 0,
        created_at_ms: 1,
        updated_at_ms: 1,
        target: crate::session::Target::None,
        policy: crate::session::QuotaPolicy::default(),
        scope: crate::session::TargetScope::default(),
        events: vec![],
        class: String::new(),
        placement: None,
        explanation: None,
        usage: crate::profile::UsageSeries::default(),
        origin: crate::session::Origin::Controller,
        revision: 0,
        no_preempt: false,
        preempting: None,
        preempted_for: None,
        gang: None,
        preemption: None,
        home: None,
        run_uid: None,
        decisions: Vec::new(),
    }
}

/// A place for a store, kept alive as long as the test needs it.
enum Place {
    Sled(tempfile::TempDir),
    Etcd(Etcd),
}

impl Place {
    fn sled() -> Self {
        Self::Sled(scratch("store"))
    }

    fn etcd() -> Self {
        Self::Etcd(Etcd::start())
    }

    fn spec(&self) -> StoreSpec {
        match self {
            Self::Sled(dir) => StoreSpec::Sled(dir.path().join("store")),
            Self::Etcd(etcd) => etcd.store_url("test").parse().unwrap(),
        }
    }
}

fn both() -> [Place; 2] {
    [Place::sled(), Place::etcd()]
}

#[test]
fn session_records_from_before_targets_still_load() {
    let mut old = serde_json::to_value(session("s1")).unwrap();
    for key in ["target", "policy", "events"] {
        old.as_object_mut().unwrap().remove(key);
    }
    let back: Session = serde_json::from_value(old).unwrap();
    assert_eq!(back, session("s1"));
}

#[tokio::test]
async fn records_survive_reopening() {
    for place in both() {
        let spec = place.spec();
        {
            let store = Store::open(&spec).await.unwrap();
            let mut r = SlotTypeRegistry::new();
            r.merge(
                "n",
                &[(SlotName::new("cuda.shares").unwrap(), SlotKind::Count)],
            )
            .unwrap();
            store
                .write(vec![
                    Write::session(&session("s1")).unwrap(),
                    Write::session(&session("gone")).unwrap(),
                    Write::registry(&r).unwrap(),
                ])
                .await
                .unwrap();
            store
                .write(vec![Write::remove_session("gone")])
                .await
                .unwrap();
        }
        let back = Store::open(&spec).await.unwrap().load().await.unwrap();
        assert_eq!(back.sessions, vec![session("s1")], "{spec}");
        assert_eq!(back.registry.kind("cuda.shares"), Some(SlotKind::Count));
    }
}

#[tokio::test]
async fn another_format_version_is_refused() {
    for place in both() {
        let spec = place.spec();
        let store = Store::open(&spec).await.unwrap();
        store
            .write(vec![Write::Put {
                key: FORMAT_KEY.to_owned(),
                value: b"99".to_vec(),
            }])
            .await
            .unwrap();
        store.close().await;
        let err = Store::open(&spec).await.unwrap_err();
        assert!(
            err.to_string().contains("format version 99"),
            "{spec}: {err}"
        );
    }
}

#[tokio::test]
async fn lists_page_through_every_key_in_order_and_only_under_the_prefix() {
    for place in both() {
        let store = Store::open(&place.spec()).await.unwrap();
        // More than one etcd page (256), with keys that sort around the prefix's end.
        let mut writes: Vec<Write> = (0..600)
            .map(|i| Write::session(&session(&format!("s{i:04}"))).unwrap())
            .collect();
        writes.push(Write::Put {
            key: "sessions0/not-a-session".to_owned(),
            value: b"{}".to_vec(),
        });
        store.write(writes).await.unwrap();
        let keys: Vec<String> = store
            .kv()
            .list(SESSIONS)
            .await
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys.len(), 600, "{}", store.kv().describe());
        assert_eq!(keys[0], "sessions/s0000");
        assert_eq!(keys[599], "sessions/s0599");
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
    }
}

#[tokio::test]
async fn compare_and_put_writes_only_over_what_was_expected() {
    for place in both() {
        let store = Store::open(&place.spec()).await.unwrap();
        let kv = store.kv();
        assert!(kv.compare_and_put("policies/p", None, b"1").await.unwrap());
        assert!(!kv.compare_and_put("policies/p", None, b"2").await.unwrap());
        assert!(
            !kv.compare_and_put("policies/p", Some(b"0"), b"2")
                .await
                .unwrap()
        );
        assert!(
            kv.compare_and_put("policies/p", Some(b"1"), b"2")
                .await
                .unwrap()
        );
        assert_eq!(
            kv.get("policies/p").await.unwrap().as_deref(),
            Some(&b"2"[..])
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_changes_share_commits_and_each_is_answered_when_durable() {
    for place in both() {
        let spec = place.spec();
        let store = Store::open(&spec).await.unwrap();
        let announced = Arc::new(Mutex::new(Vec::new()));
        let submitted = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..200 {
            let store = store.clone();
            let announced = Arc::clone(&announced);
            let submitted = Arc::clone(&submitted);
            tasks.push(tokio::spawn(async move {
                let id = format!("s{i:03}");
                // Submitted under a lock, as the controller does under the scheduler's.
                let change = {
                    let mut order = submitted.lock().unwrap();
                    order.push(id.clone());
                    let after_id = id.clone();
                    store.submit(
                        vec![Write::session(&session(&id)).unwrap()],
                        Some(Box::new(move || announced.lock().unwrap().push(after_id))),
                    )
                };
                change.durable().await.map(|()| id)
            }));
        }
        let mut acknowledged = Vec::new();
        for t in tasks {
            acknowledged.push(t.await.unwrap().unwrap());
        }
        let (commits, changes) = store.commit_counts();
        assert_eq!(changes, 200, "{spec}");
        assert!(
            commits < 200,
            "{spec}: {commits} commits for 200 changes: nothing grouped"
        );
        // Every acknowledged change is there for a fresh reader.
        store.close().await;
        let back = Store::open(&spec).await.unwrap().load().await.unwrap();
        let mut stored: Vec<String> = back.sessions.into_iter().map(|s| s.id).collect();
        stored.sort();
        acknowledged.sort();
        assert_eq!(stored, acknowledged, "{spec}");
        // Announcements ran once each, after their commit, in the order changes were submitted.
        assert_eq!(
            *announced.lock().unwrap(),
            *submitted.lock().unwrap(),
            "{spec}"
        );
    }
}

#[tokio::test]
async fn a_failed_commit_answers_with_the_reason_and_its_writes_go_with_the_next() {
    let mut etcd = Etcd::start();
    let spec: StoreSpec = etcd.store_url("fail").parse().unwrap();
    let store = Store::open(&spec).await.unwrap();
    etcd.kill();
    let err = store
        .write(vec![Write::session(&session("kept")).unwrap()])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("etcd"), "{err}");
    etcd.resume();
    // The next commit carries the failed one's writes.
    store
        .write(vec![Write::session(&session("next")).unwrap()])
        .await
        .unwrap();
    let back = Store::open(&spec).await.unwrap().load().await.unwrap();
    let ids: Vec<String> = back.sessions.into_iter().map(|s| s.id).collect();
    assert_eq!(ids, ["kept", "next"]);
}

#[tokio::test]
async fn a_sled_store_copies_into_etcd() {
    let sled = Place::sled();
    let etcd = Place::etcd();
    let from = Store::open(&sled.spec()).await.unwrap();
    from.write(vec![
        Write::session(&session("a")).unwrap(),
        Write::session(&session("b")).unwrap(),
        Write::policy("limits", &serde_json::json!({"max": 3})).unwrap(),
    ])
    .await
    .unwrap();
    let to = Store::open(&etcd.spec()).await.unwrap();
    assert_eq!(from.copy_to(&to).await.unwrap(), 3);
    let back = to.load().await.unwrap();
    assert_eq!(back.sessions, vec![session("a"), session("b")]);
    assert_eq!(
        to.kv().get("policies/limits").await.unwrap().as_deref(),
        Some(&br#"{"max":3}"#[..])
    );
}

#[test]
fn team_queues_read_back_as_stored_and_none_when_never_set() {
    let never = Snapshot::from_records(Vec::new()).unwrap();
    assert_eq!(never.quotas, None, "the config file's queues apply");
    let mut quotas = QuotaConfig::default();
    quotas.queues.insert(
        "team-a".into(),
        crate::scheduler::quotas::QueueQuota {
            guaranteed: ResourceSlot::parse_any(&["cuda.shares=4.5"]).unwrap(),
            limit: None,
        },
    );
    quotas.members.insert("alice".into(), "team-a".into());
    let Write::Put { key, value } = Write::quotas(&quotas).unwrap() else {
        panic!("a put");
    };
    let back = Snapshot::from_records([(key.clone(), value)]).unwrap();
    assert_eq!(back.quotas, Some(quotas));
    // Every queue removed is kept as such: an empty record, not none.
    let Write::Put { value, .. } = Write::quotas(&QuotaConfig::default()).unwrap() else {
        panic!("a put");
    };
    let back = Snapshot::from_records([(key, value)]).unwrap();
    assert_eq!(back.quotas, Some(QuotaConfig::default()));
}

#[test]
fn store_specs_parse_and_bad_ones_say_what_is_wrong() {
    assert_eq!(
        "sled:/var/lib/gw".parse::<StoreSpec>().unwrap(),
        StoreSpec::Sled("/var/lib/gw".into())
    );
    assert_eq!(
        "etcd://a:2379,b:2379".parse::<StoreSpec>().unwrap(),
        StoreSpec::Etcd {
            endpoints: vec!["a:2379".into(), "b:2379".into()],
            prefix: DEFAULT_ETCD_PREFIX.into(),
            tls: ClientTls::default(),
        }
    );
    let spec: StoreSpec = "etcd://10.0.0.1:2379/prod/gw/".parse().unwrap();
    assert_eq!(spec.to_string(), "etcd://10.0.0.1:2379/prod/gw");
    for (bad, says) in [
        ("sled:", "no directory"),
        ("/var/lib/gw", "unknown scheme"),
        ("etcd://a", "\"a\" is not HOST:PORT"),
        ("etcd://a:2379,:1", "\":1\" is not HOST:PORT"),
        ("etcd://a:99999", "not HOST:PORT"),
    ] {
        let err = bad.parse::<StoreSpec>().unwrap_err().to_string();
        assert!(err.contains(says) && err.contains(bad), "{bad}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ungrouped_baseline_commits_each_change_on_its_own() {
    let place = Place::sled();
    let store = Store::open(&place.spec())
        .await
        .unwrap()
        .one_change_per_commit();
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .write(vec![Write::session(&session(&format!("s{i}"))).unwrap()])
                    .await
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(store.commit_counts(), (50, 50));
    assert_eq!(store.load().await.unwrap().sessions.len(), 50);
}

/// Two candidates on one election: the second leads only once the first's lease lapses, and from
/// then on nothing the first commits lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leader_cannot_write_and_its_successor_can() {
    let etcd = Etcd::start();
    let spec: StoreSpec = etcd.store_url("ha").parse().unwrap();
    let open = || async { Store::open(&spec).await.unwrap() };
    let (a, b) = (open().await, open().await);
    let (Kv::Etcd(a_kv), Kv::Etcd(b_kv)) = (a.kv(), b.kv()) else {
        unreachable!("etcd stores")
    };
    let ttl = Duration::from_secs(2);
    let a_office = a_kv
        .campaign("controller", "10.0.0.1:50051", ttl)
        .await
        .unwrap();
    assert_eq!(
        b_kv.leader("controller").await.unwrap().as_deref(),
        Some("10.0.0.1:50051")
    );
    let a_store = a.clone().fenced(a_office.fence());
    a_store
        .write(vec![Write::session(&session("by-a")).unwrap()])
        .await
        .unwrap();

    // B campaigns while A leads: it waits.
    let b_kv2 = b_kv.clone();
    let b_campaign =
        tokio::spawn(async move { b_kv2.campaign("controller", "10.0.0.2:50051", ttl).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!b_campaign.is_finished(), "B led while A's lease was alive");

    // A stops renewing (a paused or cut-off leader): B leads within the TTL and a second.
    let lapsed = Instant::now();
    drop(a_office);
    let b_office = tokio::time::timeout(ttl + Duration::from_secs(3), b_campaign)
        .await
        .expect("B leads after A's lease lapses")
        .unwrap()
        .unwrap();
    let takeover = lapsed.elapsed();
    assert!(
        takeover <= ttl + Duration::from_secs(2),
        "took {takeover:?}"
    );
    assert_eq!(
        a_kv.leader("controller").await.unwrap().as_deref(),
        Some("10.0.0.2:50051")
    );

    // A's fenced writes are refused, not retried, and none lands.
    let err = a_store
        .write(vec![Write::session(&session("late-a")).unwrap()])
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Deposed { .. }), "{err}");
    assert!(
        err.to_string().contains("another controller leads"),
        "{err}"
    );
    let b_store = b.clone().fenced(b_office.fence());
    b_store
        .write(vec![Write::session(&session("by-b")).unwrap()])
        .await
        .unwrap();
    let ids: Vec<String> = open()
        .await
        .load()
        .await
        .unwrap()
        .sessions
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(ids, ["by-a", "by-b"]);

    // Resigning hands over at once.
    b_office.resign().await.unwrap();
    assert_eq!(a_kv.leader("controller").await.unwrap(), None);
}

#[tokio::test]
async fn a_key_written_twice_in_one_commit_keeps_the_last_value() {
    for place in both() {
        let store = Store::open(&place.spec()).await.unwrap();
        let mut second = session("s1");
        second.name = "second".into();
        // etcd refuses a transaction naming a key twice; the group keeps the last write.
        store
            .write(vec![
                Write::session(&session("s1")).unwrap(),
                Write::session(&second).unwrap(),
            ])
            .await
            .unwrap();
        let back = store.load().await.unwrap();
        assert_eq!(back.sessions, vec![second], "{}", store.kv().describe());
    }
}

/// A standby may wait far longer than one etcd request may take; it still takes over, and leaves
/// no candidacy behind that nobody holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_waited_past_the_request_timeout_still_takes_over() {
    let etcd = Etcd::start();
    let spec: StoreSpec = etcd.store_url("wait").parse().unwrap();
    let store = Store::open(&spec).await.unwrap();
    let Kv::Etcd(kv) = store.kv() else {
        unreachable!("an etcd store")
    };
    let ttl = Duration::from_secs(2);
    let a = kv.campaign("controller", "a:1", ttl).await.unwrap();
    let waiting = (**kv).clone();
    let b = tokio::spawn(async move { waiting.campaign("controller", "b:1", ttl).await });
    // The client's request timeout is 10 s.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(!b.is_finished(), "B led while A held office");
    let lapsed = Instant::now();
    drop(a);
    let b = tokio::time::timeout(ttl + Duration::from_secs(3), b)
        .await
        .expect("B leads once A's lease lapses")
        .unwrap()
        .unwrap();
    assert!(
        lapsed.elapsed() <= ttl + Duration::from_secs(2),
        "{:?}",
        lapsed.elapsed()
    );
    assert_eq!(
        kv.leader("controller").await.unwrap().as_deref(),
        Some("b:1")
    );
    // Only B's candidacy is in the election: nothing abandoned waits to lead after it.
    let candidates = kv.list("election/controller/").await.unwrap();
    assert_eq!(candidates.len(), 1, "{candidates:?}");
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_copy_follows_every_put_and_delete_and_says_when_it_has_caught_up() {
    let etcd = Etcd::start();
    let spec: StoreSpec = etcd.store_url("warm").parse().unwrap();
    let writer = Store::open(&spec).await.unwrap();
    writer
        .write(vec![Write::session(&session("before")).unwrap()])
        .await
        .unwrap();
    let Kv::Etcd(etcd) = writer.kv() else {
        unreachable!("an etcd store")
    };
    let replica = etcd.replicate().await.unwrap();
    let mut batch: Vec<Write> = (0..300)
        .map(|i| Write::session(&session(&format!("s{i:03}"))).unwrap())
        .collect();
    batch.push(Write::remove_session("before"));
    writer.write(batch).await.unwrap();
    // The revision now: every write above is at or before it.
    let (_, now) = etcd.list_at("meta/", None).await.unwrap();
    replica
        .caught_up(now, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(!replica.failed());
    let copied = Snapshot::from_records(replica.records()).unwrap();
    let read = writer.load().await.unwrap();
    assert_eq!(copied.sessions.len(), 300);
    assert_eq!(copied.sessions, read.sessions);
    // A revision that never comes is a clear error, not a hang.
    let err = replica
        .caught_up(now + 1000, Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("needed"), "{err}");
}
