//! The CLI given several controllers sharing a real etcd: whichever it asks first, a dead one or
//! a standby, it ends up asking the leader.

use std::{process::Command, time::Duration};

use gpuwarden_controller::{api::Timing, scheduler::SchedulerConfig, server};
use gpuwarden_proto::v1::{self as pb, agent_service_client::AgentServiceClient};
use gpuwarden_test_support::Etcd;

/// A controller on `store`, campaigning; returns its URL.
fn start_elected(rt: &tokio::runtime::Runtime, store: &str) -> String {
    let spec = store.parse().expect("a store spec");
    let addr = rt
        .block_on(server::spawn_elected(
            &spec,
            SchedulerConfig::default(),
            Timing::default(),
            Duration::from_secs(2),
            std::future::pending(),
        ))
        .expect("serves");
    format!("http://{addr}")
}

fn slot_ls(controllers: &str) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwarden"))
        .args(["--controller", controllers, "slot", "ls"])
        .output()
        .expect("runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_cli_asks_the_leader_whichever_controller_it_is_given() {
    let etcd = Etcd::start();
    let store = etcd.store_url("cli");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let leader = start_elected(&rt, &store);
    // The first to start leads: wait until it does, then start a standby.
    let started = std::time::Instant::now();
    while !slot_ls(&leader).0 {
        assert!(started.elapsed() < Duration::from_secs(10), "never led");
        std::thread::sleep(Duration::from_millis(50));
    }
    let standby = start_elected(&rt, &store);
    // Only the leader knows this slot type: seeing it proves whom the CLI asked.
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(leader.clone())
            .expect("a URL")
            .connect()
            .await
            .expect("connects");
        AgentServiceClient::new(channel)
            .register(pb::NodeInfo {
                node_id: "n1".into(),
                hostname: "n1".into(),
                slot_types: vec![pb::SlotType {
                    name: "tpu.cores".into(),
                    kind: pb::SlotKind::Count.into(),
                }],
                ..Default::default()
            })
            .await
            .expect("registers");
    });
    // The standby learns the leader within a moment of starting.
    std::thread::sleep(Duration::from_millis(600));
    for given in [
        standby.clone(),
        format!("http://127.0.0.1:1,{standby}"),
        format!("{standby},{leader}"),
    ] {
        let (ok, said) = slot_ls(&given);
        assert!(
            ok && said.contains("tpu.cores"),
            "--controller {given}: {said}"
        );
    }
}
