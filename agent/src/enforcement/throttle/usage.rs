//! Where the throttle's usage signal comes from.

pub mod device;
pub mod sampled;

use std::{
    io,
    path::Path,
    time::{Duration, Instant},
};

use crate::devices::GpuBackend;

/// A cgroup's cumulative busy time on one GPU, complete up to `until`.
///
/// A signal that is sampled (NVML) knows a cgroup's use only up to its newest sample, not up to
/// now: `until` says where the figure ends, so the throttle earns a share of exactly the span the
/// busy time covers (earning up to now while paying up to the last sample charges late use
/// against the wrong interval, and the credit cap then throws the difference away).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Cumulative busy time, monotonic over the life of the cgroup. One GPU fully busy for one
    /// second is one second.
    pub busy: Duration,
    /// The time up to which `busy` is complete (at most now; never moves backwards for one
    /// source).
    pub until: Instant,
}

/// Cumulative busy time of a cgroup on one GPU: the throttle's usage signal.
///
/// On real GPUs this is the GPU's busy time (NVML's device utilization samples) apportioned among
/// the processes active in each sample period and summed per cgroup (see [`sampled`]);
/// [`CpuTimeUsage`] stands in for it with mock devices.
pub trait UsageSource: Send {
    /// The cumulative busy time of the cgroup at `cgroup_dir` on `gpu`, and up to when it is
    /// complete.
    ///
    /// # Errors
    /// The signal can't be read; [`io::ErrorKind::NotFound`] when the cgroup is gone (the
    /// throttle then drops it).
    fn busy(&mut self, gpu: u32, cgroup_dir: &Path) -> io::Result<Usage>;
}

/// A span of one GPU's time and how much of it the GPU was busy, whoever ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusyInterval {
    /// Where the span starts.
    pub start: Instant,
    /// Where it ends (after `start`).
    pub end: Instant,
    /// Busy time within it (at most `end − start` from a GPU; the CPU-time stand-in may show a
    /// little more or less, as the kernel accounts it late).
    pub busy: Duration,
}

/// What a [`DeviceSignal`] read of one GPU brings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceReading {
    /// Spans of the GPU's time closed since the last read, oldest first, not overlapping.
    pub intervals: Vec<BusyInterval>,
    /// For each cgroup the read was asked about, in order: whether its processes showed GPU
    /// activity in those spans (per-process samples, or the cgroup's own CPU time).
    pub active: Vec<bool>,
    /// Indices of the cgroups asked about that no longer exist.
    pub gone: Vec<usize>,
    /// When the signal is expected to close its next span (the driver's sample phase), where the
    /// signal has a rhythm of its own; `None` where the reader sets it (GPM, CPU time).
    pub next_close: Option<Instant>,
    /// The signal's usual span (the driver's sample period), once known.
    pub period: Option<Duration>,
    /// The GPU keeps no utilization samples of any kind (a MIG instance under NVML): `intervals`
    /// is empty and `active` comes from the cgroups' own CPU time. The slot throttle then holds
    /// shares by time alone (see `slots.rs`).
    pub time_only: bool,
}

/// How a GPU's signal has behaved: what the loop sees, exported for operators.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SignalHealth {
    /// The usual span between two samples (median of the recent ones).
    pub period: Option<Duration>,
    /// How far recent spans stray from `period` (the largest recent deviation).
    pub jitter: Option<Duration>,
    /// Samples read: device spans closed so far.
    pub samples: u64,
    /// Samples that arrived for time already closed (late or duplicate).
    pub late_samples: u64,
    /// Spans longer than twice the period (samples lost), counted once each.
    pub gaps: u64,
    /// GPU busy time that fell in no one's slot (filled in by the throttle).
    pub unattributed: Duration,
    /// The slowest read of the signal so far (filled in by the throttle): a slot's switch
    /// waits for the read before it.
    pub read_max: Duration,
    /// The mean read of the signal (filled in by the throttle).
    pub read_mean: Duration,
    /// The GPU keeps no utilization samples (a MIG instance under NVML): shares on it are held
    /// by time alone, and no busy time is measured.
    pub time_only: bool,
}

/// The GPU's own busy time, whoever ran: the signal of the exclusive-slot throttle, which knows
/// who held each slot and so needs no per-process split.
///
/// On real GPUs it is NVML's device utilization samples (with process samples only to tell which
/// cgroups are active); [`CpuTimeSignal`] stands in for it with mock devices.
pub trait DeviceSignal: Send {
    /// Spans of `gpu`'s busy time closed since the last read, and which of `cgroups` (cgroup v2
    /// directories) were active in them.
    ///
    /// # Errors
    /// The signal can't be read at all (a cgroup that is gone is reported in
    /// [`DeviceReading::gone`], not as an error).
    fn read(&mut self, gpu: u32, cgroups: &[&Path]) -> io::Result<DeviceReading>;

    /// How `gpu`'s signal has behaved so far; `None` before its first read.
    fn health(&self, gpu: u32) -> Option<SignalHealth>;
}

/// The slot throttle's signal for `backend`'s GPUs: the driver's device samples where the backend
/// has them (NVML), the CPU-time stand-in otherwise (mock devices).
#[must_use]
pub fn device_signal_for(backend: &dyn GpuBackend, cgroup_root: &Path) -> Box<dyn DeviceSignal> {
    match backend.sample_driver(cgroup_root) {
        Some(driver) => Box::new(device::SampledDevice::new(driver)),
        None => Box::new(CpuTimeSignal::default()),
    }
}

/// The usage signal for `backend`'s GPUs, a source of its own for each reader (sources keep
/// per-reader state): the driver's samples apportioned by process activity where the backend has
/// them (NVML), the CPU-time stand-in otherwise (mock devices).
#[must_use]
pub fn usage_for(backend: &dyn GpuBackend, cgroup_root: &Path) -> Box<dyn UsageSource> {
    match backend.sample_driver(cgroup_root) {
        Some(driver) => Box::new(sampled::SampledSource::new(driver)),
        None => Box::new(CpuTimeUsage),
    }
}

/// A stand-in usage signal for testing the mechanism: the cgroup's CPU time (`usage_usec` in
/// `<dir>/cpu.stat`), one CPU counted as one GPU, complete up to now.
///
/// It ignores `gpu` (every GPU of the cgroup sees the same CPU time) and measures nothing about
/// a real GPU; it exists so that the freeze/thaw duty cycle can be tested end to end with mock
/// devices and CPU-bound workloads, where a single-threaded spinner left alone is fraction 1.0.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuTimeUsage;

impl UsageSource for CpuTimeUsage {
    fn busy(&mut self, _gpu: u32, cgroup_dir: &Path) -> io::Result<Usage> {
        let text = std::fs::read_to_string(cgroup_dir.join("cpu.stat"))?;
        let until = Instant::now();
        let busy = usage_usec(&text)
            .map(Duration::from_micros)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("no usage_usec in {}/cpu.stat", cgroup_dir.display()),
                )
            })?;
        Ok(Usage { busy, until })
    }
}

/// The device signal's stand-in with mock devices: a GPU's busy time is the CPU time of the
/// cgroups asked about (`usage_usec` in their `cpu.stat`), one CPU counted as one GPU, in spans
/// from one read to the next. Like [`CpuTimeUsage`], it tests the mechanism and says nothing about
/// a real GPU.
#[derive(Debug, Default)]
pub struct CpuTimeSignal {
    gpus: std::collections::HashMap<u32, CpuGpu>,
}

#[derive(Debug, Default)]
struct CpuGpu {
    last: Option<Instant>,
    usage: std::collections::HashMap<std::path::PathBuf, Duration>,
    health: SignalHealth,
}

/// A cgroup counts as active when it ran at least this fraction of a span.
const CPU_ACTIVE_FRACTION: f64 = 0.01;

impl DeviceSignal for CpuTimeSignal {
    fn read(&mut self, gpu: u32, cgroups: &[&Path]) -> io::Result<DeviceReading> {
        let state = self.gpus.entry(gpu).or_default();
        let now = Instant::now();
        let mut reading = DeviceReading {
            active: vec![false; cgroups.len()],
            ..DeviceReading::default()
        };
        let mut busy = Duration::ZERO;
        let mut seen = std::collections::HashMap::new();
        let span = state.last.map(|last| now.saturating_duration_since(last));
        for (i, dir) in cgroups.iter().enumerate() {
            let usage = match CpuTimeUsage.busy(gpu, dir) {
                Ok(u) => u.busy,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    reading.gone.push(i);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let before = state.usage.get(*dir).copied();
            seen.insert(dir.to_path_buf(), usage);
            if let (Some(before), Some(span)) = (before, span) {
                let used = usage.saturating_sub(before);
                busy += used;
                reading.active[i] = used.as_secs_f64() >= CPU_ACTIVE_FRACTION * span.as_secs_f64();
            }
        }
        state.usage = seen;
        if let (Some(start), Some(span)) = (state.last, span)
            && !span.is_zero()
        {
            // Not capped at the span: the kernel accounts a running task's time at its scheduler
            // ticks, so one read may show a little more than the span and the next less.
            reading.intervals.push(BusyInterval {
                start,
                end: now,
                busy,
            });
            state.health.samples += 1;
        }
        state.last = Some(now);
        Ok(reading)
    }

    fn health(&self, gpu: u32) -> Option<SignalHealth> {
        self.gpus.get(&gpu).map(|g| g.health)
    }
}

/// The `usage_usec` value of a `cpu.stat` text.
fn usage_usec(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("usage_usec "))
        .and_then(|value| value.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_usage_usec() {
        let text = "usage_usec 730249\nuser_usec 730249\nsystem_usec 0\n";
        assert_eq!(usage_usec(text), Some(730_249));
        assert_eq!(usage_usec("user_usec 5\n"), None);
        assert_eq!(usage_usec("usage_usec x\n"), None);
    }

    #[test]
    fn missing_cgroup_is_not_found() {
        let err = CpuTimeUsage
            .busy(0, Path::new("/nonexistent/gpuwarden-throttle"))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn cpu_time_is_complete_up_to_now() {
        let dir = std::env::temp_dir().join(format!("gpuwarden-usage-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cpu.stat"), "usage_usec 1500\n").unwrap();
        let before = Instant::now();
        let usage = CpuTimeUsage.busy(0, &dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(usage.busy, Duration::from_micros(1500));
        assert!(usage.until >= before && usage.until <= Instant::now());
    }
}
