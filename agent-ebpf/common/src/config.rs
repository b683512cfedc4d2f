//! Settings user space writes into the programs' read-only data before loading them.

use crate::pod;

/// Name of the global that holds the [`Config`].
pub const CONFIG_SYMBOL: &str = "GPUWARDEN_CONFIG";

/// Marks a tracepoint field the running kernel doesn't have.
pub const FIELD_ABSENT: u32 = u32::MAX;

/// Load-time settings. Tracepoint field offsets come from the kernel's `format` files, which
/// differ between kernel versions.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Allocations of at least this many bytes are sent as events.
    pub alloc_event_min_bytes: u64,
    /// Offset of `parent_pid` in `sched_process_fork`.
    pub fork_parent_pid: u32,
    /// Offset of `child_pid` in `sched_process_fork`.
    pub fork_child_pid: u32,
    /// Offset of `pid` in `sched_process_exit`.
    pub exit_pid: u32,
    /// Offset of `group_dead` in `sched_process_exit`, or [`FIELD_ABSENT`].
    pub exit_group_dead: u32,
}

impl Config {
    /// Offsets of the kernels gpuwarden was first written on (6.x), events from 1 MiB.
    pub const DEFAULT: Self = Self {
        alloc_event_min_bytes: 1 << 20,
        fork_parent_pid: 12,
        fork_child_pid: 20,
        exit_pid: 24,
        exit_group_dead: 32,
    };
}

impl Default for Config {
    fn default() -> Self {
        Self::DEFAULT
    }
}

pod!(Config);
