//! `gpuwarden-controller certs mint`: a CA, the controller's serving certificate and client
//! certificates for nodes, users and admins, without OpenSSL ([`crate::auth::mint`]).

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use clap::Subcommand;

use crate::auth::{clients::ClientRole, mint};

/// Certificates for mutual TLS, without OpenSSL.
#[derive(Subcommand)]
pub(in crate::server) enum CertsCommand {
    /// Write a CA, the controller's serving certificate and one client certificate per node
    /// into a directory; a CA already there (ca.pem, ca.key) is reused, other files replaced.
    Mint {
        /// Directory to write into.
        #[arg(long)]
        out: PathBuf,
        /// Node ids, comma-separated: one client certificate each (NODE.pem, NODE.key).
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        /// Names the controller is reached by (DNS names or IP addresses), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "localhost,127.0.0.1")]
        server_names: Vec<String>,
        /// Scheduler users, comma-separated: one client certificate each naming
        /// <spiffe://gpuwarden/user/NAME> (user-NAME.pem, user-NAME.key).
        #[arg(long, value_delimiter = ',')]
        users: Vec<String>,
        /// Scheduler admins, comma-separated: one client certificate each naming
        /// <spiffe://gpuwarden/admin/NAME> (admin-NAME.pem, admin-NAME.key).
        #[arg(long, value_delimiter = ',')]
        admins: Vec<String>,
        /// Days the server and node certificates are valid (a new CA: ten times as long).
        #[arg(long, default_value_t = 365)]
        days: u32,
    },
}

/// Runs `command`.
pub(in crate::server) fn main(command: CertsCommand) -> ExitCode {
    let CertsCommand::Mint {
        out,
        nodes,
        server_names,
        users,
        admins,
        days,
    } = command;
    let clients: Vec<(String, ClientRole)> = users
        .into_iter()
        .map(|u| (u, ClientRole::User))
        .chain(admins.into_iter().map(|a| (a, ClientRole::Admin)))
        .collect();
    mint_command(&out, &nodes, &server_names, &clients, days)
}

/// `certs mint`: writes the files and says which.
fn mint_command(
    out: &Path,
    nodes: &[String],
    server_names: &[String],
    clients: &[(String, ClientRole)],
    days: u32,
) -> ExitCode {
    let server_names: Vec<String> = server_names
        .iter()
        .filter(|n| !n.is_empty())
        .cloned()
        .collect();
    let minted = mint::mint_into(out, nodes, &server_names, days).and_then(|mut minted| {
        if !clients.is_empty() {
            let more = mint::mint_clients_into(out, clients, days)?;
            minted.written.extend(more.written);
        }
        Ok(minted)
    });
    match minted {
        Ok(minted) => {
            if minted.reused_ca {
                println!("reused the CA in {}", out.display());
            }
            for file in &minted.written {
                println!("wrote {}", file.display());
            }
            ExitCode::SUCCESS
        }
        Err(
            e @ (mint::MintError::InvalidNodeId { .. } | mint::MintError::InvalidClientName { .. }),
        ) => {
            eprintln!("gpuwarden-controller: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("gpuwarden-controller: {e}");
            ExitCode::FAILURE
        }
    }
}
