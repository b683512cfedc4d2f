//! The scheduling pass: each pending session in queue order through its team queue's limit and
//! the per-owner predicates, then filter, score and bind.

use super::{Command, QueuePolicy, Scheduler, fit::Verdict, quotas::Standing, set_state};
use crate::{
    allocator::{Allocation, GpuRequest, Strategy},
    node::{Node, NodeState},
    placement::{Explanation, Placement},
    session::{SessionState, WaitKind},
    slots::ResourceSlot,
};

/// No node: the candidates of a profile no node has an idle instance of.
static NO_NODES: std::collections::BTreeSet<(u128, String)> = std::collections::BTreeSet::new();

impl Scheduler {
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
        let governed = !self.config.quotas.queues.is_empty();
        // What each team queue holds, read once: it orders the queue and, kept up to date as
        // sessions are placed, holds each queue to its limit.
        let mut held = if governed {
            self.queue_holdings()
        } else {
            std::collections::BTreeMap::new()
        };
        // A session whose MIG instance was just made for it goes first: it is its own.
        let order = self.queue_order(&held);
        let order = self.mig_made_first(order);
        let mut reclaimable = None;
        let mut commands = Vec::new();
        let mut tried = super::gang::Tried::new();
        for id in order {
            let started = std::time::Instant::now();
            let Some(session) = self.sessions.get(&id) else {
                continue;
            };
            // The members of one gang are tried where its first pending member stands.
            let (placed, reason, kind, members) = if let Some(gang) = session.gang.clone() {
                let owner = session.owner.clone();
                if session.state != SessionState::Pending
                    || !tried.insert((owner.clone(), gang.name.clone()))
                {
                    continue;
                }
                let Some(outcome) = self.pass_gang(
                    &owner,
                    &gang,
                    governed,
                    (&mut held, &mut reclaimable),
                    &mut commands,
                ) else {
                    // Incomplete: not ready to run, it waits without holding the queue up.
                    observe(started.elapsed(), false);
                    continue;
                };
                outcome
            } else {
                let queue = self.queue_key(governed, &session.owner);
                let (placed, reason, kind) =
                    match self.try_session(&id, queue.as_deref(), governed, &held) {
                        Verdict::Placed(command) => {
                            if governed && let Command::Allocate { slots, .. } = &command {
                                let entry = held.entry(queue).or_default();
                                *entry = entry.checked_add(slots).unwrap_or_else(|| entry.clone());
                            }
                            commands.push(command);
                            (true, String::new(), WaitKind::Capacity)
                        }
                        Verdict::Refused(why) => (false, why, WaitKind::QueueLimit),
                        Verdict::NoRoom(why) => {
                            // A MIG profile may have an instance made for it (issue 37 §3)
                            // before anything is reclaimed for it.
                            if let Some((orders, reason)) = self.mig_on_demand(&id) {
                                commands.extend(orders);
                                (false, reason, WaitKind::Capacity)
                            } else {
                                // Reclaim by preemption only where quotas are configured: without
                                // them nothing changes.
                                match governed
                                    .then(|| {
                                        self.reclaim(&id, queue.as_deref(), &held, &mut reclaimable)
                                    })
                                    .flatten()
                                {
                                    Some(reclaim) => {
                                        commands.extend(reclaim.commands);
                                        (false, reclaim.reason, WaitKind::Preemption)
                                    }
                                    None => (false, why, WaitKind::Capacity),
                                }
                            }
                        }
                    };
                (placed, reason, kind, vec![id])
            };
            observe(started.elapsed(), placed);
            if !placed {
                // A gang fails as one session: every member counts the pass, and the most any
                // of them failed decides whether it still holds the queue.
                let mut failed = 0;
                for member in &members {
                    if let Some(s) = self.sessions.get_mut(member) {
                        s.failed_passes += 1;
                        failed = failed.max(s.failed_passes);
                    }
                    self.set_reason(member, &reason, kind);
                }
                // FIFO: the head blocks later sessions until it has failed `skip_after` passes.
                if self.config.queue == QueuePolicy::Fifo
                    && !members.is_empty()
                    && failed <= self.config.skip_after
                {
                    break;
                }
            }
        }
        // Suspended sessions resume where room is left after the waiting ones had their turn
        // (issue 38): a victim resumed first would only be reclaimed again.
        commands.extend(self.resume_suspended());
        commands
    }

    /// Sets a waiting session's reason and why it waits, recording the change only when
    /// either differs.
    pub(super) fn set_reason(&mut self, id: &str, reason: &str, kind: WaitKind) {
        if let Some(s) = self.sessions.get_mut(id)
            && (s.reason != reason || s.wait != Some(kind))
        {
            reason.clone_into(&mut s.reason);
            s.wait = Some(kind);
            self.changes.sessions.insert(id.to_owned());
        }
    }

    /// The team queue `owner`'s sessions count against, when queues govern.
    pub(super) fn queue_key(&self, governed: bool, owner: &str) -> Option<String> {
        governed
            .then(|| self.config.quotas.queue_of(owner).map(str::to_owned))
            .flatten()
    }

    /// Session `id` through its team queue's limit and the per-owner predicates, then filter,
    /// score and bind (`queue`: its team queue; `held`: what each queue holds).
    pub(super) fn try_session(
        &mut self,
        id: &str,
        queue: Option<&str>,
        governed: bool,
        held: &std::collections::BTreeMap<Option<String>, ResourceSlot>,
    ) -> Verdict {
        let Some(session) = self.sessions.get(id) else {
            return Verdict::Refused("gone".to_owned());
        };
        let owner = session.owner.clone();
        let limits = self
            .config
            .limits
            .get(&owner)
            .unwrap_or(&self.config.default_limits);
        let queue_held = || {
            held.get(&queue.map(str::to_owned))
                .cloned()
                .unwrap_or_default()
        };
        let past_limit = governed
            .then(|| self.past_queue_limit(queue, &queue_held(), &session.requested))
            .flatten();
        let unpreemptible_borrower = governed
            && session.no_preempt
            && self
                .config
                .quotas
                .standing(queue, &queue_held(), &session.requested)
                != Standing::WithinGuarantee;
        if let Some(why) = past_limit {
            Verdict::Refused(why)
        } else if unpreemptible_borrower {
            Verdict::Refused(format!(
                "no-preempt: admitted only within queue {}'s guarantee",
                queue.unwrap_or("-")
            ))
        } else if !self.tracker.admits(&owner, id, limits.max_concurrent) {
            Verdict::Refused(format!(
                "owner {owner} is at its limit of {} concurrent sessions",
                limits.max_concurrent.unwrap_or(0)
            ))
        } else if !self.within_slot_limit(&owner, &session.requested, limits.max_slots.as_ref()) {
            Verdict::Refused(format!("owner {owner} would exceed its slot limit"))
        } else {
            match self.place(id) {
                Ok(command) => Verdict::Placed(command),
                Err(why) => Verdict::NoRoom(why),
            }
        }
    }

    /// Why a session of `queue` asking for `requested` waits while the queue holds `held`, if
    /// the request would take the queue past its limit.
    fn past_queue_limit(
        &self,
        queue: Option<&str>,
        held: &ResourceSlot,
        requested: &ResourceSlot,
    ) -> Option<String> {
        let quotas = &self.config.quotas;
        let Standing::OverLimit { slot } = quotas.standing(queue, held, requested) else {
            return None;
        };
        let limit = quotas.quota(queue).limit.unwrap_or_default();
        Some(format!(
            "queue {} would pass its limit of {} in {slot}",
            queue.unwrap_or("-"),
            limit.get(slot.as_str()),
        ))
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
        // A MIG profile is held only by nodes with an idle instance of it.
        let candidates = match gpu.profile.as_deref() {
            Some(slot) => self.with_idle.get(slot).unwrap_or(&NO_NODES),
            None => &self.by_free,
        };
        let range = candidates.range((lower, String::new())..).map(|(_, id)| id);
        let (node_id, planned, explanation) = if mode == Placement::InterferenceAware && wants_gpu {
            let cache = std::mem::take(&mut self.excess);
            let scorer = self.scorer(&session.class, cache);
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
            // Binpack: the fullest node that fits (ascending free); spread: the emptiest. A
            // request with GPUs finds every node plain, so one walk is all (a second would only
            // repeat a failed one).
            let best = if strategy == Strategy::Binpack {
                let first = range.clone().find(|id| plain(id) && fits(id));
                if wants_gpu {
                    first
                } else {
                    first.or_else(|| range.clone().find(|id| fits(id)))
                }
            } else {
                let first = range.clone().rev().find(|id| plain(id) && fits(id));
                if wants_gpu {
                    first
                } else {
                    first.or_else(|| range.clone().rev().find(|id| fits(id)))
                }
            }
            .cloned()
            .ok_or_else(|| format!("no node fits {}", session.requested))?;
            let node = self.nodes.get(&best).ok_or("node vanished")?;
            let planned = node
                .allocator
                .plan(&gpu, strategy)
                .map_err(|e| e.to_string())?;
            let cache = std::mem::take(&mut self.excess);
            let scorer = self.scorer(&session.class, cache);
            let explanation = scorer.explain_one(mode, &best, node, &planned);
            self.excess = scorer.into_cache();
            (best, planned, explanation)
        };
        self.bind(id, node_id, planned, explanation)
    }

    /// Binds session `id` to `node_id` with the allocation `planned` there: books it on the
    /// node and its owner, and says so in the session; the `Allocate` for the agent.
    fn bind(
        &mut self,
        id: &str,
        node_id: String,
        planned: Allocation,
        explanation: Explanation,
    ) -> Result<Command, String> {
        let session = self.sessions.get(id).ok_or("gone")?;
        let requested = session.requested.clone();
        let owner = session.owner.clone();
        let (target, policy, scope, run_uid) = (
            session.target.clone(),
            session.policy,
            session.scope.clone(),
            session.run_uid,
        );
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
            s.record_wait();
            s.wait = None;
            s.placed_at_ms = Some(crate::session::now_ms());
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
            scope,
            run_uid,
        })
    }
}
