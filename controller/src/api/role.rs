//! Leader or standby: what a controller sharing an etcd store with others may do now, and the gate
//! that turns a standby's gRPC calls away with the leader's address (docs/architecture.md, "One
//! machine embeds, many use etcd").
//!
//! Only the leader schedules and talks to agents. A standby answers every `SchedulerService` and
//! `AgentService` call with `UNAVAILABLE` and, in the `gpuwarden-leader` metadata, the address the
//! leader campaigned with (when one is known), so that agents and the CLI can follow; health
//! checking and reflection stay served.

use std::{
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll},
};

use tonic::{Status, body::Body, metadata::MetadataValue};

pub use gpuwarden_proto::follow::LEADER_METADATA;

/// The gRPC path prefix of gpuwarden's own services (health and reflection are not gated).
const GATED: &str = "/gpuwarden.v1.";

/// This controller's role, shared by the services, the background loop and the election.
#[derive(Debug, Clone, Default)]
pub struct Role(Arc<State>);

#[derive(Debug, Default)]
struct State {
    leading: AtomicBool,
    /// Where the leader is, when this one is a standby and knows.
    leader: Mutex<Option<String>>,
    /// Times this controller took office.
    terms: AtomicU64,
}

impl Role {
    /// A controller that leads from the start (one store, no election).
    #[must_use]
    pub fn leader() -> Self {
        let role = Self::default();
        role.0.leading.store(true, Ordering::SeqCst);
        role.0.terms.store(1, Ordering::SeqCst);
        role
    }

    /// A standby until it wins an election.
    #[must_use]
    pub fn standby() -> Self {
        Self::default()
    }

    /// Whether this controller leads now.
    #[must_use]
    pub fn is_leader(&self) -> bool {
        self.0.leading.load(Ordering::SeqCst)
    }

    /// The leader's address, as a standby last heard it.
    #[must_use]
    pub fn known_leader(&self) -> Option<String> {
        self.0
            .leader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Times this controller took office.
    #[must_use]
    pub fn terms(&self) -> u64 {
        self.0.terms.load(Ordering::SeqCst)
    }

    pub(crate) fn take_office(&self) {
        *self.0.leader.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.0.terms.fetch_add(1, Ordering::SeqCst);
        self.0.leading.store(true, Ordering::SeqCst);
    }

    pub(crate) fn stand_by(&self, leader: Option<String>) {
        self.0.leading.store(false, Ordering::SeqCst);
        *self.0.leader.lock().unwrap_or_else(PoisonError::into_inner) = leader;
    }

    /// What a standby answers: `UNAVAILABLE`, naming the leader where it is known.
    #[must_use]
    pub fn refusal(&self) -> Status {
        let leader = self.known_leader();
        let message = match &leader {
            Some(addr) => format!("this controller is a standby; the leader is at {addr}"),
            None => "this controller is a standby and no leader is known yet; retry".to_owned(),
        };
        let mut status = Status::unavailable(message);
        if let Some(value) = leader.and_then(|a| MetadataValue::try_from(a).ok()) {
            status.metadata_mut().insert(LEADER_METADATA, value);
        }
        status
    }
}

/// The gate as a tower layer for the gRPC server.
#[derive(Debug, Clone)]
pub struct StandbyGate(pub Role);

impl<S> tower::Layer<S> for StandbyGate {
    type Service = Gated<S>;

    fn layer(&self, inner: S) -> Gated<S> {
        Gated {
            inner,
            role: self.0.clone(),
        }
    }
}

/// A service behind the standby gate.
#[derive(Debug, Clone)]
pub struct Gated<S> {
    inner: S,
    role: Role,
}

type BoxFuture<T, E> = Pin<Box<dyn std::future::Future<Output = Result<T, E>> + Send>>;

impl<S> tower::Service<http::Request<Body>> for Gated<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Send,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if !self.role.is_leader() && request.uri().path().starts_with(GATED) {
            let refusal = self.role.refusal().into_http();
            return Box::pin(async move { Ok(refusal) });
        }
        Box::pin(self.inner.call(request))
    }
}
