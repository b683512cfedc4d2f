//! Reclaim by preemption (issue 24 §2): when a pending session within its queue's guarantee
//! finds no room that borrowers hold, or a lower-priority session of its own queue holds it,
//! the pass picks the fewest victims ([`super::quotas::choose_victims`]) whose release makes it
//! fit on some node, marks them preempting and sends each node a `Preempt`. A victim keeps its
//! allocation until its agent reports the workload gone; it then ends [`SessionState::Preempted`]
//! and the waiting session is placed on a later pass, so no device is ever over-committed.

use std::collections::BTreeMap;

use super::{
    Command, Scheduler,
    quotas::{Candidate, Cause, QuotaConfig, Requester, Victim, choose_victims},
    set_state,
};
use crate::{
    allocator::{Allocation, DevicePart, DeviceState, GpuRequest},
    node::{Node, NodeState},
    session::{DecisionKind, Home, Origin, PreemptionMode, Session, SessionState, now_ms},
    slots::{ResourceSlot, SlotValue},
};

/// What a reclaim decided for a waiting session.
pub(super) struct Reclaim {
    /// Preemptions to send.
    pub commands: Vec<Command>,
    /// Why the session still waits.
    pub reason: String,
}

/// Each candidate's sessions (id, node, request): itself, or a gang's live members.
pub(super) type Units = BTreeMap<String, Vec<(String, String, ResourceSlot)>>;

/// The sessions a pass's reclaims may free: gathered once, on the pass's first reclaim, and kept
/// up to date as it preempts. Nothing else changes them during a pass (placing only schedules
/// sessions, and only an agent's answer makes one run or end), so a pass looks at every session
/// once rather than once per waiting session.
#[derive(Debug, Default)]
pub(super) struct Reclaimable {
    /// Sessions being preempted that still hold resources: (id, node, requested).
    pub(super) in_flight: Vec<(String, String, ResourceSlot)>,
    /// Running sessions that may yield; a running gang is one candidate (issue 24 §3), named
    /// by its first member, its members' requests summed.
    pub(super) candidates: Vec<Candidate>,
    /// Each candidate's sessions, which preempting it ends.
    pub(super) units: Units,
    /// Which waiting session each session in flight is being preempted for (none: stored
    /// before that was kept, and free for any).
    pub(super) earmarked: BTreeMap<String, String>,
}

impl Reclaimable {
    /// The sessions in flight whose release `waiter` may count on: those preempted for it, for
    /// a session that no longer waits (`waits` says which still do), or for none recorded.
    /// Room on its way to another waiting session is that session's: counting it for a second
    /// one would leave the second waiting a whole grace period for room it never gets.
    fn freed_for(
        &self,
        waiter: &str,
        waits: impl Fn(&str) -> bool,
    ) -> Vec<(&str, &str, &ResourceSlot)> {
        self.in_flight
            .iter()
            .filter(|(victim, _, _)| {
                self.earmarked
                    .get(victim)
                    .is_none_or(|w| w == waiter || !waits(w))
            })
            .map(|(s, n, r)| (s.as_str(), n.as_str(), r))
            .collect()
    }
}

/// What a waiting session (or gang) does about the room it lacks.
pub(super) enum Plan {
    /// The sessions already being preempted make room once released: wait for them.
    Wait(Reclaim),
    /// Preempt these candidates (a gang's stands for all its members).
    Preempt(Vec<Victim>),
}

/// Decides for `asker`, given what reclaim may free: `fits(freed)` says whether it would fit with
/// the sessions `freed` (id, node, request) released. Sessions already in flight count as freed:
/// while their release makes room, nothing more is preempted. `None`: no allowed set of victims
/// makes room.
pub(super) fn plan(
    quotas: &QuotaConfig,
    known: &Reclaimable,
    held: &BTreeMap<Option<String>, ResourceSlot>,
    (waiter, asker): (&str, Requester<'_>),
    waits: impl Fn(&str) -> bool,
    fits: impl Fn(&[(&str, &str, &ResourceSlot)]) -> bool,
) -> Option<Plan> {
    let in_flight = known.freed_for(waiter, waits);
    if !in_flight.is_empty() && fits(&in_flight) {
        let names: Vec<&str> = in_flight.iter().map(|(s, _, _)| *s).collect();
        return Some(Plan::Wait(Reclaim {
            commands: Vec::new(),
            reason: format!(
                "waits for preempted sessions to release their resources: {}",
                names.join(", ")
            ),
        }));
    }
    let victims = choose_victims(quotas, held, asker, &known.candidates, |chosen| {
        let mut freed = in_flight.clone();
        freed.extend(chosen.iter().flat_map(|c| {
            known
                .units
                .get(&c.id)
                .into_iter()
                .flatten()
                .map(|(sid, node, requested)| (sid.as_str(), node.as_str(), requested))
        }));
        fits(&freed)
    })?;
    Some(Plan::Preempt(victims))
}

impl Scheduler {
    /// What reclaim may free now.
    pub(super) fn reclaimable(&self) -> Reclaimable {
        let quotas = &self.config.quotas;
        let mut known = Reclaimable::default();
        let mut gangs = std::collections::BTreeSet::new();
        for s in self.sessions.values() {
            let Some(node) = &s.node else { continue };
            if s.preempting.is_some() {
                if s.state.holds_resources() {
                    known
                        .in_flight
                        .push((s.id.clone(), node.clone(), s.requested.clone()));
                    if let Some(waiter) = &s.preempted_for {
                        known.earmarked.insert(s.id.clone(), waiter.clone());
                    }
                }
            } else if may_yield(s) {
                let members: Vec<&Session> = match &s.gang {
                    None => vec![s],
                    // A gang yields whole: preempting one member preempts all, so that no
                    // partial gang keeps GPUs. One with a member not running is no candidate.
                    Some(g) if gangs.insert((s.owner.clone(), g.name.clone())) => {
                        let members = self.live_members(&s.owner, &g.name);
                        if !members.iter().all(|m| may_yield(m) && m.node.is_some()) {
                            continue;
                        }
                        members
                    }
                    Some(_) => continue,
                };
                let requested = super::fit::summed(&members);
                known.candidates.push(Candidate {
                    id: s.id.clone(),
                    queue: quotas.queue_of(&s.owner).map(str::to_owned),
                    priority: members
                        .iter()
                        .map(|m| m.priority)
                        .max()
                        .unwrap_or(s.priority),
                    seq: members.iter().map(|m| m.seq).max().unwrap_or(s.seq),
                    requested,
                    preemptible: members.iter().all(|m| !m.no_preempt),
                });
                let unit = members
                    .iter()
                    .filter_map(|m| Some((m.id.clone(), m.node.clone()?, m.requested.clone())))
                    .collect();
                known.units.insert(s.id.clone(), unit);
            }
        }
        known
    }

    /// The sessions `victims` (candidates) stand for: each one's unit, a gang's every member.
    pub(super) fn unit_victims(known: &Reclaimable, victims: Vec<Victim>) -> Vec<Victim> {
        victims
            .into_iter()
            .flat_map(|v| {
                let members = known.units.get(&v.id).cloned().unwrap_or_default();
                members
                    .into_iter()
                    .map(move |(id, _, _)| Victim { id, cause: v.cause })
            })
            .collect()
    }

    /// The sessions `commands` preempt are in flight now, their candidates no longer ones.
    pub(super) fn now_in_flight(&self, known: &mut Reclaimable, commands: &[Command]) {
        for command in commands {
            let Command::Preempt { node, session, .. } = command else {
                continue;
            };
            if let Some(at) = known.candidates.iter().position(|c| c.id == *session) {
                known.candidates.remove(at);
                known.units.remove(session);
            }
            let Some(victim) = self.sessions.get(session) else {
                continue;
            };
            let requested = victim.requested.clone();
            if let Some(waiter) = &victim.preempted_for {
                known.earmarked.insert(session.clone(), waiter.clone());
            }
            // In id order, as the sessions are: the reason lists them so.
            let slot = known
                .in_flight
                .partition_point(|(s, _, _)| s.as_str() < session.as_str());
            known
                .in_flight
                .insert(slot, (session.clone(), node.clone(), requested));
        }
    }

    /// Preempts what session `id` (of `queue`) needs, if a set of allowed victims makes room;
    /// `None` when none does. Sessions already being preempted count as freed: while their
    /// release makes room, nothing more is preempted. `known` is what the pass's reclaims may
    /// free (`None` before its first reclaim).
    pub(super) fn reclaim(
        &mut self,
        id: &str,
        queue: Option<&str>,
        held: &BTreeMap<Option<String>, ResourceSlot>,
        known: &mut Option<Reclaimable>,
    ) -> Option<Reclaim> {
        let known = known.get_or_insert_with(|| self.reclaimable());
        if known.in_flight.is_empty() && known.candidates.is_empty() {
            return None;
        }
        let session = self.sessions.get(id)?;
        let gpu = GpuRequest::from_slots(&session.requested).ok()?;
        let non_gpu = Node::non_gpu(&session.requested);
        let pinned = session.pinned_node.clone();
        let (priority, request) = (session.priority, session.requested.clone());
        // Would the request fit on some node with `freed` (id, node, requested) released?
        let fits_freeing = |freed: &[(&str, &str, &ResourceSlot)]| {
            self.nodes.iter().any(|(nid, n)| {
                if n.state != NodeState::Ready || pinned.as_ref().is_some_and(|p| p != nid) {
                    return false;
                }
                // A node that frees nothing did not fit a moment ago: no copy of it is made.
                let here: Vec<_> = freed.iter().filter(|f| f.1 == nid).collect();
                if here.is_empty() {
                    return false;
                }
                let mut n = n.clone();
                for &&(sid, _, requested) in &here {
                    n.allocator.release(sid);
                    n.unreserve(requested);
                }
                (non_gpu.is_zero() || n.non_gpu_fits(&non_gpu)) && n.allocator.can_fit(&gpu)
            })
        };
        let asker = Requester {
            queue,
            priority,
            request: &request,
        };
        let plan = self.plan_for(known, held, (id, asker), fits_freeing)?;
        Some(self.carry_out(known, id, queue, plan))
    }

    /// Whether session `id` still waits to be placed.
    pub(super) fn waits(&self, id: &str) -> bool {
        self.sessions
            .get(id)
            .is_some_and(|s| s.state == SessionState::Pending)
    }

    /// [`plan`] for `waiter` under this scheduler's team queues, counting as freed for it the
    /// in-flight victims earmarked for it or for a session that no longer waits.
    pub(super) fn plan_for(
        &self,
        known: &Reclaimable,
        held: &BTreeMap<Option<String>, ResourceSlot>,
        asking: (&str, Requester<'_>),
        fits: impl Fn(&[(&str, &str, &ResourceSlot)]) -> bool,
    ) -> Option<Plan> {
        plan(
            &self.config.quotas,
            known,
            held,
            asking,
            |w| self.waits(w),
            fits,
        )
    }

    /// Carries `plan` out for waiting session `waiter` (of `queue`): marks the victims (every
    /// member of a gang chosen) preempting, and keeps `known` up to date with them.
    pub(super) fn carry_out(
        &mut self,
        known: &mut Reclaimable,
        waiter: &str,
        queue: Option<&str>,
        plan: Plan,
    ) -> Reclaim {
        match plan {
            Plan::Wait(reclaim) => reclaim,
            Plan::Preempt(victims) => {
                let victims = Self::unit_victims(known, victims);
                let reclaim = self.preempt_victims(waiter, queue, &victims);
                self.now_in_flight(known, &reclaim.commands);
                reclaim
            }
        }
    }

    /// Marks `victims` preempting for waiting session `waiter` and makes their commands.
    pub(super) fn preempt_victims(
        &mut self,
        waiter: &str,
        queue: Option<&str>,
        victims: &[Victim],
    ) -> Reclaim {
        let grace_ms = self.config.preemption_grace_ms;
        let waiter_priority = self.sessions.get(waiter).map_or(0, |s| s.priority);
        let mut commands = Vec::new();
        let mut names = Vec::new();
        let mut preempted = Vec::new();
        for victim in victims {
            let victim_queue = self
                .sessions
                .get(&victim.id)
                .and_then(|s| self.config.quotas.queue_of(&s.owner).map(str::to_owned));
            let mode = self
                .sessions
                .get(&victim.id)
                .map_or(PreemptionMode::Kill, |s| self.preemption_mode(s));
            let Some(s) = self.sessions.get_mut(&victim.id) else {
                continue;
            };
            let Some(node) = s.node.clone() else {
                continue;
            };
            let rule = match victim.cause {
                Cause::Reclaim => format!(
                    "queue {} reclaims its guarantee from queue {}, which borrowed past its own",
                    queue.unwrap_or("-"),
                    victim_queue.as_deref().unwrap_or("-"),
                ),
                Cause::Priority => format!(
                    "priority {waiter_priority} over {} in queue {}",
                    s.priority,
                    queue.unwrap_or("-"),
                ),
            };
            let why = format!("preempted for {waiter}: {rule}");
            s.reason = match mode {
                PreemptionMode::Kill => format!("being preempted ({grace_ms} ms grace): {why}"),
                PreemptionMode::Suspend => format!("being suspended: {why}"),
            };
            s.preempting = Some(why.clone());
            s.preempted_for = Some(waiter.to_owned());
            s.updated_at_ms = crate::session::now_ms();
            s.record_decision(DecisionKind::Yielded, why.clone());
            self.changes.sessions.insert(victim.id.clone());
            names.push(victim.id.clone());
            preempted.push(format!("{} on {node} ({rule})", victim.id));
            commands.push(Command::Preempt {
                node,
                session: victim.id.clone(),
                grace_ms,
                reason: why,
                mode,
            });
        }
        if let Some(w) = self.sessions.get_mut(waiter)
            && !preempted.is_empty()
        {
            w.record_decision(DecisionKind::Preempted, preempted.join("; "));
            self.changes.sessions.insert(waiter.to_owned());
        }
        Reclaim {
            commands,
            reason: format!(
                "waits for preempted sessions to release their resources: {}",
                names.join(", ")
            ),
        }
    }

    /// The agent on `node` reports `session`'s preempted workload gone: it ends
    /// [`SessionState::Preempted`] with the reason it was preempted for, and what it held is
    /// released. Returns whether it ended.
    pub(super) fn preempted(&mut self, node: &str, session: &str) -> bool {
        let Some(s) = self.sessions.get_mut(session) else {
            return false;
        };
        if s.node.as_deref() != Some(node) || !s.state.holds_resources() {
            return false;
        }
        s.preempted_for = None;
        let reason = s
            .preempting
            .take()
            .unwrap_or_else(|| "preempted on its node".to_owned());
        self.finish(session, SessionState::Preempted, &reason);
        true
    }
}

impl Scheduler {
    /// How `s` yields when preempted: as it said, else as its queue does, else kill.
    pub(super) fn preemption_mode(&self, s: &Session) -> PreemptionMode {
        s.preemption.unwrap_or_else(|| {
            if self
                .config
                .quotas
                .queue_of(&s.owner)
                .is_some_and(|q| self.config.suspend_queues.contains(q))
            {
                PreemptionMode::Suspend
            } else {
                PreemptionMode::Kill
            }
        })
    }

    /// The agent on `node` suspended `session` (issue 38): it holds no GPU from now on; it
    /// keeps a home (its node and the GPUs it left) where it is resumed when room returns
    /// ([`Self::resume_suspended`]).
    pub(super) fn suspended(&mut self, node: &str, session: &str, host_bytes: u64) {
        let Some(s) = self.sessions.get_mut(session) else {
            return;
        };
        // Only a suspension this controller asked for frees the session's resources: one an
        // operator made on the node through the agent's socket keeps them booked.
        if s.node.as_deref() != Some(node) || !s.state.holds_resources() || s.preempting.is_none() {
            return;
        }
        let yielded_to = s.preempted_for.take().unwrap_or_default();
        let why = s.preempting.take().unwrap_or_default();
        let home = Home {
            node: node.to_owned(),
            allocation: s.allocation.clone(),
            since_ms: now_ms(),
            yielded_to,
            host_bytes,
            home_only: false,
        };
        let footprint = host_footprint(&home);
        let devices: Vec<String> = home
            .allocation
            .parts
            .iter()
            .map(|p| p.index.to_string())
            .collect();
        let reason = format!(
            "suspended ({why}); waits to resume on {node}, GPUs {}",
            devices.join(",")
        );
        s.record_decision(DecisionKind::Suspended, reason.clone());
        set_state(s, SessionState::Suspended, &reason);
        s.home = Some(home);
        s.node = None;
        let (owner, requested) = (s.owner.clone(), s.requested.clone());
        // It holds nothing while suspended: the concurrency caps count it again on resume.
        self.tracker.remove(&owner, session);
        self.changes.sessions.insert(session.to_owned());
        if let Some(n) = self.nodes.get_mut(node) {
            n.allocator.release(session);
            n.unreserve(&requested);
            // Its GPU memory now lives in the node's host memory.
            n.reserve(&footprint);
            self.changes.nodes.insert(node.to_owned());
            self.reindex(node);
        }
    }

    /// Books on `node` (`id`, at its registration) the host memory of the sessions suspended
    /// at home there.
    pub(super) fn book_suspended(&self, id: &str, node: &mut Node) {
        for s in self.sessions.values() {
            if s.state == SessionState::Suspended
                && let Some(h) = s.home.as_ref().filter(|h| h.node == id)
            {
                node.reserve(&host_footprint(h));
            }
        }
    }

    /// Resumes each suspended session that has room on its node again, once the session it
    /// yielded to no longer waits: on the GPUs it left where they have room, else (issue 38) on
    /// other GPUs of the same model there ([`resume_onto`]), unless its agent refused that
    /// before. They are booked for it and its agent is told to resume it there. Runs at the end
    /// of a pass.
    pub(super) fn resume_suspended(&mut self) -> Vec<Command> {
        let mut waiting: Vec<(u64, String)> = self
            .sessions
            .values()
            .filter(|s| s.state == SessionState::Suspended && s.home.is_some())
            .map(|s| (s.seq, s.id.clone()))
            .collect();
        waiting.sort();
        let mut commands = Vec::new();
        for (_, id) in waiting {
            let Some(s) = self.sessions.get(&id) else {
                continue;
            };
            let Some(home) = s.home.clone() else { continue };
            let lender_waits = self
                .sessions
                .get(&home.yielded_to)
                .is_some_and(|w| w.state == SessionState::Pending);
            if lender_waits {
                continue;
            }
            let Some(s) = self.sessions.get(&id) else {
                continue;
            };
            let Some(n) = self.nodes.get_mut(&home.node) else {
                continue;
            };
            if n.state != NodeState::Ready {
                continue;
            }
            let (allocation, onto) = if home_fits(n, &home) {
                (home.allocation.clone(), None)
            } else if let Some(other) = (!home.home_only)
                .then(|| resume_onto(n, &home.allocation))
                .flatten()
            {
                (other.clone(), Some(other))
            } else {
                continue;
            };
            n.allocator.restore(&id, allocation.clone());
            n.unreserve(&host_footprint(&home));
            n.reserve(&s.requested);
            self.changes.nodes.insert(home.node.clone());
            self.reindex(&home.node);
            let Some(s) = self.sessions.get_mut(&id) else {
                continue;
            };
            let away = (now_ms() - home.since_ms).max(0) / 1000;
            let gpus = match &onto {
                Some(other) => format!(
                    ", GPUs {} (suspended on {})",
                    indexes(other),
                    indexes(&home.allocation)
                ),
                None => format!(", GPUs {}", indexes(&allocation)),
            };
            s.node = Some(home.node.clone());
            s.allocation = allocation;
            set_state(
                s,
                SessionState::Running,
                &format!("resuming on {}{gpus} after {away} s suspended", home.node),
            );
            let owner = s.owner.clone();
            self.tracker.add(&owner, &id);
            self.changes.sessions.insert(id.clone());
            commands.push(Command::Resume {
                node: home.node,
                session: id,
                onto,
            });
        }
        commands
    }

    /// The agent on `node` resumed `session`: the story is told in its decisions.
    pub(super) fn resumed(&mut self, node: &str, session: &str) {
        let Some(s) = self.sessions.get_mut(session) else {
            return;
        };
        let Some(home) = s.home.take() else { return };
        if s.node.as_deref() != Some(node) {
            s.home = Some(home);
            return;
        }
        let away = (now_ms() - home.since_ms).max(0) / 1000;
        let whom = if home.yielded_to.is_empty() {
            String::new()
        } else {
            format!(" for {}", home.yielded_to)
        };
        let (now, left) = (indexes(&s.allocation), indexes(&home.allocation));
        let gpus = if now == left {
            format!("GPUs {now}")
        } else {
            format!("GPUs {now} of the same model (suspended on GPUs {left})")
        };
        s.record_decision(
            DecisionKind::Resumed,
            format!("resumed on {node}, {gpus}, after {away} s suspended{whom}"),
        );
        s.reason = String::new();
        s.updated_at_ms = now_ms();
        self.changes.sessions.insert(session.to_owned());
    }

    /// The agent on `node` refused to resume `session` on the other GPUs it was booked on:
    /// nothing moved there, so it is suspended again at home, its GPUs freed. Where its driver
    /// cannot restore onto other GPUs, it waits for the GPUs it left from now on; where a
    /// restart of the agent cut the move short (`interrupted`), it may be moved again.
    pub(super) fn resume_refused(&mut self, node: &str, session: &str, interrupted: bool) {
        let Some(s) = self.sessions.get_mut(session) else {
            return;
        };
        if s.node.as_deref() != Some(node) || s.state != SessionState::Running {
            return;
        }
        let Some(home) = s.home.as_mut() else { return };
        home.home_only |= !interrupted;
        let home = home.clone();
        let why = if interrupted {
            "its move to other GPUs was cut short by an agent restart"
        } else {
            "its node cannot restore it onto other GPUs"
        };
        let reason = format!(
            "suspended; {why}: waits to resume on {node}, GPUs {}",
            indexes(&home.allocation)
        );
        set_state(s, SessionState::Suspended, &reason);
        s.node = None;
        let (owner, requested) = (s.owner.clone(), s.requested.clone());
        self.tracker.remove(&owner, session);
        self.changes.sessions.insert(session.to_owned());
        if let Some(n) = self.nodes.get_mut(node) {
            n.allocator.release(session);
            n.unreserve(&requested);
            n.reserve(&host_footprint(&home));
            self.changes.nodes.insert(node.to_owned());
            self.reindex(node);
        }
    }
}

/// The GPU indexes of `allocation`, comma-separated.
fn indexes(allocation: &Allocation) -> String {
    allocation
        .parts
        .iter()
        .map(|p| p.index.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The model of GPU `index` on `n` as its agent reported it; `None` for a MIG instance (the
/// driver checkpoints none) or where the agent reported no model.
fn model_of(n: &Node, index: u32) -> Option<&str> {
    let at = n.report.devices.iter().position(|d| d.index == index)?;
    match n.report.device_models.get(at) {
        Some((model, false)) if !model.is_empty() => Some(model),
        _ => None,
    }
}

/// Other GPUs of `n` for a suspended session's `home` allocation (issue 38): for each part, in
/// order, a GPU of the same model as the one it left with room for the part, not taken by
/// another of its parts; the GPU it left where it has room. `None` where a part finds none
/// (the driver restores only onto the same chip type with enough memory).
fn resume_onto(n: &Node, home: &Allocation) -> Option<Allocation> {
    let devices = n.allocator.devices();
    let mut taken: Vec<u32> = Vec::new();
    let mut parts = Vec::new();
    for part in &home.parts {
        let model = model_of(n, part.index)?;
        let candidates = devices.iter().filter(|d| {
            !taken.contains(&d.spec.index)
                && model_of(n, d.spec.index) == Some(model)
                && part_fits(d, part)
        });
        let chosen = candidates
            .clone()
            .find(|d| d.spec.index == part.index)
            .or_else(|| candidates.min_by_key(|d| d.spec.index))?;
        taken.push(chosen.spec.index);
        parts.push(DevicePart {
            index: chosen.spec.index,
            uuid: chosen.spec.uuid.clone(),
            ..part.clone()
        });
    }
    Some(Allocation { parts })
}

/// Whether `part` has room on `d`: shares and memory, none held whole by another, and for a
/// part that holds its GPU whole, nothing else there.
fn part_fits(d: &DeviceState, part: &DevicePart) -> bool {
    !d.kubernetes
        && d.exclusive_owner.is_none()
        && (!part.exclusive || (d.allocated == SlotValue::ZERO && d.allocated_memory == 0))
        && d.allocated.saturating_add(part.shares) <= d.capacity
        && d.allocated_memory.saturating_add(part.memory_bytes) <= d.spec.memory_bytes
}

/// The host memory a suspended session's GPU memory takes on its node (issue 38): what its
/// agent counted, at least the GPU memory it was allocated; booked as the node's `mem` while it
/// is suspended.
pub(super) fn host_footprint(home: &Home) -> ResourceSlot {
    let bytes = home.host_bytes.max(home.allocation.memory_bytes());
    ResourceSlot::new().with(
        crate::slots::names::MEM,
        crate::slots::SlotValue::from_int(bytes),
    )
}

/// Whether the GPUs `home` left on `n` have room for it again (shares and memory, none held
/// whole by another).
fn home_fits(n: &Node, home: &Home) -> bool {
    home.allocation.parts.iter().all(|part| {
        n.allocator
            .devices()
            .iter()
            .find(|d| d.spec.index == part.index)
            .is_some_and(|d| part_fits(d, part))
    })
}

/// Whether `s` may be preempted now: running, placed by the controller, not already yielding.
fn may_yield(s: &Session) -> bool {
    s.state == SessionState::Running && s.origin == Origin::Controller && s.preempting.is_none()
}
