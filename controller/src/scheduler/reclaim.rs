//! Reclaim by preemption (issue 24 §2): when a pending session within its queue's guarantee
//! finds no room that borrowers hold, or a lower-priority session of its own queue holds it,
//! the pass picks the fewest victims ([`super::quotas::choose_victims`]) whose release makes it
//! fit on some node, marks them preempting and sends each node a `Preempt`. A victim keeps its
//! allocation until its agent reports the workload gone; it then ends [`SessionState::Preempted`]
//! and the waiting session is placed on a later pass, so no device is ever over-committed.

use std::collections::BTreeMap;

use super::{
    Command, Scheduler,
    quotas::{Candidate, Cause, Requester, Victim, choose_victims},
};
use crate::{
    allocator::GpuRequest,
    node::{Node, NodeState},
    session::{DecisionKind, Origin, SessionState},
    slots::ResourceSlot,
};

/// Each candidate's sessions (id, node, request): itself, or a gang's live members.
pub(super) type Units = BTreeMap<String, Vec<(String, String, ResourceSlot)>>;

/// What a reclaim decided for a waiting session.
pub(super) struct Reclaim {
    /// Preemptions to send.
    pub commands: Vec<Command>,
    /// Why the session still waits.
    pub reason: String,
}

impl Scheduler {
    /// Preempts what session `id` (of `queue`) needs, if a set of allowed victims makes room;
    /// `None` when none does. Sessions already being preempted count as freed: while their
    /// release makes room, nothing more is preempted.
    pub(super) fn reclaim(
        &mut self,
        id: &str,
        queue: Option<&str>,
        held: &BTreeMap<Option<String>, ResourceSlot>,
    ) -> Option<Reclaim> {
        let session = self.sessions.get(id)?;
        let gpu = GpuRequest::from_slots(&session.requested).ok()?;
        let non_gpu = Node::non_gpu(&session.requested);
        let pinned = session.pinned_node.clone();
        let (priority, request) = (session.priority, session.requested.clone());
        let in_flight: Vec<(String, String, ResourceSlot)> = self
            .sessions
            .values()
            .filter(|s| s.preempting.is_some() && s.state.holds_resources())
            .filter_map(|s| Some((s.id.clone(), s.node.clone()?, s.requested.clone())))
            .collect();
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
        let in_flight_freed: Vec<(&str, &str, &ResourceSlot)> = in_flight
            .iter()
            .map(|(s, n, r)| (s.as_str(), n.as_str(), r))
            .collect();
        if !in_flight.is_empty() && fits_freeing(&in_flight_freed) {
            let names: Vec<&str> = in_flight.iter().map(|(s, _, _)| s.as_str()).collect();
            return Some(Reclaim {
                commands: Vec::new(),
                reason: format!(
                    "waits for preempted sessions to release their resources: {}",
                    names.join(", ")
                ),
            });
        }
        let quotas = &self.config.quotas;
        // A running gang is one candidate (issue 24 §3): preempting one member preempts all.
        let (candidates, units) = self.reclaim_candidates(id);
        let asker = Requester {
            queue,
            priority,
            request: &request,
        };
        let victims = choose_victims(quotas, held, asker, &candidates, |chosen| {
            let mut freed = in_flight_freed.clone();
            freed.extend(chosen.iter().flat_map(|c| {
                units
                    .get(c.id.as_str())
                    .into_iter()
                    .flatten()
                    .map(|(sid, node, requested)| (sid.as_str(), node.as_str(), requested))
            }));
            fits_freeing(&freed)
        })?;
        let victims: Vec<Victim> = victims
            .into_iter()
            .flat_map(|v| {
                let members = units.get(v.id.as_str()).cloned().unwrap_or_default();
                members.into_iter().map(move |(sid, _, _)| Victim {
                    id: sid,
                    cause: v.cause,
                })
            })
            .collect();
        Some(self.preempt_victims(id, queue, &victims))
    }

    /// The running sessions reclaim may preempt for `waiter`, and for each candidate the
    /// sessions (id, node, request) preempting it ends: itself, or for a gang every live member,
    /// the gang standing as one candidate (its members' requests summed, preemptible only if all
    /// are). A gang with a member not running (or already being preempted) is no candidate.
    pub(super) fn reclaim_candidates(&self, waiter: &str) -> (Vec<Candidate>, Units) {
        let quotas = &self.config.quotas;
        let eligible = |s: &crate::session::Session| {
            s.state == SessionState::Running
                && s.origin == Origin::Controller
                && s.preempting.is_none()
                && s.id != waiter
        };
        let mut candidates = Vec::new();
        let mut units = Units::new();
        let mut gangs = std::collections::BTreeSet::new();
        for s in self.sessions.values().filter(|s| eligible(s)) {
            let members: Vec<&crate::session::Session> = match &s.gang {
                None => vec![s],
                Some(g) if gangs.insert((s.owner.clone(), g.name.clone())) => {
                    self.live_members(&s.owner, &g.name)
                }
                Some(_) => continue,
            };
            if !members.iter().all(|m| eligible(m)) {
                continue;
            }
            let requested = members.iter().fold(ResourceSlot::new(), |acc, m| {
                acc.checked_add(&m.requested).unwrap_or(acc)
            });
            candidates.push(Candidate {
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
            units.insert(
                s.id.clone(),
                members
                    .iter()
                    .filter_map(|m| Some((m.id.clone(), m.node.clone()?, m.requested.clone())))
                    .collect(),
            );
        }
        (candidates, units)
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
            s.reason = format!("being preempted ({grace_ms} ms grace): {why}");
            s.preempting = Some(why.clone());
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
        let reason = s
            .preempting
            .take()
            .unwrap_or_else(|| "preempted on its node".to_owned());
        self.finish(session, SessionState::Preempted, &reason);
        true
    }
}
