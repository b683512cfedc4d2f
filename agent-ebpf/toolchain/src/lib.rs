//! Finds a toolchain that can build gpuwarden's eBPF programs, and builds them.
//!
//! The programs are Rust compiled for `bpfel-unknown-none`, which needs a `core` library for that
//! target and the `bpf-linker`. Two toolchains provide `core`:
//!
//! - Debian's `rustc-web` with `libstd-rust-web-dev-bpf` ships a prebuilt `core` for the target
//!   (`/usr/bin/rustc`); it is used with `RUSTC_BOOTSTRAP=1` since aya-ebpf needs unstable features;
//! - a rustup nightly with `rust-src` builds `core` itself (`-Z build-std=core`).
//!
//! Both the agent's build script (which embeds the object in the agent binary) and
//! `cargo xtask setup`/`build-ebpf` use this crate, so they agree on what is missing.

use std::{
    env,
    fmt::{self, Display},
    path::{Path, PathBuf},
    process::Command,
};

/// The eBPF target.
pub const TARGET: &str = "bpfel-unknown-none";

/// The eBPF package and its binary (the object's file name).
pub const PACKAGE: &str = "gpuwarden-agent-ebpf";
/// Name of the object cargo produces.
pub const OBJECT: &str = "gpuwarden";

/// Debian's rustc, which can carry a prebuilt `core` for the eBPF target.
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";

/// A toolchain that builds the programs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Toolchain {
    /// Debian's rustc with the prebuilt `core` for the target.
    Debian {
        /// Path of the rustc.
        rustc: PathBuf,
        /// Path of bpf-linker.
        linker: PathBuf,
    },
    /// rustup's nightly, building `core` from `rust-src`.
    Nightly {
        /// Path of bpf-linker.
        linker: PathBuf,
    },
}

/// What is missing to build the programs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// No `core` for the target (neither Debian's nor a nightly with `rust-src`).
    pub core: bool,
    /// No `bpf-linker` on `PATH` or in `$CARGO_HOME/bin`.
    pub linker: bool,
}

impl Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.core {
            parts.push(
                "a Rust `core` for bpfel-unknown-none (Debian: `apt-get install rustc-web \
                 libstd-rust-web-dev-bpf`; or `rustup toolchain install nightly --component rust-src`)",
            );
        }
        if self.linker {
            parts.push(
                "bpf-linker (`cargo install bpf-linker --no-default-features --features llvm-22` \
                 with `LLVM_PREFIX=/usr/lib/llvm-22` after `apt-get install llvm-22-dev \
                 libpolly-22-dev libzstd-dev zlib1g-dev`)",
            );
        }
        write!(
            f,
            "cannot build the eBPF programs: missing {}. `cargo xtask setup` installs them.",
            parts.join(" and ")
        )
    }
}

impl std::error::Error for Missing {}

impl Toolchain {
    /// Finds a usable toolchain, preferring Debian's (no `core` to build).
    ///
    /// # Errors
    /// Returns what is missing.
    pub fn detect() -> Result<Self, Missing> {
        let linker = find_linker();
        let core = if debian_has_bpf_core() {
            Some(true)
        } else if nightly_has_rust_src() {
            Some(false)
        } else {
            None
        };
        match (core, linker) {
            (Some(true), Some(linker)) => Ok(Self::Debian {
                rustc: PathBuf::from(DEBIAN_RUSTC),
                linker,
            }),
            (Some(false), Some(linker)) => Ok(Self::Nightly { linker }),
            (core, linker) => Err(Missing {
                core: core.is_none(),
                linker: linker.is_none(),
            }),
        }
    }

    /// The cargo command that builds the programs into `target_dir`, run from the workspace root.
    ///
    /// `cargo` is the cargo to run (the caller's, for the Debian toolchain).
    #[must_use]
    pub fn build_command(&self, cargo: &Path, workspace: &Path, target_dir: &Path) -> Command {
        let mut cmd = match self {
            Self::Debian { .. } => Command::new(cargo),
            Self::Nightly { .. } => {
                let mut cmd = Command::new("rustup");
                cmd.args(["run", "nightly", "cargo"]);
                cmd
            }
        };
        cmd.current_dir(workspace)
            .args([
                "build",
                "--release",
                "--package",
                PACKAGE,
                "--target",
                TARGET,
            ])
            .arg("--target-dir")
            .arg(target_dir);
        // What the outer build set for the host compiler must not leak into this one.
        for key in [
            "RUSTC",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_BUILD_RUSTFLAGS",
            "CARGO_TARGET_DIR",
        ] {
            cmd.env_remove(key);
        }
        let linker = match self {
            Self::Debian { rustc, linker } => {
                cmd.env("RUSTC", rustc).env("RUSTC_BOOTSTRAP", "1");
                linker
            }
            Self::Nightly { linker } => {
                cmd.args(["-Z", "build-std=core"]);
                linker
            }
        };
        cmd.env("CARGO_TARGET_BPFEL_UNKNOWN_NONE_LINKER", linker);
        // BTF: the verifier needs func_info for bpf_loop callbacks, and aya-log reads it.
        cmd.env(
            "CARGO_TARGET_BPFEL_UNKNOWN_NONE_RUSTFLAGS",
            "-C debuginfo=2 -C link-arg=--btf",
        );
        cmd
    }

    /// Where [`Self::build_command`] leaves the object.
    #[must_use]
    pub fn object_path(target_dir: &Path) -> PathBuf {
        target_dir.join(TARGET).join("release").join(OBJECT)
    }
}

impl Display for Toolchain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Debian { rustc, linker } => write!(
                f,
                "Debian rustc ({}) with its prebuilt core, {}",
                rustc.display(),
                linker.display()
            ),
            Self::Nightly { linker } => {
                write!(
                    f,
                    "rustup nightly with -Z build-std=core, {}",
                    linker.display()
                )
            }
        }
    }
}

/// Whether Debian's rustc has a `core` for the target.
fn debian_has_bpf_core() -> bool {
    let Ok(output) = Command::new(DEBIAN_RUSTC)
        .args(["--print", "sysroot"])
        .output()
    else {
        return false;
    };
    if !output.status.success() {
        return false;
    }
    let sysroot = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let lib = Path::new(&sysroot)
        .join("lib/rustlib")
        .join(TARGET)
        .join("lib");
    std::fs::read_dir(lib).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("libcore-") && name.ends_with(".rlib")
        })
    })
}

/// Whether rustup has a nightly toolchain with `rust-src`.
fn nightly_has_rust_src() -> bool {
    let Ok(output) = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output()
    else {
        return false;
    };
    if !output.status.success() {
        return false;
    }
    let sysroot = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    Path::new(&sysroot)
        .join("lib/rustlib/src/rust/library/core")
        .is_dir()
}

/// Finds `bpf-linker` on `PATH` or in `$CARGO_HOME/bin` (where `cargo install` puts it).
#[must_use]
pub fn find_linker() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = env::var_os("PATH")
        .map(|p| env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(home) = env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(home).join("bin"));
    }
    if let Some(home) = env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo/bin"));
    }
    dirs.into_iter()
        .map(|d| d.join("bpf-linker"))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_names_each_prerequisite() {
        let both = Missing {
            core: true,
            linker: true,
        }
        .to_string();
        assert!(both.contains("libstd-rust-web-dev-bpf"), "{both}");
        assert!(both.contains("bpf-linker"), "{both}");
        let linker_only = Missing {
            core: false,
            linker: true,
        }
        .to_string();
        assert!(!linker_only.contains("rust-src"), "{linker_only}");
        assert!(linker_only.contains("cargo xtask setup"), "{linker_only}");
    }
}
