//! The sweep the agent's upkeep runs (`BPF_PROG_TEST_RUN`; the program is never attached): files
//! the programs kept past their last tracked fd, because someone they don't follow held them,
//! are released once the kernel has released them (`memory::sweep_files`).

use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};

use crate::memory;

/// Named for a tracepoint only because the program type needs one: it is run, not attached.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn sweep_files(_ctx: RawTracePointContext) -> i32 {
    memory::sweep_files();
    0
}
