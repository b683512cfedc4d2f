//! Keys and values of the BPF maps, and the device and ioctl-family numbering they use.

use crate::pod;

/// Longest GPU device-node path the programs match, including the terminating NUL.
pub const PATH_LEN: usize = 64;

/// GPUs a process or client tracks memory for by index; bytes on a GPU at or above, or on one
/// that can't be told, are kept in the [`UNKNOWN_SLOT`].
pub const MAX_GPUS: usize = 16;

/// Slots of the per-GPU byte arrays: one per GPU, then one for "device unknown".
pub const MEMORY_SLOTS: usize = MAX_GPUS + 1;

/// The slot of bytes whose GPU can't be told.
pub const UNKNOWN_SLOT: usize = MAX_GPUS;

/// The slot of `device`'s bytes.
#[inline]
#[must_use]
pub const fn memory_slot(device: u32) -> usize {
    if (device as usize) < MAX_GPUS {
        device as usize
    } else {
        UNKNOWN_SLOT
    }
}

/// The device a slot's bytes are reported under.
#[inline]
#[must_use]
#[expect(
    clippy::cast_possible_truncation,
    reason = "a slot below MAX_GPUS fits; `u32::try_from` is not const"
)]
pub const fn slot_device(slot: usize) -> u32 {
    if slot < MAX_GPUS {
        slot as u32
    } else {
        DEVICE_UNKNOWN
    }
}

/// Highest fd number copied into a forked child's table (the kernel's default `nr_open`); the
/// copy walks fds up to the parent's highest GPU fd only.
pub const MAX_FORK_FDS: u32 = 1 << 20;

/// Device id of `/dev/nvidiactl` (its minor number).
pub const DEVICE_CTL: u32 = 255;
/// Device id of `/dev/nvidia-modeset` (its minor number).
pub const DEVICE_MODESET: u32 = 254;
/// Device id of `/dev/nvidia-uvm`.
pub const DEVICE_UVM: u32 = 256;
/// Device id of `/dev/nvidia-uvm-tools`.
pub const DEVICE_UVM_TOOLS: u32 = 257;
/// Device id used when an allocation's GPU can't be told.
pub const DEVICE_UNKNOWN: u32 = u32::MAX;

/// How the programs decode ioctls on a device node.
pub mod node_kind {
    /// A resource-manager node (`nvidiactl`, `nvidiaN`): `_IOC`-encoded escapes.
    pub const RM: u32 = 0;
    /// A UVM node (`nvidia-uvm*`): plain command numbers.
    pub const UVM: u32 = 1;
}

/// The family of an ioctl command in [`IoctlKey::family`].
pub mod family {
    /// An RM escape; `cmd` is its `nr`.
    pub const RM: u32 = 0;
    /// A UVM command; `cmd` is the command number.
    pub const UVM: u32 = 1;
}

/// A GPU device node: what the programs know about a path or an fd that refers to one.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct GpuNode {
    /// Device id (see the `DEVICE_*` constants; a GPU's id is its index `N` in `nvidiaN`).
    pub device: u32,
    /// One of [`node_kind`].
    pub kind: u32,
}

/// Key of the path table: a NUL-padded absolute path.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PathKey {
    /// The path bytes, NUL-padded to [`PATH_LEN`].
    pub path: [u8; PATH_LEN],
}

/// What identifies an opened file as a GPU node, whatever path opened it: a device node's
/// device number (`i_rdev`, with `ino` 0), or for a node that is not a device file (the fake
/// driver's FUSE files) its file system's device and inode number. Device numbers are the
/// kernel's encoding, `major << 20 | minor`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct FileId {
    /// `i_rdev`, or `i_sb->s_dev`.
    pub dev: u32,
    /// Zero.
    pub _pad: u32,
    /// 0, or `i_ino`.
    pub ino: u64,
}

/// A kernel device number (`MKDEV`) from its major and minor.
#[must_use]
pub const fn kernel_dev(major: u32, minor: u32) -> u32 {
    (major << 20) | (minor & 0xf_ffff)
}

/// A tracked GPU fd: the node it refers to and the kernel's open file (0 when not known yet,
/// e.g. an fd seeded from `/proc` before its first ioctl).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FdInfo {
    /// The node.
    pub node: GpuNode,
    /// The `struct file` address: the same for every dup and inherited copy.
    pub file: u64,
}

/// Clients made through one open GPU file, and how many tracked fds refer to it: when the last
/// goes and nobody else holds the file, the driver frees those clients with everything they hold
/// (held elsewhere, the entry stays with `refs` 0, see `held`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FileRefs {
    /// Tracked fds referring to the file.
    pub refs: u32,
    /// Entries of `clients` in use.
    pub count: u32,
    /// Client handles made through the file (the first [`FILE_CLIENTS`]).
    pub clients: [u32; FILE_CLIENTS],
    /// 1 once an fd of the file was refused an entry in the fd table (its container past its fd
    /// budget, or the table full): the file may outlive its tracked fds. Decides only where the
    /// kernel's count of the file can't be read (`FileOffsets::file_refs_kind` absent): the last
    /// tracked fd then releases nothing and the clients stay counted until their process ends.
    pub untracked: u32,
    /// 1 when, at the last decision (a `close`, `close_range`, exit or exec of a tracked fd),
    /// the kernel counted more references to the file than tracked fds: someone the table
    /// doesn't follow holds it (an fd not yet used for an ioctl, one in flight in a socket, a
    /// mapping). The last tracked fd's close then keeps the entry (with `refs` 0), so the
    /// clients' memory stays counted until the file is seen to close.
    pub held: u32,
}

impl FileRefs {
    /// Whether `client` is one of the clients the file's close releases.
    #[must_use]
    pub fn lists(&self, client: u32) -> bool {
        let count = (self.count as usize).min(FILE_CLIENTS);
        self.clients[..count].contains(&client)
    }
}

/// Clients remembered per open file (more are released when their process ends).
pub const FILE_CLIENTS: usize = 8;

/// What the programs know of a device or subdevice object.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ObjectInfo {
    /// Its GPU index.
    pub gpu: u32,
    /// The device object it is (itself) or is under (a subdevice's parent).
    pub device: u32,
    /// The cgroup the entry is charged to (its budget of [`table::OBJECTS`]).
    pub cgroup: u64,
}

/// Indexes of the `SETTINGS` array.
pub mod setting {
    /// How over-limit allocations are acted on ([`super::enforce_mode`]).
    pub const ENFORCE_MODE: u32 = 0;
    /// 1: some watched node is not a device file, so files are also matched by inode.
    pub const MATCH_INODES: u32 = 1;
    /// Number of settings.
    pub const COUNT: u32 = 2;
}

/// Key of the managed-memory mappings: a mapping of the UVM node by its start address.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct MappingKey {
    /// The process.
    pub tgid: u32,
    /// Zero.
    pub _pad: u32,
    /// The address `mmap` returned.
    pub addr: u64,
}

/// A managed-memory (UVM) mapping charged to a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Mapping {
    /// Its length.
    pub bytes: u64,
    /// The cgroup it is charged to.
    pub cgroup: u64,
    /// Generation of its process when mapped.
    pub proc_generation: u64,
}

/// Key of the GPU fd table.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FdKey {
    /// The process (thread-group id).
    pub tgid: u32,
    /// The file descriptor.
    pub fd: u32,
}

/// Key of the per-CPU ioctl counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct IoctlKey {
    /// cgroup v2 id of the caller.
    pub cgroup: u64,
    /// Device id of the node the ioctl was issued on.
    pub device: u32,
    /// One of [`family`].
    pub family: u32,
    /// Escape `nr` (RM) or command number (UVM); `XFER_CMD` is unwrapped.
    pub cmd: u32,
    /// Zero.
    pub _pad: u32,
}

/// What kind of memory a figure counts ([`CgroupDeviceKey::kind`], [`Allocation::kind`]).
pub mod memory_kind {
    /// Video memory on a GPU (per GPU; [`super::DEVICE_UNKNOWN`] when it can't be told).
    pub const VIDEO: u32 = 0;
    /// Host memory allocated or pinned for the GPUs (device [`super::DEVICE_UNKNOWN`]).
    pub const SYSTEM: u32 = 1;
    /// Managed (UVM) memory mapped (device [`super::DEVICE_UNKNOWN`]): a bound, not residency.
    pub const MANAGED: u32 = 2;
}

/// Key of the per-cgroup GPU memory table.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct CgroupDeviceKey {
    /// cgroup v2 id.
    pub cgroup: u64,
    /// GPU index.
    pub device: u32,
    /// One of [`memory_kind`].
    pub kind: u32,
}

/// A process that has opened a GPU node.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcInfo {
    /// The cgroup its GPU memory is charged to (its cgroup when first seen).
    pub cgroup: u64,
    /// Generation stamp (boot-time ns when first seen) so a reused pid is not confused with it.
    pub generation: u64,
    /// Highest GPU fd it holds, bounds the copy at fork.
    pub max_fd: u32,
    /// Bit `N`: it has held `nvidiaN` open (N < 32); tells an allocation's GPU when the device
    /// handle predates the agent.
    pub gpu_nodes: u32,
    /// Video memory bytes by [`memory_slot`].
    pub vidmem: [u64; MEMORY_SLOTS],
    /// Host memory bytes allocated or pinned for the GPUs.
    pub sysmem: u64,
    /// Managed (UVM) bytes mapped.
    pub managed: u64,
    /// 1 once a file it dropped a tracked fd of lived on (another fd, a mapping or a socket
    /// holds it): its end then looks for allocations to leave charged with the file (orphans).
    pub outlived: u32,
    /// Zero.
    pub _pad: u32,
}

/// An RM client (root handle) that allocated memory.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientInfo {
    /// The process that created it.
    pub tgid: u32,
    /// Allocations of processes that ended while the client's open file lived on ("orphans",
    /// marked `tgid` 0 in `ALLOCATIONS`): the driver still holds them, so they stay charged to
    /// their cgroup until they are freed, or the client is.
    pub orphans: u32,
    /// Generation stamp of the client.
    pub generation: u64,
    /// Generation stamp of its process.
    pub proc_generation: u64,
    /// cgroup its memory is charged to.
    pub cgroup: u64,
    /// Video memory bytes its creator allocated, by [`memory_slot`].
    pub vidmem: [u64; MEMORY_SLOTS],
    /// Host memory bytes its creator allocated or pinned for the GPUs.
    pub sysmem: u64,
    /// The open file it was made through (0: unknown).
    pub file: u64,
}

/// Key of the handle tables: an RM object within its client.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct HandleKey {
    /// The client (`hRoot`).
    pub client: u32,
    /// The object.
    pub handle: u32,
}

/// A counted memory allocation.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Allocation {
    /// Process that allocated it; 0 once that process ended while the client's open file
    /// lived on (an orphan, counted in `ClientInfo::orphans`, `proc_generation` 0 too).
    pub tgid: u32,
    /// GPU index.
    pub device: u32,
    /// Generation of its client when allocated.
    pub client_generation: u64,
    /// Generation of its process when allocated.
    pub proc_generation: u64,
    /// cgroup it is charged to.
    pub cgroup: u64,
    /// Bytes the driver allocated.
    pub bytes: u64,
    /// One of [`memory_kind`] (video or system).
    pub kind: u32,
    /// The object it was allocated under.
    pub parent: u32,
    /// The device object above it (freeing that frees it).
    pub device_handle: u32,
    /// Zero.
    pub _pad: u32,
}

/// Character-device major number of the NVIDIA driver's nodes (`nvidiaN`, `nvidiactl`,
/// `nvidia-modeset`); `nvidia-uvm` gets a dynamic major and is left to the runtime's rules.
pub const NVIDIA_MAJOR: u32 = 195;

/// Quotas the kernel enforces at once (bound workloads on one node).
pub const MAX_QUOTAS: u32 = 4096;

/// A quota's limit on a GPU it has no limit on.
pub const NO_LIMIT: u64 = u64::MAX;

/// What to do when an allocation would cross a GPU-memory limit and the ioctl can't be refused.
pub mod memory_policy {
    /// `bpf_send_signal(SIGKILL)`.
    pub const KILL: u32 = 1;
    /// `bpf_send_signal(SIGSTOP)`; the agent reports it, a person resumes or kills.
    pub const STOP: u32 = 2;
    /// Only the event.
    pub const REPORT: u32 = 3;
}

/// How the kernel side acts on an over-limit allocation (slot 0 of `SETTINGS`).
pub mod enforce_mode {
    /// From the `sys_enter_ioctl` tracepoint, by the quota's policy (signals).
    pub const SIGNAL: u32 = 0;
    /// The BPF LSM `file_ioctl` program refuses the ioctl with `-ENOMEM`.
    pub const LSM_DENY: u32 = 1;
}

/// Bits of [`Quota::flags`].
pub mod quota_flags {
    /// Only the GPUs in [`super::Quota::devices`] may be opened.
    pub const DEVICES: u32 = 1;
}

/// A bound workload's quota, shared by every cgroup mapped to it in `CGROUP_QUOTA`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// GPU-memory limit by GPU index ([`NO_LIMIT`] for none).
    pub limit: [u64; MAX_GPUS],
    /// GPU memory its cgroups hold, by [`memory_slot`] (kept by the programs); bytes on a GPU
    /// that can't be told are checked against the sum of the limits.
    pub used: [u64; MEMORY_SLOTS],
    /// Bit `N`: `nvidiaN` may be opened.
    pub devices: u64,
    /// One of [`memory_policy`].
    pub memory_policy: u32,
    /// [`quota_flags`].
    pub flags: u32,
    /// Over-limit allocations acted on.
    pub actions: u64,
    /// Opens of GPU nodes refused.
    pub denied_opens: u64,
}

impl Default for Quota {
    fn default() -> Self {
        Self {
            limit: [NO_LIMIT; MAX_GPUS],
            used: [0; MEMORY_SLOTS],
            devices: 0,
            memory_policy: memory_policy::KILL,
            flags: 0,
            actions: 0,
            denied_opens: 0,
        }
    }
}

/// An ioctl the LSM program is to refuse (value of `DENY`, by `pid_tgid`): the raw command and
/// argument, so a stale entry never refuses some other ioctl.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Deny {
    /// The ioctl command as issued.
    pub cmd: u64,
    /// The ioctl argument as issued.
    pub arg: u64,
}

/// The kernel tables a container can grow, each with a per-cgroup budget ([`TableUse`],
/// `Config::budgets`).
pub mod table {
    /// The GPU fd table (`GPU_FDS`).
    pub const FDS: usize = 0;
    /// The process table (`PROCS`).
    pub const PROCS: usize = 1;
    /// The client table (`CLIENTS`).
    pub const CLIENTS: usize = 2;
    /// The allocation table (`ALLOCATIONS`).
    pub const ALLOCATIONS: usize = 3;
    /// The table of device and subdevice objects and the GPU each is on (`OBJECT_DEVICES`).
    pub const OBJECTS: usize = 4;
    /// The table of managed-memory mappings (`UVM_MAPPINGS`).
    pub const MAPPINGS: usize = 5;
    /// Number of tables.
    pub const COUNT: usize = 6;
    /// Their names, by index, as the snapshot and metrics report them.
    pub const NAMES: [&str; COUNT] = [
        "fds",
        "processes",
        "clients",
        "allocations",
        "device_objects",
        "managed_mappings",
    ];
    /// Capacity of each table (the map sizes).
    pub const CAPACITY: [u32; COUNT] = [65_536, 32_768, 32_768, 262_144, 65_536, 65_536];
    /// The default per-cgroup budget: an eighth of each table, so one container never holds
    /// more than that, and eight at their budget still leave the tables unfilled.
    pub const DEFAULT_BUDGET: [u32; COUNT] = [
        CAPACITY[FDS] / 8,
        CAPACITY[PROCS] / 8,
        CAPACITY[CLIENTS] / 8,
        CAPACITY[ALLOCATIONS] / 8,
        CAPACITY[OBJECTS] / 8,
        CAPACITY[MAPPINGS] / 8,
    ];
}

/// One cgroup's entries in each [`table`] and the entries it was refused past its budget
/// (value of `CGROUP_TABLES`, keyed by the cgroup id entries are charged to; written by the
/// programs only).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TableUse {
    /// Entries the programs added less those they removed, by [`table`] index. What the cgroup
    /// holds is this less [`TableReleased::released`].
    pub used: [u64; table::COUNT],
    /// Entries refused because the cgroup held its budget, by [`table`] index.
    pub refused: [u64; table::COUNT],
}

/// Entries of one cgroup the agent removed itself (value of `CGROUP_TABLES_RELEASED`, written by
/// the agent only, so neither side ever overwrites the other's counts): those of processes that
/// died unseen and of released clients, which the programs counted in and never out.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TableReleased {
    /// By [`table`] index.
    pub released: [u64; table::COUNT],
}

/// Entries a cgroup holds in table `which`: what the programs counted, less what the agent
/// removed.
#[must_use]
pub const fn table_held(used: &TableUse, released: &TableReleased, which: usize) -> u64 {
    used.used[which].saturating_sub(released.released[which])
}

/// Indexes of the per-CPU statistics array.
pub mod stat {
    /// Events dropped because the ring buffer was full.
    pub const RINGBUF_DROPS: u32 = 0;
    /// GPU fds not tracked because the fd table was full.
    pub const FD_TABLE_FULL: u32 = 1;
    /// Allocations not tracked because the handle table was full.
    pub const HANDLE_TABLE_FULL: u32 = 2;
    /// ioctls whose parameters could not be decoded.
    pub const DECODE_ERRORS: u32 = 3;
    /// ioctls seen on tracked GPU fds.
    pub const GPU_IOCTLS: u32 = 4;
    /// Processes not tracked because the process table was full.
    pub const PROC_TABLE_FULL: u32 = 5;
    /// Over-limit allocations acted on.
    pub const QUOTA_ACTIONS: u32 = 6;
    /// Opens of GPU nodes refused by the device program.
    pub const DEVICE_DENIED: u32 = 7;
    /// Table entries refused because their cgroup was at its budget.
    pub const BUDGET_REFUSED: u32 = 8;
    /// Number of statistics.
    pub const COUNT: u32 = 9;
}

pod!(
    GpuNode,
    MappingKey,
    Mapping,
    FileId,
    FdInfo,
    FileRefs,
    ObjectInfo,
    PathKey,
    FdKey,
    IoctlKey,
    CgroupDeviceKey,
    ProcInfo,
    ClientInfo,
    HandleKey,
    Allocation,
    Quota,
    Deny,
    TableUse,
    TableReleased
);
