use super::*;

fn gpus() -> Vec<GpuDevice> {
    (0..2)
        .map(|i| GpuDevice {
            mig: None,
            uuid: format!("GPU-{i}"),
            model: "Mock".into(),
            memory_bytes: 16 << 30,
            numa_node: 0,
            sm_count: 0,
            is_mig: false,
            index: i,
            device_node: format!("/dev/nvidia{i}"),
        })
        .collect()
}

fn allocate(parts: &[(u32, &str, u64)], memory: &str, compute: &str) -> pb::Allocate {
    pb::Allocate {
        session_id: "s-1".into(),
        devices: parts
            .iter()
            .map(|(index, shares, memory_bytes)| pb::DeviceShare {
                index: *index,
                shares: (*shares).to_owned(),
                memory_bytes: *memory_bytes,
                ..Default::default()
            })
            .collect(),
        target: Some(pb::Target {
            kind: Some(pb::target::Kind::CgroupPath("/a/b".into())),
        }),
        policy: Some(pb::QuotaPolicy {
            memory: memory.into(),
            compute: compute.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn shares_alone_limit_memory_to_that_fraction_of_the_device() {
    let spec = QuotaSpec::from_allocate(&allocate(&[(1, "0.25", 0)], "", ""), &gpus())
        .unwrap()
        .unwrap();
    assert_eq!(spec.devices[0].memory_bytes, 4 << 30);
    assert_eq!(spec.devices[0].shares_ppm, 250_000);
    assert_eq!(spec.memory_policy, MemoryPolicy::Kill);
    assert_eq!(spec.compute_policy, ComputePolicy::Hard);
    assert_eq!(spec.target, Target::CgroupPath("/a/b".into()));
}

#[test]
fn an_explicit_memory_limit_wins_and_multi_gpu_parts_are_kept_per_card() {
    let spec = QuotaSpec::from_allocate(
        &allocate(
            &[(1, "0.6", 3 << 30), (0, "0.6", 3 << 30)],
            "stop",
            "work-conserving",
        ),
        &gpus(),
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        spec.devices.iter().map(|d| d.index).collect::<Vec<_>>(),
        [0, 1]
    );
    assert_eq!(spec.memory_bytes(), 6 << 30);
    assert!((spec.shares() - 1.2).abs() < 1e-9);
    assert_eq!(spec.memory_policy, MemoryPolicy::Stop);
    assert_eq!(spec.compute_policy, ComputePolicy::WorkConserving);
}

#[test]
fn bad_quotas_are_refused_with_their_reason() {
    let refuse = |a: pb::Allocate| {
        QuotaSpec::from_allocate(&a, &gpus())
            .unwrap_err()
            .to_string()
    };
    assert!(refuse(allocate(&[(0, "1.5", 0)], "", "")).contains("more than one whole"));
    // A zero share with no memory limit leaves nothing to enforce.
    assert!(refuse(allocate(&[(0, "0", 0)], "", "")).contains("0 bytes"));
    assert!(refuse(allocate(&[(0, "-0.5", 0)], "", "")).contains("negative"));
    assert!(refuse(allocate(&[(0, "half", 0)], "", "")).contains("\"half\""));
    assert!(refuse(allocate(&[(0, "0.5", 0)], "freeze", "")).contains("\"freeze\""));
    assert!(refuse(allocate(&[(0, "0.5", 0)], "", "soft")).contains("\"soft\""));
    assert!(refuse(allocate(&[(7, "0.5", 0)], "", "")).contains("no such GPU"));
    assert!(refuse(allocate(&[(0, "0.5", 0), (0, "0.2", 0)], "", "")).contains("twice"));
    let mut tiny = gpus();
    tiny[0].memory_bytes = 1;
    let err = QuotaSpec::from_allocate(&allocate(&[(0, "0.5", 0)], "", ""), &tiny).unwrap_err();
    assert_eq!(err, QuotaError::ZeroMemory { index: 0 });
    let mut a = allocate(&[(0, "0.5", 0)], "", "");
    a.target = Some(pb::Target {
        kind: Some(pb::target::Kind::CgroupPath("../etc".into())),
    });
    assert!(refuse(a).contains("absolute"));
}

#[test]
fn memory_alone_limits_memory_and_leaves_compute_alone() {
    let spec = QuotaSpec::from_allocate(&allocate(&[(0, "0", 2 << 30)], "", ""), &gpus())
        .unwrap()
        .unwrap();
    assert_eq!(spec.devices[0].memory_bytes, 2 << 30);
    assert_eq!(spec.devices[0].shares_ppm, 0);
}

#[test]
fn an_allocation_without_a_target_is_only_booked() {
    let mut a = allocate(&[(0, "0.5", 0)], "", "");
    a.target = None;
    assert_eq!(QuotaSpec::from_allocate(&a, &gpus()), Ok(None));
}

#[test]
fn shares_parse_exactly() {
    assert_eq!(parse_share(0, "1"), Ok(PPM));
    assert_eq!(parse_share(0, ".25"), Ok(250_000));
    assert_eq!(parse_share(0, "0.000001"), Ok(1));
    assert_eq!(parse_share(0, "0.3000000"), Ok(300_000));
    assert!(parse_share(0, "0.0000001").is_err());
    assert!(parse_share(0, ".").is_err());
}
