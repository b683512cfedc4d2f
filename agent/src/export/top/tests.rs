use std::collections::BTreeMap;

use super::*;
use gpuwarden_agent_api::{
    BindingView, Container, DeviceQuotaView, DeviceUsage, EnforcementView, QuotaView, Stats,
};

#[test]
fn a_pod_shows_by_name_where_the_kubelet_named_it() {
    let pod = |name: Option<&str>| Snapshot {
        containers: vec![Container {
            pod_uid: Some("0f1e2d3c-0000-4000-8000-000000000001".into()),
            pod_name: name.map(Into::into),
            pod_namespace: name.map(|_| "ml".into()),
            cgroup_path: "/kubepods.slice/x".into(),
            ..Container::default()
        }],
        ..Snapshot::default()
    };
    assert!(render(&pod(Some("trainer-7"))).contains(" ml/trainer-7 "));
    let unnamed = render(&pod(None));
    assert!(
        unnamed.contains(" 0f1e2d3c-0000-4000-8000-000000000001 "),
        "{unnamed}"
    );
}

#[test]
fn renders_one_row_per_device_with_totals() {
    let snapshot = Snapshot {
        node: "n1".into(),
        tier: Some("syscall_tracepoint".into()),
        hooks: vec![],
        probes: vec![],
        containers: vec![Container {
            container_id: Some("a".repeat(64)),
            runtime: "docker".into(),
            pod_uid: None,
            pod_name: None,
            pod_namespace: None,
            qos: None,
            cgroup_path: "/system.slice/docker-x.scope".into(),
            cgroup_id: 7,
            pids: vec![10, 11],
            devices: vec![
                DeviceUsage {
                    device: "nvidia0".into(),
                    ioctls: BTreeMap::from([("rm_alloc".into(), 3), ("rm_free".into(), 1)]),
                    memory_bytes: 64 << 20,
                },
                DeviceUsage {
                    device: "nvidiactl".into(),
                    ioctls: BTreeMap::from([("rm_control".into(), 5)]),
                    memory_bytes: 0,
                },
            ],
            system_memory_bytes: 0,
            managed_memory_bytes: 0,
            session_id: Some("s-1".into()),
            quota: None,
            enforcement: Some(EnforcementView {
                tier: "tracepoint_signal".into(),
                actions: 2,
                denied_opens: 0,
                throttled_ms: 700,
                frozen: false,
                achieved: Some(0.31),
                deviation: None,
                gpu_time_ms: 0,
                ledger_ms: None,
            }),
            xid_errors: BTreeMap::new(),
            events: vec![],
            tables: vec![],
        }],
        stats: Stats::default(),
        memory_tier: Some("tracepoint_signal".into()),
        memory_tier_reason: None,
        bindings: vec![BindingView {
            session_id: "s-1".into(),
            target: "container aaaaaaaaaaaa".into(),
            state: "bound".into(),
            cgroup_path: Some("/system.slice/docker-x.scope".into()),
            quota: QuotaView {
                memory_bytes: 1 << 30,
                shares: 0.5,
                policy: "kill".into(),
                compute_policy: "hard".into(),
                devices: vec![DeviceQuotaView {
                    device: "nvidia0".into(),
                    memory_bytes: 1 << 30,
                    used_bytes: 64 << 20,
                    shares: 0.5,
                }],
            },
        }],
        gpus: vec![],
        kubelet: None,
        accuracy: vec![],
        throttle_mode: None,
        throttle_signals: vec![],
    };
    let table = render(&snapshot);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 8, "{table}");
    assert!(lines[5].contains("tracepoint_signal"), "{table}");
    assert!(
        lines[7].starts_with("s-1 ")
            && lines[7].contains("64.0 MiB / 1.0 GiB")
            && lines[7].contains("0.50     0.31 kill")
            && lines[7].contains("700ms"),
        "{table}"
    );
    assert!(lines[2].starts_with("aaaaaaaaaaaa "), "{table}");
    assert!(
        lines[2].contains("64.0 MiB") && lines[2].contains("rm_alloc=3"),
        "{table}"
    );
    assert!(
        lines[3].contains("nvidiactl") && lines[3].contains("rm_control=5"),
        "{table}"
    );
}

#[test]
fn a_frame_clears_the_screen_only_on_a_terminal() {
    let snapshot = Snapshot::default();
    let piped = frame(&snapshot, false);
    assert!(!piped.contains('\x1b'), "{piped:?}");
    assert_eq!(piped, render(&snapshot));
    assert!(frame(&snapshot, true).starts_with("\x1b[2J\x1b[H"));
}
