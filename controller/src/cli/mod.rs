//! The `gpuwarden` command line: sessions, nodes and slot types over the gRPC API.
//!
//! Human tables by default, `--json` everywhere (the key names of [`json`] are stable). Bad input
//! exits 2 with a message naming the bad part; a server error exits 1 with the gRPC status.

pub mod json;
pub mod render;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gpuwarden_proto::v1::{self as pb, scheduler_service_client::SchedulerServiceClient};
use tokio_stream::StreamExt;
use tonic::transport::{Channel, Endpoint};

use crate::{api::convert, slots::ResourceSlot};

/// gpuwarden: share GPUs between containers.
#[derive(Parser)]
#[command(name = "gpuwarden", version, about)]
pub struct Cli {
    /// Controller URL.
    #[arg(
        long,
        global = true,
        env = "GPUWARDEN_CONTROLLER",
        default_value = "http://127.0.0.1:50051"
    )]
    controller: String,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Sessions: create, list, show, remove, watch.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Nodes and their GPU allocation maps.
    #[command(subcommand)]
    Node(NodeCommand),
    /// Slot types merged from every agent.
    #[command(subcommand)]
    Slot(SlotCommand),
}

#[derive(Subcommand)]
enum SessionCommand {
    /// Ask for resources, e.g. `-r cpu=1 -r mem=2g -r cuda.shares=0.2`.
    Create {
        /// A resource, name=value (repeat).
        #[arg(short = 'r', long = "resource", required = true)]
        resources: Vec<String>,
        /// Owner (user or project).
        #[arg(long, default_value = "default")]
        owner: String,
        /// Name.
        #[arg(long, default_value = "")]
        name: String,
        /// Priority (higher first).
        #[arg(long, default_value_t = 0)]
        priority: i32,
        /// Pin to a node.
        #[arg(long)]
        node: Option<String>,
    },
    /// List sessions.
    Ls {
        /// Only this owner's.
        #[arg(long)]
        owner: Option<String>,
    },
    /// Show one session.
    Show {
        /// Session id.
        id: String,
    },
    /// End a session.
    Rm {
        /// Session id.
        id: String,
    },
    /// Print session changes as they happen.
    Watch,
}

#[derive(Subcommand)]
enum NodeCommand {
    /// List nodes.
    Ls,
    /// Show a node with its GPU allocation map.
    Show {
        /// Node id.
        node: String,
    },
}

#[derive(Subcommand)]
enum SlotCommand {
    /// List slot types.
    Ls,
}

/// How a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad input (exit 2).
    #[error("{0}")]
    Input(String),
    /// The controller answered with an error (exit 1).
    #[error("controller error: {code:?}: {message}")]
    Server {
        /// gRPC code.
        code: tonic::Code,
        /// Its reason.
        message: String,
    },
    /// The controller can't be reached (exit 1).
    #[error("cannot reach the controller at {url}: {reason}")]
    Unreachable {
        /// URL.
        url: String,
        /// Why.
        reason: String,
    },
}

impl CliError {
    /// The process exit code.
    #[must_use]
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Self::Input(_) => ExitCode::from(2),
            Self::Server { .. } | Self::Unreachable { .. } => ExitCode::from(1),
        }
    }
}

impl From<tonic::Status> for CliError {
    fn from(s: tonic::Status) -> Self {
        Self::Server {
            code: s.code(),
            message: s.message().to_owned(),
        }
    }
}

async fn connect(url: &str) -> Result<SchedulerServiceClient<Channel>, CliError> {
    let unreachable = |reason: String| CliError::Unreachable {
        url: url.to_owned(),
        reason,
    };
    let channel = Endpoint::from_shared(url.to_owned())
        .map_err(|e| CliError::Input(format!("invalid --controller URL {url:?}: {e}")))?
        .connect_timeout(std::time::Duration::from_secs(3))
        .connect()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    Ok(SchedulerServiceClient::new(channel))
}

fn print_json<T: serde::Serialize>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("gpuwarden: cannot encode JSON: {e}"),
    }
}

/// Runs the parsed command line.
///
/// # Errors
/// See [`CliError`].
pub async fn run(cli: Cli) -> Result<(), CliError> {
    // Parse before connecting, so bad input is exit 2 even with no controller.
    let requested = match &cli.command {
        Command::Session(SessionCommand::Create { resources, .. }) => {
            Some(ResourceSlot::parse_any(resources).map_err(|e| CliError::Input(e.to_string()))?)
        }
        _ => None,
    };
    let mut client = connect(&cli.controller).await?;
    match cli.command {
        Command::Session(SessionCommand::Create {
            owner,
            name,
            priority,
            node,
            ..
        }) => {
            let s = client
                .create_session(pb::CreateSessionRequest {
                    requested: Some(convert::slots_to_pb(&requested.unwrap_or_default())),
                    owner,
                    name,
                    priority,
                    node_id: node.unwrap_or_default(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            if cli.json {
                print_json(&json::Session::from(&s));
            } else {
                println!("{}", s.id);
            }
        }
        Command::Session(SessionCommand::Ls { owner }) => {
            let sessions = client
                .list_sessions(pb::ListSessionsRequest {
                    owner: owner.unwrap_or_default(),
                })
                .await?
                .into_inner()
                .sessions;
            if cli.json {
                print_json(&sessions.iter().map(json::Session::from).collect::<Vec<_>>());
            } else {
                print!("{}", render::sessions(&sessions));
            }
        }
        Command::Session(SessionCommand::Show { id }) => {
            let s = client
                .get_session(pb::GetSessionRequest { id })
                .await?
                .into_inner();
            if cli.json {
                print_json(&json::Session::from(&s));
            } else {
                print!("{}", render::session(&s));
            }
        }
        Command::Session(SessionCommand::Rm { id }) => {
            let s = client
                .terminate_session(pb::TerminateSessionRequest { id })
                .await?
                .into_inner();
            if cli.json {
                print_json(&json::Session::from(&s));
            } else {
                println!("{} {}", s.id, render::state(s.state));
            }
        }
        Command::Session(SessionCommand::Watch) => {
            let mut stream = client
                .watch_sessions(pb::WatchSessionsRequest {})
                .await?
                .into_inner();
            while let Some(s) = stream.next().await {
                let s = s?;
                if cli.json {
                    match serde_json::to_string(&json::Session::from(&s)) {
                        Ok(line) => println!("{line}"),
                        Err(e) => eprintln!("gpuwarden: {e}"),
                    }
                } else {
                    println!(
                        "{} {} {} {}",
                        s.id,
                        render::state(s.state),
                        s.node_id,
                        s.reason
                    );
                }
            }
        }
        Command::Node(NodeCommand::Ls) => {
            let nodes = client
                .list_nodes(pb::ListNodesRequest {})
                .await?
                .into_inner()
                .nodes;
            if cli.json {
                print_json(&nodes.iter().map(json::Node::from).collect::<Vec<_>>());
            } else {
                print!("{}", render::nodes(&nodes));
            }
        }
        Command::Node(NodeCommand::Show { node }) => {
            let n = client
                .get_node(pb::GetNodeRequest {
                    node_id: node.clone(),
                })
                .await?
                .into_inner();
            let map = client
                .get_allocation_map(pb::GetAllocationMapRequest { node_id: node })
                .await?
                .into_inner();
            let devices = map
                .nodes
                .into_iter()
                .next()
                .map(|m| m.devices)
                .unwrap_or_default();
            if cli.json {
                print_json(&json::NodeDetail::new(&n, &devices));
            } else {
                print!("{}", render::node(&n, &devices));
            }
        }
        Command::Slot(SlotCommand::Ls) => {
            let types = client
                .list_slot_types(pb::ListSlotTypesRequest {})
                .await?
                .into_inner()
                .slot_types;
            if cli.json {
                print_json(&types.iter().map(json::SlotType::from).collect::<Vec<_>>());
            } else {
                print!("{}", render::slot_types(&types));
            }
        }
    }
    Ok(())
}
