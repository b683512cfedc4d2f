//! Where the throttle's usage signal comes from.

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
