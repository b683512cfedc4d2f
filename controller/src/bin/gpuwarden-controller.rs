//! `gpuwarden-controller run [--listen ADDR] [--state-dir DIR] [--config FILE]` (see
//! [`gpuwarden_controller::server`]).

/// mimalloc rather than glibc's allocator: every request, watch message and stored record
/// allocates on whichever worker thread runs it and frees on another, and glibc's arenas spent
/// a sixth of the process's CPU on that in `cargo xtask bench e2e` (lock waits and
/// consolidation). The bench runs under the same allocator (`controller/sim/benches/e2e.rs`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    gpuwarden_controller::server::main()
}
