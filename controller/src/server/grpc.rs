//! The gRPC server: the scheduler and agent services behind the authentication and standby
//! gates, health checking and reflection, over plain text or mutual TLS, with every connection,
//! stream and message bounded. The controller's background loop and, with an [`Election`], its
//! campaign run beside it and are stopped and joined with it.
//!
//! [`GrpcServer`] is the server, a builder: it takes the controller and a bound listener, and
//! every other setting has a default a caller changes only where it needs to (the [`Security`],
//! the [`Bounds`], an [`Election`]). The [`Bounds`] a server is given hold its services, its
//! connection caps, and the counters of what they refused, which the metrics read.

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use gpuwarden_runtime::lifecycle::Tasks;

use gpuwarden_proto::v1::{
    FILE_DESCRIPTOR_SET, agent_service_server::AgentServiceServer,
    scheduler_service_server::SchedulerServiceServer,
};

use crate::{
    api::{AgentApi, SchedulerApi, StandbyGate},
    auth::{
        clients::ClientAuth,
        gate::AuthGate,
        grants::{self, GrantFile, Grants},
        tls::ConnectionCaps,
    },
    hub::Hub,
    limits::{Bounds, Limits},
    session::Session,
};

use super::{
    ServeError,
    election::{self, Election},
    security::{Security, Transport},
};

/// The gRPC server of one controller: built with [`GrpcServer::new`], adjusted with its
/// setters, run with [`GrpcServer::serve`]. Unless told otherwise it speaks plain text with no
/// token file, holds clients to the default [`Limits`], and leads at once (no election).
#[must_use = "a server does nothing until it serves"]
pub struct GrpcServer {
    controller: Arc<Hub>,
    listener: tokio::net::TcpListener,
    security: Security,
    bounds: Option<Arc<Bounds>>,
    election: Option<Election>,
}

impl GrpcServer {
    /// Serves `controller` on `listener` (bound already: tests and benchmarks bind port 0, the
    /// app binds before it opens the store).
    pub fn new(controller: Arc<Hub>, listener: tokio::net::TcpListener) -> Self {
        Self {
            controller,
            listener,
            security: Transport::PlainText.into(),
            bounds: None,
            election: None,
        }
    }

    /// How the port speaks and clients authenticate (a [`Transport`] alone takes no tokens).
    pub fn security(mut self, security: impl Into<Security>) -> Self {
        self.security = security.into();
        self
    }

    /// The bounds clients and agents are held to, which count what the server refuses (default:
    /// bounds of its own with the default [`Limits`]).
    pub fn bounds(mut self, bounds: Arc<Bounds>) -> Self {
        self.bounds = Some(bounds);
        self
    }

    /// With an election, the server is a standby that campaigns and leads when it wins (see
    /// [`Election`]); without, the controller leads as it is.
    pub fn election(mut self, election: impl Into<Option<Election>>) -> Self {
        self.election = election.into();
        self
    }

    /// Serves until `shutdown` completes, with the controller's background loop, the grant
    /// watch and the campaign (if any) beside it; they are stopped and joined before it returns.
    ///
    /// # Errors
    /// The listener's address is unknown, plain text would be exposed, or the server fails.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
        let Self {
            controller,
            listener,
            security,
            bounds,
            election,
        } = self;
        let bounds = bounds.unwrap_or_else(|| Bounds::new(Limits::default()));
        let addr = listener.local_addr().map_err(ServeError::LocalAddr)?;
        security.transport.check_exposure(addr)?;
        let (health_reporter, health) = tonic_health::server::health_reporter();
        election::set_health(&health_reporter, controller.role().is_leader()).await;
        let clients = security.clients(bounds.denials());
        warn_about_clients(&clients, &security.transport);
        let router = router(&controller, health, clients, Arc::clone(&bounds))?;
        // They run until stopped: stopped and joined here, so none outlives the server.
        let mut beside = Tasks::<ServeError>::default();
        beside.abort(
            "background",
            tokio::spawn(Arc::clone(&controller).run_background()),
        );
        beside.abort(
            "grant watch",
            tokio::spawn(watch_grants(
                Arc::clone(&controller),
                Arc::clone(&security.grants),
            )),
        );
        if let Some(election) = election {
            beside.abort(
                "election",
                tokio::spawn(election::hold_elections(
                    Arc::clone(&controller),
                    election,
                    health_reporter.clone(),
                )),
            );
        }
        let served =
            serve_router(router, listener, addr, security.transport, bounds, shutdown).await;
        served.and(beside.shutdown().await)
    }
}

/// Serves `router` on `listener` over `transport` until `shutdown`.
async fn serve_router(
    router: tonic::transport::server::Router<Layers>,
    listener: tokio::net::TcpListener,
    addr: SocketAddr,
    transport: Transport,
    bounds: Arc<Bounds>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let serve_error = |source| ServeError::Serve { addr, source };
    match transport {
        Transport::PlainText | Transport::Insecure => {
            if matches!(transport, Transport::Insecure) && !addr.ip().is_loopback() {
                bounds.mark_serving_insecure();
                // Every start, not once per process: this is the line an operator must see.
                tracing::warn!(
                    %addr,
                    "--insecure: serving plain text beyond loopback; anyone who reaches this port can act as any node and read every token (gpuwarden.controller.insecure = 1)"
                );
            } else {
                tracing::warn!("serving plain text: any client can act as any node");
            }
            tracing::info!(%addr, "controller listening (plain text)");
            router
                .serve_with_incoming_shutdown(
                    crate::auth::tls::incoming_plain(
                        listener,
                        Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
                        bounds,
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
                            bounds,
                        ),
                    ),
                    shutdown,
                )
                .await
                .map_err(serve_error)
        }
    }
}

/// How often the grant file is looked at for a change that withdraws a grant.
const GRANT_CHECK: Duration = Duration::from_secs(1);

/// Re-checks the sessions users created against the grant file, at start (a controller
/// restarted after a grant was withdrawn) and whenever a new version is in force: a session its
/// owner's grants no longer allow fails, saying why, and is released on its node (issue 33: a
/// removed grant left the sessions made under it bound, even after a restart).
async fn watch_grants(controller: Arc<Hub>, grants: Arc<GrantFile>) {
    let mut checked: Option<Arc<Grants>> = None;
    let mut tick = tokio::time::interval(GRANT_CHECK);
    loop {
        tick.tick().await;
        // Only a leader changes sessions; a standby checks once it leads.
        if !controller.role().is_leader() {
            checked = None;
            continue;
        }
        let now = grants.current();
        if checked.as_ref().is_some_and(|c| Arc::ptr_eq(c, &now)) {
            continue;
        }
        let check = |s: &Session| {
            grants::still_granted(&s.owner, &s.scope, &s.target, &s.policy, &now)
                .err()
                .map(|e| format!("its owner's grant was withdrawn: {e}"))
        };
        let withdrawn = controller.read(|s| {
            s.sessions()
                .values()
                .any(|x| !x.state.is_final() && check(x).is_some())
        });
        if !withdrawn {
            checked = Some(now);
            continue;
        }
        match controller.apply(|s| s.fail_ungranted(check)).await {
            Ok(releases) => {
                tracing::warn!(
                    sessions = releases.len(),
                    "a grant was withdrawn: the sessions it allowed failed"
                );
                controller.dispatch(releases);
                controller.kick();
                checked = Some(now);
            }
            Err(e) => tracing::warn!("sessions no longer granted are not failed yet: {e}"),
        }
    }
}

/// Warns, at each start of a server, about client authentication that protects little (a
/// daemon starts one; a test process may start many, each saying it).
fn warn_about_clients(clients: &ClientAuth, transport: &Transport) {
    if clients.is_open() {
        tracing::warn!(
            "no --token-file and no TLS: every client acts as an admin and may see and end every session"
        );
    } else if clients.takes_tokens() && transport.is_plain_text() {
        tracing::warn!(
            "bearer tokens over plain text: anyone on the network path can read and reuse them; serve TLS"
        );
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
    controller: &Arc<Hub>,
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
            SchedulerServiceServer::new(SchedulerApi {
                controller: Arc::clone(controller),
                clients,
                bounds: Arc::clone(&bounds),
            })
            .max_decoding_message_size(size)
            .max_encoding_message_size(size),
        )
        .add_service(
            AgentServiceServer::new(AgentApi {
                controller: Arc::clone(controller),
                bounds,
            })
            .max_decoding_message_size(size)
            .max_encoding_message_size(size),
        ))
}
