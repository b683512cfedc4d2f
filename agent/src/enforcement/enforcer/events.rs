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

/// What happened to a session, as [`Enforcer::record`] takes it: an action (`bound`, `deny`,
/// `resumed`...), why, and where as far as it is known: the session's cgroup, the process that
/// caused it, the GPU and the bytes at stake. Built as `Happened::to(session,
/// action).at(cgroup).because(reason)`, with the process, GPU and bytes added where an
/// allocation or an open caused it.
#[derive(Debug, Default)]
pub(super) struct Happened {
    session: String,
    action: String,
    reason: String,
    /// The session's cgroup, relative to the cgroup root (empty: none bound).
    cgroup_path: String,
    /// The process that caused it (0: none in particular).
    pid: u32,
    /// The GPU it happened on.
    device: Option<u32>,
    bytes: Bytes,
}

/// The bytes an allocation put at stake (0 where it is no allocation).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Bytes {
    /// Asked for.
    pub(super) requested: u64,
    /// Held before it (or, once suspended, moved to host memory).
    pub(super) used: u64,
    /// The limit ([`NO_LIMIT`]: none, reported as 0).
    pub(super) limit: u64,
}

impl Happened {
    /// `action`, done to or seen of `session`.
    pub(super) fn to(session: &str, action: &str) -> Self {
        Self {
            session: session.to_owned(),
            action: action.to_owned(),
            ..Self::default()
        }
    }

    /// At the session's cgroup, `cgroup_path` (relative to the cgroup root).
    pub(super) fn at(self, cgroup_path: String) -> Self {
        Self {
            cgroup_path,
            ..self
        }
    }

    /// Caused by process `pid`.
    pub(super) fn by(self, pid: u32) -> Self {
        Self { pid, ..self }
    }

    /// On GPU `device`.
    pub(super) fn on_gpu(self, device: u32) -> Self {
        Self {
            device: Some(device),
            ..self
        }
    }

    /// With `bytes` at stake.
    pub(super) fn bytes(self, bytes: Bytes) -> Self {
        Self { bytes, ..self }
    }

    /// Because of `reason`, the text the session's owner reads.
    pub(super) fn because(self, reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            ..self
        }
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
                    Happened::to(&session, name)
                        .at(rel)
                        .by(e.tgid)
                        .on_gpu(e.device)
                        .bytes(Bytes {
                            requested: e.bytes,
                            used: e.used,
                            limit: e.limit,
                        })
                        .because(reason),
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
                    Happened::to(&session, "device_denied")
                        .at(rel)
                        .by(e.tgid)
                        .on_gpu(e.device)
                        .because(reason),
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
            Happened::to(session, action.as_str())
                .at(cgroup_path)
                .because(reason),
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
                Happened::to(session, name)
                    .at(rel)
                    .by(pid)
                    .on_gpu(*index)
                    .bytes(Bytes {
                        used: nvml_used,
                        limit,
                        ..Bytes::default()
                    })
                    .because(reason),
            );
        }
        self.cross_checked = over;
    }

    /// Records what happened: rate-limited per session where its workload caused it, logged,
    /// sent up to the controller and kept in the history.
    pub(super) fn record(&mut self, happened: Happened) {
        let Happened {
            session,
            action,
            mut reason,
            cgroup_path,
            pid,
            device,
            bytes,
        } = happened;
        let session = session.as_str();
        let action = action.as_str();
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
            requested_bytes: bytes.requested,
            used_bytes: bytes.used,
            limit_bytes: if bytes.limit == NO_LIMIT {
                0
            } else {
                bytes.limit
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
