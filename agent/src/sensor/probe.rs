//! Choosing the hook tier (docs/architecture.md, "Hooks: the syscall tracepoints are the only
//! tier"): the most targeted hook the kernel allows, which today is always the tracepoints.
//!
//! A hook on the NVIDIA driver itself (fentry/kprobe on `nvidia_ioctl`) would cost nothing on
//! other files' ioctls; syscall tracepoints see every `ioctl` and filter by fd. The probe looks
//! at what this kernel offers and reports each candidate with the reason it was or wasn't used.
//! Only the tracepoint tier has programs today, so it is chosen whenever it is available; the
//! report still says when a driver hook would have been possible.

use std::path::Path;

use serde::{Deserialize, Serialize};

pub use gpuwarden_agent_api::{Candidate, Tier};

/// The probe's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    /// The tier in use, `None` when the kernel offers none.
    pub chosen: Option<Tier>,
    /// Every candidate, most targeted first.
    pub candidates: Vec<Candidate>,
}

/// Probes the kernel through `sys` (normally `/sys`).
#[must_use]
pub fn probe(sys: &Path) -> Probe {
    let module_btf = sys.join("kernel/btf/nvidia").exists();
    let kprobes = [
        "kernel/tracing/kprobe_events",
        "kernel/debug/tracing/kprobe_events",
    ]
    .iter()
    .any(|p| sys.join(p).exists());
    let tracepoints = ["kernel/tracing", "kernel/debug/tracing"]
        .iter()
        .any(|p| sys.join(p).join("events/syscalls/sys_enter_ioctl").is_dir());

    let driver_reason = |available: bool, what: &str| {
        if available {
            format!("{what} present, but this build has no driver-hook programs yet")
        } else {
            format!("{what} not present")
        }
    };
    let candidates = vec![
        Candidate {
            tier: Tier::DriverFentry,
            available: module_btf,
            reason: driver_reason(module_btf, "nvidia module BTF (/sys/kernel/btf/nvidia)"),
        },
        Candidate {
            tier: Tier::DriverKprobe,
            available: kprobes && module_btf,
            reason: if kprobes {
                driver_reason(module_btf, "kprobes and the nvidia module")
            } else {
                "kernel has no kprobe_events".to_owned()
            },
        },
        Candidate {
            tier: Tier::SyscallTracepoint,
            available: tracepoints,
            reason: if tracepoints {
                "syscall tracepoints present; ioctls filtered by the GPU fd table".to_owned()
            } else {
                "syscalls/sys_enter_ioctl not found in tracefs (CONFIG_FTRACE_SYSCALLS?)".to_owned()
            },
        },
    ];
    Probe {
        chosen: tracepoints.then_some(Tier::SyscallTracepoint),
        candidates,
    }
}

#[cfg(test)]
mod tests;

/// Where an attempt to load a driver hook ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookTrial {
    /// `driver_fentry`, `driver_kprobe`, or `vmlinux_fentry` (an fentry on a core kernel
    /// function: whether fentry loads at all).
    pub hook: String,
    /// The function it was aimed at.
    pub target: String,
    /// It loaded and attached.
    pub loaded: bool,
    /// What the kernel (or the loader) said.
    pub detail: String,
}
