//! The bounds' own tests.

use gpuwarden_proto::v1::{self as pb, agent_message::Msg};
use gpuwarden_runtime::sync::Lock as _;

use super::{bounds::CLIENT_BUCKETS, *};

#[test]
fn every_reason_has_its_own_counter() {
    for (i, reason) in Refusal::ALL.into_iter().enumerate() {
        assert_eq!(reason as usize, i, "{reason:?} is out of order in ALL");
    }
}

#[test]
fn a_refusal_is_counted_by_the_bounds_that_refused_it() {
    let (a, b) = (
        Bounds::new(Limits::default()),
        Bounds::new(Limits::default()),
    );
    let e = a.limits.id("id", &"x".repeat(a.limits.max_id_len + 1));
    let status = a.refuse(&e.expect_err("too long"));
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    a.count(Refusal::Cap);
    assert_eq!(a.refusals().count_of(Refusal::Oversized), 1);
    assert_eq!(a.refusals().count_of(Refusal::Cap), 1);
    assert_eq!(a.refusals().count_of(Refusal::Rate), 0);
    assert!(
        Refusal::ALL
            .into_iter()
            .all(|r| b.refusals().count_of(r) == 0),
        "other bounds counted it"
    );
}

#[test]
fn watch_guards_free_their_place() {
    let bounds = Bounds::new(Limits {
        max_watches_per_caller: 2,
        max_watches: 3,
        ..Limits::default()
    });
    let a1 = bounds.open_watch("a").expect("first");
    let _a2 = bounds.open_watch("a").expect("second");
    let e = bounds.open_watch("a").expect_err("third of a");
    assert!(e.to_string().contains("max_watches_per_caller"), "{e}");
    let _b1 = bounds.open_watch("b").expect("b's first");
    let e = bounds.open_watch("c").expect_err("over the total");
    assert!(e.to_string().contains("limits.max_watches)"), "{e}");
    drop(a1);
    assert_eq!(bounds.open_watches(), 2);
    bounds.open_watch("c").expect("a place was freed");
}

#[test]
fn a_bucket_allows_its_burst_then_refuses() {
    let mut bucket = Bucket::agent_stream(&Limits {
        agent_messages_per_sec: 0,
        agent_message_burst: 3,
        ..Limits::default()
    });
    assert!((0..3).all(|_| bucket.take()));
    assert!(!bucket.take());
}

#[test]
fn each_client_has_its_own_rate_and_idle_ones_are_forgotten() {
    let bounds = Bounds::new(Limits {
        client_requests_per_sec: 0,
        client_request_burst: 2,
        ..Limits::default()
    });
    assert!(bounds.admit_call("a").is_ok() && bounds.admit_call("a").is_ok());
    let e = bounds.admit_call("a").expect_err("a's third call");
    assert_eq!(e.reason(), Refusal::Rate);
    assert_eq!(e.to_status().code(), tonic::Code::ResourceExhausted);
    assert!(
        e.to_string().contains("limits.client_requests_per_sec"),
        "{e}"
    );
    bounds.admit_call("b").expect("b has its own bucket");
    // Thousands of clients that call once and never again do not grow the map without end:
    // refilled at once here, their buckets are full, and full ones are forgotten.
    let bounds = Bounds::new(Limits {
        client_requests_per_sec: u32::MAX,
        ..Limits::default()
    });
    for i in 0..2 * CLIENT_BUCKETS {
        bounds
            .admit_call(&format!("client-{i}"))
            .expect("a first call");
    }
    let kept = bounds.clients.locked().len();
    assert!(kept <= CLIENT_BUCKETS, "{kept} buckets kept");
}

#[test]
fn observed_sessions_are_bounded_field_by_field() {
    let limits = Limits::default();
    let long = "x".repeat(limits.max_id_len + 1);
    let observed = |claim: pb::KubernetesClaim, devices: usize| pb::ObservedSession {
        session_id: "k8s-a".into(),
        devices: vec![pb::DeviceShare::default(); devices],
        claim: Some(claim),
        ..Default::default()
    };
    let ok = observed(pb::KubernetesClaim::default(), 1);
    let message = |o: pb::ObservedSession| pb::AgentMessage {
        msg: Some(Msg::Observed(o)),
    };
    assert_eq!(limits.agent_message(&message(ok.clone())), Ok(()));
    let e = limits
        .agent_message(&message(observed(
            pb::KubernetesClaim {
                pod_name: long.clone(),
                ..Default::default()
            },
            1,
        )))
        .expect_err("refused");
    assert!(e.to_string().starts_with("observed.claim.pod_name:"), "{e}");
    let e = limits
        .agent_message(&message(observed(
            pb::KubernetesClaim::default(),
            limits.max_devices_per_node + 1,
        )))
        .expect_err("refused");
    assert!(e.to_string().starts_with("observed.devices:"), "{e}");
    // At registration: each one named by its place; the node's two GPU lists share a bound.
    let node = |observed: Vec<pb::ObservedSession>, gpus: usize| pb::NodeInfo {
        node_id: "n1".into(),
        devices: vec![pb::Device::default(); gpus],
        kubernetes_devices: vec![pb::Device::default(); gpus],
        observed_sessions: observed,
        ..Default::default()
    };
    assert_eq!(limits.node(&node(vec![ok.clone()], 32)), Ok(()));
    let e = limits.node(&node(vec![], 33)).expect_err("refused");
    assert!(e.to_string().starts_with("devices: 66 entries"), "{e}");
    let mut bad = ok;
    bad.session_id = long;
    let e = limits
        .node(&node(vec![pb::ObservedSession::default(), bad], 1))
        .expect_err("refused");
    assert!(
        e.to_string()
            .starts_with("observed_sessions[1].session_id:"),
        "{e}"
    );
}

#[test]
fn floats_out_of_range_name_their_field() {
    let limits = Limits::default();
    for bad in [f64::NAN, f64::INFINITY, -0.5] {
        let m = pb::AgentMessage {
            msg: Some(Msg::Usage(pb::SessionUsage {
                session_id: "s".into(),
                utilization: bad,
                ..Default::default()
            })),
        };
        let e = limits.agent_message(&m).expect_err("refused");
        assert!(e.to_string().starts_with("usage.utilization"), "{e}");
    }
}

#[test]
fn limits_parse_from_toml_with_defaults() {
    let l: Limits = toml::from_str("max_sessions_per_owner = 5").expect("parses");
    assert_eq!(l.max_sessions_per_owner, 5);
    assert_eq!(l.max_watches, Limits::default().max_watches);
    assert!(toml::from_str::<Limits>("max_everything = 1").is_err());
}

#[test]
fn a_gang_is_bounded_by_the_sessions_an_owner_may_have() {
    let limits = Limits {
        max_sessions_per_owner: 8,
        ..Limits::default()
    };
    let request = |name: &str, size| pb::CreateSessionRequest {
        gang: Some(pb::Gang {
            name: name.into(),
            size,
        }),
        ..Default::default()
    };
    assert!(limits.create(&request("train", 8)).is_ok());
    let e = limits.create(&request("train", 9)).expect_err("refused");
    assert!(
        matches!(&e, LimitError::TooLarge { field, key: "max_sessions_per_owner", .. } if field == "gang.size"),
        "{e}"
    );
    assert_eq!(e.to_status().code(), tonic::Code::InvalidArgument);
    let e = limits
        .create(&request(&"g".repeat(limits.max_name_len + 1), 2))
        .expect_err("refused");
    assert!(e.to_string().starts_with("gang.name"), "{e}");
}

#[test]
fn a_registrations_mig_instance_names_its_gpu_within_the_id_bound() {
    let limits = Limits::default();
    let node = |parent: String| pb::NodeInfo {
        node_id: "n1".into(),
        devices: vec![pb::Device {
            uuid: "MIG-1".into(),
            is_mig: true,
            parent_uuid: parent,
            ..Default::default()
        }],
        ..Default::default()
    };
    assert_eq!(limits.node(&node("GPU-1".into())), Ok(()));
    let e = limits
        .node(&node("G".repeat(limits.max_id_len + 1)))
        .expect_err("refused");
    assert!(e.to_string().starts_with("devices[0].parent_uuid"), "{e}");
}

#[test]
fn a_registrations_mig_layouts_are_bounded() {
    let limits = Limits::default();
    let layout = |profiles: usize, free: usize| pb::MigLayout {
        gpu_uuid: "GPU-1".into(),
        slices: 8,
        profiles: vec![
            pb::MigProfilePlacements {
                profile: "1g.18gb".into(),
                free: vec![0; free],
                ..Default::default()
            };
            profiles
        ],
        ..Default::default()
    };
    let node = |layouts: Vec<pb::MigLayout>| pb::NodeInfo {
        node_id: "n1".into(),
        mig_layouts: layouts,
        ..Default::default()
    };
    assert_eq!(limits.node(&node(vec![layout(7, 7)])), Ok(()));
    let e = limits
        .node(&node(vec![layout(1, limits.max_list_len + 1)]))
        .expect_err("refused");
    assert!(
        e.to_string()
            .starts_with("mig_layouts[0].profiles[0].free:"),
        "{e}"
    );
    let e = limits
        .node(&node(vec![layout(1, 1); limits.max_devices_per_node + 1]))
        .expect_err("refused");
    assert!(e.to_string().starts_with("mig_layouts:"), "{e}");
}
