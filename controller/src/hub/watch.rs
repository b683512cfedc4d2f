//! Sessions as clients list and watch them (docs/architecture.md, "Watching sessions").
//!
//! Every stored change to a session is numbered by one counter, the revision, that only grows:
//! the controller stamps each changed session as it submits the change and keeps the counter in
//! the store (each session record carries its revision; [`RevisionMark`] keeps what forgotten
//! sessions took with them), so a restarted controller or a new leader goes on from where the
//! last one stopped.
//!
//! [`SessionLog`] holds the latest *stored* state of every session, indexed by its revision. A
//! watcher is a cursor into it, not a buffer: when it reads it is sent every session whose
//! revision is past its cursor, in revision order, and its cursor moves on. A watcher that reads
//! slowly therefore misses intermediate states but never a session's latest one, and costs the
//! controller nothing while it lags. Only two things end a watch: the controller stops leading
//! (or takes office again), and a cursor older than [`RevisionMark::compacted`] (an ended
//! session forgotten after its last state was stored cannot be replayed to it), which is told to
//! list again, as Kubernetes answers 410 Gone.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    ops::Bound,
    sync::{Arc, Mutex, MutexGuard},
};

use gpuwarden_proto::v1 as pb;
use prost::Message as _;
use tokio::sync::{mpsc, watch};
use tonic::Status;

use crate::{convert, session::Session, store::RevisionMark};

/// Sessions sent to a watcher per look at the log (the lock is not held while sending).
const BATCH: usize = 256;

/// The revision of a store in which nothing was ever numbered. Not 0: `since_revision` 0 has
/// long meant "from now" to `WatchSessions`, so a listing that answered 0 on an empty store led
/// a client that lists, then watches from the listing's revision, to miss every session created
/// in between (issue 40; `controller/tests/watch.rs` shows it). No session is stamped with it.
pub const GENESIS: u64 = 1;

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// After this revision: every session whose latest change is newer is sent first.
    After(u64),
    /// From the latest revision stored now: only changes from now on.
    Now,
}

/// Why a watch cannot go on from where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    /// The cursor is older than what the log can replay.
    #[error(
        "revision {since} is older than the oldest this controller can replay ({compacted}: an \
         ended session whose last change came after it has been forgotten); list the sessions \
         again and watch from the listing's revision"
    )]
    TooOld {
        /// Where the watch was.
        since: u64,
        /// The oldest revision a watch may resume from.
        compacted: u64,
    },
    /// The revision is ahead of any this controller has numbered.
    #[error(
        "revision {since} is newer than any this controller has stored ({latest}); list the \
         sessions again and watch from the listing's revision"
    )]
    TooNew {
        /// What was asked for.
        since: u64,
        /// The latest revision numbered.
        latest: u64,
    },
    /// The controller stepped down or took office again: its log was replaced.
    #[error("this controller's term changed; watch the leader again from revision {resume}")]
    TermEnded {
        /// The last revision the watcher was sent.
        resume: u64,
    },
}

/// The index: each session's latest stored state by revision, and by creation for listing.
#[derive(Debug, Default)]
struct Log {
    /// Keyed by (revision, id): sessions stored before revisions share revision 0.
    by_revision: BTreeMap<(u64, String), Arc<pb::Session>>,
    /// Each session's key in `by_revision`.
    revision_of: HashMap<String, u64>,
    /// (`created_at_ms`, id) of every session: the listing order.
    by_created: BTreeSet<(i64, String)>,
    /// The latest revision stored and published.
    revision: u64,
    /// The oldest revision a watch may resume from.
    compacted: u64,
    /// Bumped when the log is replaced (a new term) or closed (stepping down).
    term: u64,
}

impl Log {
    fn insert(&mut self, s: Arc<pb::Session>) {
        self.revision = self.revision.max(s.revision);
        match self.revision_of.insert(s.id.clone(), s.revision) {
            Some(old) => {
                self.by_revision.remove(&(old, s.id.clone()));
            }
            None => {
                self.by_created.insert((s.created_at_ms, s.id.clone()));
            }
        }
        self.by_revision.insert((s.revision, s.id.clone()), s);
    }

    fn remove(&mut self, id: &str) {
        if let Some(old) = self.revision_of.remove(id)
            && let Some(s) = self.by_revision.remove(&(old, id.to_owned()))
        {
            self.by_created.remove(&(s.created_at_ms, s.id.clone()));
        }
    }
}

/// One page of a listing.
#[derive(Debug)]
pub struct Page {
    /// The sessions, in creation order.
    pub sessions: Vec<pb::Session>,
    /// Where the next page starts, when there is one.
    pub next: Option<(i64, String)>,
    /// The revision the log was at.
    pub revision: u64,
}

/// The latest stored state of every session, for listing and watching, and the revision
/// counter.
#[derive(Debug)]
pub struct SessionLog {
    log: Mutex<Log>,
    /// The counter: the last revision handed out, and the highest compacted one submitted. Only
    /// touched under the scheduler's lock, so revisions are handed out in the order changes are
    /// submitted to the store.
    counter: Mutex<RevisionMark>,
    /// (term, revision) as published: what watchers wait on.
    published: watch::Sender<(u64, u64)>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.locked()
}

impl SessionLog {
    /// An empty log, its counter at 0 (see [`SessionLog::reset`]).
    #[must_use]
    pub fn new() -> Self {
        Self {
            log: Mutex::new(Log::default()),
            counter: Mutex::new(RevisionMark::default()),
            published: watch::channel((0, 0)).0,
        }
    }

    /// Starts a new term over `sessions` as restored (each with its stored revision) and `mark`:
    /// the counter goes on past everything stored, and watchers of the old term end.
    pub fn reset<'a>(&self, sessions: impl IntoIterator<Item = &'a Session>, mark: RevisionMark) {
        let mut log = lock(&self.log);
        let term = log.term + 1;
        *log = Log {
            term,
            compacted: mark.compacted,
            revision: mark.last.max(mark.compacted).max(GENESIS),
            ..Log::default()
        };
        for s in sessions {
            log.insert(Arc::new(convert::session_to_pb(s)));
        }
        *lock(&self.counter) = RevisionMark {
            last: log.revision,
            compacted: log.compacted,
        };
        self.published.send_replace((term, log.revision));
    }

    /// Ends the term without a new one (stepping down): every watcher ends.
    pub fn close(&self) {
        let mut log = lock(&self.log);
        log.term += 1;
        self.published.send_replace((log.term, log.revision));
    }

    /// The next revision (call under the scheduler's lock).
    pub(crate) fn next_revision(&self) -> u64 {
        let mut counter = lock(&self.counter);
        counter.last += 1;
        counter.last
    }

    /// Records that sessions `removed` are forgotten (call under the scheduler's lock): the mark
    /// to store with their removal.
    pub(crate) fn forget(&self, removed: &[String]) -> RevisionMark {
        // The log first and alone: `start` takes the log, then the counter.
        let known: Vec<Option<u64>> = {
            let log = lock(&self.log);
            removed
                .iter()
                .map(|id| log.revision_of.get(id).copied())
                .collect()
        };
        let mut counter = lock(&self.counter);
        for revision in known {
            // A final state not yet published may still be committing: its revision is at most
            // the counter.
            counter.compacted = counter.compacted.max(revision.unwrap_or(counter.last));
        }
        *counter
    }

    /// Publishes stored changes (in revision order): `changed` sessions' new states, `removed`
    /// ones forgotten, and the compacted revision that goes with them.
    pub(crate) fn publish(
        &self,
        changed: Vec<Arc<pb::Session>>,
        removed: &[String],
        compacted: u64,
    ) {
        let mut log = lock(&self.log);
        for s in changed {
            log.insert(s);
        }
        for id in removed {
            log.remove(id);
        }
        log.compacted = log.compacted.max(compacted);
        self.published.send_replace((log.term, log.revision));
    }

    /// The latest revision stored and published.
    #[must_use]
    pub fn revision(&self) -> u64 {
        lock(&self.log).revision
    }

    /// Session `id` in its latest stored state: what a listing or a watch would show, never a
    /// change a failover could still lose.
    #[must_use]
    pub fn get(&self, id: &str) -> Option<Arc<pb::Session>> {
        let log = lock(&self.log);
        let revision = log.revision_of.get(id)?;
        log.by_revision.get(&(*revision, id.to_owned())).cloned()
    }

    /// Where a watch from `start` starts, and the term it belongs to.
    ///
    /// # Errors
    /// The revision is older than what can be replayed, or newer than any handed out.
    pub fn start(&self, start: Start) -> Result<(u64, u64), WatchError> {
        let log = lock(&self.log);
        let since = match start {
            Start::Now => return Ok((log.revision, log.term)),
            Start::After(since) => since,
        };
        if since < log.compacted {
            return Err(WatchError::TooOld {
                since,
                compacted: log.compacted,
            });
        }
        // Handed out but not yet published is fine: it is being stored, and will be sent.
        let latest = lock(&self.counter).last;
        if since > latest {
            return Err(WatchError::TooNew { since, latest });
        }
        Ok((since, log.term))
    }

    /// Up to `most` sessions whose revision is past `cursor`, in revision order.
    ///
    /// # Errors
    /// The term ended, or `cursor` fell behind what can be replayed.
    pub fn after(
        &self,
        cursor: u64,
        term: u64,
        most: usize,
    ) -> Result<Vec<Arc<pb::Session>>, WatchError> {
        let log = lock(&self.log);
        if log.term != term {
            return Err(WatchError::TermEnded { resume: cursor });
        }
        if cursor < log.compacted {
            return Err(WatchError::TooOld {
                since: cursor,
                compacted: log.compacted,
            });
        }
        Ok(log
            .by_revision
            .range((cursor.saturating_add(1), String::new())..)
            .take(most)
            .map(|(_, s)| Arc::clone(s))
            .collect())
    }

    /// A page of the sessions `keep` accepts, in creation order, starting after `after`: at most
    /// `size` of them and, past the first, no more than `budget` encoded bytes.
    pub fn page(
        &self,
        keep: impl Fn(&pb::Session) -> bool,
        after: Option<&(i64, String)>,
        size: usize,
        budget: usize,
    ) -> Page {
        let log = lock(&self.log);
        let start = match after {
            Some(key) => Bound::Excluded(key.clone()),
            None => Bound::Unbounded,
        };
        let mut sessions = Vec::new();
        let mut bytes = 0;
        let mut next = None;
        for key in log.by_created.range((start, Bound::Unbounded)) {
            let Some(s) = log
                .revision_of
                .get(&key.1)
                .and_then(|r| log.by_revision.get(&(*r, key.1.clone())))
            else {
                continue;
            };
            if !keep(s) {
                continue;
            }
            let len = s.encoded_len();
            if sessions.len() == size || (!sessions.is_empty() && bytes + len > budget) {
                next = sessions
                    .last()
                    .map(|s: &pb::Session| (s.created_at_ms, s.id.clone()));
                break;
            }
            bytes += len;
            sessions.push(pb::Session::clone(s));
        }
        Page {
            sessions,
            next,
            revision: log.revision,
        }
    }

    /// Waits until something is published after `seen` (term, revision).
    pub async fn changed(&self, seen: (u64, u64)) {
        let mut rx = self.published.subscribe();
        // `wait_for` looks at the current value first: nothing published since is missed.
        let _ = rx.wait_for(|now| *now != seen).await;
    }

    fn published(&self) -> (u64, u64) {
        *self.published.borrow()
    }
}

impl Default for SessionLog {
    fn default() -> Self {
        Self::new()
    }
}

/// A watch's state filter (`states` of `WatchSessionsRequest` and
/// `WatchSessionEventsRequest`, issue 40): it lets through sessions in one of its states (all,
/// when it has none), and a session it let through once more when it leaves them, so that the
/// watcher learns it left. It remembers the sessions it let through that may still leave: not
/// those in a final state, which never changes again.
#[derive(Debug, Clone, Default)]
pub struct StateFilter {
    states: BTreeSet<i32>,
    sent: BTreeSet<String>,
}

impl StateFilter {
    /// A filter of these states (`pb::SessionState` numbers); none: every session.
    #[must_use]
    pub fn new(states: &[i32]) -> Self {
        Self {
            states: states.iter().copied().collect(),
            sent: BTreeSet::new(),
        }
    }

    /// Whether `s`, in its latest state, goes to the watcher.
    pub fn admits(&mut self, s: &pb::Session) -> bool {
        if self.states.is_empty() {
            return true;
        }
        if self.states.contains(&s.state) {
            let ended = matches!(
                s.state(),
                pb::SessionState::Terminated
                    | pb::SessionState::Failed
                    | pb::SessionState::Preempted
            );
            if ended {
                self.sent.remove(&s.id);
            } else {
                self.sent.insert(s.id.clone());
            }
            return true;
        }
        // It left the states asked for: sent once more, in its new state.
        self.sent.remove(&s.id)
    }
}

/// A watch's stream (`WatchSessions`): a task sends what `see` lets through, from `start` (the
/// cursor and term [`SessionLog::start`] gave), into a small channel; the client's reading paces
/// it. `hold` (the watch's place in the caps) lives as long as the task. `ended` says what a watch
/// whose term ended is told.
pub fn stream<H: Send + 'static>(
    log: Arc<SessionLog>,
    start: (u64, u64),
    see: impl FnMut(&pb::Session) -> bool + Send + 'static,
    ended: impl Fn(WatchError) -> Status + Send + 'static,
    hold: H,
) -> mpsc::Receiver<Result<pb::Session, Status>> {
    follow(log, start, see, ended, hold, |s| s, None)
}

/// [`stream`] as `WatchSessionEvents` sends it: sessions, and bookmarks. A bookmark goes out
/// when the watch first catches up with the log (the replay is over), and whenever it catches
/// up again with its cursor past the last revision it sent (changes `see` held back moved it), so
/// a watcher that sees few of the changes still learns a recent revision to resume from.
pub fn events<H: Send + 'static>(
    log: Arc<SessionLog>,
    start: (u64, u64),
    see: impl FnMut(&pb::Session) -> bool + Send + 'static,
    ended: impl Fn(WatchError) -> Status + Send + 'static,
    hold: H,
) -> mpsc::Receiver<Result<pb::SessionEvent, Status>> {
    use pb::session_event::Event;
    follow(
        log,
        start,
        see,
        ended,
        hold,
        |s| pb::SessionEvent {
            event: Some(Event::Session(s)),
        },
        Some(|revision| pb::SessionEvent {
            event: Some(Event::Bookmark(pb::WatchBookmark { revision })),
        }),
    )
}

/// The loop behind [`stream`] and [`events`]: replays and then follows the log from `cursor` in
/// `term`, sending each session `see` lets through as `session` makes it and, when `bookmark` is
/// given, a bookmark as [`events`] says. The first error (the term ended, the cursor fell behind
/// what can be replayed) is sent through `ended` and ends the watch, as does the client going
/// away.
fn follow<T: Send + 'static, H: Send + 'static>(
    log: Arc<SessionLog>,
    (mut cursor, term): (u64, u64),
    mut see: impl FnMut(&pb::Session) -> bool + Send + 'static,
    ended: impl Fn(WatchError) -> Status + Send + 'static,
    hold: H,
    session: fn(pb::Session) -> T,
    bookmark: Option<fn(u64) -> T>,
) -> mpsc::Receiver<Result<T, Status>> {
    let (tx, rx) = mpsc::channel(32);
    tokio::spawn(async move {
        let _hold = hold;
        // The last revision the watcher was told of; `None` before the first catch-up, and
        // always without bookmarks (only a bookmark makes it `Some`).
        let mut told: Option<u64> = None;
        loop {
            let seen = log.published();
            let batch = match log.after(cursor, term, BATCH) {
                Ok(batch) => batch,
                Err(e) => {
                    let _ = tx.send(Err(ended(e))).await;
                    return;
                }
            };
            if batch.is_empty() {
                if let Some(bookmark) = bookmark
                    && told.is_none_or(|t| t < cursor)
                {
                    told = Some(cursor);
                    if tx.send(Ok(bookmark(cursor))).await.is_err() {
                        return;
                    }
                }
                tokio::select! {
                    () = log.changed(seen) => continue,
                    () = tx.closed() => return,
                }
            }
            for s in batch {
                cursor = s.revision;
                if !see(&s) {
                    continue;
                }
                if told.is_some() {
                    told = Some(cursor);
                }
                if tx.send(Ok(session(pb::Session::clone(&s)))).await.is_err() {
                    return;
                }
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(id: &str, revision: u64, created: i64) -> Arc<pb::Session> {
        Arc::new(pb::Session {
            id: id.into(),
            revision,
            created_at_ms: created,
            ..Default::default()
        })
    }

    fn ids(v: &[Arc<pb::Session>]) -> Vec<(&str, u64)> {
        v.iter().map(|s| (s.id.as_str(), s.revision)).collect()
    }

    #[test]
    fn a_cursor_gets_the_latest_state_of_each_session_changed_after_it_in_revision_order() {
        let log = SessionLog::new();
        log.reset([], RevisionMark::default());
        let (_, term) = log.start(Start::Now).unwrap();
        log.publish(vec![s("a", 1, 1), s("b", 2, 2), s("c", 3, 3)], &[], 0);
        log.publish(vec![s("a", 4, 1), s("b", 5, 2)], &[], 0);
        log.publish(vec![s("a", 6, 1)], &[], 0);
        assert_eq!(
            ids(&log.after(0, term, 10).unwrap()),
            [("c", 3), ("b", 5), ("a", 6)]
        );
        assert_eq!(ids(&log.after(5, term, 10).unwrap()), [("a", 6)]);
        assert_eq!(ids(&log.after(3, term, 1).unwrap()), [("b", 5)]);
        assert!(log.after(6, term, 10).unwrap().is_empty());
    }

    #[test]
    fn a_forgotten_session_makes_older_cursors_too_old() {
        let log = SessionLog::new();
        log.reset([], RevisionMark::default());
        let (_, term) = log.start(Start::Now).unwrap();
        // The first revision handed out follows the empty store's.
        for r in 2..=4 {
            assert_eq!(log.next_revision(), r);
        }
        log.publish(vec![s("a", 2, 1), s("b", 3, 2), s("c", 4, 3)], &[], 0);
        let mark = log.forget(&["b".to_owned()]);
        assert_eq!(
            mark,
            RevisionMark {
                last: 4,
                compacted: 3
            }
        );
        log.publish(vec![], &["b".to_owned()], mark.compacted);
        assert_eq!(
            log.after(2, term, 10),
            Err(WatchError::TooOld {
                since: 2,
                compacted: 3
            })
        );
        assert_eq!(ids(&log.after(3, term, 10).unwrap()), [("c", 4)]);
        assert!(matches!(
            log.start(Start::After(2)),
            Err(WatchError::TooOld { .. })
        ));
        assert!(matches!(
            log.start(Start::After(5)),
            Err(WatchError::TooNew { .. })
        ));
        assert_eq!(log.start(Start::After(4)), Ok((4, term)));
        assert_eq!(log.start(Start::Now), Ok((4, term)));
    }

    #[test]
    fn an_empty_store_is_at_the_genesis_revision_and_a_watch_after_it_gets_every_create() {
        let log = SessionLog::new();
        log.reset([], RevisionMark::default());
        // What a listing of the empty store answers: never 0, which means "now" to a watch.
        assert_eq!(log.revision(), GENESIS);
        let (cursor, term) = log.start(Start::After(log.revision())).unwrap();
        let r = log.next_revision();
        log.publish(vec![s("a", r, 1)], &[], 0);
        assert_eq!(ids(&log.after(cursor, term, 10).unwrap()), [("a", 2)]);
        assert_eq!(log.get("a").map(|s| s.revision), Some(2));
        assert!(log.get("b").is_none());
    }

    #[test]
    fn a_new_term_goes_on_past_every_stored_revision_and_ends_old_cursors() {
        let log = SessionLog::new();
        log.reset([], RevisionMark::default());
        let (_, old) = log.start(Start::Now).unwrap();
        log.reset(
            [],
            RevisionMark {
                last: 40,
                compacted: 7,
            },
        );
        assert_eq!(log.next_revision(), 41);
        assert_eq!(
            log.after(10, old, 10),
            Err(WatchError::TermEnded { resume: 10 })
        );
        assert_eq!(log.revision(), 40);
    }

    #[test]
    fn pages_follow_creation_order_and_stop_at_size_or_bytes() {
        let log = SessionLog::new();
        log.reset([], RevisionMark::default());
        #[expect(clippy::cast_possible_wrap, reason = "test indices below 10")]
        let all: Vec<Arc<pb::Session>> = (0..10)
            .map(|i| s(&format!("s{i}"), 10 - i, i as i64))
            .collect();
        log.publish(all, &[], 0);
        let page = log.page(|_| true, None, 4, usize::MAX);
        let names: Vec<&str> = page.sessions.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(names, ["s0", "s1", "s2", "s3"]);
        assert_eq!(page.next, Some((3, "s3".to_owned())));
        // A session changed between pages keeps its place.
        log.publish(vec![s("s2", 11, 2), s("s5", 12, 5)], &[], 0);
        let page = log.page(|_| true, page.next.as_ref(), 4, usize::MAX);
        let names: Vec<&str> = page.sessions.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(names, ["s4", "s5", "s6", "s7"]);
        let last = log.page(|_| true, page.next.as_ref(), 4, usize::MAX);
        assert_eq!(last.sessions.len(), 2);
        assert_eq!(last.next, None);
        // The byte budget stops a page early, but never before its first session.
        let tiny = log.page(|_| true, None, 100, 1);
        assert_eq!(tiny.sessions.len(), 1);
        assert!(tiny.next.is_some());
    }
}
