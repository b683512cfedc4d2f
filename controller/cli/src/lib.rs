//! The `gpuwarden` command line: sessions, nodes, slot types, profiles and team queues over the
//! controller's gRPC API, and `gpuwarden run` to run a command inside a session's quota on this
//! node.
//!
//! A crate of its own on the shared domain (`gpuwarden-types`: the slot parser, the placement
//! modes, policies and targets) and the wire (`gpuwarden-proto` and its conversions): it links
//! none of the controller, whose internals stay its own.
//!
//! The controller may want to know who calls: `--token-file` sends the token in it as
//! `authorization: Bearer <token>`, `--cert`/`--key` present a client certificate over TLS.
//!
//! Human tables by default, `--json` everywhere (the key names of [`json`] are stable). Bad input
//! exits 2 with a message naming the bad part; a server or agent error exits 1 with the reason.
//! [`main`] is the whole binary, so test binaries can wrap the same CLI.

pub mod follow;
mod inventory;
pub mod json;
pub mod queue;
pub mod render;
pub mod run;
mod session;
pub mod waiting;
pub mod wire;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use gpuwarden_host::tls::ClientTls;
use gpuwarden_proto::{
    follow::Controllers,
    v1::{self as pb, scheduler_service_client::SchedulerServiceClient},
};
use tonic::{
    metadata::{Ascii, MetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
    transport::{Channel, Endpoint},
};

use gpuwarden_types::{
    placement::Placement,
    policy::{ComputePolicy, MemoryPolicy, QuotaPolicy},
    slot::ResourceSlot,
    target::Target,
};

/// gpuwarden: share GPUs between containers.
#[derive(Parser)]
#[command(name = "gpuwarden", version, about)]
pub struct Cli {
    #[command(flatten)]
    controller: ControllerArgs,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

/// Where the controller is, the TLS files to reach it with, and the token to show it.
#[derive(clap::Args, Debug, Clone)]
pub struct ControllerArgs {
    /// Controller URL (https:// needs --ca); with several controllers sharing an etcd store, a
    /// comma-separated list (the CLI asks the one that leads).
    #[arg(
        long = "controller",
        global = true,
        env = "GPUWARDEN_CONTROLLER",
        default_value = "http://127.0.0.1:50051"
    )]
    url: String,
    /// CA that signs the controller's certificate (PEM), for an https:// controller.
    #[arg(long, global = true, env = "GPUWARDEN_CA", value_name = "FILE")]
    ca: Option<PathBuf>,
    /// Client certificate to present to the controller (PEM).
    #[arg(long, global = true, env = "GPUWARDEN_CERT", value_name = "FILE")]
    cert: Option<PathBuf>,
    /// Private key of --cert (PEM).
    #[arg(long, global = true, env = "GPUWARDEN_KEY", value_name = "FILE")]
    key: Option<PathBuf>,
    /// File holding the bearer token to authenticate with (as `gpuwarden-controller tokens
    /// add` printed it), sent with every call.
    #[arg(long, global = true, env = "GPUWARDEN_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<PathBuf>,
}

/// The scheduler client the CLI uses: every call carries the bearer token, when one is given.
pub type Client = SchedulerServiceClient<InterceptedService<Channel, Bearer>>;

/// Adds `authorization: Bearer <token>` to every call (nothing without a token).
#[derive(Clone, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    /// The token in `path` (surrounding whitespace, such as a final newline, dropped).
    ///
    /// # Errors
    /// [`CliError::Input`]: the file can't be read, is empty, or holds what can't be a token.
    pub fn from_file(path: &std::path::Path) -> Result<Self, CliError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            CliError::Input(format!(
                "cannot read the token file {}: {e}",
                path.display()
            ))
        })?;
        let token = text.trim();
        if token.is_empty() || token.contains(char::is_whitespace) {
            return Err(CliError::Input(format!(
                "the token file {} must hold one token and nothing else",
                path.display()
            )));
        }
        let value = format!("Bearer {token}").parse().map_err(|_| {
            CliError::Input(format!(
                "the token in {} has characters a token can't have",
                path.display()
            ))
        })?;
        Ok(Self(Some(value)))
    }
}

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
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
    /// Workload profiles learned from finished sessions.
    #[command(subcommand)]
    Profile(ProfileCommand),
    /// Team queues: guarantees, limits, members; what each holds and borrows.
    #[command(subcommand)]
    Queue(queue::QueueCommand),
    /// Run a command inside a new session's quota on this node, e.g.
    /// `gpuwarden run -r cuda.shares=0.5 -r cuda.mem=4g -- python train.py`.
    Run(run::RunArgs),
}

/// How a quota is enforced (`session create`, `run`).
#[derive(clap::Args)]
pub struct PolicyArgs {
    /// Over the GPU-memory limit: kill (default), stop or report.
    #[arg(long, value_name = "POLICY")]
    memory_policy: Option<MemoryPolicy>,
    /// Compute share: hard (default) or work-conserving.
    #[arg(long, value_name = "POLICY")]
    compute_policy: Option<ComputePolicy>,
}

impl PolicyArgs {
    /// The policy the flags name (defaults for those left out).
    #[must_use]
    pub fn policy(&self) -> QuotaPolicy {
        QuotaPolicy {
            memory: self.memory_policy.unwrap_or_default(),
            compute: self.compute_policy.unwrap_or_default(),
        }
    }
}

/// The gang a session joins (`session create`, `run`): its members are placed all at once or
/// not at all (docs/teams.md, "Gangs").
#[derive(clap::Args)]
pub struct GangArgs {
    /// Join this gang (of the session's owner): placed only together with all its members.
    #[arg(long, value_name = "NAME", requires = "gang_size")]
    gang: Option<String>,
    /// How many sessions the gang has (2 or more; every member names the same size).
    #[arg(long, value_name = "N", requires = "gang")]
    gang_size: Option<u32>,
}

impl GangArgs {
    /// The gang the flags name, if any.
    #[must_use]
    pub fn to_pb(&self) -> Option<pb::Gang> {
        Some(pb::Gang {
            name: self.gang.clone()?,
            size: self.gang_size?,
        })
    }
}

/// The workload a quota binds to (`session create`); at most one.
#[derive(clap::Args)]
struct TargetArgs {
    /// Bind the quota to this container (its runtime's id, hex digits).
    #[arg(long, value_name = "ID", conflicts_with_all = ["pod", "cgroup"])]
    container: Option<String>,
    /// Bind the quota to this Kubernetes pod (its UID): all its containers share it.
    #[arg(long, value_name = "UID", conflicts_with = "cgroup")]
    pod: Option<String>,
    /// Bind the quota to this cgroup v2 path, relative to the cgroup root (e.g.
    /// /system.slice/my.service).
    #[arg(long, value_name = "PATH")]
    cgroup: Option<String>,
    /// Admins only: the cgroup need not be a workload's (a slice or a service, not a container,
    /// pod or session cgroup). The agent still refuses the root, system cgroups, its own and
    /// one another session binds.
    #[arg(long, requires = "cgroup")]
    unconfined: bool,
}

impl TargetArgs {
    fn target(&self) -> Target {
        match (&self.container, &self.pod, &self.cgroup) {
            (Some(id), _, _) => Target::ContainerId(id.clone()),
            (None, Some(uid), _) => Target::PodUid(uid.clone()),
            (None, None, Some(path)) => Target::CgroupPath(path.clone()),
            (None, None, None) => Target::None,
        }
    }
}

#[derive(Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "a command line, parsed once: boxing `create`'s flags buys nothing"
)]
enum SessionCommand {
    /// Ask for resources, e.g. `-r cpu=1 -r mem=2g -r cuda.shares=0.2`; prints the session's
    /// id.
    Create(CreateArgs),
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
        /// Why it went where it went: the best candidates with each score term.
        #[arg(long)]
        explain: bool,
    },
    /// End a session.
    Rm {
        /// Session id.
        id: String,
    },
    /// Print session changes as they happen (following the leader, and resuming where it
    /// stopped when the controller restarts).
    Watch,
}

/// The flags of `session create`.
#[derive(clap::Args)]
struct CreateArgs {
    /// A resource, name=value (repeat).
    #[arg(short = 'r', long = "resource", required = true)]
    resources: Vec<String>,
    /// Owner (user or project); default: the caller (the token's or certificate's owner;
    /// `default` on a controller without authentication). Only an admin names another.
    #[arg(long, default_value = "")]
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
    #[command(flatten)]
    target: TargetArgs,
    #[command(flatten)]
    policy: PolicyArgs,
    /// Workload class its usage profile is learned under (default: its name).
    #[arg(long, default_value = "")]
    class: String,
    /// Placement mode: binpack, spread or interference-aware (default: the controller's).
    #[arg(long, value_name = "MODE")]
    placement: Option<Placement>,
    /// Never preempted; admitted only within its queue's guarantee (docs/quotas.md).
    #[arg(long)]
    no_preempt: bool,
    /// How it yields when preempted: `kill`, or `suspend` (its GPU memory to its node's
    /// host memory, resumed there when room returns; docs/suspend.md). Default: its
    /// queue's mode, else kill.
    #[arg(long, value_name = "MODE", value_parser = ["kill", "suspend"])]
    preemption: Option<String>,
    #[command(flatten)]
    gang: GangArgs,
    /// Wait until the session runs, saying on stderr what it waits for (the controller's
    /// reason, again whenever it changes); then print it. Ctrl-C or `--timeout` stop the
    /// wait and leave the session as it is (end it with `session rm`).
    #[arg(long)]
    wait: bool,
    /// With --wait: seconds to wait; after, exit 124 naming the last reason.
    #[arg(long, default_value_t = 120, value_name = "SECS", requires = "wait")]
    timeout: u64,
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

#[derive(Subcommand)]
enum ProfileCommand {
    /// List the learned profiles.
    Ls,
    /// Show one class's profile.
    Show {
        /// Workload class.
        class: String,
    },
}

/// How a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad input (exit 2).
    #[error("{0}")]
    Input(String),
    /// The controller answered with an error (exit 1, whatever the reason).
    #[error(
        "controller error: {code:?}: {message}{}{}",
        reason.as_ref().map(|r| format!(" (reason {r})")).unwrap_or_default(),
        retry_after.map(|d| format!(" (retry after {d:?})")).unwrap_or_default()
    )]
    Server {
        /// gRPC code.
        code: tonic::Code,
        /// Its reason.
        message: String,
        /// The stable reason code of its `ErrorInfo` detail (docs/api.md, "Errors"), if any.
        reason: Option<String>,
        /// When retrying can succeed, as its `RetryInfo` detail says.
        retry_after: Option<std::time::Duration>,
    },
    /// The controller can't be reached (exit 1).
    #[error("cannot reach the controller at {url}: {reason}")]
    Unreachable {
        /// URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The node agent can't be reached or refused (exit 1).
    #[error(transparent)]
    Agent(#[from] gpuwarden_agent_api::ClientError),
    /// `gpuwarden run` could not get its session running (exit 1).
    #[error("{0}")]
    Run(String),
    /// A session did not start within `--timeout` (exit [`TIMEOUT_EXIT`]).
    #[error(
        "session {id} did not start within {waited} (still {state}{}); see --timeout",
        if reason.is_empty() { String::new() } else { format!(": {reason}") }
    )]
    TimedOut {
        /// The session.
        id: String,
        /// How long it was waited for, in words.
        waited: String,
        /// Its state at the end.
        state: String,
        /// Its last reason (empty: none given).
        reason: String,
    },
}

/// The exit code of a wait that ran out of `--timeout` (`run`, `session create --wait`): 124,
/// as `timeout(1)` exits when its time runs out.
pub const TIMEOUT_EXIT: u8 = 124;

impl CliError {
    /// The process exit code.
    #[must_use]
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Self::Input(_) => ExitCode::from(2),
            Self::TimedOut { .. } => ExitCode::from(TIMEOUT_EXIT),
            Self::Server { .. } | Self::Unreachable { .. } | Self::Agent(_) | Self::Run(_) => {
                ExitCode::from(1)
            }
        }
    }
}

impl From<tonic::Status> for CliError {
    fn from(s: tonic::Status) -> Self {
        Self::Server {
            code: s.code(),
            message: s.message().to_owned(),
            reason: gpuwarden_proto::details::reason(&s),
            retry_after: gpuwarden_proto::details::retry_delay(&s),
        }
    }
}

/// The whole `gpuwarden` binary: parses the command line, runs it on its own runtime, and
/// returns the exit code (0; 1 for server, agent or run failures; 2 for bad input;
/// [`TIMEOUT_EXIT`] when a session did not start within `--timeout`; the command's own for
/// `run`, or [`run::PREEMPTED_EXIT`] when its session was preempted).
#[must_use]
pub fn main() -> ExitCode {
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
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gpuwarden: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpuwarden: {e}");
            e.exit_code()
        }
    }
}

async fn connect(controller: &ControllerArgs) -> Result<Client, CliError> {
    let bearer = controller
        .token_file
        .as_deref()
        .map(Bearer::from_file)
        .transpose()?
        .unwrap_or_default();
    let channel = leader(controller).await?;
    Ok(SchedulerServiceClient::with_interceptor(channel, bearer))
}

/// A channel to `url`, with the TLS settings given.
async fn channel(url: &str, controller: &ControllerArgs) -> Result<Channel, CliError> {
    let endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|e| CliError::Input(format!("invalid --controller URL {url:?}: {e}")))?;
    let tls = ClientTls {
        ca: controller.ca.clone(),
        cert: controller.cert.clone(),
        key: controller.key.clone(),
    };
    tls.apply(endpoint)
        .map_err(|e| CliError::Input(e.to_string()))?
        .connect_timeout(std::time::Duration::from_secs(3))
        .connect()
        .await
        .map_err(|e| CliError::Unreachable {
            url: url.to_owned(),
            reason: e.to_string(),
        })
}

/// The controller of `--controller`'s list that leads, and a channel to it: each is asked in
/// turn, and a standby's answer (which names the leader) is followed.
async fn leader(controller: &ControllerArgs) -> Result<Channel, CliError> {
    let mut controllers =
        Controllers::parse(&controller.url).map_err(|e| CliError::Input(e.to_string()))?;
    // Every entry once, and a named leader after each.
    let attempts = 2 * controllers.urls().len() + 1;
    let mut last = None;
    for _ in 0..attempts {
        let url = controllers.current().to_owned();
        let channel = match channel(&url, controller).await {
            Ok(channel) => channel,
            Err(e @ CliError::Input(_)) => return Err(e),
            Err(e) => {
                controllers.failed(None);
                last = Some(e);
                continue;
            }
        };
        // Any answer but a standby's means this one leads (an error is the command's to report).
        match SchedulerServiceClient::new(channel.clone())
            .list_slot_types(pb::ListSlotTypesRequest {})
            .await
        {
            Err(status) if status.code() == tonic::Code::Unavailable => {
                controllers.failed(Some(&status));
                last = Some(CliError::Unreachable {
                    url,
                    reason: status.message().to_owned(),
                });
            }
            _ => return Ok(channel),
        }
    }
    Err(last.unwrap_or_else(|| CliError::Unreachable {
        url: controller.url.clone(),
        reason: "no controller leads".to_owned(),
    }))
}

fn print_json<T: serde::Serialize>(value: &T) {
    match serde_json::to_string_pretty(value) {
        Ok(s) => println!("{s}"),
        Err(e) => eprintln!("gpuwarden: cannot encode JSON: {e}"),
    }
}

/// Runs the parsed command line; the exit code is 0 but for `run`, whose is the command's.
///
/// # Errors
/// See [`CliError`].
pub async fn run(cli: Cli) -> Result<ExitCode, CliError> {
    let command = match cli.command {
        Command::Run(args) => {
            return run::run(&cli.controller, args, waiting::Style::detect(cli.json)).await;
        }
        other => other,
    };
    // Parse before connecting, so bad input is exit 2 even with no controller.
    let requested = match &command {
        Command::Session(SessionCommand::Create(create)) => {
            create
                .target
                .target()
                .validate(create.node.as_deref())
                .map_err(|e| CliError::Input(e.to_string()))?;
            Some(
                ResourceSlot::parse_any(&create.resources)
                    .map_err(|e| CliError::Input(e.to_string()))?,
            )
        }
        _ => None,
    };
    let queue = match &command {
        Command::Queue(q) => queue::parse(q)?,
        _ => None,
    };
    let mut client = connect(&cli.controller).await?;
    match command {
        Command::Session(command) => {
            return session::run(&cli.controller, client, command, requested, cli.json).await;
        }
        Command::Node(command) => inventory::node(&mut client, command, cli.json).await?,
        Command::Slot(command) => inventory::slot(&mut client, command, cli.json).await?,
        Command::Profile(command) => inventory::profile(&mut client, command, cli.json).await?,
        Command::Queue(command) => queue::run(&mut client, command, queue, cli.json).await?,
        // Handled above, before connecting.
        Command::Run(_) => {}
    }
    Ok(ExitCode::SUCCESS)
}
