//! Enforcement: binding quotas to workloads and keeping the kernel side in step.
//!
//! The [`Enforcer`] holds one [`Binding`] per session with a quota. A binding waits (pending)
//! until its target's cgroup exists, then maps that cgroup and every cgroup below it to the quota
//! in the BPF maps (memory limits, allowed GPUs), attaches the device-access program to it, and
//! hands its compute shares to the throttle. It lets go on release, and when the cgroup goes away
//! it waits again. A quota whose cgroup never appears expires with an event.
//!
//! Kernel events (an over-limit allocation, a refused open) come back here, are tied to their
//! session, kept in a short history for snapshots, and sent up to the controller.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    path::PathBuf,
    time::{Duration, Instant},
};

use gpuwarden_agent_common::{
    event::{Event, action, kind},
    maps::{CgroupDeviceKey, MAX_GPUS, NO_LIMIT, Quota, memory_kind, quota_flags, slot_device},
};
use gpuwarden_proto::v1 as pb;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

pub use gpuwarden_agent_api::Record;

use super::{
    cgroup_tree::CgroupTree,
    confinement::{Rules, Verdict},
    kernel::{Kernel, Pinned},
    quota::{MemoryPolicy, QuotaSpec, Target},
    suspend::{self, Refusal, SuspendConfig, Suspended, Suspension},
    throttle::{self, ThrottleHandle, ThrottleStats},
};
use crate::checkpoint::helper::Helper;
use crate::{devices::ProcessMemory, sensor::MemoryTier};

/// Enforcement events kept for snapshots.
const HISTORY: usize = 64;

/// The actions a workload can cause as often as it likes (an allocation over its limit under
/// `report`, a refused open in a loop): rate-limited per session by [`EventLimiter`].
const WORKLOAD_ACTIONS: [&str; 5] = ["deny", "kill", "stop", "report", "device_denied"];

/// Workload-caused events a session sends per second once its burst is spent.
const EVENTS_PER_SEC: f64 = 5.0;

/// Workload-caused events a session may send at once.
const EVENT_BURST: f64 = 20.0;

/// A token bucket per session for the events its workload causes: a tenant allocating in a loop
/// under `report` fills neither the controller link nor the history; what is held back is
/// counted and named in the next event that goes.
#[derive(Debug, Default)]
struct EventLimiter {
    /// Session → (tokens, when last refilled, events held back since the last one sent).
    sessions: BTreeMap<String, (f64, Instant, u64)>,
    /// Events held back since the agent started.
    suppressed_total: u64,
}

impl EventLimiter {
    /// `Some(held back before it)` when `session`'s event goes, `None` when it is held back.
    fn admit(&mut self, session: &str, now: Instant) -> Option<u64> {
        let (tokens, last, held_back) =
            self.sessions
                .entry(session.to_owned())
                .or_insert((EVENT_BURST, now, 0));
        let refill = now.saturating_duration_since(*last).as_secs_f64() * EVENTS_PER_SEC;
        *tokens = (*tokens + refill).min(EVENT_BURST);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Some(std::mem::take(held_back))
        } else {
            *held_back += 1;
            self.suppressed_total += 1;
            None
        }
    }

    fn forget(&mut self, session: &str) {
        self.sessions.remove(session);
    }
}

/// Where a binding stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BindState {
    /// Waiting for the target's cgroup.
    Pending,
    /// Enforced on its cgroup.
    Bound,
    /// The cgroup never appeared in time.
    Expired,
    /// Its cgroup is one no quota may bind ([`super::confinement`]); an event says why.
    Refused,
}

/// One session's quota and where it is enforced.
#[derive(Debug)]
struct Binding {
    /// The quota.
    spec: QuotaSpec,
    /// Where it stands.
    state: BindState,
    /// When it started waiting.
    since: Instant,
    /// The cgroup it is bound at.
    dir: Option<PathBuf>,
    /// That cgroup's id: the key of its quota in the maps.
    key: Option<u64>,
    /// Every cgroup mapped to the quota.
    members: BTreeSet<u64>,
    /// Processes stopped by policy, for `resume`/`kill`.
    stopped: BTreeSet<u32>,
    /// Its cgroup is held frozen because of them.
    held: bool,
    /// GPUs whose memory limit the driver enforces on `dir` (`dmem.max` set).
    driver_limited: Vec<u32>,
}

/// One binding as the rest of the agent sees it (snapshots, usage reports): a copy, with what
/// the kernel side counts against it and what the throttle did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct BindingReport {
    /// The session.
    pub session_id: String,
    /// The quota.
    pub spec: QuotaSpec,
    /// Where it stands.
    pub state: BindState,
    /// The cgroup it is bound at.
    pub dir: Option<PathBuf>,
    /// That cgroup relative to the cgroup root.
    pub cgroup_path: Option<String>,
    /// The key of its quota in the maps.
    pub key: Option<u64>,
    /// Every cgroup mapped to the quota.
    pub members: BTreeSet<u64>,
    /// The quota as the kernel side holds it (used bytes, actions).
    pub kernel: Option<Quota>,
    /// What the compute-share throttle did.
    pub throttle: Option<ThrottleStats>,
    /// The driver tier's name when the driver enforces its memory limits (`driver_dmem`).
    pub driver_tier: Option<&'static str>,
}

/// Everything enforcement holds, as the rest of the agent sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Standing {
    /// Bindings by session.
    pub bindings: Vec<BindingReport>,
    /// Recent actions, oldest first.
    pub history: Vec<Record>,
    /// Events a workload caused that were counted but not sent one by one.
    pub suppressed_events: u64,
    /// How the compute-share throttle holds shares (`slots`, `buckets`), where it runs.
    pub throttle_mode: Option<&'static str>,
    /// How each GPU's compute-share signal has behaved (the slot mode).
    pub signals: Vec<(u32, throttle::SignalHealth)>,
}

/// The event sent up to the controller for `record`.
fn record_to_pb(record: &Record) -> pb::EnforcementEvent {
    gpuwarden_proto::convert::event_to_pb(&record.session_id, &record.event())
}

/// Errors of the local controls.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ControlError {
    /// The pid is in no bound workload.
    #[error("process {0} is not in a workload with a quota on this node")]
    NotBound(u32),
    /// The signal could not be sent.
    #[error("cannot signal process {pid}: {source}")]
    Signal {
        /// The process.
        pid: u32,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No such session.
    #[error("no quota for session {0:?} on this node")]
    NoSession(String),
}

/// Binds quotas and keeps the kernel side in step.
pub(crate) struct Enforcer {
    kernel: Kernel,
    tree: CgroupTree,
    bindings: BTreeMap<String, Binding>,
    history: VecDeque<Record>,
    upward: mpsc::Sender<pb::EnforcementEvent>,
    /// Events the controller link could not take (it was away and its buffer full).
    dropped_upward: u64,
    timeout: Duration,
    throttle: Option<ThrottleHandle>,
    /// (session, GPU) pairs the NVML cross-check acted on and that are still over.
    cross_checked: BTreeSet<(String, u32)>,
    /// What a quota may bind to.
    rules: Rules,
    /// Per session, how many of the events a workload can cause go up and into the history.
    limiter: EventLimiter,
    /// Sessions being preempted: signalled, killed at their deadline ([`Self::preempt`]).
    preempting: BTreeMap<String, Preemption>,
    /// How workloads are suspended; `None`: they are not (a suspension falls back to a kill).
    suspend: Option<SuspendConfig>,
    /// Sessions suspended, or being suspended or resumed ([`Self::begin_suspend`]).
    suspensions: BTreeMap<String, Suspension>,
}

/// A suspension or resumption for the enforcer's task to run off the enforcer (each driver
/// call may take seconds): the session, its cgroup, its processes and how to reach the driver.
#[derive(Debug, Clone)]
pub(crate) struct CheckpointJob {
    /// The session.
    pub session: String,
    /// Its bound cgroup.
    pub dir: PathBuf,
    /// Its processes with a GPU context.
    pub pids: Vec<u32>,
    /// The helper.
    pub helper: Helper,
    /// The limit on each call.
    pub step: Duration,
}

/// A preemption under way: the workload was sent `SIGTERM` and is killed at `deadline`.
#[derive(Debug)]
struct Preemption {
    deadline: Instant,
    reason: String,
}

/// Whether NVML's count shows a workload over its limit that the kernel side did not see (so
/// nothing acted on it): the decoder missed an allocation path.
#[must_use]
pub(crate) fn missed_by_decoder(limit: u64, kernel_used: u64, nvml_used: u64) -> bool {
    nvml_used > limit && kernel_used <= limit
}

impl Enforcer {
    /// An enforcer writing to `kernel` for the cgroups of `tree`, sending events up through
    /// `upward`; a quota whose cgroup does not appear within `timeout` expires.
    pub(crate) fn new(
        kernel: Kernel,
        tree: CgroupTree,
        upward: mpsc::Sender<pb::EnforcementEvent>,
        timeout: Duration,
        throttle: Option<ThrottleHandle>,
    ) -> Self {
        Self {
            kernel,
            tree,
            bindings: BTreeMap::new(),
            history: VecDeque::new(),
            upward,
            dropped_upward: 0,
            timeout,
            throttle,
            cross_checked: BTreeSet::new(),
            rules: Rules::default(),
            limiter: EventLimiter::default(),
            preempting: BTreeMap::new(),
            suspend: None,
            suspensions: BTreeMap::new(),
        }
    }

    /// The same, suspending workloads through `config` where a preemption asks for it.
    #[must_use]
    pub(crate) fn with_suspend(mut self, config: Option<SuspendConfig>) -> Self {
        self.suspend = config;
        self
    }

    /// The same, holding quotas to `rules` (the agent's own cgroup, the kubelet's pods).
    #[must_use]
    pub(crate) fn with_rules(mut self, rules: Rules) -> Self {
        self.rules = rules;
        self
    }

    /// The bindings and recent actions, with the kernel's and the throttle's counts.
    pub(crate) fn standing(&self) -> Standing {
        let bindings = self
            .bindings
            .iter()
            .map(|(session, b)| BindingReport {
                session_id: session.clone(),
                spec: b.spec.clone(),
                state: b.state,
                dir: b.dir.clone(),
                cgroup_path: b.dir.as_deref().map(|d| self.tree.relative(d)),
                key: b.key,
                members: b.members.clone(),
                kernel: b.key.and_then(|k| self.kernel.maps.quotas.get(&k)),
                throttle: b
                    .key
                    .and_then(|k| self.throttle.as_ref().and_then(|t| t.stats(k))),
                driver_tier: self
                    .kernel
                    .driver_limits
                    .as_ref()
                    .filter(|_| !b.driver_limited.is_empty())
                    .map(|d| d.tier()),
            })
            .collect();
        Standing {
            bindings,
            history: self.history.iter().cloned().collect(),
            suppressed_events: self.limiter.suppressed_total,
            throttle_mode: self.throttle.as_ref().map(ThrottleHandle::mode),
            signals: self
                .throttle
                .as_ref()
                .map(ThrottleHandle::signals)
                .unwrap_or_default(),
        }
    }

    /// Events the controller link could not take.
    pub(crate) fn dropped_upward(&self) -> u64 {
        self.dropped_upward
    }

    /// Thaws the cgroup each held quota binds to: a dead agent may have left it frozen
    /// mid-period. Run once at start, before the throttle takes over.
    pub(crate) fn thaw_targets(&self, specs: &[QuotaSpec]) {
        for spec in specs {
            if let Ok(Some(dir)) = self.tree.find(&spec.target, &spec.session_id)
                && let Err(e) = throttle::thaw(&dir)
            {
                tracing::debug!(dir = %dir.display(), "not thawed: {e}");
            }
        }
    }

    /// Enforces `spec` (replacing the session's earlier quota) as soon as its cgroup exists.
    pub(crate) fn apply(&mut self, spec: QuotaSpec) {
        if let Some(b) = self.bindings.get(&spec.session_id)
            && b.spec == spec
        {
            return;
        }
        let session = spec.session_id.clone();
        if self.bindings.contains_key(&session) {
            self.unbind(&session, "quota replaced");
        }
        self.bindings.insert(
            session.clone(),
            Binding {
                spec,
                state: BindState::Pending,
                since: Instant::now(),
                dir: None,
                key: None,
                members: BTreeSet::new(),
                stopped: BTreeSet::new(),
                held: false,
                driver_limited: Vec::new(),
            },
        );
        self.reconcile_one(&session);
    }

    /// Stops enforcing the session's quota.
    pub(crate) fn release(&mut self, session: &str) {
        if !self.bindings.contains_key(session) {
            return;
        }
        if let Some(s) = self.suspensions.remove(session) {
            // Released while suspended: its GPU state will never be restored, so nothing of the
            // workload can go on. It ends as a killed one does.
            self.hold_frozen(session, false);
            let _ = throttle::thaw(&s.dir);
            if let Err(e) = self.tree.kill(&s.dir) {
                tracing::warn!(session, "suspended workload not killed on release: {e}");
            }
        }
        self.unbind(session, "released by the controller");
        self.limiter.forget(session);
        if let Some(b) = self.bindings.remove(session)
            && b.spec.target == Target::Managed
        {
            // The session's own cgroup: gone with it (if its processes have left).
            self.tree.remove_managed(session);
        }
    }

    /// Removes pinned kernel state no binding owns: quotas, cgroup mappings and device links
    /// left by an earlier agent for sessions this one no longer holds (released while it was
    /// down, or a store that was lost). Run once after the held quotas are applied at start.
    pub(crate) fn sweep_stale(&mut self) {
        let owned: BTreeSet<u64> = self.bindings.values().filter_map(|b| b.key).collect();
        let maps = &mut self.kernel.maps;
        let stale: Vec<u64> = maps
            .quotas
            .keys()
            .into_iter()
            .filter(|k| !owned.contains(k))
            .collect();
        for key in &stale {
            if let Err(e) = maps.quotas.remove(key) {
                tracing::warn!(key, "stale quota left in place: {e}");
            }
        }
        let unmapped: Vec<u64> = maps
            .cgroup_quota
            .entries()
            .into_iter()
            .filter(|(_, key)| !owned.contains(key))
            .map(|(cgroup, _)| cgroup)
            .collect();
        for cgroup in &unmapped {
            if let Err(e) = maps.cgroup_quota.remove(cgroup) {
                tracing::warn!(cgroup, "stale cgroup mapping left in place: {e}");
            }
        }
        let links = self.kernel.devices.sweep(&owned);
        if !stale.is_empty() || !unmapped.is_empty() || links > 0 {
            tracing::info!(
                quotas = stale.len(),
                cgroups = unmapped.len(),
                device_links = links,
                "removed enforcement left by an earlier agent for sessions no longer held"
            );
        }
    }

    /// Binds what is pending, follows bound cgroups (new children, removal), expires what
    /// waited too long.
    pub(crate) fn reconcile(&mut self) {
        // Admins' (and DRA claims') quotas bind first: where one overlaps a user's that has not
        // bound yet, the admin's wins and the user's is refused at its binding.
        let mut sessions: Vec<(bool, String)> = self
            .bindings
            .iter()
            .map(|(s, b)| (!b.spec.scope.admin, s.clone()))
            .collect();
        sessions.sort();
        let sessions = sessions.into_iter().map(|(_, s)| s);
        for session in sessions {
            self.reconcile_one(&session);
        }
        self.advance_preemptions(Instant::now());
    }

    /// Preempts `session`: `SIGTERM` to every process of its bound cgroup (and the cgroups
    /// below), which are killed `grace` later ([`Self::advance_preemptions`]) unless they are
    /// gone before. A session with nothing bound (no target, or its cgroup not there) ends at
    /// once. Either way its quota is then released and a `preempted` event goes up, which the
    /// controller link takes as the end of the session's hold on the node.
    pub(crate) fn preempt(&mut self, session: &str, grace: Duration, reason: &str) {
        if self.preempting.contains_key(session) {
            return;
        }
        let dir = self.bound_dir(session);
        let preemption = Preemption {
            deadline: Instant::now() + grace,
            reason: reason.to_owned(),
        };
        let Some(dir) = dir else {
            self.preempting.insert(session.to_owned(), preemption);
            self.finish_preemption(session);
            return;
        };
        let pids = self.tree.procs_below(&dir);
        let mut signalled = 0;
        for &pid in &pids {
            match self.kernel.signals.send(pid, libc::SIGTERM) {
                Ok(()) => signalled += 1,
                Err(e) => tracing::debug!(session, pid, "SIGTERM not sent: {e}"),
            }
        }
        // A workload its memory policy stopped would never see the SIGTERM: let it run to end.
        let stopped: Vec<u32> = self
            .bindings
            .get(session)
            .map(|b| b.stopped.iter().copied().collect())
            .unwrap_or_default();
        if !stopped.is_empty() {
            self.hold_stopped(session, false);
            for pid in stopped {
                let _ = self.kernel.signals.send(pid, libc::SIGCONT);
            }
        }
        let rel = self.tree.relative(&dir);
        let why = format!(
            "preempted ({reason}): SIGTERM to {signalled} processes; killed in {} ms",
            grace.as_millis()
        );
        self.record(session, "preempt", why, rel, 0, None, (0, 0, 0));
        self.preempting.insert(session.to_owned(), preemption);
    }

    /// Starts suspending `session` instead of killing it (issue 38): its processes with a GPU
    /// context, for the task to lock and checkpoint off the enforcer ([`suspend::suspend`]).
    /// `None` where it was preempted the kill way instead (no helper configured, nothing
    /// bound) or where a preemption or suspension of it is already under way.
    pub(crate) fn begin_suspend(
        &mut self,
        session: &str,
        grace: Duration,
        reason: &str,
    ) -> Option<CheckpointJob> {
        if self.preempting.contains_key(session) || self.suspensions.contains_key(session) {
            return None;
        }
        let (Some(config), Some(dir)) = (self.suspend.clone(), self.bound_dir(session)) else {
            let why = if self.suspend.is_none() {
                "no checkpoint helper"
            } else {
                "nothing bound"
            };
            self.preempt(session, grace, &format!("{reason}; not suspended: {why}"));
            return None;
        };
        let pids = self.tree.procs_below(&dir);
        let gpu = suspend::with_gpu_context(std::path::Path::new("/proc"), &pids);
        // What goes to host memory: the GPU memory its quota counts now.
        let held = self
            .bindings
            .get(session)
            .and_then(|b| b.key)
            .and_then(|k| self.kernel.maps.quotas.get(&k))
            .map_or(0, |q| q.used.iter().sum::<u64>());
        let rel = self.tree.relative(&dir);
        let why = format!(
            "suspending ({reason}): {} of {} processes hold a GPU context; their GPU memory \
             goes to host memory",
            gpu.len(),
            pids.len()
        );
        self.record(session, "suspend", why, rel, 0, None, (0, 0, 0));
        self.suspensions.insert(
            session.to_owned(),
            Suspension {
                dir: dir.clone(),
                pids: Vec::new(),
                since: Instant::now(),
                reason: reason.to_owned(),
                grace,
                done: false,
                held,
            },
        );
        Some(CheckpointJob {
            session: session.to_owned(),
            dir,
            pids: gpu,
            helper: config.helper,
            step: config.step_timeout,
        })
    }

    /// The end of a suspension [`Self::begin_suspend`] started: `suspended` (the cgroup held
    /// frozen), or the driver refused and the workload is preempted the kill way, the event
    /// saying why.
    pub(crate) fn end_suspend(&mut self, session: &str, result: Result<Suspended, Refusal>) {
        let Some(s) = self.suspensions.get_mut(session) else {
            return;
        };
        let rel = self.tree.relative(&s.dir);
        match result {
            Ok(done) => {
                s.pids.clone_from(&done.pids);
                s.done = true;
                let why = format!(
                    "suspended ({}): {} processes checkpointed to host memory and the cgroup \
                     frozen in {} ms; their GPU memory is released",
                    s.reason,
                    done.pids.len(),
                    done.took.as_millis()
                );
                let held = s.held;
                self.hold_frozen(session, true);
                // `used_bytes`: the GPU memory now in host memory (the controller books it).
                self.record(session, "suspended", why, rel, 0, None, (0, held, 0));
            }
            Err(refusal) => {
                let Some(s) = self.suspensions.remove(session) else {
                    return;
                };
                let why = format!("not suspended ({refusal}): preempted the kill way instead");
                self.record(session, "suspend_refused", why, rel, 0, None, (0, 0, 0));
                self.preempt(
                    session,
                    s.grace,
                    &format!("{}; suspend refused: {refusal}", s.reason),
                );
            }
        }
    }

    /// Starts resuming a suspended `session`: its checkpointed processes, for the task to
    /// restore and unlock ([`suspend::resume`]). `None` where it is not suspended (or a
    /// suspension or resumption of it is still under way).
    pub(crate) fn begin_resume(&mut self, session: &str) -> Option<CheckpointJob> {
        let config = self.suspend.clone()?;
        if !self.suspensions.contains_key(session)
            && let Some(dir) = self.bound_dir(session)
        {
            // Suspended by an agent before a restart: nothing remembered, so its processes with a
            // GPU context are resumed for what the driver says they are.
            let pids = self.tree.procs_below(&dir);
            let gpu = suspend::with_gpu_context(std::path::Path::new("/proc"), &pids);
            self.suspensions.insert(
                session.to_owned(),
                Suspension {
                    dir,
                    pids: gpu,
                    since: Instant::now(),
                    reason: "suspended before this agent started".to_owned(),
                    grace: Duration::ZERO,
                    done: true,
                    held: 0,
                },
            );
        }
        let s = self.suspensions.get_mut(session).filter(|s| s.done)?;
        s.done = false;
        let job = CheckpointJob {
            session: session.to_owned(),
            dir: s.dir.clone(),
            pids: s.pids.clone(),
            helper: config.helper,
            step: config.step_timeout,
        };
        let why = format!(
            "resuming after {} s: {} processes back to the GPU",
            s.since.elapsed().as_secs(),
            s.pids.len()
        );
        let rel = self.tree.relative(&job.dir);
        self.hold_frozen(session, false);
        self.record(session, "resuming", why, rel, 0, None, (0, 0, 0));
        Some(job)
    }

    /// The end of a resumption: `resumed`, or the restore failed, the workload's GPU state is
    /// lost, and it is ended the kill way.
    pub(crate) fn end_resume(&mut self, session: &str, result: Result<Duration, Refusal>) {
        let Some(s) = self.suspensions.remove(session) else {
            return;
        };
        let rel = self.tree.relative(&s.dir);
        match result {
            Ok(took) => {
                let why = format!(
                    "resumed after {} s suspended ({}): {} processes restored and unlocked in \
                     {} ms",
                    s.since.elapsed().as_secs(),
                    s.reason,
                    s.pids.len(),
                    took.as_millis()
                );
                self.record(session, "resumed", why, rel, 0, None, (0, 0, 0));
            }
            Err(refusal) => {
                let why = format!("not resumed ({refusal}): its GPU state is lost");
                self.record(
                    session,
                    "resume_failed",
                    why.clone(),
                    rel,
                    0,
                    None,
                    (0, 0, 0),
                );
                self.preempt(session, Duration::ZERO, &why);
            }
        }
    }

    /// Holds `session`'s cgroup frozen against the throttle's periods (or lets it go).
    fn hold_frozen(&self, session: &str, held: bool) {
        let Some(b) = self.bindings.get(session) else {
            return;
        };
        if let (Some(key), Some(dir), Some(throttle)) = (b.key, b.dir.clone(), &self.throttle)
            && let Err(e) = throttle.hold(key, dir, held)
        {
            tracing::warn!(session, "suspension not held against the throttle: {e}");
        }
    }

    /// Ends the preemptions whose deadline passed or whose workload is gone.
    pub(crate) fn advance_preemptions(&mut self, now: Instant) {
        let due: Vec<String> = self
            .preempting
            .iter()
            .filter(|(session, p)| {
                now >= p.deadline
                    || self
                        .bound_dir(session)
                        .is_none_or(|dir| self.tree.procs_below(&dir).is_empty())
            })
            .map(|(session, _)| session.clone())
            .collect();
        for session in due {
            self.finish_preemption(&session);
        }
    }

    /// Kills what is left of a preempted workload (`cgroup.kill`, else `SIGKILL` per process),
    /// releases its quota and reports `preempted`.
    fn finish_preemption(&mut self, session: &str) {
        let Some(preemption) = self.preempting.remove(session) else {
            return;
        };
        let dir = self.bound_dir(session);
        let rel = dir
            .as_deref()
            .map(|d| self.tree.relative(d))
            .unwrap_or_default();
        let mut killed = 0;
        if let Some(dir) = &dir {
            let pids = self.tree.procs_below(dir);
            killed = pids.len();
            if !pids.is_empty()
                && let Err(e) = self.tree.kill(dir)
            {
                tracing::debug!(
                    session,
                    "cgroup.kill not written ({e}): SIGKILL per process"
                );
                for pid in pids {
                    if let Err(e) = self.kernel.signals.send(pid, libc::SIGKILL) {
                        tracing::debug!(session, pid, "SIGKILL not sent: {e}");
                    }
                }
            }
        }
        self.release(session);
        let why = if killed == 0 {
            format!(
                "preempted ({}): the workload ended; quota released",
                preemption.reason
            )
        } else {
            format!(
                "preempted ({}): {killed} processes killed at the deadline; quota released",
                preemption.reason
            )
        };
        self.record(session, "preempted", why, rel, 0, None, (0, 0, 0));
    }

    /// The cgroup `session`'s quota is bound at, if it is bound.
    fn bound_dir(&self, session: &str) -> Option<PathBuf> {
        self.bindings
            .get(session)
            .filter(|b| b.state == BindState::Bound)
            .and_then(|b| b.dir.clone())
    }

    fn reconcile_one(&mut self, session: &str) {
        let Some(b) = self.bindings.get(session) else {
            return;
        };
        match b.state {
            BindState::Expired | BindState::Refused => {}
            BindState::Pending => match self.tree.find(&b.spec.target, session) {
                Ok(Some(dir)) => {
                    let path = self.tree.relative(&dir);
                    let bound: Vec<(String, String)> = self
                        .bindings
                        .iter()
                        .filter(|(s, o)| s.as_str() != session && o.state == BindState::Bound)
                        .filter_map(|(s, o)| {
                            o.dir.as_deref().map(|d| (s.clone(), self.tree.relative(d)))
                        })
                        .collect();
                    let verdict = self.rules.check_bind(
                        &b.spec,
                        &path,
                        bound.iter().map(|(s, p)| (s.as_str(), p.as_str())),
                    );
                    match verdict {
                        Verdict::Bind => self.bind(session, dir),
                        Verdict::Wait(why) if b.since.elapsed() >= self.timeout => {
                            if let Some(b) = self.bindings.get_mut(session) {
                                b.state = BindState::Expired;
                            }
                            let reason =
                                format!("not bound within {} s: {why}", self.timeout.as_secs());
                            self.record(session, "expired", reason, path, 0, None, (0, 0, 0));
                        }
                        Verdict::Wait(why) => tracing::debug!(session, "binding waits: {why}"),
                        Verdict::Refuse(refusal) => {
                            if let Some(b) = self.bindings.get_mut(session) {
                                b.state = BindState::Refused;
                            }
                            let reason = format!("not bound: {refusal}");
                            // The reason goes to the session's owner; the log also names
                            // the other session, for the operator.
                            if let super::confinement::Refusal::Overlap { other, .. } = &refusal {
                                tracing::warn!(session, other, "{reason}");
                            } else {
                                tracing::warn!(session, "{reason}");
                            }
                            self.record(session, "refused", reason, path, 0, None, (0, 0, 0));
                        }
                    }
                }
                Ok(None) if b.since.elapsed() >= self.timeout => {
                    let reason = format!(
                        "no cgroup for {} appeared within {} s",
                        b.spec.target,
                        self.timeout.as_secs()
                    );
                    if let Some(b) = self.bindings.get_mut(session) {
                        b.state = BindState::Expired;
                    }
                    self.record(
                        session,
                        "expired",
                        reason,
                        String::new(),
                        0,
                        None,
                        (0, 0, 0),
                    );
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(session, "binding: {e}"),
            },
            BindState::Bound => {
                let Some(dir) = b.dir.clone() else {
                    return;
                };
                let members = self.tree.members(&dir);
                if members.is_empty() {
                    self.unbind(session, "its cgroup was removed");
                    if let Some(b) = self.bindings.get_mut(session) {
                        b.since = Instant::now();
                    }
                    return;
                }
                self.map_members(session, &members);
                self.hold_stopped_workload(session);
            }
        }
    }

    /// Holds a stopped workload stopped: once every process its memory policy stopped is in the
    /// stopped state, its cgroup is held frozen, so a `SIGCONT` from inside does nothing (only a
    /// resume through the agent lets it go). Frozen only then, because a cgroup frozen before a
    /// process finished stopping leaves it asleep, not stopped. A process continued in between
    /// is stopped again.
    fn hold_stopped_workload(&mut self, session: &str) {
        let Some(b) = self.bindings.get_mut(session) else {
            return;
        };
        if b.held || b.stopped.is_empty() {
            return;
        }
        let mut all_stopped = true;
        let mut continued = Vec::new();
        b.stopped
            .retain(|&pid| match self.kernel.signals.is_stopped(pid) {
                None => false,
                Some(true) => true,
                Some(false) => {
                    all_stopped = false;
                    continued.push(pid);
                    true
                }
            });
        if b.stopped.is_empty() {
            return;
        }
        let rel = b
            .dir
            .as_deref()
            .map(|d| self.tree.relative(d))
            .unwrap_or_default();
        for pid in continued {
            // Continued by someone but the agent while the stop settled: stopped again. (A
            // process still on its way to stopping is signalled twice, which changes nothing.)
            if self.kernel.signals.send(pid, libc::SIGSTOP).is_ok() {
                tracing::debug!(
                    session,
                    pid,
                    "a stopped process not yet stopped: SIGSTOP again"
                );
            }
        }
        if all_stopped {
            self.hold_stopped(session, true);
            if let Some(b) = self.bindings.get_mut(session) {
                b.held = true;
            }
            let reason = "the stopped workload's cgroup is held frozen until it is resumed \
                          through the agent"
                .to_owned();
            self.record(session, "hold", reason, rel, 0, None, (0, 0, 0));
        }
    }

    /// Maps the quota onto `dir` and its children.
    fn bind(&mut self, session: &str, dir: PathBuf) {
        let members = self.tree.members(&dir);
        let Some(&(key, _)) = members.first() else {
            return;
        };
        let Some(b) = self.bindings.get(session) else {
            return;
        };
        let mut quota = Quota {
            memory_policy: super::quota::kernel_code(b.spec.memory_policy),
            flags: quota_flags::DEVICES,
            ..Quota::default()
        };
        for d in &b.spec.devices {
            quota.limit[d.index as usize % MAX_GPUS] = d.memory_bytes;
            // A MIG instance is opened by its parent's node (and its capability nodes).
            quota.devices |= 1u64 << (d.node_minor() % 64);
        }
        // A restarted agent finds the quota in the pinned map: keep what the kernel counted.
        // (A fresh one starts at zero; mapping its cgroups adds what they hold.)
        if let Some(old) = self.kernel.maps.quotas.get(&key) {
            quota.used = old.used;
            quota.actions = old.actions;
            quota.denied_opens = old.denied_opens;
        }
        if let Err(e) = self.kernel.maps.quotas.insert(key, quota) {
            tracing::error!(session, "cannot write the quota: {e}");
            return;
        }
        let caps: Vec<u32> = b
            .spec
            .devices
            .iter()
            .filter_map(|d| d.mig.as_ref())
            .flat_map(|m| m.cap_minors.iter().copied())
            .collect();
        self.kernel.devices.allow_caps(key, &caps);
        self.kernel.devices.attach(key, &dir);
        let driver_limited = set_driver_limits(&mut self.kernel, session, &dir, &b.spec);
        let rel = self.tree.relative(&dir);
        if let Some(throttle) = &self.throttle {
            // A memory-only part has no compute share to keep.
            for d in b.spec.devices.iter().filter(|d| d.shares_ppm > 0) {
                let member = throttle::Member {
                    cgroup_dir: dir.clone(),
                    share_ppm: d.shares_ppm,
                    policy: b.spec.compute_policy,
                };
                if let Err(e) = throttle.set(d.index, key, member) {
                    tracing::warn!(session, "compute share not enforced: {e}");
                }
            }
        }
        let reason = format!(
            "{} bound at {rel}: {} bytes of GPU memory, {:.2} GPU, memory policy {}, compute {}",
            b.spec.target,
            b.spec.memory_bytes(),
            b.spec.shares(),
            b.spec.memory_policy,
            b.spec.compute_policy
        );
        if let Some(b) = self.bindings.get_mut(session) {
            b.state = BindState::Bound;
            b.dir = Some(dir);
            b.key = Some(key);
            b.driver_limited = driver_limited;
        }
        self.map_members(session, &members);
        self.record(session, "bound", reason, rel, 0, None, (0, 0, 0));
    }

    /// Maps cgroups new below a bound one (a new container in a pod).
    fn map_members(&mut self, session: &str, members: &[(u64, PathBuf)]) {
        let Some(b) = self.bindings.get_mut(session) else {
            return;
        };
        let Some(key) = b.key else {
            return;
        };
        for (id, _) in members {
            if b.members.contains(id) {
                continue;
            }
            // Mapped already (by an agent before a restart): its bytes are in the quota.
            let mapped = self.kernel.maps.cgroup_quota.get(id) == Some(key);
            if !mapped {
                seed_member(&mut self.kernel, key, *id);
            }
            if let Err(e) = self.kernel.maps.cgroup_quota.insert(*id, key) {
                tracing::error!(
                    session,
                    cgroup = id,
                    "cannot map the cgroup to its quota: {e}"
                );
                continue;
            }
            b.members.insert(*id);
        }
    }

    /// Removes the quota from the kernel side; the binding waits again.
    fn unbind(&mut self, session: &str, why: &str) {
        let Some(b) = self.bindings.get_mut(session) else {
            return;
        };
        if b.state != BindState::Bound {
            return;
        }
        for id in std::mem::take(&mut b.members) {
            if let Err(e) = self.kernel.maps.cgroup_quota.remove(&id) {
                tracing::warn!(session, cgroup = id, "cgroup mapping not removed: {e}");
            }
        }
        let rel = b
            .dir
            .as_deref()
            .map(|d| self.tree.relative(d))
            .unwrap_or_default();
        if let Some(key) = b.key.take() {
            if let Err(e) = self.kernel.maps.quotas.remove(&key) {
                tracing::warn!(session, "quota not removed: {e}");
            }
            self.kernel.devices.detach(key);
            let gpus = std::mem::take(&mut b.driver_limited);
            if let (Some(driver), Some(dir)) = (self.kernel.driver_limits.as_mut(), &b.dir)
                && !gpus.is_empty()
                && let Err(e) = driver.lift(dir, &gpus)
            {
                tracing::warn!(session, "the driver's memory limit is not lifted: {e}");
            }
            if let Some(throttle) = &self.throttle
                && let Err(e) = throttle.remove(key)
            {
                tracing::warn!(session, "compute share not released: {e}");
            }
        }
        b.dir = None;
        b.state = BindState::Pending;
        b.stopped.clear();
        // Removing it from the throttle thawed it.
        b.held = false;
        self.record(session, "unbound", why.to_owned(), rel, 0, None, (0, 0, 0));
    }

    /// Ties a kernel event to its session and records it; other events are ignored.
    pub(crate) fn on_kernel_event(&mut self, e: &Event, tier: MemoryTier) {
        let Some((session, rel)) = self.session_of_cgroup(e.cgroup) else {
            return;
        };
        match e.kind {
            kind::QUOTA_EXCEEDED => {
                let (name, what) = match e.code {
                    action::DENY => ("deny", "refused with ENOMEM"),
                    action::KILL => ("kill", "killed (SIGKILL)"),
                    action::STOP => ("stop", "stopped (SIGSTOP)"),
                    _ => ("report", "reported"),
                };
                if e.code == action::STOP
                    && let Some(b) = self.bindings.get_mut(&session)
                {
                    b.stopped.insert(e.tgid);
                }
                let reason = format!(
                    "allocation of {} bytes on GPU {} would bring the quota to {} of {} bytes: {what} ({})",
                    e.bytes,
                    e.device,
                    e.used.saturating_add(e.bytes),
                    e.limit,
                    tier.as_str()
                );
                self.record(
                    &session,
                    name,
                    reason,
                    rel,
                    e.tgid,
                    Some(e.device),
                    (e.bytes, e.used, e.limit),
                );
            }
            kind::DEVICE_DENIED => {
                let reason = if e.code == 2 {
                    format!(
                        "open of /dev/nvidia{} refused: the workload holds its budget of GPU fds",
                        e.device
                    )
                } else {
                    format!(
                        "open of /dev/nvidia{} refused: not allocated to this workload",
                        e.device
                    )
                };
                self.record(
                    &session,
                    "device_denied",
                    reason,
                    rel,
                    e.tgid,
                    Some(e.device),
                    (0, 0, 0),
                );
            }
            _ => {}
        }
    }

    /// The session and cgroup path a cgroup id is mapped under.
    fn session_of_cgroup(&self, cgroup: u64) -> Option<(String, String)> {
        self.bindings.iter().find_map(|(s, b)| {
            b.members.contains(&cgroup).then(|| {
                let rel = b
                    .dir
                    .as_deref()
                    .map(|d| self.tree.relative(d))
                    .unwrap_or_default();
                (s.clone(), rel)
            })
        })
    }

    /// Records a deviation the share watch raised on one of `session`'s containers and sends
    /// it up as a `share_deviation` event: a report, nothing is done to the workload. A session
    /// this node holds no quota for is ignored (it was released meanwhile).
    pub(crate) fn share_deviation(&mut self, session: &str, cgroup_path: String, reason: String) {
        if !self.bindings.contains_key(session) {
            return;
        }
        let action = gpuwarden_types::event::Action::ShareDeviation;
        self.record(
            session,
            action.as_str(),
            reason,
            cgroup_path,
            0,
            None,
            (0, 0, 0),
        );
    }

    /// Compares NVML's per-process memory with each bound quota's limits and acts, by the
    /// quota's policy, on workloads the decoder let past their limit (once per crossing).
    pub(crate) fn cross_check(&mut self, samples: &[ProcessMemory]) {
        // A process can be listed as both compute and graphics: count it once.
        let mut by_process: BTreeMap<(u32, u32), u64> = BTreeMap::new();
        for s in samples {
            let bytes = by_process.entry((s.index, s.pid)).or_default();
            *bytes = (*bytes).max(s.bytes);
        }
        // (session, GPU) → (bytes, largest process, its bytes).
        let mut totals: BTreeMap<(String, u32), (u64, u32, u64)> = BTreeMap::new();
        for (&(index, pid), &bytes) in &by_process {
            let Some(cgroup) = self.tree.cgroup_id_of_pid(pid) else {
                continue;
            };
            let Some((session, _)) = self.session_of_cgroup(cgroup) else {
                continue;
            };
            let t = totals.entry((session, index)).or_default();
            t.0 += bytes;
            if bytes > t.2 {
                (t.1, t.2) = (pid, bytes);
            }
        }
        let over: BTreeSet<(String, u32)> = totals
            .iter()
            .filter(|((session, index), (nvml_used, _, _))| {
                let Some(b) = self.bindings.get(session) else {
                    return false;
                };
                let Some(limit) = b.spec.devices.iter().find(|d| d.index == *index) else {
                    return false;
                };
                let kernel_used = b
                    .key
                    .and_then(|k| self.kernel.maps.quotas.get(&k))
                    .map_or(0, |q| q.used[*index as usize % MAX_GPUS]);
                missed_by_decoder(limit.memory_bytes, kernel_used, *nvml_used)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in &over {
            if self.cross_checked.contains(key) {
                continue;
            }
            let (session, index) = key;
            let Some(&(nvml_used, pid, _)) = totals.get(key) else {
                continue;
            };
            let Some(b) = self.bindings.get_mut(session) else {
                continue;
            };
            let limit = b
                .spec
                .devices
                .iter()
                .find(|d| d.index == *index)
                .map_or(0, |d| d.memory_bytes);
            let (name, signal) = match b.spec.memory_policy {
                MemoryPolicy::Kill => ("kill", Some(libc::SIGKILL)),
                MemoryPolicy::Stop => ("stop", Some(libc::SIGSTOP)),
                MemoryPolicy::Report => ("report", None),
            };
            if let Some(signal) = signal {
                if let Err(e) = self.kernel.signals.send(pid, signal) {
                    tracing::warn!(session, pid, "cross-check could not signal: {e}");
                }
                if signal == libc::SIGSTOP {
                    b.stopped.insert(pid);
                }
            }
            let rel = b
                .dir
                .as_deref()
                .map(|d| self.tree.relative(d))
                .unwrap_or_default();

            let reason = format!(
                "NVML counts {nvml_used} bytes for the workload on GPU {index}, over its limit of {limit}, which the ioctl decoder did not see: {name} (NVML cross-check)"
            );
            self.record(
                &session.clone(),
                name,
                reason,
                rel,
                pid,
                Some(*index),
                (0, nvml_used, limit),
            );
        }
        self.cross_checked = over;
    }

    /// Sends `signal` (SIGCONT or SIGKILL) to a process of a bound workload, by request,
    /// through the pidfd that pinned it before its owner was checked.
    ///
    /// # Errors
    /// The process is in no bound workload, or can't be signalled (it ended meanwhile).
    pub(crate) fn signal(
        &mut self,
        process: &Pinned,
        resume: bool,
    ) -> Result<String, ControlError> {
        let pid = process.pid();
        let cgroup = self
            .tree
            .cgroup_id_of_pid(pid)
            .ok_or(ControlError::NotBound(pid))?;
        let (session, rel) = self
            .session_of_cgroup(cgroup)
            .ok_or(ControlError::NotBound(pid))?;
        let signal = if resume { libc::SIGCONT } else { libc::SIGKILL };
        let last_stopped = self
            .bindings
            .get(&session)
            .is_some_and(|b| b.held && b.stopped.len() == 1 && b.stopped.contains(&pid));
        if resume && last_stopped {
            // Thawed before the signal, so the process runs as soon as it is continued.
            self.hold_stopped(&session, false);
        }
        self.kernel
            .signals
            .send_pinned(process, signal)
            .map_err(|source| ControlError::Signal { pid, source })?;
        if let Some(b) = self.bindings.get_mut(&session) {
            b.stopped.remove(&pid);
            if last_stopped {
                b.held = false;
            }
        }
        if !resume && last_stopped {
            self.hold_stopped(&session, false);
        }
        let (name, what) = if resume {
            ("resume", "resumed (SIGCONT) by request")
        } else {
            ("kill", "killed (SIGKILL) by request")
        };
        self.record(&session, name, what.to_owned(), rel, pid, None, (0, 0, 0));
        Ok(session)
    }

    /// Holds the bound cgroup of `session` frozen (or lets go): a process stopped by its memory
    /// policy then stays stopped even if something in its container sends it `SIGCONT`; only a
    /// resume through the agent lets it run (docs/threat-model.md).
    fn hold_stopped(&self, session: &str, held: bool) {
        let Some(b) = self.bindings.get(session) else {
            return;
        };
        let (Some(key), Some(dir), Some(throttle)) = (b.key, b.dir.clone(), &self.throttle) else {
            tracing::warn!(
                session,
                "stop not held by freezing: no bound cgroup or no throttle"
            );
            return;
        };
        if let Err(e) = throttle.hold(key, dir, held) {
            tracing::warn!(session, "stop not held by freezing: {e}");
        }
    }

    /// The cgroup directory of `session`'s binding, and whether it is bound.
    ///
    /// # Errors
    /// The session has no quota here.
    pub(crate) fn session_cgroup(&self, session: &str) -> Result<(PathBuf, bool), ControlError> {
        let b = self
            .bindings
            .get(session)
            .ok_or_else(|| ControlError::NoSession(session.to_owned()))?;
        let dir = b.dir.clone().unwrap_or_else(|| match &b.spec.target {
            Target::Managed => self.tree.managed_dir(session),
            Target::CgroupPath(p) => self.tree.root().join(p.trim_start_matches('/')),
            _ => PathBuf::new(),
        });
        Ok((dir, b.state == BindState::Bound))
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "each input is a different part it is wired to"
    )]
    fn record(
        &mut self,
        session: &str,
        action: &str,
        reason: String,
        cgroup_path: String,
        pid: u32,
        device: Option<u32>,
        (requested_bytes, used_bytes, limit_bytes): (u64, u64, u64),
    ) {
        let mut reason = reason;
        if WORKLOAD_ACTIONS.contains(&action) {
            match self.limiter.admit(session, Instant::now()) {
                None => return,
                Some(0) => {}
                Some(held_back) => {
                    use std::fmt::Write as _;
                    let _ = write!(
                        reason,
                        " ({held_back} more like it from this session were counted but not sent)"
                    );
                }
            }
        }
        let record = Record {
            session_id: session.to_owned(),
            action: action.into(),
            reason,
            cgroup_path,
            pid,
            device,
            requested_bytes,
            used_bytes,
            limit_bytes: if limit_bytes == NO_LIMIT {
                0
            } else {
                limit_bytes
            },
            at_ms: gpuwarden_types::now_ms(),
        };
        tracing::info!(session, action, pid, "{}", record.reason);
        if self.upward.try_send(record_to_pb(&record)).is_err() {
            self.dropped_upward += 1;
        }
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(record);
    }
}

/// Sets the quota's memory limits as the driver's own (`dmem.max`) on `dir` where the node has
/// that tier; the GPUs it set. A failure leaves the eBPF tiers enforcing, and says so.
fn set_driver_limits(
    kernel: &mut Kernel,
    session: &str,
    dir: &std::path::Path,
    spec: &QuotaSpec,
) -> Vec<u32> {
    let Some(driver) = kernel.driver_limits.as_mut() else {
        return Vec::new();
    };
    let limits: Vec<(u32, u64)> = spec
        .devices
        .iter()
        .filter(|d| d.memory_bytes != 0 && d.memory_bytes != NO_LIMIT)
        .map(|d| (d.index, d.memory_bytes))
        .collect();
    match driver.set(dir, &limits) {
        Ok(set) => set,
        Err(e) => {
            tracing::warn!(session, "the driver's memory limit is not set: {e}");
            Vec::new()
        }
    }
}

/// Adds what a newly mapped cgroup already holds to its quota (bytes charged before the bind).
fn seed_member(kernel: &mut Kernel, key: u64, id: u64) {
    let Some(mut quota) = kernel.maps.quotas.get(&key) else {
        return;
    };
    let mut changed = false;
    for (slot, used) in quota.used.iter_mut().enumerate() {
        let k = CgroupDeviceKey {
            cgroup: id,
            device: slot_device(slot),
            kind: memory_kind::VIDEO,
        };
        if let Some(bytes) = kernel.maps.cgroup_memory.get(&k) {
            *used += bytes;
            changed = true;
        }
    }
    if changed && let Err(e) = kernel.maps.quotas.insert(key, quota) {
        tracing::warn!(
            cgroup = id,
            "bytes it held before the bind not counted: {e}"
        );
    }
}

#[cfg(test)]
mod tests;
