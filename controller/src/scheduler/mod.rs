//! The scheduler: the cluster's nodes and sessions, and the pass that places pending sessions.
//!
//! A pass takes pending sessions in queue order ([`QueuePolicy`]), runs the per-owner
//! predicates (concurrency through the idempotent [`ConcurrencyTracker`], total slots), filters
//! nodes that fit, scores them ([`Strategy`]) and binds: the allocation is reserved at once, so
//! two sessions never get the same share, and an `Allocate` goes to the node's agent. The
//! session runs when the agent acknowledges; a refusal releases the reservation and fails the
//! session with the agent's reason.
//!
//! Everything here is in memory and synchronous; the service layer persists what changed
//! ([`Scheduler::take_changes`]) and talks to agents.

pub mod tracker;

use std::{
    cell::RefCell,
    collections::{BTreeMap, BTreeSet, HashMap},
};

use serde::{Deserialize, Serialize};

pub use tracker::ConcurrencyTracker;

use crate::{
    allocator::{
        Allocation, AllocatorConfig, DeviceState, GpuRequest, GpuRequestError, NodeAllocator,
        Strategy,
    },
    colocation,
    node::{Node, NodeReport, NodeState},
    placement::{Candidate, EXPLAINED, Explanation, Placement, ScoringConfig, Terms, Weights},
    profile::{POINTS, ProfileBook, UsageSample},
    session::{EnforcementEvent, QuotaPolicy, Session, SessionState, Target, TargetError, now_ms},
    slots::{RegistryError, ResourceSlot, SlotTypeRegistry, SlotValue, names},
    store::Snapshot,
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
    /// Total slots its sessions may hold.
    pub max_slots: Option<ResourceSlot>,
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
    /// Workload class for its profile (empty: its name).
    pub class: String,
    /// Placement mode (`None`: the controller's).
    pub placement: Option<Placement>,
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
    },
    /// Release what `session` holds.
    Release {
        /// Node.
        node: String,
        /// Session.
        session: String,
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

    /// Rebuilds from stored records (after a controller restart). Nodes start Lost until their
    /// agents come back; the agents' reports then win.
    #[must_use]
    pub fn restore(config: SchedulerConfig, stored: Snapshot) -> Self {
        let Snapshot {
            registry,
            nodes,
            sessions,
            profiles,
        } = stored;
        let mut s = Self::new(config);
        s.registry = registry;
        s.profiles = ProfileBook::new(profiles);
        for mut node in nodes {
            node.state = NodeState::Lost;
            node.refresh();
            let id = node.report.node_id.clone();
            s.nodes.insert(id.clone(), node);
            s.reindex(&id);
        }
        for session in sessions {
            s.next_seq = s.next_seq.max(session.seq + 1);
            if session.state.holds_resources() {
                s.tracker.add(&session.owner, &session.id);
            }
            s.sessions.insert(session.id.clone(), session);
        }
        s
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

    /// Records what a running session used, as its node measured it. Samples from a node the
    /// session isn't on, or for a session not running, are ignored (a late report after a
    /// release). The series is written without waking watchers or forcing a flush
    /// ([`Changes::usage`]), so a report costs one buffered write.
    pub fn record_usage(&mut self, node: &str, session: &str, sample: UsageSample) -> bool {
        let Some(s) = self.sessions.get_mut(session) else {
            return false;
        };
        if s.state != SessionState::Running || s.node.as_deref() != Some(node) {
            return false;
        }
        s.usage.record(sample);
        self.changes.usage.insert(session.to_owned());
        true
    }

    /// What changed since the last call.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    /// Registers (or re-registers) a node. `running` lists the sessions its agent holds: that
    /// report wins over the controller's memory. Returns the commands to send it.
    ///
    /// # Errors
    /// The node's slot types conflict with the cluster's.
    pub fn register(
        &mut self,
        report: NodeReport,
        running: &[String],
    ) -> Result<Vec<Command>, RegisterError> {
        if report.node_id.is_empty() {
            return Err(RegisterError::EmptyId);
        }
        if !self
            .registry
            .merge(&report.node_id, &report.slot_types)?
            .is_empty()
        {
            self.changes.slot_types = true;
        }
        let id = report.node_id.clone();
        let mut allocator = NodeAllocator::new(report.devices.clone(), self.config.allocator);
        let mut held = Vec::new();
        let running: BTreeSet<&str> = running.iter().map(String::as_str).collect();
        let mut commands = Vec::new();
        // Sessions the controller placed here: keep those the agent holds, or that await its ack.
        let placed: Vec<String> = self
            .sessions
            .values()
            .filter(|s| s.node.as_deref() == Some(&id) && s.state.holds_resources())
            .map(|s| s.id.clone())
            .collect();
        for sid in placed {
            let Some(session) = self.sessions.get_mut(&sid) else {
                continue;
            };
            if running.contains(sid.as_str()) || session.state == SessionState::Scheduled {
                allocator.restore(&sid, session.allocation.clone());
                held.push(session.requested.clone());
                if session.state == SessionState::Lost {
                    set_state(session, SessionState::Running, "");
                }
                if session.state == SessionState::Scheduled {
                    // The agent may never have seen it: send it again.
                    commands.push(Command::Allocate {
                        node: id.clone(),
                        session: sid.clone(),
                        slots: session.requested.clone(),
                        allocation: session.allocation.clone(),
                        target: session.target.clone(),
                        policy: session.policy,
                    });
                }
            } else {
                set_state(
                    session,
                    SessionState::Failed,
                    "its node restarted without it",
                );
                self.tracker.remove(&session.owner, &sid);
            }
            self.changes.sessions.insert(sid);
        }
        // Sessions the agent holds that the controller ended: tell it to let go.
        for sid in &running {
            let known = self
                .sessions
                .get(*sid)
                .is_some_and(|s| s.node.as_deref() == Some(&id) && s.state.holds_resources());
            if !known {
                commands.push(Command::Release {
                    node: id.clone(),
                    session: (*sid).to_owned(),
                });
            }
        }
        let mut node = Node::new(report, allocator, ResourceSlot::new(), now_ms());
        for requested in &held {
            node.reserve(requested);
        }
        self.nodes.insert(id.clone(), node);
        self.reindex(&id);
        self.changes.nodes.insert(id);
        Ok(commands)
    }

    /// Records a heartbeat; a Lost node comes back.
    pub fn heartbeat(&mut self, node: &str) {
        if let Some(n) = self.nodes.get_mut(node) {
            n.last_heartbeat_ms = now_ms();
            if n.state == NodeState::Lost {
                n.state = NodeState::Ready;
                self.changes.nodes.insert(node.to_owned());
                for s in self
                    .sessions
                    .values_mut()
                    .filter(|s| s.node.as_deref() == Some(node) && s.state == SessionState::Lost)
                {
                    set_state(s, SessionState::Running, "");
                    self.changes.sessions.insert(s.id.clone());
                }
            }
        }
    }

    /// Marks nodes silent for longer than `timeout_ms` Lost, and their sessions with them.
    /// Returns the nodes marked.
    pub fn expire(&mut self, now: i64, timeout_ms: i64) -> Vec<String> {
        let mut lost = Vec::new();
        for (id, n) in &mut self.nodes {
            if n.state == NodeState::Ready && now - n.last_heartbeat_ms > timeout_ms {
                n.state = NodeState::Lost;
                lost.push(id.clone());
                self.changes.nodes.insert(id.clone());
            }
        }
        for s in self.sessions.values_mut() {
            if s.node.as_ref().is_some_and(|n| lost.contains(n)) && s.state.holds_resources() {
                set_state(s, SessionState::Lost, "node stopped sending heartbeats");
                self.changes.sessions.insert(s.id.clone());
            }
        }
        lost
    }

    /// Queues a new session.
    ///
    /// # Errors
    /// The request names unknown slots, is malformed, or is larger than every node.
    pub fn create(&mut self, new: NewSession) -> Result<Session, RequestError> {
        let NewSession {
            id,
            name,
            owner,
            priority,
            requested,
            pinned_node,
            target,
            policy,
            class,
            placement,
        } = new;
        target.validate(pinned_node.as_deref())?;
        if requested.is_zero() {
            return Err(RequestError::Empty);
        }
        for (slot, _) in requested.iter() {
            if self.registry.kind(slot.as_str()).is_none() {
                return Err(RequestError::UnknownSlot {
                    slot: slot.to_string(),
                    known: self.registry.names(),
                });
            }
        }
        let gpu = GpuRequest::from_slots(&requested)?;
        let quantum = self.config.allocator.quantum;
        if !quantum.is_zero() && !gpu.shares.micros().is_multiple_of(quantum.micros()) {
            return Err(GpuRequestError::NotMultipleOfQuantum {
                requested: gpu.shares,
                quantum,
            }
            .into());
        }
        if let Some(node) = &pinned_node
            && !self.nodes.contains_key(node)
        {
            return Err(RequestError::UnknownNode(node.clone()));
        }
        if !self.nodes.is_empty()
            && !self
                .nodes
                .values()
                .any(|n| requested.fits_in(&n.capacity()))
        {
            let largest = self
                .nodes
                .values()
                .map(Node::capacity)
                .max_by_key(|c| c.get(names::CUDA_SHARES))
                .unwrap_or_default();
            return Err(RequestError::Oversized { requested, largest });
        }
        let now = now_ms();
        let name = if name.is_empty() { id.clone() } else { name };
        let session = Session {
            class: if class.is_empty() {
                name.clone()
            } else {
                class
            },
            placement,
            explanation: None,
            usage: crate::profile::UsageSeries::default(),
            name,
            id: id.clone(),
            owner,
            priority,
            requested,
            pinned_node,
            state: SessionState::Pending,
            node: None,
            allocation: Allocation::default(),
            reason: String::new(),
            seq: self.next_seq,
            failed_passes: 0,
            created_at_ms: now,
            updated_at_ms: now,
            target,
            policy,
            events: Vec::new(),
        };
        self.next_seq += 1;
        self.sessions.insert(id.clone(), session.clone());
        self.changes.sessions.insert(id);
        Ok(session)
    }

    /// Ends a session, releasing what it holds. Returns the command for its agent, if any.
    pub fn terminate(&mut self, id: &str) -> Option<Command> {
        let session = self.sessions.get_mut(id)?;
        if session.state.is_final() {
            return None;
        }
        let held = session.state.holds_resources();
        // What it used teaches its class, once it ran long enough to say anything.
        if session.state == SessionState::Running
            && self
                .profiles
                .learn(&session.class, &session.usage, now_ms())
                .is_some()
        {
            self.changes.profiles.insert(session.class.clone());
            self.excess.clear();
        }
        set_state(session, SessionState::Terminated, "terminated by request");
        self.changes.sessions.insert(id.to_owned());
        let owner = session.owner.clone();
        let node = session.node.clone();
        let requested = session.requested.clone();
        self.tracker.remove(&owner, id);
        let node = node.filter(|_| held)?;
        if let Some(n) = self.nodes.get_mut(&node) {
            n.allocator.release(id);
            n.unreserve(&requested);
            self.changes.nodes.insert(node.clone());
            self.reindex(&node);
        }
        Some(Command::Release {
            node,
            session: id.to_owned(),
        })
    }

    /// The agent on `node` holds `session`.
    pub fn ack(&mut self, node: &str, session: &str) {
        if let Some(s) = self.sessions.get_mut(session)
            && s.node.as_deref() == Some(node)
            && s.state == SessionState::Scheduled
        {
            set_state(s, SessionState::Running, "");
            self.changes.sessions.insert(session.to_owned());
        }
    }

    /// An enforcement event the agent on `node` reported for `session`. Returns whether it was
    /// recorded: events for sessions unknown or placed elsewhere are not.
    pub fn record_event(&mut self, node: &str, session: &str, event: EnforcementEvent) -> bool {
        let Some(s) = self.sessions.get_mut(session) else {
            return false;
        };
        if s.node.as_deref() != Some(node) {
            return false;
        }
        s.record_event(event);
        self.changes.sessions.insert(session.to_owned());
        true
    }

    /// The agent on `node` refused `session`: release and fail it with the agent's reason.
    pub fn nack(&mut self, node: &str, session: &str, reason: &str, message: &str) {
        let Some(s) = self.sessions.get_mut(session) else {
            return;
        };
        if s.node.as_deref() != Some(node) || !s.state.holds_resources() {
            return;
        }
        let text = if message.is_empty() {
            reason.to_owned()
        } else {
            format!("{reason}: {message}")
        };
        set_state(s, SessionState::Failed, &text);
        let (owner, requested) = (s.owner.clone(), s.requested.clone());
        self.tracker.remove(&owner, session);
        self.changes.sessions.insert(session.to_owned());
        if let Some(n) = self.nodes.get_mut(node) {
            n.allocator.release(session);
            n.unreserve(&requested);
            self.changes.nodes.insert(node.to_owned());
            self.reindex(node);
        }
    }

    /// One scheduling pass: places as many pending sessions as fit. Returns the commands.
    pub fn pass(&mut self) -> Vec<Command> {
        self.pass_observed(&mut |_, _| {})
    }

    /// [`Self::pass`], reporting how long each session's decision took and whether it was placed
    /// (for benchmarks).
    pub fn pass_observed(
        &mut self,
        observe: &mut dyn FnMut(std::time::Duration, bool),
    ) -> Vec<Command> {
        let order = self.queue_order();
        let mut commands = Vec::new();
        for id in order {
            let started = std::time::Instant::now();
            let Some(session) = self.sessions.get(&id) else {
                continue;
            };
            let owner = session.owner.clone();
            let limits = self
                .config
                .limits
                .get(&owner)
                .unwrap_or(&self.config.default_limits)
                .clone();
            let mut placed = false;
            let mut reason = String::new();
            if !self.tracker.admits(&owner, &id, limits.max_concurrent) {
                reason = format!(
                    "owner {owner} is at its limit of {} concurrent sessions",
                    limits.max_concurrent.unwrap_or(0)
                );
            } else if !self.within_slot_limit(&owner, &session.requested, limits.max_slots.as_ref())
            {
                reason = format!("owner {owner} would exceed its slot limit");
            } else {
                match self.place(&id) {
                    Ok(command) => {
                        commands.push(command);
                        placed = true;
                    }
                    Err(why) => reason = why,
                }
            }
            observe(started.elapsed(), placed);
            if !placed {
                let skip_after = self.config.skip_after;
                let fifo = self.config.queue == QueuePolicy::Fifo;
                if let Some(s) = self.sessions.get_mut(&id) {
                    s.failed_passes += 1;
                    if s.reason != reason {
                        s.reason = reason;
                        self.changes.sessions.insert(id.clone());
                    }
                    // FIFO: the head blocks later sessions until it has failed `skip_after` passes.
                    if fifo && s.failed_passes <= skip_after {
                        break;
                    }
                }
            }
        }
        commands
    }

    /// Pending sessions in the order the policy tries them.
    fn queue_order(&self) -> Vec<String> {
        let mut pending: Vec<&Session> = self
            .sessions
            .values()
            .filter(|s| s.state == SessionState::Pending)
            .collect();
        pending.sort_by_key(|s| (std::cmp::Reverse(s.priority), s.seq));
        if self.config.queue == QueuePolicy::Drf {
            let shares = self.dominant_shares();
            pending.sort_by(|a, b| {
                let sa = shares.get(&a.owner).copied().unwrap_or(0.0);
                let sb = shares.get(&b.owner).copied().unwrap_or(0.0);
                b.priority
                    .cmp(&a.priority)
                    .then(sa.total_cmp(&sb))
                    .then(a.seq.cmp(&b.seq))
            });
        }
        pending.into_iter().map(|s| s.id.clone()).collect()
    }

    /// Each owner's dominant share: the largest fraction of any slot's cluster capacity it holds.
    fn dominant_shares(&self) -> BTreeMap<String, f64> {
        let total = self
            .nodes
            .values()
            .filter(|n| n.state == NodeState::Ready)
            .fold(ResourceSlot::new(), |acc, n| {
                acc.checked_add(&n.capacity()).unwrap_or(acc)
            });
        let mut held: BTreeMap<String, ResourceSlot> = BTreeMap::new();
        for s in self.sessions.values().filter(|s| s.state.holds_resources()) {
            let entry = held.entry(s.owner.clone()).or_default();
            *entry = entry
                .checked_add(&s.requested)
                .unwrap_or_else(|| entry.clone());
        }
        held.into_iter()
            .map(|(owner, slots)| {
                // Ratios only order owners; a float is fine here, the slots stay exact.
                let share = slots
                    .iter()
                    .map(|(k, v)| {
                        let cap = total.get(k.as_str());
                        if cap.is_zero() {
                            0.0
                        } else {
                            v.micros() as f64 / cap.micros() as f64
                        }
                    })
                    .fold(0.0, f64::max);
                (owner, share)
            })
            .collect()
    }

    fn within_slot_limit(
        &self,
        owner: &str,
        requested: &ResourceSlot,
        max: Option<&ResourceSlot>,
    ) -> bool {
        let Some(max) = max else { return true };
        let held = self
            .sessions
            .values()
            .filter(|s| s.owner == owner && s.state.holds_resources())
            .fold(ResourceSlot::new(), |acc, s| {
                acc.checked_add(&s.requested).unwrap_or(acc)
            });
        held.checked_add(requested)
            .is_some_and(|total| total.fits_in(max))
    }

    /// Filter, score and bind one session.
    fn place(&mut self, id: &str) -> Result<Command, String> {
        let session = self.sessions.get(id).ok_or("gone")?;
        let gpu = GpuRequest::from_slots(&session.requested).map_err(|e| e.to_string())?;
        let wants_gpu = !gpu.is_empty();
        // Computed once: most requests have no non-GPU part worth a per-node check.
        let non_gpu = Node::non_gpu(&session.requested);
        let mode = session.placement.unwrap_or(self.config.strategy);
        // Only nodes with at least this much free can hold the request.
        let lower = if gpu.devices > 0 {
            self.config.allocator.quantum.micros() * u128::from(gpu.devices)
        } else {
            gpu.shares.micros()
        };
        let fits = |nid: &String| {
            self.nodes.get(nid).is_some_and(|n| {
                n.state == NodeState::Ready
                    && session.pinned_node.as_ref().is_none_or(|p| p == nid)
                    && (non_gpu.is_zero() || n.non_gpu_fits(&non_gpu))
                    && n.allocator.can_fit(&gpu)
            })
        };
        // Keep GPU nodes for GPU work: a request without GPUs tries nodes without them first.
        let plain =
            |nid: &String| wants_gpu || self.nodes.get(nid).is_some_and(|n| !n.has_accelerators());
        let range = self
            .by_free
            .range((lower, String::new())..)
            .map(|(_, id)| id);
        let (node_id, planned, explanation) = if mode == Placement::InterferenceAware && wants_gpu {
            let cache = std::mem::take(&mut self.excess);
            let scorer = Scorer::new(self, &session.class, cache);
            let half = self.config.scoring.max_nodes.div_ceil(2);
            let fullest: Vec<&String> = range.clone().filter(|id| fits(id)).take(half).collect();
            // The emptiest that fit, unless the fullest already are all of them.
            let emptiest = range
                .rev()
                .filter(|id| fits(id))
                .take_while(|id| !fullest.contains(id))
                .take(half);
            let nodes: Vec<&String> = fullest.iter().copied().chain(emptiest).collect();
            let chosen = scorer.choose(nodes.into_iter(), &gpu);
            self.excess = scorer.into_cache();
            chosen.ok_or_else(|| format!("no node fits {}", session.requested))?
        } else {
            let strategy = if mode == Placement::Spread {
                Strategy::Spread
            } else {
                Strategy::Binpack
            };
            // Binpack: the fullest node that fits (ascending free); spread: the emptiest.
            let best = if strategy == Strategy::Binpack {
                range
                    .clone()
                    .find(|id| plain(id) && fits(id))
                    .or_else(|| range.clone().find(|id| fits(id)))
            } else {
                range
                    .clone()
                    .rev()
                    .find(|id| plain(id) && fits(id))
                    .or_else(|| range.clone().rev().find(|id| fits(id)))
            }
            .cloned()
            .ok_or_else(|| format!("no node fits {}", session.requested))?;
            let node = self.nodes.get(&best).ok_or("node vanished")?;
            let planned = node
                .allocator
                .plan(&gpu, strategy)
                .map_err(|e| e.to_string())?;
            let cache = std::mem::take(&mut self.excess);
            let scorer = Scorer::new(self, &session.class, cache);
            let explanation = scorer.explain_one(mode, &best, node, &planned);
            self.excess = scorer.into_cache();
            (best, planned, explanation)
        };
        let requested = session.requested.clone();
        let owner = session.owner.clone();
        let (target, policy) = (session.target.clone(), session.policy);
        let node = self.nodes.get_mut(&node_id).ok_or("node vanished")?;
        let allocation = node
            .allocator
            .allocate_planned(id, planned)
            .map_err(|e| e.to_string())?;
        node.reserve(&requested);
        self.tracker.add(&owner, id);
        self.changes.nodes.insert(node_id.clone());
        self.reindex(&node_id);
        if let Some(s) = self.sessions.get_mut(id) {
            s.node = Some(node_id.clone());
            s.allocation = allocation.clone();
            s.explanation = Some(explanation);
            set_state(s, SessionState::Scheduled, "");
            self.changes.sessions.insert(id.to_owned());
        }
        Ok(Command::Allocate {
            node: node_id,
            session: id.to_owned(),
            slots: requested,
            allocation,
            target,
            policy,
        })
    }
}

/// Predicted `Σ(slowdown − 1)` of a device's tenants, by (node, device index), with the
/// tenants it was predicted for.
type ExcessCache = HashMap<(String, u32), (BTreeSet<String>, f64)>;

/// Scores candidate placements of one session against the cluster as it is.
struct Scorer<'a> {
    scheduler: &'a Scheduler,
    /// The session's utilization distribution (its class's profile, or the prior).
    candidate: [f64; POINTS],
    excess: RefCell<ExcessCache>,
}

impl<'a> Scorer<'a> {
    fn new(scheduler: &'a Scheduler, class: &str, excess: ExcessCache) -> Self {
        Self {
            scheduler,
            candidate: scheduler.profiles.deciles(class),
            excess: RefCell::new(excess),
        }
    }

    fn into_cache(self) -> ExcessCache {
        self.excess.into_inner()
    }

    /// The interference among `device`'s tenants as they are (`tenants`: their profiles).
    fn excess_now(&self, node_id: &str, device: &DeviceState, tenants: &[[f64; POINTS]]) -> f64 {
        let key = (node_id.to_owned(), device.spec.index);
        if let Some((who, excess)) = self.excess.borrow().get(&key)
            && *who == device.sessions
        {
            return *excess;
        }
        let refs: Vec<&[f64; POINTS]> = tenants.iter().collect();
        let excess = colocation::predict(&refs).total_excess();
        self.excess
            .borrow_mut()
            .insert(key, (device.sessions.clone(), excess));
        excess
    }

    fn weights(&self) -> &Weights {
        &self.scheduler.config.scoring.weights
    }

    /// The utilization distributions of a device's tenants.
    fn tenants(&self, device: &DeviceState) -> Vec<[f64; POINTS]> {
        device
            .sessions
            .iter()
            .map(|sid| {
                let class = self
                    .scheduler
                    .sessions
                    .get(sid)
                    .map_or(sid.as_str(), |s| s.class.as_str());
                self.scheduler.profiles.deciles(class)
            })
            .collect()
    }

    /// Scores `allocation` on `node`.
    fn score(&self, node_id: &str, node: &Node, allocation: &Allocation) -> Candidate {
        let cap = self.scheduler.config.scoring.packing_cap;
        let mut terms = Terms::default();
        let mut summed = 0.0;
        let mut over_cap = false;
        let mut numa = BTreeSet::new();
        let devices = node.allocator.devices();
        for part in &allocation.parts {
            let Some(device) = devices.iter().find(|d| d.spec.index == part.index) else {
                continue;
            };
            if device.spec.numa_node >= 0 {
                numa.insert(device.spec.numa_node);
            }
            let tenants = self.tenants(device);
            let before = self.excess_now(node_id, device, &tenants);
            let mut with: Vec<&[f64; POINTS]> = tenants.iter().collect();
            with.push(&self.candidate);
            let after = colocation::predict(&with);
            terms.interference += after.total_excess() - before;
            let unusable = |allocated_after: bool, free: SlotValue| {
                if allocated_after && !part.exclusive {
                    free.as_f64()
                } else {
                    0.0
                }
            };
            let free = device.free();
            let before_frag = unusable(!device.allocated.is_zero(), free);
            let after_frag = unusable(
                !device.allocated.saturating_add(part.shares).is_zero(),
                free.saturating_sub(part.shares),
            );
            terms.fragmentation += after_frag - before_frag;
            terms.packing += after.summed.min(1.0);
            summed += after.summed;
            over_cap |= !tenants.is_empty() && after.summed > cap;
        }
        let parts = allocation.parts.len().max(1) as f64;
        terms.packing /= parts;
        terms.topology = numa.len().saturating_sub(1) as f64;
        Candidate {
            node: node_id.to_owned(),
            devices: allocation.parts.iter().map(|p| p.index).collect(),
            total: terms.total(self.weights()),
            terms,
            predicted_utilization: summed / parts,
            over_cap,
            chosen: false,
        }
    }

    /// The explanation of a placement another mode chose.
    fn explain_one(
        &self,
        mode: Placement,
        node_id: &str,
        node: &Node,
        allocation: &Allocation,
    ) -> Explanation {
        let mut candidate = self.score(node_id, node, allocation);
        candidate.chosen = true;
        Explanation {
            mode,
            weights: *self.weights(),
            candidates: vec![candidate],
            considered: 1,
        }
    }

    /// The best placement over `nodes` (ids of nodes that fit): the lowest total among
    /// candidates under the packing cap, else among all; ties go to the first scored.
    fn choose<'n>(
        &self,
        nodes: impl Iterator<Item = &'n String>,
        gpu: &GpuRequest,
    ) -> Option<(String, Allocation, Explanation)> {
        let mut scored: Vec<(Candidate, Allocation)> = Vec::new();
        for nid in nodes {
            let Some(node) = self.scheduler.nodes.get(nid) else {
                continue;
            };
            let mut plans = node.allocator.single_device_plans(gpu);
            if plans.is_empty() {
                plans.extend(node.allocator.plan(gpu, Strategy::Binpack).ok());
            }
            // Idle devices of a node score alike: one of them per NUMA node is enough.
            let mut idle_seen = BTreeSet::new();
            for plan in plans {
                if let [part] = plan.parts.as_slice()
                    && let Some(d) = node
                        .allocator
                        .devices()
                        .iter()
                        .find(|d| d.spec.index == part.index)
                    && d.is_idle()
                    && !idle_seen.insert(d.spec.numa_node)
                {
                    continue;
                }
                scored.push((self.score(nid, node, &plan), plan));
            }
        }
        let considered = u32::try_from(scored.len()).unwrap_or(u32::MAX);
        // Stable: equal keys keep the order scored.
        scored.sort_by(|(a, _), (b, _)| {
            a.over_cap
                .cmp(&b.over_cap)
                .then(a.total.total_cmp(&b.total))
        });
        let mut iter = scored.into_iter();
        let (mut best, plan) = iter.next()?;
        best.chosen = true;
        let node = best.node.clone();
        let mut candidates = vec![best];
        candidates.extend(iter.take(EXPLAINED - 1).map(|(c, _)| c));
        Some((
            node,
            plan,
            Explanation {
                mode: Placement::InterferenceAware,
                weights: *self.weights(),
                candidates,
                considered,
            },
        ))
    }
}

impl Scheduler {
    /// Re-files `node` in the free-capacity index after its allocations changed.
    fn reindex(&mut self, node: &str) {
        if let Some(old) = self.free_key.remove(node) {
            self.by_free.remove(&(old, node.to_owned()));
        }
        if let Some(n) = self.nodes.get(node) {
            let key = n.allocator.free().total.micros();
            self.by_free.insert((key, node.to_owned()));
            self.free_key.insert(node.to_owned(), key);
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
