//! The `gpuwarden-agent` command line: the node daemon and its local clients. A library module so
//! that test builds of the binary run the very same code.

use std::{io::IsTerminal as _, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use crate::{
    api::{self, DEFAULT_SOCKET, Request},
    checkpoint,
    config::{AgentConfig, Settings},
    daemon,
    export::top,
    sensor::pins,
};

/// gpuwarden's node agent: traces GPU ioctls with eBPF and attributes them to containers.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "parsed once at start; boxing the flags buys nothing"
)]
enum Command {
    /// Run the agent (needs root: loads eBPF programs).
    Run {
        /// TOML config file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Pin nothing: enforcement ends with the agent (benchmarks, trials).
        #[arg(long, conflicts_with = "bpf_pin_dir")]
        no_pin: bool,
        /// The settings a flag may give (each also a key of the config file, which they win
        /// over).
        #[command(flatten)]
        flags: Settings,
    },
    /// Resume a process the `stop` memory policy stopped (SIGCONT).
    Resume {
        /// The process.
        #[arg(long)]
        pid: u32,
        /// Local socket path.
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
    },
    /// Kill a process of a workload with a quota (SIGKILL).
    Kill {
        /// The process.
        #[arg(long)]
        pid: u32,
        /// Local socket path.
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
    },
    /// Suspend a session's workload: its GPU memory to host memory, its cgroup frozen (as a
    /// preemption in mode `suspend`; where the driver refuses, it is preempted the kill way).
    /// The outcome shows in the snapshot's events.
    Suspend {
        /// The session.
        #[arg(long)]
        session: String,
        /// Local socket path.
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
    },
    /// Resume a suspended session.
    ResumeSuspended {
        /// The session.
        #[arg(long)]
        session: String,
        /// Local socket path.
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
    },
    /// Remove the pinned programs and maps: ends all enforcement on this node (uninstall).
    Unpin {
        /// The pin directory.
        #[arg(long, default_value = pins::DEFAULT_PIN_DIR)]
        bpf_pin_dir: PathBuf,
    },
    /// Try to load each NVIDIA driver hook (kprobe and fentry on the driver's ioctl entry, and an
    /// fentry on a core kernel function) and say which this kernel allows (needs root).
    ProbeHooks {
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
    /// Read each GPU's MIG profile table from NVML (profiles, possible placements) and compare
    /// it with the placement rules gpuwarden makes instances by; read only: nothing is created
    /// or destroyed. Prints JSON (`ok`, `gpus` or `error`); exits 0 even without NVML.
    MigTable,
    /// One CUDA checkpoint call on a process (the helper the agent runs to suspend a workload;
    /// it loads libcuda, which the agent itself never does). Prints one JSON line; exits 0 when
    /// the call succeeded, 3 when the driver refused it, 1 when it could not be made, 4 when
    /// its agent (`--parent`) ended first.
    Checkpoint {
        /// The target process.
        #[arg(long)]
        pid: u32,
        /// The call.
        #[arg(long, value_enum)]
        action: checkpoint::Action,
        /// Bounds a lock in the driver (0: no bound).
        #[arg(long, default_value_t = 0)]
        timeout_ms: u32,
        /// The driver library to load.
        #[arg(long, default_value = checkpoint::driver::LIBCUDA)]
        library: PathBuf,
        /// For a restore onto other GPUs: `OLD=NEW`, GPU UUIDs, one per GPU the process left
        /// (the driver's `CUcheckpointGpuPair`, CUDA 13.0 and later).
        #[arg(long = "gpu-pair")]
        gpu_pairs: Vec<checkpoint::GpuPair>,
        /// The agent that started this helper (its pid, which must be this process's parent):
        /// the helper ends (exit 4) when it does, even in the middle of the call.
        #[arg(long)]
        parent: Option<u32>,
    },
    /// Print one snapshot of GPU use per container.
    Snapshot {
        /// Print the JSON document instead of a table.
        #[arg(long)]
        json: bool,
        /// Local socket path.
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
    },
    /// Show GPU use per container, refreshed every second (one frame when not on a terminal).
    Top {
        /// Local socket path.
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Print one frame and exit (the default when stdout is not a terminal).
        #[arg(long)]
        once: bool,
    },
}

/// Runs the command line (the whole of `gpuwarden-agent`'s `main`).
#[must_use]
pub fn main() -> ExitCode {
    // The checkpoint helper is synchronous and short-lived: no runtime, no logging set-up.
    let cli = Cli::parse();
    if let Command::Checkpoint {
        pid,
        action,
        timeout_ms,
        library,
        gpu_pairs,
        parent,
    } = &cli.command
    {
        if let Some(parent) = parent
            && let Err(e) = checkpoint::parent::end_with(*parent)
        {
            // Its agent is gone (or never was its parent): nothing is done in its name.
            eprintln!("gpuwarden-agent checkpoint: not watching the agent {parent}: {e}");
            return ExitCode::from(checkpoint::parent::ORPHANED);
        }
        return checkpoint_helper(&library.clone(), *pid, *action, *timeout_ms, gpu_pairs);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gpuwarden-agent: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(main_async(cli))
}

fn checkpoint_helper(
    library: &std::path::Path,
    pid: u32,
    action: checkpoint::Action,
    timeout_ms: u32,
    gpu_pairs: &[checkpoint::GpuPair],
) -> ExitCode {
    let answer = checkpoint::driver::answer(library, pid, action, timeout_ms, gpu_pairs);
    match serde_json::to_string(&answer) {
        Ok(line) => println!("{line}"),
        Err(e) => eprintln!("gpuwarden-agent: {e}"),
    }
    match answer {
        checkpoint::Answer::Ok { .. } => ExitCode::SUCCESS,
        checkpoint::Answer::Refused { .. } | checkpoint::Answer::NoGpuPairs { .. } => {
            ExitCode::from(3)
        }
        checkpoint::Answer::Error { .. } => ExitCode::FAILURE,
    }
}

async fn main_async(cli: Cli) -> ExitCode {
    gpuwarden_runtime::logging::init("info");
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuwarden-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run {
            config,
            no_pin,
            mut flags,
        } => {
            // The config layer reads an empty pin directory as "pin nothing".
            if no_pin {
                flags.bpf_pin_dir = Some(PathBuf::new());
            }
            let config = AgentConfig::load(config.as_deref(), flags)?;
            daemon::run(config).await?;
        }
        // Answered in `main`, before any runtime starts.
        Command::Checkpoint { .. } => anyhow::bail!("checkpoint runs without the runtime"),
        Command::Snapshot { json, socket } => {
            let snapshot = api::snapshot(&socket).await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&snapshot).context("encoding the snapshot")?
                );
            } else {
                print!("{}", top::render(&snapshot));
            }
        }
        Command::Resume { pid, socket } => signal(&socket, Request::Resume { pid }).await?,
        Command::Kill { pid, socket } => signal(&socket, Request::Kill { pid }).await?,
        Command::Suspend { session, socket } => {
            let request = Request::Suspend {
                session_id: session,
            };
            let a = api::client::suspend(&socket, &request).await?;
            println!("suspending session {}: see its events", a.session_id);
        }
        Command::ResumeSuspended { session, socket } => {
            let request = Request::ResumeSuspended {
                session_id: session,
            };
            let a = api::client::suspend(&socket, &request).await?;
            println!("resuming session {}: see its events", a.session_id);
        }
        Command::ProbeHooks { json } => {
            let trials = crate::sensor::try_driver_hooks();
            if json {
                println!("{}", serde_json::to_string_pretty(&trials)?);
            } else {
                for t in &trials {
                    let verdict = if t.loaded { "loads" } else { "refused" };
                    println!("{:<15} {:<22} {verdict}: {}", t.hook, t.target, t.detail);
                }
            }
        }
        Command::MigTable => {
            let doc = match crate::devices::nvml::mig_tables() {
                Ok(gpus) => serde_json::json!({ "ok": true, "gpus": gpus }),
                Err(e) => serde_json::json!({ "ok": false, "error": format!("NVML: {e}") }),
            };
            println!("{}", serde_json::to_string_pretty(&doc)?);
        }
        Command::Unpin { bpf_pin_dir } => {
            pins::remove(&bpf_pin_dir)?;
            println!("removed {}: enforcement ended", bpf_pin_dir.display());
        }
        Command::Top {
            socket,
            interval,
            once,
        } => {
            let period = Duration::from_secs_f64(interval.max(0.1));
            let terminal = std::io::stdout().is_terminal();
            loop {
                let snapshot = api::snapshot(&socket).await?;
                print!("{}", top::frame(&snapshot, terminal));
                if once || !terminal {
                    return Ok(());
                }
                tokio::select! {
                    () = tokio::time::sleep(period) => {}
                    _ = tokio::signal::ctrl_c() => return Ok(()),
                }
            }
        }
    }
    Ok(())
}

async fn signal(socket: &std::path::Path, request: Request) -> anyhow::Result<()> {
    let done = api::client::signal(socket, &request).await?;
    println!(
        "signalled process {} (session {})",
        done.pid, done.session_id
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn the_help_says_what_the_binary_is() {
        let help = Cli::command().render_help().to_string();
        assert!(help.contains("gpuwarden's node agent"), "{help}");
        let long = Cli::command().render_long_help().to_string();
        assert!(long.contains("gpuwarden's node agent"), "{long}");
        Cli::command().debug_assert();
    }

    #[test]
    fn a_flag_and_its_file_key_are_one_setting() {
        let cli = Cli::try_parse_from([
            "gpuwarden-agent",
            "run",
            "--socket",
            "/tmp/a.sock",
            "--gpu-devices",
            "/dev/x,/dev/y",
            "--usage-report-interval-ms",
            "250",
        ])
        .unwrap();
        let Command::Run { flags, .. } = cli.command else {
            panic!("not run");
        };
        let file: Settings = toml::from_str(
            "socket = \"/tmp/a.sock\"\ngpu_devices = [\"/dev/x\", \"/dev/y\"]\nusage_report_interval_ms = 250\n",
        )
        .unwrap();
        // The environment may set the flags that read it (NODE_NAME and the like).
        assert_eq!(
            Settings {
                node_name: None,
                controller: None,
                prometheus_listen: None,
                ..flags
            },
            file
        );
    }

    #[test]
    fn top_takes_once() {
        let cli = Cli::try_parse_from(["gpuwarden-agent", "top", "--once"]).unwrap();
        assert!(matches!(cli.command, Command::Top { once: true, .. }));
    }
}
