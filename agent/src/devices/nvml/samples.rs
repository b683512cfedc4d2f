//! NVML's utilization samples for the compute-share throttle: each GPU's device samples and its
//! per-process SM samples, each process placed in its cgroup.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use nvml_wrapper::{
    Nvml, enum_wrappers::device::Sampling, enums::device::SampleValue, error::NvmlError,
};

use crate::devices::samples::{DeviceSample, DriverError, ProcessSample, SampleDriver};

/// NVML as a [`SampleDriver`]: each GPU's device utilization samples and its per-process SM
/// utilization samples (the throttle's `sampled` usage turns them into each cgroup's busy time:
/// each GPU's busy time apportioned among the processes active in each sample period).
pub struct NvmlSamples {
    nvml: Arc<Nvml>,
    nvml_index: HashMap<u32, u32>,
    /// Where a GPU is in MIG mode, the first index its instances take.
    first_instance: Option<u32>,
    cgroup_root: PathBuf,
    /// The clock of the device samples' timestamps, once one was seen.
    device_clock: Option<SampleClock>,
    /// The clock of the process samples' timestamps, once one was seen.
    process_clock: Option<SampleClock>,
}

impl NvmlSamples {
    /// The samples of the GPUs NVML lists at `nvml_index` (NVML's index by our GPU index), each
    /// process placed in its cgroup under `cgroup_root`. Indices from `first_instance` on are
    /// MIG instances, where there are any.
    pub(super) fn new(
        nvml: Arc<Nvml>,
        nvml_index: HashMap<u32, u32>,
        first_instance: Option<u32>,
        cgroup_root: PathBuf,
    ) -> Self {
        Self {
            nvml,
            nvml_index,
            first_instance,
            cgroup_root,
            device_clock: None,
            process_clock: None,
        }
    }

    fn device(&self, gpu: u32) -> Result<nvml_wrapper::Device<'_>, DriverError> {
        let Some(index) = self.nvml_index.get(&gpu) else {
            // An index past the GPUs is a MIG instance: NVML's device and process utilization
            // samples are not supported on MIG-enabled GPUs (nvml.h, `nvmlDeviceGetSamples`,
            // `nvmlDeviceGetProcessUtilization`).
            return Err(if self.first_instance.is_some_and(|first| gpu >= first) {
                DriverError::NotSupported
            } else {
                DriverError::Other(format!("no GPU {gpu}"))
            });
        };
        self.nvml.device_by_index(*index).map_err(driver_error)
    }
}

fn driver_error(e: NvmlError) -> DriverError {
    match e {
        NvmlError::NotSupported => DriverError::NotSupported,
        e => DriverError::Other(e.to_string()),
    }
}

impl SampleDriver for NvmlSamples {
    fn device_samples(
        &mut self,
        gpu: u32,
        last_seen_us: u64,
    ) -> Result<Vec<DeviceSample>, DriverError> {
        let since = self.device_clock.map_or(0, |c| c.to_native(last_seen_us));
        match self.device(gpu)?.samples(Sampling::GpuUtilization, since) {
            Ok(samples) => {
                let clock = SampleClock::learn(
                    &mut self.device_clock,
                    samples.first().map(|s| s.timestamp),
                );
                Ok(samples
                    .iter()
                    .map(|s| DeviceSample {
                        timestamp_us: clock.to_realtime(s.timestamp),
                        util_percent: percent(&s.value),
                    })
                    .collect())
            }
            // No samples newer than the last seen.
            Err(NvmlError::NotFound) => Ok(Vec::new()),
            Err(e) => Err(driver_error(e)),
        }
    }

    fn process_samples(
        &mut self,
        gpu: u32,
        last_seen_us: u64,
    ) -> Result<Vec<ProcessSample>, DriverError> {
        let since = self.process_clock.map_or(0, |c| c.to_native(last_seen_us));
        match self.device(gpu)?.process_utilization_stats(since) {
            Ok(samples) => {
                let clock = SampleClock::learn(
                    &mut self.process_clock,
                    samples.first().map(|s| s.timestamp),
                );
                Ok(samples
                    .iter()
                    .map(|s| ProcessSample {
                        pid: s.pid,
                        timestamp_us: clock.to_realtime(s.timestamp),
                        sm_util_percent: s.sm_util,
                    })
                    .collect())
            }
            Err(NvmlError::NotFound) => Ok(Vec::new()),
            Err(e) => Err(driver_error(e)),
        }
    }

    fn now(&self) -> (Instant, u64) {
        (Instant::now(), realtime_us())
    }

    fn cgroup_of(&self, pid: u32) -> Option<PathBuf> {
        cgroup_dir_of(&self.cgroup_root, pid)
    }

    fn cgroup_exists(&self, dir: &Path) -> bool {
        dir.is_dir()
    }
}

/// A sample's value as a percentage.
fn percent(value: &SampleValue) -> u32 {
    let v = match *value {
        SampleValue::U32(v) => u64::from(v),
        SampleValue::U64(v) => v,
        SampleValue::I64(v) => u64::try_from(v).unwrap_or(0),
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "clamped to 0..=100"
        )]
        SampleValue::F64(v) => v.clamp(0.0, 100.0).round() as u64,
    };
    u32::try_from(v.min(100)).unwrap_or(100)
}

/// The clock NVML stamped a stream of samples with, as an offset to the real-time clock.
///
/// NVML documents its timestamps only as "CPU timestamps in microseconds". Process samples carry
/// the real-time clock (µs since the epoch) on the drivers reported publicly, but device samples
/// have been seen counting from boot (polarsignals/gpu-metrics-agent#37, on a DGX Spark). The two
/// streams are matched by time, so each is moved onto the real-time clock by the offset its
/// first sample shows, fixed from then on so that "last seen" goes back to NVML exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct SampleClock {
    /// Real time minus the stream's clock, µs.
    offset_us: u64,
}

impl SampleClock {
    /// The clock of a stream whose sample was stamped `ts_us`: whichever of the real-time and
    /// the since-boot clocks it is nearer (none seen yet: the real-time clock).
    fn of(ts_us: u64, clocks: &Clocks) -> Self {
        let since_boot =
            ts_us != 0 && ts_us.abs_diff(clocks.boot_us) < ts_us.abs_diff(clocks.real_us);
        Self {
            offset_us: if since_boot {
                clocks.real_us.saturating_sub(clocks.boot_us)
            } else {
                0
            },
        }
    }

    /// The clock `known`, or learned from a stream's first sample stamped `first_us` (until one
    /// comes, the real-time clock, without remembering it).
    fn learn(known: &mut Option<Self>, first_us: Option<u64>) -> Self {
        match (*known, first_us) {
            (Some(clock), _) => clock,
            (None, Some(ts)) => *known.insert(Self::of(ts, &Clocks::now())),
            (None, None) => Self::default(),
        }
    }

    fn to_realtime(self, ts_us: u64) -> u64 {
        ts_us.saturating_add(self.offset_us)
    }

    fn to_native(self, realtime_us: u64) -> u64 {
        realtime_us.saturating_sub(self.offset_us)
    }
}

/// The machine's real-time and since-boot clocks, µs.
#[derive(Debug, Clone, Copy)]
struct Clocks {
    real_us: u64,
    boot_us: u64,
}

impl Clocks {
    fn now() -> Self {
        Self {
            real_us: realtime_us(),
            boot_us: boottime_us(),
        }
    }
}

/// The real-time clock, µs since the epoch: the clock samples are moved onto.
fn realtime_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Time since boot (`CLOCK_BOOTTIME`), µs; 0 if it can't be read.
fn boottime_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &raw mut ts) } != 0 {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let micros = u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000;
    secs.saturating_mul(1_000_000).saturating_add(micros)
}

/// The cgroup v2 directory of a process.
fn cgroup_dir_of(root: &Path, pid: u32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(root.join(rel.trim().trim_start_matches('/')))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLOCKS: Clocks = Clocks {
        real_us: 1_790_000_000_000_000,
        boot_us: 86_400_000_000,
    };

    #[test]
    fn real_time_stamps_are_kept_and_since_boot_ones_moved_onto_real_time() {
        let real = SampleClock::of(CLOCKS.real_us - 150_000, &CLOCKS);
        assert_eq!(
            real.to_realtime(CLOCKS.real_us - 150_000),
            CLOCKS.real_us - 150_000
        );
        let boot = SampleClock::of(CLOCKS.boot_us - 150_000, &CLOCKS);
        assert_eq!(
            boot.to_realtime(CLOCKS.boot_us - 150_000),
            CLOCKS.real_us - 150_000
        );
        // "Last seen" goes back to NVML in its own clock, exactly.
        let seen = boot.to_realtime(CLOCKS.boot_us + 7);
        assert_eq!(boot.to_native(seen), CLOCKS.boot_us + 7);
        // No sample yet: the real-time clock, not remembered; the first sample decides.
        let mut known = None;
        assert_eq!(SampleClock::learn(&mut known, None), real);
        assert_eq!(known, None);
        let boot_us = boottime_us();
        let learned = SampleClock::learn(&mut known, Some(boot_us));
        assert_ne!(learned, real, "a since-boot stamp moves the stream");
        assert_eq!(known, Some(learned));
        assert_eq!(
            SampleClock::learn(&mut known, Some(realtime_us())),
            learned,
            "fixed once learned"
        );
    }

    #[test]
    fn the_machines_clocks_read_as_expected() {
        let clocks = Clocks::now();
        assert!(
            clocks.boot_us > 0 && clocks.boot_us < clocks.real_us,
            "{clocks:?}"
        );
    }
}
