//! Empty programs on the NVIDIA driver's ioctl entry, loaded only to find out whether this
//! kernel lets a driver hook load (`gpuwarden-agent probe-hooks`): the most targeted tier would
//! spare every other file's ioctl the tracepoint's look-up (docs/architecture.md, "The most
//! targeted hook wins"). They count nothing.

use aya_ebpf::{
    macros::{fentry, kprobe},
    programs::{FEntryContext, ProbeContext},
};

#[fentry(function = "nvidia_unlocked_ioctl")]
pub fn driver_fentry(_ctx: FEntryContext) -> u32 {
    0
}

#[kprobe]
pub fn driver_kprobe(_ctx: ProbeContext) -> u32 {
    0
}
