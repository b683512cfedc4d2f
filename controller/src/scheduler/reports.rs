//! What an agent reports of a session placed on its node: that it holds it (an ack), what it
//! did to enforce it (events, some of which move the session: preempted, suspended, resumed,
//! released), or that it refused it (a nack).

use super::{Command, Scheduler, set_state};
use crate::session::{Action, EnforcementEvent, Origin, SessionState};

impl Scheduler {
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
        let (action, used_bytes, interrupted) = (
            event.action.clone(),
            event.used_bytes,
            event.move_interrupted,
        );
        let terminating = s.state == SessionState::Terminating;
        s.record_event(event);
        self.changes.sessions.insert(session.to_owned());
        if terminating {
            // Only the end of its workload matters now: the client asked it to end, so a
            // preemption that finished first ends it as terminated too, and a suspension is
            // not kept (the Release that follows ends the suspended workload).
            match action {
                Action::Released => {
                    self.released(node, session, "released it");
                }
                Action::Preempted => {
                    self.released(
                        node,
                        session,
                        "ended its workload (preempted) and released it",
                    );
                }
                _ => {}
            }
            return true;
        }
        match action {
            Action::Preempted => {
                self.preempted(node, session);
            }
            Action::Suspended => self.suspended(node, session, used_bytes),
            Action::Resumed => self.resumed(node, session),
            Action::ResumeRefused => self.resume_refused(node, session, interrupted),
            _ => {}
        }
        true
    }

    /// The agent on `node` refused `session`: release and fail it with the agent's reason. A
    /// member of a gang refused before it ever ran takes its gang down with it (all or nothing
    /// at the start too, as Kueue evicts a workload whose pods do not all start): the other
    /// members that hold resources fail as well, and the returned releases are for their nodes,
    /// to be sent once the failures are stored.
    #[must_use = "the gang's other members must be released on their nodes"]
    pub fn nack(&mut self, node: &str, session: &str, reason: &str, message: &str) -> Vec<Command> {
        // A MIG instance it would not make: the session still waits (issue 37 §3).
        if self.mig_refused(node, session, reason, message) {
            return Vec::new();
        }
        let Some(s) = self.sessions.get_mut(session) else {
            return Vec::new();
        };
        if s.node.as_deref() != Some(node)
            || !s.state.holds_resources()
            || s.origin != Origin::Controller
        {
            return Vec::new();
        }
        let text = if message.is_empty() {
            reason.to_owned()
        } else {
            format!("{reason}: {message}")
        };
        if s.state == SessionState::Terminating {
            // Refused before it was released: the agent holds nothing of it.
            self.released(
                node,
                session,
                &format!("refused it ({text}), so held nothing"),
            );
            return Vec::new();
        }
        let never_ran = s.state == SessionState::Scheduled;
        let gang = s.gang.clone().map(|g| (s.owner.clone(), g.name));
        set_state(s, SessionState::Failed, &text);
        let (owner, requested) = (s.owner.clone(), s.requested.clone());
        self.tracker.remove(&owner, session);
        self.live.ended(&owner);
        self.changes.sessions.insert(session.to_owned());
        if let Some(n) = self.nodes.get_mut(node) {
            n.allocator.release(session);
            n.unreserve(&requested);
            self.changes.nodes.insert(node.to_owned());
            self.reindex(node);
        }
        let Some((owner, name)) = gang.filter(|_| never_ran) else {
            return Vec::new();
        };
        let mates: Vec<String> = self
            .live_members(&owner, &name)
            .iter()
            .filter(|m| m.id != session && m.state.holds_resources())
            .map(|m| m.id.clone())
            .collect();
        let why = format!(
            "gang {name} could not start whole: member {session} was refused by its node ({text})"
        );
        mates
            .into_iter()
            .filter_map(|id| {
                let node = self.finish(&id, SessionState::Failed, &why)?;
                Some(Command::Release { node, session: id })
            })
            .collect()
    }
}
