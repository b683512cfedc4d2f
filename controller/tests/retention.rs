//! Ended sessions past their retention leave the store too: a restarted controller does not
//! bring them back, and live ones are untouched. Run on sled and on a real etcd.

use gpuwarden_controller::{
    api::Timing,
    node::NodeReport,
    scheduler::{NewSession, Retention, SchedulerConfig},
    server,
    session::SessionState,
    slots::ResourceSlot,
    store::StoreSpec,
};

#[tokio::test]
async fn forgotten_sessions_stay_forgotten_on_sled() {
    let scratch = gpuwarden_test_support::scratch("retention");
    forgotten_sessions_stay_forgotten(&server::sled_in(scratch.path())).await;
}

#[tokio::test]
async fn forgotten_sessions_stay_forgotten_on_etcd() {
    let etcd = gpuwarden_test_support::Etcd::start();
    let spec = etcd.store_url("retention").parse().expect("a store spec");
    forgotten_sessions_stay_forgotten(&spec).await;
}

async fn forgotten_sessions_stay_forgotten(spec: &StoreSpec) {
    let config = SchedulerConfig {
        retention: Retention {
            ended_secs: 3_600,
            max_ended: 1,
        },
        ..SchedulerConfig::default()
    };
    let open = || server::open(spec, config.clone(), Timing::default());
    let new = |id: &str| NewSession {
        id: id.into(),
        requested: ResourceSlot::parse_any(&["cuda.shares=0.1"]).expect("valid"),
        ..NewSession::default()
    };

    let controller = open().await.expect("opens");
    controller
        .apply(|s| {
            s.register(NodeReport::with_gpus("n1", 2, 80 << 30, 2), &[])
                .expect("registers");
            for id in ["a", "b", "c"] {
                s.create(new(id)).expect("created");
            }
            s.terminate("a");
            s.terminate("b");
        })
        .await
        .expect("persisted");
    // `a` and `b` ended in the same millisecond or one after the other: one of them is forgotten.
    let forgotten = controller
        .apply(|s| s.forget_ended(gpuwarden_controller::session::now_ms()))
        .await
        .expect("persisted");
    assert_eq!(forgotten, 1);
    let kept: Vec<String> = controller.read(|s| s.sessions().keys().cloned().collect());
    drop(controller);

    let controller = open().await.expect("reopens");
    let restored: Vec<String> = controller.read(|s| s.sessions().keys().cloned().collect());
    assert_eq!(restored, kept, "the store holds what memory held");
    assert_eq!(restored.len(), 2);
    assert!(restored.contains(&"c".to_owned()));
    assert_eq!(
        controller.read(|s| s.sessions()["c"].state),
        SessionState::Pending
    );
}
