//! Charging and releasing GPU memory.
//!
//! Every counted allocation is an entry in `ALLOCATIONS` and is added to three totals: its
//! process's, its client's and its cgroup's (per GPU). Freeing the allocation subtracts it from
//! all three; freeing the client or ending the process subtracts their totals at once, since the
//! driver frees everything under them without a per-object `RM_FREE`. Generation stamps let a
//! later free of a stale entry (its client or process already gone) be told apart and ignored.
//!
//! The driver frees memory when it is freed, when its client is, or when the open file the
//! client was made through is released; a process's end is no driver event. So an allocation of
//! a process that ends while its client's file lives on (sent to another process, inherited by a
//! child) becomes an orphan: it leaves its process's totals but stays charged to its cgroup,
//! until it is freed or the file closes (see `orphan_held`).

use core::ffi::c_void;

use aya_ebpf::helpers::{bpf_for_each_map_elem, bpf_ktime_get_ns, bpf_loop, bpf_probe_read_kernel};
use gpuwarden_agent_common::{
    config::file_refs,
    event::{Event, decode_error, kind},
    maps::{
        Allocation, CgroupDeviceKey, ClientInfo, DEVICE_UNKNOWN, FILE_CLIENTS, FileRefs, HandleKey,
        MAX_GPUS, MEMORY_SLOTS, ObjectInfo, ProcInfo, memory_kind, memory_slot, slot_device, stat,
        table,
    },
    nvidia::esc,
};

use crate::{
    atomic::{atomic_add, atomic_add32},
    budget, conf, config,
    events::{count, emit},
    maps::{ALLOCATIONS, CGROUP_MEMORY, CLIENTS, FILES, OBJECT_DEVICES, PROCS, SCRATCH_CLIENT},
};

/// Adds `delta` (two's complement for a decrease) to the cgroup's bytes of `kind` on `device`,
/// and, for video memory, to its quota's if it is bound to one.
#[inline(always)]
pub fn add_cgroup(cgroup: u64, device: u32, kind: u32, delta: u64) {
    if kind == memory_kind::VIDEO {
        crate::quota::account(cgroup, device, delta);
    }
    let key = CgroupDeviceKey {
        cgroup,
        device,
        kind,
    };
    if let Some(p) = CGROUP_MEMORY.get_ptr_mut(key) {
        // SAFETY: a live map value.
        unsafe { atomic_add(p, delta) };
        return;
    }
    // First bytes for this cgroup and GPU; a racing CPU may have inserted meanwhile.
    if CGROUP_MEMORY.insert(key, 0, 1).is_err() && CGROUP_MEMORY.get_ptr_mut(key).is_none() {
        return;
    }
    if let Some(p) = CGROUP_MEMORY.get_ptr_mut(key) {
        // SAFETY: a live map value.
        unsafe { atomic_add(p, delta) };
    }
}

/// Registers a new client created by `tgid` through open file `file` (0: unknown).
#[inline(always)]
pub fn new_client(tgid: u32, client: u32, file: u64) {
    let Some(proc) = PROCS.get_ptr(tgid) else {
        return;
    };
    // The value is built in per-CPU scratch: the stack can't hold it beside the ioctl's state.
    let Some(info) = SCRATCH_CLIENT.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: live map values; the scratch slot is this CPU's, with preemption off.
    unsafe {
        (*info).tgid = tgid;
        (*info).orphans = 0;
        (*info).generation = bpf_ktime_get_ns();
        (*info).proc_generation = (*proc).generation;
        (*info).cgroup = (*proc).cgroup;
        (*info).vidmem = [0; MEMORY_SLOTS];
        (*info).sysmem = 0;
        (*info).file = file;
        if !budget::take((*info).cgroup, table::CLIENTS) {
            return;
        }
        if CLIENTS.insert(client, *info, 0).is_err() {
            budget::give((*info).cgroup, table::CLIENTS);
            count(stat::HANDLE_TABLE_FULL);
            return;
        }
    }
    if file == 0 {
        return;
    }
    if let Some(refs) = FILES.get_ptr_mut(file) {
        // SAFETY: a live map value; the index is checked.
        unsafe {
            let n = (*refs).count as usize;
            if n < FILE_CLIENTS {
                (*refs).clients[n & (FILE_CLIENTS - 1)] = client;
                (*refs).count += 1;
            }
        }
    }
}

/// One more tracked fd refers to open file `file`.
#[inline(always)]
pub fn file_ref(file: u64) {
    if let Some(refs) = FILES.get_ptr_mut(file) {
        // SAFETY: a live map value.
        unsafe { (*refs).refs += 1 };
        return;
    }
    let first = FileRefs {
        refs: 1,
        ..FileRefs::default()
    };
    let _ = FILES.insert(file, first, 0);
}

/// An fd of open file `file` was refused an entry in the fd table: from now on the last tracked
/// fd's close can't tell that the file closed (see `FileRefs::untracked`). A file with no
/// tracked fd has no entry to mark, and none is made for it (a container past its budget must
/// not fill the file table either): it releases nothing at a close anyway.
#[inline(always)]
pub fn file_untracked(file: u64) {
    if file == 0 {
        return;
    }
    if let Some(refs) = FILES.get_ptr_mut(file) {
        // SAFETY: a live map value.
        unsafe { (*refs).untracked = 1 };
    }
}

/// The references the kernel holds on open file `file` now (fds of any process, fds in flight
/// in a socket, mappings, calls in progress), where its offsets tell.
#[inline(always)]
fn kernel_refs(file: u64) -> Option<u64> {
    let kind = conf!(files.file_refs_kind);
    if kind == file_refs::ABSENT {
        return None;
    }
    let at = file + u64::from(conf!(files.file_refs));
    // SAFETY: the helper faults safely on bad kernel pointers.
    let raw: u64 = unsafe { bpf_probe_read_kernel(at as *const u64) }.ok()?;
    file_refs::references(kind, raw)
}

/// Before tracked fds of `file` go while they still hold it (at `close` entry, and for every fd
/// first at `close_range` and exit): notes whether someone the table doesn't follow holds the
/// file too (`FileRefs::held`), so the last tracked fd's release keeps its clients counted.
#[inline(always)]
pub fn note_holders(file: u64) {
    if file == 0 {
        return;
    }
    let Some(refs) = FILES.get_ptr_mut(file) else {
        return;
    };
    let Some(kernel) = kernel_refs(file) else {
        return;
    };
    // SAFETY: a live map value.
    unsafe { (*refs).held = u32::from(kernel > u64::from((*refs).refs)) };
}

/// One tracked fd less refers to open file `file`; at none, the file is closed and the driver
/// has freed the clients made through it with everything they held: release them. `closed`: the
/// kernel has already closed the fd (exec, `dup2` over it, a reused number), so the file's own
/// count tells whether anyone still holds it; else [`note_holders`] measured it before.
/// Returns whether the file's entry lives on (its clients with it).
#[inline(always)]
pub fn file_unref(tgid: u32, file: u64, closed: bool) -> bool {
    let Some(refs) = FILES.get_ptr_mut(file) else {
        return false;
    };
    // SAFETY: a live map value.
    let (left, count, clients, untracked, noted) = unsafe {
        (*refs).refs = (*refs).refs.saturating_sub(1);
        (
            (*refs).refs,
            (*refs).count,
            (*refs).clients,
            (*refs).untracked,
            (*refs).held,
        )
    };
    if left != 0 {
        return true;
    }
    let held = if conf!(files.file_refs_kind) == file_refs::ABSENT {
        None
    } else if closed {
        kernel_refs(file).map(|k| k > 0)
    } else {
        Some(noted != 0)
    };
    match held {
        // Someone the table doesn't follow holds the file, and the driver its clients: the
        // entry stays (no tracked fd) for their orphans, until a tracked fd of it decides again.
        Some(true) if count != 0 => {
            // SAFETY: a live map value.
            unsafe { (*refs).held = 1 };
            return true;
        }
        Some(true) => {
            let _ = FILES.remove(file);
            return false;
        }
        // Without the kernel's count: an fd the table refused may still hold the file, and the
        // driver frees its clients only at the file's last close: keep them counted (their
        // process's end releases them).
        None if untracked != 0 => {
            let _ = FILES.remove(file);
            return false;
        }
        Some(false) | None => {}
    }
    let _ = FILES.remove(file);
    close_file(tgid, file, count, clients);
    false
}

/// Open file `file` (its entry gone) closed, as `tgid` saw it (0: the sweep): releases the first
/// `count` of `clients`, which the driver freed with it.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "`FILE_CLIENTS` is a small constant"
)]
fn close_file(tgid: u32, file: u64, count: u32, clients: [u32; FILE_CLIENTS]) {
    let mut closing = Closing {
        tgid,
        count,
        file,
        clients,
    };
    // bpf_loop verifies the body once, not once per client.
    // SAFETY: the callback and its context match bpf_loop's contract.
    unsafe {
        bpf_loop(
            FILE_CLIENTS as u32,
            free_file_client as *mut c_void,
            (&raw mut closing).cast(),
            0,
        );
    }
}

/// Releases the files kept past their last tracked fd (`FileRefs::held`) that the kernel has
/// since released (the holder the table didn't follow closed them, or the mappings of an ended
/// process went), with the clients the driver freed with them. Run by the agent's upkeep
/// ([`crate::sweep::sweep_files`]).
#[inline(always)]
pub fn sweep_files() {
    // SAFETY: as in `free`.
    unsafe {
        bpf_for_each_map_elem(
            (&raw const FILES).cast_mut().cast(),
            close_if_released as *mut c_void,
            core::ptr::null_mut(),
            0,
        );
    }
}

/// `bpf_for_each_map_elem` body over `FILES`: closes a kept file the kernel released.
#[inline(never)]
extern "C" fn close_if_released(
    _map: *mut c_void,
    key: *const u64,
    value: *const FileRefs,
    _ctx: *mut c_void,
) -> i64 {
    // SAFETY: the helper passes a live key and value.
    let (file, refs) = unsafe { (*key, *value) };
    if refs.refs != 0 || refs.held == 0 || kernel_refs(file) != Some(0) {
        return 0;
    }
    if FILES.remove(file).is_ok() {
        close_file(0, file, refs.count, refs.clients);
    }
    0
}

/// Context of [`free_file_client`]: the clients of a file closed by `tgid`.
#[repr(C)]
struct Closing {
    tgid: u32,
    count: u32,
    file: u64,
    clients: [u32; FILE_CLIENTS],
}

/// `bpf_loop` body: frees client `index` of a closed file.
#[inline(never)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "`bpf_loop` counts below `FILE_CLIENTS`, and the mask bounds it for the verifier"
)]
extern "C" fn free_file_client(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes back the context `file_unref` gave it.
    let closing = unsafe { &*ctx.cast::<Closing>() };
    if index >= u64::from(closing.count) {
        return 1;
    }
    let client = closing.clients[index as usize & (FILE_CLIENTS - 1)];
    // A handle the driver has since reused for another file's client is not this one.
    let made_here = CLIENTS.get_ptr(client).is_some_and(|c| {
        // SAFETY: a live map value.
        unsafe { (*c).file == closing.file }
    });
    if made_here {
        free_client(closing.tgid, client);
    }
    0
}

/// An allocation to charge.
#[derive(Clone, Copy)]
pub struct Charge {
    /// The GPU (video memory).
    pub device: u32,
    /// Bytes the driver allocated.
    pub bytes: u64,
    /// One of `memory_kind` (video or system).
    pub kind: u32,
    /// The object it is allocated under.
    pub parent: u32,
    /// The device object above it.
    pub device_handle: u32,
}

/// Charges an allocation made as `handle` of `client` by `tgid`: video memory on its GPU (bytes
/// on a GPU that can't be told, or past [`MAX_GPUS`], as device unknown), or system memory.
#[inline(always)]
pub fn charge(tgid: u32, client: u32, handle: u32, what: Charge) {
    let Charge {
        device,
        bytes,
        kind: memory,
        ..
    } = what;
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
    let device = if memory == memory_kind::VIDEO {
        slot_device(memory_slot(device))
    } else {
        DEVICE_UNKNOWN
    };
    let Some(proc) = PROCS.get_ptr_mut(tgid) else {
        return;
    };
    // SAFETY: a live map value; generation and cgroup never change after insert.
    let (proc_generation, cgroup) = unsafe { ((*proc).generation, (*proc).cgroup) };
    // A client created before the agent started is registered on its first allocation.
    if CLIENTS.get_ptr(client).is_none() {
        new_client(tgid, client, 0);
    }
    let Some(client_info) = CLIENTS.get_ptr_mut(client) else {
        return;
    };
    // SAFETY: a live map value.
    let (client_generation, creator) = unsafe { ((*client_info).generation, (*client_info).tgid) };
    let allocation = Allocation {
        tgid,
        device,
        client_generation,
        proc_generation,
        cgroup,
        bytes,
        kind: memory,
        parent: what.parent,
        device_handle: what.device_handle,
        _pad: 0,
    };
    // Untracked bytes could never be released, so they are not charged either (a bound
    // container at its budget had the allocation acted on at entry: `quota::check_alloc`).
    if !budget::take(cgroup, table::ALLOCATIONS) {
        return;
    }
    if ALLOCATIONS
        .insert(HandleKey { client, handle }, allocation, 0)
        .is_err()
    {
        budget::give(cgroup, table::ALLOCATIONS);
        count(stat::HANDLE_TABLE_FULL);
        return;
    }
    // A client's totals hold only its creator's bytes: another process's (a forked child's)
    // are released with that process, and must not be released twice with the client.
    let on_client = creator == tgid;
    // SAFETY: live map values.
    unsafe {
        add_totals(
            proc,
            on_client.then_some(client_info),
            memory,
            device,
            bytes,
        );
    };
    add_cgroup(cgroup, device, memory, bytes);
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

/// Adds `delta` (two's complement for a decrease) of `kind` memory on `device` to a process's
/// totals, and to its client's where the process created the client (a client's totals hold
/// only its creator's bytes).
///
/// # Safety
/// `proc` and `client` point at live map values.
#[inline(always)]
unsafe fn add_totals(
    proc: *mut ProcInfo,
    client: Option<*mut ClientInfo>,
    kind: u32,
    device: u32,
    delta: u64,
) {
    // SAFETY: the caller's; the index is in bounds.
    unsafe {
        if kind == memory_kind::VIDEO {
            let index = memory_slot(device);
            atomic_add(&raw mut (*proc).vidmem[index], delta);
            if let Some(client) = client {
                atomic_add(&raw mut (*client).vidmem[index], delta);
            }
        } else {
            atomic_add(&raw mut (*proc).sysmem, delta);
            if let Some(client) = client {
                atomic_add(&raw mut (*client).sysmem, delta);
            }
        }
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
    // SAFETY: the value is copied out at once.
    if let Some(info) = unsafe { OBJECT_DEVICES.get(key) }.copied() {
        // A device or subdevice goes with everything under it.
        if OBJECT_DEVICES.remove(key).is_ok() {
            budget::give(info.cgroup, table::OBJECTS);
        }
        let mut under = Under { client, object };
        for_each_allocation(free_if_under, &mut under);
        // SAFETY: the callback and its context match the helper's contract; the map argument
        // is the map's definition, which the loader turns into the map.
        unsafe {
            bpf_for_each_map_elem(
                (&raw const OBJECT_DEVICES).cast_mut().cast(),
                forget_if_under as *mut c_void,
                (&raw mut under).cast(),
                0,
            );
        }
        return;
    }
    free_allocation(tgid, key);
}

/// A `bpf_for_each_map_elem` body over `ALLOCATIONS`.
type AllocationBody =
    extern "C" fn(*mut c_void, *const HandleKey, *const Allocation, *mut c_void) -> i64;

/// Calls `body` on every entry of `ALLOCATIONS`, with `ctx` as its context.
#[inline(always)]
fn for_each_allocation<C>(body: AllocationBody, ctx: &mut C) {
    // SAFETY: `body` has the helper's callback signature for this map, and `ctx` outlives the
    // call; the map argument is the map's definition, which the loader turns into the map.
    unsafe {
        bpf_for_each_map_elem(
            (&raw const ALLOCATIONS).cast_mut().cast(),
            body as *mut c_void,
            core::ptr::from_mut(ctx).cast(),
            0,
        );
    }
}

/// What [`free_if_under`] and [`forget_if_under`] look for: objects of `client` under `object`.
#[repr(C)]
struct Under {
    client: u32,
    object: u32,
}

/// `bpf_for_each_map_elem` body over `ALLOCATIONS`: frees an allocation under the freed device.
#[inline(never)]
extern "C" fn free_if_under(
    _map: *mut c_void,
    key: *const HandleKey,
    value: *const Allocation,
    ctx: *mut c_void,
) -> i64 {
    // SAFETY: the helper passes a live key, value and the context given to it.
    let (key, value, under) = unsafe { (*key, &*value, &*ctx.cast::<Under>()) };
    if key.client == under.client
        && (value.parent == under.object || value.device_handle == under.object)
    {
        free_allocation(value.tgid, key);
    }
    0
}

/// `bpf_for_each_map_elem` body over `OBJECT_DEVICES`: forgets subdevices of the freed device.
#[inline(never)]
extern "C" fn forget_if_under(
    _map: *mut c_void,
    key: *const HandleKey,
    value: *const ObjectInfo,
    ctx: *mut c_void,
) -> i64 {
    // SAFETY: as above.
    let (key, value, under) = unsafe { (*key, &*value, &*ctx.cast::<Under>()) };
    if key.client == under.client && value.device == under.object {
        let cgroup = value.cgroup;
        if OBJECT_DEVICES.remove(key).is_ok() {
            budget::give(cgroup, table::OBJECTS);
        }
    }
    0
}

/// Frees the allocation at `key`, charged to `tgid`'s process.
#[inline(always)]
fn free_allocation(tgid: u32, key: HandleKey) {
    let client = key.client;
    let object = key.handle;
    // SAFETY: the value is copied out at once.
    let Some(allocation) = (unsafe { ALLOCATIONS.get(key) }).copied() else {
        return;
    };
    if ALLOCATIONS.remove(key).is_ok() {
        budget::give(allocation.cgroup, table::ALLOCATIONS);
    }
    let Some(client_info) = CLIENTS.get_ptr_mut(client) else {
        return;
    };
    if allocation.tgid == 0 {
        // An orphan: its process ended, the file held it; released with its client if that
        // went first.
        // SAFETY: a live map value.
        unsafe {
            if (*client_info).generation != allocation.client_generation {
                return;
            }
            // Atomic: another process's end may orphan on the same client meanwhile.
            atomic_add32(&raw mut (*client_info).orphans, 1u32.wrapping_neg());
        }
        uncharge(&allocation, tgid, client, object);
        return;
    }
    let Some(proc) = PROCS.get_ptr_mut(allocation.tgid) else {
        return;
    };
    // SAFETY: live map values.
    let (live, on_client) = unsafe {
        (
            (*client_info).generation == allocation.client_generation
                && (*proc).generation == allocation.proc_generation,
            (*client_info).tgid == allocation.tgid,
        )
    };
    if !live {
        // Its client or process was released already, with these bytes.
        return;
    }
    let minus = allocation.bytes.wrapping_neg();
    // SAFETY: live map values.
    unsafe {
        add_totals(
            proc,
            on_client.then_some(client_info),
            allocation.kind,
            allocation.device,
            minus,
        );
    }
    uncharge(&allocation, tgid, client, object);
}

/// Subtracts `allocation` (`handle` of `client`, its entry gone) from its cgroup, and reports it
/// freed by `tgid` (0: an orphan, with its client or file).
#[inline(always)]
fn uncharge(allocation: &Allocation, tgid: u32, client: u32, handle: u32) {
    add_cgroup(
        allocation.cgroup,
        allocation.device,
        allocation.kind,
        allocation.bytes.wrapping_neg(),
    );
    emit(Event {
        kind: kind::FREE,
        tgid,
        cgroup: allocation.cgroup,
        device: allocation.device,
        bytes: allocation.bytes,
        client,
        handle,
        ..Event::default()
    });
}

/// What [`free_orphan_of`] looks for: orphans of `client` at `generation`, `left` of them.
#[repr(C)]
struct Orphans {
    client: u32,
    left: u32,
    generation: u64,
}

/// `bpf_for_each_map_elem` body over `ALLOCATIONS`: releases an orphan of the freed client.
#[inline(never)]
extern "C" fn free_orphan_of(
    _map: *mut c_void,
    key: *const HandleKey,
    value: *const Allocation,
    ctx: *mut c_void,
) -> i64 {
    // SAFETY: the helper passes a live key, value and the context given to it.
    let (key, value, orphans) = unsafe { (*key, *value, &mut *ctx.cast::<Orphans>()) };
    if key.client != orphans.client
        || value.tgid != 0
        || value.client_generation != orphans.generation
    {
        return 0;
    }
    if ALLOCATIONS.remove(key).is_ok() {
        budget::give(value.cgroup, table::ALLOCATIONS);
        uncharge(&value, 0, key.client, key.handle);
    }
    orphans.left = orphans.left.saturating_sub(1);
    // Stop once every orphan is found.
    i64::from(orphans.left == 0)
}

/// Releases everything a client held.
#[inline(always)]
fn free_client(tgid: u32, client: u32) {
    let (Some(held), Some(scratch)) = (CLIENTS.get_ptr(client), SCRATCH_CLIENT.get_ptr_mut(0))
    else {
        return;
    };
    // SAFETY: live map values; the scratch slot is this CPU's, with preemption off. Copied out
    // before the entry goes.
    let info = unsafe {
        *scratch = *held;
        &*scratch
    };
    if CLIENTS.remove(client).is_ok() {
        budget::give(info.cgroup, table::CLIENTS);
    }
    if info.orphans != 0 {
        // The driver frees the allocations of ended processes with the client too.
        let mut orphans = Orphans {
            client,
            left: info.orphans,
            generation: info.generation,
        };
        for_each_allocation(free_orphan_of, &mut orphans);
    }
    let Some(proc) = PROCS.get_ptr_mut(info.tgid) else {
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
            add_cgroup(
                info.cgroup,
                slot_device(index),
                memory_kind::VIDEO,
                bytes.wrapping_neg(),
            );
            total += bytes;
        }
    }
    if info.sysmem != 0 {
        // SAFETY: a live map value.
        unsafe { atomic_add(&raw mut (*proc).sysmem, info.sysmem.wrapping_neg()) };
        add_cgroup(
            info.cgroup,
            DEVICE_UNKNOWN,
            memory_kind::SYSTEM,
            info.sysmem.wrapping_neg(),
        );
        total += info.sysmem;
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

/// The process that ends, whose allocations [`orphan_if_held`] looks at.
#[repr(C)]
struct Ending {
    tgid: u32,
    _pad: u32,
    generation: u64,
}

/// Before process `tgid` is released (it exits or exec'd, its fds forgotten): where it dropped
/// a tracked fd of a file that lived on (`ProcInfo::outlived`), its allocations on clients that
/// such a file still holds become orphans — out of the process's totals, still charged to its
/// cgroup — released when they are freed, or their client or file is. Clients past the file's
/// list (`FILE_CLIENTS`), or made through a file not known, go with the process as before.
#[inline(always)]
pub fn orphan_held(tgid: u32) {
    // SAFETY: the value is copied out at once.
    let Some(info) = (unsafe { PROCS.get(tgid) }).copied() else {
        return;
    };
    if info.outlived == 0 || (info.sysmem == 0 && info.vidmem.iter().all(|b| *b == 0)) {
        return;
    }
    let mut ending = Ending {
        tgid,
        _pad: 0,
        generation: info.generation,
    };
    for_each_allocation(orphan_if_held, &mut ending);
}

/// `bpf_for_each_map_elem` body over `ALLOCATIONS`: makes an allocation of the ending process an
/// orphan if its client's file lives on and lists the client.
#[inline(never)]
extern "C" fn orphan_if_held(
    _map: *mut c_void,
    key: *const HandleKey,
    value: *const Allocation,
    ctx: *mut c_void,
) -> i64 {
    // SAFETY: the helper passes a live key, value and the context given to it.
    let (key, ending) = unsafe { (*key, &*ctx.cast::<Ending>()) };
    // SAFETY: as above.
    let (tgid, proc_generation) = unsafe { ((*value).tgid, (*value).proc_generation) };
    if tgid != ending.tgid || proc_generation != ending.generation {
        return 0;
    }
    orphan(ending.tgid, key);
    0
}

/// Makes allocation `key` of process `tgid` an orphan if its client's file lives on.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "the index is below `FILE_CLIENTS`, a small constant"
)]
fn orphan(tgid: u32, key: HandleKey) {
    let (Some(client_info), Some(allocation), Some(proc)) = (
        CLIENTS.get_ptr_mut(key.client),
        ALLOCATIONS.get_ptr_mut(key),
        PROCS.get_ptr_mut(tgid),
    ) else {
        return;
    };
    // SAFETY: live map values.
    let (generation, file, creator) = unsafe {
        (
            (*client_info).generation,
            (*client_info).file,
            (*client_info).tgid,
        )
    };
    // SAFETY: a live map value.
    let allocation_value = unsafe { *allocation };
    if generation != allocation_value.client_generation || file == 0 {
        return;
    }
    // SAFETY: a live map value, read at once.
    let Some(refs) = (unsafe { FILES.get(file) }) else {
        return;
    };
    // The file's close releases only the clients it lists.
    let mut listed = false;
    for index in 0..FILE_CLIENTS {
        if (index as u32) < refs.count && refs.clients[index] == key.client {
            listed = true;
        }
    }
    if !listed {
        return;
    }
    let minus = allocation_value.bytes.wrapping_neg();
    // SAFETY: live map values.
    unsafe {
        add_totals(
            proc,
            (creator == tgid).then_some(client_info),
            allocation_value.kind,
            allocation_value.device,
            minus,
        );
        (*allocation).tgid = 0;
        (*allocation).proc_generation = 0;
        atomic_add32(&raw mut (*client_info).orphans, 1);
    }
}

/// Releases what a process still holds (it exited, or exec'd and so closed its GPU fds; its
/// orphans left its totals before, `orphan_held`), and reports it as `event` (`PROCESS_EXIT` or
/// `EXEC`).
#[inline(always)]
pub fn release_process(tgid: u32, event: u32) -> Option<ProcInfo> {
    // SAFETY: the value is copied out at once.
    let info = (unsafe { PROCS.get(tgid) }).copied()?;
    if PROCS.remove(tgid).is_ok() {
        budget::give(info.cgroup, table::PROCS);
    }
    let mut total = 0u64;
    for index in 0..MEMORY_SLOTS {
        let bytes = info.vidmem[index];
        if bytes != 0 {
            add_cgroup(
                info.cgroup,
                slot_device(index),
                memory_kind::VIDEO,
                bytes.wrapping_neg(),
            );
            total += bytes;
        }
    }
    for (kind, bytes) in [
        (memory_kind::SYSTEM, info.sysmem),
        (memory_kind::MANAGED, info.managed),
    ] {
        if bytes != 0 {
            add_cgroup(info.cgroup, DEVICE_UNKNOWN, kind, bytes.wrapping_neg());
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
