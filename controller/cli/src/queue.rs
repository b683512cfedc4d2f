//! `gpuwarden queue ls|show|set|rm`: team queues (docs/teams.md). Anyone lists and shows them;
//! only an admin sets or removes one. Values are exact: `--guaranteed cuda.shares=4.5` is 4.5,
//! shown back as 4.5.

use clap::Subcommand;
use gpuwarden_proto::{convert, v1 as pb};
use gpuwarden_types::slot::ResourceSlot;

use crate::{CliError, Client, json, print_json, render};

/// The `queue` subcommands.
#[derive(Subcommand)]
pub enum QueueCommand {
    /// List the team queues: guarantee, limit, what each holds and borrows now.
    Ls,
    /// Show one queue.
    Show {
        /// Queue name.
        name: String,
    },
    /// Create or replace a queue (admins only), e.g. `gpuwarden queue set team-a --guaranteed
    /// cuda.shares=4.5,cuda.mem=200g --limit cuda.shares=8 --member alice --member bob`. Every
    /// field is replaced: a flag left out clears it (no --limit: no limit).
    Set {
        /// Queue name (a DNS label: lowercase letters, digits, '-').
        name: String,
        /// What the queue gets whenever it asks: name=value, comma-separated or repeated.
        #[arg(long, value_delimiter = ',', value_name = "SLOT=VALUE")]
        guaranteed: Vec<String>,
        /// The most it may hold, borrowing included (a slot left out is not capped).
        #[arg(long, value_delimiter = ',', value_name = "SLOT=VALUE")]
        limit: Option<Vec<String>>,
        /// An owner whose sessions count against the queue (repeat).
        #[arg(long = "member", value_name = "OWNER")]
        members: Vec<String>,
    },
    /// Remove a queue (admins only): its members' sessions then have no quota.
    Rm {
        /// Queue name.
        name: String,
    },
}

/// `tokens` as slots, refusing a zero (which would read as "left out").
fn slots(flag: &str, tokens: &[String]) -> Result<ResourceSlot, CliError> {
    let bad = |e: String| CliError::Input(format!("--{flag}: {e}"));
    for token in tokens {
        if ResourceSlot::parse_any(std::slice::from_ref(token))
            .map_err(|e| bad(e.to_string()))?
            .is_zero()
        {
            return Err(bad(format!(
                "{token}: zero; leave the slot out instead (in a limit, a slot left out is not \
                 capped)"
            )));
        }
    }
    ResourceSlot::parse_any(tokens).map_err(|e| bad(e.to_string()))
}

/// The queue `set` asks for, parsed before connecting (bad input exits 2 without a controller).
///
/// # Errors
/// [`CliError::Input`] naming the bad flag and token.
pub fn parse(command: &QueueCommand) -> Result<Option<pb::Queue>, CliError> {
    let QueueCommand::Set {
        name,
        guaranteed,
        limit,
        members,
    } = command
    else {
        return Ok(None);
    };
    Ok(Some(pb::Queue {
        name: name.clone(),
        guaranteed: Some(convert::slots_to_pb(&slots("guaranteed", guaranteed)?)),
        limit: limit
            .as_deref()
            .map(|l| slots("limit", l))
            .transpose()?
            .as_ref()
            .map(convert::slots_to_pb),
        members: members.clone(),
        ..pb::Queue::default()
    }))
}

/// Runs `command` (`set`'s queue parsed by [`parse`]).
///
/// # Errors
/// The controller refused or can't be reached.
pub async fn run(
    client: &mut Client,
    command: QueueCommand,
    set: Option<pb::Queue>,
    as_json: bool,
) -> Result<(), CliError> {
    let show = |q: &pb::Queue| {
        if as_json {
            print_json(&json::Queue::from(q));
        } else {
            print!("{}", render::queue(q));
        }
    };
    match command {
        QueueCommand::Ls => {
            let queues = client
                .list_queues(pb::ListQueuesRequest::default())
                .await?
                .into_inner()
                .queues;
            if as_json {
                print_json(&queues.iter().map(json::Queue::from).collect::<Vec<_>>());
            } else {
                print!("{}", render::queues(&queues));
            }
        }
        QueueCommand::Show { name } => {
            show(
                &client
                    .get_queue(pb::GetQueueRequest { name })
                    .await?
                    .into_inner(),
            );
        }
        QueueCommand::Set { .. } => {
            show(
                &client
                    .set_queue(pb::SetQueueRequest { queue: set })
                    .await?
                    .into_inner(),
            );
        }
        QueueCommand::Rm { name } => {
            let q = client
                .delete_queue(pb::DeleteQueueRequest {
                    name,
                    ..Default::default()
                })
                .await?
                .into_inner();
            if as_json {
                print_json(&json::Queue::from(&q));
            } else {
                println!("queue {} removed", q.name);
            }
        }
    }
    Ok(())
}
