//! `ioctl` enter/exit on tracked GPU fds, and decoding of the NVIDIA escapes that create and free
//! objects.
//!
//! Enter counts the ioctl and, for `RM_ALLOC`/`RM_FREE`, records what the exit needs; exit reads
//! the driver's answer (the ioctl's return and the params' `status`) and charges or releases
//! memory only on success. Any other fd costs one map lookup at enter and one array read at exit.

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_probe_read_user},
    macros::tracepoint,
    programs::TracePointContext,
};
use gpuwarden_agent_common::{
    event::{Event, decode_error, kind},
    maps::{
        DEVICE_UNKNOWN, FdKey, HandleKey, IoctlKey, ObjectInfo, family, memory_kind, node_kind,
    },
    nvidia::{
        class, esc, ioctl_nr, ioctl_size, memory_alloc, nvos00, nvos02, nvos21, nvos32, nvos64,
        xfer,
    },
};

use crate::{
    arg, current,
    events::{count, emit},
    maps::{GPU_FDS, IOCTL_COUNTS, IOCTLS_IN_FLIGHT, OBJECT_DEVICES, PENDING_IOCTL, PROCS},
    memory, quota, ret,
};
use aya_log_ebpf::warn;
use gpuwarden_agent_common::maps::stat;

/// What an ioctl in flight will do once the driver answers.
pub mod op {
    /// Creates a client.
    pub const CLIENT: u32 = 1;
    /// Creates a device object; `value` is its `deviceId`.
    pub const DEVICE: u32 = 2;
    /// Creates a subdevice object under `parent`.
    pub const SUBDEVICE: u32 = 3;
    /// Allocates video memory under `parent`; `size_at` points at its size.
    pub const VIDMEM: u32 = 4;
    /// Frees `object` (the client itself when `object == client`).
    pub const FREE: u32 = 5;
    /// Allocates host memory for the GPU under `parent`; `size_at` points at its size.
    pub const SYSMEM: u32 = 6;
}

/// Bits of [`Call::flags`].
pub mod call_flags {
    /// The field at `size_at` is a limit: the size minus one (`NVOS02`).
    pub const SIZE_IS_LIMIT: u32 = 1;
}

/// An ioctl in flight (value of `PENDING_IOCTL`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Call {
    /// One of [`op`].
    pub op: u32,
    /// Offset of `status` in the params.
    pub status_offset: u32,
    /// User address of the params.
    pub params: u64,
    /// User address of the allocation's size (`VIDMEM`, `SYSMEM`) or of the nested allocation
    /// params (`DEVICE`).
    pub size_at: u64,
    /// `hRoot`.
    pub client: u32,
    /// `hObjectParent`.
    pub parent: u32,
    /// `hObjectOld` for a free.
    pub object: u32,
    /// Op-specific value.
    pub value: u32,
    /// Offset of the new object's handle in the params, read at exit.
    pub handle_offset: u32,
    /// [`call_flags`].
    pub flags: u32,
    /// The open file the ioctl was issued on (0: unknown).
    pub file: u64,
}

impl Call {
    /// The bytes the field at `size_at` stands for, read from user memory.
    #[inline(always)]
    fn size(&self) -> Option<u64> {
        let raw = read_u64(self.size_at)?;
        Some(if self.flags & call_flags::SIZE_IS_LIMIT != 0 {
            raw.saturating_add(1)
        } else {
            raw
        })
    }
}

#[tracepoint]
pub fn sys_enter_ioctl(ctx: TracePointContext) -> u32 {
    let (tgid, pid_tgid) = current();
    let key = FdKey {
        tgid,
        fd: arg(&ctx, 0) as u32,
    };
    // SAFETY: the value is copied out at once.
    let Some(mut info) = (unsafe { GPU_FDS.get(&key) }).copied() else {
        return 0;
    };
    let node = info.node;
    if info.file == 0
        && let Some(file) = crate::fds::file_of_fd(key.fd)
    {
        // An fd seeded from /proc: its file is learned on its first ioctl, once.
        info.file = file;
        if GPU_FDS.insert(&key, &info, 0).is_ok() {
            memory::file_ref(file);
        }
    }
    count(stat::GPU_IOCTLS);
    let cmd = arg(&ctx, 1) as u32;
    let params = arg(&ctx, 2);
    // SAFETY: a plain helper call.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    if node.kind == node_kind::UVM {
        count_ioctl(cgroup, node.device, family::UVM, cmd);
        return 0;
    }
    let (nr, size, params) = match unwrap_xfer(&ctx, tgid, cgroup, cmd, params) {
        Some(inner) => inner,
        None => (ioctl_nr(cmd), ioctl_size(cmd), params),
    };
    count_ioctl(cgroup, node.device, family::RM, nr);
    let call = match nr {
        esc::RM_ALLOC => decode_alloc(&ctx, tgid, cgroup, size, params),
        esc::RM_FREE => decode_free(&ctx, tgid, cgroup, size, params),
        esc::RM_ALLOC_MEMORY => decode_alloc_memory(&ctx, tgid, cgroup, size, params),
        esc::RM_VID_HEAP_CONTROL => decode_vid_heap(&ctx, tgid, cgroup, size, params),
        _ => None,
    };
    if let Some(mut call) = call {
        call.file = info.file;
        if call.op == op::VIDMEM {
            // Size and GPU are read only for a cgroup with a quota.
            let what = || {
                let requested = call.size()?;
                Some((resolve_device(tgid, cgroup, &call, false), requested))
            };
            quota::check_alloc(&ctx, tgid, cgroup, what, u64::from(cmd), arg(&ctx, 2));
        }
        if PENDING_IOCTL.insert(&pid_tgid, &call, 0).is_ok() {
            if let Some(n) = IOCTLS_IN_FLIGHT.get_ptr_mut(0) {
                // SAFETY: a live array slot; atomics keep CPUs from losing updates.
                unsafe { memory::atomic_add(n, 1) };
            }
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
    let Some(call) = (unsafe { PENDING_IOCTL.get(&pid_tgid) }).copied() else {
        return 0;
    };
    let _ = PENDING_IOCTL.remove(&pid_tgid);
    if let Some(n) = IOCTLS_IN_FLIGHT.get_ptr_mut(0) {
        // SAFETY: as above.
        unsafe { memory::atomic_add(n, u64::MAX) };
    }
    if ret(&ctx) != 0 {
        return 0;
    }
    let Some(status) = read_u32(call.params + u64::from(call.status_offset)) else {
        decode_failed(&ctx, tgid, 0, decode_error::READ_RESULT, esc::RM_ALLOC, 0);
        return 0;
    };
    if status != 0 {
        return 0;
    }
    match call.op {
        op::FREE => memory::free(tgid, call.client, call.object),
        op::CLIENT | op::DEVICE | op::SUBDEVICE | op::VIDMEM | op::SYSMEM => {
            let Some(handle) = read_u32(call.params + u64::from(call.handle_offset)) else {
                decode_failed(&ctx, tgid, 0, decode_error::READ_RESULT, esc::RM_ALLOC, 0);
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
            let info = ObjectInfo {
                gpu: call.value,
                device: handle,
            };
            let _ = OBJECT_DEVICES.insert(&key, &info, 0);
        }
        op::SUBDEVICE => {
            let key = HandleKey {
                client: call.client,
                handle,
            };
            let info = ObjectInfo {
                gpu: object_device(call.client, call.parent),
                device: call.parent,
            };
            let _ = OBJECT_DEVICES.insert(&key, &info, 0);
        }
        op::VIDMEM | op::SYSMEM => {
            // The driver writes back the size it really allocated.
            let Some(bytes) = call.size() else {
                decode_failed(
                    ctx,
                    tgid,
                    0,
                    decode_error::READ_ALLOC_PARAMS,
                    esc::RM_ALLOC,
                    0,
                );
                return;
            };
            // SAFETY: a plain helper call.
            let cgroup = unsafe { bpf_get_current_cgroup_id() };
            let (device, kind) = if call.op == op::VIDMEM {
                (resolve_device(tgid, cgroup, call, true), memory_kind::VIDEO)
            } else {
                (DEVICE_UNKNOWN, memory_kind::SYSTEM)
            };
            let parent = HandleKey {
                client: call.client,
                handle: call.parent,
            };
            // SAFETY: the value is copied out at once.
            let device_handle =
                unsafe { OBJECT_DEVICES.get(&parent) }.map_or(call.parent, |o| o.device);
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
    let nodes = PROCS.get_ptr(&tgid).map_or(0, |p| {
        // SAFETY: a live map value.
        unsafe { (*p).gpu_nodes }
    });
    let found = if nodes != 0 && nodes & (nodes - 1) == 0 {
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
        let info = ObjectInfo {
            gpu: device,
            device: call.parent,
        };
        let _ = OBJECT_DEVICES.insert(&key, &info, 0);
    }
    device
}

/// The GPU a device or subdevice object belongs to.
#[inline(always)]
fn object_device(client: u32, object: u32) -> u32 {
    let key = HandleKey {
        client,
        handle: object,
    };
    // SAFETY: the value is copied out at once.
    unsafe { OBJECT_DEVICES.get(&key) }.map_or(DEVICE_UNKNOWN, |o| o.gpu)
}

/// Unwraps `IOCTL_XFER_CMD` into the inner (nr, size, params).
#[inline(always)]
fn unwrap_xfer(
    ctx: &TracePointContext,
    tgid: u32,
    cgroup: u64,
    cmd: u32,
    params: u64,
) -> Option<(u32, u32, u64)> {
    if ioctl_nr(cmd) != esc::IOCTL_XFER_CMD {
        return None;
    }
    if ioctl_size(cmd) != xfer::SIZE {
        decode_failed(
            ctx,
            tgid,
            cgroup,
            decode_error::BAD_SIZE,
            esc::IOCTL_XFER_CMD,
            0,
        );
        return None;
    }
    // SAFETY: the helper faults safely on bad user pointers.
    let Ok(raw) = (unsafe { bpf_probe_read_user(params as *const [u32; 4]) }) else {
        decode_failed(
            ctx,
            tgid,
            cgroup,
            decode_error::READ_PARAMS,
            esc::IOCTL_XFER_CMD,
            0,
        );
        return None;
    };
    let ptr = u64::from(raw[xfer::PTR / 4]) | (u64::from(raw[xfer::PTR / 4 + 1]) << 32);
    Some((raw[xfer::CMD / 4], raw[xfer::PARAMS_SIZE / 4], ptr))
}

/// Decodes `RM_ALLOC` (NVOS21 or NVOS64) into the work its exit will do.
#[inline(always)]
fn decode_alloc(
    ctx: &TracePointContext,
    tgid: u32,
    cgroup: u64,
    size: u32,
    params: u64,
) -> Option<Call> {
    // Both forms share the first 24 bytes; they differ in where paramsSize and status are.
    let (status_offset, params_size_offset) = if size == nvos21::SIZE {
        (nvos21::STATUS, nvos21::PARAMS_SIZE)
    } else if size == nvos64::SIZE {
        (nvos64::STATUS, nvos64::PARAMS_SIZE)
    } else {
        decode_failed(
            ctx,
            tgid,
            cgroup,
            decode_error::BAD_SIZE,
            esc::RM_ALLOC,
            u64::from(size),
        );
        return None;
    };
    // SAFETY: the helper faults safely on bad user pointers.
    let Ok(head) = (unsafe { bpf_probe_read_user(params as *const [u32; 8]) }) else {
        decode_failed(
            ctx,
            tgid,
            cgroup,
            decode_error::READ_PARAMS,
            esc::RM_ALLOC,
            0,
        );
        return None;
    };
    let h_class = head[nvos21::H_CLASS / 4];
    let alloc_params = u64::from(head[nvos21::P_ALLOC_PARMS / 4])
        | (u64::from(head[nvos21::P_ALLOC_PARMS / 4 + 1]) << 32);
    let mut call = Call {
        op: 0,
        status_offset: status_offset as u32,
        params,
        size_at: alloc_params,
        client: head[nvos21::H_ROOT / 4],
        parent: head[nvos21::H_OBJECT_PARENT / 4],
        object: 0,
        value: 0,
        handle_offset: nvos21::H_OBJECT_NEW as u32,
        flags: 0,
        file: 0,
    };
    match h_class {
        c if class::is_client(c) => call.op = op::CLIENT,
        class::DEVICE_0 => {
            let Some(device_id) = read_u32(alloc_params) else {
                decode_failed(
                    ctx,
                    tgid,
                    cgroup,
                    decode_error::READ_ALLOC_PARAMS,
                    esc::RM_ALLOC,
                    0,
                );
                return None;
            };
            call.op = op::DEVICE;
            call.value = device_id;
        }
        class::SUBDEVICE_0 => call.op = op::SUBDEVICE,
        class::MEMORY_LOCAL_USER | class::MEMORY_SYSTEM => {
            // NVOS21 carries paramsSize in the head already read; NVOS64 past it.
            let params_size = if size == nvos21::SIZE {
                head[nvos21::PARAMS_SIZE / 4]
            } else {
                let Some(params_size) = read_u32(params + params_size_offset as u64) else {
                    decode_failed(
                        ctx,
                        tgid,
                        cgroup,
                        decode_error::READ_PARAMS,
                        esc::RM_ALLOC,
                        0,
                    );
                    return None;
                };
                params_size
            };
            // Drivers append fields to these params; the ones read here (up to `size` at 64)
            // have kept their offsets, so any size from the oldest known layout up is read.
            // 0 is what CUDA sends in NVOS64 (driver 580): the driver takes the size from the
            // class, not from the caller.
            if params_size != 0 && params_size < memory_alloc::SIZE_OLD {
                decode_failed(
                    ctx,
                    tgid,
                    cgroup,
                    decode_error::BAD_SIZE,
                    esc::RM_ALLOC,
                    // The ioctl's params size above the allocation params' size.
                    (u64::from(size) << 32) | u64::from(params_size),
                );
                return None;
            }
            // SAFETY: the helper faults safely on bad user pointers.
            let Ok(fields) = (unsafe { bpf_probe_read_user(alloc_params as *const [u32; 7]) })
            else {
                decode_failed(
                    ctx,
                    tgid,
                    cgroup,
                    decode_error::READ_ALLOC_PARAMS,
                    esc::RM_ALLOC,
                    0,
                );
                return None;
            };
            let flags = fields[memory_alloc::FLAGS / 4];
            let location = (fields[memory_alloc::ATTR / 4] >> memory_alloc::ATTR_LOCATION_SHIFT)
                & memory_alloc::ATTR_LOCATION_MASK;
            // A VA reservation holds no memory; system memory, or local memory placed in host
            // memory, is counted apart from video memory.
            if flags & memory_alloc::FLAGS_VIRTUAL != 0 {
                return None;
            }
            call.op =
                if h_class == class::MEMORY_SYSTEM || location == memory_alloc::ATTR_LOCATION_PCI {
                    op::SYSMEM
                } else {
                    op::VIDMEM
                };
            call.size_at = alloc_params + memory_alloc::SIZE_FIELD as u64;
        }
        _ => return None,
    }
    Some(call)
}

/// Decodes `RM_FREE` (NVOS00).
#[inline(always)]
fn decode_free(
    ctx: &TracePointContext,
    tgid: u32,
    cgroup: u64,
    size: u32,
    params: u64,
) -> Option<Call> {
    if size != nvos00::SIZE {
        decode_failed(
            ctx,
            tgid,
            cgroup,
            decode_error::BAD_SIZE,
            esc::RM_FREE,
            u64::from(size),
        );
        return None;
    }
    // SAFETY: the helper faults safely on bad user pointers.
    let Ok(raw) = (unsafe { bpf_probe_read_user(params as *const [u32; 4]) }) else {
        decode_failed(
            ctx,
            tgid,
            cgroup,
            decode_error::READ_PARAMS,
            esc::RM_FREE,
            0,
        );
        return None;
    };
    Some(Call {
        op: op::FREE,
        status_offset: nvos00::STATUS as u32,
        params,
        size_at: 0,
        client: raw[nvos00::H_ROOT / 4],
        parent: raw[nvos00::H_OBJECT_PARENT / 4],
        object: raw[nvos00::H_OBJECT_OLD / 4],
        value: 0,
        handle_offset: 0,
        flags: 0,
        file: 0,
    })
}

/// Decodes `RM_ALLOC_MEMORY` (`nvos02_with_fd`): system memory and user memory pinned for the
/// GPU are host memory of `limit + 1` bytes; other classes (a framebuffer view) hold none.
#[inline(always)]
fn decode_alloc_memory(
    ctx: &TracePointContext,
    tgid: u32,
    cgroup: u64,
    size: u32,
    params: u64,
) -> Option<Call> {
    if size != nvos02::SIZE {
        decode_failed(
            ctx,
            tgid,
            cgroup,
            decode_error::BAD_SIZE,
            esc::RM_ALLOC_MEMORY,
            u64::from(size),
        );
        return None;
    }
    // SAFETY: the helper faults safely on bad user pointers.
    let Ok(head) = (unsafe { bpf_probe_read_user(params as *const [u32; 4]) }) else {
        decode_failed(
            ctx,
            tgid,
            cgroup,
            decode_error::READ_PARAMS,
            esc::RM_ALLOC_MEMORY,
            0,
        );
        return None;
    };
    let h_class = head[nvos02::H_CLASS / 4];
    if h_class != class::MEMORY_SYSTEM && h_class != class::MEMORY_SYSTEM_OS_DESCRIPTOR {
        return None;
    }
    Some(Call {
        op: op::SYSMEM,
        status_offset: nvos02::STATUS as u32,
        params,
        size_at: params + nvos02::LIMIT as u64,
        client: head[nvos02::H_ROOT / 4],
        parent: head[nvos02::H_OBJECT_PARENT / 4],
        object: 0,
        value: 0,
        handle_offset: nvos02::H_OBJECT_NEW as u32,
        flags: call_flags::SIZE_IS_LIMIT,
        file: 0,
    })
}

/// Decodes `RM_VID_HEAP_CONTROL` (`NVOS32`): `ALLOC_SIZE` allocates video or host memory by its
/// location (`_ANY` counted as video memory, where the driver prefers to put it; a virtual
/// allocation holds none); `FREE` frees `hMemory`.
#[inline(always)]
fn decode_vid_heap(
    ctx: &TracePointContext,
    tgid: u32,
    cgroup: u64,
    size: u32,
    params: u64,
) -> Option<Call> {
    if size != nvos32::SIZE {
        decode_failed(
            ctx,
            tgid,
            cgroup,
            decode_error::BAD_SIZE,
            esc::RM_VID_HEAP_CONTROL,
            u64::from(size),
        );
        return None;
    }
    // hRoot … data.AllocSize.attr: the first 60 bytes.
    // SAFETY: the helper faults safely on bad user pointers.
    let Ok(head) = (unsafe { bpf_probe_read_user(params as *const [u32; 15]) }) else {
        decode_failed(
            ctx,
            tgid,
            cgroup,
            decode_error::READ_PARAMS,
            esc::RM_VID_HEAP_CONTROL,
            0,
        );
        return None;
    };
    let mut call = Call {
        op: 0,
        status_offset: nvos32::STATUS as u32,
        params,
        size_at: params + nvos32::ALLOC_SIZE as u64,
        client: head[nvos32::H_ROOT / 4],
        parent: head[nvos32::H_OBJECT_PARENT / 4],
        object: 0,
        value: 0,
        handle_offset: nvos32::H_MEMORY as u32,
        flags: 0,
        file: 0,
    };
    match head[nvos32::FUNCTION / 4] {
        nvos32::FUNCTION_ALLOC_SIZE => {
            if head[nvos32::ALLOC_FLAGS / 4] & nvos32::FLAGS_VIRTUAL != 0 {
                return None;
            }
            let location = (head[nvos32::ALLOC_ATTR / 4] >> nvos32::ATTR_LOCATION_SHIFT)
                & nvos32::ATTR_LOCATION_MASK;
            call.op = if location == nvos32::LOCATION_PCI {
                op::SYSMEM
            } else {
                op::VIDMEM
            };
        }
        nvos32::FUNCTION_FREE => {
            call.op = op::FREE;
            call.object = head[nvos32::H_MEMORY / 4];
        }
        _ => return None,
    }
    Some(call)
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
    match IOCTL_COUNTS.get_ptr_mut(&key) {
        // SAFETY: a per-CPU value, written only from this CPU with preemption off.
        Some(n) => unsafe { *n += 1 },
        None => {
            let _ = IOCTL_COUNTS.insert(&key, &1, 0);
        }
    }
}

/// Reports an ioctl that could not be decoded.
#[inline(always)]
fn decode_failed(
    ctx: &TracePointContext,
    tgid: u32,
    cgroup: u64,
    reason: u32,
    nr: u32,
    detail: u64,
) {
    count(stat::DECODE_ERRORS);
    warn!(
        ctx,
        "cannot decode escape {:x} of tgid {}: reason {}", nr, tgid, reason
    );
    emit(Event {
        kind: kind::DECODE_ERROR,
        tgid,
        cgroup,
        code: reason,
        handle: nr,
        bytes: detail,
        ..Event::default()
    });
}

#[inline(always)]
fn read_u32(addr: u64) -> Option<u32> {
    // SAFETY: the helper faults safely on bad user pointers.
    unsafe { bpf_probe_read_user(addr as *const u32) }.ok()
}

#[inline(always)]
fn read_u64(addr: u64) -> Option<u64> {
    // SAFETY: the helper faults safely on bad user pointers.
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}
