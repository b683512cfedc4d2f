//! `gpuwarden session`: create, list, show, end and watch sessions.

use std::process::ExitCode;

use gpuwarden_proto::{convert, v1 as pb};
use gpuwarden_types::slot::ResourceSlot;

use crate::{
    CliError, Client, ControllerArgs, CreateArgs, SessionCommand, follow, json, print_json, render,
    waiting, wire,
};

/// Runs `command` on `client`; `requested` is what `create` asks for, parsed before connecting.
pub(crate) async fn run(
    controller: &ControllerArgs,
    mut client: Client,
    command: SessionCommand,
    requested: Option<ResourceSlot>,
    as_json: bool,
) -> Result<ExitCode, CliError> {
    match command {
        SessionCommand::Create(create) => {
            return self::create(
                controller,
                &mut client,
                create,
                requested.unwrap_or_default(),
                as_json,
            )
            .await;
        }
        SessionCommand::Ls { owner } => {
            let (sessions, _) = follow::list_all(&mut client, &owner.unwrap_or_default()).await?;
            if as_json {
                print_json(&sessions.iter().map(json::Session::from).collect::<Vec<_>>());
            } else {
                print!("{}", render::sessions(&sessions));
            }
        }
        SessionCommand::Show { id, explain } => {
            let s = client
                .get_session(pb::GetSessionRequest { id })
                .await?
                .into_inner();
            if as_json {
                // The JSON document always carries the explanation.
                print_json(&json::Session::from(&s));
            } else if explain {
                print!("{}{}", render::session(&s), render::explanation(&s));
            } else {
                print!("{}", render::session(&s));
            }
        }
        SessionCommand::Rm { id } => {
            let s = client
                .terminate_session(pb::TerminateSessionRequest { id })
                .await?
                .into_inner();
            if as_json {
                print_json(&json::Session::from(&s));
            } else {
                println!("{} {}", s.id, wire::state(s.state));
            }
        }
        SessionCommand::Watch => watch(controller, client, as_json).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `session create`: asks for `requested`, waits for it to run if asked, and prints it.
async fn create(
    controller: &ControllerArgs,
    client: &mut Client,
    create: CreateArgs,
    requested: ResourceSlot,
    as_json: bool,
) -> Result<ExitCode, CliError> {
    let CreateArgs {
        owner,
        name,
        priority,
        node,
        target,
        policy,
        class,
        placement,
        no_preempt,
        preemption,
        gang,
        wait,
        timeout,
        ..
    } = create;
    let mut s = client
        .create_session(pb::CreateSessionRequest {
            requested: Some(convert::slots_to_pb(&requested)),
            owner,
            name,
            priority,
            node_id: node.unwrap_or_default(),
            target: convert::target_to_pb(&target.target()),
            policy: Some(convert::policy_to_pb(policy.policy())),
            class,
            placement: convert::placement_to_pb(placement),
            unconfined_target: target.unconfined,
            no_preempt,
            preemption: preemption.unwrap_or_default(),
            gang: gang.to_pb(),
            // `session create` runs nothing here: no local user to name.
            run_caller: None,
            // One try, never retried: nothing to recognise a retry by.
            request_id: String::new(),
            // The string above says it, for controllers from before the enum.
            placement_mode: 0,
        })
        .await?
        .into_inner();
    if wait {
        let id = s.id.clone();
        let waited = waiting::wait_running(
            controller,
            client,
            &id,
            std::time::Duration::from_secs(timeout),
            waiting::Style::detect(as_json),
        );
        // Ctrl-C stops the wait, not the session: say where it was left (once the wait,
        // and the status line it draws, is gone).
        let waited = tokio::select! {
            s = waited => Some(s),
            _ = tokio::signal::ctrl_c() => None,
        };
        let Some(waited) = waited else {
            eprintln!(
                "gpuwarden: stopped waiting; session {id} stays queued \
                 (end it with `gpuwarden session rm {id}`)"
            );
            return Ok(ExitCode::from(130));
        };
        s = waited?;
    }
    if as_json {
        print_json(&json::Session::from(&s));
    } else {
        println!("{}", s.id);
    }
    Ok(ExitCode::SUCCESS)
}

/// `session watch`: prints each session change, from the revision the sessions are at now,
/// across restarts and leader changes; returns only on an error.
async fn watch(
    controller: &ControllerArgs,
    mut client: Client,
    as_json: bool,
) -> Result<(), CliError> {
    let revision = follow::revision_now(&mut client).await?;
    let mut follower = follow::Follower::new(controller, client, revision);
    loop {
        let s = follower.next().await?;
        if as_json {
            match serde_json::to_string(&json::Session::from(&s)) {
                Ok(line) => println!("{line}"),
                Err(e) => eprintln!("gpuwarden: {e}"),
            }
        } else {
            println!(
                "{} {} {} {}",
                s.id,
                wire::state(s.state),
                s.node_id,
                s.reason
            );
        }
    }
}
