//! The throttle's decisions, kept pure: the time is passed in and cgroups are read and frozen
//! through [`Cgroups`], so tests drive it with a fake clock and fake cgroups, without sleeping.
//!
//! Each member (a cgroup on one GPU) has a token bucket counted in nanoseconds of busy time:
//! every tick it earns `share ×` the span its usage reading newly covers (up to the reading's
//! `until`, which lags now for a sampled signal such as NVML's) and pays what it used over that
//! same span. A member in debt
//! wants to be frozen until it has earned back `share × (1 − share) × period`; for a member that
//! is always busy this makes one freeze/thaw cycle last one period (run `share × period`, stay
//! frozen `(1 − share) × period`), and because debt carries over, measurement lag and freeze
//! latency are paid back rather than lost. Credit is capped at `share × (period + lag)`, `lag`
//! being how far the signal's readings trail now (zero for the CPU-time stand-in; a sample period
//! or so for NVML, decaying over about 16 spans): a member thawed on a lagging signal keeps
//! earning until the signal shows it running, and a cap of one period would throw that credit
//! away (a simulated GPU with a sixth of a second's samples then holds 0.3 at 0.25). Idle time
//! banks no burst larger than `share × (period + lag)`; the lag is at most a second.

use std::{
    collections::{BTreeMap, HashMap},
    io,
    path::Path,
    time::{Duration, Instant},
};

use super::{
    ComputePolicy, Member, ThrottleStats, Usage,
    freezer::{self, Cgroup, Freezer, is_gone},
};

/// A `work-conserving` member counts the others on its GPU as idle while each uses less than
/// this fraction of its own share.
const IDLE_FRACTION_OF_SHARE: f64 = 0.1;

/// Debt is capped at this many periods, so one wild reading can't freeze a cgroup for long.
const MAX_DEBT_PERIODS: u32 = 10;

const PPM: i128 = 1_000_000;

/// The kernel side of the throttle, faked in tests.
pub(crate) trait Cgroups: Freezer {
    /// Cumulative busy time of the cgroup at `dir` on `gpu`, and up to when it is complete.
    fn busy(&mut self, gpu: u32, dir: &Path) -> io::Result<Usage>;
}

/// One cgroup on one GPU.
#[derive(Debug)]
struct Bucket {
    share_ppm: u32,
    policy: ComputePolicy,
    /// Nanoseconds of busy time it may still use; negative is debt.
    credit: i64,
    /// The last reading: up to when it was complete, and the busy time; `None` until the first.
    last: Option<(Instant, Duration)>,
    /// Recent running fraction (an exponential average over about one period).
    recent: f64,
    /// How far behind now the last reading was complete.
    lag: Duration,
    /// This GPU's loop wants the cgroup frozen.
    wants_frozen: bool,
    /// Busy time the readings showed, from the first.
    gpu_time: Duration,
}

impl Bucket {
    fn new(member: &Member) -> Self {
        Self {
            share_ppm: member.share_ppm,
            policy: member.policy,
            credit: 0,
            last: None,
            recent: 0.0,
            lag: Duration::ZERO,
            wants_frozen: false,
            gpu_time: Duration::ZERO,
        }
    }

    /// `share × d` in nanoseconds.
    fn of_share(&self, d: Duration) -> i64 {
        let ns =
            i128::try_from(d.as_nanos()).unwrap_or(i128::MAX) * i128::from(self.share_ppm) / PPM;
        i64::try_from(ns).unwrap_or(i64::MAX)
    }

    fn cap(&self, period: Duration) -> i64 {
        self.of_share(period)
    }

    /// Credit needed to thaw: `share × (1 − share) × period`.
    fn band(&self, period: Duration) -> i64 {
        let idle_ppm = PPM - i128::from(self.share_ppm);
        let ns = i128::from(self.of_share(period)) * idle_ppm / PPM;
        i64::try_from(ns).unwrap_or(i64::MAX)
    }

    /// Earns `share ×` the span the reading adds (from the last reading's `until` to this one's)
    /// and pays the busy time gained over the same span.
    fn observe(&mut self, now: Instant, usage: Usage, period: Duration) {
        let Usage { busy, until } = usage;
        let lag = now
            .saturating_duration_since(until)
            .min(period * MAX_DEBT_PERIODS);
        let since = self.last.map_or(Duration::ZERO, |(at, _)| {
            until.saturating_duration_since(at)
        });
        self.lag = lag.max(self.lag.saturating_sub(since / 16));
        if let Some((at, before)) = self.last {
            let elapsed = until.saturating_duration_since(at);
            // A counter that went backwards (a re-created cgroup) counts as no use.
            let used = busy.saturating_sub(before);
            self.gpu_time += used;
            let used_ns = i64::try_from(used.as_nanos()).unwrap_or(i64::MAX);
            let debt_cap = -(i64::try_from((period * MAX_DEBT_PERIODS).as_nanos()).unwrap_or(0));
            self.credit = self
                .credit
                .saturating_add(self.of_share(elapsed))
                .saturating_sub(used_ns)
                .clamp(debt_cap, self.of_share(period + self.lag));
            if !elapsed.is_zero() {
                let sample = used.as_secs_f64() / elapsed.as_secs_f64();
                let alpha = 1.0 - (-elapsed.as_secs_f64() / period.as_secs_f64()).exp();
                self.recent += alpha * (sample - self.recent);
            }
        }
        let until = self.last.map_or(until, |(at, _)| at.max(until));
        self.last = Some((until, busy));
    }

    /// Uses the GPU, or wants to: the others on a GPU must then make room.
    fn active(&self) -> bool {
        self.wants_frozen || self.recent >= IDLE_FRACTION_OF_SHARE * f64::from(self.share_ppm) / 1e6
    }

    fn decide(&mut self, others_active: bool, period: Duration) {
        if self.policy == ComputePolicy::WorkConserving && !others_active {
            // Idle capacity is free to use, but it is not lent: no debt is kept for it, so the
            // member falls back to its share as soon as the others contend, without a penalty.
            self.credit = self.credit.max(0);
            self.wants_frozen = false;
        } else if self.wants_frozen {
            self.wants_frozen = self.credit < self.band(period);
        } else {
            self.wants_frozen = self.credit < 0;
        }
    }
}

/// Every member of every GPU and what the throttle has done to them.
#[derive(Debug)]
pub(crate) struct Controller {
    period: Duration,
    /// GPU → cgroup key → bucket.
    gpus: BTreeMap<u32, BTreeMap<u64, Bucket>>,
    cgroups: HashMap<u64, Cgroup>,
}

impl Controller {
    pub(crate) fn new(period: Duration) -> Self {
        Self {
            period,
            gpus: BTreeMap::new(),
            cgroups: HashMap::new(),
        }
    }

    /// Adds `key` to `gpu`, or updates its share and policy there (keeping its credit).
    pub(crate) fn set(&mut self, gpu: u32, key: u64, member: &Member) {
        freezer::member(&mut self.cgroups, key, &member.cgroup_dir);
        let period = self.period;
        self.gpus
            .entry(gpu)
            .or_default()
            .entry(key)
            .and_modify(|b| {
                b.share_ppm = member.share_ppm;
                b.policy = member.policy;
                b.credit = b.credit.min(b.cap(period));
            })
            .or_insert_with(|| Bucket::new(member));
    }

    /// Holds cgroup `key` (at `dir`) frozen, or lets its buckets decide again; a cgroup that is
    /// no member is held all the same, until [`Controller::remove`].
    pub(crate) fn hold(
        &mut self,
        key: u64,
        dir: &std::path::Path,
        held: bool,
        now: Instant,
        sys: &mut dyn Cgroups,
    ) {
        let cgroup = self
            .cgroups
            .entry(key)
            .or_insert_with(|| Cgroup::new(dir.to_owned()));
        cgroup.held = held;
        // At once, not at the next tick: a stopped workload must not run meanwhile.
        let wants = held
            || self
                .gpus
                .values()
                .filter_map(|members| members.get(&key))
                .any(|b| b.wants_frozen);
        if cgroup.apply(now, wants, sys).is_err() {
            self.cgroups.remove(&key);
            self.forget(key);
        }
    }

    /// Drops `key` from every GPU and thaws it.
    pub(crate) fn remove(&mut self, key: u64, now: Instant, sys: &mut dyn Cgroups) {
        self.forget(key);
        freezer::release(&mut self.cgroups, key, now, sys);
    }

    /// Thaws every cgroup (on shutdown).
    pub(crate) fn thaw_all(&mut self, now: Instant, sys: &mut dyn Cgroups) {
        freezer::thaw_all(&mut self.cgroups, now, sys);
    }

    fn forget(&mut self, key: u64) {
        for members in self.gpus.values_mut() {
            members.remove(&key);
        }
        self.gpus.retain(|_, members| !members.is_empty());
    }

    /// Measures every member and freezes or thaws each cgroup accordingly.
    pub(crate) fn tick(&mut self, now: Instant, sys: &mut dyn Cgroups) {
        let mut gone = Vec::new();
        for (&gpu, members) in &mut self.gpus {
            for (key, bucket) in members.iter_mut() {
                let Some(cgroup) = self.cgroups.get_mut(key) else {
                    continue;
                };
                match sys.busy(gpu, &cgroup.dir) {
                    Ok(usage) => bucket.observe(now, usage, self.period),
                    Err(e) if is_gone(&e) => gone.push(*key),
                    // Keep the last reading: the next good one accounts for the whole interval.
                    Err(e) => cgroup.warn_once("reading usage", &e),
                }
            }
            let active: Vec<(u64, bool)> = members.iter().map(|(k, b)| (*k, b.active())).collect();
            for (key, bucket) in members.iter_mut() {
                let others_active = active.iter().any(|(k, a)| k != key && *a);
                bucket.decide(others_active, self.period);
            }
        }
        for (key, cgroup) in &mut self.cgroups {
            if gone.contains(key) {
                continue;
            }
            // Frozen when held, or when any GPU's loop wants it frozen.
            let frozen = cgroup.held
                || self
                    .gpus
                    .values()
                    .filter_map(|members| members.get(key))
                    .any(|b| b.wants_frozen);
            if cgroup.apply(now, frozen, sys).is_err() {
                gone.push(*key);
            }
        }
        for key in gone {
            if let Some(cgroup) = self.cgroups.remove(&key) {
                tracing::debug!(cgroup = %cgroup.dir.display(), key, "throttle: cgroup is gone; dropped");
            }
            self.forget(key);
        }
    }

    /// What the throttle knows of each cgroup, at `now`.
    pub(crate) fn stats(&self, now: Instant) -> impl Iterator<Item = (u64, ThrottleStats)> + '_ {
        self.cgroups.iter().map(move |(&key, cgroup)| {
            let running_fraction = self
                .gpus
                .values()
                .filter_map(|members| members.get(&key))
                .map(|b| b.recent)
                .fold(0.0, f64::max);
            let stats = ThrottleStats {
                throttled: cgroup.throttled(now),
                frozen: cgroup.frozen == Some(true),
                running_fraction,
                gpu_time: self
                    .gpus
                    .values()
                    .filter_map(|members| members.get(&key))
                    .map(|b| b.gpu_time)
                    .sum(),
                balance: None,
            };
            (key, stats)
        })
    }
}

#[cfg(test)]
mod tests;
