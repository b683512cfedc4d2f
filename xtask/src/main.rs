//! `cargo xtask`: gpuwarden's development tasks, one module per job.

mod bench;
mod build_ebpf;
mod run;
mod setup;
mod sim;
mod test;

use std::{
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
        /// Arguments passed to `gpuwarden-agent run`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, then check formatting, lints and run every test (needs root for the eBPF tests).
    Test,
    /// Replay a job trace under binpack, spread and interference-aware placement and print
    /// the table (the bundled trace unless --trace or --seed is given).
    Sim {
        /// Arguments passed to `gpuwarden-sim` (--trace FILE, --seed N, --json, …).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
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
        Job::Run { args } => run::run(&args),
        Job::Test => test::run(),
        Job::Bench { which } => bench::run(&which),
        Job::Sim { args } => sim::run(&args),
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

/// Builds the agent and controller binaries in release; returns the folder that holds them.
fn build_release_binaries() -> anyhow::Result<PathBuf> {
    status(cargo().args([
        "build",
        "--release",
        "-p",
        "gpuwarden-agent",
        "-p",
        "gpuwarden-controller",
    ]))?;
    Ok(workspace().join("target/release"))
}

/// Whether this process runs as root.
fn is_root() -> bool {
    // SAFETY: a plain syscall.
    unsafe { libc::geteuid() == 0 }
}
