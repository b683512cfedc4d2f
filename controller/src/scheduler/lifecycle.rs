//! The lives of nodes and sessions: registration, heartbeats and expiry; creation, usage, and
//! the end (what the agents report of a session is in [`super::reports`]).

use std::collections::BTreeSet;

use super::{
    Command, NewSession, RegisterError, RequestError, Scheduler, SchedulerConfig,
    observed::{ObserveError, Observed},
    set_state,
};
use crate::{
    allocator::{Allocation, GpuRequest, NodeAllocator},
    node::{Node, NodeReport, NodeState},
    profile::{ProfileBook, UsageSample},
    session::{Origin, Session, SessionState, now_ms},
    slots::ResourceSlot,
    store::Snapshot,
};

impl Scheduler {
    /// Rebuilds from stored records (after a controller restart). Nodes start Lost until their
    /// agents come back; the agents' reports then win.
    #[must_use]
    pub(crate) fn restore(config: SchedulerConfig, stored: Snapshot) -> Self {
        let Snapshot {
            registry,
            nodes,
            sessions,
            profiles,
            revisions,
            quotas,
        } = stored;
        let mut s = Self::new(config);
        // Queues an admin set at run time win over the config file's (docs/teams.md).
        if let Some(quotas) = quotas {
            s.config.quotas = quotas;
        }
        s.revisions = revisions;
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
            if session.state == SessionState::Pending {
                s.queue(&session);
            }
            // Observed sessions are Kubernetes': the caps on sessions don't count them.
            if !session.state.is_final() && session.origin == Origin::Controller {
                s.live.started(&session.owner);
            }
            s.join_gang(&session);
            s.index_request(&session);
            s.sessions.insert(session.id.clone(), session);
        }
        s
    }

    /// Records what a running session used, as its node measured it. Samples from a node the
    /// session isn't on, or for a session not running, are ignored (a late report after a
    /// release). The series is written without waking watchers or forcing a flush
    /// ([`super::Changes::usage`]), so a report costs one buffered write.
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
        self.register_observing(report, running, Vec::new())
            .map(|(commands, _)| commands)
    }

    /// The sessions node `id`'s agent holds (`running`) that the controller ended: it is told
    /// to let go of each.
    fn releases(&self, id: &str, running: &BTreeSet<&str>) -> Vec<Command> {
        running
            .iter()
            .filter(|sid| {
                !self.sessions.get(**sid).is_some_and(|s| {
                    (s.node.as_deref() == Some(id) && s.state.holds_resources())
                        // Suspended: its agent holds it frozen until it is resumed.
                        || (s.state == SessionState::Suspended
                            && s.home.as_ref().is_some_and(|h| h.node == id))
                })
            })
            .map(|sid| Command::Release {
                node: id.to_owned(),
                session: (*sid).to_owned(),
            })
            .collect()
    }

    /// [`Self::register`] for a node whose agent also holds `observed` sessions (Kubernetes
    /// claims it prepared): they are rebuilt from that list, and those of the node it no longer
    /// lists end. Returns the commands to send it and the observed sessions refused.
    ///
    /// # Errors
    /// The node's slot types conflict with the cluster's.
    pub fn register_observing(
        &mut self,
        report: NodeReport,
        running: &[String],
        observed: Vec<Observed>,
    ) -> Result<(Vec<Command>, Vec<ObserveError>), RegisterError> {
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
        let mut allocator = NodeAllocator::new(report.devices.clone(), self.config.allocator)
            .with_profiles(&crate::node::mig_profiles(&report))
            .with_kubernetes(report.kubernetes_devices.clone());
        let mut held = Vec::new();
        let running: BTreeSet<&str> = running.iter().map(String::as_str).collect();
        let mut commands = Vec::new();
        // Sessions the controller placed here: keep those the agent holds, or that await its ack.
        let placed: Vec<String> = self
            .sessions
            .values()
            .filter(|s| {
                s.node.as_deref() == Some(&id)
                    && s.state.holds_resources()
                    && s.origin == Origin::Controller
            })
            .map(|s| s.id.clone())
            .collect();
        for sid in placed {
            let Some(session) = self.sessions.get_mut(&sid) else {
                continue;
            };
            if session.state == SessionState::Terminating {
                let still_held = running.contains(sid.as_str());
                if still_held {
                    allocator.restore(&sid, session.allocation.clone());
                    held.push(session.requested.clone());
                }
                commands.extend(self.terminating_registered(&id, &sid, still_held));
            } else if running.contains(sid.as_str()) || session.state == SessionState::Scheduled {
                allocator.restore(&sid, session.allocation.clone());
                held.push(session.requested.clone());
                if session.state == SessionState::Lost {
                    set_state(session, SessionState::Running, "");
                }
                if let Some(reason) = session.preempting.clone() {
                    // A preemption its agent may not have finished (or seen): asked again.
                    let mode = self.preemption_mode(&self.sessions[&sid]);
                    commands.push(Command::Preempt {
                        node: id.clone(),
                        session: sid.clone(),
                        grace_ms: self.config.preemption_grace_ms,
                        reason,
                        mode,
                    });
                }
                let Some(session) = self.sessions.get_mut(&sid) else {
                    continue;
                };
                if session.state == SessionState::Scheduled {
                    // The agent may never have seen it: send it again.
                    commands.push(Command::Allocate {
                        node: id.clone(),
                        session: sid.clone(),
                        slots: session.requested.clone(),
                        allocation: session.allocation.clone(),
                        target: session.target.clone(),
                        policy: session.policy,
                        scope: session.scope.clone(),
                        run_uid: session.run_uid,
                    });
                }
            } else if let Some(reason) = session.preempting.take() {
                session.preempted_for = None;
                // Its agent let go of it: the preemption finished while the report was lost.
                set_state(session, SessionState::Preempted, &reason);
                self.tracker.remove(&session.owner, &sid);
                self.live.ended(&session.owner);
            } else {
                set_state(
                    session,
                    SessionState::Failed,
                    "its node restarted without it",
                );
                self.tracker.remove(&session.owner, &sid);
                self.live.ended(&session.owner);
            }
            self.changes.sessions.insert(sid);
        }
        commands.extend(self.releases(&id, &running));
        let mut node = Node::new(report, allocator, ResourceSlot::new(), now_ms());
        for requested in &held {
            node.reserve(requested);
        }
        self.book_suspended(&id, &mut node);
        self.nodes.insert(id.clone(), node);
        self.reindex(&id);
        let refused = self.reconcile_observed(&id, observed);
        commands.extend(self.mig_registered(&id));
        self.changes.nodes.insert(id);
        Ok((commands, refused))
    }

    /// Terminating session `sid` as node `node` (re)registers: still held there, booked (by the
    /// caller) and its node told again; not, its agent let go of it (the confirmation may have
    /// been lost with the stream) and it ends, with nothing booked on the new allocator.
    fn terminating_registered(
        &mut self,
        node: &str,
        sid: &str,
        still_held: bool,
    ) -> Option<Command> {
        if still_held {
            return Some(Command::Release {
                node: node.to_owned(),
                session: sid.to_owned(),
            });
        }
        let session = self.sessions.get_mut(sid)?;
        session.releasing_since_ms = None;
        set_state(
            session,
            SessionState::Terminated,
            &format!("terminated by request: node {node} came back without it"),
        );
        self.tracker.remove(&session.owner, sid);
        self.live.ended(&session.owner);
        None
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
        let mut failed = Vec::new();
        let mut unconfirmed = Vec::new();
        for s in self.sessions.values_mut() {
            if s.node.as_ref().is_some_and(|n| lost.contains(n)) && s.state.holds_resources() {
                if s.state == SessionState::Terminating {
                    // Nobody is left to confirm its release: it ends now (finished below).
                    unconfirmed.push(s.id.clone());
                } else {
                    set_state(s, SessionState::Lost, "node stopped sending heartbeats");
                    self.changes.sessions.insert(s.id.clone());
                }
            }
            if s.state == SessionState::Suspended
                && let Some(home) = s.home.as_ref().filter(|h| lost.contains(&h.node))
            {
                // Its GPU memory was in that node's host memory: nothing is left to resume.
                let why = format!(
                    "its node {} stopped sending heartbeats while it was suspended: its GPU \
                     memory was in that node's host memory",
                    home.node
                );
                set_state(s, SessionState::Failed, &why);
                failed.push((s.id.clone(), s.owner.clone()));
                self.changes.sessions.insert(s.id.clone());
            }
        }
        for (id, owner) in failed {
            self.live.ended(&owner);
            if let Some(s) = self.sessions.get_mut(&id) {
                s.home = None;
            }
        }
        for id in unconfirmed {
            let node = self.sessions[&id].node.clone().unwrap_or_default();
            let why = format!(
                "terminated by request: node {node} stopped sending heartbeats before it \
                 confirmed the release"
            );
            self.finish(&id, SessionState::Terminated, &why);
        }
        lost
    }

    /// Ends, unconfirmed, each session [`SessionState::Terminating`] for longer than
    /// `timeout_ms` before `now_ms`: its agent never said it let go (an agent from before
    /// issue 40 never does). What it held is freed; the returned releases tell its node again,
    /// to be sent once the ends are stored. A `timeout_ms` of 0 ends nothing.
    #[must_use = "the sessions' nodes must be told again to release them"]
    pub fn expire_releases(&mut self, now_ms: i64, timeout_ms: i64) -> Vec<Command> {
        if timeout_ms <= 0 {
            return Vec::new();
        }
        let late: Vec<String> = self
            .sessions
            .values()
            .filter(|s| {
                s.state == SessionState::Terminating
                    && now_ms - s.releasing_since_ms.unwrap_or(s.updated_at_ms) > timeout_ms
            })
            .map(|s| s.id.clone())
            .collect();
        late.into_iter()
            .filter_map(|id| {
                let node = self.sessions[&id].node.clone().unwrap_or_default();
                let why = format!(
                    "terminated by request: node {node} did not confirm the release within \
                     {timeout_ms} ms; what it held was freed unconfirmed"
                );
                let node = self.finish(&id, SessionState::Terminated, &why)?;
                Some(Command::Release { node, session: id })
            })
            .collect()
    }

    /// Queues a new session.
    ///
    /// # Errors
    /// The request names unknown slots, is malformed, or is larger than every node.
    pub fn create(&mut self, new: NewSession) -> Result<Session, RequestError> {
        let NewSession {
            requested,
            pinned_node,
            target,
            ..
        } = &new;
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
        GpuRequest::from_slots(requested)?.check_quantum(self.config.allocator.quantum)?;
        if let Some(node) = pinned_node
            && !self.nodes.contains_key(node)
        {
            return Err(RequestError::UnknownNode(node.clone()));
        }
        if !self.nodes.is_empty()
            && !self.nodes.values().any(|n| {
                requested.fits_in(&n.capacity()) || super::mig_demand::could_make(n, requested)
            })
        {
            let largest = self
                .nodes
                .values()
                .map(Node::capacity)
                .max_by_key(|c| c.get("cuda.shares"))
                .unwrap_or_default();
            return Err(RequestError::Oversized {
                requested: requested.clone(),
                largest,
            });
        }
        if let Some(gang) = &new.gang {
            self.check_gang(&new.owner, gang)?;
        }
        let id = new.id.clone();
        let session = self.new_session(new, Origin::Controller);
        self.join_gang(&session);
        self.queue(&session);
        self.live.started(&session.owner);
        self.sessions.insert(id.clone(), session.clone());
        self.changes.sessions.insert(id);
        Ok(session)
    }

    /// A Pending session made of `new`, next in arrival order, created now, its class filed
    /// for its owner: the one place a [`Session`] is made (observed ones are then marked placed).
    pub(super) fn new_session(&mut self, new: NewSession, origin: Origin) -> Session {
        let NewSession {
            id,
            name,
            owner,
            priority,
            requested,
            pinned_node,
            target,
            policy,
            scope,
            class,
            placement,
            no_preempt,
            preemption,
            gang,
            run_uid,
        } = new;
        let now = now_ms();
        let name = if name.is_empty() { id.clone() } else { name };
        let class = if class.is_empty() {
            name.clone()
        } else {
            class
        };
        // A pod's label is its namespace's word, whatever scope Kubernetes admitted it under:
        // filed within its owner. An admin's own sessions file classes as named.
        let files_as_admin = scope.admin && origin == Origin::Controller;
        let session = Session {
            class: self.config.filed_class(&owner, class, files_as_admin),
            placement,
            explanation: None,
            usage: crate::profile::UsageSeries::default(),
            origin,
            revision: 0,
            request_id: None,
            wait: None,
            placed_at_ms: None,
            releasing_since_ms: None,
            name,
            id,
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
            scope,
            events: Vec::new(),
            no_preempt,
            preempting: None,
            preempted_for: None,
            gang,
            run_uid,
            decisions: Vec::new(),
            preemption,
            home: None,
        };
        self.next_seq += 1;
        session
    }

    /// Ends a session at a client's request. Returns the command for its agent, if any.
    ///
    /// A session placed on a node that is up becomes [`SessionState::Terminating`]: its agent
    /// is told to release it, and what it holds stays booked until the agent confirms
    /// ([`Self::record_event`], `released`), its node is lost, or
    /// [`Self::expire_releases`]. Any other ends [`SessionState::Terminated`] at once, its
    /// reason saying why nothing was waited for. A session already terminating or ended, and
    /// one Kubernetes placed ([`Origin::Dra`], not the controller's to end; the API refuses
    /// before), change nothing.
    pub fn terminate(&mut self, id: &str) -> Option<Command> {
        self.terminate_with(id, |_| true)
    }

    /// [`Self::terminate`], where only a node for which `agent_live` holds (its agent's stream
    /// is open) is waited on: a session on any other ends at once, as on a lost node.
    pub fn terminate_with(
        &mut self,
        id: &str,
        agent_live: impl Fn(&str) -> bool,
    ) -> Option<Command> {
        let session = self.sessions.get(id)?;
        if session.state.is_final()
            || session.state == SessionState::Terminating
            || session.origin != Origin::Controller
        {
            return None;
        }
        let placed_on = session
            .node
            .clone()
            .filter(|_| session.state.holds_resources());
        let node_up = placed_on
            .as_ref()
            .and_then(|n| self.nodes.get(n))
            .is_some_and(|n| n.state == NodeState::Ready)
            && placed_on.as_deref().is_some_and(agent_live);
        let why = match (&placed_on, session.state) {
            (Some(node), SessionState::Scheduled | SessionState::Running) if node_up => {
                let node = node.clone();
                let s = self.sessions.get_mut(id)?;
                // It stops running now: what it used teaches its class now, as at its end.
                if s.state == SessionState::Running
                    && self.profiles.learn(&s.class, &s.usage, now_ms()).is_some()
                {
                    self.changes.profiles.insert(s.class.clone());
                    self.excess.clear();
                }
                set_state(
                    s,
                    SessionState::Terminating,
                    &format!(
                        "terminated by request: waiting for node {node} to confirm the release"
                    ),
                );
                s.releasing_since_ms = Some(s.updated_at_ms);
                self.changes.sessions.insert(id.to_owned());
                return Some(Command::Release {
                    node,
                    session: id.to_owned(),
                });
            }
            (Some(node), _)
                if self
                    .nodes
                    .get(node)
                    .is_some_and(|n| n.state == NodeState::Ready) =>
            {
                format!(
                    "terminated by request: the agent of its node {node} is not connected, so no \
                     release could be confirmed (it is told when it connects)"
                )
            }
            (Some(node), _) => format!(
                "terminated by request: its node {node} is lost, so no release could be confirmed"
            ),
            (None, SessionState::Suspended) => {
                "terminated by request: its node was told to end its suspended workload".to_owned()
            }
            (None, _) => "terminated by request: it held no place".to_owned(),
        };
        let node = self.finish(id, SessionState::Terminated, &why)?;
        Some(Command::Release {
            node,
            session: id.to_owned(),
        })
    }

    /// [`Self::terminate`], its release taken as confirmed at once: for a caller that plays
    /// the agents itself (the simulator, tests), where nothing would ever confirm it.
    pub fn terminate_released(&mut self, id: &str) -> Option<Command> {
        let command = self.terminate(id)?;
        if let Command::Release { node, session } = &command {
            self.released(node, session, "released it");
        }
        Some(command)
    }

    /// The agent on `node` confirmed it let go of `session` (issue 40): a terminating session
    /// ends, what it held is freed. Returns whether it ended.
    pub(super) fn released(&mut self, node: &str, session: &str, how: &str) -> bool {
        let Some(s) = self.sessions.get(session) else {
            return false;
        };
        if s.state != SessionState::Terminating || s.node.as_deref() != Some(node) {
            return false;
        }
        let why = format!("terminated by request: node {node} {how}");
        self.finish(session, SessionState::Terminated, &why)
            .is_some()
    }

    /// Ends session `id` in `state`: what it used teaches its class (once it ran long enough
    /// to say anything), and what it held is released. Returns the node it held resources on.
    pub(super) fn finish(&mut self, id: &str, state: SessionState, reason: &str) -> Option<String> {
        let session = self.sessions.get_mut(id)?;
        let held = session.state.holds_resources();
        // Suspended: it holds nothing on the books, but its agent holds it frozen at home; that
        // node is told to let go (which ends the workload) like any other.
        let home = session
            .home
            .take()
            .filter(|_| session.state == SessionState::Suspended);
        // A terminating session taught its class as it stopped running (`terminate_with`).
        if session.state == SessionState::Running
            && self
                .profiles
                .learn(&session.class, &session.usage, now_ms())
                .is_some()
        {
            self.changes.profiles.insert(session.class.clone());
            self.excess.clear();
        }
        set_state(session, state, reason);
        session.releasing_since_ms = None;
        if state.is_final() {
            // Ended: no longer being preempted either (a terminating one may have been).
            session.preempting = None;
            session.preempted_for = None;
        }
        if session.origin == Origin::Controller {
            self.live.ended(&session.owner);
        }
        self.changes.sessions.insert(id.to_owned());
        let owner = session.owner.clone();
        let node = session.node.clone();
        let requested = session.requested.clone();
        self.tracker.remove(&owner, id);
        if let Some(h) = &home
            && let Some(n) = self.nodes.get_mut(&h.node)
        {
            n.unreserve(&super::reclaim::host_footprint(h));
            self.changes.nodes.insert(h.node.clone());
        }
        let node = node.filter(|_| held).or(home.map(|h| h.node))?;
        if held && let Some(n) = self.nodes.get_mut(&node) {
            n.allocator.release(id);
            n.unreserve(&requested);
            self.changes.nodes.insert(node.clone());
            self.reindex(&node);
        }
        Some(node)
    }

    /// Fails every session the controller placed that `check` no longer allows (its owner's
    /// grant was withdrawn), with `check`'s reason; returns the releases for their nodes.
    #[must_use = "the failed sessions must be released on their nodes"]
    pub fn fail_ungranted(&mut self, check: impl Fn(&Session) -> Option<String>) -> Vec<Command> {
        let failing: Vec<(String, String)> = self
            .sessions
            .values()
            .filter(|s| !s.state.is_final() && s.origin == Origin::Controller)
            .filter_map(|s| check(s).map(|why| (s.id.clone(), why)))
            .collect();
        failing
            .into_iter()
            .filter_map(|(id, why)| {
                let node = self.finish(&id, SessionState::Failed, &why)?;
                Some(Command::Release { node, session: id })
            })
            .collect()
    }
}
