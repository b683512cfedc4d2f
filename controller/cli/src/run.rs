//! `gpuwarden run`: runs a command inside a session's quota on this node (bare metal).
//!
//! The steps: ask the local agent for its node, create a session pinned there with a managed
//! target, wait until it runs (watching from the revision the sessions were at once it was
//! created, so no change of it is missed, across controller restarts and leader changes, and
//! saying on stderr what it waits for: [`crate::waiting`]), ask
//! the agent for the session's cgroup, start the command inside it, wait for it, end the session,
//! and exit with the command's status (128 + signal when a signal killed it; 127 when it could not
//! be found, 126 when it could not be started).
//!
//! A session preempted while its command runs (docs/quotas.md, "Reclaim by preemption") says so
//! on stderr when the preemption starts (the agent then sends the command SIGTERM, and kills it
//! at the deadline), waits for the session to end `preempted`, and exits [`PREEMPTED_EXIT`].

use std::{
    os::unix::process::ExitStatusExt,
    path::{Path, PathBuf},
    process::ExitCode,
    time::{Duration, Instant},
};

use gpuwarden_proto::v1 as pb;
use tokio::signal::unix::{Signal, SignalKind, signal};

use gpuwarden_agent_api::{ClientError, client};

use super::{
    CliError, Client, ControllerArgs, PolicyArgs, connect, follow,
    waiting::{Style, wait_running},
};
use gpuwarden_proto::convert;
use gpuwarden_types::{slot::ResourceSlot, target::Target};

/// The exit code of a `run` whose session was preempted: 75, `EX_TEMPFAIL` of sysexits.h (a
/// temporary failure: run it again later), which no other outcome of `run` uses.
pub const PREEMPTED_EXIT: u8 = 75;
/// How long `run` waits, after its preempted command ended, for the session to end.
const PREEMPTED_WAIT: Duration = Duration::from_secs(15);

/// How often the session's cgroup is polled while starting.
const POLL: Duration = Duration::from_millis(100);
/// How long the agent may take to make and bind the session's cgroup once the session runs.
const CGROUP_WAIT: Duration = Duration::from_secs(10);
/// How long binding the cgroup goes unsaid (it usually takes a moment).
const CGROUP_QUIET: Duration = Duration::from_secs(1);

/// `gpuwarden run` arguments.
#[derive(clap::Args)]
pub struct RunArgs {
    /// A resource, name=value (repeat), e.g. `-r cuda.shares=0.5 -r cuda.mem=4g`.
    #[arg(short = 'r', long = "resource", required = true)]
    resources: Vec<String>,
    #[command(flatten)]
    policy: PolicyArgs,
    /// The node agent's local socket.
    #[arg(
        long,
        env = "GPUWARDEN_AGENT_SOCKET",
        default_value = gpuwarden_agent_api::DEFAULT_SOCKET
    )]
    agent_socket: PathBuf,
    /// Owner (user or project); default: the caller (the token's or certificate's owner;
    /// `default` on a controller without authentication).
    #[arg(long, default_value = "")]
    owner: String,
    /// Session name (default: the session id).
    #[arg(long, default_value = "")]
    name: String,
    /// Workload class its usage profile is learned under (default: its name).
    #[arg(long, default_value = "")]
    class: String,
    /// Priority (higher first).
    #[arg(long, default_value_t = 0)]
    priority: i32,
    /// Never preempted; admitted only within its queue's guarantee (docs/quotas.md).
    #[arg(long)]
    no_preempt: bool,
    #[command(flatten)]
    gang: crate::GangArgs,
    /// Seconds to wait for the session to run. Until then `run` says on stderr what it waits
    /// for (the controller's reason, again whenever it changes); after, it ends the session and
    /// exits 124, naming the last reason. Ctrl-C while waiting ends the session too (exit 130).
    #[arg(
        long,
        alias = "start-timeout",
        default_value_t = 120,
        value_name = "SECS"
    )]
    timeout: u64,
    /// Say on stderr what happens before the command starts.
    #[arg(short, long)]
    verbose: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Why the session did not get to run the command.
enum Interrupted {
    /// SIGINT or SIGTERM while starting.
    Signal(i32),
    /// Something failed.
    Error(CliError),
}

impl From<CliError> for Interrupted {
    fn from(e: CliError) -> Self {
        Self::Error(e)
    }
}

/// Runs `gpuwarden run`; the exit code is the command's.
///
/// # Errors
/// Bad input; an unreachable or refusing agent or controller; a session that fails or doesn't
/// start in time.
pub async fn run(
    controller: &ControllerArgs,
    args: RunArgs,
    style: Style,
) -> Result<ExitCode, CliError> {
    // Bad input first, so it is exit 2 with no agent or controller around.
    let requested =
        ResourceSlot::parse_any(&args.resources).map_err(|e| CliError::Input(e.to_string()))?;
    let policy = args.policy.policy();
    let Some(program) = args.command.first() else {
        return Err(CliError::Input("no command to run after `--`".into()));
    };
    // Signals that would kill us mid-way are caught from here on, so the session always ends.
    let (mut sigint, mut sigterm) = signals()?;
    let node = client::node(&args.agent_socket).await?;
    let mut client = connect(controller).await?;
    let session = client
        .create_session(pb::CreateSessionRequest {
            requested: Some(convert::slots_to_pb(&requested)),
            owner: args.owner.clone(),
            name: args.name.clone(),
            priority: args.priority,
            node_id: node.clone(),
            target: convert::target_to_pb(&Target::Managed),
            policy: Some(convert::policy_to_pb(policy)),
            class: args.class.clone(),
            // `run` is pinned to this node: the mode only explains the devices picked there.
            placement: String::new(),
            unconfined_target: false,
            no_preempt: args.no_preempt,
            preemption: String::new(),
            gang: args.gang.to_pb(),
            // This process's uid: the agent gives the session's cgroup to it alone.
            // SAFETY: getuid can't fail.
            run_caller: Some(pb::RunCaller {
                uid: unsafe { libc::getuid() },
            }),
            // One try, never retried: nothing to recognise a retry by.
            request_id: String::new(),
            placement_mode: 0,
        })
        .await?
        .into_inner();
    let id = session.id;
    if args.verbose {
        eprintln!("gpuwarden: session {id} created on node {node}");
    }

    let start = async {
        wait_running(
            controller,
            &mut client,
            &id,
            Duration::from_secs(args.timeout),
            style,
        )
        .await?;
        let cgroup = wait_cgroup(&args.agent_socket, &id).await?;
        if args.verbose {
            eprintln!("gpuwarden: session {id} running in {}", cgroup.display());
        }
        Ok::<_, CliError>(cgroup)
    };
    let started = tokio::select! {
        r = start => r.map_err(Interrupted::Error),
        _ = sigint.recv() => Err(Interrupted::Signal(libc::SIGINT)),
        _ = sigterm.recv() => Err(Interrupted::Signal(libc::SIGTERM)),
    };
    let cgroup = match started {
        Ok(cgroup) => cgroup,
        Err(why) => {
            end_session(&mut client, &id).await;
            return match why {
                Interrupted::Signal(sig) => {
                    eprintln!(
                        "gpuwarden: interrupted before the command started: session {id} ended"
                    );
                    Ok(signal_code(sig))
                }
                Interrupted::Error(e) => Err(e),
            };
        }
    };

    let code = match spawn_in(program, &args.command[1..], &cgroup) {
        Ok(child) => {
            let mut watcher = client.clone();
            tokio::select! {
                code = supervise(child, &mut sigint, &mut sigterm) => code,
                () = tell_preemption(controller, &mut watcher, &id) => unreachable!("it never returns"),
            }
        }
        Err(e) => {
            eprintln!(
                "gpuwarden: cannot start {program:?} in {}: {e}",
                cgroup.display()
            );
            // The shell's codes: 127 not found, 126 found but not startable.
            if e.kind() == std::io::ErrorKind::NotFound {
                ExitCode::from(127)
            } else {
                ExitCode::from(126)
            }
        }
    };
    if let Some(reason) = preempted(&mut client, &id).await {
        eprintln!("gpuwarden: session {id} was preempted: {reason}");
        return Ok(ExitCode::from(PREEMPTED_EXIT));
    }
    end_session(&mut client, &id).await;
    Ok(code)
}

/// Whether a reason says the session is being preempted (the controller's words).
fn being_preempted(s: &pb::Session) -> bool {
    s.state == pb::SessionState::Running as i32 && s.reason.starts_with("being preempted")
}

/// Says on stderr when the session starts being preempted; never returns (a broken watch
/// only keeps quiet).
async fn tell_preemption(controller: &ControllerArgs, client: &mut Client, id: &str) {
    let watch = async {
        let revision = follow::revision_now(client).await.ok()?;
        let now = client
            .get_session(pb::GetSessionRequest { id: id.to_owned() })
            .await
            .ok()?
            .into_inner();
        let mut follower = follow::Follower::new(controller, client.clone(), revision);
        let mut s = now;
        loop {
            if being_preempted(&s) {
                eprintln!("gpuwarden: session {id} {}", s.reason);
                return Some(());
            }
            s = loop {
                let next = follower.next().await.ok()?;
                if next.id == id {
                    break next;
                }
            };
        }
    };
    let _ = watch.await;
    std::future::pending::<()>().await;
}

/// The reason, when the session was preempted: once its command has ended, a session being
/// preempted is left to end `preempted` (not ended by `run`), waited for a while.
async fn preempted(client: &mut Client, id: &str) -> Option<String> {
    let deadline = Instant::now() + PREEMPTED_WAIT;
    loop {
        let s = client
            .get_session(pb::GetSessionRequest { id: id.to_owned() })
            .await
            .ok()?
            .into_inner();
        if s.state == pb::SessionState::Preempted as i32 {
            return Some(s.reason);
        }
        if !being_preempted(&s) {
            return None;
        }
        if Instant::now() >= deadline {
            return Some(s.reason);
        }
        tokio::time::sleep(POLL).await;
    }
}

fn signals() -> Result<(Signal, Signal), CliError> {
    let catch = |kind: SignalKind| {
        signal(kind).map_err(|e| CliError::Run(format!("cannot catch signals: {e}")))
    };
    Ok((
        catch(SignalKind::interrupt())?,
        catch(SignalKind::terminate())?,
    ))
}

fn signal_code(sig: i32) -> ExitCode {
    ExitCode::from(u8::try_from(128 + sig).unwrap_or(u8::MAX))
}

/// Asks the agent for the session's cgroup until it is bound; says so on stderr once that
/// takes longer than [`CGROUP_QUIET`].
async fn wait_cgroup(socket: &Path, id: &str) -> Result<PathBuf, CliError> {
    let started = Instant::now();
    let deadline = started + CGROUP_WAIT;
    let mut said = false;
    loop {
        // The agent may answer "unknown session" in the moment between its ack and its books.
        let last = match client::session_cgroup(socket, id).await {
            Ok(c) if c.bound => {
                if !c.cgroup_dir.is_absolute() {
                    return Err(CliError::Run(format!(
                        "the agent at {} gave a relative cgroup directory {}",
                        socket.display(),
                        c.cgroup_dir.display()
                    )));
                }
                return Ok(c.cgroup_dir);
            }
            Ok(_) => "it is not bound yet".to_owned(),
            Err(ClientError::Refused { message, .. }) => message,
            Err(e) => return Err(e.into()),
        };
        if Instant::now() >= deadline {
            return Err(CliError::Run(format!(
                "the agent at {} did not bind a cgroup for session {id} within {CGROUP_WAIT:?}: {last}",
                socket.display()
            )));
        }
        if !said && started.elapsed() >= CGROUP_QUIET {
            said = true;
            eprintln!(
                "gpuwarden: session {id} runs; waiting for the agent at {} to bind its cgroup ({last})",
                socket.display()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Starts `program` with the child moving itself into `cgroup` before exec, so not one
/// instruction of it runs outside the quota.
fn spawn_in(
    program: &str,
    args: &[String],
    cgroup: &Path,
) -> std::io::Result<tokio::process::Child> {
    let mut command = tokio::process::Command::new(program);
    command.args(args);
    gpuwarden_host::cgroup::spawn_inside(command.as_std_mut(), cgroup)?;
    command.spawn()
}

/// Waits for the child. SIGINT is left to the child (the terminal sends it to the whole
/// foreground process group); SIGTERM is passed on to it.
async fn supervise(
    mut child: tokio::process::Child,
    sigint: &mut Signal,
    sigterm: &mut Signal,
) -> ExitCode {
    loop {
        tokio::select! {
            status = child.wait() => {
                return match status {
                    Ok(s) => match (s.code(), s.signal()) {
                        (Some(code), _) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
                        (None, Some(sig)) => signal_code(sig),
                        (None, None) => ExitCode::FAILURE,
                    },
                    Err(e) => {
                        eprintln!("gpuwarden: waiting for the command: {e}");
                        ExitCode::FAILURE
                    }
                };
            }
            _ = sigint.recv() => {}
            _ = sigterm.recv() => {
                // Not reaped yet (its wait above has not completed), so the pid is still ours.
                if let Some(pid) = child.id().and_then(|p| libc::pid_t::try_from(p).ok()) {
                    // SAFETY: kill has no memory-safety preconditions.
                    unsafe { libc::kill(pid, libc::SIGTERM) };
                }
            }
        }
    }
}

/// How long `run` waits, after the command, for the session's node to confirm the release.
const RELEASE_WAIT: Duration = Duration::from_secs(10);

/// Ends the session; a failure is reported, not fatal (the command's status still wins). A
/// session that answers TERMINATING (issue 40) is waited for, a while, until its node has
/// confirmed the release, so that what follows `run` finds its resources free.
async fn end_session(client: &mut Client, id: &str) {
    let mut state = match client
        .terminate_session(pb::TerminateSessionRequest { id: id.to_owned() })
        .await
    {
        Ok(s) => s.into_inner().state(),
        Err(e) => {
            eprintln!(
                "gpuwarden: could not end session {id}: {:?}: {} (end it with `gpuwarden session rm {id}`)",
                e.code(),
                e.message()
            );
            return;
        }
    };
    let deadline = Instant::now() + RELEASE_WAIT;
    while state == pb::SessionState::Terminating && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        match client
            .get_session(pb::GetSessionRequest { id: id.to_owned() })
            .await
        {
            Ok(s) => state = s.into_inner().state(),
            // Ended and told; what the controller says next is not this command's concern.
            Err(_) => return,
        }
    }
    if state == pb::SessionState::Terminating {
        eprintln!(
            "gpuwarden: session {id} is still terminating: its node has not confirmed the \
             release within {RELEASE_WAIT:?}"
        );
    }
}
