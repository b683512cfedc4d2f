//! The walk from the current task to the file behind an fd and the device it is, as direct loads
//! the verifier types from the kernel's BTF.
//!
//! `bpf_get_current_task_btf()` gives the task as a pointer the verifier knows the type of; each
//! load at a field's offset then gives the field, typed in turn (`task.files → files_struct.fdt →
//! fdtable.{max_fds, fd}`). The kernel compiles such a load to one instruction that reads 0
//! rather than faulting on a bad address, so a hop costs a load, not a `bpf_probe_read_kernel`
//! call. The fd table's slot (`fd[fd]`, a `struct file **`, which the verifier sees as a number)
//! is cast with the `bpf_rdonly_cast` kfunc to a struct whose first member is a `struct file *`
//! (`kiocb.ki_filp`), so the file, its inode and the inode's fields are typed loads too. The
//! kernel inlines that cast to a register move.
//!
//! The offsets are the load-time settings' (`FileOffsets`), which the verifier reads as
//! constants. Used only where the agent found the cast's kfunc and type (`slot_type != 0`).

use aya_ebpf::helpers::generated::bpf_get_current_task_btf;
#[cfg(target_arch = "bpf")]
use gpuwarden_agent_common::config::kfunc;

use crate::conf;

/// Loads a `T` at `base + offset`: one instruction, typed by the verifier from `base`'s type.
/// Volatile, so the compiler neither merges loads of neighbouring fields (a load must lie
/// inside one field) nor drops one.
///
/// # Safety
/// `base` is a pointer the verifier types (from the task, or a cast), `offset` the offset of a
/// field of type `T` in it: the kernel makes the load fault-safe.
#[inline(always)]
unsafe fn field<T>(base: u64, offset: u32) -> T {
    // SAFETY: see above; the address is checked by the kernel, not dereferenced by Rust rules.
    unsafe { ((base + u64::from(offset)) as *const T).read_volatile() }
}

/// `bpf_rdonly_cast(addr, btf_id)`: `addr` as a read-only pointer to the BTF type `btf_id`.
///
/// The call is a raw instruction with a placeholder function id the agent replaces before
/// loading ([`kfunc`]); `btf_id` must be a constant the verifier knows (a load-time setting).
#[cfg(target_arch = "bpf")]
#[inline(always)]
fn rdonly_cast(addr: u64, btf_id: u32) -> u64 {
    let cast: u64;
    // SAFETY: the instruction is a kfunc call with the BPF calling convention: arguments in
    // r1, r2, the result in r0, r1–r5 clobbered, no stack use.
    unsafe {
        core::arch::asm!(
            ".quad {insn}",
            insn = const kfunc::call(kfunc::RDONLY_CAST_PLACEHOLDER),
            inlateout("r1") addr => _,
            inlateout("r2") u64::from(btf_id) => _,
            lateout("r0") cast,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
            options(nostack, pure, nomem),
        );
    }
    cast
}

/// The host's [`rdonly_cast`], so that clippy can check this crate on the host target: the kfunc
/// returns the address it was given, typed for the verifier, and the host has no verifier.
#[cfg(not(target_arch = "bpf"))]
#[inline(always)]
fn rdonly_cast(addr: u64, _btf_id: u32) -> u64 {
    addr
}

/// The `struct file` behind the current task's `fd`: `current->files->fdt->fd[fd]`.
#[inline(always)]
pub fn file_of_fd(fd: u32) -> Option<u64> {
    let (task_files, files_fdt) = (conf!(files.task_files), conf!(files.files_fdt));
    let (fdt_max_fds, fdt_fd) = (conf!(files.fdt_max_fds), conf!(files.fdt_fd));
    // SAFETY: a plain helper call; the task of a syscall is never null.
    let task = unsafe { bpf_get_current_task_btf() } as u64;
    // SAFETY (every `field` below): each offset is that field's, from the kernel's BTF.
    let files: u64 = unsafe { field(task, task_files) };
    let fdt: u64 = unsafe { field(files, files_fdt) };
    let max_fds: u32 = unsafe { field(fdt, fdt_max_fds) };
    if fd >= max_fds {
        return None;
    }
    let array: u64 = unsafe { field(fdt, fdt_fd) };
    let slot = rdonly_cast(array + 8 * u64::from(fd), conf!(files.slot_type));
    // `kiocb.ki_filp`, the struct's first member, is the slot's `struct file *`.
    let file: u64 = unsafe { field(slot, 0) };
    (file != 0).then_some(file)
}

/// The inode of `file`, and its device number (0 for a file that is not a device).
#[inline(always)]
pub fn inode_of(file: u64) -> (u64, u32) {
    let (file_inode, inode_rdev) = (conf!(files.file_inode), conf!(files.inode_rdev));
    // SAFETY: `file` came from [`file_of_fd`], typed; the offsets are from the kernel's BTF.
    let inode: u64 = unsafe { field(file, file_inode) };
    // SAFETY: as above.
    (inode, unsafe { field(inode, inode_rdev) })
}

/// The file system's device and the inode's number.
#[inline(always)]
pub fn inode_id(inode: u64) -> (u32, u64) {
    let (inode_sb, sb_dev, inode_ino) = (
        conf!(files.inode_sb),
        conf!(files.sb_dev),
        conf!(files.inode_ino),
    );
    // SAFETY: `inode` came from [`inode_of`], typed; the offsets are from the kernel's BTF.
    let sb: u64 = unsafe { field(inode, inode_sb) };
    // SAFETY: as above.
    unsafe { (field(sb, sb_dev), field(inode, inode_ino)) }
}
