//! Sessions observed but not placed: Kubernetes claims a node's agent prepared.

use super::{tests::report, *};
use crate::{
    allocator::{DevicePart, DeviceSpec, GpuRequest},
    node::NodeReport,
    profile::UsageSample,
    session::{KubernetesClaim, Origin},
    slots::SlotValue,
    store::Snapshot,
};

/// `n1` with two controller GPUs (0, 1) and two GPUs offered to Kubernetes (2, 3), 16 GiB each.
fn dra_node() -> NodeReport {
    let mut node = report("n1", 2, &[]);
    node.kubernetes_devices = (2..4)
        .map(|i| DeviceSpec {
            uuid: format!("n1-GPU-{i}"),
            index: i,
            memory_bytes: 16 << 30,
            sm_count: 132,
            numa_node: 0,
            parent_uuid: String::new(),
        })
        .collect();
    node
}

/// Claim `name` of namespace `ml` holding `shares` and `memory` of GPU `index`.
fn claim(name: &str, index: u32, shares: &str, memory: u64) -> Observed {
    Observed {
        id: format!("k8s-uid-{name}"),
        allocation: Allocation {
            parts: vec![DevicePart {
                index,
                uuid: format!("n1-GPU-{index}"),
                shares: shares.parse().unwrap(),
                memory_bytes: memory,
                exclusive: false,
            }],
        },
        target: Target::PodUid("0b7a4c56-2f3e-4d1a-9c8b-7e6f5a4b3c2d".into()),
        policy: QuotaPolicy::default(),
        claim: KubernetesClaim {
            namespace: "ml".into(),
            claim_name: format!("{name}-gpu"),
            claim_uid: format!("uid-{name}"),
            pod_name: format!("{name}-pod"),
            pod_uid: "0b7a4c56-2f3e-4d1a-9c8b-7e6f5a4b3c2d".into(),
        },
        class: "train".into(),
    }
}

fn allocated(s: &Scheduler, index: u32) -> String {
    s.nodes()["n1"]
        .allocator
        .devices()
        .iter()
        .find(|d| d.spec.index == index)
        .map(|d| d.allocated.to_string())
        .unwrap_or_default()
}

#[test]
fn an_observed_claim_runs_as_a_dra_session_and_fills_the_allocation_map() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(dra_node(), &[]).unwrap();
    s.observe("n1", claim("a", 2, "0.5", 1 << 30)).unwrap();
    let session = &s.sessions()["k8s-uid-a"];
    assert_eq!(session.state, SessionState::Running);
    assert_eq!(session.owner, "k8s:ml");
    // A pod's label is filed within its namespace.
    assert_eq!(session.class, "k8s:ml/train");
    assert_eq!(session.name, "a-pod");
    assert_eq!(session.node.as_deref(), Some("n1"));
    assert_eq!(session.origin.as_str(), "dra");
    assert_eq!(
        session.origin.claim().map(|c| c.claim_name.as_str()),
        Some("a-gpu")
    );
    assert_eq!(session.requested.get("cuda.shares").to_string(), "0.5");
    let map = s.nodes()["n1"].allocator.alloc_map();
    let gpu2 = map.iter().find(|d| d.index == 2).unwrap();
    assert_eq!(gpu2.shares.to_string(), "0.5");
    assert_eq!(gpu2.allocated_memory, 1 << 30);
    assert!(gpu2.kubernetes);
    assert!(
        s.nodes()["n1"].allocator.devices()[2]
            .sessions
            .contains("k8s-uid-a")
    );
    // The caps on sessions and the concurrency tracker don't count it.
    assert_eq!(s.live_sessions("k8s:ml"), (0, 0));
    // Reported again (a repeated prepare, a re-registration): nothing doubles.
    s.take_changes();
    s.observe("n1", claim("a", 2, "0.5", 1 << 30)).unwrap();
    assert_eq!(allocated(&s, 2), "0.5");
    assert!(s.take_changes().sessions.is_empty());
}

#[test]
fn kubernetes_gpus_are_no_capacity_of_the_controller() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(dra_node(), &[]).unwrap();
    s.observe("n1", claim("a", 2, "0.25", 0)).unwrap();
    let node = &s.nodes()["n1"];
    // Capacity and holdings are the two controller GPUs'.
    assert_eq!(node.capacity().get("cuda.shares").to_string(), "2");
    assert!(node.holding().get("cuda.shares").is_zero());
    // Three whole GPUs fit in no node now: the two Kubernetes GPUs don't count.
    let err = s
        .create(NewSession {
            id: "big".into(),
            owner: "u".into(),
            requested: ResourceSlot::parse_any(&["cuda.shares=3"]).unwrap(),
            ..NewSession::default()
        })
        .unwrap_err();
    assert!(matches!(err, RequestError::Oversized { .. }), "{err}");
}

#[test]
fn the_controller_never_places_a_session_on_a_kubernetes_gpu() {
    for strategy in [Placement::Binpack, Placement::Spread] {
        let mut s = Scheduler::new(SchedulerConfig {
            strategy,
            ..SchedulerConfig::default()
        });
        s.register(dra_node(), &[]).unwrap();
        // A Kubernetes GPU with room left, and one idle: packing would pick the first, spreading
        // the second, if either were the controller's.
        s.observe("n1", claim("a", 2, "0.5", 0)).unwrap();
        for (i, shares) in ["0.5", "0.5", "1", "0.5"].iter().enumerate() {
            s.create(NewSession {
                id: format!("c{i}"),
                owner: "u".into(),
                requested: ResourceSlot::parse_any(&[&format!("cuda.shares={shares}")]).unwrap(),
                ..NewSession::default()
            })
            .unwrap();
        }
        s.create(NewSession {
            id: "whole".into(),
            owner: "u".into(),
            requested: ResourceSlot::parse_any(&["cuda.device=1"]).unwrap(),
            ..NewSession::default()
        })
        .unwrap();
        for _ in 0..5 {
            s.pass();
        }
        for session in s.sessions().values() {
            if session.origin != Origin::Controller {
                continue;
            }
            for part in &session.allocation.parts {
                assert!(
                    part.index < 2,
                    "{strategy}: {} on GPU{}",
                    session.id,
                    part.index
                );
            }
        }
        // The controller's GPUs are full (0.5 + 0.5 + 1), the rest waits.
        assert_eq!(allocated(&s, 0), "1", "{strategy}");
        assert_eq!(allocated(&s, 1), "1", "{strategy}");
        assert_eq!(allocated(&s, 2), "0.5", "{strategy}");
        assert_eq!(allocated(&s, 3), "0", "{strategy}");
        assert_eq!(s.sessions()["whole"].state, SessionState::Pending);
        assert_eq!(s.sessions()["c3"].state, SessionState::Pending);
    }
}

#[test]
fn an_unprepared_claim_ends_its_session_and_teaches_its_class() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(dra_node(), &[]).unwrap();
    s.observe("n1", claim("a", 2, "0.5", 0)).unwrap();
    for _ in 0..5 {
        assert!(s.record_usage(
            "n1",
            "k8s-uid-a",
            UsageSample {
                utilization: 0.9,
                memory_bytes: 1 << 30,
                ioctls_per_sec: 10.0,
            }
        ));
    }
    // Another node can't end it.
    assert!(!s.observed_ended("n2", "k8s-uid-a"));
    assert!(s.observed_ended("n1", "k8s-uid-a"));
    let session = &s.sessions()["k8s-uid-a"];
    assert_eq!(session.state, SessionState::Terminated);
    assert_eq!(session.reason, "its claim was unprepared");
    assert_eq!(allocated(&s, 2), "0");
    assert!(s.nodes()["n1"].allocator.allocation("k8s-uid-a").is_none());
    let profile = s
        .profiles()
        .get("k8s:ml/train")
        .expect("a profile for its class");
    assert_eq!(profile.runs, 1);
    assert_eq!(profile.peak_memory_bytes, 1 << 30);
    // Ended twice: nothing more.
    assert!(!s.observed_ended("n1", "k8s-uid-a"));
    // Prepared again later: a new run of the same id.
    s.observe("n1", claim("a", 2, "0.5", 0)).unwrap();
    assert_eq!(s.sessions()["k8s-uid-a"].state, SessionState::Running);
    assert_eq!(allocated(&s, 2), "0.5");
}

#[test]
fn clients_cannot_end_an_observed_session_nor_agents_take_a_placed_one() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(dra_node(), &[]).unwrap();
    s.observe("n1", claim("a", 2, "0.5", 0)).unwrap();
    assert_eq!(s.terminate("k8s-uid-a"), None);
    assert_eq!(s.sessions()["k8s-uid-a"].state, SessionState::Running);
    assert_eq!(allocated(&s, 2), "0.5");
    // An agent's nack doesn't fail it either.
    let _ = s.nack("n1", "k8s-uid-a", "InvalidQuota", "no");
    assert_eq!(s.sessions()["k8s-uid-a"].state, SessionState::Running);

    s.create(NewSession {
        id: "mine".into(),
        owner: "u".into(),
        requested: ResourceSlot::parse_any(&["cuda.shares=0.5"]).unwrap(),
        ..NewSession::default()
    })
    .unwrap();
    s.pass();
    let mut taken = claim("x", 2, "0.5", 0);
    taken.id = "mine".into();
    assert_eq!(
        s.observe("n1", taken),
        Err(ObserveError::PlacedByController("mine".into()))
    );
    assert_eq!(s.sessions()["mine"].origin, Origin::Controller);
    // Held on n1: another node can't report it as its own.
    s.register(report("n2", 1, &[]), &[]).unwrap();
    assert!(matches!(
        s.observe("n2", claim("a", 0, "0.5", 0)),
        Err(ObserveError::OnAnotherNode { .. })
    ));
    assert!(matches!(
        s.observe("nx", claim("b", 2, "0.5", 0)),
        Err(ObserveError::UnknownNode(_))
    ));
}

#[test]
fn a_reregistration_rebuilds_observed_sessions_and_ends_the_missing() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(dra_node(), &[]).unwrap();
    s.observe("n1", claim("a", 2, "0.5", 0)).unwrap();
    s.observe("n1", claim("b", 3, "0.25", 0)).unwrap();
    // The agent comes back holding `a` and a claim prepared while it was away; `b` was
    // unprepared meanwhile. Its controller sessions don't end for it either.
    let (commands, refused) = s
        .register_observing(
            dra_node(),
            &[],
            vec![claim("a", 2, "0.5", 0), claim("c", 3, "0.3", 0)],
        )
        .unwrap();
    assert!(commands.is_empty(), "{commands:?}");
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(s.sessions()["k8s-uid-a"].state, SessionState::Running);
    assert_eq!(s.sessions()["k8s-uid-b"].state, SessionState::Terminated);
    assert_eq!(
        s.sessions()["k8s-uid-b"].reason,
        "its node no longer holds its claim"
    );
    assert_eq!(s.sessions()["k8s-uid-c"].state, SessionState::Running);
    assert_eq!(allocated(&s, 2), "0.5");
    assert_eq!(allocated(&s, 3), "0.3");
}

#[test]
fn a_restarted_controller_gets_observed_sessions_back_from_the_agent() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(dra_node(), &[]).unwrap();
    s.observe("n1", claim("a", 2, "0.5", 0)).unwrap();
    // What the store holds, read back as a restarted controller does.
    let stored = Snapshot {
        registry: s.registry().clone(),
        nodes: s.nodes().values().cloned().collect(),
        sessions: s.sessions().values().cloned().collect(),
        profiles: Vec::new(),
        revisions: crate::store::RevisionMark::default(),
        quotas: None,
    };
    let json = serde_json::to_vec(&stored.sessions).unwrap();
    let sessions: Vec<Session> = serde_json::from_slice(&json).unwrap();
    assert_eq!(
        sessions, stored.sessions,
        "sessions round-trip the store's JSON"
    );
    let mut restarted = Scheduler::restore(SchedulerConfig::default(), stored);
    assert_eq!(restarted.live_sessions("k8s:ml"), (0, 0));
    assert_eq!(
        restarted.sessions()["k8s-uid-a"].origin.as_str(),
        "dra",
        "its origin is kept"
    );
    // The agent registers again, still holding the claim.
    restarted
        .register_observing(dra_node(), &[], vec![claim("a", 2, "0.5", 0)])
        .unwrap();
    assert_eq!(
        restarted.sessions()["k8s-uid-a"].state,
        SessionState::Running
    );
    assert_eq!(allocated(&restarted, 2), "0.5");
    let gpu2 = &restarted.nodes()["n1"].allocator.devices()[2];
    assert!(gpu2.kubernetes && gpu2.sessions.contains("k8s-uid-a"));
    assert_eq!(gpu2.free(), SlotValue::ZERO);
}

#[test]
fn the_extender_judges_a_pod_on_the_gpus_offered_to_kubernetes() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(dra_node(), &[]).unwrap();
    // A node without GPUs for Kubernetes is judged on its own, as before.
    s.register(report("plain", 1, &[]), &[]).unwrap();
    let half = GpuRequest::shares("0.5".parse().unwrap());
    let nodes = ["n1".to_owned(), "plain".to_owned()];
    let fits = |s: &Scheduler| -> Vec<bool> {
        s.fit_nodes("train", &half, &nodes)
            .into_iter()
            .map(|f| matches!(f, NodeFit::Fits(_)))
            .collect()
    };
    assert_eq!(fits(&s), [true, true]);
    // The controller's GPUs full: a pod still fits on Kubernetes' GPUs.
    s.create(NewSession {
        id: "c".into(),
        owner: "u".into(),
        requested: ResourceSlot::parse_any(&["cuda.shares=2"]).unwrap(),
        pinned_node: Some("n1".into()),
        ..NewSession::default()
    })
    .unwrap();
    s.pass();
    assert_eq!(s.sessions()["c"].state, SessionState::Scheduled);
    assert_eq!(fits(&s), [true, true]);
    // Kubernetes' GPUs holding claims of 0.75 and 0.8: half a GPU fits nowhere there.
    s.observe("n1", claim("a", 2, "0.75", 0)).unwrap();
    s.observe("n1", claim("b", 3, "0.8", 0)).unwrap();
    assert_eq!(fits(&s), [false, true]);
    // The view changes nothing of the controller's own state.
    assert_eq!(allocated(&s, 0), "1");
    assert!(s.nodes()["n1"].allocator.devices()[2].kubernetes);
    assert_eq!(s.nodes()["n1"].allocator.free().total, SlotValue::ZERO);
}

#[test]
fn a_pod_fits_only_where_one_kubernetes_gpu_holds_it() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(dra_node(), &[]).unwrap();
    s.observe("n1", claim("a", 2, "0.6", 0)).unwrap();
    s.observe("n1", claim("b", 3, "0.6", 0)).unwrap();
    let fits = |shares: &str| {
        let request = GpuRequest::shares(shares.parse().unwrap());
        matches!(
            s.fit_nodes("train", &request, &["n1".to_owned()])[0],
            NodeFit::Fits(_)
        )
    };
    // 0.4 free on each: 0.4 fits on one; 0.5 would take both, and DRA gives a claim one device.
    assert!(fits("0.4"));
    assert!(!fits("0.5"));
}

#[test]
fn a_node_reports_no_more_claims_than_it_offers_to_kubernetes() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(dra_node(), &[]).unwrap();
    s.observe("n1", claim("a", 2, "0.75", 1 << 30)).unwrap();
    // Over the GPU's shares or memory with what is there, on a GPU kept for the controller, or
    // holding nothing (a way to report claims without end): refused, nothing booked.
    for (c, words) in [
        (
            claim("b", 2, "0.5", 1 << 30),
            "would hold 1.25 of its 1 shares",
        ),
        (claim("c", 3, "0.1", 17 << 30), "of its 17179869184 bytes"),
        (claim("d", 0, "0.1", 0), "not offered to Kubernetes"),
        (claim("e", 3, "0", 0), "holds nothing"),
    ] {
        let err = s.observe("n1", c).expect_err(words).to_string();
        assert!(err.contains(words), "{err}");
    }
    assert_eq!(allocated(&s, 2), "0.75");
    assert_eq!(allocated(&s, 3), "0");
    assert!(!s.sessions().contains_key("k8s-uid-b"));
    // Growing within what is free, and reporting the same claim again, are fine.
    s.observe("n1", claim("a", 2, "1", 1 << 30)).unwrap();
    s.observe("n1", claim("a", 2, "1", 1 << 30)).unwrap();
    assert_eq!(allocated(&s, 2), "1");
}

#[test]
fn a_users_class_teaches_only_its_owner_unless_an_admin_shares_it() {
    let mut config = SchedulerConfig {
        shared_classes: vec!["inference".into()],
        ..SchedulerConfig::default()
    };
    assert_eq!(
        config.filed_class("mallory", "train".into(), false),
        "mallory/train"
    );
    assert_eq!(config.filed_class("ops", "train".into(), true), "train");
    assert_eq!(
        config.filed_class("mallory", "inference".into(), false),
        "inference"
    );
    config.shared_classes.clear();
    let mut s = Scheduler::new(config);
    s.register(report("n1", 1, &[]), &[]).unwrap();
    s.create(NewSession {
        id: "m".into(),
        owner: "mallory".into(),
        class: "train".into(),
        requested: ResourceSlot::parse_any(&["cuda.shares=0.5"]).unwrap(),
        ..NewSession::default()
    })
    .unwrap();
    assert_eq!(s.sessions()["m"].class, "mallory/train");
}
