//! A simulated GPU that NVML reports on as NVML's reference documents it, for closed-loop tests
//! of the throttle with the real controller and the real usage integration, in simulated time.
//!
//! The GPU: each tenant cgroup runs one process that keeps `depth` of GPU work queued while it is
//! thawed (a matmul loop that launches a few kernels, then synchronizes); the GPU time-slices
//! between the processes with queued work (processor sharing), and keeps running what is queued
//! after a freeze, as a real GPU drains its queue.
//!
//! The driver's sampling, as NVML documents it: every sample period (replayed from an H200's
//! recording, or a fixed period with a little jitter) one device sample — the percent of the period during which any kernel ran — and one
//! process sample for each process that had non-zero utilization in that period (its SM
//! utilization percent), all stamped with the CPU's real time in µs; queries return the samples
//! newer than a "last seen" timestamp, none being `NotFound` (an empty list here).

#![expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "simulated times in µs as f64, percentages in 0..=100"
)]

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::{HashMap, VecDeque},
    io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::{
    DeviceReading, DeviceSignal, Usage, UsageSource,
    control::Cgroups,
    freezer::Freezer,
    sampled::{DeviceSample, DriverError, ProcessSample, SampleDriver},
    slots::SlotKernel,
};

/// How the simulated GPU and its driver behave.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SimConfig {
    /// The driver's sample period.
    pub period_us: u64,
    /// Each period is longer or shorter by up to this (pseudo-random).
    pub jitter_us: u64,
    /// The gaps between a real driver's samples, replayed in order (round and round) instead of
    /// `period_us` and `jitter_us`.
    pub periods_us: Option<&'static [u64]>,
    /// GPU work a thawed process keeps queued.
    pub depth_us: f64,
    /// With a gap: a thawed process queues `depth_us` at once, waits for it to drain, and
    /// queues the next batch this long after (a loop that synchronizes: the GPU idles in
    /// between). Zero: it keeps its queue full.
    pub host_gap_us: u64,
    /// Samples become visible to queries this long after their timestamp.
    pub publish_delay_us: u64,
    /// Process samples are stamped this long after the device sample of the same period.
    pub process_offset_us: u64,
    /// Whether the driver keeps device utilization samples.
    pub device_samples: bool,
    /// Process samples are taken on a rhythm of their own, this long after each device sample,
    /// each over the span since the previous process sample (not the device sample's span):
    /// what a driver that samples processes separately gives. `None`: over the device's span.
    pub process_window_lag_us: Option<u64>,
    /// With `process_window_lag_us`: the n-th process's samples come `n ×` this later still.
    pub process_stagger_us: u64,
    /// The SM clock's rise when the GPU is partly idle, as a fraction of the clock at full duty
    /// (an H200 at its power cap: 1,470 MHz busy, 1,980 MHz held partly idle, 0.35).
    pub boost: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            period_us: 166_667,
            jitter_us: 2_000,
            periods_us: None,
            depth_us: 2_000.0,
            host_gap_us: 0,
            publish_delay_us: 0,
            process_offset_us: 0,
            device_samples: true,
            process_window_lag_us: None,
            process_stagger_us: 0,
            boost: 0.0,
        }
    }
}

impl SimConfig {
    /// The H200 as gpu-check recorded its NVML streams (2026-11-28, driver 580.159.04,
    /// `xtask/gpu-check/recordings/`): the gaps between its device samples replayed in order
    /// (median 199,992 µs, ± 3 ms around it mostly, 191–209 ms at the extremes), samples read
    /// 15 ms after their timestamps, process samples stamped with the device sample of their
    /// period; batches of 3 ms of work 0.1 ms apart (96.8 % busy at full duty: the recorded
    /// matmul loop kept it 96.7 % busy alone), and the clock rising 35 % when the GPU is held
    /// partly idle (1,980 against 1,470 MHz at its power cap).
    pub(crate) fn h200() -> Self {
        Self {
            period_us: 200_000,
            jitter_us: 0,
            periods_us: Some(h200_periods()),
            depth_us: 3_000.0,
            host_gap_us: 100,
            publish_delay_us: 15_000,
            process_offset_us: 0,
            device_samples: true,
            process_window_lag_us: None,
            process_stagger_us: 0,
            boost: 0.35,
        }
    }

    /// The model the bucket mode was calibrated on before the recording (from the figures of
    /// `docs/gpu-check.md` alone): a sixth of a second between samples with 2 ms of jitter, and
    /// process samples on a rhythm of their own a quarter period after the device's, which
    /// makes the bucket mode's pairs miss by as much as they did on the H200 (up to 12.6
    /// points).
    pub(crate) fn h200_as_first_read() -> Self {
        Self {
            period_us: 166_667,
            jitter_us: 2_000,
            periods_us: None,
            depth_us: 2_000.0,
            host_gap_us: 0,
            publish_delay_us: 5_000,
            process_window_lag_us: Some(41_667),
            ..Self::h200()
        }
    }
}

/// The gaps between the recorded H200's device samples, µs (`nvml.py periods` of the recording).
fn h200_periods() -> &'static [u64] {
    static PERIODS: std::sync::LazyLock<Vec<u64>> = std::sync::LazyLock::new(|| {
        include_str!("gpu_sim/h200-periods.txt")
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    });
    &PERIODS
}

/// NVML's timestamps are the CPU's real time: somewhere in 2025.
const EPOCH_US: u64 = 1_750_000_000_000_000;
/// Samples the driver keeps.
const BUFFER: usize = 120;

#[derive(Debug)]
struct SimProcess {
    pid: u32,
    dir: PathBuf,
    frozen: bool,
    queue_us: f64,
    busy_us: f64,
    busy_in_period_us: f64,
    /// Busy since its last process sample (with `process_window_lag_us`).
    busy_in_window_us: f64,
    /// Work done: GPU time scaled by the clock it ran at (what a matmul count measures).
    work: f64,
    /// Never submits work.
    idle: bool,
    /// Host time since its last batch drained (with a host gap).
    waited_us: u64,
    /// Own-rhythm sampling: when its next process sample is due, and when its last one was.
    next_sample_us: Option<u64>,
    last_sample_us: u64,
}

/// The simulated GPU, its processes and its driver's sample buffers.
#[derive(Debug)]
pub(crate) struct SimGpu {
    config: SimConfig,
    base: Instant,
    t_us: u64,
    period_start_us: u64,
    next_sample_us: u64,
    any_busy_in_period_us: f64,
    rng: u64,
    processes: Vec<SimProcess>,
    device: VecDeque<DeviceSample>,
    process: VecDeque<ProcessSample>,
    /// The GPU's recent duty (an average over about 50 ms), which sets its clock.
    duty: f64,
    /// Samples taken (the next replayed period's index).
    samples: usize,
}

impl SimGpu {
    pub(crate) fn new(config: SimConfig) -> Self {
        Self {
            config,
            base: Instant::now(),
            t_us: 0,
            period_start_us: 0,
            // The driver's sampling is not in phase with anything else.
            next_sample_us: config.period_us / 3,
            any_busy_in_period_us: 0.0,
            rng: 0x2545_f491_4f6c_dd1d,
            processes: Vec::new(),
            device: VecDeque::new(),
            process: VecDeque::new(),
            duty: 1.0,
            samples: 0,
        }
    }

    /// Adds a process that is always busy while thawed, in cgroup `dir`.
    pub(crate) fn add(&mut self, pid: u32, dir: &str) {
        self.processes.push(SimProcess {
            pid,
            dir: dir.into(),
            frozen: false,
            queue_us: 0.0,
            busy_us: 0.0,
            busy_in_period_us: 0.0,
            busy_in_window_us: 0.0,
            work: 0.0,
            idle: false,
            waited_us: 0,
            next_sample_us: None,
            last_sample_us: 0,
        });
    }

    /// Adds a process that never submits work, in cgroup `dir`.
    pub(crate) fn add_idle(&mut self, pid: u32, dir: &str) {
        self.add(pid, dir);
        if let Some(p) = self.processes.last_mut() {
            p.idle = true;
        }
    }

    /// The work the processes of `dir` have done, in µs of GPU time at the full-duty clock.
    pub(crate) fn work(&self, dir: &str) -> f64 {
        self.processes
            .iter()
            .filter(|p| p.dir == Path::new(dir))
            .map(|p| p.work)
            .sum()
    }

    /// The GPU time the processes of `dir` have had.
    pub(crate) fn gpu_time(&self, dir: &str) -> Duration {
        let us: f64 = self
            .processes
            .iter()
            .filter(|p| p.dir == Path::new(dir))
            .map(|p| p.busy_us)
            .sum();
        Duration::from_secs_f64(us / 1e6)
    }

    pub(crate) fn now(&self) -> Instant {
        self.base + Duration::from_micros(self.t_us)
    }

    fn random(&mut self) -> u64 {
        // xorshift64: deterministic, so a failing run can be replayed.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// Runs the GPU for `dt_us`.
    pub(crate) fn step(&mut self, dt_us: u64) {
        let dt = dt_us as f64;
        let gap = self.config.host_gap_us;
        for p in &mut self.processes {
            if p.frozen || p.idle {
                continue;
            }
            if gap == 0 {
                // A thawed process keeps its queue full.
                p.queue_us = self.config.depth_us;
            } else if p.queue_us <= 0.0 {
                // Its host waits out the gap after a batch drains, then queues the next.
                if p.waited_us >= gap {
                    p.queue_us = self.config.depth_us;
                    p.waited_us = 0;
                } else {
                    p.waited_us += dt_us;
                }
            }
        }
        let ready = self.processes.iter().filter(|p| p.queue_us > 0.0).count();
        let clock = 1.0 + self.config.boost * (1.0 - self.duty);
        let mut busy = 0.0;
        if ready > 0 {
            let slice = dt / ready as f64;
            for p in self.processes.iter_mut().filter(|p| p.queue_us > 0.0) {
                let ran = slice.min(p.queue_us);
                p.queue_us -= ran;
                p.busy_us += ran;
                p.busy_in_period_us += ran;
                p.busy_in_window_us += ran;
                p.work += ran * clock;
                busy += ran;
            }
            self.any_busy_in_period_us += busy;
        }
        let alpha = 1.0 - (-dt / 50_000.0).exp();
        self.duty += alpha * (busy / dt - self.duty);
        self.t_us += dt_us;
        if self.t_us >= self.next_sample_us {
            self.sample();
        }
        self.sample_processes();
    }

    /// The driver's process samples on their own rhythm: each over the span since the last.
    fn sample_processes(&mut self) {
        let ts = EPOCH_US + self.t_us;
        let t = self.t_us;
        for p in &mut self.processes {
            if p.next_sample_us.is_none_or(|at| t < at) {
                continue;
            }
            p.next_sample_us = None;
            let length = (t - p.last_sample_us) as f64;
            if p.busy_in_window_us > 0.0 && length > 0.0 {
                self.process.push_back(ProcessSample {
                    pid: p.pid,
                    timestamp_us: ts,
                    sm_util_percent: (100.0 * p.busy_in_window_us / length)
                        .round()
                        .clamp(0.0, 100.0) as u32,
                });
            }
            p.busy_in_window_us = 0.0;
            p.last_sample_us = t;
        }
        while self.process.len() > BUFFER * 4 {
            self.process.pop_front();
        }
    }

    /// The driver takes its samples for the period that just ended.
    fn sample(&mut self) {
        let length = (self.t_us - self.period_start_us) as f64;
        let ts = EPOCH_US + self.t_us;
        let percent = |busy: f64| (100.0 * busy / length).round().clamp(0.0, 100.0) as u32;
        if self.config.device_samples {
            self.device.push_back(DeviceSample {
                timestamp_us: ts,
                util_percent: percent(self.any_busy_in_period_us),
            });
        }
        let own_rhythm = self.config.process_window_lag_us;
        for p in &mut self.processes {
            if own_rhythm.is_none() && p.busy_in_period_us > 0.0 {
                self.process.push_back(ProcessSample {
                    pid: p.pid,
                    timestamp_us: ts + self.config.process_offset_us,
                    sm_util_percent: percent(p.busy_in_period_us),
                });
            }
            p.busy_in_period_us = 0.0;
        }
        if let Some(lag) = own_rhythm {
            // Each process's samples keep a phase of their own (set by its context's creation).
            for (i, p) in self.processes.iter_mut().enumerate() {
                p.next_sample_us =
                    Some(self.t_us + lag + i as u64 * self.config.process_stagger_us);
            }
        }
        while self.device.len() > BUFFER {
            self.device.pop_front();
        }
        while self.process.len() > BUFFER * 4 {
            self.process.pop_front();
        }
        self.any_busy_in_period_us = 0.0;
        self.period_start_us = self.t_us;
        if let Some(periods) = self.config.periods_us.filter(|p| !p.is_empty()) {
            self.next_sample_us = self.t_us + periods[self.samples % periods.len()];
            self.samples += 1;
            return;
        }
        let jitter = self.config.jitter_us;
        let offset = if jitter == 0 {
            0
        } else {
            self.random() % (2 * jitter + 1)
        };
        self.next_sample_us = self.t_us + self.config.period_us + offset - jitter;
    }

    fn visible(&self, ts: u64) -> bool {
        ts + self.config.publish_delay_us <= EPOCH_US + self.t_us
    }
}

/// The simulated GPU shared between the driver the usage source reads and the test that runs it.
#[derive(Debug, Clone)]
pub(crate) struct SimHandle(pub Arc<Mutex<SimGpu>>);

impl SimHandle {
    pub(crate) fn new(config: SimConfig) -> Self {
        Self(Arc::new(Mutex::new(SimGpu::new(config))))
    }

    pub(crate) fn gpu(&self) -> std::sync::MutexGuard<'_, SimGpu> {
        self.0.locked()
    }
}

impl SampleDriver for SimHandle {
    fn device_samples(
        &mut self,
        _gpu: u32,
        last_seen_us: u64,
    ) -> Result<Vec<DeviceSample>, DriverError> {
        let gpu = self.gpu();
        if !gpu.config.device_samples {
            return Err(DriverError::NotSupported);
        }
        Ok(gpu
            .device
            .iter()
            .filter(|s| s.timestamp_us > last_seen_us && gpu.visible(s.timestamp_us))
            .copied()
            .collect())
    }

    fn process_samples(
        &mut self,
        _gpu: u32,
        last_seen_us: u64,
    ) -> Result<Vec<ProcessSample>, DriverError> {
        let gpu = self.gpu();
        Ok(gpu
            .process
            .iter()
            .filter(|s| s.timestamp_us > last_seen_us && gpu.visible(s.timestamp_us))
            .copied()
            .collect())
    }

    fn now(&self) -> (Instant, u64) {
        let gpu = self.gpu();
        (gpu.now(), EPOCH_US + gpu.t_us)
    }

    fn cgroup_of(&self, pid: u32) -> Option<PathBuf> {
        self.gpu()
            .processes
            .iter()
            .find(|p| p.pid == pid)
            .map(|p| p.dir.clone())
    }

    fn cgroup_exists(&self, dir: &Path) -> bool {
        self.gpu().processes.iter().any(|p| p.dir == dir)
    }
}

/// The integration the agent used before: each process sample charged `sm_util ×` the time since
/// that process's previous sample (at most a second), with the throttle earning by its own clock
/// (`until` = now). Kept to show what the closed-loop test catches.
pub(crate) struct PerPidSpans {
    sim: SimHandle,
    refreshed: Option<Instant>,
    last_timestamp: u64,
    pid_timestamp: HashMap<u32, u64>,
    busy_us: HashMap<PathBuf, u64>,
}

impl PerPidSpans {
    pub(crate) fn new(sim: SimHandle) -> Self {
        Self {
            sim,
            refreshed: None,
            last_timestamp: 0,
            pid_timestamp: HashMap::new(),
            busy_us: HashMap::new(),
        }
    }
}

impl UsageSource for PerPidSpans {
    fn busy(&mut self, gpu: u32, cgroup_dir: &Path) -> io::Result<Usage> {
        let (now, _) = self.sim.now();
        if self
            .refreshed
            .is_none_or(|t| now.saturating_duration_since(t) >= Duration::from_millis(50))
        {
            self.refreshed = Some(now);
            let samples = self
                .sim
                .process_samples(gpu, self.last_timestamp)
                .unwrap_or_default();
            for s in samples {
                let since = self
                    .pid_timestamp
                    .get(&s.pid)
                    .copied()
                    .unwrap_or(self.last_timestamp);
                let span = if since == 0 {
                    0
                } else {
                    s.timestamp_us.saturating_sub(since).min(1_000_000)
                };
                self.pid_timestamp.insert(s.pid, s.timestamp_us);
                self.last_timestamp = self.last_timestamp.max(s.timestamp_us);
                if span == 0 || s.sm_util_percent == 0 {
                    continue;
                }
                if let Some(dir) = self.sim.cgroup_of(s.pid) {
                    *self.busy_us.entry(dir).or_default() +=
                        span * u64::from(s.sm_util_percent) / 100;
                }
            }
        }
        let total: u64 = self
            .busy_us
            .iter()
            .filter(|(d, _)| d.starts_with(cgroup_dir))
            .map(|(_, us)| *us)
            .sum();
        Ok(Usage {
            busy: Duration::from_micros(total),
            until: now,
        })
    }
}

/// The throttle's kernel side on the simulated GPU: usage from `source`, freezing the simulated
/// processes.
pub(crate) struct SimCgroups<S> {
    pub sim: SimHandle,
    pub source: S,
}

impl<S: UsageSource + ?Sized> Cgroups for SimCgroups<Box<S>> {
    fn busy(&mut self, gpu: u32, dir: &Path) -> io::Result<Usage> {
        self.source.busy(gpu, dir)
    }
}

impl<S: DeviceSignal + ?Sized> SlotKernel for SimCgroups<Box<S>> {
    fn read(&mut self, gpu: u32, cgroups: &[&Path]) -> io::Result<DeviceReading> {
        self.source.read(gpu, cgroups)
    }
}

impl<S: ?Sized> Freezer for SimCgroups<Box<S>> {
    fn set_frozen(&mut self, dir: &Path, frozen: bool) -> io::Result<()> {
        let mut gpu = self.sim.gpu();
        let mut found = false;
        for p in gpu.processes.iter_mut().filter(|p| p.dir == dir) {
            p.frozen = frozen;
            found = true;
        }
        if found {
            Ok(())
        } else {
            Err(io::ErrorKind::NotFound.into())
        }
    }
}

#[cfg(test)]
mod tests;
