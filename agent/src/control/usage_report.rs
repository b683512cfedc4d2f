//! Usage reports: what each session with a quota used over the last interval, sent up the
//! controller stream as `SessionUsage`; the controller folds a finished session's reports into
//! the workload profile of its class (interference-aware scheduling).
//!
//! Each report carries:
//!
//! - `utilization`: the busy time the throttle's [`UsageSource`] measured for the session's
//!   cgroup on each of its GPUs, over the wall time since the last report, clamped to 0..=1 per
//!   GPU and averaged over its GPUs (on real GPUs NVML's device utilization apportioned among the
//!   processes active in each sample period; with mock devices the cgroup's CPU time, the same
//!   stand-in the throttle uses);
//! - `memory_bytes`: the GPU memory its quota holds now, as the kernel side counts it (the quota
//!   map's `used`, over all GPUs);
//! - `ioctls_per_sec`: the growth of its cgroups' GPU ioctl counters over the interval.
//!
//! Which sessions report: a **bound** quota reports measured figures from its second interval on
//! (the first reading is the baseline the next one is measured against); a **pending** quota,
//! whose workload has no cgroup yet, reports utilization 0 every interval — the session holds
//! its GPUs and they idle, which is a real sample of what the class does. Expired quotas, quotas
//! on no GPU and allocations with no target (booked only: no workload on this node can be tied
//! to them) report nothing, for want of any signal.
//!
//! Reading the usage source and the maps is cheap next to the interval, but the source is read
//! more often than reports are sent: NVML keeps its samples for a short time and
//! [`crate::enforcement::throttle::sampled::SampledSource`] on NVML reads them as they come, so it is polled at least every
//! [`MAX_POLL`] to keep integrating (with the CPU-time stand-in the extra reads are harmless).

use std::{
    collections::{HashMap, HashSet},
    io,
    path::PathBuf,
    sync::atomic::{AtomicU8, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use gpuwarden_proto::v1 as pb;

use crate::{
    enforcement::{BindState, Standing, throttle::UsageSource},
    sensor::Counters,
};

/// The longest gap between two reads of the usage source.
pub const MAX_POLL: Duration = Duration::from_millis(500);

/// How many reports went up and how many were dropped on the way (the stream's buffer was
/// full, as when the controller is away or slow); shown in the snapshot's `stats`.
#[derive(Debug, Default)]
pub struct UsageCounters {
    /// Reports handed to the controller stream.
    pub sent: AtomicU64,
    /// Reports dropped because a buffer on the way was full.
    pub dropped: AtomicU64,
    /// The link's state, kept beside the reports it carries: `LINK_NONE`, `LINK_DOWN` or
    /// `LINK_UP` (read it with [`UsageCounters::connected`]).
    pub link: AtomicU8,
}

/// No controller link runs.
pub const LINK_NONE: u8 = 0;
/// The link runs and its stream is down (connecting, or waiting to retry).
pub const LINK_DOWN: u8 = 1;
/// The stream to the controller is up.
pub const LINK_UP: u8 = 2;

impl UsageCounters {
    /// Counts one sent report.
    pub fn count_sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one dropped report.
    pub fn count_dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Records whether the stream to the controller is up.
    pub fn set_connected(&self, up: bool) {
        self.link
            .store(if up { LINK_UP } else { LINK_DOWN }, Ordering::Relaxed);
    }

    /// Whether the stream to the controller is up; `None` when no link runs.
    #[must_use]
    pub fn connected(&self) -> Option<bool> {
        match self.link.load(Ordering::Relaxed) {
            LINK_NONE => None,
            state => Some(state == LINK_UP),
        }
    }

    /// (sent, dropped) so far.
    #[must_use]
    pub fn get(&self) -> (u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
        )
    }
}

/// One session's workload as the agent sees it at one moment (read under the daemon's lock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionReading {
    /// The session.
    pub session_id: String,
    /// Its bound cgroup; `None` while its quota waits for one.
    pub cgroup_dir: Option<PathBuf>,
    /// Its GPUs (indexes), sorted.
    pub gpus: Vec<u32>,
    /// GPU memory its quota holds now, over all GPUs.
    pub memory_bytes: u64,
    /// GPU ioctls its cgroups have issued (cumulative while they live).
    pub ioctls: u64,
}

/// The sessions that report (see the module docs), with their memory and ioctl counters.
#[must_use]
pub(crate) fn read_sessions(standing: &Standing, counters: &Counters) -> Vec<SessionReading> {
    let mut out: Vec<SessionReading> = Vec::new();
    for b in &standing.bindings {
        if b.spec.devices.is_empty() {
            continue;
        }
        let cgroup_dir = match b.state {
            BindState::Bound => b.dir.clone(),
            BindState::Pending => None,
            BindState::Expired | BindState::Refused => continue,
        };
        let memory_bytes = b
            .kernel
            .map_or(0, |q| q.used.iter().fold(0u64, |a, b| a.saturating_add(*b)));
        let ioctls = b
            .members
            .iter()
            .filter_map(|id| counters.cgroups.get(id))
            .fold(0u64, |a, c| a.saturating_add(c.ioctls()));
        out.push(SessionReading {
            session_id: b.session_id.clone(),
            cgroup_dir,
            gpus: b.spec.devices.iter().map(|d| d.index).collect(),
            memory_bytes,
            ioctls,
        });
    }
    out
}

/// The bound cgroups and their GPUs, for polling the usage source between reports.
#[must_use]
pub(crate) fn bound_cgroups(standing: &Standing) -> Vec<(PathBuf, Vec<u32>)> {
    standing
        .bindings
        .iter()
        .filter(|b| b.state == BindState::Bound)
        .filter_map(|b| {
            let gpus: Vec<u32> = b.spec.devices.iter().map(|d| d.index).collect();
            b.dir
                .clone()
                .filter(|_| !gpus.is_empty())
                .map(|d| (d, gpus))
        })
        .collect()
}

/// How often to poll the usage source and how many polls make one report interval: the
/// interval split into equal polls of at most [`MAX_POLL`].
#[must_use]
pub fn poll_plan(interval: Duration) -> (Duration, u32) {
    let polls = interval.as_nanos().div_ceil(MAX_POLL.as_nanos()).max(1);
    let polls = u32::try_from(polls).unwrap_or(u32::MAX);
    (interval / polls, polls)
}

/// What one session's last report was measured from.
#[derive(Debug, Clone)]
struct Baseline {
    at: Instant,
    dir: PathBuf,
    busy: Vec<Duration>,
    ioctls: u64,
}

/// Turns readings into reports: keeps each bound session's previous reading and measures the
/// next one against it.
pub struct Reporter {
    usage: Box<dyn UsageSource>,
    baselines: HashMap<String, Baseline>,
}

impl Reporter {
    /// A reporter measuring busy time with `usage` (its own instance: sources keep state).
    #[must_use]
    pub fn new(usage: Box<dyn UsageSource>) -> Self {
        Self {
            usage,
            baselines: HashMap::new(),
        }
    }

    /// Reads the usage source for each bound cgroup without reporting, so that sources that
    /// integrate samples (NVML) keep doing so between reports. Errors are left to the report.
    pub fn poll(&mut self, cgroups: &[(PathBuf, Vec<u32>)]) {
        for (dir, gpus) in cgroups {
            for gpu in gpus {
                let _ = self.usage.busy(*gpu, dir);
            }
        }
    }

    /// The reports for `readings` taken at `now` (`at_ms` since the epoch). A bound session's
    /// first reading (or first after its cgroup changed or could not be read) only sets its
    /// baseline.
    pub fn report(
        &mut self,
        readings: Vec<SessionReading>,
        now: Instant,
        at_ms: i64,
    ) -> Vec<pb::SessionUsage> {
        let live: HashSet<&str> = readings.iter().map(|r| r.session_id.as_str()).collect();
        self.baselines.retain(|s, _| live.contains(s.as_str()));
        let mut out = Vec::with_capacity(readings.len());
        for r in readings {
            let Some(dir) = r.cgroup_dir else {
                // Holds its GPUs, nothing runs: idle.
                self.baselines.remove(&r.session_id);
                out.push(pb::SessionUsage {
                    session_id: r.session_id,
                    utilization: 0.0,
                    memory_bytes: r.memory_bytes,
                    ioctls_per_sec: 0.0,
                    at_ms,
                });
                continue;
            };
            // The wall time is the report's own; `until` matters to the throttle, which earns
            // its share by it, not to a report over seconds.
            let busy: io::Result<Vec<Duration>> = r
                .gpus
                .iter()
                .map(|g| self.usage.busy(*g, &dir).map(|u| u.busy))
                .collect();
            let busy = match busy {
                Ok(busy) => busy,
                Err(e) => {
                    // Gone (released or removed) or unreadable: start over next time.
                    tracing::debug!(session = %r.session_id, dir = %dir.display(), "no usage reading: {e}");
                    self.baselines.remove(&r.session_id);
                    continue;
                }
            };
            let previous = self.baselines.insert(
                r.session_id.clone(),
                Baseline {
                    at: now,
                    dir: dir.clone(),
                    busy: busy.clone(),
                    ioctls: r.ioctls,
                },
            );
            let Some(prev) = previous.filter(|p| p.dir == dir && p.busy.len() == busy.len()) else {
                continue;
            };
            let elapsed = now.saturating_duration_since(prev.at);
            if elapsed.is_zero() {
                continue;
            }
            out.push(pb::SessionUsage {
                session_id: r.session_id,
                utilization: utilization(&prev.busy, &busy, elapsed),
                memory_bytes: r.memory_bytes,
                ioctls_per_sec: r.ioctls.saturating_sub(prev.ioctls) as f64 / elapsed.as_secs_f64(),
                at_ms,
            });
        }
        out
    }
}

/// The mean over GPUs of the busy time gained per wall second, each clamped to 0..=1 (a source
/// may run a little ahead of the wall clock; the CPU-time stand-in counts every CPU).
#[must_use]
pub fn utilization(before: &[Duration], after: &[Duration], elapsed: Duration) -> f64 {
    if after.is_empty() || elapsed.is_zero() {
        return 0.0;
    }
    let sum: f64 = before
        .iter()
        .zip(after)
        .map(|(b, a)| (a.saturating_sub(*b).as_secs_f64() / elapsed.as_secs_f64()).clamp(0.0, 1.0))
        .sum();
    sum / after.len() as f64
}

#[cfg(test)]
mod tests;
