//! Where the throttle's usage signal comes from.

use std::{io, path::Path, time::Duration};

/// Cumulative busy time of a cgroup on one GPU: the throttle's usage signal.
///
/// On real GPUs this is NVML's per-process SM utilisation summed over the cgroup's processes;
/// [`CpuTimeUsage`] stands in for it with mock devices.
pub trait UsageSource: Send {
    /// Cumulative busy time of the cgroup at `cgroup_dir` on `gpu`, monotonic over the life of
    /// the cgroup. One GPU fully busy for one second is one second.
    ///
    /// # Errors
    /// The signal can't be read; [`io::ErrorKind::NotFound`] when the cgroup is gone (the
    /// throttle then drops it).
    fn busy(&mut self, gpu: u32, cgroup_dir: &Path) -> io::Result<Duration>;
}

/// A stand-in usage signal for testing the mechanism: the cgroup's CPU time (`usage_usec` in
/// `<dir>/cpu.stat`), one CPU counted as one GPU.
///
/// It ignores `gpu` (every GPU of the cgroup sees the same CPU time) and measures nothing about
/// a real GPU; it exists so that the freeze/thaw duty cycle can be tested end to end with mock
/// devices and CPU-bound workloads, where a single-threaded spinner left alone is fraction 1.0.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuTimeUsage;

impl UsageSource for CpuTimeUsage {
    fn busy(&mut self, _gpu: u32, cgroup_dir: &Path) -> io::Result<Duration> {
        let text = std::fs::read_to_string(cgroup_dir.join("cpu.stat"))?;
        usage_usec(&text).map(Duration::from_micros).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("no usage_usec in {}/cpu.stat", cgroup_dir.display()),
            )
        })
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
}
