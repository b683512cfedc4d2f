//! `gpuwarden-agent top` and the human form of `snapshot`: the snapshot as a table.

use std::fmt::Write as _;

use gpuwarden_agent_api::Snapshot;
use gpuwarden_types::units::human_bytes;

/// One frame of `top`: on a terminal the screen is cleared and the cursor homed first; elsewhere
/// (a pipe, a file) the table alone.
#[must_use]
pub fn frame(snapshot: &Snapshot, terminal: bool) -> String {
    let table = render(snapshot);
    if terminal {
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
        "{:<22} {:<8} {:<36} {:>21} {:>6} {:>8} {:<7} {:>7} {:>11}",
        "SESSION",
        "STATE",
        "TARGET / CGROUP",
        "GPU MEMORY",
        "SHARES",
        "ACHIEVED",
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
            "{:<22} {:<8} {:<36} {:>21} {:>6.2} {:>8} {:<7} {:>7} {:>9}ms",
            truncate(&b.session_id, 22),
            b.state,
            truncate(b.cgroup_path.as_deref().unwrap_or(&b.target), 36),
            format!(
                "{} / {}",
                human_bytes(used),
                human_bytes(b.quota.memory_bytes)
            ),
            b.quota.shares,
            // Entitled against achieved: the throttle's measure of what it got recently.
            enforcement
                .and_then(|e| e.achieved)
                .map_or_else(|| "-".to_owned(), |a| format!("{a:.2}")),
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
mod tests;
