//! The BPF maps. Sizes bound kernel memory; a full table is counted in [`STATS`] and logged.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use gpuwarden_agent_common::maps::{
    Allocation, CgroupDeviceKey, ClientInfo, Deny, FdInfo, FdKey, FileId, FileRefs, GpuNode,
    HandleKey, IoctlKey, MAX_QUOTAS, Mapping, MappingKey, ObjectInfo, PathKey, ProcInfo, Quota,
    TableReleased, TableUse, setting, stat, table,
};

/// Don't preallocate: large tables cost memory only for what they hold.
const NO_PREALLOC: u32 = 1;

/// GPU device-node paths to track, written by the agent.
#[map(name = "GPU_PATHS")]
pub static GPU_PATHS: HashMap<PathKey, GpuNode> = HashMap::with_max_entries(256, 0);

/// GPU device nodes by what identifies the opened file (device number, or inode for nodes that
/// are not device files), written by the agent.
#[map(name = "GPU_FILES")]
pub static GPU_FILES: HashMap<FileId, GpuNode> = HashMap::with_max_entries(256, 0);

/// Bit `m % 64` of entry `m / 64`: device major `m` is one of the watched GPU nodes' (written by
/// the agent with `GPU_FILES`), so a device file of any other major is told apart without a hash
/// look-up.
#[map(name = "GPU_MAJORS")]
pub static GPU_MAJORS: Array<u64> = Array::with_max_entries(64, 0);

/// Open GPU fds by (tgid, fd).
#[map(name = "GPU_FDS")]
pub static GPU_FDS: HashMap<FdKey, FdInfo> =
    HashMap::with_max_entries(table::CAPACITY[table::FDS], NO_PREALLOC);

/// Open GPU files (by `struct file` address): tracked fds on each, and the clients made through
/// it.
#[map(name = "FILES")]
pub static FILES: HashMap<u64, FileRefs> = HashMap::with_max_entries(65_536, NO_PREALLOC);

/// Processes holding GPU fds.
#[map(name = "PROCS")]
pub static PROCS: HashMap<u32, ProcInfo> =
    HashMap::with_max_entries(table::CAPACITY[table::PROCS], NO_PREALLOC);

/// RM clients that hold counted memory.
#[map(name = "CLIENTS")]
pub static CLIENTS: HashMap<u32, ClientInfo> =
    HashMap::with_max_entries(table::CAPACITY[table::CLIENTS], NO_PREALLOC);

/// Counted memory allocations by (client, handle).
#[map(name = "ALLOCATIONS")]
pub static ALLOCATIONS: HashMap<HandleKey, Allocation> =
    HashMap::with_max_entries(table::CAPACITY[table::ALLOCATIONS], NO_PREALLOC);

/// GPU index of device and subdevice objects by (client, handle).
#[map(name = "OBJECT_DEVICES")]
pub static OBJECT_DEVICES: HashMap<HandleKey, ObjectInfo> =
    HashMap::with_max_entries(table::CAPACITY[table::OBJECTS], NO_PREALLOC);

/// Video memory bytes by (cgroup, GPU).
#[map(name = "CGROUP_MEMORY")]
pub static CGROUP_MEMORY: HashMap<CgroupDeviceKey, u64> =
    HashMap::with_max_entries(16_384, NO_PREALLOC);

/// ioctl counts by (cgroup, device, family, command), per CPU.
#[map(name = "IOCTL_COUNTS")]
pub static IOCTL_COUNTS: PerCpuHashMap<IoctlKey, u64> = PerCpuHashMap::with_max_entries(16_384, 0);

/// Statistics (see `stat`), per CPU.
#[map(name = "STATS")]
pub static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);

/// Events to user space.
#[map(name = "EVENTS")]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// A GPU path matched at `openat` entry, by `pid_tgid`, until the syscall returns the fd.
#[map(name = "PENDING_OPEN")]
pub static PENDING_OPEN: HashMap<u64, GpuNode> = HashMap::with_max_entries(8_192, 0);

/// The source of a `dup*`/`fcntl(F_DUPFD*)` in flight, by `pid_tgid`.
#[map(name = "PENDING_DUP")]
pub static PENDING_DUP: HashMap<u64, FdInfo> = HashMap::with_max_entries(8_192, 0);

/// A decoded ioctl in flight, by `pid_tgid`, until its exit reads the driver's answer.
#[map(name = "PENDING_IOCTL")]
pub static PENDING_IOCTL: HashMap<u64, gpuwarden_agent_common::decode::Call> =
    HashMap::with_max_entries(8_192, 0);

/// Number of entries in [`PENDING_IOCTL`]: lets every other ioctl's exit return after reading
/// one array slot instead of hashing.
#[map(name = "IOCTLS_IN_FLIGHT")]
pub static IOCTLS_IN_FLIGHT: Array<u64> = Array::with_max_entries(1, 0);

/// The length of an `mmap` of the UVM node in flight, by `pid_tgid`.
#[map(name = "PENDING_MMAP")]
pub static PENDING_MMAP: HashMap<u64, u64> = HashMap::with_max_entries(8_192, 0);

/// Number of entries in [`PENDING_MMAP`]: every other mmap's exit reads one array slot.
#[map(name = "MMAPS_IN_FLIGHT")]
pub static MMAPS_IN_FLIGHT: Array<u64> = Array::with_max_entries(1, 0);

/// Managed-memory mappings of the UVM node, by (tgid, address).
#[map(name = "UVM_MAPPINGS")]
pub static UVM_MAPPINGS: HashMap<MappingKey, Mapping> =
    HashMap::with_max_entries(table::CAPACITY[table::MAPPINGS], NO_PREALLOC);

/// Clone flags of a GPU process's `clone*` in flight, by `pid_tgid`.
#[map(name = "PENDING_CLONE")]
pub static PENDING_CLONE: HashMap<u64, u64> = HashMap::with_max_entries(8_192, 0);

/// The quota each bound cgroup counts against (keyed by the bound cgroup's id), written by the agent.
#[map(name = "CGROUP_QUOTA")]
pub static CGROUP_QUOTA: HashMap<u64, u64> = HashMap::with_max_entries(16_384, NO_PREALLOC);

/// Quotas by bound cgroup id: limits written by the agent, usage kept by the programs.
#[map(name = "QUOTAS")]
pub static QUOTAS: HashMap<u64, Quota> = HashMap::with_max_entries(MAX_QUOTAS, NO_PREALLOC);

/// ioctls the LSM program is to refuse, by `pid_tgid`.
#[map(name = "DENY")]
pub static DENY: HashMap<u64, Deny> = HashMap::with_max_entries(8_192, 0);

/// Per-CPU room to build a client entry in (too large for the stack beside an ioctl's state).
#[map(name = "SCRATCH_CLIENT")]
pub static SCRATCH_CLIENT: PerCpuArray<ClientInfo> = PerCpuArray::with_max_entries(1, 0);

/// Settings the agent writes after loading (see `setting`).
#[map(name = "SETTINGS")]
pub static SETTINGS: Array<u32> = Array::with_max_entries(setting::COUNT, 0);

/// Each cgroup's entries in the tables it can grow, and what it was refused past its budget.
#[map(name = "CGROUP_TABLES")]
pub static CGROUP_TABLES: HashMap<u64, TableUse> = HashMap::with_max_entries(16_384, NO_PREALLOC);

/// Each cgroup's entries the agent removed itself (processes that died unseen, stale handles).
#[map(name = "CGROUP_TABLES_RELEASED")]
pub static CGROUP_TABLES_RELEASED: HashMap<u64, TableReleased> =
    HashMap::with_max_entries(16_384, NO_PREALLOC);
