//! Human tables.

use std::fmt::Write as _;

use gpuwarden_proto::{convert, v1 as pb};
use gpuwarden_types::{
    slot::{SlotKind, SlotValue, format_value, names},
    units::{fit, human_bytes},
};

use crate::wire::{kind, mean, node_state, state};

fn slots(s: Option<&pb::ResourceSlot>) -> String {
    let mut pairs: Vec<String> = s
        .map(|s| s.values.iter().map(|(k, v)| format!("{k}={v}")).collect())
        .unwrap_or_default();
    pairs.sort();
    pairs.join(",")
}

/// A request as typed: `cuda.mem=4g,cuda.shares=0.5` (byte slots in their shortest exact
/// spelling, which `-r` takes back), sorted by name.
fn typed(s: Option<&pb::ResourceSlot>) -> String {
    let mut pairs: Vec<(&String, String)> = s
        .map(|s| {
            s.values
                .iter()
                .map(|(k, v)| {
                    let v = v
                        .parse::<SlotValue>()
                        .map_or_else(|_| v.clone(), |value| format_value(k, value));
                    (k, v)
                })
                .collect()
        })
        .unwrap_or_default();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Columns padded to their widest cell (counted in characters), two spaces apart; the last
/// column is not padded. Cells a table must keep usable (ids) are given whole, so the width
/// follows them.
fn columns(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|&h| h.to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let last = row.len().saturating_sub(1);
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            if i == last {
                line.push_str(cell);
            } else {
                let pad = w.saturating_sub(cell.chars().count());
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The widest a session's name or owner is shown in a table (`session show` and `--json` have
/// them whole): long names are cut to it so a row keeps to one line.
const NAME_WIDTH: usize = 20;

/// A session's name for a table: `-` when none was given (the controller then names it by its
/// id, which the ID column already shows).
fn name(s: &pb::Session) -> String {
    if s.name.is_empty() || s.name == s.id {
        "-".to_owned()
    } else {
        fit(&s.name, NAME_WIDTH)
    }
}

/// Sessions as a table. Ids and nodes are whole, so any can be pasted into the next command;
/// names and owners are cut to [`NAME_WIDTH`]. The OWNER column is there only when sessions of
/// more than one owner are listed (a user sees only their own; an admin sees everyone's), as
/// `kubectl` shows NAMESPACE only across namespaces. The ORIGIN column is there only when a
/// session Kubernetes placed (origin `dra`) is listed, and such a session names its claim and pod
/// after what it holds.
#[must_use]
pub fn sessions(list: &[pb::Session]) -> String {
    let observed = list.iter().any(|s| origin(s) != "controller");
    let owners = list
        .iter()
        .map(|s| s.owner.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .len()
        > 1;
    let mut header = vec!["ID", "NAME"];
    if owners {
        header.push("OWNER");
    }
    header.extend(["STATE", "NODE"]);
    if observed {
        header.push("ORIGIN");
    }
    header.push("REQUESTED");
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|s| {
            let mut row = vec![s.id.clone(), name(s)];
            if owners {
                row.push(fit(&s.owner, NAME_WIDTH));
            }
            row.push(state(s.state).to_owned());
            row.push(if s.node_id.is_empty() {
                "-".to_owned()
            } else {
                s.node_id.clone()
            });
            if observed {
                row.push(origin(s).to_owned());
            }
            let mut requested = typed(s.requested.as_ref());
            if let Some(k) = &s.kubernetes {
                let _ = write!(requested, "  {}", claim(k));
            }
            if let Some(g) = &s.gang {
                let _ = write!(requested, "  {}", gang(g));
            }
            row.push(requested);
            row
        })
        .collect();
    columns(&header, &rows)
}

/// Who placed a session: `controller` (also from controllers before origins) or `dra`.
fn origin(s: &pb::Session) -> &str {
    if s.origin.is_empty() {
        "controller"
    } else {
        &s.origin
    }
}

/// A gang in words: `gang train (4 members)`.
fn gang(g: &pb::Gang) -> String {
    format!("gang {} ({} members)", g.name, g.size)
}

/// A Kubernetes claim and its pod in words: `claim ml/half pod train-0`.
fn claim(k: &pb::KubernetesClaim) -> String {
    format!("claim {}/{} pod {}", k.namespace, k.claim_name, k.pod_name)
}

/// One session in detail.
#[must_use]
pub fn session(s: &pb::Session) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "id:        {}", s.id);
    let _ = writeln!(out, "name:      {}", s.name);
    let _ = writeln!(out, "owner:     {}", s.owner);
    let _ = writeln!(out, "state:     {}", state(s.state));
    let _ = writeln!(out, "node:      {}", s.node_id);
    let _ = writeln!(out, "origin:    {}", origin(s));
    if let Some(k) = &s.kubernetes {
        let _ = writeln!(
            out,
            "claim:     {}/{} (uid {})",
            k.namespace, k.claim_name, k.claim_uid
        );
        let _ = writeln!(
            out,
            "pod:       {}/{} (uid {})",
            k.namespace, k.pod_name, k.pod_uid
        );
    }
    let _ = writeln!(out, "requested: {}", slots(s.requested.as_ref()));
    if let Some(g) = &s.gang {
        let _ = writeln!(out, "gang:      {} ({} members)", g.name, g.size);
    }
    let _ = writeln!(out, "class:     {}", s.class);
    if let Some(e) = &s.explanation {
        let _ = writeln!(out, "placement: {}", e.mode);
    } else if !s.placement.is_empty() {
        let _ = writeln!(out, "placement: {}", s.placement);
    }
    for d in &s.devices {
        let _ = writeln!(
            out,
            "device:    GPU{} {} shares={} mem={}{}",
            d.index,
            d.uuid,
            d.shares,
            d.memory_bytes,
            if d.exclusive { " exclusive" } else { "" }
        );
    }
    if !s.reason.is_empty() {
        let _ = writeln!(out, "reason:    {}", s.reason);
    }
    let _ = writeln!(out, "target:    {}", target(s.target.as_ref()));
    if let Some(p) = &s.policy {
        let _ = writeln!(out, "policy:    memory={} compute={}", p.memory, p.compute);
    }
    if let Some(share) = &s.share {
        share_lines(&mut out, share);
    }
    if !s.events.is_empty() {
        let _ = writeln!(out, "events:");
        let _ = writeln!(
            out,
            "  {:<15} {:<13} {:>8} {:<6} {:<24} REASON",
            "AT_MS", "ACTION", "PID", "GPU", "CONTAINER"
        );
        for e in &s.events {
            let mut reason = e.reason.clone();
            if e.limit_bytes > 0 {
                let _ = write!(
                    reason,
                    " (used {} of {} bytes, asked {})",
                    e.used_bytes, e.limit_bytes, e.requested_bytes
                );
            }
            let _ = writeln!(
                out,
                "  {:<15} {:<13} {:>8} {:<6} {:<24} {}",
                e.at_ms,
                // The enum where the sender filled it; the string for an action newer than
                // this build, or from an agent or controller from before the enum.
                convert::action_from_pb(e),
                e.pid,
                // `device_index` tells no GPU from GPU 0; a controller from before it sends
                // only `device`, where 0 may be either.
                e.device_index
                    .or((e.device != 0).then_some(e.device))
                    .map_or_else(|| "-".to_owned(), |d| format!("GPU{d}")),
                e.container,
                reason
            );
        }
    }
    out
}

/// The `entitled:` and `achieved:` lines: its share of each GPU against the GPU time its agent
/// measured it getting.
fn share_lines(out: &mut String, share: &pb::SessionShare) {
    let _ = writeln!(
        out,
        "entitled:  compute {:.3} of each GPU, memory {} bytes",
        share.entitled_compute, share.entitled_memory_bytes
    );
    if share.samples == 0 {
        let _ = writeln!(out, "achieved:  no usage reported yet");
        return;
    }
    let _ = writeln!(
        out,
        "achieved:  compute {:.3} mean of the last {} reports, {:.3} at the last; memory {} \
         bytes at the last (peak {}); {} reports in all",
        share.achieved_mean,
        share.window_samples,
        share.achieved_last,
        share.last_memory_bytes,
        share.peak_memory_bytes,
        share.samples
    );
}

/// Why a session went where it went: each candidate with its terms, best first.
#[must_use]
pub fn explanation(s: &pb::Session) -> String {
    let mut out = decisions(s);
    let Some(e) = &s.explanation else {
        let _ = writeln!(out, "session {} is not placed yet: {}", s.id, s.reason);
        return out;
    };
    let _ = writeln!(
        out,
        "placement: {} ({} candidate{} scored; lower totals win)",
        e.mode,
        e.considered,
        if e.considered == 1 { "" } else { "s" }
    );
    let names: Vec<&str> = e
        .candidates
        .first()
        .map(|c| c.terms.iter().map(|t| t.name.as_str()).collect())
        .unwrap_or_default();
    let _ = write!(
        out,
        "  {:<6} {:<16} {:<10} {:>9} {:>9}",
        "", "NODE", "GPUS", "TOTAL", "UTIL"
    );
    for n in &names {
        let _ = write!(out, " {:>22}", n.to_uppercase());
    }
    out.push('\n');
    for c in &e.candidates {
        let gpus: Vec<String> = c.devices.iter().map(|d| format!("GPU{d}")).collect();
        let mark = match (c.chosen, c.over_cap) {
            (true, _) => "chosen",
            (false, true) => "capped",
            _ => "",
        };
        let _ = write!(
            out,
            "  {:<6} {:<16} {:<10} {:>9.3} {:>9.2}",
            mark,
            c.node_id,
            gpus.join(","),
            c.total,
            c.predicted_utilization
        );
        for t in &c.terms {
            // value × weight = contribution (packing enters with a minus sign).
            let _ = write!(
                out,
                " {:>22}",
                format!("{:.3}×{:.2}={:+.3}", t.value, t.weight, t.contribution)
            );
        }
        out.push('\n');
    }
    out
}

/// The scheduler's decisions about `s`, oldest first, one line each (nothing when none).
fn decisions(s: &pb::Session) -> String {
    let mut out = String::new();
    if s.decisions.is_empty() {
        return out;
    }
    out.push_str("decisions:\n");
    for d in &s.decisions {
        let _ = writeln!(out, "  {:<15} {:<9} {}", d.at_ms, d.kind, d.detail);
    }
    out
}

/// Workload profiles, one line each.
#[must_use]
pub fn profiles(list: &[pb::Profile]) -> String {
    let mut out = format!(
        "{:<24} {:>5} {:>8} {:>6} {:>6} {:>6} {:>14}\n",
        "CLASS", "RUNS", "SAMPLES", "MEAN", "P50", "P95", "PEAK_MEM"
    );
    for p in list {
        let _ = writeln!(
            out,
            "{:<24} {:>5} {:>8} {:>6.2} {:>6.2} {:>6.2} {:>14}",
            p.class,
            p.runs,
            p.samples,
            mean(&p.deciles),
            p.deciles.get(5).copied().unwrap_or(0.0),
            p.deciles.last().copied().unwrap_or(0.0),
            p.peak_memory_bytes
        );
    }
    out
}

/// One profile in detail, with its distribution drawn.
#[must_use]
pub fn profile(p: &pb::Profile) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "class:       {}", p.class);
    let _ = writeln!(out, "runs:        {}", p.runs);
    let _ = writeln!(out, "samples:     {}", p.samples);
    let _ = writeln!(out, "mean util:   {:.3}", mean(&p.deciles));
    let _ = writeln!(out, "peak memory: {} bytes", p.peak_memory_bytes);
    let _ = writeln!(out, "ioctls/s:    {:.1}", p.mean_ioctls_per_sec);
    let _ = writeln!(out, "utilization by decile:");
    for (i, d) in p.deciles.iter().enumerate() {
        let _ = writeln!(out, "  p{:<3} {:>5.2} {}", i * 10 + 5, d, bar(*d, 30));
    }
    out
}

/// A session's target in words.
#[must_use]
pub fn target(t: Option<&pb::Target>) -> String {
    use pb::target::Kind;
    match t.and_then(|t| t.kind.as_ref()) {
        None | Some(Kind::Managed(false)) => "none".to_owned(),
        Some(Kind::ContainerId(id)) => format!("container {id}"),
        Some(Kind::PodUid(uid)) => format!("pod {uid}"),
        Some(Kind::CgroupPath(path)) => format!("cgroup {path}"),
        Some(Kind::Managed(true)) => "managed".to_owned(),
    }
}

/// Nodes as a table: GPU shares and GPU memory as allocated/capacity, then the other slots
/// the same way, bytes in binary units. Node ids are whole (`node show` takes them back).
#[must_use]
pub fn nodes(list: &[pb::Node]) -> String {
    let width = list
        .iter()
        .filter_map(|n| n.info.as_ref())
        .map(|i| i.node_id.chars().count())
        .fold(16, usize::max);
    let mut out = format!(
        "{:<width$} {:<7} {:>4} {:<11} {:<21} {}\n",
        "NODE", "STATE", "GPUS", "SHARES", "GPU MEMORY", "OTHER (ALLOCATED/CAPACITY)"
    );
    for n in list {
        let info = n.info.clone().unwrap_or_default();
        let usage = Usage::of(n);
        let others: Vec<String> = usage
            .names()
            .filter(|name| !name.starts_with(names::CUDA_PREFIX))
            .map(|name| format!("{name} {}", usage.pair(name)))
            .collect();
        let _ = writeln!(
            out,
            "{:<width$} {:<7} {:>4} {:<11} {:<21} {}",
            info.node_id,
            node_state(n.state),
            info.devices.len(),
            usage.pair(names::CUDA_SHARES),
            usage.pair(names::CUDA_MEM),
            others.join(", ")
        );
    }
    out
}

/// A node's slots, allocated and capacity, read with the kinds its agent declared.
struct Usage<'a> {
    allocated: Option<&'a pb::ResourceSlot>,
    capacity: Option<&'a pb::ResourceSlot>,
    kinds: &'a [pb::SlotType],
}

impl<'a> Usage<'a> {
    fn of(n: &'a pb::Node) -> Self {
        let info = n.info.as_ref();
        Self {
            allocated: n.allocated.as_ref(),
            // Controllers before the `capacity` field sent the agent's report only.
            capacity: n
                .capacity
                .as_ref()
                .or_else(|| info.and_then(|i| i.capacity.as_ref())),
            kinds: info.map_or(&[], |i| i.slot_types.as_slice()),
        }
    }

    /// Every slot named in either, sorted.
    fn names(&self) -> impl Iterator<Item = &'a str> {
        let mut all: Vec<&str> = [self.allocated, self.capacity]
            .into_iter()
            .flatten()
            .flat_map(|s| s.values.keys().map(String::as_str))
            .collect();
        all.sort_unstable();
        all.dedup();
        all.into_iter()
    }

    /// `allocated/capacity` of `slot`, bytes in binary units (`-` where the node has none).
    fn pair(&self, slot: &str) -> String {
        let get = |s: Option<&pb::ResourceSlot>| s.and_then(|s| s.values.get(slot)).cloned();
        let (allocated, capacity) = (get(self.allocated), get(self.capacity));
        if capacity.is_none() && allocated.is_none() {
            return "-".to_owned();
        }
        let allocated = allocated.unwrap_or_else(|| "0".to_owned());
        let capacity = capacity.unwrap_or_else(|| "0".to_owned());
        if self.is_bytes(slot) {
            format!("{}/{}", Self::bytes(&allocated), Self::bytes(&capacity))
        } else {
            format!("{allocated}/{capacity}")
        }
    }

    fn is_bytes(&self, slot: &str) -> bool {
        self.kinds
            .iter()
            .find(|t| t.name == slot)
            .and_then(|t| convert::kind_from_pb(t.kind))
            .map_or(slot == names::MEM || slot == names::CUDA_MEM, |k| {
                k == SlotKind::Bytes
            })
    }

    /// An exact byte count from the wire in binary units; anything else as it came.
    fn bytes(value: &str) -> String {
        value
            .parse::<u64>()
            .map_or_else(|_| value.to_owned(), human_bytes)
    }

    /// Every slot as `name allocated/capacity`, comma-separated.
    fn all(&self) -> String {
        self.names()
            .map(|name| format!("{name} {}", self.pair(name)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A bar of `width` cells for `fraction` (0–1).
#[must_use]
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "a bar: a clamped fraction of a small width"
)]
pub fn bar(fraction: f64, width: usize) -> String {
    let filled = ((fraction.clamp(0.0, 1.0) * width as f64).round() as usize).min(width);
    format!("{}{}", "█".repeat(filled), "░".repeat(width - filled))
}

/// A node with its GPU allocation map, one bar per GPU: `GPU0 ████████░░ 0.80`. MIG instances
/// follow, under the GPU they are part of (issue 37).
#[must_use]
pub fn node(n: &pb::Node, devices: &[pb::DeviceAllocation]) -> String {
    let info = n.info.clone().unwrap_or_default();
    let mut out = String::new();
    let _ = writeln!(out, "node:      {} ({})", info.node_id, node_state(n.state));
    // allocated/capacity per slot, GPU slots included.
    let _ = writeln!(out, "slots:     {}", Usage::of(n).all());
    if !info.hooks.is_empty() {
        let _ = writeln!(out, "hooks:     {}", info.hooks.len());
    }
    for d in devices.iter().filter(|d| d.parent_uuid.is_empty()) {
        let _ = writeln!(out, "{}", device_row(&format!("GPU{}", d.index), d));
    }
    let mut parents: Vec<&str> = Vec::new();
    for d in devices.iter().filter(|d| !d.parent_uuid.is_empty()) {
        if !parents.contains(&d.parent_uuid.as_str()) {
            parents.push(&d.parent_uuid);
        }
    }
    for parent in parents {
        let _ = writeln!(out, "GPU {parent} in MIG mode:");
        for d in devices.iter().filter(|d| d.parent_uuid == parent) {
            let _ = writeln!(out, "  {}", device_row(&format!("MIG{}", d.index), d));
        }
    }
    out
}

/// One device of the allocation map: its bar, shares, memory and sessions.
fn device_row(name: &str, d: &pb::DeviceAllocation) -> String {
    let allocated: f64 = d.allocated_shares.parse().unwrap_or(0.0);
    let capacity: f64 = d.capacity_shares.parse().unwrap_or(1.0);
    let fraction = if capacity > 0.0 {
        allocated / capacity
    } else {
        0.0
    };
    // A GPU offered to Kubernetes holds claims, never the controller's sessions.
    format!(
        "{name} {} {allocated:.2}  {}/{} GiB  {}{}",
        bar(fraction, 10),
        d.allocated_memory_bytes >> 30,
        d.memory_bytes >> 30,
        if d.kubernetes { "[k8s] " } else { "" },
        d.sessions.join(",")
    )
}

/// Slot types as a table.
#[must_use]
pub fn slot_types(list: &[pb::SlotType]) -> String {
    let mut out = format!("{:<24} {}\n", "SLOT", "KIND");
    for t in list {
        let _ = writeln!(out, "{:<24} {}", t.name, kind(t.kind));
    }
    out
}

/// Slots in their exact spelling (`cuda.mem=200g,cuda.shares=4.5`); `-` for none. A value this
/// build can't read is shown as the wire has it.
fn exact(s: Option<&pb::ResourceSlot>) -> String {
    match convert::slots_from_pb(s) {
        Ok(parsed) if parsed.is_zero() => "-".to_owned(),
        Ok(parsed) => parsed.to_string(),
        Err(_) => slots(s),
    }
}

/// Team queues as a table: guarantee, limit (`-`: none), what each holds and borrows now (in
/// the slots it governs), and its members.
#[must_use]
pub fn queues(list: &[pb::Queue]) -> String {
    let mut out = format!(
        "{:<16} {:<32} {:<32} {:<24} {:<24} {}\n",
        "NAME", "GUARANTEED", "LIMIT", "HELD", "BORROWED", "MEMBERS"
    );
    for q in list {
        let _ = writeln!(
            out,
            "{:<16} {:<32} {:<32} {:<24} {:<24} {}",
            q.name,
            exact(q.guaranteed.as_ref()),
            exact(q.limit.as_ref()),
            exact(q.held.as_ref()),
            exact(q.borrowed.as_ref()),
            q.members.join(",")
        );
    }
    out
}

/// One team queue in detail.
#[must_use]
pub fn queue(q: &pb::Queue) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "name:       {}", q.name);
    let _ = writeln!(out, "guaranteed: {}", exact(q.guaranteed.as_ref()));
    let limit = if q.limit.is_some() {
        exact(q.limit.as_ref())
    } else {
        "none".to_owned()
    };
    let _ = writeln!(out, "limit:      {limit}");
    let _ = writeln!(out, "held:       {}", exact(q.held.as_ref()));
    let _ = writeln!(out, "borrowed:   {}", exact(q.borrowed.as_ref()));
    let _ = writeln!(out, "members:    {}", q.members.join(", "));
    out
}

#[cfg(test)]
mod tests;
