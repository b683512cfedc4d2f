//! `gpuwarden-agent top` and the human form of `snapshot`: the snapshot as a table.

use std::fmt::Write as _;

use gpuwarden_agent_api::snapshot::Snapshot;
use gpuwarden_types::units::human_bytes;

/// Whether `top` redraws in place: only on a terminal, and not with `--once`. Piped into a file
/// or a pager it prints one frame, with no screen-clearing escapes.
#[must_use]
pub const fn is_live(once: bool, stdout_is_terminal: bool) -> bool {
    stdout_is_terminal && !once
}

/// One frame of `top`: the table, after clearing the screen and homing the cursor when `live`.
#[must_use]
pub fn frame(snapshot: &Snapshot, live: bool) -> String {
    let table = render(snapshot);
    if live {
        format!("\x1b[2J\x1b[H{table}")
    } else {
        table
    }
}

/// The snapshot as a table: one row per container and device.
#[must_use]
pub fn render(snapshot: &Snapshot) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "node {}  tier {}  GPU ioctls {}  events {}  dropped {}",
        snapshot.node,
        snapshot.tier.as_deref().unwrap_or("none"),
        snapshot.stats.gpu_ioctls,
        snapshot.stats.events_received,
        snapshot.stats.ringbuf_drops,
    );
    let _ = writeln!(
        out,
        "{:<14} {:<10} {:<36} {:<16} {:<14} {:>8} {:>12}  TOP IOCTLS",
        "CONTAINER", "RUNTIME", "POD / CGROUP", "PIDS", "DEVICE", "IOCTLS", "MEMORY"
    );
    for c in &snapshot.containers {
        let id = c
            .container_id
            .as_deref()
            .map_or("-", |id| &id[..id.len().min(12)]);
        // The pod's name from the kubelet where known, else its UID, else the cgroup.
        let named = c
            .pod_name
            .as_deref()
            .map(|name| match c.pod_namespace.as_deref() {
                Some(ns) => format!("{ns}/{name}"),
                None => name.to_owned(),
            });
        let place = named
            .as_deref()
            .or(c.pod_uid.as_deref())
            .unwrap_or(&c.cgroup_path);
        let pids = c
            .pids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let rows = if c.devices.is_empty() {
            1
        } else {
            c.devices.len()
        };
        for i in 0..rows {
            let (device, total, memory, top) = c.devices.get(i).map_or_else(
                || ("-".to_owned(), 0, 0, String::new()),
                |d| {
                    let mut classes: Vec<_> = d.ioctls.iter().collect();
                    classes.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
                    let top = classes
                        .iter()
                        .take(3)
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(" ");
                    (
                        d.device.clone(),
                        d.ioctls.values().sum(),
                        d.memory_bytes,
                        top,
                    )
                },
            );
            let (id, runtime, place, pids) = if i == 0 {
                (
                    id,
                    c.runtime.as_str(),
                    truncate(place, 36),
                    truncate(&pids, 16),
                )
            } else {
                ("", "", String::new(), String::new())
            };
            let _ = writeln!(
                out,
                "{id:<14} {runtime:<10} {place:<36} {pids:<16} {device:<14} {total:>8} {:>12}  {top}",
                human_bytes(memory)
            );
        }
    }
    if snapshot.containers.is_empty() {
        let _ = writeln!(out, "(no GPU processes seen)");
    }
    render_quotas(&mut out, snapshot);
    out
}

/// The quotas: one row per session, then each bound container's latest actions.
fn render_quotas(out: &mut String, snapshot: &Snapshot) {
    if snapshot.bindings.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nquotas (memory tier {})",
        snapshot.memory_tier.as_deref().unwrap_or("none")
    );
    let _ = writeln!(
        out,
        "{:<22} {:<8} {:<36} {:>21} {:>6} {:<7} {:>7} {:>11}",
        "SESSION",
        "STATE",
        "TARGET / CGROUP",
        "GPU MEMORY",
        "SHARES",
        "POLICY",
        "ACTIONS",
        "THROTTLED"
    );
    for b in &snapshot.bindings {
        let used: u64 = b.quota.devices.iter().map(|d| d.used_bytes).sum();
        let container = snapshot
            .containers
            .iter()
            .find(|c| c.session_id.as_deref() == Some(b.session_id.as_str()));
        let enforcement = container.and_then(|c| c.enforcement.as_ref());
        let _ = writeln!(
            out,
            "{:<22} {:<8} {:<36} {:>21} {:>6.2} {:<7} {:>7} {:>9}ms",
            truncate(&b.session_id, 22),
            b.state,
            truncate(b.cgroup_path.as_deref().unwrap_or(&b.target), 36),
            format!(
                "{} / {}",
                human_bytes(used),
                human_bytes(b.quota.memory_bytes)
            ),
            b.quota.shares,
            b.quota.policy,
            enforcement.map_or(0, |e| e.actions),
            enforcement.map_or(0, |e| e.throttled_ms),
        );
        if let Some(last) = container.and_then(|c| c.events.last()) {
            let _ = writeln!(
                out,
                "  last: {} pid {}: {}",
                last.action, last.pid, last.reason
            );
        }
    }
}

fn truncate(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_owned()
    } else {
        let tail: String = s
            .chars()
            .rev()
            .take(width - 1)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!("…{tail}")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_a_terminal_without_once_redraws_in_place() {
        assert!(is_live(false, true));
        assert!(!is_live(true, true));
        assert!(!is_live(false, false));
        let snapshot = Snapshot::default();
        assert!(frame(&snapshot, true).starts_with("\x1b[2J\x1b[H"));
        let plain = frame(&snapshot, false);
        assert!(!plain.contains('\x1b'), "{plain:?}");
        assert_eq!(plain, render(&snapshot));
    }

    use std::collections::BTreeMap;

    use super::*;
    use gpuwarden_agent_api::snapshot::{
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
                session_id: Some("s-1".into()),
                quota: None,
                enforcement: Some(EnforcementView {
                    tier: "tracepoint_signal".into(),
                    actions: 2,
                    denied_opens: 0,
                    throttled_ms: 700,
                    frozen: false,
                }),
                events: vec![],
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
        };
        let table = render(&snapshot);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 8, "{table}");
        assert!(lines[5].contains("tracepoint_signal"), "{table}");
        assert!(
            lines[7].starts_with("s-1 ")
                && lines[7].contains("64.0 MiB / 1.0 GiB")
                && lines[7].contains("0.50 kill")
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
}
