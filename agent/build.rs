//! Builds the eBPF programs and puts the object in `OUT_DIR`, where `sensor` embeds it, so the
//! agent ships as one file.
//!
//! `GPUWARDEN_EBPF_OBJECT=path` embeds a prebuilt object instead. The eBPF crate builds in
//! `ebpf/` under the target directory (`CARGO_TARGET_DIR` when set).

use std::{env, fs, path::PathBuf, process::ExitCode};

use gpuwarden_ebpf_toolchain::Toolchain;

fn main() -> ExitCode {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let workspace = manifest
        .parent()
        .expect("agent/ is inside the workspace")
        .to_owned();
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("set by cargo")).join("gpuwarden.bpf.o");
    for watched in [
        "agent-ebpf/src",
        "agent-ebpf/Cargo.toml",
        "agent-ebpf/common/src",
    ] {
        println!(
            "cargo:rerun-if-changed={}",
            workspace.join(watched).display()
        );
    }
    println!("cargo:rerun-if-env-changed=GPUWARDEN_EBPF_OBJECT");
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");

    if let Some(prebuilt) = env::var_os("GPUWARDEN_EBPF_OBJECT") {
        if let Err(e) = fs::copy(&prebuilt, &out) {
            eprintln!(
                "error: GPUWARDEN_EBPF_OBJECT={}: {e}",
                PathBuf::from(prebuilt).display()
            );
            return ExitCode::FAILURE;
        }
        return ExitCode::SUCCESS;
    }

    let toolchain = match Toolchain::detect() {
        Ok(toolchain) => toolchain,
        Err(missing) => {
            eprintln!("error: {missing}");
            return ExitCode::FAILURE;
        }
    };
    let cargo = PathBuf::from(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    // Beside the workspace's other build outputs, wherever CARGO_TARGET_DIR puts them (a relative
    // one is taken from the workspace root, where cargo is usually run).
    let target_dir = env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace.join("target"), |dir| workspace.join(dir))
        .join("ebpf");
    let status = toolchain
        .build_command(&cargo, &workspace, &target_dir)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => {
            eprintln!("error: building the eBPF programs with {toolchain} failed ({s})");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("error: cannot run cargo for the eBPF programs ({toolchain}): {e}");
            return ExitCode::FAILURE;
        }
    }
    let object = Toolchain::object_path(&target_dir);
    if let Err(e) = fs::copy(&object, &out) {
        eprintln!(
            "error: copying {} to {}: {e}",
            object.display(),
            out.display()
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
