//! GPU health as OpenTelemetry's hardware conventions describe it: a state (`ok`, `degraded`,
//! `failed`), errors by type (XID events, ECC corrected and uncorrected), power, energy and
//! memory utilization — each where the backend can read it (NVML on real GPUs; mock devices take
//! them from their TOML file, so the path is tested without a GPU).
//!
//! An XID names no process in NVML's event; where exactly one process runs on the GPU when it
//! arrives, the backend names that process's cgroup, so the fault is attributed to its container
//! and session. Counts are cumulative from the agent's start (the metrics are counters).

use std::path::Path;

/// The state OpenTelemetry's `hw.status` reports (`hw.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HealthState {
    /// Working.
    #[default]
    Ok,
    /// Working with faults (uncorrected memory errors, XIDs that reset work).
    Degraded,
    /// Not usable (fallen off the bus, or the backend says so).
    Failed,
}

impl HealthState {
    /// Every state, in order.
    pub const ALL: [Self; 3] = [Self::Ok, Self::Degraded, Self::Failed];

    /// The `hw.state` value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Degraded => "degraded",
            Self::Failed => "failed",
        }
    }

    /// Parses `ok`, `degraded` or `failed`.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// One XID error, with the cgroup of the process it is attributed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xid {
    /// The XID code (NVIDIA's list: 13 graphics engine exception, 31 MMU fault, 79 fallen off
    /// the bus, …).
    pub code: u64,
    /// The cgroup v2 path (`/system.slice/docker-….scope`) of the process it is attributed to;
    /// `None` where no single process could be named.
    pub cgroup: Option<String>,
}

/// What the backend knows of one GPU's health; `None` where it can't tell.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuHealth {
    /// GPU index (`nvidiaN`).
    pub index: u32,
    /// Its state.
    pub state: HealthState,
    /// Power drawn now, in watts.
    pub power_watts: Option<f64>,
    /// Energy used since the driver loaded, in joules.
    pub energy_joules: Option<f64>,
    /// Fraction of the time the memory was read or written.
    pub memory_utilization: Option<f64>,
    /// Corrected ECC errors (aggregate count).
    pub ecc_corrected: Option<u64>,
    /// Uncorrected ECC errors (aggregate count).
    pub ecc_uncorrected: Option<u64>,
    /// XID errors seen since the agent started.
    pub xids: Vec<Xid>,
}

/// The cgroup v2 path of `pid` (the `0::` line of `/proc/PID/cgroup`), read from `proc`.
#[must_use]
pub fn cgroup_of(proc: &Path, pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(proc.join(pid.to_string()).join("cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn states_read_as_the_conventions_name_them() {
        for s in HealthState::ALL {
            assert_eq!(HealthState::parse(s.as_str()), Some(s));
        }
        assert_eq!(HealthState::parse("broken"), None);
    }

    #[test]
    fn a_process_cgroup_is_its_v2_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("42")).unwrap();
        std::fs::write(
            dir.path().join("42/cgroup"),
            "12:memory:/docker/x\n0::/system.slice/docker-x.scope\n",
        )
        .unwrap();
        assert_eq!(
            cgroup_of(dir.path(), 42).as_deref(),
            Some("/system.slice/docker-x.scope")
        );
        assert_eq!(cgroup_of(dir.path(), 43), None);
        // This process has one.
        assert!(cgroup_of(Path::new("/proc"), std::process::id()).is_some());
    }
}
