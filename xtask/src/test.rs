//! `cargo xtask test`: what CI runs. Setup, formatting, lints (Rust, the module graph, and `buf`
//! on the protos), the Kubernetes manifests (validated offline against the OpenAPI schemas), then
//! every test.

use std::process::Command;

use crate::{cargo, setup, status, workspace};

/// Runs the whole check.
pub fn run() -> anyhow::Result<()> {
    setup::run()?;
    if !crate::is_root() {
        eprintln!(
            "xtask test: not root: the tests marked `needs root` (eBPF, FUSE, cgroups) will fail; run as root"
        );
    }
    status(cargo().args(["fmt", "--all", "--check"]))?;
    status(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
    // The agent's bench-only code (its `bench` feature, out of the shipped binary) and the bench
    // that needs it.
    status(cargo().args([
        "clippy",
        "-p",
        "gpuwarden-agent",
        "--all-targets",
        "--features",
        "bench",
        "--",
        "-D",
        "warnings",
    ]))?;
    lint_kernel_crate()?;
    // No import circle between a crate's modules beyond those xtask/modgraph.allow names.
    crate::modgraph::run(false, None)?;
    // The API's protos: lint, and nothing that breaks `main`'s v1.
    crate::buf::check()?;
    status(
        Command::new(setup::validator_python())
            .arg(workspace().join("deploy/kubernetes/validate.py")),
    )?;
    // Tests that need root are `#[ignore = "needs root"]` so a plain `cargo test` names what it
    // skipped; CI runs them all (see the root policy in `gpuwarden-test-support`).
    status(cargo().args(["test", "--no-fail-fast", "--", "--include-ignored"]))?;
    Ok(())
}

/// Clippy on the kernel-side crate. Its BPF target's `core` comes prebuilt with Debian's rustc,
/// which has no clippy, so it is checked for the host (the crate's two assembly helpers have host
/// twins); `panic=abort` because a `no_std` crate cannot unwind.
fn lint_kernel_crate() -> anyhow::Result<()> {
    let host = host_triple()?;
    status(
        cargo()
            .args(["clippy", "-p", "gpuwarden-agent-ebpf", "--target", &host])
            .args(["--", "-D", "warnings"])
            .env("RUSTFLAGS", "-C panic=abort"),
    )
}

/// The host's target triple, as the toolchain's `rustc -vV` names it.
fn host_triple() -> anyhow::Result<String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(&rustc).arg("-vV").output()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("`{} -vV` names no host", rustc.to_string_lossy()))
}
