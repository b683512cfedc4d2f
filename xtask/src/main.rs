//! `cargo xtask`: gpuwarden's development tasks, one module per job.

mod bench;
mod buf;
mod build_ebpf;
mod gpu_check;
mod modgraph;
mod run;
mod setup;
mod sim;
mod test;

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "gpuwarden's development tasks")]
struct Cli {
    #[command(subcommand)]
    command: Job,
}

#[derive(Subcommand)]
enum Job {
    /// Install what this machine lacks to build and test gpuwarden (idempotent).
    Setup,
    /// Build the eBPF programs and print where the object is.
    BuildEbpf,
    /// Build and run the agent on this node (needs root).
    Run {
        /// Mint a throw-away CA and certificates and run both over mutual TLS.
        #[arg(long)]
        tls: bool,
        /// Arguments passed to `gpuwarden-agent run`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, then check formatting, lints and run every test (needs root for the eBPF tests).
    Test,
    /// Lint the protos with buf and check them against `main`'s (installs buf if missing; part
    /// of `test`).
    Buf,
    /// Replay a job trace under binpack, spread and interference-aware placement and print
    /// the table (the bundled trace unless --trace or --seed is given); with --teams, teams
    /// sharing the cluster without queues and with team queues and reclaim.
    Sim {
        /// Arguments passed to `gpuwarden-sim` (--trace FILE, --seed N, --json, …).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// On a machine with an NVIDIA GPU (as root): the agent's bytes against NVML, the memory
    /// limit, the compute-share throttle, the agent's cost and the driver hooks, in one table.
    /// Refuses without a GPU.
    GpuCheck(gpu_check::Args),
    /// Find import circles between each crate's modules (see `xtask/src/modgraph.rs`); fails on
    /// one `xtask/modgraph.allow` does not list.
    Modgraph {
        /// Also list each child module that uses its parent's own items.
        #[arg(long)]
        up: bool,
        /// Measure another checkout of the repository (to compare with an older commit).
        #[arg(long, value_name = "DIR")]
        root: Option<PathBuf>,
    },
    /// Run a benchmark and print its table.
    Bench {
        /// Which benchmark.
        #[command(subcommand)]
        which: bench::Which,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Job::Setup => setup::run(),
        Job::BuildEbpf => build_ebpf::run().map(|_| ()),
        Job::Run { tls, args } => run::run(tls, &args),
        Job::Test => test::run(),
        Job::Buf => buf::install().and_then(|()| buf::check()),
        Job::Bench { which } => bench::run(&which),
        Job::Sim { args } => sim::run(&args),
        Job::GpuCheck(args) => gpu_check::run(&args),
        Job::Modgraph { up, root } => modgraph::run(up, root.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_owned)
}

/// Where cargo puts what it builds for this workspace: `CARGO_TARGET_DIR` when set, else
/// `target/` in the workspace.
fn target_dir() -> PathBuf {
    resolve_target_dir(
        std::env::var_os("CARGO_TARGET_DIR").as_deref(),
        &workspace(),
    )
}

/// The target directory for a `CARGO_TARGET_DIR` of `env` (unset or empty: none). A relative one
/// is taken from `workspace`, where [`cargo`] runs every build.
fn resolve_target_dir(env: Option<&OsStr>, workspace: &Path) -> PathBuf {
    match env.filter(|dir| !dir.is_empty()) {
        Some(dir) => workspace.join(dir),
        None => workspace.join("target"),
    }
}

/// The cargo that runs this task.
fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace());
    cmd
}

/// Runs `cmd`, failing with its command line when it fails.
fn status(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {shown}"))?;
    if !status.success() {
        bail!("{shown} failed ({status})");
    }
    Ok(())
}

/// Builds the agent, controller and CLI binaries in release, as shipped; returns the folder that
/// holds them.
fn build_release_binaries() -> anyhow::Result<PathBuf> {
    build_release(&[])
}

/// [`build_release_binaries`] with the agent's `bench` feature (the baseline `ioctl` matches
/// `cargo xtask bench ebpf` times). The next [`build_release_binaries`] puts the shipped agent
/// back in the folder.
fn build_bench_binaries() -> anyhow::Result<PathBuf> {
    build_release(&["--features", "gpuwarden-agent/bench"])
}

fn build_release(extra: &[&str]) -> anyhow::Result<PathBuf> {
    status(
        cargo()
            .args([
                "build",
                "--release",
                "-p",
                "gpuwarden-agent",
                "-p",
                "gpuwarden-controller",
                "-p",
                "gpuwarden-cli",
            ])
            .args(extra),
    )?;
    Ok(target_dir().join("release"))
}

/// Whether this process runs as root.
fn is_root() -> bool {
    // SAFETY: a plain syscall.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_directory_follows_cargo_target_dir() {
        let ws = Path::new("/src/gpuwarden");
        assert_eq!(
            resolve_target_dir(None, ws),
            Path::new("/src/gpuwarden/target")
        );
        assert_eq!(
            resolve_target_dir(Some(OsStr::new("")), ws),
            Path::new("/src/gpuwarden/target"),
            "an empty value is no value"
        );
        assert_eq!(
            resolve_target_dir(Some(OsStr::new("/var/cache/cargo")), ws),
            Path::new("/var/cache/cargo")
        );
        assert_eq!(
            resolve_target_dir(Some(OsStr::new("out/build")), ws),
            Path::new("/src/gpuwarden/out/build"),
            "relative to the workspace, where the builds run"
        );
    }

    /// The `key = value` lines of TOML table `name` in `manifest` (comments and blanks left out).
    fn table<'a>(manifest: &'a str, name: &str) -> Vec<&'a str> {
        let header = format!("[{name}]");
        manifest
            .lines()
            .map(str::trim)
            .skip_while(|l| *l != header)
            .skip(1)
            .take_while(|l| !l.starts_with('['))
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    }

    /// One set of lints: every crate inherits the workspace's and sets none of its own
    /// (exceptions are `#[expect(…, reason)]` in the code, where they apply).
    #[test]
    fn every_crate_inherits_the_workspace_lints() {
        let ws = workspace();
        let root = std::fs::read_to_string(ws.join("Cargo.toml")).unwrap();
        let members = table(&root, "workspace");
        let members: Vec<&str> = members
            .iter()
            .skip_while(|l| !l.starts_with("members"))
            .skip(1)
            .take_while(|l| !l.starts_with(']'))
            .map(|l| l.trim_matches(|c| c == '"' || c == ','))
            .collect();
        assert!(members.len() > 10, "members not found: {members:?}");
        for member in members {
            let manifest = std::fs::read_to_string(ws.join(member).join("Cargo.toml")).unwrap();
            assert_eq!(
                table(&manifest, "lints"),
                ["workspace = true"],
                "{member}/Cargo.toml must inherit the workspace lints"
            );
            assert!(
                !manifest.contains("[lints."),
                "{member}/Cargo.toml sets lints of its own"
            );
        }
    }
}
