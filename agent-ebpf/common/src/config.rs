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
    /// Kernel struct offsets to find an fd's file; `valid == 0` where the kernel has no BTF.
    pub files: FileOffsets,
    /// One of [`ioctl_match`]: how `ioctl` enter tells a GPU fd.
    pub ioctl_match: u32,
    /// Zero.
    pub _pad: u32,
    /// Per-cgroup budget of each table a container can grow, by `maps::table` index.
    pub budgets: [u32; crate::maps::table::COUNT],
}

/// How `ioctl` enter tells a GPU fd ([`Config::ioctl_match`]).
pub mod ioctl_match {
    /// From the fd's own file (task → files → fdtable → file → inode → device number), however
    /// the fd was obtained; needs [`super::FileOffsets`]. The default where they are known.
    pub const FILE: u32 = 0;
    /// By the (process, fd) table the `openat`/`dup`/`fork` hooks keep: the behaviour before
    /// [`FILE`], kept as the benchmark's baseline and for kernels without BTF. Misses fds
    /// obtained any other way (`io_uring`, `SCM_RIGHTS`, `pidfd_getfd`, `open`/`creat`).
    pub const FD_TABLE: u32 = 1;
}

/// Byte offsets of the kernel struct members that lead from the current task to the file behind
/// an fd and identify it (from the kernel's BTF: Rust programs get no CO-RE relocations).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FileOffsets {
    /// `task_struct.files`.
    pub task_files: u32,
    /// `files_struct.fdt`.
    pub files_fdt: u32,
    /// `files_struct.fdtab`, the fd table embedded in the struct (`fdt` points at it until the
    /// process outgrows it).
    pub files_fdtab: u32,
    /// `fdtable.max_fds`.
    pub fdt_max_fds: u32,
    /// `fdtable.fd`.
    pub fdt_fd: u32,
    /// `file.f_inode`.
    pub file_inode: u32,
    /// `inode.i_rdev`.
    pub inode_rdev: u32,
    /// `inode.i_sb`.
    pub inode_sb: u32,
    /// `inode.i_ino`.
    pub inode_ino: u32,
    /// `super_block.s_dev`.
    pub sb_dev: u32,
    /// BTF id of `struct kiocb` (whose first member is a `struct file *`), or 0. Non-zero: the
    /// programs walk from the task to the file with direct loads the verifier types from the
    /// kernel's BTF (one instruction each, fault-safe), casting the fd table's slot to it with
    /// the `bpf_rdonly_cast` kfunc (see [`kfunc`]); zero: with a `bpf_probe_read_kernel` call per
    /// hop.
    pub slot_type: u32,
    /// Offset of the open file's reference count (`file.f_ref`, or `file.f_count` before 6.13),
    /// read where the programs decide whether a file outlives the fds they track.
    pub file_refs: u32,
    /// How [`Self::file_refs`] counts (one of [`file_refs`]); [`file_refs::ABSENT`] where the
    /// kernel has neither member.
    pub file_refs_kind: u32,
    /// 1 when the offsets were found; the programs then match GPU nodes by the opened file's
    /// device number, else by path.
    pub valid: u32,
}

impl FileOffsets {
    /// No offsets: match by path.
    pub const NONE: Self = Self {
        task_files: 0,
        files_fdt: 0,
        files_fdtab: 0,
        fdt_max_fds: 0,
        fdt_fd: 0,
        file_inode: 0,
        inode_rdev: 0,
        inode_sb: 0,
        inode_ino: 0,
        sb_dev: 0,
        slot_type: 0,
        file_refs: 0,
        file_refs_kind: file_refs::ABSENT,
        valid: 0,
    };
}

/// How a kernel counts the references to an open file ([`FileOffsets::file_refs_kind`]).
pub mod file_refs {
    /// Not known: the programs can't tell whether a file outlives the fds they track.
    pub const ABSENT: u32 = 0;
    /// `file_ref_t f_ref` (6.13 and later, `include/linux/file_ref.h`): a live file's `refcnt`
    /// is its references less one; from [`RELEASED`] up the file is released (dead).
    pub const FILE_REF: u32 = 1;
    /// `atomic_long_t f_count`: the references themselves.
    pub const COUNT: u32 = 2;
    /// `FILE_REF_RELEASED` (64-bit): a `refcnt` at or above it counts no reference.
    pub const RELEASED: u64 = 0xc000_0000_0000_0000;

    /// The references a raw counter of `kind` holds (`file_ref_read`), or `None` for
    /// [`ABSENT`].
    #[must_use]
    pub const fn references(kind: u32, raw: u64) -> Option<u64> {
        match kind {
            FILE_REF => Some(if raw >= RELEASED { 0 } else { raw + 1 }),
            // A negative count is no reference.
            COUNT => Some(if raw.cast_signed() < 0 { 0 } else { raw }),
            _ => None,
        }
    }
}

/// The kernel functions (kfuncs) the programs call. A Rust eBPF program can't name one (no
/// `__ksym` externs), so each call is emitted as a raw instruction whose immediate is a
/// placeholder, and the agent writes the function's BTF id over it before loading.
pub mod kfunc {
    /// Placeholder immediate of the call to `bpf_rdonly_cast`.
    pub const RDONLY_CAST_PLACEHOLDER: u32 = 0x7ead_beef;

    /// The instruction `call kfunc imm`: `BPF_JMP | BPF_CALL` with `src_reg =
    /// BPF_PSEUDO_KFUNC_CALL` (2), as the 8 bytes read little-endian.
    #[must_use]
    pub const fn call(imm: u32) -> u64 {
        ((imm as u64) << 32) | 0x2085
    }

    /// `r0 = 0`: what replaces a kfunc call the kernel lacks (the call is then on a path the
    /// load-time settings turn off, but the verifier resolves every call before pruning).
    pub const ZERO_R0: u64 = 0xb7;
}

impl Config {
    /// Offsets of the kernels gpuwarden was first written on (6.x), events from 1 MiB.
    pub const DEFAULT: Self = Self {
        alloc_event_min_bytes: 1 << 20,
        fork_parent_pid: 12,
        fork_child_pid: 20,
        exit_pid: 24,
        exit_group_dead: 32,
        files: FileOffsets::NONE,
        ioctl_match: ioctl_match::FILE,
        _pad: 0,
        budgets: crate::maps::table::DEFAULT_BUDGET,
    };
}

impl Default for Config {
    fn default() -> Self {
        Self::DEFAULT
    }
}

pod!(Config, FileOffsets);

#[cfg(test)]
mod tests {
    use super::file_refs::{ABSENT, COUNT, FILE_REF, RELEASED, references};

    /// `file_ref_t` keeps references less one, and the zone from `FILE_REF_RELEASED` up (released,
    /// dead, `FILE_REF_NOREF`) holds none (`include/linux/file_ref.h`, `file_ref_read`).
    #[test]
    fn the_kernels_file_counts_read_as_references() {
        assert_eq!(references(FILE_REF, 0), Some(1));
        assert_eq!(references(FILE_REF, 2), Some(3));
        assert_eq!(references(FILE_REF, RELEASED), Some(0));
        assert_eq!(references(FILE_REF, 0xe000_0000_0000_0000), Some(0));
        assert_eq!(references(FILE_REF, u64::MAX), Some(0));
        assert_eq!(references(COUNT, 2), Some(2));
        assert_eq!(references(COUNT, 0), Some(0));
        assert_eq!(references(COUNT, u64::MAX), Some(0));
        assert_eq!(references(ABSENT, 5), None);
    }
}
