//! `ioctl` enter/exit on tracked GPU fds.
//!
//! Enter counts the ioctl and, for the escapes that create or free objects, records what the exit
//! needs; exit reads the driver's answer (the ioctl's return and the params' `status`) and charges
//! or releases memory only on success. An ioctl on any other file costs a test of its command
//! number (most other drivers' commands stop there) and the walk to the fd's file at enter
//! ([`crate::btf_walk`]), and one array read at exit. The decoding itself is
//! [`gpuwarden_agent_common::decode`], shared with user space, where it is fuzzed on byte
//! buffers; here it reads user memory through [`User`].
#![expect(
    clippy::cast_possible_truncation,
    reason = "the kernel hands 32-bit values (fds, ioctl commands, pids, loop indices) in 64-bit registers and fields; these casts take the low half as the kernel does, where a checked conversion would add branches for the verifier to walk"
)]

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_probe_read_user},
    macros::tracepoint,
    programs::TracePointContext,
};
use gpuwarden_agent_common::{
    config::ioctl_match,
    decode::{self, Call, DecodeError, Escape, UserMemory, op},
    event::{Event, decode_error, kind},
    maps::{
        DEVICE_UNKNOWN, FdKey, HandleKey, IoctlKey, ObjectInfo, family, memory_kind, node_kind,
        table,
    },
    nvidia::{esc, may_be_driver_ioctl},
};

use crate::{
    arg, atomic, budget, conf, current,
    events::{count, emit},
    fds,
    maps::{GPU_FDS, IOCTL_COUNTS, IOCTLS_IN_FLIGHT, OBJECT_DEVICES, PENDING_IOCTL, PROCS},
    memory, mig, quota, ret,
};
use aya_log_ebpf::warn;
use gpuwarden_agent_common::maps::stat;

#[tracepoint]
pub fn sys_enter_ioctl(ctx: TracePointContext) -> u32 {
    let fd = arg(&ctx, 0) as u32;
    let (tgid, pid_tgid, node, file) =
        if conf!(ioctl_match) == ioctl_match::FILE && conf!(files.valid) != 0 {
            // A command the driver can't act on is no GPU ioctl, whatever the fd: most other
            // drivers' ioctls stop here, before the walk.
            if !may_be_driver_ioctl(arg(&ctx, 1) as u32) {
                return 0;
            }
            // The fd's own file says whether it is a GPU node, however the fd was obtained; every
            // other file's ioctl returns here, before any helper call but the task's.
            let Some((file, node)) = fds::gpu_file(fd) else {
                return 0;
            };
            let (tgid, pid_tgid) = current();
            fds::learn(&ctx, tgid, fd, node, file);
            (tgid, pid_tgid, node, file)
        } else {
            let (tgid, pid_tgid) = current();
            let key = FdKey { tgid, fd };
            // SAFETY: the value is copied out at once.
            let Some(mut info) = (unsafe { GPU_FDS.get(key) }).copied() else {
                return 0;
            };
            if info.file == 0
                && let Some(file) = fds::file_of_fd(key.fd)
            {
                // An fd seeded from /proc: its file is learned on its first ioctl, once.
                info.file = file;
                if GPU_FDS.insert(key, info, 0).is_ok() {
                    memory::file_ref(file);
                }
            }
            (tgid, pid_tgid, info.node, info.file)
        };
    count(stat::GPU_IOCTLS);
    let cmd = arg(&ctx, 1) as u32;
    let params = arg(&ctx, 2);
    // SAFETY: a plain helper call.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    if node.kind == node_kind::UVM {
        count_ioctl(cgroup, node.device, family::UVM, cmd);
        return 0;
    }
    let escape = Escape::of(&User, cmd, params).unwrap_or_else(|err| {
        decode_failed(&ctx, tgid, cgroup, err);
        Escape::direct(cmd, params)
    });
    count_ioctl(cgroup, node.device, family::RM, escape.nr);
    let call = decode::decode(&User, escape).unwrap_or_else(|err| {
        decode_failed(&ctx, tgid, cgroup, err);
        None
    });
    if let Some(mut call) = call {
        call.file = file;
        if call.op == op::VIDMEM {
            // Size and GPU are read only for a cgroup with a quota.
            let what = || {
                let requested = call.size(&User)?;
                Some((vidmem_device(tgid, cgroup, &call, false), requested))
            };
            quota::check_alloc(&ctx, tgid, cgroup, what, u64::from(cmd), arg(&ctx, 2));
        }
        if PENDING_IOCTL.insert(pid_tgid, call, 0).is_ok()
            && let Some(n) = IOCTLS_IN_FLIGHT.get_ptr_mut(0)
        {
            // SAFETY: a live array slot; atomics keep CPUs from losing updates.
            unsafe { atomic::atomic_add(n, 1) };
        }
    }
    0
}

#[tracepoint]
pub fn sys_exit_ioctl(ctx: TracePointContext) -> u32 {
    // Most exits are of ioctls nobody decoded: one array read tells.
    match IOCTLS_IN_FLIGHT.get(0) {
        Some(&n) if n != 0 => {}
        _ => return 0,
    }
    let (tgid, pid_tgid) = current();
    // SAFETY: the value is copied out at once.
    let Some(call) = (unsafe { PENDING_IOCTL.get(pid_tgid) }).copied() else {
        return 0;
    };
    let _ = PENDING_IOCTL.remove(pid_tgid);
    if let Some(n) = IOCTLS_IN_FLIGHT.get_ptr_mut(0) {
        // SAFETY: as above.
        unsafe { atomic::atomic_add(n, u64::MAX) };
    }
    if ret(&ctx) != 0 {
        return 0;
    }
    let Some(status) = call.status(&User) else {
        decode_failed(&ctx, tgid, 0, unreadable_result());
        return 0;
    };
    if status != 0 {
        return 0;
    }
    match call.op {
        op::FREE => {
            if call.object == call.client {
                mig::forget(call.client);
            }
            memory::free(tgid, call.client, call.object);
        }
        op::PARTITION => mig::subscribed(call.client, call.parent, call.value),
        op::CLIENT | op::DEVICE | op::SUBDEVICE | op::VIDMEM | op::SYSMEM => {
            let Some(handle) = call.new_handle(&User) else {
                decode_failed(&ctx, tgid, 0, unreadable_result());
                return 0;
            };
            created(&ctx, tgid, &call, handle);
        }
        _ => {}
    }
    0
}

/// Records what an `RM_ALLOC` that succeeded created.
#[inline(always)]
fn created(ctx: &TracePointContext, tgid: u32, call: &Call, handle: u32) {
    match call.op {
        op::CLIENT => memory::new_client(tgid, handle, call.file),
        op::DEVICE => {
            let key = HandleKey {
                client: call.client,
                handle,
            };
            remember_object(tgid, &key, call.value, handle);
        }
        op::SUBDEVICE => {
            let key = HandleKey {
                client: call.client,
                handle,
            };
            remember_object(
                tgid,
                &key,
                object_device(call.client, call.parent),
                call.parent,
            );
        }
        op::VIDMEM | op::SYSMEM => {
            // The driver writes back the size it really allocated.
            let Some(bytes) = call.size(&User) else {
                let err = DecodeError::new(decode_error::READ_ALLOC_PARAMS, esc::RM_ALLOC, 0);
                decode_failed(ctx, tgid, 0, err);
                return;
            };
            // SAFETY: a plain helper call.
            let cgroup = unsafe { bpf_get_current_cgroup_id() };
            let (device, kind) = if call.op == op::VIDMEM {
                (vidmem_device(tgid, cgroup, call, true), memory_kind::VIDEO)
            } else {
                (DEVICE_UNKNOWN, memory_kind::SYSTEM)
            };
            let parent = HandleKey {
                client: call.client,
                handle: call.parent,
            };
            // SAFETY: the value is copied out at once.
            let device_handle =
                unsafe { OBJECT_DEVICES.get(parent) }.map_or(call.parent, |o| o.device);
            let what = memory::Charge {
                device,
                bytes,
                kind,
                parent: call.parent,
                device_handle,
            };
            memory::charge(tgid, call.client, handle, what);
        }
        _ => {}
    }
}

/// The device video memory allocated under `call.parent` is counted as: its GPU
/// ([`resolve_device`]), or the MIG instance the client subscribed to on it.
#[inline(always)]
fn vidmem_device(tgid: u32, cgroup: u64, call: &Call, learn: bool) -> u32 {
    let gpu = resolve_device(tgid, cgroup, call, learn);
    let parent = HandleKey {
        client: call.client,
        handle: call.parent,
    };
    // SAFETY: the value is copied out at once.
    let device_handle = unsafe { OBJECT_DEVICES.get(parent) }.map_or(call.parent, |o| o.device);
    mig::device_of(call.client, device_handle, gpu)
}

/// The GPU an allocation under `call.parent` is on: the parent's, when the agent saw it made;
/// otherwise the one GPU node the process holds, or the one GPU its cgroup's quota covers (the
/// parent predates the agent); otherwise `DEVICE_UNKNOWN`. With `learn`, a GPU found the second
/// way is remembered as the parent's.
#[inline(always)]
fn resolve_device(tgid: u32, cgroup: u64, call: &Call, learn: bool) -> u32 {
    let device = object_device(call.client, call.parent);
    if device != DEVICE_UNKNOWN {
        return device;
    }
    let nodes = PROCS.get_ptr(tgid).map_or(0, |p| {
        // SAFETY: a live map value.
        unsafe { (*p).gpu_nodes }
    });
    let found = if nodes != 0 && nodes.is_power_of_two() {
        Some(nodes.trailing_zeros())
    } else {
        quota::single_device(cgroup)
    };
    let Some(device) = found else {
        return DEVICE_UNKNOWN;
    };
    if learn {
        let key = HandleKey {
            client: call.client,
            handle: call.parent,
        };
        remember_object(tgid, &key, device, call.parent);
    }
    device
}

/// Records that object `key` is (or is under) device object `device` on GPU `gpu`. A new entry
/// is charged to the cgroup `tgid`'s process is charged to, within its budget of device
/// objects (past it the object stays unknown: `budget::exhausted` then has the cgroup's
/// allocations acted on); an entry already there is updated and stays charged where it was.
#[inline(always)]
fn remember_object(tgid: u32, key: &HandleKey, gpu: u32, device: u32) {
    if let Some(known) = OBJECT_DEVICES.get_ptr_mut(key) {
        // SAFETY: a live map value.
        unsafe {
            (*known).gpu = gpu;
            (*known).device = device;
        }
        return;
    }
    let cgroup = PROCS.get_ptr(tgid).map_or_else(
        // SAFETY: a plain helper call.
        || unsafe { bpf_get_current_cgroup_id() },
        // SAFETY: a live map value; its cgroup never changes after insert.
        |p| unsafe { (*p).cgroup },
    );
    if !budget::take(cgroup, table::OBJECTS) {
        return;
    }
    let info = ObjectInfo {
        gpu,
        device,
        cgroup,
    };
    if OBJECT_DEVICES.insert(key, info, 0).is_err() {
        budget::give(cgroup, table::OBJECTS);
        count(stat::HANDLE_TABLE_FULL);
    }
}

/// The GPU a device or subdevice object belongs to.
#[inline(always)]
fn object_device(client: u32, object: u32) -> u32 {
    let key = HandleKey {
        client,
        handle: object,
    };
    // SAFETY: the value is copied out at once.
    unsafe { OBJECT_DEVICES.get(key) }.map_or(DEVICE_UNKNOWN, |o| o.gpu)
}

/// Adds one to the per-CPU counter of (cgroup, device, family, cmd).
#[inline(always)]
fn count_ioctl(cgroup: u64, device: u32, family: u32, cmd: u32) {
    let key = IoctlKey {
        cgroup,
        device,
        family,
        cmd,
        _pad: 0,
    };
    match IOCTL_COUNTS.get_ptr_mut(key) {
        // SAFETY: a per-CPU value, written only from this CPU with preemption off.
        Some(n) => unsafe { *n += 1 },
        None => {
            let _ = IOCTL_COUNTS.insert(key, 1, 0);
        }
    }
}

/// Reports an ioctl that could not be decoded.
#[inline(always)]
fn decode_failed(ctx: &TracePointContext, tgid: u32, cgroup: u64, err: DecodeError) {
    count(stat::DECODE_ERRORS);
    warn!(
        ctx,
        "cannot decode escape {:x} of tgid {}: reason {}", err.escape, tgid, err.reason
    );
    emit(Event {
        kind: kind::DECODE_ERROR,
        tgid,
        cgroup,
        code: err.reason,
        handle: err.escape,
        bytes: err.detail,
        ..Event::default()
    });
}

/// The driver's answer to a decoded call can't be read back.
#[inline(always)]
const fn unreadable_result() -> DecodeError {
    DecodeError::new(decode_error::READ_RESULT, esc::RM_ALLOC, 0)
}

/// The calling process's memory, read with `bpf_probe_read_user` (which fails, rather than
/// faults, on a bad pointer).
struct User;

impl UserMemory for User {
    #[inline(always)]
    fn words<const N: usize>(&self, addr: u64) -> Option<[u32; N]> {
        // SAFETY: the helper faults safely on bad user pointers.
        unsafe { bpf_probe_read_user(addr as *const [u32; N]) }.ok()
    }
}
