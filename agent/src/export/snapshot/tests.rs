use std::{collections::BTreeMap, time::Duration};

use gpuwarden_agent_api::Record;
use gpuwarden_agent_common::maps::Quota;
use gpuwarden_types::{
    policy::{ComputePolicy, MemoryPolicy},
    target::Target,
};

use super::*;
use crate::{
    attribution::parse_cgroup_path,
    enforcement::throttle::ThrottleStats,
    enforcement::{BindState, quota::DeviceQuota, quota::QuotaSpec},
};

const GIB: u64 = 1 << 30;

/// A binding of `session` on `devices` (index, shares in ppm, memory), with cgroup `member`.
fn binding(session: &str, devices: &[(u32, u32, u64)], member: u64) -> BindingReport {
    BindingReport {
        session_id: session.to_owned(),
        spec: QuotaSpec {
            session_id: session.to_owned(),
            target: Target::CgroupPath(format!("/{session}")),
            scope: gpuwarden_types::target::TargetScope::admin(true),
            memory_policy: MemoryPolicy::Stop,
            compute_policy: ComputePolicy::Hard,
            devices: devices
                .iter()
                .map(|&(index, shares_ppm, memory_bytes)| DeviceQuota {
                    index,
                    shares_ppm,
                    memory_bytes,
                    mig: None,
                })
                .collect(),
        },
        state: BindState::Bound,
        dir: None,
        cgroup_path: Some(format!("/{session}")),
        key: Some(member),
        members: [member].into(),
        kernel: None,
        throttle: None,
        driver_tier: None,
    }
}

fn throttled(running_fraction: f64) -> ThrottleStats {
    ThrottleStats {
        throttled: Duration::from_millis(1500),
        frozen: true,
        running_fraction,
        gpu_time: Duration::from_millis(2500),
        balance: Some(-0.02),
    }
}

fn record(session: &str, action: &str) -> Record {
    Record {
        session_id: session.to_owned(),
        action: action.into(),
        reason: "test".to_owned(),
        cgroup_path: format!("/{session}"),
        pid: 7,
        device: Some(0),
        requested_bytes: 0,
        used_bytes: 0,
        limit_bytes: 0,
        at_ms: 0,
    }
}

#[test]
fn measured_utilization_is_reported_as_nvml_and_a_missing_gpu_as_unknown() {
    let measured = BTreeMap::from([(0, 0.25)]);
    let gpus = gpu_utilization(
        &[0, 1],
        &DeviceNames::default(),
        Some(&measured),
        &Standing::default(),
    );
    assert_eq!(gpus.len(), 2);
    assert_eq!(
        (
            gpus[0].device.as_str(),
            gpus[0].utilization,
            gpus[0].source.as_str()
        ),
        ("nvidia0", Some(0.25), "nvml")
    );
    assert_eq!(
        (gpus[1].device.as_str(), gpus[1].utilization),
        ("nvidia1", None)
    );
}

#[test]
fn without_nvml_a_gpu_is_as_busy_as_its_throttled_members_clamped_to_one() {
    let mut a = binding("a", &[(0, 600_000, GIB)], 10);
    a.throttle = Some(throttled(0.5));
    let mut b = binding("b", &[(0, 300_000, GIB), (1, 300_000, GIB)], 11);
    b.throttle = Some(throttled(0.75));
    // A memory-only part has no compute share: its activity is not the GPU's.
    let mut memory_only = binding("m", &[(1, 0, GIB)], 12);
    memory_only.throttle = Some(throttled(0.9));
    let standing = Standing {
        bindings: vec![a, b, memory_only],
        history: vec![],
        suppressed_events: 0,
        ..Standing::default()
    };
    let gpus = gpu_utilization(&[0, 1, 2], &DeviceNames::default(), None, &standing);
    let busy: Vec<_> = gpus.iter().map(|g| g.utilization).collect();
    assert_eq!(busy, [Some(1.0), Some(0.75), Some(0.0)]);
    assert!(gpus.iter().all(|g| g.source == "throttle_stand_in"));
}

#[test]
fn a_member_cgroup_carries_its_quota_enforcement_and_only_its_sessions_events() {
    let mut b = binding("s1", &[(1, 500_000, 2 * GIB)], 42);
    let mut kernel = Quota {
        actions: 3,
        denied_opens: 2,
        ..Quota::default()
    };
    kernel.used[1] = GIB;
    b.kernel = Some(kernel);
    b.throttle = Some(throttled(0.4));
    let standing = Standing {
        bindings: vec![b],
        history: vec![
            record("s1", "stop"),
            record("s2", "kill"),
            record("s1", "bound"),
        ],
        suppressed_events: 0,
        ..Standing::default()
    };
    let workload = parse_cgroup_path("/system.slice/job.service");
    let totals = CgroupCounters {
        pids: vec![7],
        devices: BTreeMap::from([(1, (BTreeMap::from([("alloc".to_owned(), 5)]), GIB))]),
        system_bytes: 3,
        managed_bytes: 5,
        tables: gpuwarden_agent_common::maps::TableUse {
            used: [4, 1, 2, 3, 7, 8],
            refused: [0, 0, 1, 0, 0, 2],
        },
    };
    let mut c = container(42, Some(&workload), totals, &DeviceNames::default());
    assert_eq!((c.system_memory_bytes, c.managed_memory_bytes), (3, 5));
    let clients = c.tables.iter().find(|t| t.table == "clients").unwrap();
    assert_eq!((clients.used, clients.refused), (2, 1));
    assert_eq!(clients.budget, 32_768 / 8);
    let mappings = c
        .tables
        .iter()
        .find(|t| t.table == "managed_mappings")
        .unwrap();
    assert_eq!(
        (mappings.used, mappings.refused, mappings.budget),
        (8, 2, 65_536 / 8)
    );
    add_quota(&mut c, &standing, "tracepoint", &DeviceNames::default());

    assert_eq!(c.cgroup_path, "/system.slice/job.service");
    assert_eq!(c.devices[0].device, "nvidia1");
    assert_eq!(c.devices[0].memory_bytes, GIB);
    assert_eq!(c.session_id.as_deref(), Some("s1"));
    let quota = c.quota.expect("a member has the quota");
    assert_eq!((quota.memory_bytes, quota.shares), (2 * GIB, 0.5));
    assert_eq!(quota.policy, "stop");
    assert_eq!(quota.devices[0].used_bytes, GIB);
    let enforcement = c.enforcement.expect("and its enforcement");
    assert_eq!(enforcement.tier, "tracepoint");
    assert_eq!((enforcement.actions, enforcement.denied_opens), (3, 2));
    assert_eq!(enforcement.throttled_ms, 1500);
    assert_eq!(enforcement.gpu_time_ms, 2500);
    assert_eq!(enforcement.ledger_ms, Some(-20));
    assert!(enforcement.frozen);
    let actions: Vec<_> = c.events.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(actions, ["stop", "bound"]);
}

#[test]
fn a_cgroup_outside_every_binding_has_no_quota_and_a_vanished_one_says_so() {
    let standing = Standing {
        bindings: vec![binding("s1", &[(0, 500_000, GIB)], 42)],
        history: vec![record("s1", "stop")],
        suppressed_events: 0,
        ..Standing::default()
    };
    let mut c = container(99, None, CgroupCounters::default(), &DeviceNames::default());
    add_quota(&mut c, &standing, "tracepoint", &DeviceNames::default());
    assert_eq!(c.runtime, "unknown");
    assert_eq!(c.cgroup_path, "<cgroup 99 not found>");
    assert!(c.session_id.is_none() && c.quota.is_none() && c.enforcement.is_none());
    assert!(c.events.is_empty());
}

/// A MIG instance's index: the GPU the list gives under the name `names` gives it.
fn instance(index: u32, gpu_instance: u32) -> crate::devices::GpuDevice {
    crate::devices::mig::test_instance(index, gpu_instance, 0, "1g.18gb")
}

#[test]
fn a_mig_instance_is_reported_under_the_name_it_is_given() {
    let names = DeviceNames::new(&[instance(5, 9)]);
    let gpus = gpu_utilization(&[0, 5], &names, None, &Standing::default());
    let devices: Vec<_> = gpus.iter().map(|g| g.device.as_str()).collect();
    assert_eq!(devices, ["nvidia0", "nvidia1/gi9"]);

    let standing = Standing {
        bindings: vec![binding("s1", &[(5, 0, GIB)], 42)],
        ..Standing::default()
    };
    let totals = CgroupCounters {
        devices: BTreeMap::from([(5, (BTreeMap::new(), GIB))]),
        ..CgroupCounters::default()
    };
    let mut c = container(42, None, totals, &names);
    add_quota(&mut c, &standing, "tracepoint", &names);
    assert_eq!(c.devices[0].device, "nvidia1/gi9");
    assert_eq!(c.quota.unwrap().devices[0].device, "nvidia1/gi9");
}

#[test]
fn each_gpu_carries_the_kernel_sides_memory_and_the_drivers_beside_it() {
    // GPU 0 whole; instance 5 (GPU 1's GPU instance 9); instance 6 (GI 10), which the driver
    // does not answer for.
    let names = DeviceNames::new(&[instance(5, 9), instance(6, 10)]);
    let mut snapshot = Snapshot {
        gpus: gpu_utilization(&[0, 5, 6], &names, None, &Standing::default()),
        ..Snapshot::default()
    };
    let held = |id, on: &[(u32, u64)]| {
        let totals = CgroupCounters {
            devices: on
                .iter()
                .map(|&(index, bytes)| (index, (BTreeMap::new(), bytes)))
                .collect(),
            ..CgroupCounters::default()
        };
        container(id, None, totals, &names)
    };
    // Two containers on the instance, one of them on GPU 0 as well.
    snapshot.containers = vec![held(1, &[(5, 3 * GIB), (0, GIB)]), held(2, &[(5, GIB)])];
    let driver = BTreeMap::from([
        (
            0,
            DriverMemory {
                used: 2 * GIB,
                reserved: GIB / 2,
            },
        ),
        (
            5,
            DriverMemory {
                used: 5 * GIB,
                reserved: 0,
            },
        ),
    ]);
    add_memory(&mut snapshot, &driver, &names);
    let by_name = |name: &str| {
        let g = snapshot.gpus.iter().find(|g| g.device == name).unwrap();
        (
            g.memory_bytes,
            g.driver_memory_bytes,
            g.driver_reserved_bytes,
        )
    };
    assert_eq!(by_name("nvidia0"), (GIB, Some(2 * GIB), Some(GIB / 2)));
    assert_eq!(by_name("nvidia1/gi9"), (4 * GIB, Some(5 * GIB), Some(0)));
    assert_eq!(by_name("nvidia1/gi10"), (0, None, None));
}
