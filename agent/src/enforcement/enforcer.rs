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

use gpuwarden_agent_common::maps::{
    CgroupDeviceKey, MAX_GPUS, NO_LIMIT, Quota, memory_kind, quota_flags, slot_device,
};
use gpuwarden_proto::v1 as pb;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

pub use gpuwarden_agent_api::Record;

use super::{
    cgroup_tree::CgroupTree,
    confinement::{Rules, Verdict},
    kernel::Kernel,
    quota::{QuotaSpec, Target},
    suspend::{SuspendConfig, Suspension},
    throttle::{self, ThrottleHandle, ThrottleStats},
};

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
    /// Where the host's available memory is read before a suspension (`/proc/meminfo`).
    meminfo: std::path::PathBuf,
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
            meminfo: "/proc/meminfo".into(),
        }
    }

    /// The same, reading the host's available memory from `path` (a test's own meminfo).
    #[cfg(test)]
    #[must_use]
    pub(crate) fn with_meminfo(mut self, path: std::path::PathBuf) -> Self {
        self.meminfo = path;
        self
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

    /// [`Self::release`] on a `Release` (from the controller, the DRA plugin or the socket),
    /// then reports `released` (issue 40): the controller holds a terminating session's
    /// resources booked until it hears it, so it is reported even when nothing was bound here.
    pub(crate) fn release_on_request(&mut self, session: &str) {
        let why = if self.bindings.contains_key(session) {
            "released: its quota is no longer enforced"
        } else {
            "released: no quota of it was held here"
        };
        self.release(session);
        self.record(Happened::to(session, "released").because(why));
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

    /// The cgroup `session`'s quota is bound at, if it is bound.
    /// Whether `session`'s quota is here and still looks for its cgroup.
    pub(crate) fn awaits_binding(&self, session: &str) -> bool {
        self.bindings
            .get(session)
            .is_some_and(|b| b.state == BindState::Pending)
    }

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
                            self.record(Happened::to(session, "expired").at(path).because(reason));
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
                            self.record(Happened::to(session, "refused").at(path).because(reason));
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
                    self.record(Happened::to(session, "expired").because(reason));
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
            self.record(Happened::to(session, "hold").at(rel).because(reason));
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
        self.record(Happened::to(session, "bound").at(rel).because(reason));
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
        self.record(Happened::to(session, "unbound").at(rel).because(why));
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

mod control;
mod events;
mod preemption;

#[cfg(test)]
use self::events::{EVENT_BURST, HISTORY, missed_by_decoder};
pub(crate) use self::{control::ControlError, preemption::CheckpointJob};
use self::{
    events::{EventLimiter, Happened},
    preemption::Preemption,
};

#[cfg(test)]
mod tests;
