//! The usage signal of a GPU whose driver samples utilization (NVML), as pure code: fed the
//! driver's samples, it says how much GPU time each cgroup used and up to when that is known.
//!
//! What the driver gives (NVML's reference): every sample period (1/6 s to 1 s, by product) a
//! **device sample** — the percent of the period during which one or more kernels ran on the GPU,
//! with the CPU timestamp (µs) at which it was taken — and, for each process that had non-zero
//! utilization during that period, a **process sample** with its SM utilization percent and the
//! same kind of timestamp. Queries return the samples newer than a timestamp the caller passes
//! ("last seen"); none newer is `NotFound`.
//!
//! What this makes of them: each device sample closes an interval (from the previous device
//! sample's timestamp to its own); the interval's busy time, `length × util`, is split among the
//! processes with a sample in that interval in proportion to their SM utilization, and summed per
//! cgroup. One process alone on a GPU is charged exactly the GPU's busy time; two split it by
//! their activity; a process in no bound cgroup (or already gone) takes its part away from
//! nobody. A process that had no sample in an interval is charged nothing for it — unlike
//! charging each process sample for the gap since that process's previous sample, which charges
//! a process that was frozen for several periods, on its first sample after the thaw, for the
//! whole time it was frozen.
//!
//! [`SampledUsage::until_us`] is the end of the newest interval charged: the figure is complete up
//! to there. An interval is charged [`GRACE_US`] after its device sample arrived (so that process
//! samples published a little after the device sample still count), and `until` never lags the
//! query time by more
//! than [`MAX_LAG_US`], so that a GPU whose driver reports nothing new still lets the throttle
//! earn (a frozen cgroup produces no samples, and must still earn its thaw).

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::{Usage, UsageSource};
pub use crate::devices::samples::{DeviceSample, DriverError, ProcessSample, SampleDriver};

/// The longest span one device sample is taken to cover (a gap longer than that, after lost
/// samples or a clock step, is not charged beyond it).
pub const MAX_INTERVAL_US: u64 = 1_000_000;

/// A process sample stamped up to this long after a device sample belongs to the interval that
/// device sample closes (the two are taken together, but need not carry the same microsecond).
pub const MATCH_US: u64 = 10_000;

/// An interval is charged once the query time is this far past the arrival of its device sample
/// (and [`MATCH_US`] past its end).
pub const GRACE_US: u64 = 20_000;

/// `until` never lags the query time by more than this.
pub const MAX_LAG_US: u64 = 1_000_000;

/// Process samples kept while waiting for the device sample of their interval.
const MAX_EARLY: usize = 4096;

/// Gaps between device samples remembered to estimate the driver's sample period.
const GAPS: usize = 15;

/// What could not be charged to anyone, for diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SampledStats {
    /// GPU busy time charged to cgroups.
    pub charged: Duration,
    /// GPU busy time of processes in no known cgroup, or of intervals with no process sample.
    pub unattributed: Duration,
    /// Process samples that arrived after their interval was charged, or fell in no interval.
    pub late_samples: u64,
    /// Device samples not newer than the newest one seen (duplicates, or a clock gone back).
    pub stale_device_samples: u64,
}

/// One device interval waiting to be charged.
#[derive(Debug)]
struct Interval {
    start: u64,
    end: u64,
    util: u32,
    /// The query time of the first settle after it arrived.
    seen: Option<u64>,
    /// pid → timestamp → SM utilization (a sample read twice counts once).
    procs: BTreeMap<u32, BTreeMap<u64, u32>>,
}

impl Interval {
    /// Whether a process sample stamped `ts` belongs here.
    fn holds(&self, ts: u64) -> bool {
        self.start + MATCH_US < ts && ts <= self.end + MATCH_US
    }
}

/// The integrator for one GPU. See the module docs.
#[derive(Debug, Default)]
pub struct SampledUsage {
    /// The newest device sample's timestamp.
    last_device: Option<u64>,
    /// Recent gaps between device samples (µs).
    gaps: VecDeque<u64>,
    open: VecDeque<Interval>,
    /// Process samples newer than every open interval.
    early: Vec<ProcessSample>,
    /// Charged up to here.
    until: Option<u64>,
    /// Device samples are missing for idle periods (they are made from process samples).
    sparse: bool,
    busy_ns: HashMap<PathBuf, u64>,
    stats: SampledStats,
}

impl SampledUsage {
    /// An integrator that has seen nothing.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The "last seen" timestamp to ask the driver for device samples with.
    #[must_use]
    pub fn device_last_seen(&self) -> u64 {
        self.last_device.unwrap_or(0)
    }

    /// The "last seen" timestamp to ask the driver for process samples with: the end of what
    /// has been charged, so that samples of intervals still open are read again until they are
    /// charged (one published a little late still counts; one read twice counts once).
    #[must_use]
    pub fn process_last_seen(&self) -> u64 {
        self.until.map_or(0, |u| u + MATCH_US)
    }

    /// Up to when (CPU µs) every cgroup's figure is complete; `None` until the first device
    /// sample or the first [`SampledUsage::settle`].
    #[must_use]
    pub fn until_us(&self) -> Option<u64> {
        self.until
    }

    /// Cumulative GPU busy time of the cgroup at `dir` and those below it.
    #[must_use]
    pub fn busy(&self, dir: &Path) -> Duration {
        let ns = self
            .busy_ns
            .iter()
            .filter(|(d, _)| d.starts_with(dir))
            .fold(0u64, |a, (_, ns)| a.saturating_add(*ns));
        Duration::from_nanos(ns)
    }

    /// Folds the busy time of cgroups that no longer exist into their parents', deepest first,
    /// so that the map holds only cgroups that exist rather than every container that ever ran
    /// on the GPU, and every figure of a cgroup still there (which includes its descendants')
    /// stays exactly what it was.
    pub fn prune(&mut self, exists: &mut dyn FnMut(&Path) -> bool) {
        let mut gone: Vec<PathBuf> = self
            .busy_ns
            .keys()
            .filter(|dir| !exists(dir))
            .cloned()
            .collect();
        gone.sort_by_key(|dir| std::cmp::Reverse(dir.components().count()));
        for dir in gone {
            let Some(ns) = self.busy_ns.remove(&dir) else {
                continue;
            };
            if let Some(parent) = dir.parent() {
                let slot = self.busy_ns.entry(parent.to_owned()).or_default();
                *slot = slot.saturating_add(ns);
            }
        }
    }

    /// Cgroups with a figure of their own.
    #[must_use]
    pub fn cgroups(&self) -> usize {
        self.busy_ns.len()
    }

    /// What could not be charged, so far.
    #[must_use]
    pub fn stats(&self) -> SampledStats {
        self.stats
    }

    /// The driver's sample period as seen (the median recent gap), once a few were seen.
    #[must_use]
    pub fn sample_period_us(&self) -> Option<u64> {
        if self.gaps.len() < 3 {
            return None;
        }
        let mut gaps: Vec<u64> = self.gaps.iter().copied().collect();
        gaps.sort_unstable();
        Some(gaps[gaps.len() / 2])
    }

    /// Says that device samples exist only for periods in which some process was active (they
    /// are made from process samples): each then covers one sample period at most, not the gap
    /// since the previous one.
    pub fn set_sparse(&mut self, sparse: bool) {
        self.sparse = sparse;
    }

    /// The longest span one device sample is taken to cover now.
    fn longest(&self) -> u64 {
        let estimate = if self.sparse {
            // Gaps are whole periods or more: the shortest is the period.
            self.gaps
                .iter()
                .min()
                .copied()
                .filter(|_| self.gaps.len() >= 3)
        } else {
            // Gaps are periods, give or take a jitter: twice the usual one is a lost sample.
            self.sample_period_us().map(|p| 2 * p)
        };
        estimate.map_or(MAX_INTERVAL_US, |e| e.min(MAX_INTERVAL_US))
    }

    /// Takes device samples (in any order; those not newer than the newest seen are ignored).
    pub fn add_device(&mut self, samples: &[DeviceSample]) {
        let mut samples = samples.to_vec();
        samples.sort_by_key(|s| s.timestamp_us);
        for s in samples {
            let ts = s.timestamp_us;
            let Some(last) = self.last_device else {
                // The first sample only marks where the figures start.
                self.last_device = Some(ts);
                self.until = Some(self.until.map_or(ts, |u| u.max(ts)));
                continue;
            };
            if ts <= last {
                self.stats.stale_device_samples += 1;
                continue;
            }
            let gap = ts - last;
            // A gap much longer than the sample period means lost samples (or a clock step):
            // this sample covers one period, not the gap.
            let longest = self.longest();
            if self.sparse || gap <= 4 * self.sample_period_us().unwrap_or(gap) {
                if self.gaps.len() == GAPS {
                    self.gaps.pop_front();
                }
                self.gaps.push_back(gap);
            }
            self.last_device = Some(ts);
            let start = last
                .max(ts.saturating_sub(longest))
                .max(self.until.unwrap_or(0));
            if start >= ts {
                continue;
            }
            self.open.push_back(Interval {
                start,
                end: ts,
                util: s.util_percent.min(100),
                seen: None,
                procs: BTreeMap::new(),
            });
        }
        let early = std::mem::take(&mut self.early);
        self.add_processes(&early);
    }

    /// Takes process samples (in any order).
    pub fn add_processes(&mut self, samples: &[ProcessSample]) {
        let closed = self.until.map(|u| u + MATCH_US);
        for s in samples {
            let ts = s.timestamp_us;
            if closed.is_some_and(|c| ts <= c) {
                self.stats.late_samples += 1;
                continue;
            }
            if let Some(interval) = self.open.iter_mut().find(|i| i.holds(ts)) {
                interval
                    .procs
                    .entry(s.pid)
                    .or_default()
                    .insert(ts, s.sm_util_percent.min(100));
            } else if self.last_device.is_none_or(|d| ts > d + MATCH_US) {
                if self.early.len() == MAX_EARLY {
                    self.early.remove(0);
                    self.stats.late_samples += 1;
                }
                if !self.early.contains(s) {
                    self.early.push(*s);
                }
            } else {
                // Between intervals (a gap that was not charged).
                self.stats.late_samples += 1;
            }
        }
    }

    /// Charges every interval whose device sample arrived [`GRACE_US`] or more before `now_us`
    /// (the query's CPU time, µs; process samples published a little after the device sample
    /// still count), resolving each process to its cgroup directory with `cgroup_of`, and keeps
    /// `until` within [`MAX_LAG_US`] of `now_us`.
    pub fn settle(&mut self, now_us: u64, cgroup_of: &mut dyn FnMut(u32) -> Option<PathBuf>) {
        for interval in &mut self.open {
            interval.seen.get_or_insert(now_us);
        }
        while let Some(first) = self.open.front() {
            let seen = first.seen.unwrap_or(now_us);
            let due = seen.saturating_add(GRACE_US).max(first.end + MATCH_US);
            if due > now_us && first.end.saturating_add(MAX_LAG_US) > now_us {
                break;
            }
            let Some(interval) = self.open.pop_front() else {
                break;
            };
            self.charge(&interval, cgroup_of);
            self.until = Some(self.until.map_or(interval.end, |u| u.max(interval.end)));
        }
        // Before any sample, nothing is known (or owed) before the first query.
        let floor = self
            .until
            .map_or(now_us, |_| now_us.saturating_sub(MAX_LAG_US));
        if self.until.is_none_or(|u| u < floor) {
            self.until = Some(floor);
        }
        if let Some(closed) = self.until.map(|u| u + MATCH_US) {
            let before = self.early.len();
            self.early.retain(|s| s.timestamp_us > closed);
            self.stats.late_samples += (before - self.early.len()) as u64;
        }
    }

    fn charge(&mut self, interval: &Interval, cgroup_of: &mut dyn FnMut(u32) -> Option<PathBuf>) {
        let busy_ns =
            u128::from(interval.end - interval.start) * 1000 * u128::from(interval.util) / 100;
        let weights: Vec<(u32, u128)> = interval
            .procs
            .iter()
            .map(|(pid, samples)| (*pid, samples.values().map(|&u| u128::from(u)).sum()))
            .collect();
        let total: u128 = weights.iter().map(|(_, w)| w).sum();
        let mut unattributed = if total == 0 { busy_ns } else { 0 };
        for (pid, w) in weights {
            if let Some(part) = (busy_ns * w).checked_div(total) {
                let part = u64::try_from(part).unwrap_or(u64::MAX);
                match cgroup_of(pid) {
                    Some(dir) => {
                        let slot = self.busy_ns.entry(dir).or_default();
                        *slot = slot.saturating_add(part);
                        self.stats.charged += Duration::from_nanos(part);
                    }
                    None => unattributed += u128::from(part),
                }
            }
        }
        self.stats.unattributed +=
            Duration::from_nanos(u64::try_from(unattributed).unwrap_or(u64::MAX));
    }
}

/// Don't read the driver more often than this (once per throttle tick at the default period).
pub const REFRESH: Duration = Duration::from_millis(10);

/// How often the figures of cgroups that are gone are folded into their parents'.
pub const PRUNE: Duration = Duration::from_mins(1);

/// A [`UsageSource`] reading a [`SampleDriver`] into one [`SampledUsage`] per GPU.
pub struct SampledSource<D> {
    driver: D,
    gpus: HashMap<u32, GpuSamples>,
}

/// What has been read from one GPU.
#[derive(Default)]
struct GpuSamples {
    refreshed: Option<Instant>,
    pruned: Option<Instant>,
    samples: SampledUsage,
    /// The GPU has no device utilization samples: they are made from the process samples
    /// instead (each period's busy time the sum of its processes' SM utilization).
    no_device_samples: bool,
    /// An error other than "no new samples" was logged (once is enough).
    warned: bool,
}

impl GpuSamples {
    fn warn_once(&mut self, gpu: u32, what: &str, err: &DriverError) {
        if !self.warned {
            self.warned = true;
            tracing::warn!(gpu, "compute-share signal: reading {what}: {err}");
        }
    }
}

impl<D: SampleDriver> SampledSource<D> {
    /// A source reading `driver`.
    pub fn new(driver: D) -> Self {
        Self {
            driver,
            gpus: HashMap::new(),
        }
    }

    /// The driver.
    pub fn driver(&mut self) -> &mut D {
        &mut self.driver
    }

    /// What `gpu`'s integration could not charge, so far.
    pub fn stats(&self, gpu: u32) -> Option<SampledStats> {
        self.gpus.get(&gpu).map(|g| g.samples.stats())
    }

    fn refresh(&mut self, gpu: u32) {
        let (now, _) = self.driver.now();
        let usage = self.gpus.entry(gpu).or_default();
        if usage
            .refreshed
            .is_some_and(|t| now.saturating_duration_since(t) < REFRESH)
        {
            return;
        }
        usage.refreshed = Some(now);
        if !usage.no_device_samples {
            match self
                .driver
                .device_samples(gpu, usage.samples.device_last_seen())
            {
                Ok(samples) => usage.samples.add_device(&samples),
                Err(DriverError::NotSupported) => {
                    usage.no_device_samples = true;
                    usage.samples.set_sparse(true);
                }
                Err(e) => usage.warn_once(gpu, "device utilization samples", &e),
            }
        }
        let processes = match self
            .driver
            .process_samples(gpu, usage.samples.process_last_seen())
        {
            Ok(samples) => samples,
            Err(e) => {
                usage.warn_once(gpu, "process utilization samples", &e);
                Vec::new()
            }
        };
        if usage.no_device_samples {
            usage.samples.add_device(&device_from_processes(&processes));
        }
        usage.samples.add_processes(&processes);
        let driver = &self.driver;
        let mut seen: HashMap<u32, Option<PathBuf>> = HashMap::new();
        let (_, now_us) = driver.now();
        usage.samples.settle(now_us, &mut |pid| {
            seen.entry(pid)
                .or_insert_with(|| driver.cgroup_of(pid))
                .clone()
        });
        if usage
            .pruned
            .is_none_or(|t| now.saturating_duration_since(t) >= PRUNE)
        {
            usage.pruned = Some(now);
            usage.samples.prune(&mut |dir| driver.cgroup_exists(dir));
        }
    }
}

impl<D: SampleDriver> UsageSource for SampledSource<D> {
    fn busy(&mut self, gpu: u32, cgroup_dir: &Path) -> io::Result<Usage> {
        if !self.driver.cgroup_exists(cgroup_dir) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} is gone", cgroup_dir.display()),
            ));
        }
        self.refresh(gpu);
        let (now, now_us) = self.driver.now();
        let samples = self.gpus.get(&gpu).map(|u| &u.samples);
        let busy = samples.map_or(Duration::ZERO, |s| s.busy(cgroup_dir));
        // Samples are stamped with the CPU's clock in µs; the throttle counts in `Instant`s.
        let lag_us = samples
            .and_then(SampledUsage::until_us)
            .map_or(MAX_LAG_US, |u| now_us.saturating_sub(u));
        let until = now
            .checked_sub(Duration::from_micros(lag_us))
            .unwrap_or(now);
        Ok(Usage { busy, until })
    }
}

/// Device samples made from process samples, for GPUs without device utilization samples: one
/// per timestamp, busy the sum of its processes' SM utilization (at most 100 %).
pub(crate) fn device_from_processes(processes: &[ProcessSample]) -> Vec<DeviceSample> {
    let mut by_ts: BTreeMap<u64, u32> = BTreeMap::new();
    for p in processes {
        let util = by_ts.entry(p.timestamp_us).or_default();
        *util = (*util + p.sm_util_percent).min(100);
    }
    by_ts
        .into_iter()
        .map(|(timestamp_us, util_percent)| DeviceSample {
            timestamp_us,
            util_percent,
        })
        .collect()
}

#[cfg(test)]
mod tests;
