//! MIG instances made on demand (issue 37 §3, docs/mig.md "Instances made on demand"): the
//! controller and a real agent link over loopback gRPC, the agent on mock GPUs whose MIG layer
//! refuses what the driver refuses. What changed is read from the mock's own layout and device
//! list, not from the controller's bookkeeping.

// Test helpers fail loudly on anything unexpected.
#![expect(
    clippy::unwrap_used,
    reason = "a test's helpers unwrap: a failure there is the test failing"
)]

use std::{path::Path, sync::Arc, time::Duration};

use gpuwarden_agent::{
    control::link::{self as controller_link, LinkConfig},
    devices::{GpuBackend, mock::MockBackend},
};
use gpuwarden_controller::scheduler::SchedulerConfig;
use gpuwarden_proto::v1::{self as pb, SessionState};
use gpuwarden_test_support::{
    cluster::{create, no_holdings, wait_nodes, wait_state},
    controller::{TestController, fast_timing},
    scratch,
    wait::eventually,
};

/// GPU-0 whole; GPU-1, an H200 in MIG mode with the operator's `3g.71gb` at slices 4-7, given
/// to gpuwarden; GPU-2, an H200 in MIG mode with no instance, not given.
const DEVICES: &str = include_str!("../../deploy/mock-devices-mig-on-demand.toml");

/// GPU `gpu`'s instances as the mock's MIG layer holds them: (profile, start, size).
fn layout(backend: &MockBackend, gpu: &str) -> Vec<(String, u32, u32)> {
    let mut out: Vec<(String, u32, u32)> = backend
        .mig_layouts()
        .into_iter()
        .find(|(uuid, _, _)| uuid == gpu)
        .map(|(_, _, l)| {
            l.instances
                .iter()
                .map(|(p, at)| (p.name.to_owned(), at.start, at.size))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The real agent link on `backend`, GPU-1 given to gpuwarden; stopped when the sender drops.
fn start_agent(
    url: &str,
    backend: Arc<MockBackend>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = LinkConfig {
        controller: url.to_owned(),
        tls: gpuwarden_runtime::tls::ClientTls::default(),
        node_id: "n1".into(),
        hostname: "n1".into(),
        hooks: vec![],
        mig_reconfigurable: vec!["GPU-1".into()],
    };
    let dyn_backend: Arc<dyn GpuBackend> = backend;
    let task = tokio::spawn(controller_link::run(
        config,
        dyn_backend,
        no_holdings(),
        None,
        async {
            let _ = stopped.await;
        },
    ));
    (stop, task)
}

async fn session(
    c: &mut pb::scheduler_service_client::SchedulerServiceClient<tonic::transport::Channel>,
    id: &str,
) -> pb::Session {
    c.get_session(pb::GetSessionRequest { id: id.into() })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(clippy::too_many_lines, reason = "one scenario, read top to bottom")]
async fn a_profile_request_makes_an_instance_binds_to_it_and_terminate_destroys_it() {
    let state = scratch("mig-ondemand");
    let ctl = TestController::builder(state.path())
        .config(SchedulerConfig::default())
        .timing(fast_timing(Duration::from_secs(3)))
        .start();
    let backend = Arc::new(MockBackend::from_toml(DEVICES, Path::new("mock.toml")).unwrap());
    let untouched = layout(&backend, "GPU-2");
    assert!(untouched.is_empty());
    let before: Vec<String> = backend.devices().iter().map(|d| d.uuid.clone()).collect();
    let (stop, task) = start_agent(&ctl.url(), Arc::clone(&backend));
    let mut c = ctl.client().await;
    wait_nodes(&c, 1).await;

    // No 2g.35gb exists: one is made on GPU-1 and the session is bound to it.
    let s = create(&mut c, "u", &["cuda.mig.2g.35gb=1"]).await.unwrap();
    wait_state(&c, &s.id, SessionState::Running).await;
    let placed = session(&mut c, &s.id).await;
    assert_eq!(placed.devices.len(), 1, "{placed:?}");
    let uuid = placed.devices[0].uuid.clone();
    assert!(
        !before.contains(&uuid),
        "bound to a new device, not {before:?}"
    );
    // The mock's own account: a device of that UUID, a 2g.35gb instance of GPU-1.
    let made = backend
        .devices()
        .into_iter()
        .find(|d| d.uuid == uuid)
        .expect("the session's device is on the node");
    let mig = made.mig.clone().unwrap();
    assert_eq!(
        (mig.parent_uuid.as_str(), mig.profile.as_str()),
        ("GPU-1", "2g.35gb")
    );
    assert_eq!(placed.devices[0].index, made.index);
    // GPU-1 holds it beside the operator's 3g (at a start a 2g may take), GPU-2 is untouched.
    let gpu1 = layout(&backend, "GPU-1");
    assert_eq!(gpu1.len(), 2, "{gpu1:?}");
    assert!(gpu1.contains(&("3g.71gb".into(), 4, 4)), "{gpu1:?}");
    let new = gpu1.iter().find(|i| i.0 == "2g.35gb").unwrap();
    assert!([0, 2].contains(&new.1) && new.2 == 2, "{gpu1:?}");
    assert_eq!(layout(&backend, "GPU-2"), untouched);

    // A 7g.141gb would fit only on GPU-2, which was not given: nothing is made, it waits.
    let big = create(&mut c, "u", &["cuda.mig.7g.141gb=1"]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        session(&mut c, &big.id).await.state,
        SessionState::Pending as i32
    );
    assert_eq!(layout(&backend, "GPU-2"), untouched);
    c.terminate_session(pb::TerminateSessionRequest { id: big.id.clone() })
        .await
        .unwrap();

    // A process still in the instance when the session ends: the driver refuses to destroy
    // it, so it stays, tried again at each heartbeat, and goes once the process is gone.
    backend.set_instance_processes(&uuid, 1).unwrap();
    c.terminate_session(pb::TerminateSessionRequest { id: s.id.clone() })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        backend.devices().iter().any(|d| d.uuid == uuid),
        "destroyed with a process in it"
    );
    backend.set_instance_processes(&uuid, 0).unwrap();
    eventually("the made instance to be destroyed", || {
        let b = Arc::clone(&backend);
        let uuid = uuid.clone();
        async move { !b.devices().iter().any(|d| d.uuid == uuid) }
    })
    .await;
    // Its slices are free again; the operator's instance stays; GPU-2 never changed.
    assert_eq!(layout(&backend, "GPU-1"), [("3g.71gb".to_owned(), 4, 4)]);
    assert_eq!(layout(&backend, "GPU-2"), untouched);
    // The controller learns it from the agent's registration.
    eventually(
        "the controller to list the node without the instance",
        || {
            let mut c = c.clone();
            let uuid = uuid.clone();
            async move {
                let nodes = c
                    .list_nodes(pb::ListNodesRequest::default())
                    .await
                    .unwrap()
                    .into_inner()
                    .nodes;
                nodes.len() == 1
                    && nodes[0]
                        .info
                        .as_ref()
                        .is_some_and(|i| i.devices.iter().all(|d| d.uuid != uuid))
            }
        },
    )
    .await;

    // The layout changed behind the controller's back (slices 0-3 taken out of band): the
    // instance it orders is refused by the driver, and the session waits with the reason.
    let _ = backend.create_instance("GPU-1", "2g.35gb", 0).unwrap();
    let _ = backend.create_instance("GPU-1", "2g.35gb", 2).unwrap();
    let refused = create(&mut c, "u", &["cuda.mig.1g.18gb=1"]).await.unwrap();
    eventually("the refusal to reach the session", || {
        let mut c = c.clone();
        let id = refused.id.clone();
        async move {
            let s = session(&mut c, &id).await;
            s.state == SessionState::Pending as i32
                && s.reason.contains("refused to make a MIG instance")
                && s.reason.contains("the driver refused")
        }
    })
    .await;
    // Nothing was made: GPU-1 holds what the operator and the out-of-band calls put there.
    let gpu1 = layout(&backend, "GPU-1");
    assert_eq!(gpu1.len(), 3, "{gpu1:?}");
    assert!(gpu1.iter().all(|i| i.0 != "1g.18gb"), "{gpu1:?}");
    let _ = stop.send(());
    let _ = task.await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_two_instances_has_both_made_and_binds_to_both() {
    let state = scratch("mig-ondemand-two");
    let ctl = TestController::builder(state.path())
        .config(SchedulerConfig::default())
        .timing(fast_timing(Duration::from_secs(3)))
        .start();
    let backend = Arc::new(MockBackend::from_toml(DEVICES, Path::new("mock.toml")).unwrap());
    let before: Vec<String> = backend.devices().iter().map(|d| d.uuid.clone()).collect();
    let (stop, task) = start_agent(&ctl.url(), Arc::clone(&backend));
    let mut c = ctl.client().await;
    wait_nodes(&c, 1).await;

    // No 1g.18gb exists: two are made on GPU-1 (the agent registers after each) and the
    // session is bound to both.
    let s = create(&mut c, "u", &["cuda.mig.1g.18gb=2"]).await.unwrap();
    wait_state(&c, &s.id, SessionState::Running).await;
    let placed = session(&mut c, &s.id).await;
    let uuids: Vec<String> = placed.devices.iter().map(|d| d.uuid.clone()).collect();
    assert_eq!(uuids.len(), 2, "{placed:?}");
    assert!(uuids.iter().all(|u| !before.contains(u)), "{uuids:?}");
    // The mock's own account: two 1g.18gb instances of GPU-1, at two starts in slices 0-3.
    for uuid in &uuids {
        let d = backend
            .devices()
            .into_iter()
            .find(|d| d.uuid == *uuid)
            .expect("the session's device is on the node");
        let mig = d.mig.unwrap();
        assert_eq!(
            (mig.parent_uuid.as_str(), mig.profile.as_str()),
            ("GPU-1", "1g.18gb")
        );
    }
    let gpu1 = layout(&backend, "GPU-1");
    let ones: Vec<u32> = gpu1
        .iter()
        .filter(|i| i.0 == "1g.18gb")
        .map(|i| i.1)
        .collect();
    assert_eq!(ones.len(), 2, "{gpu1:?}");
    assert!(
        ones.iter().all(|s| *s < 4) && ones[0] != ones[1],
        "{gpu1:?}"
    );

    // Ended: both are destroyed, the operator's 3g stays.
    c.terminate_session(pb::TerminateSessionRequest { id: s.id.clone() })
        .await
        .unwrap();
    eventually("both made instances to be destroyed", || {
        let b = Arc::clone(&backend);
        async move { layout(&b, "GPU-1") == [("3g.71gb".to_owned(), 4, 4)] }
    })
    .await;
    let _ = stop.send(());
    let _ = task.await;
}
