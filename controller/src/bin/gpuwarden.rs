//! `gpuwarden`: the command line for sessions, nodes and slot types.

use std::process::ExitCode;

use clap::Parser;
use gpuwarden_controller::cli::{Cli, run};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Usage errors are bad input: exit 2 (help and version exit 0).
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuwarden: {e}");
            e.exit_code()
        }
    }
}
