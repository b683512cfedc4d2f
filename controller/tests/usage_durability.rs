//! A running session's usage reports survive a controller restart: they are written to the
//! store as they arrive (without waking watchers), so the profile learned when the session ends
//! still counts the reports from before the restart. Run on sled and on a real etcd.

use gpuwarden_controller::{
    api::Timing,
    node::NodeReport,
    profile::UsageSample,
    scheduler::{NewSession, SchedulerConfig},
    server,
    slots::ResourceSlot,
    store::StoreSpec,
};

/// One node with one 16 GiB GPU, as simulations register it.
fn node() -> NodeReport {
    NodeReport::with_gpus("n1", 1, 16 << 30, 1)
}

fn sample(utilization: f64) -> UsageSample {
    UsageSample {
        utilization,
        ..UsageSample::default()
    }
}

#[tokio::test]
async fn usage_reports_survive_a_controller_restart_on_sled() {
    let scratch = gpuwarden_test_support::scratch("usage");
    usage_reports_survive_a_controller_restart(&server::sled_in(scratch.path())).await;
}

#[tokio::test]
async fn usage_reports_survive_a_controller_restart_on_etcd() {
    let etcd = gpuwarden_test_support::Etcd::start();
    let spec = etcd.store_url("usage").parse().expect("a store spec");
    usage_reports_survive_a_controller_restart(&spec).await;
}

async fn usage_reports_survive_a_controller_restart(spec: &StoreSpec) {
    let open = || server::open(spec, SchedulerConfig::default(), Timing::default());

    let controller = open().await.expect("opens");
    controller
        .apply(|s| {
            s.register(node(), &[]).expect("registers");
            s.create(NewSession {
                id: "a".into(),
                class: "train".into(),
                requested: ResourceSlot::parse_any(&["cuda.shares=0.5"]).expect("valid"),
                ..NewSession::default()
            })
            .expect("created");
            s.pass();
            s.ack("n1", "a");
        })
        .await
        .expect("persisted");
    for _ in 0..4 {
        let recorded = controller
            .apply(|s| s.record_usage("n1", "a", sample(0.8)))
            .await
            .expect("persisted");
        assert!(recorded);
    }
    drop(controller);

    // After the restart the node comes back (its agent re-registers, still holding `a`).
    let controller = open().await.expect("reopens");
    let samples = controller.read(|s| s.sessions()["a"].usage.samples);
    assert_eq!(samples, 4, "reports written before the restart");
    controller
        .apply(|s| {
            s.register(node(), &["a".to_owned()]).expect("re-registers");
            s.record_usage("n1", "a", sample(0.2));
            s.terminate("a");
        })
        .await
        .expect("persisted");
    let profile = controller
        .read(|s| s.profiles().get("train").cloned())
        .expect("learned");
    assert_eq!(profile.samples, 5);
    // Four samples at 0.8 and one at 0.2: the 5th–15th percentiles are 0.2, the rest 0.8.
    assert!((profile.mean() - 0.68).abs() < 1e-9, "{profile:?}");
}
