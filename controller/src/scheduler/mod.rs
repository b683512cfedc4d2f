//! The scheduler: the cluster's nodes and sessions, and the pass that places pending sessions.
//!
//! A pass takes pending sessions in queue order ([`QueuePolicy`]), runs the per-owner
//! predicates (concurrency through the idempotent `ConcurrencyTracker`, total slots), filters
//! nodes that fit, scores them ([`crate::placement`]) and binds: the allocation is reserved at
//! once, so two sessions never get the same share, and an `Allocate` goes to the node's agent.
//! The session runs when the agent acknowledges; a refusal releases the reservation and fails
//! the session with the agent's reason.
//!
//! Everything here is in memory and synchronous; the service layer persists what changed
//! ([`Scheduler::take_changes`]) and talks to agents.
//!
//! The parts: the lifecycle (nodes come and go; sessions are created, acknowledged, refused and
//! ended), the sessions observed but not placed (Kubernetes claims prepared by a node's agent),
//! the queue (FIFO or DRF order, per-owner limits), the pass (filter, score, bind) and gangs
//! (sessions placed all at once or not at all).
//! The `interference-aware` scorer lives with the placement modes ([`crate::placement`]).

mod fit;
mod gang;
mod lifecycle;
pub mod mig_demand;
mod observed;
mod pass;
mod queue;
pub mod quotas;
mod reclaim;
mod reports;
mod requests;
mod retention;
mod team_queues;
mod tracker;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use fit::NodeFit;
pub use observed::{ObserveError, Observed};
pub use requests::{Created, REQUEST_WINDOW_MS};
pub use retention::Retention;
pub use team_queues::{QueueError, QueueSpec, QueueView};
pub(crate) use tracker::ConcurrencyTracker;

use crate::{
    allocator::{Allocation, AllocatorConfig, GpuRequestError},
    node::Node,
    placement::{ExcessCache, Placement, Scorer, ScoringConfig},
    profile::ProfileBook,
    session::{
        Gang, GangError, PreemptionMode, QuotaPolicy, Session, SessionState, Target, TargetError,
        TargetScope, now_ms,
    },
    slots::{RegistryError, ResourceSlot, SlotLimits, SlotTypeRegistry},
    store::RevisionMark,
};

/// Order in which pending sessions are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueuePolicy {
    /// Priority, then arrival; a session that failed `skip_after` passes lets later ones by.
    #[default]
    Fifo,
    /// Dominant-resource fairness: the owner with the smallest dominant share goes first.
    Drf,
}

/// Per-owner limits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OwnerLimits {
    /// Sessions that may hold resources at once.
    pub max_concurrent: Option<usize>,
    /// Total slots its sessions may hold: a limit per slot, `unlimited` for none; a slot left
    /// out is limited to zero (`{ "cuda.shares" = "2", cpu = "unlimited" }`).
    pub max_slots: Option<SlotLimits>,
}

/// Scheduler settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    /// How placements are chosen, unless a session asks for its own mode.
    #[serde(alias = "placement")]
    pub strategy: Placement,
    /// Weights and the packing cap of `interference-aware` placement.
    pub scoring: ScoringConfig,
    /// Queue order.
    pub queue: QueuePolicy,
    /// Under FIFO, passes a head-of-line session may fail before later ones go by it.
    pub skip_after: u32,
    /// Allocator settings for every node.
    pub allocator: AllocatorConfig,
    /// Limits for owners without their own.
    pub default_limits: OwnerLimits,
    /// Limits by owner.
    pub limits: BTreeMap<String, OwnerLimits>,
    /// Team queues: a guarantee and a limit per slot ([`quotas`]); none configured: every
    /// session is served in queue order alone.
    pub quotas: quotas::QuotaConfig,
    /// Milliseconds a preempted workload has between SIGTERM and its kill (30 000).
    pub preemption_grace_ms: u32,
    /// Team queues whose sessions are suspended rather than killed when preempted (issue 38,
    /// docs/suspend.md), unless a session says otherwise. Empty: every queue kills.
    pub suspend_queues: BTreeSet<String>,
    /// Milliseconds a placed gang may wait for its nodes to acknowledge every member before it
    /// fails whole and its devices are released (300 000; 0: never).
    pub gang_start_timeout_ms: u32,
    /// How long ended sessions are kept.
    pub retention: Retention,
    /// Milliseconds a terminating session waits for its node's agent to confirm the release
    /// before it ends unconfirmed (60 000; docs/api.md, "Terminating"). Its resources stay
    /// booked until then.
    pub release_timeout_ms: u32,
    /// Workload classes whose usage profile every owner shares. Any other class a user's
    /// session names (or a pod's label) is filed under its owner (`alice/train`), so no tenant
    /// teaches the placement of another's work; an admin's sessions file classes as named.
    pub shared_classes: Vec<String>,
}

impl SchedulerConfig {
    /// The profile a session's `class` is filed under: as named for an admin's session, a
    /// shared class or no owner, within its `owner` otherwise.
    #[must_use]
    pub fn filed_class(&self, owner: &str, class: String, admin: bool) -> String {
        if admin || owner.is_empty() || self.shared_classes.contains(&class) {
            class
        } else {
            format!("{owner}/{class}")
        }
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            strategy: Placement::Binpack,
            scoring: ScoringConfig::default(),
            queue: QueuePolicy::Fifo,
            skip_after: 3,
            allocator: AllocatorConfig::default(),
            default_limits: OwnerLimits::default(),
            limits: BTreeMap::new(),
            quotas: quotas::QuotaConfig::default(),
            preemption_grace_ms: 30_000,
            suspend_queues: BTreeSet::new(),
            gang_start_timeout_ms: 300_000,
            retention: Retention::default(),
            release_timeout_ms: 60_000,
            shared_classes: Vec::new(),
        }
    }
}

/// Why a request is refused at creation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// A slot type no agent declared.
    #[error("unknown slot type {slot:?} (known: {known})")]
    UnknownSlot {
        /// The slot.
        slot: String,
        /// Known slot names.
        known: String,
    },
    /// The GPU part is malformed.
    #[error(transparent)]
    Gpu(#[from] GpuRequestError),
    /// Larger than any node.
    #[error("request {requested} is larger than every node (largest: {largest})")]
    Oversized {
        /// The request.
        requested: ResourceSlot,
        /// The largest node's capacity.
        largest: ResourceSlot,
    },
    /// Pinned to a node the controller doesn't know.
    #[error("unknown node {0:?}")]
    UnknownNode(String),
    /// Asks for nothing.
    #[error("the request asks for no resources")]
    Empty,
    /// The target is malformed.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// The gang is malformed, or disagrees with its members.
    #[error(transparent)]
    Gang(#[from] GangError),
}

/// A session to queue: what [`Scheduler::create`] takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewSession {
    /// Unique id.
    pub id: String,
    /// Human name (empty: the id).
    pub name: String,
    /// Owner (user or project).
    pub owner: String,
    /// Higher runs first.
    pub priority: i32,
    /// What it asks for.
    pub requested: ResourceSlot,
    /// The node it must run on, if any.
    pub pinned_node: Option<String>,
    /// The workload its quota binds to.
    pub target: Target,
    /// How its quota is enforced.
    pub policy: QuotaPolicy,
    /// What its target was authorized under ([`crate::auth::grants`]).
    pub scope: TargetScope,
    /// Workload class for its profile (empty: its name).
    pub class: String,
    /// Placement mode (`None`: the controller's).
    pub placement: Option<Placement>,
    /// Never preempted; admitted only within its queue's guarantee.
    pub no_preempt: bool,
    /// How it yields when preempted (`None`: its queue's mode, else kill).
    pub preemption: Option<PreemptionMode>,
    /// The gang it belongs to: placed with its other members all at once or not at all.
    pub gang: Option<Gang>,
    /// The local uid of the `gpuwarden run` that created it, if it said.
    pub run_uid: Option<u32>,
}

/// A node refused at registration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// Its slot types conflict with the cluster's.
    #[error(transparent)]
    SlotType(#[from] RegistryError),
    /// An empty node id.
    #[error("node id must not be empty")]
    EmptyId,
}

/// A message for an agent, produced by the scheduler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Hold `allocation` for `session`.
    Allocate {
        /// Node.
        node: String,
        /// Session.
        session: String,
        /// Requested slots.
        slots: ResourceSlot,
        /// GPU parts.
        allocation: Allocation,
        /// The workload the quota binds to.
        target: Target,
        /// How the quota is enforced.
        policy: QuotaPolicy,
        /// What the target was authorized under.
        scope: TargetScope,
        /// The uid of the `gpuwarden run` that created it, if it said.
        run_uid: Option<u32>,
    },
    /// Release what `session` holds.
    Release {
        /// Node.
        node: String,
        /// Session.
        session: String,
    },
    /// End `session`'s workload (SIGTERM, killed after `grace_ms`) and release it; the agent
    /// reports `preempted` when it is done. In mode `suspend` the agent suspends it instead and
    /// reports `suspended` (or `suspend_refused`, then the kill path).
    Preempt {
        /// Node.
        node: String,
        /// Session.
        session: String,
        /// Between SIGTERM and the kill.
        grace_ms: u32,
        /// Whom it yields to and why.
        reason: String,
        /// Kill or suspend.
        mode: PreemptionMode,
    },
    /// Resume suspended `session` on its node; the agent reports `resumed` (or, asked for
    /// other GPUs its driver cannot restore onto, `resume_refused`).
    Resume {
        /// Node.
        node: String,
        /// Session.
        session: String,
        /// Where it resumes when not on the GPUs it left: other GPUs of the same model, each
        /// part in place of the home part at its position. `None`: the GPUs it left.
        onto: Option<Allocation>,
    },
    /// Make a MIG instance of `profile` at memory slice `start` of GPU `gpu_uuid` for waiting
    /// `session` (issue 37 §3, [`mig_demand`]); the agent registers again once it is made.
    MakeMigInstance {
        /// Node.
        node: String,
        /// Session.
        session: String,
        /// The GPU.
        gpu_uuid: String,
        /// The profile (`1g.18gb`).
        profile: String,
        /// The first memory slice.
        start: u32,
    },
}

/// Ids of records changed since the last [`Scheduler::take_changes`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Sessions.
    pub sessions: BTreeSet<String>,
    /// Nodes.
    pub nodes: BTreeSet<String>,
    /// The slot-type registry changed.
    pub slot_types: bool,
    /// Workload classes whose profile changed.
    pub profiles: BTreeSet<String>,
    /// Sessions whose usage series grew: written, but neither announced to watchers nor
    /// flushed at once (the store's own flush follows within half a second).
    pub usage: BTreeSet<String>,
    /// The team queues changed (an admin set or removed one).
    pub quotas: bool,
}

/// The cluster state and the scheduling pass.
#[derive(Debug, Default)]
pub struct Scheduler {
    config: SchedulerConfig,
    registry: SlotTypeRegistry,
    nodes: BTreeMap<String, Node>,
    sessions: BTreeMap<String, Session>,
    tracker: ConcurrencyTracker,
    profiles: ProfileBook,
    /// Each device's predicted interference among its tenants as they are, reused until its
    /// tenants or their profiles change: scoring a candidate then costs one prediction.
    excess: ExcessCache,
    next_seq: u64,
    changes: Changes,
    /// Nodes ordered by free GPU shares, so a decision visits only nodes that could fit.
    by_free: BTreeSet<(u128, String)>,
    /// Each node's key in `by_free`.
    free_key: BTreeMap<String, u128>,
    /// By MIG profile slot, the nodes holding an idle instance of it, keyed as in `by_free`:
    /// a profile request visits only those (a pass where instances are made on demand fails
    /// many such requests, and each would otherwise walk every node).
    with_idle: BTreeMap<String, BTreeSet<(u128, String)>>,
    /// Sessions that were pending, in FIFO order (higher priority, then arrival), so that a pass
    /// visits the queue rather than every session. Entries that left Pending are dropped when
    /// a pass next looks; only creation (and a restore) makes a session Pending.
    pending: BTreeSet<(std::cmp::Reverse<i32>, u64, String)>,
    /// Sessions not yet ended, by owner and in all, kept as they start and end, so that the
    /// caps on them cost nothing per create.
    live: Live,
    /// The session revisions' mark as restored (the controller numbers changes).
    revisions: RevisionMark,
    /// Each gang's members by owner and name, ended ones included until they are forgotten.
    gangs: BTreeMap<gang::GangKey, BTreeSet<String>>,
    /// Sessions by (owner, request id), for creates retried (`requests`).
    requests: std::collections::HashMap<(String, String), String>,
    /// MIG instances asked of agents for waiting sessions (issue 37 §3).
    mig: mig_demand::MigDemand,
}

/// Counts of sessions not yet ended.
#[derive(Debug, Clone, Default)]
struct Live {
    by_owner: BTreeMap<String, usize>,
    total: usize,
}

impl Live {
    fn started(&mut self, owner: &str) {
        *self.by_owner.entry(owner.to_owned()).or_default() += 1;
        self.total += 1;
    }

    fn ended(&mut self, owner: &str) {
        if let Some(n) = self.by_owner.get_mut(owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.by_owner.remove(owner);
            }
        }
        self.total = self.total.saturating_sub(1);
    }
}

impl Scheduler {
    /// An empty cluster.
    #[must_use]
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// Sessions of `owner` not yet ended, and sessions not yet ended in all.
    #[must_use]
    pub fn live_sessions(&self, owner: &str) -> (usize, usize) {
        (
            self.live.by_owner.get(owner).copied().unwrap_or(0),
            self.live.total,
        )
    }

    /// Settings.
    #[must_use]
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The merged slot types.
    #[must_use]
    pub fn registry(&self) -> &SlotTypeRegistry {
        &self.registry
    }

    /// Nodes by id.
    #[must_use]
    pub fn nodes(&self) -> &BTreeMap<String, Node> {
        &self.nodes
    }

    /// Sessions by id.
    #[must_use]
    pub fn sessions(&self) -> &BTreeMap<String, Session> {
        &self.sessions
    }

    /// The learned workload profiles.
    #[must_use]
    pub fn profiles(&self) -> &ProfileBook {
        &self.profiles
    }

    /// The session revisions' mark the state was restored with.
    #[must_use]
    pub fn revision_mark(&self) -> RevisionMark {
        self.revisions
    }

    /// Stamps session `id` with the revision of its latest change (the controller numbers
    /// changes as it stores them).
    pub(crate) fn stamp_revision(&mut self, id: &str, revision: u64) {
        if let Some(s) = self.sessions.get_mut(id) {
            s.revision = revision;
        }
    }

    /// What changed since the last call.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    /// A scorer of `class`'s placements against the cluster as it is, reusing the cached
    /// interference predictions (hand them back with [`Scorer::into_cache`]).
    fn scorer(&self, class: &str, excess: ExcessCache) -> Scorer<'_> {
        Scorer::new(
            &self.config.scoring,
            &self.profiles,
            &self.sessions,
            &self.nodes,
            class,
            excess,
        )
    }
}

impl Scheduler {
    /// Re-files `node` in the free-capacity index after its allocations changed.
    fn reindex(&mut self, node: &str) {
        if let Some(old) = self.free_key.remove(node) {
            let entry = (old, node.to_owned());
            self.by_free.remove(&entry);
            // A handful of profiles at most: each is looked in rather than kept per node.
            self.with_idle.retain(|_, nodes| {
                nodes.remove(&entry);
                !nodes.is_empty()
            });
        }
        if let Some(n) = self.nodes.get(node) {
            let key = n.allocator.free().total.micros();
            self.by_free.insert((key, node.to_owned()));
            self.free_key.insert(node.to_owned(), key);
            for slot in n
                .allocator
                .devices()
                .iter()
                .filter(|d| d.is_idle())
                .filter_map(|d| d.profile.as_ref())
            {
                self.with_idle
                    .entry(slot.clone())
                    .or_default()
                    .insert((key, node.to_owned()));
            }
        }
    }
}

fn set_state(s: &mut Session, state: SessionState, reason: &str) {
    s.state = state;
    reason.clone_into(&mut s.reason);
    s.updated_at_ms = now_ms();
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod placement_tests;

#[cfg(test)]
mod observed_tests;

#[cfg(test)]
mod reclaim_tests;

#[cfg(test)]
mod gang_tests;
