use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::*;
use crate::devices::samples::{DeviceSample, ProcessSample};

const T0: u64 = 1_750_000_000_000_000;

/// A driver that returns what the test gives it, NVML-style: samples newer than "last seen".
struct Script {
    base: Instant,
    now_us: u64,
    device: Vec<DeviceSample>,
    process: Vec<ProcessSample>,
    /// Keeps no device samples (NVML's `NotSupported`).
    no_device: bool,
    /// Keeps no process samples.
    no_process: bool,
}

impl SampleDriver for Script {
    fn device_samples(&mut self, _: u32, last: u64) -> Result<Vec<DeviceSample>, DriverError> {
        if self.no_device {
            return Err(DriverError::NotSupported);
        }
        Ok(self
            .device
            .iter()
            .filter(|s| s.timestamp_us > last)
            .copied()
            .collect())
    }
    fn process_samples(&mut self, _: u32, last: u64) -> Result<Vec<ProcessSample>, DriverError> {
        if self.no_process {
            return Err(DriverError::NotSupported);
        }
        Ok(self
            .process
            .iter()
            .filter(|s| s.timestamp_us > last)
            .copied()
            .collect())
    }
    fn now(&self) -> (Instant, u64) {
        (
            self.base + Duration::from_micros(self.now_us - T0),
            self.now_us,
        )
    }
    fn cgroup_of(&self, pid: u32) -> Option<PathBuf> {
        Some(PathBuf::from(format!("/pods/p{pid}/c")))
    }
    fn cgroup_exists(&self, dir: &Path) -> bool {
        dir != Path::new("/gone")
    }
}

fn sample(ms: u64, util: u32) -> DeviceSample {
    DeviceSample {
        timestamp_us: T0 + ms * 1000,
        util_percent: util,
    }
}

#[test]
fn device_samples_close_spans_of_busy_time_and_give_the_phase() {
    let mut driver = Script {
        base: Instant::now(),
        now_us: T0 + 1_000_000,
        device: (0..8).map(|i| sample(i * 166, 50)).collect(),
        process: vec![ProcessSample {
            pid: 7,
            timestamp_us: T0 + 900_000,
            sm_util_percent: 40,
        }],
        no_device: false,
        no_process: false,
    };
    driver.device.push(sample(4 * 166, 100)); // a duplicate: late
    let base = driver.base;
    let mut signal = SampledDevice::new(driver);
    let dirs = [
        Path::new("/pods/p7"),
        Path::new("/pods/p8"),
        Path::new("/gone"),
    ];
    let reading = signal.read(0, &dirs).unwrap();
    assert_eq!(
        reading.intervals.len(),
        7,
        "the first sample only marks the start"
    );
    let first = reading.intervals[0];
    assert_eq!(first.start, base);
    assert_eq!(first.end, base + Duration::from_millis(166));
    assert_eq!(first.busy, Duration::from_millis(83));
    assert_eq!(reading.active, vec![true, false, false]);
    assert_eq!(reading.gone, vec![2]);
    assert_eq!(reading.period, Some(Duration::from_millis(166)));
    assert_eq!(
        reading.next_close,
        Some(base + Duration::from_millis(7 * 166 + 166))
    );
    let health = signal.health(0).unwrap();
    assert_eq!(health.samples, 7);
    assert_eq!(health.jitter, Some(Duration::ZERO));
}

#[test]
fn a_gap_of_lost_samples_covers_one_period_at_most() {
    let mut device: Vec<DeviceSample> = (0..5).map(|i| sample(i * 100, 100)).collect();
    device.push(sample(1400, 100)); // 1 s of samples lost
    let mut signal = SampledDevice::new(Script {
        base: Instant::now(),
        now_us: T0 + 2_000_000,
        device,
        process: Vec::new(),
        no_device: false,
        no_process: false,
    });
    let reading = signal.read(0, &[]).unwrap();
    let last = reading.intervals.last().unwrap();
    assert_eq!(
        last.end.duration_since(last.start),
        Duration::from_millis(200)
    );
    assert_eq!(signal.health(0).unwrap().gaps, 1);
}

/// Two cgroup directories, `busy` and `idle`, each with a `cpu.stat` at 1 ms of CPU time.
struct TwoCgroups {
    dir: tempfile::TempDir,
}

impl TwoCgroups {
    fn new(tag: &str) -> Self {
        let dir = gpuwarden_test_support::scratch(tag);
        for name in ["busy", "idle"] {
            let cgroup = dir.path().join(name);
            std::fs::create_dir_all(&cgroup).unwrap();
            std::fs::write(cgroup.join("cpu.stat"), "usage_usec 1000\n").unwrap();
        }
        Self { dir }
    }

    /// `busy` and `idle`, in that order.
    fn dirs(&self) -> [PathBuf; 2] {
        ["busy", "idle"].map(|name| self.dir.path().join(name))
    }

    /// `busy` runs ten seconds of CPU time: more than 1 % of any span a test can take.
    fn busy_runs(&self) {
        let stat = self.dir.path().join("busy/cpu.stat");
        std::fs::write(stat, "usage_usec 10001000\n").unwrap();
    }
}

#[test]
fn a_gpu_without_samples_is_read_time_only_with_activity_from_cpu_time() {
    let cgroups = TwoCgroups::new("time-only");
    let mut signal = SampledDevice::new(Script {
        base: Instant::now(),
        now_us: T0,
        device: Vec::new(),
        process: Vec::new(),
        no_device: true,
        no_process: true,
    });
    let owned = cgroups.dirs();
    let dirs = owned.each_ref().map(PathBuf::as_path);
    let first = signal.read(9, &dirs).unwrap();
    assert!(first.time_only);
    assert_eq!(first.active, vec![false, false], "no span yet");
    cgroups.busy_runs();
    let second = signal.read(9, &dirs).unwrap();
    assert!(second.time_only);
    assert_eq!(second.active, vec![true, false]);
    assert!(second.intervals.is_empty(), "{second:?}");
    assert_eq!(second.next_close, None);
    assert!(signal.health(9).is_some_and(|h| h.time_only));
}

#[test]
fn a_gpu_without_process_samples_tells_activity_by_cpu_time_and_busy_by_its_samples() {
    let cgroups = TwoCgroups::new("no-process");
    let mut signal = SampledDevice::new(Script {
        base: Instant::now(),
        now_us: T0 + 1_000_000,
        device: (0..4).map(|i| sample(i * 200, 50)).collect(),
        process: Vec::new(),
        no_device: false,
        no_process: true,
    });
    let owned = cgroups.dirs();
    let dirs = owned.each_ref().map(PathBuf::as_path);
    let first = signal.read(0, &dirs).unwrap();
    cgroups.busy_runs();
    let second = signal.read(0, &dirs).unwrap();
    assert!(!first.time_only && !second.time_only);
    assert_eq!(first.intervals.len(), 3, "spans from the device samples");
    assert_eq!(second.active, vec![true, false]);
}
