//! `cargo xtask setup`: installs what a fresh Debian machine lacks, and nothing when all is there.
//!
//! - the eBPF toolchain (ARCHITECTURE.md's recipe): Debian's `rustc-web` with the prebuilt `core`
//!   for `bpfel-unknown-none`, LLVM 22, and `bpf-linker` built against it; a rustup nightly with
//!   `rust-src` is used instead when present;
//! - FUSE 3 for the fake NVIDIA driver the tests mount.

use std::{path::Path, process::Command};

use anyhow::{Context as _, bail};
use gpuwarden_ebpf_toolchain::{Missing, Toolchain, find_linker};

use crate::status;

/// Debian packages for Debian's eBPF-capable rustc and for building bpf-linker.
const TOOLCHAIN_PACKAGES: &[&str] = &[
    "rustc-web",
    "libstd-rust-web-dev-bpf",
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
];

/// Debian packages the tests need at run time.
const TEST_PACKAGES: &[&str] = &["fuse3"];

/// Installs what is missing.
pub fn run() -> anyhow::Result<()> {
    let mut packages: Vec<&str> = Vec::new();
    let missing = match Toolchain::detect() {
        Ok(toolchain) => {
            println!("setup: eBPF toolchain ready: {toolchain}");
            None
        }
        Err(missing) => Some(missing),
    };
    if let Some(Missing { core, linker }) = missing
        && (core || (linker && !Path::new("/usr/lib/llvm-22/bin/llvm-config").exists()))
    {
        packages.extend(TOOLCHAIN_PACKAGES);
    }
    if !Path::new("/usr/bin/fusermount3").exists() && !Path::new("/bin/fusermount3").exists() {
        packages.extend(TEST_PACKAGES);
    }
    if !packages.is_empty() {
        apt_install(&packages)?;
    }
    if find_linker().is_none() {
        println!("setup: building bpf-linker against LLVM 22 (about a minute)");
        status(
            Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
                .args([
                    "install",
                    "bpf-linker",
                    "--locked",
                    "--no-default-features",
                    "--features",
                    "llvm-22",
                ])
                .env("LLVM_PREFIX", "/usr/lib/llvm-22"),
        )?;
    }
    let toolchain = Toolchain::detect().context("after installing")?;
    println!("setup: done ({toolchain})");
    Ok(())
}

fn apt_install(packages: &[&str]) -> anyhow::Result<()> {
    if !crate::is_root() {
        bail!(
            "missing Debian packages: {}; run `cargo xtask setup` as root or `apt-get install -y {}`",
            packages.join(" "),
            packages.join(" ")
        );
    }
    println!("setup: apt-get install {}", packages.join(" "));
    status(
        Command::new("apt-get")
            .args(["update", "-q"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    status(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}
