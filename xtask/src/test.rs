//! `cargo xtask test`: what CI runs. Setup, formatting, lints, then every test.

use crate::{cargo, setup, status};

/// Runs the whole check.
pub fn run() -> anyhow::Result<()> {
    setup::run()?;
    if !crate::is_root() {
        eprintln!(
            "xtask test: not root: the eBPF and FUSE tests will fail (they need root); run as root"
        );
    }
    status(cargo().args(["fmt", "--all", "--check"]))?;
    status(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
    status(cargo().args(["test", "--no-fail-fast"]))?;
    Ok(())
}
