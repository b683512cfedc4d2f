use std::collections::BTreeSet;

use super::*;
use crate::{
    allocator::{DeviceSpec, mig::MigProfilePlacements},
    node::NodeReport,
    scheduler::{NewSession, RequestError, SchedulerConfig},
    slots::{SlotKind, SlotName},
};

/// An H100's profiles as `nvidia-smi mig -lgipp` lists them (docs/mig.md): name, slices,
/// starts. Written out here, apart from the agent's table.
const H100: &[(&str, u32, &[u32])] = &[
    ("7g.80gb", 8, &[0]),
    ("4g.40gb", 4, &[0]),
    ("3g.40gb", 4, &[0, 4]),
    ("2g.20gb", 2, &[0, 2, 4]),
    ("1g.10gb", 1, &[0, 1, 2, 3, 4, 5, 6]),
];

/// A reconfigurable H100 `GPU-R` at index 1 holding `occupied`, as its agent reports it.
fn h100(occupied: &[(u32, u32)]) -> MigGpuLayout {
    MigGpuLayout {
        gpu_uuid: "GPU-R".into(),
        gpu_index: 1,
        slices: 8,
        occupied: occupied.to_vec(),
        profiles: H100
            .iter()
            .map(|&(profile, size, starts)| MigProfilePlacements {
                profile: profile.into(),
                size,
                starts: starts.to_vec(),
                free: starts
                    .iter()
                    .copied()
                    .filter(|&s| {
                        !occupied
                            .iter()
                            .any(|&(os, oz)| s < os + oz && os < s + size)
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// Node `n1`: GPU 0 whole, GPU 1 a reconfigurable H100 in MIG mode with `instances` (device
/// index, profile, start, size) on it, each a device of its own.
fn report(instances: &[(u32, &str, u32, u32)]) -> NodeReport {
    report_on("n1", instances)
}

/// [`report`] for node `id`.
fn report_on(id: &str, instances: &[(u32, &str, u32, u32)]) -> NodeReport {
    let mut node = NodeReport {
        capacity: ResourceSlot::parse_any(&["cpu=8", "mem=32g"]).unwrap(),
        agent_version: "test".into(),
        ..NodeReport::with_gpus(id, 1, 80 << 30, 1)
    };
    node.device_models = vec![("NVIDIA H100".into(), false)];
    for &(index, profile, _, _) in instances {
        node.devices.push(DeviceSpec {
            uuid: format!("MIG-{index}"),
            index,
            memory_bytes: 10 << 30,
            sm_count: 16,
            numa_node: 0,
            parent_uuid: "GPU-R".into(),
        });
        node.device_models
            .push((format!("NVIDIA H100 MIG {profile}"), true));
    }
    for &(profile, _, _) in H100 {
        let slot = names::mig_slot(profile);
        node.slot_types
            .push((SlotName::new(&slot).unwrap(), SlotKind::Count));
        let count = instances.iter().filter(|i| i.1 == profile).count();
        node.capacity.set(
            SlotName::new(&slot).unwrap(),
            crate::slots::SlotValue::from_int(u64::try_from(count).unwrap()),
        );
    }
    let occupied: Vec<(u32, u32)> = instances.iter().map(|i| (i.2, i.3)).collect();
    node.mig_layouts = vec![h100(&occupied)];
    node
}

fn create(s: &mut Scheduler, id: &str, tokens: &[&str]) {
    s.create(NewSession {
        id: id.into(),
        owner: id.into(),
        requested: ResourceSlot::parse_any(tokens).unwrap(),
        ..NewSession::default()
    })
    .unwrap();
}

fn makes(commands: &[Command]) -> Vec<(String, String, String, u32)> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::MakeMigInstance {
                session,
                gpu_uuid,
                profile,
                start,
                ..
            } => Some((session.clone(), gpu_uuid.clone(), profile.clone(), *start)),
            _ => None,
        })
        .collect()
}

/// The orders of `n` passes (FIFO: a waiting head holds the queue for a few passes).
fn passes(s: &mut Scheduler, n: usize) -> Vec<(String, String, String, u32)> {
    (0..n).flat_map(|_| makes(&s.pass())).collect()
}

fn overlaps(a: (u32, u32), b: (u32, u32)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

#[test]
fn a_profile_with_no_idle_instance_has_one_made_then_is_placed_on_it() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report(&[]), &[]).unwrap();
    // No 2g.20gb exists on the node: the request is still admitted, the node can make one.
    create(&mut s, "a", &["cuda.mig.2g.20gb=1"]);
    create(&mut s, "b", &["cuda.mig.2g.20gb=1"]);
    let first = passes(&mut s, 5);
    assert_eq!(first.len(), 2, "{first:?}");
    let size = 2;
    let (a, b) = (&first[0], &first[1]);
    assert_eq!(
        (a.0.as_str(), a.1.as_str(), a.2.as_str()),
        ("a", "GPU-R", "2g.20gb")
    );
    assert_eq!(b.0, "b");
    // Each start one the profile may take, and the two never share a slice.
    for m in &first {
        assert!([0, 2, 4].contains(&m.3), "{m:?}");
    }
    assert!(!overlaps((a.3, size), (b.3, size)), "{first:?}");
    for id in ["a", "b"] {
        assert_eq!(s.sessions()[id].state, SessionState::Pending);
        let reason = &s.sessions()[id].reason;
        assert!(
            reason.contains("n1") && reason.contains("2g.20gb instance"),
            "{reason}"
        );
    }
    // Asked once: later passes wait without asking again.
    assert!(passes(&mut s, 5).is_empty());
    assert!(s.sessions()["a"].reason.contains("waiting for node n1"));

    // The agent made a's instance (device 2) and registers again: a is placed on it.
    s.register(report(&[(2, "2g.20gb", a.3, size)]), &[])
        .unwrap();
    assert!(!s.mig_bookings().contains_key("a"));
    assert!(
        s.mig_bookings().contains_key("b"),
        "b's instance is not made yet"
    );
    s.pass();
    let placed = &s.sessions()["a"];
    assert_eq!(placed.state, SessionState::Scheduled);
    assert_eq!(
        placed
            .allocation
            .parts
            .iter()
            .map(|p| p.index)
            .collect::<Vec<_>>(),
        vec![2]
    );
}

#[test]
fn several_instances_are_made_for_what_the_idle_ones_lack_then_the_session_takes_them_all() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    // One idle 1g.10gb at slice 6 already.
    let idle = (2, "1g.10gb", 6, 1);
    s.register(report(&[idle]), &[]).unwrap();
    create(&mut s, "a", &["cuda.mig.1g.10gb=3"]);
    let ordered = passes(&mut s, 3);
    assert_eq!(ordered.len(), 2, "three asked, one idle: {ordered:?}");
    let starts: Vec<u32> = ordered.iter().map(|o| o.3).collect();
    assert!(
        starts[0] != starts[1] && !starts.contains(&6),
        "{ordered:?}"
    );
    for o in &ordered {
        assert_eq!(
            (o.0.as_str(), o.1.as_str(), o.2.as_str()),
            ("a", "GPU-R", "1g.10gb")
        );
    }
    let reason = &s.sessions()["a"].reason;
    assert!(reason.contains("2 1g.10gb instances"), "{reason}");

    // One made: the session still waits, and only the other is asked again.
    let one = (3, "1g.10gb", starts[0], 1);
    let again = makes(&s.register(report(&[idle, one]), &[]).unwrap());
    assert_eq!(again, vec![ordered[1].clone()]);
    s.pass();
    assert_eq!(s.sessions()["a"].state, SessionState::Pending);

    // Both made: the booking goes and the session takes the three.
    let two = (4, "1g.10gb", starts[1], 1);
    assert!(makes(&s.register(report(&[idle, one, two]), &[]).unwrap()).is_empty());
    assert!(!s.mig_bookings().contains_key("a"));
    s.pass();
    assert_eq!(s.sessions()["a"].state, SessionState::Scheduled);
    assert_eq!(bound_to(&s, "a"), [2, 3, 4]);
}

#[test]
fn a_request_for_more_instances_than_the_node_could_ever_hold_is_too_large() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    // An H100 holds seven 1g.10gb side by side; the one made already is among them.
    s.register(report(&[(2, "1g.10gb", 6, 1)]), &[]).unwrap();
    let ask = |n: u32| NewSession {
        id: format!("s{n}"),
        owner: "o".into(),
        requested: ResourceSlot::parse_any(&[&format!("cuda.mig.1g.10gb={n}")]).unwrap(),
        ..NewSession::default()
    };
    assert!(s.create(ask(7)).is_ok());
    let err = s.create(ask(8)).unwrap_err();
    assert!(matches!(err, RequestError::Oversized { .. }), "{err}");
}

#[test]
fn a_refusal_frees_the_slices_and_the_session_waits_with_the_reason() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report(&[]), &[]).unwrap();
    create(&mut s, "a", &["cuda.mig.4g.40gb=1"]);
    let made = makes(&s.pass());
    assert_eq!(made.len(), 1);
    assert_eq!(made[0].3, 0, "the 4g.40gb's only start");
    // A refusal for another reason, or from another node, is not this one.
    assert!(s.nack("n2", "a", REFUSED, "busy").is_empty());
    assert!(s.mig_bookings().contains_key("a"));
    assert!(
        s.nack("n1", "a", REFUSED, "a process is on GPU-R")
            .is_empty()
    );
    assert!(s.mig_bookings().is_empty());
    let a = &s.sessions()["a"];
    assert_eq!(a.state, SessionState::Pending);
    assert!(a.reason.contains("a process is on GPU-R"), "{}", a.reason);
    // That node is not asked again for it; another session may have the slices.
    assert!(passes(&mut s, 5).is_empty());
    assert_eq!(s.sessions()["a"].state, SessionState::Pending);
    let reason = &s.sessions()["a"].reason;
    assert!(
        reason.contains("a process is on GPU-R"),
        "the reason stays: {reason}"
    );
    create(&mut s, "b", &["cuda.mig.4g.40gb=1"]);
    let again = passes(&mut s, 5);
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].0.as_str(), again[0].3), ("b", 0));
}

#[test]
fn an_order_not_yet_answered_is_sent_again_when_the_node_registers() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report(&[]), &[]).unwrap();
    create(&mut s, "a", &["cuda.mig.1g.10gb=1"]);
    let made = makes(&s.pass());
    assert_eq!(made.len(), 1);
    let again = makes(&s.register(report(&[]), &[]).unwrap());
    assert_eq!(again, made);
}

#[test]
fn bookings_never_overlap_while_instances_are_being_made() {
    // Seven 1g requests and one 2g on one H100: every order given takes its own slices.
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report(&[]), &[]).unwrap();
    for i in 0..7 {
        create(&mut s, &format!("s{i}"), &["cuda.mig.1g.10gb=1"]);
    }
    create(&mut s, "big", &["cuda.mig.2g.20gb=1"]);
    let mut held: Vec<(u32, u32)> = Vec::new();
    for _ in 0..3 {
        for m in passes(&mut s, 10) {
            let size = if m.2 == "2g.20gb" { 2 } else { 1 };
            assert!(
                !held.iter().any(|&h| overlaps(h, (m.3, size))),
                "{m:?} over {held:?}"
            );
            held.push((m.3, size));
        }
    }
    // 7 slices can hold at most 7 slices' worth: what was asked fits in them.
    let taken: u32 = held.iter().map(|h| h.1).sum();
    assert!(taken <= 7, "{held:?}");
    assert!(!held.is_empty());
}

#[test]
fn an_order_to_a_node_that_went_away_is_given_to_another() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report_on("n1", &[]), &[]).unwrap();
    create(&mut s, "a", &["cuda.mig.3g.40gb=1"]);
    let first: Vec<String> = s
        .pass()
        .iter()
        .filter_map(|c| match c {
            Command::MakeMigInstance { node, .. } => Some(node.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(first, ["n1"]);
    // n1 stops sending heartbeats; n2 comes.
    let lost = s.expire(crate::session::now_ms() + 60_000, 1_000);
    assert_eq!(lost, ["n1"]);
    s.register(report_on("n2", &[]), &[]).unwrap();
    let mut asked = Vec::new();
    for _ in 0..5 {
        for c in s.pass() {
            if let Command::MakeMigInstance { node, session, .. } = c {
                asked.push((node, session));
            }
        }
    }
    assert_eq!(asked, [("n2".to_owned(), "a".to_owned())]);
    assert_eq!(s.mig_bookings()["a"].node, "n2");
}

/// The device indexes session `id` is bound to.
fn bound_to(s: &Scheduler, id: &str) -> Vec<u32> {
    s.sessions()[id]
        .allocation
        .parts
        .iter()
        .map(|p| p.index)
        .collect()
}

#[test]
fn an_instance_made_for_a_session_is_not_taken_by_another_of_its_profile() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report(&[]), &[]).unwrap();
    create(&mut s, "a", &["cuda.mig.2g.20gb=1"]);
    let for_a = passes(&mut s, 1);
    assert_eq!(for_a.len(), 1, "{for_a:?}");
    // b asks for the same profile later, ahead of a in the queue (a higher priority).
    s.create(NewSession {
        id: "b".into(),
        owner: "b".into(),
        requested: ResourceSlot::parse_any(&["cuda.mig.2g.20gb=1"]).unwrap(),
        priority: 10,
        ..NewSession::default()
    })
    .unwrap();
    let for_b = passes(&mut s, 1);
    assert_eq!(
        for_b.iter().map(|m| m.0.as_str()).collect::<Vec<_>>(),
        ["b"]
    );
    let (a_start, b_start) = (for_a[0].3, for_b[0].3);

    // a's instance is made first (device 2, at the start ordered for a); b's is not yet.
    s.register(report(&[(2, "2g.20gb", a_start, 2)]), &[])
        .unwrap();
    s.pass();
    assert_eq!(s.sessions()["a"].state, SessionState::Scheduled);
    assert_eq!(
        bound_to(&s, "a"),
        [2],
        "a is bound to the instance made for it"
    );
    assert_eq!(s.sessions()["b"].state, SessionState::Pending);
    assert!(s.mig_bookings().contains_key("b"));

    // b's instance comes (device 3): b is bound to it.
    s.register(
        report(&[(2, "2g.20gb", a_start, 2), (3, "2g.20gb", b_start, 2)]),
        &[],
    )
    .unwrap();
    s.pass();
    assert_eq!(bound_to(&s, "b"), [3]);
}

/// The bookings' index by node stays what a rebuild from the bookings by session gives, through
/// a long run of bookings made, taken back and pruned (on three nodes of two GPUs each).
#[test]
fn the_bookings_by_node_follow_every_change() {
    let mut b = Bookings::default();
    let mut seed = 7_u64;
    let mut next = |n: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) % n
    };
    for step in 0..2_000 {
        let session = format!("s{}", next(40));
        match next(10) {
            0..=5 => {
                // One to three instances on one node.
                let node = next(3);
                let placements = (0..=next(3))
                    .map(|_| {
                        let (gpu, start) = (next(2), next(7));
                        MigPlacement {
                            gpu_uuid: format!("GPU-{node}-{gpu}"),
                            gpu_index: u32::try_from(gpu).unwrap(),
                            profile: "1g.10gb".into(),
                            start: u32::try_from(start).unwrap(),
                            size: 1 + u32::from(start % 2 == 0),
                        }
                    })
                    .collect();
                b.insert(
                    session,
                    MigBooking {
                        node: format!("n{node}"),
                        placements,
                    },
                );
            }
            6..=8 => {
                b.remove(&session);
            }
            _ => {
                let cut = next(40);
                b.retain(|id, _| id[1..].parse::<u64>().unwrap() % 7 != cut % 7);
            }
        }
        // The index, against one rebuilt from the bookings by session alone.
        let mut want: BTreeMap<String, (Vec<MigPlacement>, BTreeMap<String, u64>)> =
            BTreeMap::new();
        for bk in b.by_session.values() {
            let (placements, slices) = want.entry(bk.node.clone()).or_default();
            for p in &bk.placements {
                placements.push(p.clone());
                *slices.entry(p.gpu_uuid.clone()).or_default() |=
                    1_u64.checked_shl(p.size).map_or(u64::MAX, |v| v - 1) << p.start;
            }
        }
        let got: BTreeMap<String, (Vec<MigPlacement>, BTreeMap<String, u64>)> = b
            .by_node
            .iter()
            .map(|(node, on)| (node.clone(), (on.placements.clone(), on.slices.clone())))
            .collect();
        let sorted = |m: BTreeMap<String, (Vec<MigPlacement>, BTreeMap<String, u64>)>| {
            m.into_iter()
                .map(|(k, (mut p, s))| {
                    p.sort_by_key(|p| (p.gpu_uuid.clone(), p.start, p.size));
                    (k, (p, s))
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(sorted(got), sorted(want), "after step {step}");
    }
}

/// The index of nodes by idle instance of each profile, which profile requests search, stays
/// what a rebuild from the nodes' allocators gives, through sessions placed and ended, nodes
/// registering again with instances made, and passes (on three nodes).
#[test]
fn the_nodes_by_idle_profile_follow_every_change() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    let layouts = |i: u64| -> Vec<(u32, &'static str, u32, u32)> {
        match i % 3 {
            0 => vec![(2, "1g.10gb", 0, 1), (3, "1g.10gb", 1, 1)],
            1 => vec![(2, "2g.20gb", 0, 2), (3, "1g.10gb", 2, 1)],
            _ => vec![],
        }
    };
    for n in 0..3 {
        s.register(report_on(&format!("n{n}"), &layouts(n)), &[])
            .unwrap();
    }
    let mut seed = 11_u64;
    let mut next = |n: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) % n
    };
    let mut created = 0;
    for step in 0..400 {
        match next(6) {
            0 | 1 => {
                let profile = ["1g.10gb", "2g.20gb"][usize::try_from(next(2)).unwrap()];
                created += 1;
                create(
                    &mut s,
                    &format!("s{created}"),
                    &[&format!("cuda.mig.{profile}=1")],
                );
            }
            2 => {
                let id = format!("s{}", 1 + next(created.max(1)));
                if next(2) == 0 {
                    s.terminate(&id);
                } else {
                    s.terminate_released(&id);
                }
            }
            3 => {
                let n = next(3);
                let _ = s.register(report_on(&format!("n{n}"), &layouts(n + next(3))), &[]);
            }
            _ => {
                s.pass();
            }
        }
        let mut want: BTreeMap<String, BTreeSet<(u128, String)>> = BTreeMap::new();
        for (id, n) in &s.nodes {
            let key = n.allocator.free().total.micros();
            for d in n.allocator.devices().iter().filter(|d| d.is_idle()) {
                if let Some(slot) = &d.profile {
                    want.entry(slot.clone())
                        .or_default()
                        .insert((key, id.clone()));
                }
            }
        }
        assert_eq!(s.with_idle, want, "after step {step}");
    }
}

fn create_member(s: &mut Scheduler, id: &str, gang: &str, size: u32, tokens: &[&str]) {
    s.create(NewSession {
        id: id.into(),
        owner: "team".into(),
        requested: ResourceSlot::parse_any(tokens).unwrap(),
        gang: Some(crate::session::Gang {
            name: gang.into(),
            size,
        }),
        ..NewSession::default()
    })
    .unwrap();
}

#[test]
fn a_gang_has_its_members_instances_made_then_is_placed_whole() {
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report(&[]), &[]).unwrap();
    create_member(&mut s, "m1", "g", 2, &["cuda.mig.2g.20gb=1"]);
    create_member(&mut s, "m2", "g", 2, &["cuda.mig.2g.20gb=1"]);
    let ordered = passes(&mut s, 3);
    assert_eq!(ordered.len(), 2, "one each, asked once: {ordered:?}");
    let sessions: BTreeSet<&str> = ordered.iter().map(|o| o.0.as_str()).collect();
    assert_eq!(sessions, BTreeSet::from(["m1", "m2"]));
    assert!(
        !overlaps((ordered[0].3, 2), (ordered[1].3, 2)),
        "{ordered:?}"
    );
    for id in ["m1", "m2"] {
        assert_eq!(s.sessions()[id].state, SessionState::Pending);
        let reason = &s.sessions()[id].reason;
        assert!(
            reason.contains("MIG instances being made for 2 of its members"),
            "{reason}"
        );
    }
    // One made: the gang still waits whole, and nothing more is asked for the member whose
    // instance is there.
    let first = (2, "2g.20gb", ordered[0].3, 2);
    s.register(report(&[first]), &[]).unwrap();
    assert_eq!(passes(&mut s, 3), []);
    assert!(
        ["m1", "m2"]
            .iter()
            .all(|id| s.sessions()[*id].state == SessionState::Pending)
    );
    // Both made: both placed, each on an instance of its own.
    let second = (3, "2g.20gb", ordered[1].3, 2);
    s.register(report(&[first, second]), &[]).unwrap();
    s.pass();
    let mut devices: Vec<u32> = ["m1", "m2"]
        .iter()
        .flat_map(|id| {
            assert_eq!(s.sessions()[*id].state, SessionState::Scheduled);
            bound_to(&s, id)
        })
        .collect();
    devices.sort_unstable();
    assert_eq!(devices, [2, 3]);
}

#[test]
fn a_gang_whose_instances_cannot_all_be_made_has_none_asked() {
    // An H100 holds two 3g.40gb (at slices 0 and 4): a gang of three asks nothing.
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report(&[]), &[]).unwrap();
    for m in ["m1", "m2", "m3"] {
        create_member(&mut s, m, "g", 3, &["cuda.mig.3g.40gb=1"]);
    }
    assert!(passes(&mut s, 3).is_empty());
    assert!(s.mig_bookings().is_empty());
    // One member fewer fits: two are asked.
    let mut s = Scheduler::new(SchedulerConfig::default());
    s.register(report(&[]), &[]).unwrap();
    for m in ["m1", "m2"] {
        create_member(&mut s, m, "g", 2, &["cuda.mig.3g.40gb=1"]);
    }
    let starts: BTreeSet<u32> = passes(&mut s, 3).iter().map(|o| o.3).collect();
    assert_eq!(starts, BTreeSet::from([0, 4]));
}
