//! Placement modes through the scheduler: learning profiles, the packing cap, explanations.

use super::*;
use crate::{
    node::NodeReport,
    placement::{Candidate, Weights},
    profile::UsageSample,
};

fn node(id: &str, gpus: u32) -> NodeReport {
    super::tests::report(id, gpus, &[])
}

fn cluster(mode: Placement, scoring: ScoringConfig, gpus: u32) -> Scheduler {
    let mut s = Scheduler::new(SchedulerConfig {
        strategy: mode,
        scoring,
        ..SchedulerConfig::default()
    });
    s.register(node("n1", gpus), &[]).unwrap();
    s
}

/// Creates `id` of `class` asking for `shares`, places it and marks it running.
fn start(s: &mut Scheduler, id: &str, class: &str, shares: &str) -> Session {
    s.create(NewSession {
        id: id.into(),
        owner: "u".into(),
        class: class.into(),
        requested: ResourceSlot::parse_any(&[&format!("cuda.shares={shares}")]).unwrap(),
        ..NewSession::default()
    })
    .unwrap();
    s.pass();
    let node = s.sessions()[id].node.clone().expect("placed");
    s.ack(&node, id);
    s.sessions()[id].clone()
}

/// Teaches `class` a steady utilization `u` with one finished run.
fn teach(s: &mut Scheduler, class: &str, u: f64) {
    let id = format!("teach-{class}");
    start(s, &id, class, "0.1");
    for _ in 0..5 {
        assert!(s.record_usage(
            "n1",
            &id,
            UsageSample {
                utilization: u,
                ..UsageSample::default()
            }
        ));
    }
    s.terminate_released(&id);
}

fn devices(s: &Session) -> Vec<u32> {
    s.allocation.parts.iter().map(|p| p.index).collect()
}

#[test]
fn a_finished_run_teaches_its_class_and_is_persisted() {
    let mut s = cluster(Placement::Binpack, ScoringConfig::default(), 1);
    start(&mut s, "a", "train", "0.5");
    s.take_changes();
    // Samples from another node, or for sessions not running, teach nothing.
    assert!(!s.record_usage("n2", "a", UsageSample::default()));
    assert!(!s.record_usage("n1", "nobody", UsageSample::default()));
    // Ten samples, one per decile band: the profile's points are exactly these.
    for u in [0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95] {
        assert!(s.record_usage(
            "n1",
            "a",
            UsageSample {
                utilization: u,
                memory_bytes: 1 << 30,
                ioctls_per_sec: 3.0
            }
        ));
    }
    // Samples are written with the session, without announcing it as changed.
    let changes = s.take_changes();
    assert!(changes.usage.contains("a") && !changes.sessions.contains("a"));
    s.terminate_released("a");
    // A user's class is filed within its owner: no tenant teaches another's placements.
    assert!(
        s.take_changes().profiles.contains("u/train"),
        "to be written"
    );
    let p = s.profiles().get("u/train").expect("learned");
    assert_eq!((p.runs, p.samples, p.peak_memory_bytes), (1, 10, 1 << 30));
    assert!((p.mean() - 0.5).abs() < 1e-9, "{p:?}");

    // A second run moves the profile halfway toward it.
    start(&mut s, "b", "train", "0.5");
    for _ in 0..10 {
        s.record_usage(
            "n1",
            "b",
            UsageSample {
                utilization: 0.1,
                ..UsageSample::default()
            },
        );
    }
    s.terminate_released("b");
    let p = s.profiles().get("u/train").expect("learned");
    assert_eq!(p.runs, 2);
    assert!((p.mean() - 0.3).abs() < 1e-9, "{p:?}");
    // A session's class defaults to its name.
    s.create(NewSession {
        id: "c".into(),
        name: "nightly".into(),
        owner: "u".into(),
        requested: ResourceSlot::parse_any(&["cuda.shares=0.1"]).unwrap(),
        ..NewSession::default()
    })
    .unwrap();
    assert_eq!(s.sessions()["c"].class, "u/nightly");
}

#[test]
fn interference_aware_keeps_busy_tenants_apart_where_binpack_stacks_them() {
    for (mode, same_device) in [
        (Placement::Binpack, true),
        (Placement::InterferenceAware, false),
    ] {
        let mut s = cluster(mode, ScoringConfig::default(), 2);
        teach(&mut s, "busy", 0.9);
        let a = start(&mut s, "a", "busy", "0.5");
        let b = start(&mut s, "b", "busy", "0.5");
        assert_eq!(devices(&a) == devices(&b), same_device, "{mode}");
    }
}

#[test]
fn interference_aware_packs_light_tenants_together() {
    let mut s = cluster(Placement::InterferenceAware, ScoringConfig::default(), 2);
    teach(&mut s, "light", 0.1);
    let a = start(&mut s, "a", "light", "0.25");
    let b = start(&mut s, "b", "light", "0.25");
    let c = start(&mut s, "c", "light", "0.25");
    // Light work shares a device: the other stays whole for a 1.0 request.
    assert_eq!(devices(&a), devices(&b));
    assert_eq!(devices(&b), devices(&c));
}

#[test]
#[expect(clippy::many_single_char_names, reason = "one letter per tenant")]
fn the_packing_cap_holds_unless_nothing_else_fits() {
    // Interference weighs nothing: only the cap keeps tenants apart, against the
    // fragmentation term that would stack them.
    let scoring = ScoringConfig {
        weights: Weights {
            interference: 0.0,
            ..Weights::default()
        },
        packing_cap: 0.7,
        ..ScoringConfig::default()
    };
    let mut s = cluster(Placement::InterferenceAware, scoring, 2);
    teach(&mut s, "mid", 0.4);
    let a = start(&mut s, "a", "mid", "0.25");
    // 0.4 + 0.4 > 0.7: not on a's device while the other has room.
    let b = start(&mut s, "b", "mid", "0.25");
    assert_ne!(devices(&a), devices(&b));
    let e = s.sessions()["b"].explanation.clone().expect("explained");
    assert!(!e.candidates[0].over_cap);
    assert!(e.candidates.iter().any(|c| c.over_cap), "{e:?}");
    // Both devices are past the cap now: it still goes somewhere, marked.
    let c = start(&mut s, "c", "mid", "0.25");
    assert_eq!(c.state, SessionState::Running);
    let e = s.sessions()["c"].explanation.clone().expect("explained");
    assert!(e.candidates.iter().all(|c| c.over_cap), "{e:?}");

    // With a cap of 1.0 the same b stacks on a's device (fragmentation prefers it).
    let mut s = cluster(
        Placement::InterferenceAware,
        ScoringConfig {
            packing_cap: 1.0,
            ..scoring
        },
        2,
    );
    teach(&mut s, "mid", 0.4);
    let a = start(&mut s, "a", "mid", "0.25");
    let b = start(&mut s, "b", "mid", "0.25");
    assert_eq!(devices(&a), devices(&b));
}

#[test]
fn explanations_match_the_chosen_placement() {
    for mode in Placement::ALL {
        let mut s = cluster(mode, ScoringConfig::default(), 4);
        teach(&mut s, "busy", 0.8);
        for (i, shares) in ["0.5", "0.25", "0.5", "1.2"].iter().enumerate() {
            let id = format!("s{i}");
            let session = start(&mut s, &id, "busy", shares);
            let e = session.explanation.as_ref().expect("explained");
            assert_eq!(e.mode, mode);
            let chosen: Vec<&Candidate> = e.candidates.iter().filter(|c| c.chosen).collect();
            assert_eq!(chosen.len(), 1, "{e:?}");
            assert_eq!(Some(&chosen[0].node), session.node.as_ref());
            assert_eq!(chosen[0].devices, devices(&session), "{mode} {id}");
            // Best first, and the chosen one is the best.
            assert!(e.candidates[0].chosen);
            let keys: Vec<(bool, f64)> =
                e.candidates.iter().map(|c| (c.over_cap, c.total)).collect();
            assert!(
                keys.windows(2).all(|w| w[0]
                    .0
                    .cmp(&w[1].0)
                    .then(w[0].1.total_cmp(&w[1].1))
                    .is_le()),
                "{keys:?}"
            );
            // Each total is its weighted terms.
            for c in &e.candidates {
                assert!((c.terms.total(&e.weights) - c.total).abs() < 1e-9);
            }
            assert!(e.considered as usize >= e.candidates.len());
        }
    }
}

#[test]
fn a_session_may_ask_for_its_own_mode() {
    let mut s = cluster(Placement::Binpack, ScoringConfig::default(), 2);
    teach(&mut s, "busy", 0.9);
    start(&mut s, "a", "busy", "0.5");
    s.create(NewSession {
        id: "b".into(),
        class: "busy".into(),
        placement: Some(Placement::InterferenceAware),
        requested: ResourceSlot::parse_any(&["cuda.shares=0.5"]).unwrap(),
        ..NewSession::default()
    })
    .unwrap();
    s.pass();
    let b = &s.sessions()["b"];
    assert_eq!(
        b.explanation.as_ref().map(|e| e.mode),
        Some(Placement::InterferenceAware)
    );
    assert_ne!(devices(b), devices(&s.sessions()["a"]));
}

#[test]
fn a_decision_scores_at_most_max_nodes_nodes_from_both_ends() {
    let mut s = Scheduler::new(SchedulerConfig {
        strategy: Placement::InterferenceAware,
        scoring: ScoringConfig {
            max_nodes: 2,
            ..ScoringConfig::default()
        },
        ..SchedulerConfig::default()
    });
    for i in 0..6 {
        s.register(node(&format!("n{i}"), 2), &[]).unwrap();
    }
    // n0 fuller than the rest: the fullest end of the index.
    s.create(NewSession {
        id: "x".into(),
        pinned_node: Some("n0".into()),
        requested: ResourceSlot::parse_any(&["cuda.shares=0.5"]).unwrap(),
        ..NewSession::default()
    })
    .unwrap();
    s.pass();
    s.create(NewSession {
        id: "y".into(),
        requested: ResourceSlot::parse_any(&["cuda.shares=0.25"]).unwrap(),
        ..NewSession::default()
    })
    .unwrap();
    s.pass();
    let e = s.sessions()["y"].explanation.clone().expect("explained");
    let nodes: BTreeSet<&str> = e.candidates.iter().map(|c| c.node.as_str()).collect();
    // One node from each end: n0 (fullest) and the emptiest (ties: the last id).
    assert_eq!(nodes, BTreeSet::from(["n0", "n5"]), "{e:?}");
    // n0: its shared GPU and one of its idle ones; n5: one idle GPU.
    assert_eq!(e.considered, 3, "{e:?}");
}
