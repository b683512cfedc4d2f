//! The `gpuwarden-controller` command line: `run` (the app, [`super::app`]) and the commands
//! that prepare what it runs with, one module each.

pub(super) mod certs;
pub(super) mod copy_store;
pub(super) mod tokens;

use clap::{Parser, Subcommand};

use super::config::RunArgs;

/// gpuwarden's cluster controller.
#[derive(Parser)]
#[command(name = "gpuwarden-controller", version, about)]
pub(super) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub(super) enum Command {
    /// Serve the gRPC API.
    Run(RunArgs),
    /// Copy every record of one store into another (from sled into etcd, say).
    CopyStore(copy_store::CopyStoreArgs),
    /// Certificates for mutual TLS, without OpenSSL.
    #[command(subcommand)]
    Certs(certs::CertsCommand),
    /// Bearer tokens for scheduler clients.
    #[command(subcommand)]
    Tokens(tokens::TokensCommand),
}
