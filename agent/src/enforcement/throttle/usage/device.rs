//! The exclusive-slot throttle's signal on a GPU whose driver samples utilization (NVML): the
//! device samples as spans of the GPU's busy time, and the process samples only to tell which
//! cgroups are active.
//!
//! Each device sample closes a span from the previous one's timestamp to its own, busy
//! `length × util`; no per-process split is made (the slot throttle knows who held the GPU). The
//! timestamps (the CPU's real-time µs, see `devices/nvml.rs`) become `Instant`s through the
//! driver's `now()`, which gives both clocks at once. The driver's sample phase is reported as
//! [`DeviceReading::next_close`], so that slot boundaries can be put where the samples fall.
//!
//! A GPU that keeps neither kind of sample (a MIG instance: NVML gives no utilization samples on
//! MIG handles) is read [`DeviceReading::time_only`]: no busy time, and each cgroup's activity
//! from its own CPU time, as with mock devices. One with device samples and no process samples
//! has its busy time from the former and its cgroups' activity from their CPU time.

use std::{
    collections::{HashMap, VecDeque},
    io,
    path::Path,
    time::Duration,
};

use super::{BusyInterval, CpuTimeSignal, DeviceReading, DeviceSignal, SignalHealth, sampled};
use crate::devices::samples::{DriverError, SampleDriver};

/// Gaps between device samples remembered to estimate the sample period and its jitter.
const GAPS: usize = 15;

/// The longest span one device sample is taken to cover before its period is known.
const MAX_SPAN_US: u64 = 1_000_000;

/// A [`DeviceSignal`] reading a [`SampleDriver`] (NVML on real GPUs, a model in tests).
pub struct SampledDevice<D> {
    driver: D,
    gpus: HashMap<u32, GpuState>,
    /// Whether the cgroups on a GPU without samples are active.
    cpu: CpuTimeSignal,
}

#[derive(Debug, Default)]
struct GpuState {
    /// The newest device sample's timestamp (µs).
    last_device_us: Option<u64>,
    /// The newest process sample's timestamp (µs).
    last_process_us: u64,
    gaps: VecDeque<u64>,
    health: SignalHealth,
    /// The GPU keeps no device samples: they are made from its process samples.
    no_device_samples: bool,
    /// The GPU keeps no process samples: its cgroups' activity comes from their CPU time (and
    /// with no device samples either, it is read time only).
    no_process_samples: bool,
    /// An error other than "no new samples" was logged (once is enough).
    warned: bool,
}

impl GpuState {
    fn median_gap(&self) -> Option<u64> {
        if self.gaps.len() < 3 {
            return None;
        }
        let mut gaps: Vec<u64> = self.gaps.iter().copied().collect();
        gaps.sort_unstable();
        Some(gaps[gaps.len() / 2])
    }

    /// The samples `read` brought (`what`, for the log), `None` where the GPU keeps no such
    /// samples; any other failure is logged once and reads as none.
    fn samples<T>(
        &mut self,
        gpu: u32,
        what: &str,
        read: Result<Vec<T>, DriverError>,
    ) -> Option<Vec<T>> {
        match read {
            Ok(samples) => Some(samples),
            Err(DriverError::NotSupported) => None,
            Err(e) => {
                self.warn_once(gpu, what, &e);
                Some(Vec::new())
            }
        }
    }

    fn warn_once(&mut self, gpu: u32, what: &str, err: &DriverError) {
        if !self.warned {
            self.warned = true;
            tracing::warn!(gpu, "compute-share signal: reading {what}: {err}");
        }
    }

    /// Takes device samples (any order), returning the spans they close, in µs.
    fn close(&mut self, mut samples: Vec<sampled::DeviceSample>) -> Vec<(u64, u64, u64)> {
        samples.sort_by_key(|s| s.timestamp_us);
        let mut spans = Vec::new();
        for s in samples {
            let ts = s.timestamp_us;
            let Some(last) = self.last_device_us else {
                // The first sample only marks where the spans start.
                self.last_device_us = Some(ts);
                continue;
            };
            if ts <= last {
                self.health.late_samples += 1;
                continue;
            }
            let gap = ts - last;
            let period = self.median_gap();
            // A gap far longer than the period is lost samples: the sample covers one period.
            let longest = period.map_or(MAX_SPAN_US, |p| (2 * p).min(MAX_SPAN_US));
            if period.is_some_and(|p| gap > 2 * p) {
                self.health.gaps += 1;
            } else {
                if self.gaps.len() == GAPS {
                    self.gaps.pop_front();
                }
                self.gaps.push_back(gap);
            }
            self.last_device_us = Some(ts);
            let start = last.max(ts - gap.min(longest));
            let busy_us = (ts - start) * u64::from(s.util_percent.min(100)) / 100;
            spans.push((start, ts, busy_us));
            self.health.samples += 1;
        }
        self.health.period = self.median_gap().map(Duration::from_micros);
        self.health.jitter = self.median_gap().map(|p| {
            let worst = self.gaps.iter().map(|g| g.abs_diff(p)).max().unwrap_or(0);
            Duration::from_micros(worst)
        });
        spans
    }
}

impl<D: SampleDriver> SampledDevice<D> {
    /// A signal reading `driver`.
    pub fn new(driver: D) -> Self {
        Self {
            driver,
            gpus: HashMap::new(),
            cpu: CpuTimeSignal::default(),
        }
    }
}

impl<D: SampleDriver> DeviceSignal for SampledDevice<D> {
    fn read(&mut self, gpu: u32, cgroups: &[&Path]) -> io::Result<DeviceReading> {
        let mut reading = DeviceReading {
            active: vec![false; cgroups.len()],
            ..DeviceReading::default()
        };
        for (i, dir) in cgroups.iter().enumerate() {
            if !self.driver.cgroup_exists(dir) {
                reading.gone.push(i);
            }
        }
        let state = self.gpus.entry(gpu).or_default();
        let device = if state.no_device_samples {
            Vec::new()
        } else {
            let read = self
                .driver
                .device_samples(gpu, state.last_device_us.unwrap_or(0));
            let samples = state.samples(gpu, "device utilization samples", read);
            state.no_device_samples = samples.is_none();
            samples.unwrap_or_default()
        };
        let processes = if state.no_process_samples {
            Vec::new()
        } else {
            let read = self.driver.process_samples(gpu, state.last_process_us);
            let samples = state.samples(gpu, "process utilization samples", read);
            state.no_process_samples = samples.is_none();
            samples.unwrap_or_default()
        };
        if state.no_process_samples {
            // No process to tell who was active: the cgroups' own CPU time tells.
            reading.active = self.cpu.read(gpu, cgroups)?.active;
            if state.no_device_samples {
                if !state.health.time_only {
                    state.health.time_only = true;
                    tracing::info!(
                        gpu,
                        "compute-share signal: the GPU keeps no utilization samples (a MIG \
                         instance); shares on it are held by time alone"
                    );
                }
                reading.time_only = true;
                return Ok(reading);
            }
        }
        for p in processes.iter().filter(|p| p.sm_util_percent > 0) {
            state.last_process_us = state.last_process_us.max(p.timestamp_us);
            let Some(dir) = self.driver.cgroup_of(p.pid) else {
                continue;
            };
            for (i, cgroup) in cgroups.iter().enumerate() {
                if dir.starts_with(cgroup) {
                    reading.active[i] = true;
                }
            }
        }
        let device = if state.no_device_samples {
            sampled::device_from_processes(&processes)
        } else {
            device
        };
        let spans = state.close(device);
        let (now, now_us) = self.driver.now();
        // Samples are stamped with the CPU's real-time clock in µs; the loop counts in `Instant`s.
        let at = |us: u64| {
            if us <= now_us {
                now.checked_sub(Duration::from_micros(now_us - us))
                    .unwrap_or(now)
            } else {
                now + Duration::from_micros(us - now_us)
            }
        };
        reading.intervals = spans
            .into_iter()
            .map(|(start, end, busy)| BusyInterval {
                start: at(start),
                end: at(end),
                busy: Duration::from_micros(busy),
            })
            .collect();
        reading.period = state.health.period;
        reading.next_close = state
            .last_device_us
            .zip(state.median_gap())
            .map(|(last, p)| at(last + p));
        Ok(reading)
    }

    fn health(&self, gpu: u32) -> Option<SignalHealth> {
        self.gpus.get(&gpu).map(|g| g.health)
    }
}

#[cfg(test)]
mod tests;
