//! The `gpuwarden-controller` binary, in parts:
//!
//! - `config`: `run`'s flags layered over its TOML file ([`FileConfig`]) into a [`RunConfig`],
//!   loaded and checked before anything is opened;
//! - `app`: `run` itself, in the lifecycle both daemons share (docs/architecture.md,
//!   "Lifecycle"): [`RunConfig`] → [`App::build`] (ports bound, store opened) → [`App::spawn`]
//!   → [`Running`] → [`Running::shutdown`] (tasks joined in reverse start order);
//! - `grpc`: the gRPC server, a builder ([`GrpcServer`]; tests and benchmarks serve a controller
//!   of their own with it), over a [`Transport`] with clients authenticated as [`Security`]
//!   says;
//! - `election`: leader election among controllers sharing an etcd store ([`Election`]);
//! - `kube`: the admission webhook and the scheduler extender;
//! - `commands`: `certs mint`, `tokens add` and `copy-store`, one module each.
//!
//! [`main`] is the whole binary (it lives here, so test binaries can wrap it); every failure is a
//! [`ServeError`] that says what failed.

mod app;
mod commands;
mod config;
mod election;
mod error;
mod grpc;
mod kube;
mod security;

use std::process::ExitCode;

use clap::Parser;

pub use app::{App, Running, open, run_until, sled_in};
pub use config::{FileConfig, RunConfig};
pub use election::{ELECTION, Election, open_standby};
pub use error::{KubeSetupError, ServeError};
pub use grpc::{
    GrpcServer, MAX_ANONYMOUS_CONNECTIONS, MAX_CONNECTIONS, MAX_HANDSHAKES,
    MAX_STREAMS_PER_CONNECTION,
};
pub use kube::KubeArgs;
pub use security::{Security, Transport};

use commands::{Cli, Command};

/// The whole `gpuwarden-controller` binary: parses the command line and runs the command; `run`
/// serves until SIGINT or SIGTERM on its own runtime. Exits 2 for a bad configuration, 1 when
/// serving fails.
#[must_use]
pub fn main() -> ExitCode {
    // A wrapping binary may have set up tracing already; that one stays.
    gpuwarden_runtime::logging::init("info");
    match Cli::parse().command {
        Command::Run(args) => app::main(args),
        Command::CopyStore(args) => commands::copy_store::main(args),
        Command::Certs(command) => commands::certs::main(command),
        Command::Tokens(command) => commands::tokens::main(command),
    }
}
