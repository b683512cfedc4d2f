//! The wire conversions: fixed cases, and arbitrary messages (what a hostile client or agent can
//! send) pushed through the bounds, the conversion and the scheduler, which must refuse or
//! accept them without panicking, and keep what they accept exactly.
//! `PROPTEST_CASES=100000 cargo test -p gpuwarden-controller convert::` searches longer.

use proptest::prelude::*;

use super::*;
use crate::{
    limits::Limits,
    scheduler::{Scheduler, SchedulerConfig},
    session::{ComputePolicy, MemoryPolicy, Target},
};

#[test]
fn targets_and_policies_round_trip_and_bad_policies_are_invalid_arguments() {
    for t in [
        Target::None,
        Target::ContainerId("abc".into()),
        Target::PodUid("123e4567-e89b-12d3-a456-426614174000".into()),
        Target::CgroupPath("/a/b".into()),
        Target::Managed,
    ] {
        assert_eq!(target_from_pb(target_to_pb(&t).as_ref()), t);
    }
    let policy = QuotaPolicy {
        memory: MemoryPolicy::Stop,
        compute: ComputePolicy::WorkConserving,
    };
    assert_eq!(
        policy_from_pb(Some(&policy_to_pb(policy))).ok(),
        Some(policy)
    );
    assert_eq!(policy_from_pb(None).ok(), Some(QuotaPolicy::default()));
    let bad = policy_from_pb(Some(&pb::QuotaPolicy {
        memory: "evict".into(),
        compute: String::new(),
        ..Default::default()
    }))
    .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert!(bad.message().contains("kill, stop, report"), "{bad:?}");
}

/// Text a client might send: what users type, edge cases of the fixed point and of lengths,
/// and arbitrary unicode.
#[test]
fn a_registrations_mig_layouts_are_kept_and_listed_as_sent() {
    let layout = pb::MigLayout {
        gpu_uuid: "GPU-1".into(),
        gpu_index: 1,
        slices: 8,
        occupied: vec![pb::MigPlacement { start: 4, size: 4 }],
        profiles: vec![pb::MigProfilePlacements {
            profile: "2g.35gb".into(),
            size: 2,
            starts: vec![0, 2, 4],
            free: vec![0, 2],
        }],
    };
    let info = pb::NodeInfo {
        node_id: "n1".into(),
        mig_layouts: vec![layout.clone()],
        ..pb::NodeInfo::default()
    };
    let report = report_from_pb(&info).unwrap();
    assert_eq!(report.mig_layouts.len(), 1);
    assert_eq!(report.mig_layouts[0].occupied, [(4, 4)]);
    assert_eq!(report_to_pb(&report).mig_layouts, [layout]);
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "",
            "cuda.shares",
            "cuda.device",
            "cuda.mem",
            "mem",
            "cpu",
            "0",
            "0.5",
            "1",
            "2g",
            "1.5Gi",
            "-1",
            "NaN",
            "inf",
            "1e3",
            "0.0000000000000000001",
            "18446744073709551616",
            "kill",
            "stop",
            "report",
            "hard",
            "work-conserving",
            "binpack",
            "spread",
            "interference-aware",
            "n1",
            "/dev/nvidia0",
            "..",
            "a/b",
        ])
        .prop_map(str::to_owned),
        ".{0,24}",
        "[a-z.]{1,8}",
        "[0-9.]{1,30}",
        // Longer than every bound.
        "x{60,300}",
    ]
}

/// Mostly one of `valid`, sometimes anything: so that most cases get past the first check and
/// reach the ones after it.
fn mostly(valid: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(valid).prop_map(str::to_owned),
        1 => text(),
    ]
}

fn slots() -> impl Strategy<Value = Option<pb::ResourceSlot>> {
    let name = mostly(&["cuda.shares", "cuda.shares", "cuda.mem", "mem", "cpu"]);
    let value = mostly(&["0", "0.1", "0.5", "1", "1.2", "3", "2g", "512m"]);
    proptest::option::weighted(
        0.9,
        proptest::collection::hash_map(name, value, 1..4)
            .prop_map(|values| pb::ResourceSlot { values }),
    )
}

fn target() -> impl Strategy<Value = Option<pb::Target>> {
    use pb::target::Kind;
    proptest::option::of(
        proptest::option::of(prop_oneof![
            mostly(&["0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"])
                .prop_map(Kind::ContainerId),
            mostly(&["123e4567-e89b-12d3-a456-426614174000"]).prop_map(Kind::PodUid),
            text().prop_map(Kind::CgroupPath),
            any::<bool>().prop_map(Kind::Managed),
        ])
        .prop_map(|kind| pb::Target { kind }),
    )
}

prop_compose! {
    fn create_request()(
        requested in slots(),
        owner in mostly(&["", "alice", "bob"]),
        name in mostly(&["", "train", "job-1"]),
        node_id in mostly(&["", "", "n1"]),
        class in mostly(&["", "train", "infer"]),
        placement in mostly(&["", "", "binpack", "spread", "interference-aware"]),
        priority in any::<i32>(),
        target in target(),
        unconfined_target in any::<bool>(),
        policy in proptest::option::of((
            mostly(&["", "kill", "stop", "report"]),
            mostly(&["", "hard", "work-conserving"]),
        )),
    ) -> pb::CreateSessionRequest {
        pb::CreateSessionRequest {
            requested,
            owner,
            name,
            node_id,
            class,
            placement,
            priority,
            target,
            policy: policy.map(|(memory, compute)| pb::QuotaPolicy { memory, compute, ..Default::default() }),
            unconfined_target,
            no_preempt: false,
            preemption: String::new(),
            gang: None,
            run_caller: None,
            request_id: String::new(),
            placement_mode: 0,
        }
    }
}

prop_compose! {
    fn device()(
        uuid in mostly(&["GPU-0", "GPU-1"]),
        model in mostly(&["H100"]),
        memory_bytes in prop_oneof![Just(0u64), Just(80u64 << 30), any::<u64>()],
        numa_node in any::<i32>(),
        sm_count in any::<u32>(),
        is_mig in any::<bool>(),
        index in prop_oneof![0u32..8, any::<u32>()],
        device_node in text(),
        parent_uuid in mostly(&["", "GPU-0"]),
    ) -> pb::Device {
        pb::Device { uuid, model, memory_bytes, numa_node, sm_count, is_mig, index, device_node, parent_uuid }
    }
}

prop_compose! {
    fn node_info()(
        node_id in mostly(&["n1", "node-2"]),
        hostname in mostly(&["n1", "node-2"]),
        // Unknown enum values among them.
        slot_types in proptest::collection::vec(
            prop_oneof![
                4 => prop::sample::select(&[
                    ("cuda.shares", 1),
                    ("cuda.device", 1),
                    ("cuda.mem", 2),
                    ("mem", 2),
                ][..])
                .prop_map(|(name, kind)| (name.to_owned(), kind)),
                1 => (text(), -2i32..6),
            ],
            0..6,
        ),
        capacity in slots(),
        devices in proptest::collection::vec(device(), 0..6),
        hooks in proptest::collection::vec(text(), 0..3),
        agent_version in mostly(&["0.1.0"]),
        running_sessions in proptest::collection::vec(text(), 0..3),
        kubernetes_devices in proptest::collection::vec(device(), 0..3),
    ) -> pb::NodeInfo {
        pb::NodeInfo {
            node_id,
            hostname,
            slot_types: slot_types
                .into_iter()
                .map(|(name, kind)| pb::SlotType { name, kind })
                .collect(),
            capacity,
            devices,
            hooks,
            agent_version,
            running_sessions,
            kubernetes_devices,
            observed_sessions: vec![],
            mig_layouts: vec![],
        }
    }
}

proptest! {
    #[test]
    fn any_create_request_is_refused_with_a_reason_or_created_as_sent(r in create_request()) {
        let limits = Limits::default();
        let sent = r.clone();
        let refused = match limits.create(&r) {
            Err(e) => Some(e.to_status()),
            Ok(()) => new_session_from_pb("s-1".into(), r.owner.clone(), r).err(),
        };
        if let Some(status) = refused {
            prop_assert!(
                matches!(status.code(), tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted),
                "{status:?}"
            );
            prop_assert!(!status.message().is_empty());
            return Ok(());
        }
        let new = new_session_from_pb("s-1".into(), sent.owner.clone(), sent.clone())
            .expect("accepted above");
        prop_assert!(new.requested.len() <= limits.max_slots_per_request);
        // What was accepted is kept exactly: every slot reads back as it was parsed.
        prop_assert_eq!(slots_from_pb(Some(&slots_to_pb(&new.requested))).ok(), Some(new.requested.clone()));
        // The scheduler takes it or says why; it never panics on it.
        let mut scheduler = Scheduler::new(SchedulerConfig::default());
        scheduler
            .register(NodeReport::with_gpus("n1", 2, 80 << 30, 2), &[])
            .expect("a valid node");
        if let Ok(created) = scheduler.create(new) {
            let wire = session_to_pb(&created);
            prop_assert_eq!(wire.name, if sent.name.is_empty() { created.id.clone() } else { sent.name });
            prop_assert_eq!(policy_from_pb(wire.policy.as_ref()).ok(), Some(created.policy));
            prop_assert_eq!(target_from_pb(wire.target.as_ref()), created.target);
        }
    }

    #[test]
    fn any_node_report_is_refused_with_a_reason_or_registered_as_sent(info in node_info()) {
        let limits = Limits::default();
        let report = match limits.node(&info).map_err(|e| e.to_status()).and_then(|()| report_from_pb(&info)) {
            Err(status) => {
                prop_assert_eq!(status.code(), tonic::Code::InvalidArgument, "{:?}", status);
                prop_assert!(!status.message().is_empty());
                return Ok(());
            }
            Ok(report) => report,
        };
        prop_assert!(report.devices.iter().all(|d| d.memory_bytes <= limits.max_device_memory_bytes));
        // The report round-trips through its message.
        prop_assert_eq!(report_from_pb(&report_to_pb(&report)).ok(), Some(report.clone()));
        let mut scheduler = Scheduler::new(SchedulerConfig::default());
        if scheduler.register(report.clone(), &info.running_sessions).is_ok() {
            prop_assert!(scheduler.nodes().contains_key(&report.node_id));
        }
    }

    #[test]
    fn any_device_share_list_is_refused_or_kept_exactly(
        parts in proptest::collection::vec(
            (text(), any::<u32>(), mostly(&["0.5", "1", "0.25"]), any::<u64>(), any::<bool>()),
            0..6,
        )
    ) {
        let parts: Vec<_> = parts
            .into_iter()
            .map(|(uuid, index, shares, memory_bytes, exclusive)| pb::DeviceShare { uuid, index, shares, memory_bytes, exclusive })
            .collect();
        match parts_from_pb(&parts) {
            Err(status) => prop_assert_eq!(status.code(), tonic::Code::InvalidArgument),
            Ok(allocation) => prop_assert_eq!(parts_from_pb(&parts_to_pb(&allocation)).ok(), Some(allocation)),
        }
    }
}
