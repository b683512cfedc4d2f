//! `gpuwarden-controller tokens add`: bearer tokens for scheduler clients
//! ([`crate::auth::tokens`]).

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use clap::Subcommand;

use crate::auth::{clients::ClientRole, tokens};

/// Bearer tokens for scheduler clients.
#[derive(Subcommand)]
pub(in crate::server) enum TokensCommand {
    /// Generate a token for an owner, print it once, and append its SHA-256 to the token file
    /// (made readable by its owner only when absent). The controller picks it up without a
    /// restart; remove the entry to revoke the token.
    Add {
        /// The token file.
        #[arg(long)]
        file: PathBuf,
        /// The owner the token acts as (a user's sessions are this owner's).
        #[arg(long)]
        owner: String,
        /// admin (sees and ends every session) or user (only its own).
        #[arg(long)]
        role: ClientRole,
    },
}

/// Runs `command`.
pub(in crate::server) fn main(command: TokensCommand) -> ExitCode {
    let TokensCommand::Add { file, owner, role } = command;
    tokens_add_command(&file, &owner, role)
}

/// `tokens add`: appends the token's hash and prints the token, once.
fn tokens_add_command(file: &Path, owner: &str, role: ClientRole) -> ExitCode {
    match tokens::add(file, owner, role) {
        Ok(token) => {
            println!("{token}");
            eprintln!(
                "added a {role} token for {owner:?} to {}; it is shown only this once",
                file.display()
            );
            ExitCode::SUCCESS
        }
        Err(e @ tokens::TokenError::InvalidOwner { .. }) => {
            eprintln!("gpuwarden-controller: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("gpuwarden-controller: {e}");
            ExitCode::FAILURE
        }
    }
}
