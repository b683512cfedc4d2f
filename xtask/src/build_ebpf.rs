//! `cargo xtask build-ebpf`: builds the eBPF object (the agent's build script does the same
//! and embeds it).

use std::path::PathBuf;

use gpuwarden_ebpf_toolchain::Toolchain;

use crate::{status, target_dir, workspace};

/// Builds the object and returns its path.
pub fn run() -> anyhow::Result<PathBuf> {
    let toolchain = Toolchain::detect()?;
    let target_dir = target_dir().join("ebpf");
    let cargo = PathBuf::from(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    status(&mut toolchain.build_command(&cargo, &workspace(), &target_dir))?;
    let object = Toolchain::object_path(&target_dir);
    let size = std::fs::metadata(&object)?.len();
    println!("built {} ({size} bytes) with {toolchain}", object.display());
    Ok(object)
}
