//! `cargo xtask run`: builds the agent and runs it on this node.

use anyhow::bail;

use crate::{cargo, status, workspace};

/// Builds and runs `gpuwarden-agent run ARGS`.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    if !crate::is_root() {
        bail!("the agent loads eBPF programs: run as root");
    }
    crate::setup::run()?;
    status(cargo().args(["build", "--release", "-p", "gpuwarden-agent"]))?;
    let agent = workspace().join("target/release/gpuwarden-agent");
    status(std::process::Command::new(agent).arg("run").args(args))
}
