//! The GPU fd table: which (tgid, fd) pairs refer to a GPU device node.
//!
//! Filled at `openat`/`openat2` exit when the path is one the agent configured, copied by
//! `dup`/`dup2`/`dup3`/`fcntl(F_DUPFD*)`, removed by `close`. A new fd number that is not a GPU
//! node clears any stale entry left under that number (e.g. by a close-on-exec).

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_ktime_get_ns, bpf_probe_read_user_str_bytes},
    macros::tracepoint,
    programs::TracePointContext,
};
use aya_log_ebpf::warn;
use gpuwarden_agent_common::{
    event::{Event, kind},
    maps::{FdKey, GpuNode, MEMORY_SLOTS, PATH_LEN, PathKey, ProcInfo, node_kind, stat},
};

use crate::{
    arg, current,
    events::{count, emit},
    maps::{GPU_FDS, GPU_PATHS, PENDING_DUP, PENDING_OPEN, PROCS},
    ret,
};

/// Map update flag: fail if the key exists.
pub const BPF_NOEXIST: u64 = 1;
/// `-EEXIST`, as map helpers return it.
pub const EEXIST: i32 = -17;

/// `fcntl` commands that duplicate an fd.
const F_DUPFD: u64 = 0;
const F_DUPFD_CLOEXEC: u64 = 1030;

/// Marks a `dup` whose source is not a GPU fd (its result may overwrite a stale entry).
const NOT_GPU: GpuNode = GpuNode {
    device: u32::MAX,
    kind: u32::MAX,
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
    let mut key = PathKey {
        path: [0; PATH_LEN],
    };
    // SAFETY: the helper bounds the read by the buffer and faults safely on bad pointers.
    if unsafe { bpf_probe_read_user_str_bytes(filename as *const u8, &mut key.path) }.is_err() {
        return;
    }
    // SAFETY: the value is copied out at once.
    if let Some(node) = unsafe { GPU_PATHS.get(&key) } {
        let (_, pid_tgid) = current();
        let _ = PENDING_OPEN.insert(&pid_tgid, node, 0);
    }
}

#[inline(always)]
fn open_exit(ctx: &TracePointContext) {
    let (tgid, pid_tgid) = current();
    let fd = ret(ctx);
    // SAFETY: the value is copied out at once.
    let pending = unsafe { PENDING_OPEN.get(&pid_tgid) }.copied();
    match pending {
        Some(node) => {
            let _ = PENDING_OPEN.remove(&pid_tgid);
            if fd >= 0 {
                track(ctx, tgid, fd as u32, node);
            }
        }
        None if fd >= 0 => forget(tgid, fd as u32),
        None => {}
    }
}

#[tracepoint]
pub fn sys_enter_close(ctx: TracePointContext) -> u32 {
    let (tgid, _) = current();
    forget(tgid, arg(&ctx, 0) as u32);
    0
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
    let node = unsafe { GPU_FDS.get(&key) }.copied().unwrap_or(NOT_GPU);
    let _ = PENDING_DUP.insert(&pid_tgid, &node, 0);
}

#[inline(always)]
fn dup_exit(ctx: &TracePointContext) {
    let (tgid, pid_tgid) = current();
    // SAFETY: the value is copied out at once. Only dups recorded at entry are handled, so
    // `fcntl(F_GETFL)` and friends never touch the table.
    let Some(node) = (unsafe { PENDING_DUP.get(&pid_tgid) }).copied() else {
        return;
    };
    let _ = PENDING_DUP.remove(&pid_tgid);
    let fd = ret(ctx);
    if fd < 0 {
        return;
    }
    if node == NOT_GPU {
        // dup2/dup3 onto a GPU fd replaces it.
        forget(tgid, fd as u32);
    } else {
        track(ctx, tgid, fd as u32, node);
    }
}

/// Removes (tgid, fd) from the table.
#[inline(always)]
fn forget(tgid: u32, fd: u32) {
    let _ = GPU_FDS.remove(&FdKey { tgid, fd });
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

/// Adds (tgid, fd) to the table, registering the process on its first GPU fd.
#[inline(always)]
pub fn track(ctx: &TracePointContext, tgid: u32, fd: u32, node: GpuNode) {
    if GPU_FDS.insert(&FdKey { tgid, fd }, &node, 0).is_err() {
        count(stat::FD_TABLE_FULL);
        warn!(
            ctx,
            "gpu fd table full: fd {} of tgid {} is not tracked", fd, tgid
        );
        return;
    }
    let gpu_bit = gpu_node_bit(node);
    if let Some(proc) = PROCS.get_ptr_mut(&tgid) {
        // SAFETY: a live map value; a racing thread at worst writes the same bound (or loses a
        // bit another thread set at the same moment, which only leaves a GPU unresolved).
        unsafe {
            if (*proc).max_fd < fd {
                (*proc).max_fd = fd;
            }
            if (*proc).gpu_nodes & gpu_bit != gpu_bit {
                (*proc).gpu_nodes |= gpu_bit;
            }
        }
        return;
    }
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    let info = ProcInfo {
        cgroup,
        // SAFETY: a plain helper call.
        generation: unsafe { bpf_ktime_get_ns() },
        max_fd: fd,
        gpu_nodes: gpu_bit,
        vidmem: [0; MEMORY_SLOTS],
        sysmem: 0,
        managed: 0,
    };
    match PROCS.insert(&tgid, &info, BPF_NOEXIST) {
        Ok(()) => {}
        // Another thread of the process registered it first.
        Err(EEXIST) => return,
        Err(_) => {
            count(stat::PROC_TABLE_FULL);
            warn!(ctx, "process table full: tgid {} is not tracked", tgid);
            return;
        }
    }
    emit(Event {
        kind: kind::NEW_PROCESS,
        tgid,
        cgroup,
        device: node.device,
        ..Event::default()
    });
}
