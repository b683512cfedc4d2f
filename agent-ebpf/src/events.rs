//! The ring buffer to user space and the per-CPU statistics.

use aya_ebpf::helpers::bpf_get_current_comm;
use gpuwarden_agent_common::{event::Event, maps::stat};

use crate::maps::{EVENTS, STATS};

/// Adds one to statistic `index`.
#[inline(always)]
pub fn count(index: u32) {
    if let Some(p) = STATS.get_ptr_mut(index) {
        // SAFETY: a per-CPU slot, written only from this CPU with preemption off.
        unsafe { *p += 1 };
    }
}

/// Sends `event` (filling in `comm`), counting a drop when the buffer is full.
#[inline(always)]
pub fn emit(mut event: Event) {
    event.comm = bpf_get_current_comm().unwrap_or_default();
    if EVENTS.output::<Event>(&event, 0).is_err() {
        count(stat::RINGBUF_DROPS);
    }
}
