//! Idempotent creates (issue 40; docs/api.md, "Retrying"): a `CreateSession` sent again with the
//! `request_id` its first try carried answers the session that try made instead of making a
//! second one.
//!
//! The request id is kept on the session's own record, so the index here is rebuilt from the
//! store after a restart or a leader change, on sled and etcd alike, and leaves with the record
//! when an ended session is forgotten. A retry is recognised for [`REQUEST_WINDOW_MS`] after the
//! first create, while the session is remembered (ended ones are kept for the retention: a day
//! and at most 10,000 by default).

use super::{NewSession, RequestError, Scheduler};
use crate::session::Session;

/// How long after a create its request id still finds it: a day, the longest a client's retry
/// policy waits by any measure we know of, and no longer than ended sessions are kept by default.
pub const REQUEST_WINDOW_MS: i64 = 24 * 60 * 60 * 1_000;

/// What a create with a request id did.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    /// It made this session.
    New(Session),
    /// An earlier create of the same owner and request id made this one: nothing changed.
    Retried(Session),
}

impl Scheduler {
    /// Queues a new session, unless `request_id` names one `new`'s owner created within
    /// [`REQUEST_WINDOW_MS`] before `now_ms`: that one is answered instead.
    ///
    /// # Errors
    /// As [`Scheduler::create`], for a new session only.
    pub fn create_once(
        &mut self,
        new: NewSession,
        request_id: Option<String>,
        now_ms: i64,
    ) -> Result<Created, RequestError> {
        if let Some(first) = request_id
            .as_deref()
            .and_then(|r| self.retried(&new.owner, r, now_ms))
        {
            return Ok(Created::Retried(first.clone()));
        }
        let mut session = self.create(new)?;
        if let Some(request_id) = request_id {
            self.requests.insert(
                (session.owner.clone(), request_id.clone()),
                session.id.clone(),
            );
            if let Some(s) = self.sessions.get_mut(&session.id) {
                s.request_id = Some(request_id.clone());
            }
            session.request_id = Some(request_id);
        }
        Ok(Created::New(session))
    }

    /// The session `owner` created with `request_id` within [`REQUEST_WINDOW_MS`] before
    /// `now_ms`, if it is remembered.
    #[must_use]
    pub fn retried(&self, owner: &str, request_id: &str, now_ms: i64) -> Option<&Session> {
        let id = self
            .requests
            .get(&(owner.to_owned(), request_id.to_owned()))?;
        self.sessions
            .get(id)
            .filter(|s| now_ms.saturating_sub(s.created_at_ms) < REQUEST_WINDOW_MS)
    }

    /// Writes session `id` again with the next commit: a retried create whose first commit has
    /// not landed yet (it failed, or is under way) then answers once the session is stored.
    pub fn rewrite(&mut self, id: &str) {
        if self.sessions.contains_key(id) {
            self.changes.sessions.insert(id.to_owned());
        }
    }

    /// Indexes a restored session's request id.
    pub(super) fn index_request(&mut self, s: &Session) {
        if let Some(request_id) = &s.request_id {
            self.requests
                .insert((s.owner.clone(), request_id.clone()), s.id.clone());
        }
    }

    /// Drops a forgotten session's request id from the index (unless a later create reused it).
    pub(super) fn forget_request(&mut self, s: &Session) {
        if let Some(request_id) = &s.request_id {
            let key = (s.owner.clone(), request_id.clone());
            if self.requests.get(&key) == Some(&s.id) {
                self.requests.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        node::NodeReport, scheduler::SchedulerConfig, slots::ResourceSlot, store::Snapshot,
    };

    fn scheduler() -> Scheduler {
        let mut s = Scheduler::new(SchedulerConfig::default());
        s.register(NodeReport::with_gpus("n1", 8, 80 << 30, 8), &[])
            .expect("registers");
        s
    }

    fn new(id: &str, owner: &str) -> NewSession {
        NewSession {
            id: id.into(),
            owner: owner.into(),
            requested: ResourceSlot::parse_any(&["cuda.shares=0.1"]).expect("valid"),
            ..NewSession::default()
        }
    }

    #[test]
    fn a_retry_within_the_window_answers_the_first_session_per_owner() {
        let mut s = scheduler();
        let t = crate::session::now_ms();
        let Created::New(first) = s.create_once(new("a", "u"), Some("r1".into()), t).unwrap()
        else {
            panic!("the first create makes a session");
        };
        assert_eq!(first.request_id.as_deref(), Some("r1"));
        // The retry's own id is never used.
        assert_eq!(
            s.create_once(new("b", "u"), Some("r1".into()), t + 1)
                .unwrap(),
            Created::Retried(s.sessions()["a"].clone())
        );
        assert!(!s.sessions().contains_key("b"));
        // Another owner's request ids are its own.
        assert!(matches!(
            s.create_once(new("c", "v"), Some("r1".into()), t + 1),
            Ok(Created::New(_))
        ));
        // Past the window the id is free again: the window runs from the session's creation,
        // which may be a millisecond after `t`.
        let past = first.created_at_ms + REQUEST_WINDOW_MS;
        assert!(matches!(
            s.create_once(new("d", "u"), Some("r1".into()), past),
            Ok(Created::New(_))
        ));
        // No request id: every create makes a session.
        assert!(matches!(
            s.create_once(new("e", "u"), None, t),
            Ok(Created::New(_))
        ));
        assert!(matches!(
            s.create_once(new("f", "u"), None, t),
            Ok(Created::New(_))
        ));
    }

    #[test]
    fn the_index_is_rebuilt_from_the_stored_sessions() {
        let mut s = scheduler();
        let t = crate::session::now_ms();
        s.create_once(new("a", "u"), Some("r1".into()), t).unwrap();
        let stored = Snapshot {
            sessions: s.sessions().values().cloned().collect(),
            ..Snapshot::default()
        };
        let restored = Scheduler::restore(SchedulerConfig::default(), stored);
        assert_eq!(
            restored.retried("u", "r1", t + 1).map(|x| x.id.as_str()),
            Some("a")
        );
    }
}
