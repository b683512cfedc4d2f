//! Authentication before decoding (docs/architecture.md, "Nobody is trusted by default"): a
//! tower layer in front of every gRPC service that checks the caller from its connection (the
//! verified client certificate) and its headers (a bearer token) before the request's body is
//! read, so a peer that can't authenticate can't make the controller buffer or decode a
//! message of any size.
//!
//! - `gpuwarden.v1.SchedulerService/*`: the caller must be a client ([`ClientAuth::caller`]),
//!   unless the controller is open (no token file, no TLS: the local one-command run).
//! - `gpuwarden.v1.AgentService/*`: over TLS the peer must present a certificate naming one
//!   node ([`Peer::of`]); which node it may speak for is checked by the handler, which reads the
//!   claim from the message. Over plain text an agent is taken only while clients are too (the
//!   controller is open) or with `--insecure` ([`Peer::admitted`]).
//! - Health and reflection stay open (load balancers and `grpcurl` probe them); their messages
//!   are held to a few KiB instead (see `crate::server`'s gRPC server).
//!
//! The handlers check again (cheaply) and use what they find; a refusal here is logged and
//! counted once, by the same code, so nothing is counted twice.

use std::sync::Arc;

use tonic::body::Body;

use super::{clients::ClientAuth, identity::Peer};
use crate::screen::{Screen, Screened};

/// The path prefix of the scheduler service's methods.
const SCHEDULER: &str = "/gpuwarden.v1.SchedulerService/";
/// The path prefix of the agent service's methods.
const AGENT: &str = "/gpuwarden.v1.AgentService/";

/// The layer: authenticate, then pass on.
#[derive(Clone)]
pub struct AuthGate {
    clients: Arc<ClientAuth>,
}

impl AuthGate {
    /// Clients authenticated as `clients` says; agents by their certificate over TLS.
    #[must_use]
    pub fn new(clients: Arc<ClientAuth>) -> Self {
        Self { clients }
    }
}

impl<S> tower::Layer<S> for AuthGate {
    type Service = Authenticated<S>;

    fn layer(&self, inner: S) -> Authenticated<S> {
        Screened::new(inner, self.clone())
    }
}

/// A service behind the authentication gate.
pub type Authenticated<S> = Screened<S, AuthGate>;

impl Screen for AuthGate {
    /// The refusal for `request`, if its caller can't be authenticated for its path.
    fn refusal(&self, request: &http::Request<Body>) -> Option<tonic::Status> {
        let path = request.uri().path();
        // Scheduler calls need a client unless the controller is open; agent calls a node.
        let scheduler = path.starts_with(SCHEDULER) && !self.clients.is_open();
        let agent = path.starts_with(AGENT);
        if !scheduler && !agent {
            return None;
        }
        // Headers and connection info only: the body stays unread.
        let mut probe = http::Request::new(());
        *probe.headers_mut() = request.headers().clone();
        *probe.extensions_mut() = request.extensions().clone();
        let probe = tonic::Request::from_http(probe);
        if scheduler {
            self.clients.caller(&probe).err()
        } else {
            Peer::admitted(
                &probe,
                self.clients.admits_plain_text_agents(),
                self.clients.denials(),
            )
            .err()
        }
    }
}
