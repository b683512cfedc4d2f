//! The gate that turns a standby's gRPC calls away with the leader's address
//! (docs/architecture.md, "One machine embeds, many use etcd").
//!
//! Only the leader schedules and talks to agents. A standby answers every `SchedulerService` and
//! `AgentService` call with `UNAVAILABLE` and, in the `gpuwarden-leader` metadata, the address the
//! leader campaigned with (when one is known), so that agents and the CLI can follow; health
//! checking and reflection stay served.

use tonic::{Status, body::Body};

pub use gpuwarden_proto::follow::LEADER_METADATA;

// The role itself is the core's; named here too, where it was defined before.
pub use crate::hub::Role;
use crate::screen::{Screen, Screened};

/// The gRPC path prefix of gpuwarden's own services (health and reflection are not gated).
const GATED: &str = "/gpuwarden.v1.";

/// The gate as a tower layer for the gRPC server.
#[derive(Debug, Clone)]
pub struct StandbyGate(pub Role);

impl<S> tower::Layer<S> for StandbyGate {
    type Service = Gated<S>;

    fn layer(&self, inner: S) -> Gated<S> {
        Screened::new(inner, self.clone())
    }
}

impl Screen for StandbyGate {
    fn refusal(&self, request: &http::Request<Body>) -> Option<Status> {
        (!self.0.is_leader() && request.uri().path().starts_with(GATED)).then(|| self.0.refusal())
    }
}

/// A service behind the standby gate.
pub type Gated<S> = Screened<S, StandbyGate>;
