//! Leader or standby: what a controller sharing an etcd store with others may do now
//! (docs/architecture.md, "One machine embeds, many use etcd").
//!
//! Only the leader schedules and talks to agents; a standby answers with [`Role::refusal`],
//! naming the leader where it knows it (the gRPC side turns calls away with it in
//! [`crate::api::StandbyGate`]).

use gpuwarden_runtime::sync::Lock as _;
use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, AtomicU64, Ordering},
};

use gpuwarden_proto::{details::Details, follow::LEADER_METADATA};
use tonic::{
    Code, Status,
    metadata::{MetadataMap, MetadataValue},
};

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
        self.0.leader.locked().clone()
    }

    /// Times this controller took office.
    #[must_use]
    pub fn terms(&self) -> u64 {
        self.0.terms.load(Ordering::SeqCst)
    }

    pub(crate) fn take_office(&self) {
        *self.0.leader.locked() = None;
        self.0.terms.fetch_add(1, Ordering::SeqCst);
        self.0.leading.store(true, Ordering::SeqCst);
    }

    pub(crate) fn stand_by(&self, leader: Option<String>) {
        self.0.leading.store(false, Ordering::SeqCst);
        *self.0.leader.locked() = leader;
    }

    /// What a standby answers: `UNAVAILABLE`, naming the leader where it is known (in a
    /// [`gpuwarden_proto::v1::NotLeader`] detail and in the `gpuwarden-leader` metadata).
    #[must_use]
    pub fn refusal(&self) -> Status {
        self.refusal_after(None)
    }

    /// [`Role::refusal`], its message followed by `then` (what ended, for a watch).
    #[must_use]
    pub fn refusal_after(&self, then: Option<&str>) -> Status {
        let leader = self.known_leader();
        let mut message = match &leader {
            Some(addr) => format!("this controller is a standby; the leader is at {addr}"),
            None => "this controller is a standby and no leader is known yet; retry".to_owned(),
        };
        if let Some(then) = then {
            message = format!("{message}; {then}");
        }
        // The typed detail for clients that read details; the metadata for those that don't.
        let mut metadata = MetadataMap::new();
        if let Some(value) = leader
            .as_deref()
            .and_then(|a| MetadataValue::try_from(a).ok())
        {
            metadata.insert(LEADER_METADATA, value);
        }
        let leader = leader.unwrap_or_default();
        Details::new("NOT_LEADER")
            .meta("leader", leader.as_str())
            .leader(leader)
            .status_with(Code::Unavailable, message, metadata)
    }
}
