//! `gpuwarden-controller run`: the store, the services, health checking and reflection, over
//! plain text or mutual TLS; `gpuwarden-controller certs mint`: certificates for both.
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

use gpuwarden_proto::v1::{
    FILE_DESCRIPTOR_SET, agent_service_server::AgentServiceServer,
    scheduler_service_server::SchedulerServiceServer,
};
use serde::Deserialize;

use crate::{
    api::{AgentApi, Controller, SchedulerApi, Timing},
    auth::{
        mint,
        tls::{ReloadingConfig, ServerTlsFiles, TlsSetupError},
    },
    scheduler::{Scheduler, SchedulerConfig},
    store::{Store, StoreError},
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
    /// Only some of the TLS files are given.
    #[error("TLS needs a certificate, its key and a client CA; missing: {missing}")]
    IncompleteTls {
        /// The settings not given (flags; the config file's keys are the same with `_`).
        missing: String,
    },
}

/// How the controller's port speaks.
#[derive(Clone)]
pub enum Transport {
    /// Plain text: anyone who reaches the port can act as any node (the local one-command run).
    PlainText,
    /// TLS with this configuration; agents must present a node certificate.
    Tls(Arc<ReloadingConfig>),
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
    /// The serving certificate (PEM); with the key and client CA, the port speaks TLS.
    pub tls_cert: Option<PathBuf>,
    /// The serving certificate's private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// The CA that signs agents' client certificates (PEM).
    pub tls_client_ca: Option<PathBuf>,
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

/// Opens the store in `state_dir`, rebuilds the state from it, and returns the controller.
///
/// # Errors
/// The store can't be opened or read.
pub fn open(
    state_dir: &std::path::Path,
    config: SchedulerConfig,
    timing: Timing,
) -> Result<Arc<Controller>, ServeError> {
    let store = Store::open(&state_dir.join("store"))?;
    let snapshot = store.load()?;
    tracing::info!(
        sessions = snapshot.sessions.len(),
        nodes = snapshot.nodes.len(),
        profiles = snapshot.profiles.len(),
        "state restored from {}",
        state_dir.display()
    );
    let scheduler = Scheduler::restore(config, snapshot);
    Ok(Controller::new(scheduler, store, timing))
}

/// Serves `controller` on `addr` until `shutdown` completes.
///
/// # Errors
/// The listener or the server fails.
pub async fn serve(
    controller: Arc<Controller>,
    addr: SocketAddr,
    transport: Transport,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| ServeError::Config {
            path: PathBuf::from(addr.to_string()),
            reason: format!("cannot listen: {e}"),
        })?;
    serve_with(controller, listener, transport, shutdown).await
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
    serve_with(controller, listener, Transport::PlainText, shutdown).await
}

/// Serves on an already-bound listener, over `transport`.
///
/// # Errors
/// The server fails.
pub async fn serve_with(
    controller: Arc<Controller>,
    listener: tokio::net::TcpListener,
    transport: Transport,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ServeError> {
    let addr = listener
        .local_addr()
        .map_err(|e| ServeError::Reflection(e.to_string()))?;
    let router = router(&controller).await?;
    let background = tokio::spawn(Arc::clone(&controller).run_background());
    let serve_error = |source| ServeError::Serve { addr, source };
    let result = match transport {
        Transport::PlainText => {
            static WARNED: Once = Once::new();
            WARNED.call_once(|| {
                tracing::warn!("serving plain text: any client can act as any node");
            });
            tracing::info!(%addr, "controller listening (plain text)");
            router
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    shutdown,
                )
                .await
                .map_err(serve_error)
        }
        Transport::Tls(config) => {
            tracing::info!(%addr, "controller listening (TLS; agents need a node certificate)");
            router
                .serve_with_incoming_shutdown(
                    crate::auth::tls::incoming(listener, config),
                    shutdown,
                )
                .await
                .map_err(serve_error)
        }
    };
    background.abort();
    result
}

/// The services: scheduler, agents, health and reflection.
async fn router(
    controller: &Arc<Controller>,
) -> Result<tonic::transport::server::Router, ServeError> {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<SchedulerServiceServer<SchedulerApi>>()
        .await;
    health_reporter
        .set_serving::<AgentServiceServer<AgentApi>>()
        .await;
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
    Ok(tonic::transport::Server::builder()
        .add_service(health)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(SchedulerServiceServer::new(SchedulerApi(Arc::clone(
            controller,
        ))))
        .add_service(AgentServiceServer::new(AgentApi(Arc::clone(controller)))))
}

/// gpuwarden's cluster controller.
#[derive(Parser)]
#[command(name = "gpuwarden-controller", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the gRPC API.
    Run {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:50051")]
        listen: SocketAddr,
        /// Directory of the embedded store.
        #[arg(long, default_value = "/var/lib/gpuwarden/controller")]
        state_dir: PathBuf,
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
    },
    /// Certificates for mutual TLS, without OpenSSL.
    #[command(subcommand)]
    Certs(CertsCommand),
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
        /// Days the server and node certificates are valid (a new CA: ten times as long).
        #[arg(long, default_value_t = 365)]
        days: u32,
    },
}

/// `certs mint`: writes the files and says which.
fn mint_command(out: &Path, nodes: &[String], server_names: &[String], days: u32) -> ExitCode {
    let server_names: Vec<String> = server_names
        .iter()
        .filter(|n| !n.is_empty())
        .cloned()
        .collect();
    match mint::mint_into(out, nodes, &server_names, days) {
        Ok(minted) => {
            if minted.reused_ca {
                println!("reused the CA in {}", out.display());
            }
            for file in &minted.written {
                println!("wrote {}", file.display());
            }
            ExitCode::SUCCESS
        }
        Err(e @ mint::MintError::InvalidNodeId { .. }) => {
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
    let (listen, state_dir, config, placement, tls) = match Cli::parse().command {
        Command::Run {
            listen,
            state_dir,
            config,
            placement,
            tls_cert,
            tls_key,
            tls_client_ca,
        } => (
            listen,
            state_dir,
            config,
            placement,
            (tls_cert, tls_key, tls_client_ca),
        ),
        Command::Certs(CertsCommand::Mint {
            out,
            nodes,
            server_names,
            days,
        }) => return mint_command(&out, &nodes, &server_names, days),
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
        tls.0.or(file.tls_cert),
        tls.1.or(file.tls_key),
        tls.2.or(file.tls_client_ca),
    ) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("gpuwarden-controller: {e}");
            return ExitCode::from(2);
        }
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
    let mut scheduler = file.scheduler.unwrap_or_default();
    if let Some(mode) = placement {
        scheduler.strategy = mode;
    }
    tracing::info!(placement = %scheduler.strategy, "default placement mode");
    let result = runtime.block_on(async {
        let controller = open(&state_dir, scheduler, timing)?;
        // Metrics are an extra: a bad endpoint is reported, never fatal.
        let endpoint = file
            .otlp_endpoint
            .filter(|e| !e.is_empty())
            .or_else(crate::metrics::endpoint_from_env);
        let _metrics = match crate::metrics::start(&controller, endpoint, None) {
            Ok(metrics) => metrics,
            Err(e) => {
                tracing::warn!("metrics off: {e}");
                None
            }
        };
        serve(controller, listen, transport, gpuwarden_runtime::shutdown()).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuwarden-controller: {e}");
            ExitCode::FAILURE
        }
    }
}
