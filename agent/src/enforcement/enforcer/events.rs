//! Kernel events (an over-limit allocation, a refused open, a share deviation, what the NVML
//! cross-check found) tied to their session, rate-limited per session, kept in a short history
//! for snapshots and sent up to the controller.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Instant,
};

use gpuwarden_agent_common::{
    event::{Event, action, kind},
    maps::{MAX_GPUS, NO_LIMIT},
};
use gpuwarden_proto::v1 as pb;

use super::{Enforcer, Record};
use crate::{devices::ProcessMemory, enforcement::quota::MemoryPolicy, sensor::MemoryTier};

/// Enforcement events kept for snapshots.
pub(super) const HISTORY: usize = 64;

/// The actions a workload can cause as often as it likes (an allocation over its limit under
/// `report`, a refused open in a loop): rate-limited per session by [`EventLimiter`].
const WORKLOAD_ACTIONS: [&str; 5] = ["deny", "kill", "stop", "report", "device_denied"];

/// Workload-caused events a session sends per second once its burst is spent.
const EVENTS_PER_SEC: f64 = 5.0;

/// Workload-caused events a session may send at once.
pub(super) const EVENT_BURST: f64 = 20.0;

/// A token bucket per session for the events its workload causes: a tenant allocating in a loop
/// under `report` fills neither the controller link nor the history; what is held back is
/// counted and named in the next event that goes.
#[derive(Debug, Default)]
pub(super) struct EventLimiter {
    /// Session → (tokens, when last refilled, events held back since the last one sent).
    sessions: BTreeMap<String, (f64, Instant, u64)>,
    /// Events held back since the agent started.
    pub(super) suppressed_total: u64,
}

impl EventLimiter {
    /// `Some(held back before it)` when `session`'s event goes, `None` when it is held back.
    pub(super) fn admit(&mut self, session: &str, now: Instant) -> Option<u64> {
        let (tokens, last, held_back) =
            self.sessions
                .entry(session.to_owned())
                .or_insert((EVENT_BURST, now, 0));
        let refill = now.saturating_duration_since(*last).as_secs_f64() * EVENTS_PER_SEC;
        *tokens = (*tokens + refill).min(EVENT_BURST);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Some(std::mem::take(held_back))
        } else {
            *held_back += 1;
            self.suppressed_total += 1;
            None
        }
    }

    pub(super) fn forget(&mut self, session: &str) {
        self.sessions.remove(session);
    }
}

/// The event sent up to the controller for `record`.
pub(super) fn record_to_pb(record: &Record) -> pb::EnforcementEvent {
    gpuwarden_proto::convert::event_to_pb(&record.session_id, &record.event())
}

/// Whether NVML's count shows a workload over its limit that the kernel side did not see (so
/// nothing acted on it): the decoder missed an allocation path.
#[must_use]
pub(crate) fn missed_by_decoder(limit: u64, kernel_used: u64, nvml_used: u64) -> bool {
    nvml_used > limit && kernel_used <= limit
}

impl Enforcer {
    /// Ties a kernel event to its session and records it; other events are ignored.
    pub(crate) fn on_kernel_event(&mut self, e: &Event, tier: MemoryTier) {
        let Some((session, rel)) = self.session_of_cgroup(e.cgroup) else {
            return;
        };
        match e.kind {
            kind::QUOTA_EXCEEDED => {
                let (name, what) = match e.code {
                    action::DENY => ("deny", "refused with ENOMEM"),
                    action::KILL => ("kill", "killed (SIGKILL)"),
                    action::STOP => ("stop", "stopped (SIGSTOP)"),
                    _ => ("report", "reported"),
                };
                if e.code == action::STOP
                    && let Some(b) = self.bindings.get_mut(&session)
                {
                    b.stopped.insert(e.tgid);
                }
                let reason = format!(
                    "allocation of {} bytes on GPU {} would bring the quota to {} of {} bytes: {what} ({})",
                    e.bytes,
                    e.device,
                    e.used.saturating_add(e.bytes),
                    e.limit,
                    tier.as_str()
                );
                self.record(
                    &session,
                    name,
                    reason,
                    rel,
                    e.tgid,
                    Some(e.device),
                    (e.bytes, e.used, e.limit),
                );
            }
            kind::DEVICE_DENIED => {
                let reason = if e.code == 2 {
                    format!(
                        "open of /dev/nvidia{} refused: the workload holds its budget of GPU fds",
                        e.device
                    )
                } else {
                    format!(
                        "open of /dev/nvidia{} refused: not allocated to this workload",
                        e.device
                    )
                };
                self.record(
                    &session,
                    "device_denied",
                    reason,
                    rel,
                    e.tgid,
                    Some(e.device),
                    (0, 0, 0),
                );
            }
            _ => {}
        }
    }

    /// The session and cgroup path a cgroup id is mapped under.
    pub(super) fn session_of_cgroup(&self, cgroup: u64) -> Option<(String, String)> {
        self.bindings.iter().find_map(|(s, b)| {
            b.members.contains(&cgroup).then(|| {
                let rel = b
                    .dir
                    .as_deref()
                    .map(|d| self.tree.relative(d))
                    .unwrap_or_default();
                (s.clone(), rel)
            })
        })
    }

    /// Records a deviation the share watch raised on one of `session`'s containers and sends
    /// it up as a `share_deviation` event: a report, nothing is done to the workload. A session
    /// this node holds no quota for is ignored (it was released meanwhile).
    pub(crate) fn share_deviation(&mut self, session: &str, cgroup_path: String, reason: String) {
        if !self.bindings.contains_key(session) {
            return;
        }
        let action = gpuwarden_types::event::Action::ShareDeviation;
        self.record(
            session,
            action.as_str(),
            reason,
            cgroup_path,
            0,
            None,
            (0, 0, 0),
        );
    }

    /// Compares NVML's per-process memory with each bound quota's limits and acts, by the
    /// quota's policy, on workloads the decoder let past their limit (once per crossing).
    pub(crate) fn cross_check(&mut self, samples: &[ProcessMemory]) {
        // A process can be listed as both compute and graphics: count it once.
        let mut by_process: BTreeMap<(u32, u32), u64> = BTreeMap::new();
        for s in samples {
            let bytes = by_process.entry((s.index, s.pid)).or_default();
            *bytes = (*bytes).max(s.bytes);
        }
        // (session, GPU) → (bytes, largest process, its bytes).
        let mut totals: BTreeMap<(String, u32), (u64, u32, u64)> = BTreeMap::new();
        for (&(index, pid), &bytes) in &by_process {
            let Some(cgroup) = self.tree.cgroup_id_of_pid(pid) else {
                continue;
            };
            let Some((session, _)) = self.session_of_cgroup(cgroup) else {
                continue;
            };
            let t = totals.entry((session, index)).or_default();
            t.0 += bytes;
            if bytes > t.2 {
                (t.1, t.2) = (pid, bytes);
            }
        }
        let over: BTreeSet<(String, u32)> = totals
            .iter()
            .filter(|((session, index), (nvml_used, _, _))| {
                let Some(b) = self.bindings.get(session) else {
                    return false;
                };
                let Some(limit) = b.spec.devices.iter().find(|d| d.index == *index) else {
                    return false;
                };
                let kernel_used = b
                    .key
                    .and_then(|k| self.kernel.maps.quotas.get(&k))
                    .map_or(0, |q| q.used[*index as usize % MAX_GPUS]);
                missed_by_decoder(limit.memory_bytes, kernel_used, *nvml_used)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in &over {
            if self.cross_checked.contains(key) {
                continue;
            }
            let (session, index) = key;
            let Some(&(nvml_used, pid, _)) = totals.get(key) else {
                continue;
            };
            let Some(b) = self.bindings.get_mut(session) else {
                continue;
            };
            let limit = b
                .spec
                .devices
                .iter()
                .find(|d| d.index == *index)
                .map_or(0, |d| d.memory_bytes);
            let (name, signal) = match b.spec.memory_policy {
                MemoryPolicy::Kill => ("kill", Some(libc::SIGKILL)),
                MemoryPolicy::Stop => ("stop", Some(libc::SIGSTOP)),
                MemoryPolicy::Report => ("report", None),
            };
            if let Some(signal) = signal {
                if let Err(e) = self.kernel.signals.send(pid, signal) {
                    tracing::warn!(session, pid, "cross-check could not signal: {e}");
                }
                if signal == libc::SIGSTOP {
                    b.stopped.insert(pid);
                }
            }
            let rel = b
                .dir
                .as_deref()
                .map(|d| self.tree.relative(d))
                .unwrap_or_default();

            let reason = format!(
                "NVML counts {nvml_used} bytes for the workload on GPU {index}, over its limit of {limit}, which the ioctl decoder did not see: {name} (NVML cross-check)"
            );
            self.record(
                &session.clone(),
                name,
                reason,
                rel,
                pid,
                Some(*index),
                (0, nvml_used, limit),
            );
        }
        self.cross_checked = over;
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "each input is a different part it is wired to"
    )]
    pub(super) fn record(
        &mut self,
        session: &str,
        action: &str,
        reason: String,
        cgroup_path: String,
        pid: u32,
        device: Option<u32>,
        (requested_bytes, used_bytes, limit_bytes): (u64, u64, u64),
    ) {
        let mut reason = reason;
        if WORKLOAD_ACTIONS.contains(&action) {
            match self.limiter.admit(session, Instant::now()) {
                None => return,
                Some(0) => {}
                Some(held_back) => {
                    use std::fmt::Write as _;
                    let _ = write!(
                        reason,
                        " ({held_back} more like it from this session were counted but not sent)"
                    );
                }
            }
        }
        let record = Record {
            session_id: session.to_owned(),
            action: action.into(),
            reason,
            cgroup_path,
            pid,
            device,
            requested_bytes,
            used_bytes,
            limit_bytes: if limit_bytes == NO_LIMIT {
                0
            } else {
                limit_bytes
            },
            at_ms: gpuwarden_types::now_ms(),
        };
        tracing::info!(session, action, pid, "{}", record.reason);
        if self.upward.try_send(record_to_pb(&record)).is_err() {
            self.dropped_upward += 1;
        }
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(record);
    }
}
