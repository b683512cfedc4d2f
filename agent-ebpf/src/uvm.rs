//! Managed (UVM) memory: the length of each `mmap` of the UVM node, charged to the process and
//! its cgroup until the mapping is unmapped from its start, or the process ends (a mapping the
//! table had no entry for: only when the process ends).
//!
//! `cudaMallocManaged` memory is backed by `nvidia-uvm` and made by mapping its node; no RM
//! ioctl carries its size. The length mapped is what the process may place on a GPU, not what
//! is resident there (pages migrate on touch), so the figure is a bound, reported apart from
//! video memory (docs/accounting.md).
#![expect(
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss,
    reason = "the kernel hands 32-bit values (fds, ioctl commands, pids, loop indices) in 64-bit registers and fields; these casts take the low half as the kernel does, where a checked conversion would add branches for the verifier to walk"
)]

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use gpuwarden_agent_common::maps::{
    DEVICE_UNKNOWN, DEVICE_UVM, FdKey, Mapping, MappingKey, memory_kind, node_kind, stat, table,
};

use crate::{
    arg,
    atomic::atomic_add,
    budget, current,
    events::count,
    maps::{GPU_FDS, MMAPS_IN_FLIGHT, PENDING_MMAP, PROCS, UVM_MAPPINGS},
    memory::add_cgroup,
    ret,
};

#[tracepoint]
pub fn sys_enter_mmap(ctx: TracePointContext) -> u32 {
    let fd = arg(&ctx, 4) as i64 as i32;
    // Anonymous mappings (most of them) pass fd -1.
    if fd < 0 {
        return 0;
    }
    let (tgid, pid_tgid) = current();
    // SAFETY: the value is copied out at once.
    let Some(info) = (unsafe {
        GPU_FDS.get(FdKey {
            tgid,
            fd: fd as u32,
        })
    })
    .copied() else {
        return 0;
    };
    if info.node.kind != node_kind::UVM || info.node.device != DEVICE_UVM {
        return 0;
    }
    if PENDING_MMAP.insert(pid_tgid, arg(&ctx, 1), 0).is_ok()
        && let Some(n) = MMAPS_IN_FLIGHT.get_ptr_mut(0)
    {
        // SAFETY: a live array slot.
        unsafe { atomic_add(n, 1) };
    }
    0
}

#[tracepoint]
pub fn sys_exit_mmap(ctx: TracePointContext) -> u32 {
    match MMAPS_IN_FLIGHT.get(0) {
        Some(&n) if n != 0 => {}
        _ => return 0,
    }
    let (tgid, pid_tgid) = current();
    // SAFETY: the value is copied out at once.
    let Some(bytes) = (unsafe { PENDING_MMAP.get(pid_tgid) }).copied() else {
        return 0;
    };
    let _ = PENDING_MMAP.remove(pid_tgid);
    if let Some(n) = MMAPS_IN_FLIGHT.get_ptr_mut(0) {
        // SAFETY: a live array slot.
        unsafe { atomic_add(n, u64::MAX) };
    }
    let addr = ret(&ctx);
    // Errors are -4095..-1.
    if (-4095..0).contains(&addr) {
        return 0;
    }
    let Some(proc) = PROCS.get_ptr_mut(tgid) else {
        return 0;
    };
    // SAFETY: a live map value; generation and cgroup never change after insert.
    let (generation, cgroup) = unsafe { ((*proc).generation, (*proc).cgroup) };
    let key = MappingKey {
        tgid,
        _pad: 0,
        addr: addr as u64,
    };
    let mapping = Mapping {
        bytes,
        cgroup,
        proc_generation: generation,
    };
    // A mapping that replaces one at the same address (MAP_FIXED) releases the old one first.
    unmap(tgid, addr as u64);
    // A mapping refused an entry (its cgroup at its budget of mappings, or the table full) is
    // still charged: its bytes then stay counted until its process ends, when the process's
    // managed total is released whole. Counting too long is safe; not counting is not.
    if budget::take(cgroup, table::MAPPINGS) && UVM_MAPPINGS.insert(key, mapping, 0).is_err() {
        budget::give(cgroup, table::MAPPINGS);
        count(stat::HANDLE_TABLE_FULL);
    }
    // SAFETY: a live map value.
    unsafe { atomic_add(&raw mut (*proc).managed, bytes) };
    add_cgroup(cgroup, DEVICE_UNKNOWN, memory_kind::MANAGED, bytes);
    0
}

#[tracepoint]
pub fn sys_enter_munmap(ctx: TracePointContext) -> u32 {
    let (tgid, _) = current();
    unmap(tgid, arg(&ctx, 0));
    0
}

/// Releases the managed mapping of `tgid` that starts at `addr`, if any.
#[inline(always)]
fn unmap(tgid: u32, addr: u64) {
    let key = MappingKey {
        tgid,
        _pad: 0,
        addr,
    };
    // SAFETY: the value is copied out at once.
    let Some(mapping) = (unsafe { UVM_MAPPINGS.get(key) }).copied() else {
        return;
    };
    if UVM_MAPPINGS.remove(key).is_ok() {
        budget::give(mapping.cgroup, table::MAPPINGS);
    }
    let Some(proc) = PROCS.get_ptr_mut(tgid) else {
        return;
    };
    // SAFETY: a live map value.
    if unsafe { (*proc).generation } != mapping.proc_generation {
        // Released with its process already.
        return;
    }
    let minus = mapping.bytes.wrapping_neg();
    // SAFETY: a live map value.
    unsafe { atomic_add(&raw mut (*proc).managed, minus) };
    add_cgroup(mapping.cgroup, DEVICE_UNKNOWN, memory_kind::MANAGED, minus);
}
