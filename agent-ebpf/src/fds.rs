//! The GPU fd table: which (tgid, fd) pairs refer to a GPU device node.
//!
//! Filled at `openat`/`openat2` exit when the opened file is a GPU node — told by its device
//! number (or, for nodes that aren't device files, its inode) read through the task's fd table,
//! so any path that reaches the node counts; on kernels without BTF, by the path string the
//! agent configured. Copied by `dup`/`dup2`/`dup3`/`fcntl(F_DUPFD*)`, removed by `close` and
//! `close_range`. A new fd number that is not a GPU node clears any stale entry left under that
//! number. Each entry holds a reference on its open file: the last one gone releases the clients
//! made through that file, unless the kernel's own count of the file says someone the table
//! doesn't follow holds it too (`memory::note_holders`, `memory::file_unref`).
#![expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "the kernel hands 32-bit values (fds, ioctl commands, pids, loop indices) in 64-bit registers and fields; these casts take the low half as the kernel does, where a checked conversion would add branches for the verifier to walk"
)]

use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_user_str_bytes,
    },
    macros::tracepoint,
    programs::TracePointContext,
};
use aya_log_ebpf::warn;
use gpuwarden_agent_common::{
    event::{Event, kind},
    maps::{
        FdInfo, FdKey, FileId, GpuNode, MEMORY_SLOTS, PATH_LEN, PathKey, ProcInfo, node_kind,
        setting, stat, table,
    },
};

use crate::{
    arg, btf_walk, budget, conf, config, current,
    events::{count, emit},
    maps::{GPU_FDS, GPU_FILES, GPU_MAJORS, GPU_PATHS, PENDING_DUP, PENDING_OPEN, PROCS, SETTINGS},
    memory, ret,
};

/// Map update flag: fail if the key exists.
pub const BPF_NOEXIST: u64 = 1;
/// `-EEXIST`, as map helpers return it.
pub const EEXIST: i32 = -17;

/// `fcntl` commands that duplicate an fd.
const F_DUPFD: u64 = 0;
const F_DUPFD_CLOEXEC: u64 = 1030;

/// Marks a `dup` whose source is not a GPU fd (its result may overwrite a stale entry).
const NOT_GPU: FdInfo = FdInfo {
    node: GpuNode {
        device: u32::MAX,
        kind: u32::MAX,
    },
    file: 0,
};

#[tracepoint]
pub fn sys_enter_openat(ctx: TracePointContext) -> u32 {
    open_enter(&ctx, arg(&ctx, 1));
    0
}

#[tracepoint]
pub fn sys_enter_openat2(ctx: TracePointContext) -> u32 {
    open_enter(&ctx, arg(&ctx, 1));
    0
}

#[tracepoint]
pub fn sys_exit_openat(ctx: TracePointContext) -> u32 {
    open_exit(&ctx);
    0
}

#[tracepoint]
pub fn sys_exit_openat2(ctx: TracePointContext) -> u32 {
    open_exit(&ctx);
    0
}

#[inline(always)]
fn open_enter(_ctx: &TracePointContext, filename: u64) {
    // Matched by the opened file at exit where the kernel's offsets are known.
    if conf!(files.valid) != 0 {
        return;
    }
    let mut key = PathKey {
        path: [0; PATH_LEN],
    };
    // SAFETY: the helper bounds the read by the buffer and faults safely on bad pointers.
    if unsafe { bpf_probe_read_user_str_bytes(filename as *const u8, &mut key.path) }.is_err() {
        return;
    }
    // SAFETY: the value is copied out at once.
    if let Some(node) = unsafe { GPU_PATHS.get(key) } {
        let (_, pid_tgid) = current();
        let _ = PENDING_OPEN.insert(pid_tgid, node, 0);
    }
}

#[inline(always)]
fn open_exit(ctx: &TracePointContext) {
    let (tgid, pid_tgid) = current();
    let fd = ret(ctx);
    if conf!(files.valid) != 0 {
        if fd < 0 {
            return;
        }
        let fd = fd as u32;
        // Whatever path opened it (a symlink, a relative path, /proc/self/fd/N, a long one),
        // the file it opened tells.
        match file_of_fd(fd).and_then(|file| node_of_file(file).map(|node| (file, node))) {
            Some((file, node)) => track(ctx, tgid, fd, FdInfo { node, file }, true),
            None => forget(tgid, fd),
        }
        return;
    }
    // SAFETY: the value is copied out at once.
    let pending = unsafe { PENDING_OPEN.get(pid_tgid) }.copied();
    match pending {
        Some(node) => {
            let _ = PENDING_OPEN.remove(pid_tgid);
            if fd >= 0 {
                track(ctx, tgid, fd as u32, FdInfo { node, file: 0 }, true);
            }
        }
        None if fd >= 0 => forget(tgid, fd as u32),
        None => {}
    }
}

/// Reads a kernel value at `addr`.
#[inline(always)]
fn kernel<T>(addr: u64) -> Option<T> {
    // SAFETY: the helper faults safely on bad kernel pointers.
    unsafe { bpf_probe_read_kernel(addr as *const T) }.ok()
}

/// The `struct file` behind the current task's `fd` (`current->files->fdt->fd[fd]`).
#[inline(always)]
pub fn file_of_fd(fd: u32) -> Option<u64> {
    if conf!(files.valid) == 0 {
        return None;
    }
    if conf!(files.slot_type) != 0 {
        // Direct loads: what every ioctl on the node pays, so the cheapest the kernel allows.
        return btf_walk::file_of_fd(fd);
    }
    let o = config().files;
    // SAFETY: a plain helper call.
    let task = unsafe { bpf_get_current_task() };
    let files: u64 = kernel(task + u64::from(o.task_files))?;
    // Without typed loads, it saves reads where the layout allows: the `fdt` pointer is followed
    // by the embedded table (`max_fds`, then `fd`), which it points at until the process
    // outgrows 64 fds — one read gives all three.
    let (max_fds, array) =
        if o.files_fdtab == o.files_fdt + 8 && o.fdt_max_fds == 0 && o.fdt_fd == 8 {
            let [fdt, max_fds, array]: [u64; 3] = kernel(files + u64::from(o.files_fdt))?;
            if fdt == files + u64::from(o.files_fdtab) {
                (max_fds as u32, array)
            } else {
                let both: [u64; 2] = kernel(fdt)?;
                (both[0] as u32, both[1])
            }
        } else {
            let fdt: u64 = kernel(files + u64::from(o.files_fdt))?;
            (
                kernel::<u32>(fdt + u64::from(o.fdt_max_fds))?,
                kernel::<u64>(fdt + u64::from(o.fdt_fd))?,
            )
        };
    if fd >= max_fds {
        return None;
    }
    let file: u64 = kernel(array + 8 * u64::from(fd))?;
    (file != 0).then_some(file)
}

/// The open file behind the current task's `fd` and the GPU node it is, when it is one: what
/// `ioctl` enter decides by, whatever way the fd was obtained.
#[inline(always)]
pub fn gpu_file(fd: u32) -> Option<(u64, GpuNode)> {
    let file = file_of_fd(fd)?;
    Some((file, node_of_file(file)?))
}

/// An ioctl on `fd`, a GPU file: makes sure the fd is in the table under that file, so an fd the
/// open hooks never saw (`io_uring`, `SCM_RIGHTS`, `pidfd_getfd`, `open`/`creat`, inherited from
/// a process the agent didn't know) is followed from now on — its process registered, its file
/// referenced for the release at its last close, its fork children given a copy.
#[inline(always)]
pub fn learn(ctx: &TracePointContext, tgid: u32, fd: u32, node: GpuNode, file: u64) {
    let key = FdKey { tgid, fd };
    // SAFETY: the value is copied out at once.
    if let Some(info) = unsafe { GPU_FDS.get(key) }
        && info.file == file
    {
        return;
    }
    track(ctx, tgid, fd, FdInfo { node, file }, false);
}

/// The GPU node `file` (from [`file_of_fd`]) is, from its inode: a device file by its device
/// number, anything else (only when the agent watches such nodes) by its file system and inode
/// number.
#[inline(always)]
pub fn node_of_file(file: u64) -> Option<GpuNode> {
    let typed = conf!(files.slot_type) != 0;
    let (inode, rdev) = if typed {
        btf_walk::inode_of(file)
    } else {
        let inode: u64 = kernel(file + u64::from(conf!(files.file_inode)))?;
        (inode, kernel(inode + u64::from(conf!(files.inode_rdev)))?)
    };
    let key = if rdev != 0 {
        // Most device files on the node are not of a GPU driver's major: one array read says so,
        // before any hash look-up.
        let major = rdev >> 20;
        match GPU_MAJORS.get(major >> 6) {
            Some(bits) if bits & (1 << (major & 63)) != 0 => {}
            _ => return None,
        }
        FileId {
            dev: rdev,
            _pad: 0,
            ino: 0,
        }
    } else if SETTINGS.get(setting::MATCH_INODES).copied() == Some(1) {
        let (dev, ino) = if typed {
            btf_walk::inode_id(inode)
        } else {
            let sb: u64 = kernel(inode + u64::from(conf!(files.inode_sb)))?;
            (
                kernel(sb + u64::from(conf!(files.sb_dev)))?,
                kernel(inode + u64::from(conf!(files.inode_ino)))?,
            )
        };
        FileId { dev, _pad: 0, ino }
    } else {
        return None;
    };
    // SAFETY: the value is copied out at once.
    unsafe { GPU_FILES.get(key) }.copied()
}

#[tracepoint]
pub fn sys_enter_close(ctx: TracePointContext) -> u32 {
    let (tgid, _) = current();
    let fd = arg(&ctx, 0) as u32;
    // Every close on the node comes here: one look-up tells the GPU fds.
    // SAFETY: the value is copied out at once.
    let Some(info) = (unsafe { GPU_FDS.get(FdKey { tgid, fd }) }).copied() else {
        return 0;
    };
    // Before the close, while the fd still holds its file: whether anyone else does.
    memory::note_holders(info.file);
    forget_in(tgid, fd, 0, false);
    0
}

/// [`memory::note_holders`] for the file of tracked fd `fd` of `tgid`, before the fd goes.
#[inline(always)]
pub fn note_holders(tgid: u32, fd: u32) {
    // SAFETY: the value is copied out at once.
    if let Some(info) = unsafe { GPU_FDS.get(FdKey { tgid, fd }) }.copied() {
        memory::note_holders(info.file);
    }
}

#[tracepoint]
pub fn sys_enter_dup(ctx: TracePointContext) -> u32 {
    dup_enter(arg(&ctx, 0));
    0
}

#[tracepoint]
pub fn sys_enter_dup2(ctx: TracePointContext) -> u32 {
    dup_enter(arg(&ctx, 0));
    0
}

#[tracepoint]
pub fn sys_enter_dup3(ctx: TracePointContext) -> u32 {
    dup_enter(arg(&ctx, 0));
    0
}

#[tracepoint]
pub fn sys_enter_fcntl(ctx: TracePointContext) -> u32 {
    let cmd = arg(&ctx, 1);
    if cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC {
        dup_enter(arg(&ctx, 0));
    }
    0
}

#[tracepoint]
pub fn sys_exit_dup(ctx: TracePointContext) -> u32 {
    dup_exit(&ctx);
    0
}

#[tracepoint]
pub fn sys_exit_dup2(ctx: TracePointContext) -> u32 {
    dup_exit(&ctx);
    0
}

#[tracepoint]
pub fn sys_exit_dup3(ctx: TracePointContext) -> u32 {
    dup_exit(&ctx);
    0
}

#[tracepoint]
pub fn sys_exit_fcntl(ctx: TracePointContext) -> u32 {
    dup_exit(&ctx);
    0
}

#[inline(always)]
fn dup_enter(oldfd: u64) {
    let (tgid, pid_tgid) = current();
    let key = FdKey {
        tgid,
        fd: oldfd as u32,
    };
    // SAFETY: the value is copied out at once.
    let info = unsafe { GPU_FDS.get(key) }.copied().unwrap_or(NOT_GPU);
    let _ = PENDING_DUP.insert(pid_tgid, info, 0);
}

#[inline(always)]
fn dup_exit(ctx: &TracePointContext) {
    let (tgid, pid_tgid) = current();
    // SAFETY: the value is copied out at once. Only dups recorded at entry are handled, so
    // `fcntl(F_GETFL)` and friends never touch the table.
    let Some(info) = (unsafe { PENDING_DUP.get(pid_tgid) }).copied() else {
        return;
    };
    let _ = PENDING_DUP.remove(pid_tgid);
    let fd = ret(ctx);
    if fd < 0 {
        return;
    }
    if info == NOT_GPU {
        // dup2/dup3 onto a GPU fd replaces it.
        forget(tgid, fd as u32);
    } else {
        track(ctx, tgid, fd as u32, info, true);
    }
}

/// Removes (tgid, fd), an fd the kernel has already closed, from the table; the last tracked fd
/// of an open GPU file releases the clients made through it, as the driver frees them.
#[inline(always)]
pub fn forget(tgid: u32, fd: u32) {
    forget_in(tgid, fd, 0, true);
}

/// [`forget`], giving the fd's budget entry back to `cgroup` (0: the process's cgroup, looked
/// up; a process already released gives `cgroup` explicitly). `closed`: the kernel closed the fd
/// already; else [`note_holders`] ran before (see `memory::file_unref`).
#[inline(always)]
pub fn forget_in(tgid: u32, fd: u32, cgroup: u64, closed: bool) {
    let key = FdKey { tgid, fd };
    // SAFETY: the value is copied out at once.
    let Some(info) = (unsafe { GPU_FDS.get(key) }).copied() else {
        return;
    };
    let _ = GPU_FDS.remove(key);
    let proc = PROCS.get_ptr_mut(tgid);
    let cgroup = if cgroup != 0 {
        cgroup
    } else {
        // SAFETY: a live map value.
        proc.map_or(0, |p| unsafe { (*p).cgroup })
    };
    budget::give(cgroup, table::FDS);
    if info.file != 0
        && memory::file_unref(tgid, info.file, closed)
        && let Some(p) = proc
    {
        // The file lives on, maybe with clients this process allocated on: its end looks.
        // SAFETY: a live map value.
        unsafe { (*p).outlived = 1 };
    }
}

/// The bit of `ProcInfo::gpu_nodes` for `node` (0 for control and UVM nodes).
#[inline(always)]
fn gpu_node_bit(node: GpuNode) -> u32 {
    if node.kind == node_kind::RM && node.device < 32 {
        1 << node.device
    } else {
        0
    }
}

/// Adds (tgid, fd) to the table, registering the process on its first GPU fd. The process is
/// registered even when the fd can't be (its cgroup at its fd budget, or a full table): its
/// ioctls are told by their file and its memory must still be charged. `log`: say so when the
/// table is full (not on the ioctl path, which would say it at every call).
#[inline(always)]
pub fn track(ctx: &TracePointContext, tgid: u32, fd: u32, info: FdInfo, log: bool) {
    // An fd number reused without a close we saw drops its old file first.
    forget(tgid, fd);
    let Some(cgroup) = register(tgid, fd, info.node) else {
        return;
    };
    if !budget::take(cgroup, table::FDS) {
        memory::file_untracked(info.file);
        return;
    }
    if GPU_FDS.insert(FdKey { tgid, fd }, info, 0).is_err() {
        budget::give(cgroup, table::FDS);
        memory::file_untracked(info.file);
        count(stat::FD_TABLE_FULL);
        if log {
            warn!(
                ctx,
                "gpu fd table full: fd {} of tgid {} is not tracked", fd, tgid
            );
        }
        return;
    }
    if info.file != 0 {
        memory::file_ref(info.file);
    }
}

/// Registers the process holding GPU fd `fd` of `node` (or notes the fd on its entry); returns
/// the cgroup it is charged to, or `None` when it can't be registered (its cgroup at its
/// process budget, or a full table).
#[inline(always)]
fn register(tgid: u32, fd: u32, node: GpuNode) -> Option<u64> {
    let gpu_bit = gpu_node_bit(node);
    if let Some(proc) = PROCS.get_ptr_mut(tgid) {
        // SAFETY: a live map value; a racing thread at worst writes the same bound (or loses a
        // bit another thread set at the same moment, which only leaves a GPU unresolved).
        unsafe {
            if (*proc).max_fd < fd {
                (*proc).max_fd = fd;
            }
            if (*proc).gpu_nodes & gpu_bit != gpu_bit {
                (*proc).gpu_nodes |= gpu_bit;
            }
            return Some((*proc).cgroup);
        }
    }
    // SAFETY: a plain helper call.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    if !budget::take(cgroup, table::PROCS) {
        return None;
    }
    let info = ProcInfo {
        cgroup,
        // SAFETY: a plain helper call.
        generation: unsafe { bpf_ktime_get_ns() },
        max_fd: fd,
        gpu_nodes: gpu_bit,
        vidmem: [0; MEMORY_SLOTS],
        sysmem: 0,
        managed: 0,
        outlived: 0,
        _pad: 0,
    };
    match PROCS.insert(tgid, info, BPF_NOEXIST) {
        Ok(()) => {}
        // Another thread of the process registered it first.
        Err(EEXIST) => {
            budget::give(cgroup, table::PROCS);
            return Some(cgroup);
        }
        Err(_) => {
            budget::give(cgroup, table::PROCS);
            count(stat::PROC_TABLE_FULL);
            return None;
        }
    }
    emit(Event {
        kind: kind::NEW_PROCESS,
        tgid,
        cgroup,
        device: node.device,
        ..Event::default()
    });
    Some(cgroup)
}
