//! Gangs (issue 24 §3): sessions of one owner placed all at once or not at all.
//!
//! A gang is named by its owner and its name. A pass takes a gang where its first pending member
//! stands in the queue: while fewer than `size` members exist it waits (not blocking the queue:
//! an incomplete gang is not ready to run); once all exist, its pending members are tried one
//! after another through the same predicates and placement as a single session, each seeing the
//! capacity the ones before took, and if any does not fit every reservation made for the others
//! is undone before anyone else is tried. No partial gang ever holds a device, and a gang that
//! does not fit counts as one failed session for the head-of-line rule (`skip_after`).

use std::collections::{BTreeMap, BTreeSet};

use super::{Command, Scheduler};
use crate::{
    session::{Gang, GangError, Session, SessionState},
    slots::ResourceSlot,
};

/// A gang's key: its owner, then its name.
pub(super) type GangKey = (String, String);

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

    /// Places every one of `members` or none: each goes through the predicates and placement
    /// a single session does ([`Self::try_session`]), seeing what the ones before took; at the
    /// first that fails, what the others reserved is released and their records (and `held`,
    /// and the changes to store) are as before. Returns the commands, or why the gang waits.
    pub(super) fn try_gang(
        &mut self,
        members: &[String],
        governed: bool,
        held: &mut BTreeMap<Option<String>, ResourceSlot>,
    ) -> Result<Vec<Command>, String> {
        let saved_held = held.clone();
        let saved_changes = (self.changes.sessions.clone(), self.changes.nodes.clone());
        let mut placed: Vec<Session> = Vec::new();
        let mut commands = Vec::new();
        for id in members {
            let Some(before) = self.sessions.get(id).cloned() else {
                continue;
            };
            let queue = self.queue_key(governed, &before.owner);
            match self.try_session(id, queue.as_deref(), governed, held) {
                super::pass::Verdict::Placed(command) => {
                    if governed {
                        let entry = held.entry(queue).or_default();
                        *entry = entry
                            .checked_add(&before.requested)
                            .unwrap_or_else(|| entry.clone());
                    }
                    commands.push(command);
                    placed.push(before);
                }
                super::pass::Verdict::Refused(why) | super::pass::Verdict::NoRoom(why) => {
                    for before in placed.into_iter().rev() {
                        self.unplace(before);
                    }
                    *held = saved_held;
                    (self.changes.sessions, self.changes.nodes) = saved_changes;
                    return Err(why);
                }
            }
        }
        Ok(commands)
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
