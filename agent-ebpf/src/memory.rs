//! Charging and releasing GPU memory.
//!
//! Every counted allocation is an entry in `ALLOCATIONS` and is added to three totals: its
//! process's, its client's and its cgroup's (per GPU). Freeing the allocation subtracts it from
//! all three; freeing the client or ending the process subtracts their totals at once, since the
//! driver frees everything under them without a per-object `RM_FREE`. Generation stamps let a
//! later free of a stale entry (its client or process already gone) be told apart and ignored.

use aya_ebpf::helpers::bpf_ktime_get_ns;
use gpuwarden_agent_common::{
    event::{Event, decode_error, kind},
    maps::{
        Allocation, CgroupDeviceKey, ClientInfo, DEVICE_UNKNOWN, HandleKey, MAX_GPUS, MEMORY_SLOTS,
        ProcInfo, memory_slot, slot_device, stat,
    },
    nvidia::esc,
};

use crate::{
    config,
    events::{count, emit},
    maps::{ALLOCATIONS, CGROUP_MEMORY, CLIENTS, OBJECT_DEVICES, PROCS},
};

/// Adds `value` to `*p` atomically (subtract with `value.wrapping_neg()`).
///
/// # Safety
/// `p` must point to a live, 8-byte aligned map value.
#[inline(always)]
pub unsafe fn atomic_add(p: *mut u64, value: u64) {
    // `core::sync::atomic` offers no read-modify-write on this target; the BPF instruction is
    // `lock *(u64 *)(dst + off) += src` (BPF_ATOMIC | BPF_ADD).
    // SAFETY: guaranteed by the caller.
    unsafe {
        core::arch::asm!(
            "lock *(u64 *)({p} + 0) += {v}",
            p = in(reg) p,
            v = in(reg) value,
            options(nostack),
        );
    }
}

/// Adds `delta` (two's complement for a decrease) to the cgroup's bytes on `device`, and to its
/// quota's if it is bound to one.
#[inline(always)]
fn add_cgroup(cgroup: u64, device: u32, delta: u64) {
    crate::quota::account(cgroup, device, delta);
    let key = CgroupDeviceKey {
        cgroup,
        device,
        _pad: 0,
    };
    if let Some(p) = CGROUP_MEMORY.get_ptr_mut(&key) {
        // SAFETY: a live map value.
        unsafe { atomic_add(p, delta) };
        return;
    }
    // First bytes for this cgroup and GPU; a racing CPU may have inserted meanwhile.
    if CGROUP_MEMORY.insert(&key, &0, 1).is_err() && CGROUP_MEMORY.get_ptr_mut(&key).is_none() {
        return;
    }
    if let Some(p) = CGROUP_MEMORY.get_ptr_mut(&key) {
        // SAFETY: a live map value.
        unsafe { atomic_add(p, delta) };
    }
}

/// Registers a new client created by `tgid`.
#[inline(always)]
pub fn new_client(tgid: u32, client: u32) {
    // SAFETY: the value is copied out at once.
    let Some(proc) = (unsafe { PROCS.get(&tgid) }).copied() else {
        return;
    };
    let info = ClientInfo {
        tgid,
        _pad: 0,
        // SAFETY: a plain helper call.
        generation: unsafe { bpf_ktime_get_ns() },
        proc_generation: proc.generation,
        cgroup: proc.cgroup,
        vidmem: [0; MEMORY_SLOTS],
    };
    let _ = CLIENTS.insert(&client, &info, 0);
}

/// Charges `bytes` of video memory on `device`, allocated as `handle` of `client` by `tgid`.
/// Bytes on a GPU that can't be told (or past [`MAX_GPUS`]) are charged as device unknown.
#[inline(always)]
pub fn charge(tgid: u32, client: u32, handle: u32, device: u32, bytes: u64) {
    if device as usize >= MAX_GPUS && device != DEVICE_UNKNOWN {
        count(stat::DECODE_ERRORS);
        emit(Event {
            kind: kind::DECODE_ERROR,
            tgid,
            device,
            code: decode_error::DEVICE_OUT_OF_RANGE,
            handle: esc::RM_ALLOC,
            bytes,
            ..Event::default()
        });
    }
    let device = slot_device(memory_slot(device));
    let Some(proc) = PROCS.get_ptr_mut(&tgid) else {
        return;
    };
    // SAFETY: a live map value; generation and cgroup never change after insert.
    let (proc_generation, cgroup) = unsafe { ((*proc).generation, (*proc).cgroup) };
    // A client created before the agent started is registered on its first allocation.
    if CLIENTS.get_ptr(&client).is_none() {
        new_client(tgid, client);
    }
    let Some(client_info) = CLIENTS.get_ptr_mut(&client) else {
        return;
    };
    // SAFETY: a live map value.
    let client_generation = unsafe { (*client_info).generation };
    let allocation = Allocation {
        tgid,
        device,
        client_generation,
        proc_generation,
        cgroup,
        bytes,
    };
    if ALLOCATIONS
        .insert(&HandleKey { client, handle }, &allocation, 0)
        .is_err()
    {
        // Untracked bytes could never be released, so they are not charged either.
        count(stat::HANDLE_TABLE_FULL);
        return;
    }
    let index = memory_slot(device);
    // SAFETY: live map values; `index` is in bounds.
    unsafe {
        atomic_add(&raw mut (*proc).vidmem[index], bytes);
        atomic_add(&raw mut (*client_info).vidmem[index], bytes);
    }
    add_cgroup(cgroup, device, bytes);
    if bytes >= config().alloc_event_min_bytes {
        emit(Event {
            kind: kind::ALLOC,
            tgid,
            cgroup,
            device,
            bytes,
            client,
            handle,
            ..Event::default()
        });
    }
}

/// Handles a successful `RM_FREE` of `object` in `client`.
#[inline(always)]
pub fn free(tgid: u32, client: u32, object: u32) {
    if object == client {
        free_client(tgid, client);
        return;
    }
    let key = HandleKey {
        client,
        handle: object,
    };
    let _ = OBJECT_DEVICES.remove(&key);
    // SAFETY: the value is copied out at once.
    let Some(allocation) = (unsafe { ALLOCATIONS.get(&key) }).copied() else {
        return;
    };
    let _ = ALLOCATIONS.remove(&key);
    let Some(client_info) = CLIENTS.get_ptr_mut(&client) else {
        return;
    };
    let Some(proc) = PROCS.get_ptr_mut(&allocation.tgid) else {
        return;
    };
    // SAFETY: live map values.
    let live = unsafe {
        (*client_info).generation == allocation.client_generation
            && (*proc).generation == allocation.proc_generation
    };
    if !live {
        // Its client or process was released already, with these bytes.
        return;
    }
    let index = memory_slot(allocation.device);
    let minus = allocation.bytes.wrapping_neg();
    // SAFETY: live map values; `index` is in bounds.
    unsafe {
        atomic_add(&raw mut (*proc).vidmem[index], minus);
        atomic_add(&raw mut (*client_info).vidmem[index], minus);
    }
    add_cgroup(allocation.cgroup, allocation.device, minus);
    emit(Event {
        kind: kind::FREE,
        tgid,
        cgroup: allocation.cgroup,
        device: allocation.device,
        bytes: allocation.bytes,
        client,
        handle: object,
        ..Event::default()
    });
}

/// Releases everything a client held.
#[inline(always)]
fn free_client(tgid: u32, client: u32) {
    // SAFETY: the value is copied out at once.
    let Some(info) = (unsafe { CLIENTS.get(&client) }).copied() else {
        return;
    };
    let _ = CLIENTS.remove(&client);
    let Some(proc) = PROCS.get_ptr_mut(&info.tgid) else {
        return;
    };
    // SAFETY: a live map value.
    if unsafe { (*proc).generation } != info.proc_generation {
        return;
    }
    let mut total = 0u64;
    for index in 0..MEMORY_SLOTS {
        let bytes = info.vidmem[index];
        if bytes != 0 {
            // SAFETY: a live map value; `index` is in bounds.
            unsafe { atomic_add(&raw mut (*proc).vidmem[index], bytes.wrapping_neg()) };
            add_cgroup(info.cgroup, slot_device(index), bytes.wrapping_neg());
            total += bytes;
        }
    }
    emit(Event {
        kind: kind::CLIENT_FREE,
        tgid,
        cgroup: info.cgroup,
        bytes: total,
        client,
        ..Event::default()
    });
}

/// Releases everything a process held (it exited, or exec'd and so closed its GPU fds), and
/// reports it as `event` (`PROCESS_EXIT` or `EXEC`).
#[inline(always)]
pub fn release_process(tgid: u32, event: u32) -> Option<ProcInfo> {
    // SAFETY: the value is copied out at once.
    let info = (unsafe { PROCS.get(&tgid) }).copied()?;
    let _ = PROCS.remove(&tgid);
    let mut total = 0u64;
    for index in 0..MEMORY_SLOTS {
        let bytes = info.vidmem[index];
        if bytes != 0 {
            add_cgroup(info.cgroup, slot_device(index), bytes.wrapping_neg());
            total += bytes;
        }
    }
    emit(Event {
        kind: event,
        tgid,
        cgroup: info.cgroup,
        bytes: total,
        ..Event::default()
    });
    Some(info)
}
