//! Quotas of bound workloads: GPU-memory limits checked at the allocating ioctl, the usage those
//! checks read, and which GPU nodes a bound cgroup may open.
//!
//! The agent maps every cgroup of a bound workload to its quota (`CGROUP_QUOTA`, keyed by the id of
//! the cgroup the workload is bound at, which outlives agent restarts) and writes the limits
//! (`QUOTAS`); the programs keep `used` in step with every charge and release. An
//! over-limit allocation is refused by the LSM program where BPF LSM loads, and otherwise acted
//! on from the tracepoint by the quota's policy (docs/architecture.md, "Enforcement tiers").

use aya_ebpf::{
    bindings::BPF_DEVCG_ACC_MKNOD,
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_send_signal},
    macros::{cgroup_device, lsm},
    programs::{DeviceContext, LsmContext, TracePointContext},
};
use aya_log_ebpf::warn;
use gpuwarden_agent_common::{
    event::{Event, action, kind},
    maps::{
        DEVICE_MODESET, DEVICE_UNKNOWN, Deny, MAX_GPUS, NO_LIMIT, NVIDIA_MAJOR, UNKNOWN_SLOT,
        enforce_mode, memory_policy, memory_slot, quota_flags, stat,
    },
};

use crate::{
    atomic::atomic_add,
    budget,
    events::{count, emit},
    maps::{CGROUP_QUOTA, DENY, QUOTAS, SETTINGS},
};

const SIGKILL: u32 = 9;
const SIGSTOP: u32 = 19;
const ENOMEM: i32 = 12;

/// The quota `cgroup` counts against (the id of the cgroup its workload is bound at).
#[inline(always)]
fn slot_of(cgroup: u64) -> Option<u64> {
    // SAFETY: the value is copied out at once.
    unsafe { CGROUP_QUOTA.get(cgroup) }.copied()
}

/// The one GPU the quota `cgroup` is bound to covers (the only one it may open, or the only one
/// with a limit): where its allocations must be when nothing else tells.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "`MAX_GPUS` and the indexes below it are small"
)]
pub fn single_device(cgroup: u64) -> Option<u32> {
    let slot = slot_of(cgroup)?;
    let quota = QUOTAS.get_ptr(slot)?;
    // SAFETY: a live map value.
    let (flags, devices) = unsafe { ((*quota).flags, (*quota).devices) };
    if flags & quota_flags::DEVICES != 0 && devices != 0 && devices.is_power_of_two() {
        let index = devices.trailing_zeros();
        return (index < MAX_GPUS as u32).then_some(index);
    }
    let mut found = None;
    for index in 0..MAX_GPUS {
        // SAFETY: a live map value; `index` is in bounds.
        if unsafe { (*quota).limit[index] } != NO_LIMIT {
            if found.is_some() {
                return None;
            }
            found = Some(index as u32);
        }
    }
    found
}

/// Adds `delta` (two's complement for a release) to the usage of the quota `cgroup` is bound to.
#[inline(always)]
pub fn account(cgroup: u64, device: u32, delta: u64) {
    let Some(slot) = slot_of(cgroup) else {
        return;
    };
    let Some(quota) = QUOTAS.get_ptr_mut(slot) else {
        return;
    };
    let index = memory_slot(device);
    // SAFETY: a live map value; `index` is in bounds.
    unsafe {
        let used = &raw mut (*quota).used[index];
        // Bytes charged before the cgroup was bound are seeded by the agent, but a release racing
        // the seeding could still take more than is held: clamp at zero instead of wrapping.
        if delta > i64::MAX as u64 && *used < delta.wrapping_neg() {
            *used = 0;
        } else {
            atomic_add(used, delta);
        }
    }
}

/// Checks an allocation by the current task against its cgroup's quota, and acts when it would
/// cross the limit. `what` reads the allocation's GPU and requested bytes (only for a cgroup
/// with a quota: the rest pay one look-up). `cmd` and `arg` are the ioctl as issued (the LSM
/// program matches them).
#[inline(always)]
pub fn check_alloc(
    ctx: &TracePointContext,
    tgid: u32,
    cgroup: u64,
    what: impl FnOnce() -> Option<(u32, u64)>,
    cmd: u64,
    arg: u64,
) {
    let Some(slot) = slot_of(cgroup) else {
        return;
    };
    let Some(quota) = QUOTAS.get_ptr_mut(slot) else {
        return;
    };
    let Some((device, requested)) = what() else {
        return;
    };
    // SAFETY: a live map value; indexes are in bounds.
    let (used, limit, policy) = unsafe {
        if (device as usize) < MAX_GPUS {
            let index = gpu_index(device);
            (
                (*quota).used[index],
                (*quota).limit[index],
                (*quota).memory_policy,
            )
        } else {
            // A GPU nothing tells: the quota's bytes on every GPU against all its limits (no
            // check when a GPU it may use has none).
            let mut used = (*quota).used[UNKNOWN_SLOT];
            let mut limit = 0u64;
            for index in 0..MAX_GPUS {
                used = used.saturating_add((*quota).used[index]);
                let l = (*quota).limit[index];
                if l == NO_LIMIT && (*quota).devices & (1 << index) != 0 {
                    limit = NO_LIMIT;
                } else if l != NO_LIMIT {
                    limit = limit.saturating_add(l);
                }
            }
            (used, limit, (*quota).memory_policy)
        }
    };
    // At its budget of processes, clients or allocations the allocation's bytes could go
    // uncounted: acted on like one past the limit.
    if (limit == NO_LIMIT || used.saturating_add(requested) <= limit) && !budget::exhausted(cgroup)
    {
        return;
    }
    let mode = SETTINGS.get(0).copied().unwrap_or(enforce_mode::SIGNAL);
    let taken = if mode == enforce_mode::LSM_DENY {
        let _ = DENY.insert(bpf_get_current_pid_tgid(), Deny { cmd, arg }, 0);
        action::DENY
    } else {
        match policy {
            memory_policy::KILL => {
                // SAFETY: a plain helper call; it signals the current process.
                unsafe { bpf_send_signal(SIGKILL) };
                action::KILL
            }
            memory_policy::STOP => {
                // SAFETY: as above.
                unsafe { bpf_send_signal(SIGSTOP) };
                action::STOP
            }
            _ => action::REPORT,
        }
    };
    // SAFETY: a live map value.
    unsafe { atomic_add(&raw mut (*quota).actions, 1) };
    count(stat::QUOTA_ACTIONS);
    warn!(
        ctx,
        "GPU memory quota {} exceeded by tgid {}: {} + {} > {} on GPU {}, action {}",
        slot,
        tgid,
        used,
        requested,
        limit,
        device,
        taken
    );
    emit(Event {
        kind: kind::QUOTA_EXCEEDED,
        tgid,
        cgroup,
        device,
        code: taken,
        bytes: requested,
        used,
        limit,
        ..Event::default()
    });
}

/// Attached to each bound cgroup (alongside the runtime's own device program): a GPU node
/// (`nvidiaN`) may be opened only when the cgroup's quota lists it (made with `mknod`, any); control nodes and other
/// devices are left to the other programs. A cgroup under a bound one that is not mapped yet is
/// refused GPU nodes (fail closed) until the agent maps it.
#[cgroup_device]
pub fn gpu_devices(ctx: DeviceContext) -> i32 {
    // SAFETY: the kernel passes a valid context; its fields are plain reads.
    let (access_type, major, minor) = unsafe {
        (
            (*ctx.device).access_type,
            (*ctx.device).major,
            (*ctx.device).minor,
        )
    };
    // A MIG capability node (`nvidia-cap<minor>`) is opened only as its quota lists it.
    let caps = crate::mig::caps_major();
    let is_cap = caps != 0 && major == caps;
    if !is_cap && (major != NVIDIA_MAJOR || minor >= DEVICE_MODESET) {
        return 1;
    }
    // Making the node is not using it: a runtime that creates every GPU node its spec lists
    // after it joined the cgroup (runc does) must not fail to start the container because the
    // quota bound in between. Opening the node is what is refused.
    if access_type >> 16 == BPF_DEVCG_ACC_MKNOD {
        return 1;
    }
    // SAFETY: a plain helper call.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    let slot = slot_of(cgroup);
    let at_budget = budget::fds_exhausted(cgroup);
    if let Some(slot) = slot
        && let Some(quota) = QUOTAS.get_ptr_mut(slot)
    {
        // SAFETY: a live map value.
        let (flags, devices) = unsafe { ((*quota).flags, (*quota).devices) };
        let listed = flags & quota_flags::DEVICES == 0
            || if is_cap {
                crate::mig::cap_allowed(slot, minor)
            } else {
                minor < 64 && devices & (1u64 << minor) != 0
            };
        // A cgroup at its fd budget opens no more GPU nodes.
        if listed && !at_budget {
            return 1;
        }
        // SAFETY: a live map value.
        unsafe { atomic_add(&raw mut (*quota).denied_opens, 1) };
    }
    count(stat::DEVICE_DENIED);
    let (tgid, _) = crate::current();
    emit(Event {
        kind: kind::DEVICE_DENIED,
        tgid,
        cgroup,
        // A capability node is no GPU: reported as device unknown.
        device: if is_cap { DEVICE_UNKNOWN } else { minor },
        // 2: at its fd budget; 1: bound to a quota that lacks the GPU; 0: not mapped yet.
        code: if at_budget {
            2
        } else {
            u32::from(slot.is_some())
        },
        ..Event::default()
    });
    0
}

/// Refuses, with `-ENOMEM`, the ioctl the tracepoint found over its quota (where BPF LSM loads).
#[lsm(hook = "file_ioctl")]
pub fn gpu_file_ioctl(ctx: LsmContext) -> i32 {
    let previous: i32 = ctx.arg(3);
    if previous != 0 {
        return previous;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: the value is copied out at once.
    let Some(deny) = (unsafe { DENY.get(pid_tgid) }).copied() else {
        return 0;
    };
    let cmd: u64 = ctx.arg(1);
    let arg: u64 = ctx.arg(2);
    if deny.cmd != cmd & 0xffff_ffff || deny.arg != arg {
        return 0;
    }
    let _ = DENY.remove(pid_tgid);
    -ENOMEM
}

/// `device` (below [`MAX_GPUS`]) as an index of the per-GPU arrays, masked in the register the
/// access uses: the compiler drops a mask it proves redundant and may test a copy of the
/// register it then indexes with, which the verifier can't follow (a GPU resolved through a MIG
/// subscription reaches here by such a path).
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "a `u32` fits the BPF target's 64-bit `usize`"
)]
fn gpu_index(device: u32) -> usize {
    const _: () = assert!(MAX_GPUS == 16, "the mask below is MAX_GPUS - 1");
    let mut index = u64::from(device);
    // SAFETY: an AND on a register; no memory is touched.
    unsafe {
        core::arch::asm!("{i} &= 15", i = inout(reg) index, options(pure, nomem, nostack));
    }
    // Again in Rust, so the compiler knows the bound too (else it adds a panicking check).
    index as usize & (MAX_GPUS - 1)
}
