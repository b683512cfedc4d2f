//! `gpuwarden-controller run`: the store, the services, health checking and reflection, over
//! plain text or mutual TLS, with clients authenticated by certificate or bearer token;
//! `gpuwarden-controller certs mint`: certificates; `gpuwarden-controller tokens add`: tokens.
//!
//! [`main`] is the whole `gpuwarden-controller` binary.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{Arc, Once},
    time::Duration,
};

use clap::{Parser, Subcommand};
use gpuwarden_runtime::tls::ClientTls;

use gpuwarden_proto::v1::{
    FILE_DESCRIPTOR_SET, agent_service_server::AgentServiceServer,
    scheduler_service_server::SchedulerServiceServer,
};
use serde::Deserialize;

use crate::{
    api::{AgentApi, Controller, SchedulerApi, Timing},
    api::{Role, StandbyGate},
    auth::{
        clients::{ClientAuth, ClientRole},
        gate::AuthGate,
        grants::GrantFile,
        mint,
        tls::{ConnectionCaps, ReloadingConfig, ServerTlsFiles, TlsSetupError},
        tokens::{self, TokenError, TokenFile},
    },
    limits::{Bounds, Limits},
    scheduler::{Scheduler, SchedulerConfig},
    store::{EtcdKv, Kv, Replica, Snapshot, Store, StoreError, StoreSpec},
};

/// Errors that stop the controller.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The store can't be used.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The config file can't be used.
    #[error("config file {path}: {reason}")]
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The listener or the server failed.
    #[error("serving on {addr}: {source}")]
    Serve {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
    /// Reflection could not be built.
    #[error("building gRPC reflection: {0}")]
    Reflection(String),
    /// The TLS files can't be used.
    #[error(transparent)]
    Tls(#[from] TlsSetupError),
    /// The token file can't be used.
    #[error(transparent)]
    Tokens(#[from] TokenError),
    /// Only some of the TLS files are given.
    #[error("TLS needs a certificate, its key and a client CA; missing: {missing}")]
    IncompleteTls {
        /// The settings not given (flags; the config file's keys are the same with `_`).
        missing: String,
    },
    /// Plain text on an address other machines reach, without `--insecure`.
    #[error(
        "refusing to serve plain text on {addr} ({what}); give --tls-cert, --tls-key and \
         --tls-client-ca (clients then present a certificate or a --token-file token), listen \
         on a loopback address, or pass --insecure (config key `insecure = true`) to serve \
         plain text anyway"
    )]
    PlainTextExposed {
        /// The address.
        addr: SocketAddr,
        /// What would be exposed.
        what: &'static str,
    },
}

/// How the controller's port speaks.
#[derive(Clone)]
pub enum Transport {
    /// Plain text: anyone who reaches the port can act as any node (the local one-command run).
    /// Served on loopback addresses only.
    PlainText,
    /// Plain text on any address, because the operator said `--insecure`: warned about at
    /// every start and exported as `gpuwarden.controller.insecure` = 1.
    Insecure,
    /// TLS with this configuration; agents must present a node certificate.
    Tls(Arc<ReloadingConfig>),
}

/// Whether this process serves plain text beyond loopback (`--insecure` on a non-loopback
/// address), for the `gpuwarden.controller.insecure` gauge.
static SERVING_INSECURE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether this process serves plain text on an address other machines reach (`--insecure`).
#[must_use]
pub fn serving_insecure() -> bool {
    SERVING_INSECURE.load(std::sync::atomic::Ordering::Relaxed)
}

impl Transport {
    /// Plain text when none of the three files is given, TLS when all are.
    ///
    /// # Errors
    /// Only some are given, or the files can't be used.
    pub fn from_files(
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        client_ca: Option<PathBuf>,
    ) -> Result<Self, ServeError> {
        match (cert, key, client_ca) {
            (None, None, None) => Ok(Self::PlainText),
            (Some(cert), Some(key), Some(client_ca)) => Ok(Self::Tls(Arc::new(
                ReloadingConfig::load(ServerTlsFiles {
                    cert,
                    key,
                    client_ca,
                })?,
            ))),
            (cert, key, client_ca) => {
                let missing: Vec<&str> = [
                    (cert.is_none(), "--tls-cert"),
                    (key.is_none(), "--tls-key"),
                    (client_ca.is_none(), "--tls-client-ca"),
                ]
                .into_iter()
                .filter_map(|(absent, flag)| absent.then_some(flag))
                .collect();
                Err(ServeError::IncompleteTls {
                    missing: missing.join(", "),
                })
            }
        }
    }

    /// Plain text, loopback-only or `--insecure`.
    #[must_use]
    pub fn is_plain_text(&self) -> bool {
        !matches!(self, Self::Tls(_))
    }

    /// Plain text on `addr` is served only on loopback, or when the operator said `--insecure`
    /// (docs/architecture.md, "Nobody is trusted by default").
    ///
    /// # Errors
    /// [`ServeError::PlainTextExposed`] for [`Transport::PlainText`] on any other address.
    pub fn check_exposure(&self, addr: SocketAddr) -> Result<(), ServeError> {
        match self {
            Self::PlainText if !addr.ip().is_loopback() => Err(ServeError::PlainTextExposed {
                addr,
                what: "anyone who reaches it could act as any node and read every token",
            }),
            _ => Ok(()),
        }
    }
}

/// How the port speaks and how clients of the scheduler service authenticate.
///
/// Clients are authenticated when the port speaks TLS (by their certificate, or a token) or a
/// token file is given (by their token); with neither, every client is an admin.
#[derive(Clone)]
pub struct Security {
    /// Plain text or TLS.
    pub transport: Transport,
    /// Bearer tokens for clients.
    pub tokens: Option<Arc<TokenFile>>,
    /// What users may bind sessions to ([`crate::auth::grants`]); without a file, their own
    /// managed cgroups only.
    pub grants: Arc<GrantFile>,
}

impl From<Transport> for Security {
    /// `transport` with no token file.
    fn from(transport: Transport) -> Self {
        Self {
            transport,
            tokens: None,
            grants: Arc::default(),
        }
    }
}

impl Security {
    /// How clients of the scheduler service authenticate.
    #[must_use]
    pub fn clients(&self) -> ClientAuth {
        ClientAuth::new(
            self.tokens.clone(),
            matches!(self.transport, Transport::Tls(_)),
        )
        .with_grants(Arc::clone(&self.grants))
    }
}

/// The controller's config file; every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Scheduler settings.
    #[serde(default)]
    pub scheduler: Option<SchedulerConfig>,
    /// Seconds of silence after which a node is Lost.
    pub heartbeat_timeout_secs: Option<u64>,
    /// OTLP/gRPC endpoint for metrics (else `OTEL_EXPORTER_OTLP_ENDPOINT`; neither: off).
    pub otlp_endpoint: Option<String>,
    /// Address to serve Prometheus' text format on (`GET /metrics`); unset: off.
    pub prometheus_listen: Option<SocketAddr>,
    /// The serving certificate (PEM); with the key and client CA, the port speaks TLS.
    pub tls_cert: Option<PathBuf>,
    /// The serving certificate's private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// The CA that signs agents' client certificates (PEM).
    pub tls_client_ca: Option<PathBuf>,
    /// Hashed bearer tokens of scheduler clients, each with its owner and role (TOML).
    pub token_file: Option<PathBuf>,
    /// What users may bind sessions to: cgroup prefixes and Kubernetes namespaces per owner
    /// (TOML; see `auth::grants`).
    pub grant_file: Option<PathBuf>,
    /// Where the state lives (`sled:PATH` or `etcd://…`); else sled in the state directory.
    #[serde(default, deserialize_with = "spec_from_str")]
    pub store: Option<StoreSpec>,
    /// For an etcd store over TLS: the CA that signs etcd's certificates (PEM).
    pub etcd_ca: Option<PathBuf>,
    /// This controller's client certificate for etcd (PEM).
    pub etcd_cert: Option<PathBuf>,
    /// The private key of `etcd_cert` (PEM).
    pub etcd_key: Option<PathBuf>,
    /// Serve plain text beyond loopback (as `--insecure`).
    pub insecure: Option<bool>,
    /// Bounds on what clients and agents may send (`[limits]`; see [`Limits`]).
    #[serde(default)]
    pub limits: Limits,
}

fn spec_from_str<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<StoreSpec>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|s| s.parse().map_err(serde::de::Error::custom))
        .transpose()
}

impl FileConfig {
    /// Reads `path`.
    ///
    /// # Errors
    /// The file can't be read or parsed.
    pub fn read(path: &std::path::Path) -> Result<Self, ServeError> {
        let text = std::fs::read_to_string(path).map_err(|e| ServeError::Config {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let config: Self = toml::from_str(&text).map_err(|e| ServeError::Config {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        config.limits.validate().map_err(|e| ServeError::Config {
            path: path.to_owned(),
            reason: format!("[limits]: {e}"),
        })?;
        if let Some(scheduler) = &config.scheduler {
            scheduler
                .scoring
                .validate()
                .map_err(|e| ServeError::Config {
                    path: path.to_owned(),
                    reason: format!("[scheduler.scoring]: {e}"),
                })?;
        }
        Ok(config)
    }
}

/// Opens the store `spec` names, rebuilds the state from it, and returns the controller.
///
/// # Errors
/// The store can't be opened, reached or read.
pub async fn open(
    spec: &StoreSpec,
    config: SchedulerConfig,
    timing: Timing,
) -> Result<Arc<Controller>, ServeError> {
    let store = Store::open(spec).await?;
    let snapshot = store.load().await?;
    tracing::info!(
        sessions = snapshot.sessions.len(),
        nodes = snapshot.nodes.len(),
        profiles = snapshot.profiles.len(),
        "state restored from {spec}"
    );
    let scheduler = Scheduler::restore(config, snapshot);
    Ok(Controller::new(scheduler, store, timing))
}

/// The store of a state directory: sled in its `store/` folder.
#[must_use]
pub fn sled_in(state_dir: &std::path::Path) -> StoreSpec {
    StoreSpec::Sled(state_dir.join("store"))
}

/// Serves `controller` on `addr`, held to `limits`, until `shutdown` completes.
///
/// # Errors
/// The listener or the server fails.
pub async fn serve(
    controller: Arc<Controller>,
    addr: SocketAddr,
    security: impl Into<Security>,
    limits: Limits,
    election: Option<Election>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| ServeError::Config {
            path: PathBuf::from(addr.to_string()),
            reason: format!("cannot listen: {e}"),
        })?;
    serve_bounded(controller, listener, security, limits, election, shutdown).await
}

/// A standby controller on the etcd store `spec` names: it leads once it wins the election.
///
/// # Errors
/// The store can't be reached, or has another format version.
pub async fn open_standby(
    spec: &StoreSpec,
    config: SchedulerConfig,
    timing: Timing,
    advertise: String,
    ttl: Duration,
) -> Result<(Arc<Controller>, Election), ServeError> {
    let store = Store::open(spec).await?;
    let Kv::Etcd(kv) = store.kv() else {
        return Err(ServeError::Config {
            path: PathBuf::from(spec.to_string()),
            reason: "leader election needs an etcd store".to_owned(),
        });
    };
    let election = Election {
        kv: (**kv).clone(),
        advertise,
        ttl,
    };
    tracing::info!(store = %spec, ttl = ?ttl, "standby: campaigning for leadership");
    let controller = Controller::with_role(Scheduler::new(config), store, timing, Role::standby());
    Ok((controller, election))
}

/// Binds a loopback port and serves, in a task of the current runtime, a controller campaigning
/// on the etcd store `spec` with a lease of `ttl` and advertising that port, until `shutdown`;
/// its address. Tests and benchmarks run several controllers in one process this way.
///
/// # Errors
/// The port can't be bound, or the store can't be reached.
pub async fn spawn_elected(
    spec: &StoreSpec,
    config: SchedulerConfig,
    timing: Timing,
    ttl: Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<SocketAddr, ServeError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| ServeError::Config {
            path: PathBuf::from("127.0.0.1:0"),
            reason: format!("cannot listen: {e}"),
        })?;
    let addr = listener
        .local_addr()
        .map_err(|e| ServeError::Reflection(e.to_string()))?;
    let (controller, election) = open_standby(spec, config, timing, addr.to_string(), ttl).await?;
    tokio::spawn(serve_with(
        controller,
        listener,
        Transport::PlainText,
        Some(election),
        shutdown,
    ));
    Ok(addr)
}

/// Serves plain text on an already-bound listener (tests bind port 0).
///
/// # Errors
/// The server fails.
pub async fn serve_on(
    controller: Arc<Controller>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    serve_with(controller, listener, Transport::PlainText, None, shutdown).await
}

/// Serves on an already-bound listener, over `security`'s transport (a [`Transport`] alone
/// takes no tokens); with an `election`, as a standby that campaigns and leads when it wins
/// (see [`hold_elections`]). Held to the default [`Limits`].
///
/// # Errors
/// The server fails.
pub async fn serve_with(
    controller: Arc<Controller>,
    listener: tokio::net::TcpListener,
    security: impl Into<Security>,
    election: Option<Election>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    serve_bounded(
        controller,
        listener,
        security,
        Limits::default(),
        election,
        shutdown,
    )
    .await
}

/// [`serve_with`], held to `limits`.
///
/// # Errors
/// The server fails.
pub async fn serve_bounded(
    controller: Arc<Controller>,
    listener: tokio::net::TcpListener,
    security: impl Into<Security>,
    limits: Limits,
    election: Option<Election>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    let addr = listener
        .local_addr()
        .map_err(|e| ServeError::Reflection(e.to_string()))?;
    let security = security.into();
    security.transport.check_exposure(addr)?;
    let (health_reporter, health) = tonic_health::server::health_reporter();
    set_health(&health_reporter, controller.role().is_leader()).await;
    let elections = election.map(|election| {
        tokio::spawn(hold_elections(
            Arc::clone(&controller),
            election,
            health_reporter.clone(),
        ))
    });
    let clients = security.clients();
    warn_about_clients(&clients, &security.transport);
    let router = router(&controller, health, clients, Bounds::new(limits))?;
    let background = tokio::spawn(Arc::clone(&controller).run_background());
    let serve_error = |source| ServeError::Serve { addr, source };
    let result = match security.transport {
        Transport::PlainText | Transport::Insecure => {
            if matches!(security.transport, Transport::Insecure) && !addr.ip().is_loopback() {
                SERVING_INSECURE.store(true, std::sync::atomic::Ordering::Relaxed);
                // Every start, not once per process: this is the line an operator must see.
                tracing::warn!(
                    %addr,
                    "--insecure: serving plain text beyond loopback; anyone who reaches this port can act as any node and read every token (gpuwarden.controller.insecure = 1)"
                );
            } else {
                static WARNED: Once = Once::new();
                WARNED.call_once(|| {
                    tracing::warn!("serving plain text: any client can act as any node");
                });
            }
            tracing::info!(%addr, "controller listening (plain text)");
            router
                .serve_with_incoming_shutdown(
                    crate::auth::tls::incoming_plain(
                        listener,
                        Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
                    ),
                    shutdown,
                )
                .await
                .map_err(serve_error)
        }
        Transport::Tls(config) => {
            tracing::info!(%addr, "controller listening (TLS; agents need a node certificate)");
            router
                .serve_with_incoming_shutdown(
                    crate::auth::tls::incoming(
                        listener,
                        config,
                        ConnectionCaps::new(
                            MAX_HANDSHAKES,
                            MAX_CONNECTIONS,
                            MAX_ANONYMOUS_CONNECTIONS,
                        ),
                    ),
                    shutdown,
                )
                .await
                .map_err(serve_error)
        }
    };
    background.abort();
    if let Some(elections) = elections {
        elections.abort();
    }
    result
}

/// Warns once per process about client authentication that protects little.
fn warn_about_clients(clients: &ClientAuth, transport: &Transport) {
    static OPEN: Once = Once::new();
    static CLEAR_TOKENS: Once = Once::new();
    if clients.is_open() {
        OPEN.call_once(|| {
            tracing::warn!(
                "no --token-file and no TLS: every client acts as an admin and may see and end every session"
            );
        });
    } else if clients.takes_tokens() && transport.is_plain_text() {
        CLEAR_TOKENS.call_once(|| {
            tracing::warn!(
                "bearer tokens over plain text: anyone on the network path can read and reuse them; serve TLS"
            );
        });
    }
}

/// The router's layers: authentication before decoding, then the standby gate.
type Layers = tower::layer::util::Stack<
    StandbyGate,
    tower::layer::util::Stack<AuthGate, tower::layer::util::Identity>,
>;

/// Connections the gRPC port holds open at once (over TLS: those with a client certificate);
/// past it a new one is closed at once (counted as `gpuwarden.limits.refused{reason=cap}`).
/// Agents hold one each, clients a few.
pub const MAX_CONNECTIONS: usize = 4_096;
/// TLS connections in their handshake at once (each has 10 s).
pub const MAX_HANDSHAKES: usize = 1_024;
/// TLS connections without a client certificate (token clients, probes, anyone) at once: kept
/// apart from [`MAX_CONNECTIONS`] so that anonymous peers never take the agents' room.
pub const MAX_ANONYMOUS_CONNECTIONS: usize = 1_024;
/// Messages services other than the scheduler's and the agents' take at most (health checks
/// and reflection requests are a few hundred bytes).
const SMALL_MESSAGE_BYTES: usize = 64 << 10;
/// HTTP/2 streams one connection may hold open (agents sharing a connection hold one each).
pub const MAX_STREAMS_PER_CONNECTION: u32 = 1_024;
/// Largest header block a request may carry (a token and tracing headers fit many times).
const MAX_HEADER_LIST_BYTES: u32 = 16 << 10;

/// The services: scheduler and agents behind the standby gate, health and reflection.
fn router(
    controller: &Arc<Controller>,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    clients: ClientAuth,
    bounds: Arc<Bounds>,
) -> Result<tonic::transport::server::Router<Layers>, ServeError> {
    // Both reflection versions: grpcurl and current clients ask `v1`, many others (Python's
    // grpcio reflection, older grpcurl, Postman) still ask `v1alpha`.
    let described = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection = described()
        .build_v1()
        .map_err(|e| ServeError::Reflection(e.to_string()))?;
    let reflection_v1alpha = described()
        .build_v1alpha()
        .map_err(|e| ServeError::Reflection(e.to_string()))?;
    let limits = bounds.limits.clone();
    let size = limits.max_message_bytes;
    let clients = Arc::new(clients);
    Ok(tonic::transport::Server::builder()
        .concurrency_limit_per_connection(limits.concurrency_per_connection)
        // Open streams per connection at the HTTP/2 layer (tonic leaves it unlimited): long-lived
        // agent and Watch streams count for their whole life, so this is wider than the
        // in-flight limit above; streams past it wait in the peer's own stack.
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
        // Cuts unary calls; a stream's handler returns at once, so streams stay open.
        .timeout(limits.request_timeout())
        .http2_keepalive_interval(Some(Duration::from_secs(limits.keepalive_interval_secs)))
        .http2_keepalive_timeout(Some(Duration::from_secs(limits.keepalive_timeout_secs)))
        // Callers are checked from their connection and headers before any body is read, so
        // an unauthenticated peer can't make the controller buffer a message.
        .layer(AuthGate::new(Arc::clone(&clients)))
        .layer(StandbyGate(controller.role().clone()))
        .add_service(health.max_decoding_message_size(SMALL_MESSAGE_BYTES))
        .add_service(reflection.max_decoding_message_size(SMALL_MESSAGE_BYTES))
        .add_service(reflection_v1alpha.max_decoding_message_size(SMALL_MESSAGE_BYTES))
        .add_service(
            SchedulerServiceServer::new(SchedulerApi(
                Arc::clone(controller),
                clients,
                Arc::clone(&bounds),
            ))
            .max_decoding_message_size(size)
            .max_encoding_message_size(size),
        )
        .add_service(
            AgentServiceServer::new(AgentApi(Arc::clone(controller), bounds))
                .max_decoding_message_size(size)
                .max_encoding_message_size(size),
        ))
}

/// The election name controllers sharing a store campaign on.
pub const ELECTION: &str = "controller";

/// How a controller that shares an etcd store campaigns.
#[derive(Debug, Clone)]
pub struct Election {
    /// The store's etcd.
    pub kv: EtcdKv,
    /// The address agents and clients reach this controller at, told to them by standbys.
    pub advertise: String,
    /// The lease: a leader that stops renewing it loses office this long after.
    pub ttl: Duration,
}

async fn set_health(reporter: &tonic_health::server::HealthReporter, leading: bool) {
    let status = if leading {
        tonic_health::ServingStatus::Serving
    } else {
        tonic_health::ServingStatus::NotServing
    };
    reporter
        .set_service_status(
            <SchedulerServiceServer<SchedulerApi> as tonic::server::NamedService>::NAME,
            status,
        )
        .await;
    reporter
        .set_service_status(
            <AgentServiceServer<AgentApi> as tonic::server::NamedService>::NAME,
            status,
        )
        .await;
}

/// Campaigns, leads while the office holds, steps down when it lapses or a commit is refused,
/// and campaigns again, for as long as the server runs. While campaigning it learns where the
/// leader is, for the standby's answers.
async fn hold_elections(
    controller: Arc<Controller>,
    election: Election,
    health: tonic_health::server::HealthReporter,
) {
    let Election { kv, advertise, ttl } = election;
    // A standby keeps a warm copy of the state, so that taking office reads nothing; one that
    // stopped following (etcd restarted, say) is made again.
    let mut replica: Option<Replica> = None;
    loop {
        if replica.as_ref().is_none_or(Replica::failed) {
            replica = match kv.replicate().await {
                Ok(replica) => Some(replica),
                Err(e) => {
                    tracing::warn!(
                        "standby without a warm copy (takeover will read the store): {e}"
                    );
                    None
                }
            };
        }
        let campaign = kv.campaign(ELECTION, &advertise, ttl);
        tokio::pin!(campaign);
        let won = loop {
            tokio::select! {
                won = &mut campaign => break won,
                () = tokio::time::sleep(Duration::from_millis(250)) => {
                    match kv.leader(ELECTION).await {
                        Ok(leader) => controller.role().stand_by(leader),
                        Err(e) => tracing::warn!("standby: cannot learn the leader: {e}"),
                    }
                }
            }
        };
        let office = match won {
            Ok(office) => office,
            Err(e) => {
                tracing::error!("not scheduling: cannot campaign for leadership: {e}; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let store = match Store::over(Kv::Etcd(Box::new(kv.clone()))).await {
            Ok(store) => store.fenced(office.fence()),
            Err(e) => {
                tracing::error!("won the election but cannot use the store: {e}; resigning");
                let _ = office.resign().await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let loading = std::time::Instant::now();
        let warm = match &replica {
            Some(replica) => match replica.caught_up(office.won_at(), ttl).await {
                Ok(()) => Snapshot::from_records(replica.records()).ok(),
                Err(e) => {
                    tracing::warn!("the warm copy is behind ({e}); reading the store instead");
                    None
                }
            },
            None => None,
        };
        let from_copy = warm.is_some();
        let stored = match warm {
            Some(stored) => stored,
            None => match store.load().await {
                Ok(stored) => stored,
                Err(e) => {
                    tracing::error!("won the election but cannot read the state: {e}; resigning");
                    let _ = office.resign().await;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
        };
        tracing::info!(
            sessions = stored.sessions.len(),
            nodes = stored.nodes.len(),
            term = controller.role().terms() + 1,
            took = ?loading.elapsed(),
            from = if from_copy { "the warm copy" } else { "the store" },
            "leading: took office at {advertise}"
        );
        controller.take_office(store, stored);
        set_health(&health, true).await;
        loop {
            tokio::select! {
                () = controller.deposed() => {
                    tracing::error!("stepping down: a commit was refused, another controller leads");
                    break;
                }
                () = tokio::time::sleep(ttl / 4) => {
                    if !office.renewing() {
                        tracing::error!("stepping down: the leadership lease could not be renewed");
                        break;
                    }
                }
            }
        }
        controller.step_down(None);
        set_health(&health, false).await;
        drop(office);
    }
}

/// TLS to etcd, for an etcd store.
#[derive(clap::Args, Debug, Default, Clone)]
struct EtcdTlsArgs {
    /// CA that signs etcd's serving certificates (PEM): talk to etcd over TLS.
    #[arg(long, value_name = "FILE")]
    etcd_ca: Option<PathBuf>,
    /// Client certificate for etcd's --client-cert-auth (PEM).
    #[arg(long, value_name = "FILE")]
    etcd_cert: Option<PathBuf>,
    /// Private key of --etcd-cert (PEM).
    #[arg(long, value_name = "FILE")]
    etcd_key: Option<PathBuf>,
}

impl EtcdTlsArgs {
    /// `spec` with these files when it is an etcd store (flags first, then the config file's).
    fn apply(self, mut spec: StoreSpec, file: &FileConfig) -> StoreSpec {
        if let StoreSpec::Etcd { tls, .. } = &mut spec {
            *tls = ClientTls {
                ca: self.etcd_ca.or_else(|| file.etcd_ca.clone()),
                cert: self.etcd_cert.or_else(|| file.etcd_cert.clone()),
                key: self.etcd_key.or_else(|| file.etcd_key.clone()),
            };
        }
        spec
    }
}

/// gpuwarden's cluster controller.
#[derive(Parser)]
#[command(name = "gpuwarden-controller", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// `gpuwarden-controller run`.
#[derive(clap::Args)]
struct RunArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Directory of the embedded store (sled in its `store/` folder), unless --store says
    /// otherwise.
    #[arg(long, default_value = "/var/lib/gpuwarden/controller")]
    state_dir: PathBuf,
    /// Where the state lives: sled:PATH, or etcd://HOST:PORT[,HOST:PORT…][/PREFIX] for a
    /// store shared by several controllers (overrides the config file's `store`).
    #[arg(long, value_name = "SPEC")]
    store: Option<StoreSpec>,
    /// With an etcd store: the address agents and clients reach this controller at, which
    /// standbys tell them (default: the listen address, or this host's name with its port).
    #[arg(long, value_name = "HOST:PORT")]
    advertise: Option<String>,
    /// With an etcd store: seconds a leader may go without renewing its lease before a
    /// standby takes over (at least 2: etcd raises shorter ones).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..))]
    lease_ttl_secs: u64,
    #[command(flatten)]
    etcd_tls: EtcdTlsArgs,
    /// TOML config file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Placement mode for sessions that don't ask for one: binpack, spread or
    /// interference-aware (overrides the config file's `[scheduler] strategy`).
    #[arg(long, value_name = "MODE")]
    placement: Option<crate::placement::Placement>,
    /// Serving certificate (PEM). With --tls-key and --tls-client-ca the port speaks TLS
    /// and agents must present a node certificate; without, plain text.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// Private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// CA that signs agents' (and clients') certificates (PEM).
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// Hashed bearer tokens of scheduler clients (TOML; see `tokens add`), re-read when it
    /// changes. With it or with TLS, clients must authenticate; with neither, every client
    /// is an admin.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// What users may bind sessions to, per owner: cgroup prefixes and Kubernetes namespaces
    /// (TOML), re-read when it changes. Without it a user binds only its own `gpuwarden run`
    /// cgroups; admins bind anything.
    #[arg(long, value_name = "FILE")]
    grant_file: Option<PathBuf>,
    /// Serve plain text on a non-loopback address (the gRPC port without TLS, the extender's
    /// plain-HTTP port): refused without this. Anyone who reaches the port then acts as any
    /// node; warned at every start and exported as `gpuwarden.controller.insecure` = 1.
    #[arg(long)]
    insecure: bool,
    /// Serve the metrics in Prometheus' text format at `GET /metrics` on this address (plain
    /// HTTP; overrides the config file's `prometheus_listen`; off by default).
    #[arg(long, value_name = "ADDR")]
    prometheus_listen: Option<SocketAddr>,
    /// Boxed: the flags of the Kubernetes side would make every `Command` as large.
    #[command(flatten)]
    kube: Box<KubeArgs>,
}

/// The Kubernetes side: the admission webhook and the scheduler extender (both off unless a
/// listen address is given).
#[derive(clap::Args, Debug, Default, Clone)]
struct KubeArgs {
    /// Serve the mutating admission webhook (`POST /mutate`) and the scheduler extender
    /// (`/extender/filter`, `/extender/prioritize`) over HTTPS here; needs --webhook-cert and
    /// --webhook-key.
    #[arg(long, value_name = "ADDR")]
    webhook_listen: Option<SocketAddr>,
    /// The webhook's serving certificate (PEM), re-read when it changes.
    #[arg(long, value_name = "FILE", requires = "webhook_listen")]
    webhook_cert: Option<PathBuf>,
    /// Private key of --webhook-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "webhook_listen")]
    webhook_key: Option<PathBuf>,
    /// CA that signs the API server's webhook client certificate and kube-scheduler's extender
    /// client certificate (PEM): the HTTPS listener then refuses clients without one. Without
    /// it, anyone who reaches the port can send reviews (warned at start).
    #[arg(long, value_name = "FILE", requires = "webhook_listen")]
    webhook_client_ca: Option<PathBuf>,
    /// Serve the scheduler extender alone over plain HTTP here (for a kube-scheduler without a
    /// TLS config for extenders).
    #[arg(long, value_name = "ADDR")]
    extender_listen: Option<SocketAddr>,
    /// The Kubernetes API server the webhook makes ResourceClaimTemplates through (default:
    /// the in-cluster one, with the pod's service account).
    #[arg(long, value_name = "URL")]
    kube_api: Option<String>,
    /// CA of --kube-api (PEM).
    #[arg(long, value_name = "FILE", requires = "kube_api")]
    kube_ca: Option<PathBuf>,
    /// Bearer token file for --kube-api, re-read on every call.
    #[arg(long, value_name = "FILE", requires = "kube_api")]
    kube_token_file: Option<PathBuf>,
}

/// The Kubernetes listeners, bound and ready to serve.
struct KubeListeners {
    webhook: Option<(
        tokio::net::TcpListener,
        Arc<crate::kubernetes::serve::ServingCert>,
    )>,
    extender: Option<tokio::net::TcpListener>,
    templates: Arc<dyn crate::kubernetes::apiserver::ClaimTemplates>,
}

impl KubeArgs {
    /// Loads the certificate, reaches for the API server and binds the listeners (none when
    /// neither listen address is given).
    async fn bind(self) -> Result<Option<KubeListeners>, String> {
        use crate::kubernetes::{apiserver::ApiServer, serve::ServingCert};
        if self.webhook_listen.is_none() && self.extender_listen.is_none() {
            return Ok(None);
        }
        let bind = |addr: SocketAddr| async move {
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr}: {e}"))
        };
        let webhook = match self.webhook_listen {
            Some(addr) => {
                let (Some(cert), Some(key)) = (self.webhook_cert, self.webhook_key) else {
                    return Err(
                        "--webhook-listen needs --webhook-cert and --webhook-key".to_owned()
                    );
                };
                if self.webhook_client_ca.is_none() {
                    tracing::warn!(
                        "--webhook-listen without --webhook-client-ca: anyone who reaches {addr} can send admission reviews and extender calls"
                    );
                }
                let cert = ServingCert::load_with_client_ca(cert, key, self.webhook_client_ca)
                    .map_err(|e| e.to_string())?;
                Some((bind(addr).await?, Arc::new(cert)))
            }
            None => None,
        };
        let extender = match self.extender_listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let api = match &self.kube_api {
            Some(url) => ApiServer::new(url, self.kube_ca.as_deref(), self.kube_token_file),
            None => ApiServer::in_cluster(),
        };
        let templates: Arc<dyn crate::kubernetes::apiserver::ClaimTemplates> = match api {
            Ok(api) => Arc::new(crate::kubernetes::templates::Remembered::new(Arc::new(api))),
            Err(e) if webhook.is_some() => return Err(e.to_string()),
            // The extender alone never calls the API server.
            Err(_) => Arc::new(NoApiServer),
        };
        Ok(Some(KubeListeners {
            webhook,
            extender,
            templates,
        }))
    }
}

/// Where no API server is configured (only the extender runs).
struct NoApiServer;

impl crate::kubernetes::apiserver::ClaimTemplates for NoApiServer {
    fn ensure<'a>(
        &'a self,
        _: &'a str,
        _: &'a serde_json::Value,
    ) -> crate::kubernetes::apiserver::BoxFuture<
        'a,
        Result<crate::kubernetes::apiserver::Ensured, crate::kubernetes::apiserver::ApiError>,
    > {
        Box::pin(async {
            Err(crate::kubernetes::apiserver::ApiError::Setup(
                "no API server configured".to_owned(),
            ))
        })
    }
}

impl KubeListeners {
    /// Serves them in tasks of the current runtime, for as long as it runs.
    fn spawn(self, controller: &Arc<Controller>) {
        use crate::kubernetes::serve::{Hooks, serve_extender, serve_webhook};
        let hooks = Arc::new(Hooks {
            controller: Arc::clone(controller),
            templates: self.templates,
        });
        if let Some((listener, cert)) = self.webhook {
            tokio::spawn(serve_webhook(
                listener,
                cert,
                Arc::clone(&hooks),
                std::future::pending(),
            ));
        }
        if let Some(listener) = self.extender {
            tokio::spawn(serve_extender(listener, hooks, std::future::pending()));
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Serve the gRPC API.
    Run(RunArgs),
    /// Copy every record of one store into another (from sled into etcd, say).
    CopyStore {
        /// The store to read: sled:PATH or etcd://….
        #[arg(long, value_name = "SPEC")]
        from: StoreSpec,
        /// The store to write: sled:PATH or etcd://….
        #[arg(long, value_name = "SPEC")]
        to: StoreSpec,
        /// TLS to etcd, for whichever side is etcd.
        #[command(flatten)]
        etcd_tls: EtcdTlsArgs,
    },
    /// Certificates for mutual TLS, without OpenSSL.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Bearer tokens for scheduler clients.
    #[command(subcommand)]
    Tokens(TokensCommand),
}

#[derive(Subcommand)]
enum TokensCommand {
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

#[derive(Subcommand)]
enum CertsCommand {
    /// Write a CA, the controller's serving certificate and one client certificate per node
    /// into a directory; a CA already there (ca.pem, ca.key) is reused, other files replaced.
    Mint {
        /// Directory to write into.
        #[arg(long)]
        out: PathBuf,
        /// Node ids, comma-separated: one client certificate each (<node>.pem, <node>.key).
        #[arg(long, value_delimiter = ',')]
        nodes: Vec<String>,
        /// Names the controller is reached by (DNS names or IP addresses), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "localhost,127.0.0.1")]
        server_names: Vec<String>,
        /// Scheduler users, comma-separated: one client certificate each naming
        /// spiffe://gpuwarden/user/<name> (user-<name>.pem, user-<name>.key).
        #[arg(long, value_delimiter = ',')]
        users: Vec<String>,
        /// Scheduler admins, comma-separated: one client certificate each naming
        /// spiffe://gpuwarden/admin/<name> (admin-<name>.pem, admin-<name>.key).
        #[arg(long, value_delimiter = ',')]
        admins: Vec<String>,
        /// Days the server and node certificates are valid (a new CA: ten times as long).
        #[arg(long, default_value_t = 365)]
        days: u32,
    },
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

/// The whole `gpuwarden-controller` binary: parses the command line and serves until Ctrl-C on
/// its own runtime. Exits 2 for a bad config file, 1 when serving fails.
#[must_use]
pub fn main() -> ExitCode {
    // A wrapping binary may have set up tracing already; that one stays.
    gpuwarden_runtime::logging::init("info");
    let RunArgs {
        listen,
        state_dir,
        store,
        advertise,
        lease_ttl_secs,
        etcd_tls,
        config,
        placement,
        tls_cert,
        tls_key,
        tls_client_ca,
        token_file,
        grant_file,
        insecure,
        prometheus_listen,
        kube,
    } = match Cli::parse().command {
        Command::Run(args) => args,
        Command::CopyStore { from, to, etcd_tls } => {
            let none = FileConfig::default();
            return copy_store(
                &etcd_tls.clone().apply(from, &none),
                &etcd_tls.apply(to, &none),
            );
        }
        Command::Certs(CertsCommand::Mint {
            out,
            nodes,
            server_names,
            users,
            admins,
            days,
        }) => {
            let clients: Vec<(String, ClientRole)> = users
                .into_iter()
                .map(|u| (u, ClientRole::User))
                .chain(admins.into_iter().map(|a| (a, ClientRole::Admin)))
                .collect();
            return mint_command(&out, &nodes, &server_names, &clients, days);
        }
        Command::Tokens(TokensCommand::Add { file, owner, role }) => {
            return tokens_add_command(&file, &owner, role);
        }
    };
    let file = match config.as_deref().map(FileConfig::read).transpose() {
        Ok(f) => f.unwrap_or_default(),
        Err(e) => {
            eprintln!("gpuwarden-controller: {e}");
            return ExitCode::from(2);
        }
    };
    // Flags win over the file, file by file.
    let transport = match Transport::from_files(
        tls_cert.or_else(|| file.tls_cert.clone()),
        tls_key.or_else(|| file.tls_key.clone()),
        tls_client_ca.or_else(|| file.tls_client_ca.clone()),
    ) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("gpuwarden-controller: {e}");
            return ExitCode::from(2);
        }
    };
    let tokens = match token_file
        .or_else(|| file.token_file.clone())
        .map(|path| TokenFile::load(&path))
        .transpose()
    {
        Ok(tokens) => tokens.map(Arc::new),
        Err(e) => {
            eprintln!("gpuwarden-controller: {e}");
            return ExitCode::from(2);
        }
    };
    let grants = match grant_file
        .or_else(|| file.grant_file.clone())
        .map(|path| GrantFile::load(&path))
        .transpose()
    {
        Ok(grants) => Arc::new(grants.unwrap_or_default()),
        Err(e) => {
            eprintln!("gpuwarden-controller: {e}");
            return ExitCode::from(2);
        }
    };
    let insecure = insecure || file.insecure.unwrap_or(false);
    let transport = match transport {
        Transport::PlainText if insecure => Transport::Insecure,
        other => other,
    };
    // Refused before anything is opened, with the flags named (exit 2, like a bad flag).
    let exposed = transport
        .check_exposure(listen)
        .and_then(|()| match kube.extender_listen {
            Some(addr) if !insecure && !addr.ip().is_loopback() => {
                Err(ServeError::PlainTextExposed {
                    addr,
                    what: "--extender-listen: anyone who reaches it learns every node's GPU occupancy",
                })
            }
            _ => Ok(()),
        });
    if let Err(e) = exposed {
        eprintln!("gpuwarden-controller: {e}");
        return ExitCode::from(2);
    }
    let security = Security {
        transport,
        tokens,
        grants,
    };
    let mut timing = Timing::default();
    if let Some(secs) = file.heartbeat_timeout_secs {
        timing.heartbeat_timeout = Duration::from_secs(secs);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gpuwarden-controller: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let spec = store
        .or_else(|| file.store.clone())
        .unwrap_or_else(|| sled_in(&state_dir));
    let spec = etcd_tls.apply(spec, &file);
    let mut scheduler = file.scheduler.unwrap_or_default();
    if let Some(mode) = placement {
        scheduler.strategy = mode;
    }
    tracing::info!(placement = %scheduler.strategy, "default placement mode");
    let result = runtime.block_on(async {
        let kube = (*kube).bind().await.map_err(|reason| ServeError::Config {
            path: PathBuf::from("--webhook-listen/--extender-listen"),
            reason,
        })?;
        let (controller, election) = if matches!(spec, StoreSpec::Etcd { .. }) {
            let advertise = advertise.unwrap_or_else(|| advertised(listen));
            let ttl = Duration::from_secs(lease_ttl_secs);
            let (controller, election) =
                open_standby(&spec, scheduler, timing, advertise, ttl).await?;
            (controller, Some(election))
        } else {
            (open(&spec, scheduler, timing).await?, None)
        };
        if let Some(kube) = kube {
            kube.spawn(&controller);
        }
        // Metrics are an extra: a bad endpoint is reported, never fatal.
        let exporters = gpuwarden_runtime::otlp::Exporters {
            otlp: file
                .otlp_endpoint
                .filter(|e| !e.is_empty())
                .or_else(crate::metrics::endpoint_from_env),
            interval: None,
            prometheus: prometheus_listen.or(file.prometheus_listen),
        };
        let _metrics = match crate::metrics::start(&controller, &exporters) {
            Ok(metrics) => metrics,
            Err(e) => {
                tracing::warn!("metrics off: {e}");
                None
            }
        };
        serve(
            controller,
            listen,
            security,
            file.limits,
            election,
            gpuwarden_runtime::shutdown(),
        )
        .await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuwarden-controller: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `gpuwarden-controller copy-store`: every record of `from` into `to`.
fn copy_store(from: &StoreSpec, to: &StoreSpec) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gpuwarden-controller: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let copied = runtime.block_on(async {
        let source = Store::open(from).await?;
        let target = Store::open(to).await?;
        source.copy_to(&target).await
    });
    match copied {
        Ok(n) => {
            println!("copied {n} records from {from} to {to}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gpuwarden-controller copy-store: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The address to advertise for `listen`: itself, unless it is a wildcard, then this host's name
/// with its port.
fn advertised(listen: SocketAddr) -> String {
    if !listen.ip().is_unspecified() {
        return listen.to_string();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".to_owned());
    format!("{host}:{}", listen.port())
}
