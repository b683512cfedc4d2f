//! The one read-modify-write the BPF target lacks in `core`: an atomic add on a map value. A
//! leaf that every counting module uses, so none of them imports another for it.

/// Adds `value` to `*p` atomically (subtract with `value.wrapping_neg()`).
///
/// # Safety
/// `p` must point to a live, 8-byte aligned map value.
#[cfg(target_arch = "bpf")]
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

/// [`atomic_add`] on a 4-byte value (`lock *(u32 *)(dst + off) += src`).
///
/// # Safety
/// `p` must point to a live, 4-byte aligned map value.
#[cfg(target_arch = "bpf")]
#[inline(always)]
pub unsafe fn atomic_add32(p: *mut u32, value: u32) {
    // SAFETY: guaranteed by the caller.
    unsafe {
        core::arch::asm!(
            "lock *(u32 *)({p} + 0) += {v}",
            p = in(reg) p,
            v = in(reg) value,
            options(nostack),
        );
    }
}

/// The host's [`atomic_add`], so that clippy can check this crate on the host target (the BPF
/// target's `core` has no clippy here); the programs are never built for the host otherwise.
///
/// # Safety
/// As on BPF.
#[cfg(not(target_arch = "bpf"))]
#[inline(always)]
pub unsafe fn atomic_add(p: *mut u64, value: u64) {
    // SAFETY: guaranteed by the caller (live and 8-byte aligned).
    unsafe { core::sync::atomic::AtomicU64::from_ptr(p) }
        .fetch_add(value, core::sync::atomic::Ordering::Relaxed);
}

/// The host's [`atomic_add32`], for clippy as [`atomic_add`].
///
/// # Safety
/// As on BPF.
#[cfg(not(target_arch = "bpf"))]
#[inline(always)]
pub unsafe fn atomic_add32(p: *mut u32, value: u32) {
    // SAFETY: guaranteed by the caller (live and 4-byte aligned).
    unsafe { core::sync::atomic::AtomicU32::from_ptr(p) }
        .fetch_add(value, core::sync::atomic::Ordering::Relaxed);
}
