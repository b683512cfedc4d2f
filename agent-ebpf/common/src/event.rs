//! Records the programs send to user space through the ring buffer.

use crate::pod;

/// What an [`Event`] reports.
pub mod kind {
    /// A process opened its first GPU node. `device` is the node.
    pub const NEW_PROCESS: u32 = 1;
    /// Memory was allocated (at least the configured size). `bytes`, `device`, `client`, `handle`.
    pub const ALLOC: u32 = 2;
    /// Memory was freed. `bytes`, `device`, `client`, `handle`.
    pub const FREE: u32 = 3;
    /// A client was freed with everything it held. `bytes` is the total released.
    pub const CLIENT_FREE: u32 = 4;
    /// A GPU process exited. `bytes` is the total released.
    pub const PROCESS_EXIT: u32 = 5;
    /// An ioctl could not be decoded. `code` is a [`super::decode_error`] value, `handle` the
    /// escape, `bytes` a detail (the size found, for `BAD_SIZE`).
    pub const DECODE_ERROR: u32 = 6;
    /// A GPU process forked. `handle` is the child's pid.
    pub const FORK: u32 = 7;
    /// A GPU process exec'd: its close-on-exec GPU fds are gone. `bytes` is the total released.
    pub const EXEC: u32 = 8;
    /// An allocation would cross its quota's limit. `bytes` requested, `used`, `limit`,
    /// `device`; `code` is the [`action`] taken.
    pub const QUOTA_EXCEEDED: u32 = 9;
    /// An open of a GPU node was refused. `device` is the minor; `code` is 2 when the cgroup is at
    /// its budget of GPU fds, 1 when it is bound to a quota that lacks the GPU, 0 when it is under
    /// a bound cgroup but not mapped yet.
    pub const DEVICE_DENIED: u32 = 10;
    /// A cgroup reached its budget in a kernel table and was first refused an entry. `code` is
    /// the `maps::table` index, `limit` the budget.
    pub const TABLE_BUDGET: u32 = 11;
}

/// What the kernel did about an over-limit allocation ([`kind::QUOTA_EXCEEDED`]'s `code`).
pub mod action {
    /// The ioctl was refused with `-ENOMEM` (BPF LSM).
    pub const DENY: u32 = 1;
    /// The process was sent SIGKILL.
    pub const KILL: u32 = 2;
    /// The process was sent SIGSTOP.
    pub const STOP: u32 = 3;
    /// Reported only.
    pub const REPORT: u32 = 4;
}

/// Why an ioctl could not be decoded.
pub mod decode_error {
    /// The parameter struct could not be read from user memory.
    pub const READ_PARAMS: u32 = 1;
    /// The parameter size doesn't match any known layout.
    pub const BAD_SIZE: u32 = 2;
    /// The nested allocation parameters could not be read.
    pub const READ_ALLOC_PARAMS: u32 = 3;
    /// The GPU index is at or above `MAX_GPUS`.
    pub const DEVICE_OUT_OF_RANGE: u32 = 4;
    /// The written-back parameters could not be read at ioctl exit.
    pub const READ_RESULT: u32 = 5;
}

/// One ring-buffer record.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Event {
    /// One of [`kind`].
    pub kind: u32,
    /// Process (thread-group id).
    pub tgid: u32,
    /// cgroup v2 id.
    pub cgroup: u64,
    /// Device id.
    pub device: u32,
    /// Kind-specific code.
    pub code: u32,
    /// Bytes allocated, freed or released.
    pub bytes: u64,
    /// RM client handle.
    pub client: u32,
    /// RM object handle (or kind-specific value).
    pub handle: u32,
    /// The task's command name.
    pub comm: [u8; 16],
    /// Bytes the cgroup's quota held ([`kind::QUOTA_EXCEEDED`]).
    pub used: u64,
    /// The quota's limit ([`kind::QUOTA_EXCEEDED`]).
    pub limit: u64,
}

pod!(Event);
