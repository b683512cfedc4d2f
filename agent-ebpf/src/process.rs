//! Process lifetime: a forked child inherits its parent's GPU fds; exec and exit release what
//! the process held, but for its allocations on clients whose open file lives on (orphans, see
//! `memory::orphan_held`).
//!
//! `sched_process_fork` can't tell a new process from a new thread, so the clone flags are
//! recorded at `clone`/`clone3` entry (only for processes that hold GPU fds). The tracepoint runs
//! in the parent before the child is first scheduled, so the child never runs with an empty table.
#![expect(
    clippy::cast_possible_truncation,
    reason = "the kernel hands 32-bit values (fds, ioctl commands, pids, loop indices) in 64-bit registers and fields; these casts take the low half as the kernel does, where a checked conversion would add branches for the verifier to walk"
)]

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_ktime_get_ns, bpf_loop, bpf_probe_read_user},
    macros::tracepoint,
    programs::TracePointContext,
};
use gpuwarden_agent_common::{
    config::FIELD_ABSENT,
    event::{Event, kind},
    maps::{FdKey, MAX_FORK_FDS, MEMORY_SLOTS, ProcInfo, stat, table},
};

use crate::{
    arg, budget, config, current,
    events::{count, emit},
    fds,
    maps::{GPU_FDS, PENDING_CLONE, PROCS},
    memory,
};

/// How many fds to walk for a process whose highest GPU fd is `max_fd`.
#[inline(always)]
fn fd_span(max_fd: u32) -> u32 {
    if max_fd < MAX_FORK_FDS {
        max_fd + 1
    } else {
        MAX_FORK_FDS
    }
}

/// Context of [`copy_fd`]: the child's fds count against `cgroup`'s budget.
#[repr(C)]
struct FdCopy {
    parent: u32,
    child: u32,
    cgroup: u64,
}

/// `bpf_loop` body: copies fd `index` of the parent into the child's table.
#[inline(never)]
extern "C" fn copy_fd(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes back the context `sched_process_fork` gave it.
    let copy = unsafe { &*ctx.cast::<FdCopy>() };
    let fd = index as u32;
    // SAFETY: the value is copied out at once.
    if let Some(info) = unsafe {
        GPU_FDS.get(FdKey {
            tgid: copy.parent,
            fd,
        })
    }
    .copied()
    {
        let child = FdKey {
            tgid: copy.child,
            fd,
        };
        if !budget::take(copy.cgroup, table::FDS) {
            // Past the budget: the child's ioctls on it are still told by their file.
            memory::file_untracked(info.file);
            return 0;
        }
        if GPU_FDS.insert(child, info, 0).is_err() {
            budget::give(copy.cgroup, table::FDS);
            memory::file_untracked(info.file);
            count(stat::FD_TABLE_FULL);
        } else if info.file != 0 {
            memory::file_ref(info.file);
        }
    }
    0
}

/// `bpf_loop` body: notes who else holds the file of fd `first + index` of the process, before
/// any of the fds goes (a process may hold several fds of one file).
#[inline(never)]
extern "C" fn note_fd_holders(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes back the context its caller gave it.
    let range = unsafe { &*ctx.cast::<FdRange>() };
    fds::note_holders(range.tgid, range.first.wrapping_add(index as u32));
    0
}

/// `bpf_loop` body: removes fd `first + index` of the process (it exited, or closed a range),
/// after [`note_fd_holders`] went over the range.
#[inline(never)]
extern "C" fn forget_fd(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes back the context its caller gave it.
    let range = unsafe { &*ctx.cast::<FdRange>() };
    fds::forget_in(
        range.tgid,
        range.first.wrapping_add(index as u32),
        range.cgroup,
        false,
    );
    0
}

/// Goes over fds `range` of a process that still holds them: notes who else holds their files,
/// then forgets them.
#[inline(always)]
fn forget_range(range: &mut FdRange, count: u32) {
    // SAFETY: as in `sched_process_fork`.
    unsafe {
        bpf_loop(
            count,
            note_fd_holders as *mut c_void,
            core::ptr::from_mut(range).cast(),
            0,
        );
        bpf_loop(
            count,
            forget_fd as *mut c_void,
            core::ptr::from_mut(range).cast(),
            0,
        );
    }
}

/// `bpf_loop` body: after an exec, removes fd `index` if the kernel closed it (close-on-exec).
#[inline(never)]
extern "C" fn forget_if_closed(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes back the context `sched_process_exec` gave it.
    let range = unsafe { &*ctx.cast::<FdRange>() };
    let fd = index as u32;
    // SAFETY: the value is copied out at once.
    let Some(info) = (unsafe {
        GPU_FDS.get(FdKey {
            tgid: range.tgid,
            fd,
        })
    })
    .copied() else {
        return 0;
    };
    if info.file == 0 || fds::file_of_fd(fd) != Some(info.file) {
        fds::forget_in(range.tgid, fd, range.cgroup, true);
    } else if let Some(p) = PROCS.get_ptr_mut(range.tgid) {
        // The fd survived exec, and with it its file and the clients made through it.
        // SAFETY: a live map value.
        unsafe { (*p).outlived = 1 };
    }
    0
}

/// Context of [`forget_fd`] and [`forget_if_closed`]: fds `first..` of `tgid`, whose budget
/// entries go back to `cgroup` (0: the process's, looked up).
#[repr(C)]
struct FdRange {
    tgid: u32,
    first: u32,
    cgroup: u64,
}

/// `CLONE_THREAD`: the child is a thread of the caller's process.
const CLONE_THREAD: u64 = 0x0001_0000;

#[tracepoint]
pub fn sys_enter_clone(ctx: TracePointContext) -> u32 {
    note_clone(arg(&ctx, 0));
    0
}

#[tracepoint]
pub fn sys_enter_clone3(ctx: TracePointContext) -> u32 {
    // `struct clone_args` starts with the u64 flags.
    // SAFETY: the helper faults safely on bad user pointers.
    if let Ok(flags) = unsafe { bpf_probe_read_user(arg(&ctx, 0) as *const u64) } {
        note_clone(flags);
    }
    0
}

#[tracepoint]
pub fn sys_enter_fork(_ctx: TracePointContext) -> u32 {
    note_clone(0);
    0
}

#[tracepoint]
pub fn sys_enter_vfork(_ctx: TracePointContext) -> u32 {
    note_clone(0);
    0
}

#[inline(always)]
fn note_clone(flags: u64) {
    let (tgid, pid_tgid) = current();
    if PROCS.get_ptr(tgid).is_some() {
        let _ = PENDING_CLONE.insert(pid_tgid, flags, 0);
    }
}

#[tracepoint]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    let (parent, pid_tgid) = current();
    // SAFETY: the value is copied out at once.
    let Some(flags) = (unsafe { PENDING_CLONE.get(pid_tgid) }).copied() else {
        return 0;
    };
    let _ = PENDING_CLONE.remove(pid_tgid);
    if flags & CLONE_THREAD != 0 {
        return 0;
    }
    let offset = config().fork_child_pid as usize;
    // SAFETY: the offset comes from this kernel's format file.
    let Ok(child) = (unsafe { ctx.read_at::<u32>(offset) }) else {
        return 0;
    };
    // SAFETY: the value is copied out at once.
    let Some(parent_info) = (unsafe { PROCS.get(parent) }).copied() else {
        return 0;
    };
    // SAFETY: a plain helper call; the child starts in its parent's cgroup.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    if !budget::take(cgroup, table::PROCS) {
        // Past the budget: the child is registered, if ever, at an ioctl once there is room.
        return 0;
    }
    let info = ProcInfo {
        cgroup,
        // SAFETY: a plain helper call.
        generation: unsafe { bpf_ktime_get_ns() },
        max_fd: parent_info.max_fd,
        gpu_nodes: parent_info.gpu_nodes,
        vidmem: [0; MEMORY_SLOTS],
        sysmem: 0,
        managed: 0,
        outlived: 0,
        _pad: 0,
    };
    if PROCS.insert(child, info, 0).is_err() {
        budget::give(cgroup, table::PROCS);
        count(stat::PROC_TABLE_FULL);
        return 0;
    }
    let mut copy = FdCopy {
        parent,
        child,
        cgroup,
    };
    // bpf_loop verifies the body once; an open-coded loop over fds runs out of verifier budget.
    // SAFETY: the callback and its context match bpf_loop's contract.
    unsafe {
        bpf_loop(
            fd_span(parent_info.max_fd),
            copy_fd as *mut c_void,
            (&raw mut copy).cast(),
            0,
        );
    }
    emit(Event {
        kind: kind::FORK,
        tgid: parent,
        cgroup: info.cgroup,
        handle: child,
        ..Event::default()
    });
    0
}

#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let (tgid, pid_tgid) = current();
    let cfg = config();
    let group_dead = if cfg.exit_group_dead == FIELD_ABSENT {
        // Without the field, the leader's exit stands for the process's.
        pid_tgid as u32 == tgid
    } else {
        // SAFETY: the offset comes from this kernel's format file.
        unsafe { ctx.read_at::<u8>(cfg.exit_group_dead as usize) }.unwrap_or(0) != 0
    };
    if !group_dead {
        return 0;
    }
    // SAFETY: the value is copied out at once.
    let Some((cgroup, max_fd)) = (unsafe { PROCS.get(tgid) }).map(|p| (p.cgroup, p.max_fd)) else {
        return 0;
    };
    // The process still holds its fds here (they close after the tracepoint): the files that
    // outlive them, and the clients the driver keeps with them, are told first, and its
    // allocations on those clients left charged to its cgroup; the rest goes with it.
    let mut range = FdRange {
        tgid,
        first: 0,
        cgroup,
    };
    forget_range(&mut range, fd_span(max_fd));
    memory::orphan_held(tgid);
    memory::release_process(tgid, kind::PROCESS_EXIT);
    0
}

#[tracepoint]
pub fn sched_process_exec(_ctx: TracePointContext) -> u32 {
    let (tgid, _) = current();
    // The driver frees a client when its file closes, and GPU fds are close-on-exec. The fds
    // the kernel closed leave the table (each file's own count, read now, tells whether it
    // closed); those that survived exec stay (the agent re-checks them where the kernel's
    // offsets are unknown). The process's allocations on clients of files that live on stay
    // charged to its cgroup; the rest of what it held goes.
    // SAFETY: the value is copied out at once.
    let Some((cgroup, max_fd)) = (unsafe { PROCS.get(tgid) }).map(|p| (p.cgroup, p.max_fd)) else {
        return 0;
    };
    if config().files.valid != 0 {
        let mut range = FdRange {
            tgid,
            first: 0,
            cgroup,
        };
        // SAFETY: as in `sched_process_fork`.
        unsafe {
            bpf_loop(
                fd_span(max_fd),
                forget_if_closed as *mut c_void,
                (&raw mut range).cast(),
                0,
            );
        }
        memory::orphan_held(tgid);
    }
    memory::release_process(tgid, kind::EXEC);
    0
}

/// `close_range(2)` flag: mark close-on-exec instead of closing.
const CLOSE_RANGE_CLOEXEC: u64 = 1 << 2;

#[tracepoint]
pub fn sys_enter_close_range(ctx: TracePointContext) -> u32 {
    let (tgid, _) = current();
    if arg(&ctx, 2) & CLOSE_RANGE_CLOEXEC != 0 {
        return 0;
    }
    // SAFETY: the value is copied out at once.
    let Some(max_fd) = (unsafe { PROCS.get(tgid) }).map(|p| p.max_fd) else {
        return 0;
    };
    let first = arg(&ctx, 0) as u32;
    let last = (arg(&ctx, 1) as u32).min(max_fd);
    if first > last {
        return 0;
    }
    let mut range = FdRange {
        tgid,
        first,
        cgroup: 0,
    };
    forget_range(&mut range, fd_span(last - first));
    0
}
