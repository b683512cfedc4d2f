//! Gangs (issue 24 §3): sessions of one owner placed all at once or not at all.
//!
//! A gang is named by its owner and its name. A pass takes a gang where its first pending member
//! stands in the queue: while fewer than `size` members exist it waits (not blocking the queue:
//! an incomplete gang is not ready to run); once all exist, its pending members are tried one
//! after another through the same predicates and placement as a single session, each seeing the
//! capacity the ones before took, and if any does not fit every reservation made for the others
//! is undone before anyone else is tried. No partial gang ever holds a device, and a gang that
//! does not fit counts as one failed session for the head-of-line rule (`skip_after`). Where
//! queues are configured, a gang short of room reclaims as one session asking for the sum of its
//! members, and a running gang is one candidate for others' reclaim (`reclaim.rs`). Before that,
//! a gang whose members ask for MIG profiles has the instances they lack made for all of them,
//! or for none (`mig_demand.rs`).

use std::collections::{BTreeMap, BTreeSet};

use super::{
    Command, Scheduler,
    fit::{Verdict, summed},
    quotas::Requester,
    reclaim::{Reclaim, Reclaimable},
};
use crate::{
    allocator::{GpuRequest, Strategy},
    node::{Node, NodeState},
    session::{Gang, GangError, Session, SessionState, WaitKind},
    slots::ResourceSlot,
};

/// A gang's key: its owner, then its name.
pub(super) type GangKey = (String, String);

/// Why a gang's members were not placed.
pub(super) struct GangWait {
    /// The first member's reason.
    pub why: String,
    /// It was room (not a team-queue or owner limit) that lacked: reclaim may make some.
    pub no_room: bool,
}

/// What a pass found of a gang.
pub(super) enum GangState {
    /// Fewer members than its size exist: `present` of `size`.
    Incomplete {
        /// Members that exist (not ended).
        present: usize,
        /// Its pending members.
        pending: Vec<String>,
    },
    /// All members exist; these are pending, in arrival order.
    Ready(Vec<String>),
}

impl Scheduler {
    /// Files session `s` under its gang, if it has one.
    pub(super) fn join_gang(&mut self, s: &Session) {
        if let Some(gang) = &s.gang {
            self.gangs
                .entry((s.owner.clone(), gang.name.clone()))
                .or_default()
                .insert(s.id.clone());
        }
    }

    /// Forgets session `s` (forgotten after its retention) from its gang's members.
    pub(super) fn leave_gang(&mut self, s: &Session) {
        if let Some(gang) = &s.gang {
            let key = (s.owner.clone(), gang.name.clone());
            if let Some(ids) = self.gangs.get_mut(&key) {
                ids.remove(&s.id);
                if ids.is_empty() {
                    self.gangs.remove(&key);
                }
            }
        }
    }

    /// The members of `owner`'s gang `name` that have not ended, in arrival order.
    pub(super) fn live_members(&self, owner: &str, name: &str) -> Vec<&Session> {
        let mut members: Vec<&Session> = self
            .gangs
            .get(&(owner.to_owned(), name.to_owned()))
            .into_iter()
            .flatten()
            .filter_map(|id| self.sessions.get(id))
            .filter(|s| !s.state.is_final())
            .collect();
        members.sort_by_key(|s| s.seq);
        members
    }

    /// Fails, whole, each gang placed longer than `timeout_ms` before `now_ms` with a member
    /// its node has not yet acknowledged (Kueue's `waitForPodsReady`): a node that never answers
    /// for one member would otherwise hold every member's devices for ever. A gang all of whose
    /// members ran is never expired. The returned releases are for the members' nodes, to be
    /// sent once the failures are stored. A `timeout_ms` of 0 expires nothing.
    #[must_use = "the gang's members must be released on their nodes"]
    pub fn expire_gangs(&mut self, now_ms: i64, timeout_ms: i64) -> Vec<Command> {
        if timeout_ms <= 0 {
            return Vec::new();
        }
        // One unacknowledged member past the timeout per gang names it.
        let stuck: Vec<(String, Vec<String>)> = self
            .gangs
            .keys()
            .filter_map(|(owner, name)| {
                let members = self.live_members(owner, name);
                let late = members.iter().find(|m| {
                    m.state == SessionState::Scheduled && now_ms - m.updated_at_ms > timeout_ms
                })?;
                let why = format!(
                    "gang {name} did not start whole within {} s: member {} was not acknowledged \
                     by its node {}",
                    timeout_ms / 1000,
                    late.id,
                    late.node.as_deref().unwrap_or("?"),
                );
                Some((why, members.iter().map(|m| m.id.clone()).collect()))
            })
            .collect();
        let mut releases = Vec::new();
        for (why, ids) in stuck {
            for id in ids {
                if let Some(node) = self.finish(&id, SessionState::Failed, &why) {
                    releases.push(Command::Release { node, session: id });
                }
            }
        }
        releases
    }

    /// Whether `owner` may add a member of `gang`: it is well formed, names the size its live
    /// members name, and the gang is not full.
    pub(super) fn check_gang(&self, owner: &str, gang: &Gang) -> Result<(), GangError> {
        gang.validate()?;
        let members = self.live_members(owner, &gang.name);
        if let Some(existing) = members.iter().find_map(|s| s.gang.as_ref())
            && existing.size != gang.size
        {
            return Err(GangError::SizeMismatch {
                name: gang.name.clone(),
                size: gang.size,
                existing: existing.size,
            });
        }
        if members.len() >= gang.size as usize {
            return Err(GangError::Full {
                name: gang.name.clone(),
                size: gang.size,
            });
        }
        Ok(())
    }

    /// Where `owner`'s gang `gang` stands in a pass.
    pub(super) fn gang_state(&self, owner: &str, gang: &Gang) -> GangState {
        let members = self.live_members(owner, &gang.name);
        let pending: Vec<String> = members
            .iter()
            .filter(|s| s.state == SessionState::Pending)
            .map(|s| s.id.clone())
            .collect();
        if members.len() < gang.size as usize {
            GangState::Incomplete {
                present: members.len(),
                pending,
            }
        } else {
            GangState::Ready(pending)
        }
    }

    /// A pass's turn for `owner`'s gang `gang`: `None` while it is incomplete (its pending
    /// members then say how many exist); otherwise whether it was placed, why not, and its
    /// pending members. A gang that does not fit for want of room reclaims as one session would.
    pub(super) fn pass_gang(
        &mut self,
        owner: &str,
        gang: &Gang,
        governed: bool,
        (held, known): (
            &mut BTreeMap<Option<String>, ResourceSlot>,
            &mut Option<Reclaimable>,
        ),
        commands: &mut Vec<Command>,
    ) -> Option<(bool, String, WaitKind, Vec<String>)> {
        let members = match self.gang_state(owner, gang) {
            GangState::Incomplete { present, pending } => {
                let why = format!("gang {} {present}/{} members", gang.name, gang.size);
                for member in &pending {
                    self.set_reason(member, &why, WaitKind::GangIncomplete);
                }
                return None;
            }
            GangState::Ready(members) => members,
        };
        match self.try_gang(&members, governed, held) {
            Ok(placed) => {
                commands.extend(placed);
                Some((true, String::new(), WaitKind::Capacity, members))
            }
            Err(wait) => {
                let mut why = wait.why;
                let mut kind = if wait.no_room {
                    WaitKind::Capacity
                } else {
                    WaitKind::QueueLimit
                };
                // As for a single session: MIG instances its members lack are made before
                // anything is reclaimed; reclaim only where quotas are configured, and only for
                // room (not past a limit).
                let queue = self.queue_key(governed, owner);
                if wait.no_room
                    && let Some((orders, reason)) = self.mig_gang_on_demand(&members)
                {
                    commands.extend(orders);
                    why = reason;
                } else if governed
                    && wait.no_room
                    && let Some(reclaim) =
                        self.reclaim_gang(&members, queue.as_deref(), held, known)
                {
                    commands.extend(reclaim.commands);
                    why = reclaim.reason;
                    kind = WaitKind::Preemption;
                }
                let why = format!(
                    "gang {} ({} members) does not fit at once: {why}",
                    gang.name, gang.size
                );
                Some((false, why, kind, members))
            }
        }
    }

    /// Places every one of `members` or none: each goes through the predicates and placement
    /// a single session does ([`Self::try_session`]), seeing what the ones before took; at the
    /// first that fails, what the others reserved is released and their records (and `held`,
    /// and the changes to store) are as before. Returns the commands, or why the gang waits.
    pub(super) fn try_gang(
        &mut self,
        members: &[String],
        governed: bool,
        held: &mut BTreeMap<Option<String>, ResourceSlot>,
    ) -> Result<Vec<Command>, GangWait> {
        let saved_held = held.clone();
        let saved_changes = (self.changes.sessions.clone(), self.changes.nodes.clone());
        let mut placed: Vec<Session> = Vec::new();
        let mut commands = Vec::new();
        for id in members {
            let Some(before) = self.sessions.get(id).cloned() else {
                continue;
            };
            let queue = self.queue_key(governed, &before.owner);
            let (why, no_room) = match self.try_session(id, queue.as_deref(), governed, held) {
                Verdict::Placed(command) => {
                    if governed {
                        let entry = held.entry(queue).or_default();
                        *entry = entry
                            .checked_add(&before.requested)
                            .unwrap_or_else(|| entry.clone());
                    }
                    commands.push(command);
                    placed.push(before);
                    continue;
                }
                Verdict::Refused(why) => (why, false),
                Verdict::NoRoom(why) => (why, true),
            };
            for before in placed.into_iter().rev() {
                self.unplace(before);
            }
            *held = saved_held;
            (self.changes.sessions, self.changes.nodes) = saved_changes;
            return Err(GangWait { why, no_room });
        }
        Ok(commands)
    }

    /// Preempts what the pending `members` of a gang of `queue` need to be placed together, if
    /// a set of allowed victims makes room for all of them at once (the gang asks as one
    /// session: its members' requests summed, their highest priority); `None` when none does.
    /// As for a single session, sessions already being preempted count as freed, and while
    /// their release makes room nothing more is preempted.
    pub(super) fn reclaim_gang(
        &mut self,
        members: &[String],
        queue: Option<&str>,
        held: &BTreeMap<Option<String>, ResourceSlot>,
        known: &mut Option<Reclaimable>,
    ) -> Option<Reclaim> {
        let known = known.get_or_insert_with(|| self.reclaimable());
        if known.in_flight.is_empty() && known.candidates.is_empty() {
            return None;
        }
        let waiting: Vec<&Session> = members
            .iter()
            .filter_map(|id| self.sessions.get(id))
            .collect();
        let first = waiting.first()?.id.clone();
        let request = summed(&waiting);
        let priority = waiting.iter().map(|m| m.priority).max()?;
        let asker = Requester {
            queue,
            priority,
            request: &request,
        };
        let plan = self.plan_for(known, held, (&first, asker), |freed| {
            self.all_fit_freeing(&waiting, freed)
        })?;
        Some(self.carry_out(known, &first, queue, plan))
    }

    /// Whether every one of `members` fits at once, each after the ones before it, with the
    /// sessions `freed` (id, node, request) released: a scratch copy of the nodes they touch,
    /// members tried on the fullest ready node first, as binpack places them.
    fn all_fit_freeing(&self, members: &[&Session], freed: &[(&str, &str, &ResourceSlot)]) -> bool {
        let mut scratch: BTreeMap<&str, Node> = BTreeMap::new();
        for &(sid, nid, requested) in freed {
            let Some(node) = self.nodes.get(nid) else {
                continue;
            };
            let n = scratch.entry(nid).or_insert_with(|| node.clone());
            n.allocator.release(sid);
            n.unreserve(requested);
        }
        for m in members {
            let Ok(gpu) = GpuRequest::from_slots(&m.requested) else {
                return false;
            };
            let non_gpu = Node::non_gpu(&m.requested);
            let fits = |n: &Node| {
                (non_gpu.is_zero() || n.non_gpu_fits(&non_gpu)) && n.allocator.can_fit(&gpu)
            };
            let chosen = self.by_free.iter().map(|(_, id)| id.as_str()).find(|nid| {
                let Some(node) = self.nodes.get(*nid) else {
                    return false;
                };
                node.state == NodeState::Ready
                    && m.pinned_node.as_deref().is_none_or(|p| p == *nid)
                    && fits(scratch.get(nid).unwrap_or(node))
            });
            let Some(nid) = chosen else {
                return false;
            };
            let Some(node) = self.nodes.get(nid) else {
                return false;
            };
            let n = scratch.entry(nid).or_insert_with(|| node.clone());
            let Ok(plan) = n.allocator.plan(&gpu, Strategy::Binpack) else {
                return false;
            };
            if n.allocator.allocate_planned(&m.id, plan).is_err() {
                return false;
            }
            n.reserve(&m.requested);
        }
        true
    }

    /// Undoes a placement made in this pass: releases what the session reserved on its node
    /// and puts its record back as it was (`before`).
    fn unplace(&mut self, before: Session) {
        let id = before.id.clone();
        if let Some(s) = self.sessions.get(&id)
            && let Some(node) = s.node.clone()
        {
            let requested = s.requested.clone();
            if let Some(n) = self.nodes.get_mut(&node) {
                n.allocator.release(&id);
                n.unreserve(&requested);
            }
            self.reindex(&node);
        }
        self.tracker.remove(&before.owner, &id);
        self.sessions.insert(id, before);
    }
}

/// The gangs whose members a pass already took, so that each is tried once.
pub(super) type Tried = BTreeSet<GangKey>;
