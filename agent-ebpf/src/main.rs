//! gpuwarden's eBPF programs.
//!
//! They keep a table of the file descriptors that refer to NVIDIA device nodes, decode the ioctls
//! issued on them, and count ioctls and GPU memory per cgroup. Everything else (names, policy,
//! attribution to containers) lives in the agent. The programs are grouped by concern:
//!
//! - [`fds`]: the GPU fd table (`openat`, `openat2`, `dup*`, `fcntl(F_DUPFD*)`, `close`);
//! - [`ioctl`]: `ioctl` enter/exit on tracked fds, NVIDIA escape decoding;
//! - [`memory`]: charging and releasing GPU memory by allocation, client and process;
//! - [`mig`]: MIG instances, by each client's subscription to a GPU instance;
//! - [`process`]: fork (copy the fd table), exec and exit (release what the process held);
//! - [`budget`]: per-cgroup budgets of the tables a container can grow;
//! - [`quota`]: GPU-memory limits at the allocating ioctl, GPU-node access of bound cgroups;
//! - [`sweep`]: files kept for a holder the table doesn't follow, released once the kernel has;
//! - [`uvm`]: managed memory, by the length of each `mmap` of the UVM node;
//! - [`btf_walk`]: the task → fd → file → inode walk as direct loads the verifier types;
//! - [`atomic`]: the atomic add every counter uses;
//! - [`events`]: the ring buffer to user space and the statistics counters;
//! - [`driver_probe`]: empty driver hooks, loaded only to learn whether the kernel allows them.
#![no_std]
#![no_main]
// Inline assembly on the BPF target (atomic add) is still unstable.
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]
// Clippy checks this crate on the host target (`cargo xtask lint-ebpf`: the BPF target's `core`
// has no clippy here), where `atomic` and `btf_walk` have host twins of their assembly.
#![expect(
    clippy::inline_always,
    reason = "each program reaches the verifier as one function: its helpers are inlined, never called"
)]
#![expect(
    clippy::needless_pass_by_value,
    reason = "aya's program macros hand each program its context by value"
)]

mod atomic;
mod btf_walk;
mod budget;
mod driver_probe;
mod events;
mod fds;
mod ioctl;
mod maps;
mod memory;
mod mig;
mod process;
mod quota;
mod sweep;
mod uvm;

use aya_ebpf::{EbpfContext as _, helpers::bpf_get_current_pid_tgid, programs::TracePointContext};
use gpuwarden_agent_common::config::Config;

/// Load-time settings, written by the agent before loading (see `config::CONFIG_SYMBOL`).
#[unsafe(no_mangle)]
static GPUWARDEN_CONFIG: Config = Config::DEFAULT;

/// Reads one load-time setting, `conf!(files.valid)`: a volatile read of that field alone, so the
/// compiler can't fold the defaults and the hot paths pay one load rather than a copy of the
/// whole [`Config`]. The verifier knows the value (the settings are read-only data, frozen at
/// load), so it prunes the paths the settings turn off.
macro_rules! conf {
    ($($field:tt)+) => {
        // SAFETY: a plain read of a static the loader patched before the program ran.
        unsafe { core::ptr::read_volatile(&raw const $crate::GPUWARDEN_CONFIG.$($field)+) }
    };
}
pub(crate) use conf;

/// Reads the load-time settings. The volatile read keeps the compiler from folding the defaults.
#[inline(always)]
fn config() -> Config {
    // SAFETY: a plain read of a static the loader patched before the program ran.
    unsafe { core::ptr::read_volatile(&raw const GPUWARDEN_CONFIG) }
}

/// Offset of syscall argument `n` in a `syscalls/sys_enter_*` record.
const fn syscall_arg(n: usize) -> usize {
    16 + 8 * n
}

/// Offset of the return value in a `syscalls/sys_exit_*` record.
const SYSCALL_RET: usize = 16;

/// Reads syscall argument `n` of a `sys_enter_*` tracepoint.
///
/// A direct load from the record: the verifier allows it inside the tracepoint's record, and it
/// saves the `bpf_probe_read_kernel` call `read_at` makes on the hottest path.
#[inline(always)]
#[expect(
    clippy::cast_ptr_alignment,
    reason = "the record is 8-byte aligned and so is each argument's offset"
)]
fn arg(ctx: &TracePointContext, n: usize) -> u64 {
    // SAFETY: the offset lies inside every sys_enter record (6 arguments).
    unsafe {
        ctx.as_ptr()
            .cast::<u8>()
            .add(syscall_arg(n))
            .cast::<u64>()
            .read()
    }
}

/// Reads the return value of a `sys_exit_*` tracepoint.
#[inline(always)]
#[expect(
    clippy::cast_ptr_alignment,
    reason = "the record is 8-byte aligned and so is the return value's offset"
)]
fn ret(ctx: &TracePointContext) -> i64 {
    // SAFETY: every sys_exit record has `ret` at this offset.
    unsafe {
        ctx.as_ptr()
            .cast::<u8>()
            .add(SYSCALL_RET)
            .cast::<i64>()
            .read()
    }
}

/// The current thread's `(tgid, pid_tgid)`.
#[inline(always)]
fn current() -> (u32, u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    ((pid_tgid >> 32) as u32, pid_tgid)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
