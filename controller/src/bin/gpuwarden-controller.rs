//! `gpuwarden-controller run [--listen ADDR] [--state-dir DIR] [--config FILE]`.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use gpuwarden_controller::{api::Timing, server};

/// gpuwarden's cluster controller.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the gRPC API.
    Run {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:50051")]
        listen: SocketAddr,
        /// Directory of the embedded store.
        #[arg(long, default_value = "/var/lib/gpuwarden/controller")]
        state_dir: PathBuf,
        /// TOML config file.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let Command::Run {
        listen,
        state_dir,
        config,
    } = Cli::parse().command;
    let file = match config.as_deref().map(server::FileConfig::read).transpose() {
        Ok(f) => f.unwrap_or_default(),
        Err(e) => {
            eprintln!("gpuwarden-controller: {e}");
            return ExitCode::from(2);
        }
    };
    let mut timing = Timing::default();
    if let Some(secs) = file.heartbeat_timeout_secs {
        timing.heartbeat_timeout = Duration::from_secs(secs);
    }
    let result = async {
        let controller = server::open(&state_dir, file.scheduler.unwrap_or_default(), timing)?;
        server::serve(controller, listen, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuwarden-controller: {e}");
            ExitCode::FAILURE
        }
    }
}
