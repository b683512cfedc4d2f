//! The hub of the controller: what both gRPC services, the election and the Kubernetes side
//! share and go through.
//!
//! [`Hub`] owns the [`Scheduler`] and the [`Store`]; every change goes through
//! [`Hub::apply`], which persists what changed and tells watchers before answering.
//! Watchers read the [`SessionLog`] ([`watch`]), where every change to a session is numbered by a
//! revision.
//! Its [`Role`] says whether it leads (schedules, talks to agents) or stands by.

mod role;
pub mod watch;

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use gpuwarden_proto::v1 as pb;
use tokio::sync::{Notify, mpsc};
use tonic::Status;

pub use role::Role;
pub use watch::SessionLog;

use crate::{
    convert,
    scheduler::{Command, Scheduler},
    session::now_ms,
    store::{AfterCommit, Snapshot, Store, StoreError, Submitted, Write},
};

/// Timing of the agent protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How often agents send heartbeats.
    pub heartbeat_interval: Duration,
    /// Silence after which a node is Lost.
    pub heartbeat_timeout: Duration,
    /// Longest wait between scheduling passes.
    pub pass_interval: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(2),
            heartbeat_timeout: Duration::from_secs(10),
            pass_interval: Duration::from_millis(200),
        }
    }
}

/// Where a node's messages go while its stream is open.
pub(crate) type AgentTx = mpsc::Sender<Result<pb::ControllerMessage, Status>>;

/// The controller's hub: its state and the work both services share (the scheduler and the
/// store under one [`Hub::apply`], the session log watchers read, the agents' streams).
pub struct Hub {
    scheduler: Mutex<Scheduler>,
    /// Swapped for a fenced one each time this controller takes office.
    store: Mutex<Store>,
    role: Role,
    /// Told when a commit finds this controller deposed.
    deposed: Arc<Notify>,
    /// Open agent streams by node.
    agents: Mutex<HashMap<String, AgentTx>>,
    /// Messages for nodes whose stream isn't open yet.
    outbox: Mutex<HashMap<String, Vec<pb::ControllerMessage>>>,
    /// The latest stored state of every session, numbered by revision: what clients list and
    /// watch.
    log: Arc<SessionLog>,
    kick: Notify,
    heartbeats: AtomicU64,
    passes: PassTimes,
    timing: Timing,
    /// Where scheduling decisions' latency goes, once metrics are on.
    decisions: std::sync::OnceLock<opentelemetry::metrics::Histogram<f64>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.locked()
}

/// A store failure as the gRPC status a client sees.
#[must_use]
pub fn store_status(e: &StoreError) -> Status {
    let message = format!("the controller's store failed: {e}");
    match e {
        // Nothing of it landed, and another controller leads: ask that one.
        StoreError::Deposed { .. } => gpuwarden_proto::details::Details::new("DEPOSED")
            .status(tonic::Code::Unavailable, message),
        // The change may be made in memory and written with the next commit: a retry is safe
        // only where the call is (a create with a request id), and soon can succeed.
        _ => gpuwarden_proto::details::Details::new("STORE_UNAVAILABLE")
            .retry_after(Duration::from_secs(1))
            .status(tonic::Code::Unavailable, message),
    }
}

/// How long the scheduling passes that had a session to try took (for benchmarks; metrics have
/// each decision's time).
#[derive(Default)]
struct PassTimes {
    count: AtomicU64,
    total_ns: AtomicU64,
    longest_ns: AtomicU64,
}

impl PassTimes {
    fn record(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.total_ns.fetch_add(ns, Ordering::Relaxed);
        self.longest_ns.fetch_max(ns, Ordering::Relaxed);
    }
}

/// A change queued for commit by [`Hub::change`].
#[must_use = "a change is durable only once `durable` returns"]
pub struct Pending {
    deposed: Arc<Notify>,
    submitted: Submitted,
    /// The sessions as this change left them, revisions stamped: what watchers will hear.
    announced: Vec<Arc<pb::Session>>,
}

impl Pending {
    /// Whether it waits for a commit (false: it changed nothing that is stored).
    #[must_use]
    pub fn awaits_commit(&self) -> bool {
        self.submitted.awaits_commit()
    }

    /// Session `id` as this change left it (with the revision of the change), if it changed.
    #[must_use]
    pub fn announced(&self, id: &str) -> Option<&pb::Session> {
        self.announced
            .iter()
            .map(AsRef::as_ref)
            .find(|s| s.id == id)
    }

    /// Waits until the change is durable (and announced to watchers). A commit that finds this
    /// controller deposed tells [`Hub::deposed`].
    ///
    /// # Errors
    /// The commit failed; the change stays in memory and its writes go with the next commit.
    pub async fn durable(self) -> Result<(), StoreError> {
        let result = self.submitted.durable().await;
        if let Err(StoreError::Deposed { .. }) = &result {
            self.deposed.notify_one();
        }
        result
    }
}

impl Hub {
    /// A controller over `scheduler` (fresh or restored) persisting to `store`, leading from the
    /// start (one store, no election).
    #[must_use]
    pub fn new(scheduler: Scheduler, store: Store, timing: Timing) -> Arc<Self> {
        Self::with_role(scheduler, store, timing, Role::leader())
    }

    /// A controller that waits in `role` (a standby until it takes office).
    #[must_use]
    pub fn with_role(scheduler: Scheduler, store: Store, timing: Timing, role: Role) -> Arc<Self> {
        let log = Arc::new(SessionLog::new());
        log.reset(scheduler.sessions().values(), scheduler.revision_mark());
        Arc::new(Self {
            scheduler: Mutex::new(scheduler),
            store: Mutex::new(store),
            role,
            deposed: Arc::new(Notify::new()),
            agents: Mutex::new(HashMap::new()),
            outbox: Mutex::new(HashMap::new()),
            log,
            kick: Notify::new(),
            heartbeats: AtomicU64::new(0),
            passes: PassTimes::default(),
            timing,
            decisions: std::sync::OnceLock::new(),
        })
    }

    /// Every session change from now on, as watchers hear of it (once durable), until this
    /// controller's term ends (the stream then ends with the reason; start again for the next).
    #[must_use]
    pub fn subscribe(&self) -> mpsc::Receiver<Result<pb::Session, Status>> {
        let log = Arc::clone(&self.log);
        let start = log.start(watch::Start::Now).unwrap_or((log.revision(), 0));
        watch::stream(
            log,
            start,
            |_| true,
            |e| Status::unavailable(e.to_string()),
            (),
        )
    }

    /// Records each scheduling decision's latency into `histogram` from now on.
    pub fn set_decision_histogram(&self, histogram: opentelemetry::metrics::Histogram<f64>) {
        let _ = self.decisions.set(histogram);
    }

    /// Runs `f` on the scheduler, then persists what it changed and, once that is durable,
    /// announces it to watchers. Changes made while a commit is under way share the next one
    /// (group commit); each caller returns when its own change is durable.
    ///
    /// # Errors
    /// Persisting failed; the change stays in memory and its writes go with the next commit.
    pub async fn apply<R>(&self, f: impl FnOnce(&mut Scheduler) -> R) -> Result<R, StoreError> {
        let (result, pending) = self.change(f)?;
        pending.durable().await?;
        Ok(result)
    }

    /// Runs `f` on the scheduler and queues what it changed for the next commit, without
    /// waiting: the first half of [`Hub::apply`]. Watchers hear of the change, and the
    /// caller may act on it, only once [`Pending::durable`] returns. Callers that answer nobody
    /// (an agent's acknowledgements) keep reading while earlier changes commit.
    ///
    /// # Errors
    /// A changed record doesn't encode; nothing was queued.
    pub fn change<R>(
        &self,
        f: impl FnOnce(&mut Scheduler) -> R,
    ) -> Result<(R, Pending), StoreError> {
        let (result, submitted, announced) = {
            let mut scheduler = lock(&self.scheduler);
            let result = f(&mut scheduler);
            let changes = scheduler.take_changes();
            let mut writes = Vec::new();
            let mut announce = Vec::new();
            let mut removed = Vec::new();
            for id in &changes.sessions {
                if scheduler.sessions().contains_key(id) {
                    // Numbered in the order changes are submitted, which is the order they are
                    // stored and published in.
                    scheduler.stamp_revision(id, self.log.next_revision());
                }
                if let Some(s) = scheduler.sessions().get(id) {
                    writes.push(Write::session(s)?);
                    announce.push(Arc::new(convert::session_to_pb(s)));
                } else {
                    // Forgotten after it ended (watchers heard of its end then).
                    writes.push(Write::remove_session(id));
                    removed.push(id.clone());
                }
            }
            // Forgetting takes revisions away from what a watch can replay: the mark says
            // which, and keeps the counter from going back after a restart.
            let compacted = if removed.is_empty() {
                0
            } else {
                let mark = self.log.forget(&removed);
                writes.push(Write::revisions(&mark)?);
                mark.compacted
            };
            for id in &changes.nodes {
                if let Some(n) = scheduler.nodes().get(id) {
                    writes.push(Write::node(n)?);
                }
            }
            if changes.slot_types {
                writes.push(Write::registry(scheduler.registry())?);
            }
            if changes.quotas {
                writes.push(Write::quotas(&scheduler.config().quotas)?);
            }
            // Usage series: written, not announced.
            for id in changes.usage.difference(&changes.sessions) {
                if let Some(s) = scheduler.sessions().get(id) {
                    writes.push(Write::session(s)?);
                }
            }
            for class in &changes.profiles {
                if let Some(p) = scheduler.profiles().get(class) {
                    writes.push(Write::profile(p)?);
                }
            }
            let log = Arc::clone(&self.log);
            let announced = announce.clone();
            let after: AfterCommit = Box::new(move || log.publish(announce, &removed, compacted));
            // Submitted under the scheduler's lock: the store sees changes in the order they
            // were made, and watchers hear of them in that order.
            (
                result,
                lock(&self.store).submit(writes, Some(after)),
                announced,
            )
        };
        Ok((
            result,
            Pending {
                deposed: Arc::clone(&self.deposed),
                submitted,
                announced,
            },
        ))
    }

    /// This controller's role.
    #[must_use]
    pub fn role(&self) -> &Role {
        &self.role
    }

    /// Takes office: the state as `store` (fenced on this term) holds it replaces whatever was
    /// in memory, and scheduling starts.
    pub fn take_office(&self, store: Store, stored: Snapshot) {
        {
            let mut scheduler = lock(&self.scheduler);
            let config = scheduler.config().clone();
            *scheduler = Scheduler::restore(config, stored);
            self.log
                .reset(scheduler.sessions().values(), scheduler.revision_mark());
            *lock(&self.store) = store;
        }
        self.role.take_office();
        self.kick();
    }

    /// Steps down: stops scheduling and closes the agents' streams, so that they reconnect and
    /// find the leader (`leader`, where known).
    pub fn step_down(&self, leader: Option<String>) {
        self.role.stand_by(leader);
        // Its watchers end, and follow the leader from their last revision.
        self.log.close();
        lock(&self.agents).clear();
        lock(&self.outbox).clear();
    }

    /// Completes when a commit finds that this controller no longer leads.
    pub async fn deposed(&self) {
        self.deposed.notified().await;
    }

    /// The sessions as clients list and watch them.
    #[must_use]
    pub fn session_log(&self) -> &Arc<SessionLog> {
        &self.log
    }

    /// Reads the scheduler.
    pub fn read<R>(&self, f: impl FnOnce(&Scheduler) -> R) -> R {
        f(&lock(&self.scheduler))
    }

    /// A new session id: the time in ms (so ids sort by creation, to the millisecond), then 64
    /// random bits, so nobody can guess the id of a session about to be created (issue 33:
    /// another user of the agent's socket claimed a `gpuwarden run` session's cgroup before its
    /// owner) and two made in one millisecond differ. No counter: it would add four columns to
    /// every table for what the random bits already give. `None` when the system's random
    /// source fails.
    pub fn new_session_id(&self) -> Option<String> {
        use ring::rand::SecureRandom as _;
        let mut random = [0u8; 8];
        ring::rand::SystemRandom::new().fill(&mut random).ok()?;
        Some(format!(
            "s-{:x}{:016x}",
            now_ms(),
            u64::from_be_bytes(random)
        ))
    }

    /// The timing of the agent protocol.
    #[must_use]
    pub fn timing(&self) -> Timing {
        self.timing
    }

    /// Opens `node`'s stream: the messages kept for it go into `tx` first, then `tx` is where
    /// later ones go.
    pub(crate) fn attach_agent(&self, node: &str, tx: AgentTx) {
        // Under the agents' lock, as `dispatch` decides under it: a command dispatched while the
        // agent attaches is either in the outbox drained here or sent on `tx`, never left behind.
        let mut agents = lock(&self.agents);
        for message in lock(&self.outbox).remove(node).unwrap_or_default() {
            let _ = tx.try_send(Ok(message));
        }
        agents.insert(node.to_owned(), tx);
    }

    /// Whether `node`'s agent has its stream open now: one that can be told to release a
    /// session and confirm it (issue 40).
    #[must_use]
    pub fn agent_connected(&self, node: &str) -> bool {
        lock(&self.agents)
            .get(node)
            .is_some_and(|tx| !tx.is_closed())
    }

    /// Heartbeats received since start.
    #[must_use]
    pub fn heartbeats_received(&self) -> u64 {
        self.heartbeats.load(Ordering::Relaxed)
    }

    /// Scheduling passes since start that had a session to try, their total time and the longest.
    #[must_use]
    pub fn pass_times(&self) -> (u64, Duration, Duration) {
        let nanos = |a: &AtomicU64| Duration::from_nanos(a.load(Ordering::Relaxed));
        (
            self.passes.count.load(Ordering::Relaxed),
            nanos(&self.passes.total_ns),
            nanos(&self.passes.longest_ns),
        )
    }

    pub(crate) fn count_heartbeat(&self) {
        self.heartbeats.fetch_add(1, Ordering::Relaxed);
    }

    /// Asks for a scheduling pass soon.
    pub fn kick(&self) {
        self.kick.notify_one();
    }

    /// Sends scheduler commands to their agents (or keeps them until the agent connects).
    pub fn dispatch(&self, commands: Vec<Command>) {
        for command in commands {
            let (node, message) = match command {
                Command::Allocate {
                    node,
                    session,
                    slots,
                    allocation,
                    target,
                    policy,
                    scope,
                    run_uid,
                } => (
                    node,
                    pb::controller_message::Msg::Allocate(pb::Allocate {
                        session_id: session,
                        slots: Some(convert::slots_to_pb(&slots)),
                        devices: convert::parts_to_pb(&allocation),
                        target: convert::target_to_pb(&target),
                        policy: Some(convert::policy_to_pb(policy)),
                        scope: Some(convert::scope_to_pb(&scope)),
                        run_caller: run_uid.map(|uid| pb::RunCaller { uid }),
                    }),
                ),
                Command::Release { node, session } => (
                    node,
                    pb::controller_message::Msg::Release(pb::Release {
                        session_id: session,
                    }),
                ),
                Command::Preempt {
                    node,
                    session,
                    grace_ms,
                    reason,
                    mode,
                } => (
                    node,
                    pb::controller_message::Msg::Preempt(pb::Preempt {
                        session_id: session,
                        grace_ms,
                        reason,
                        mode: mode.as_str().to_owned(),
                    }),
                ),
                Command::Resume {
                    node,
                    session,
                    onto,
                } => (
                    node,
                    pb::controller_message::Msg::Resume(pb::Resume {
                        session_id: session,
                        devices: onto.as_ref().map(convert::parts_to_pb).unwrap_or_default(),
                    }),
                ),
                Command::MakeMigInstance {
                    node,
                    session,
                    gpu_uuid,
                    profile,
                    start,
                } => (
                    node,
                    pb::controller_message::Msg::MakeMigInstance(pb::MakeMigInstance {
                        session_id: session,
                        gpu_uuid,
                        profile,
                        start,
                    }),
                ),
            };
            let message = pb::ControllerMessage { msg: Some(message) };
            // The agents' lock is held until the message is sent or in the outbox (see
            // `attach_agent`).
            let agents = lock(&self.agents);
            let undelivered = match agents.get(&node) {
                Some(tx) => tx.try_send(Ok(message)).err().map(|e| match e {
                    mpsc::error::TrySendError::Full(m) | mpsc::error::TrySendError::Closed(m) => m,
                }),
                None => Some(Ok(message)),
            };
            if let Some(Ok(message)) = undelivered {
                lock(&self.outbox).entry(node).or_default().push(message);
            }
            drop(agents);
        }
    }

    /// Runs scheduling passes and liveness checks until the process ends.
    /// A standby only waits: it neither expires nodes nor schedules.
    pub async fn run_background(self: Arc<Self>) {
        let mut liveness = tokio::time::interval(Duration::from_secs(1));
        let mut retention = tokio::time::interval(Duration::from_mins(1));
        loop {
            tokio::select! {
                () = self.kick.notified() => {}
                () = tokio::time::sleep(self.timing.pass_interval) => {}
                _ = retention.tick(), if self.role.is_leader() => {
                    match self.apply(|s| s.forget_ended(now_ms())).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!("forgot {n} ended sessions past their retention"),
                        Err(e) => tracing::error!("forgetting ended sessions: {e}"),
                    }
                }
                _ = liveness.tick(), if self.role.is_leader() => {
                    let timeout = i64::try_from(self.timing.heartbeat_timeout.as_millis()).unwrap_or(i64::MAX);
                    let expire = |s: &mut Scheduler| {
                        let now = now_ms();
                        let lost = s.expire(now, timeout);
                        let gangs = i64::from(s.config().gang_start_timeout_ms);
                        let mut releases = s.expire_gangs(now, gangs);
                        // Terminating sessions whose release was never confirmed (issue 40).
                        let unconfirmed = i64::from(s.config().release_timeout_ms);
                        releases.extend(s.expire_releases(now, unconfirmed));
                        (lost, releases)
                    };
                    match self.apply(expire).await {
                        Ok((lost, releases)) => {
                            for node in lost {
                                tracing::warn!(%node, "node lost: no heartbeat for {:?}", self.timing.heartbeat_timeout);
                                lock(&self.agents).remove(&node);
                            }
                            self.dispatch(releases);
                        }
                        Err(e) => tracing::error!("persisting node loss: {e}"),
                    }
                }
            }
            if !self.role.is_leader() {
                continue;
            }
            let decisions = self.decisions.get();
            let passes = &self.passes;
            let pass = |s: &mut Scheduler| {
                let started = std::time::Instant::now();
                let mut decided = false;
                let commands = s.pass_observed(&mut |took, placed| {
                    decided = true;
                    if let Some(h) = decisions {
                        h.record(
                            took.as_secs_f64(),
                            &[opentelemetry::KeyValue::new("gpuwarden.placed", placed)],
                        );
                    }
                });
                if decided {
                    passes.record(started.elapsed());
                }
                commands
            };
            match self.apply(pass).await {
                Ok(commands) => self.dispatch(commands),
                Err(e) => tracing::error!("persisting a scheduling pass: {e}"),
            }
        }
    }
}
