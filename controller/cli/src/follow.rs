//! Sessions as the CLI follows them (docs/architecture.md, "Watching sessions"): list, then watch
//! from the listing's revision. When the stream breaks (the controller restarted, or another one
//! leads now) the follower connects again — to whichever controller leads — and resumes from the
//! last revision it received; when the controller says that revision can no longer be served, it
//! lists again and goes on from the new listing. Nothing that changed is missed.
//!
//! It watches with `WatchSessionEvents`, whose bookmarks move its revision past changes it is not
//! shown (other owners' sessions), so that a resumed watch starts from a recent revision rather
//! than one the forgetting of ended sessions made too old; a controller from before them answers
//! `UNIMPLEMENTED`, and the follower then watches with `WatchSessions` as before.

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use gpuwarden_proto::v1 as pb;
use tokio_stream::StreamExt as _;
use tonic::{Code, Status, Streaming};

use super::{CliError, Client, ControllerArgs, connect};

/// How long the follower keeps trying to reach a leading controller before it gives up.
const GIVE_UP: Duration = Duration::from_mins(1);
/// The longest pause between two tries.
const MOST_BACKOFF: Duration = Duration::from_secs(2);

/// Every session `owner` may see (empty: all the caller may), page by page, and the revision the
/// listing reflects.
///
/// # Errors
/// The controller refuses or can't be reached.
pub async fn list_all(client: &mut Client, owner: &str) -> Result<(Vec<pb::Session>, u64), Status> {
    let mut sessions = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_sessions(pb::ListSessionsRequest {
                owner: owner.to_owned(),
                page_size: 0,
                page_token,
                states: Vec::new(),
            })
            .await?
            .into_inner();
        sessions.extend(page.sessions);
        if page.next_page_token.is_empty() {
            return Ok((sessions, page.revision));
        }
        page_token = page.next_page_token;
    }
}

/// The revision the controller's sessions are at now (one listing of one session).
///
/// # Errors
/// The controller refuses or can't be reached.
pub async fn revision_now(client: &mut Client) -> Result<u64, Status> {
    Ok(client
        .list_sessions(pb::ListSessionsRequest {
            page_size: 1,
            ..Default::default()
        })
        .await?
        .into_inner()
        .revision)
}

/// An open watch: with bookmarks, or of bare sessions from an older controller.
enum Stream {
    Events(Streaming<pb::SessionEvent>),
    Sessions(Streaming<pb::Session>),
}

/// What a watch sent next.
enum Next {
    Session(Box<pb::Session>),
    Bookmark(u64),
}

impl Stream {
    async fn next(&mut self) -> Option<Result<Next, Status>> {
        use pb::session_event::Event;
        match self {
            Self::Sessions(s) => s
                .next()
                .await
                .map(|r| r.map(|s| Next::Session(Box::new(s)))),
            Self::Events(s) => loop {
                match s.next().await? {
                    Ok(pb::SessionEvent {
                        event: Some(Event::Session(session)),
                    }) => return Some(Ok(Next::Session(Box::new(session)))),
                    Ok(pb::SessionEvent {
                        event: Some(Event::Bookmark(b)),
                    }) => return Some(Ok(Next::Bookmark(b.revision))),
                    // An event of a kind added later: nothing to act on.
                    Ok(pb::SessionEvent { event: None }) => {}
                    Err(status) => return Some(Err(status)),
                }
            },
        }
    }
}

/// A watch that survives controller restarts and leader changes.
pub struct Follower<'a> {
    controller: &'a ControllerArgs,
    client: Client,
    stream: Option<Stream>,
    /// The controller has no `WatchSessionEvents` (from before issue 40).
    plain: bool,
    /// The last revision handed out.
    revision: u64,
    /// Sessions a new listing found changed, to hand out before the watch goes on.
    listed: VecDeque<pb::Session>,
    /// Revisions of sessions handed out from a listing past its revision: the watch sends them
    /// again, and they are passed over.
    ahead: HashMap<String, u64>,
}

impl<'a> Follower<'a> {
    /// Follows every change after `revision` (one a listing gave), starting on `client`.
    #[must_use]
    pub fn new(controller: &'a ControllerArgs, client: Client, revision: u64) -> Self {
        Self {
            controller,
            client,
            stream: None,
            plain: false,
            revision,
            listed: VecDeque::new(),
            ahead: HashMap::new(),
        }
    }

    /// The last revision handed out (where a resumed watch starts).
    #[must_use]
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The next session to change, in its latest state.
    ///
    /// # Errors
    /// The controller refuses the watch for a reason other than a restart or a leader change,
    /// or no controller leads for [`GIVE_UP`].
    pub async fn next(&mut self) -> Result<pb::Session, CliError> {
        loop {
            if let Some(s) = self.listed.pop_front() {
                return Ok(s);
            }
            if self.stream.is_none() {
                // Said outright: the revision is a listing's, a session's or a bookmark's, and
                // a watch after it must send everything newer, 0 included.
                let start = pb::WatchStart::AfterRevision.into();
                let opened = if self.plain {
                    self.client
                        .watch_sessions(pb::WatchSessionsRequest {
                            since_revision: self.revision,
                            start,
                            ..Default::default()
                        })
                        .await
                        .map(|s| Stream::Sessions(s.into_inner()))
                } else {
                    self.client
                        .watch_session_events(pb::WatchSessionEventsRequest {
                            since_revision: self.revision,
                            start,
                            owner: String::new(),
                            ..Default::default()
                        })
                        .await
                        .map(|s| Stream::Events(s.into_inner()))
                };
                match opened {
                    Ok(stream) => self.stream = Some(stream),
                    // A controller from before bookmarks.
                    Err(status) if status.code() == Code::Unimplemented && !self.plain => {
                        self.plain = true;
                        continue;
                    }
                    Err(status) => {
                        self.recover(&status).await?;
                        continue;
                    }
                }
            }
            let Some(stream) = &mut self.stream else {
                continue;
            };
            match stream.next().await {
                Some(Ok(Next::Bookmark(revision))) => {
                    self.revision = self.revision.max(revision);
                }
                Some(Ok(Next::Session(s))) => {
                    self.revision = self.revision.max(s.revision);
                    if self.ahead.get(&s.id).is_some_and(|r| *r >= s.revision) {
                        continue;
                    }
                    self.ahead.remove(&s.id);
                    return Ok(*s);
                }
                Some(Err(status)) => {
                    self.stream = None;
                    self.recover(&status).await?;
                }
                None => {
                    self.stream = None;
                    self.recover(&Status::unavailable("the watch ended"))
                        .await?;
                }
            }
        }
    }

    /// After the watch ended with `status`: reconnects to the leader, or lists again.
    async fn recover(&mut self, status: &Status) -> Result<(), CliError> {
        match status.code() {
            // The revision can't be served: what changed since comes from a listing.
            Code::OutOfRange => {
                let (sessions, revision) = list_all(&mut self.client, "").await?;
                let since = self.revision;
                self.ahead = sessions
                    .iter()
                    .filter(|s| s.revision > revision)
                    .map(|s| (s.id.clone(), s.revision))
                    .collect();
                self.listed = sessions
                    .into_iter()
                    .filter(|s| s.revision > since)
                    .collect();
                self.revision = revision;
                Ok(())
            }
            // A restart, a standby's answer, a broken connection: find the leader again.
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Aborted => {
                self.reconnect().await
            }
            _ => Err(status.clone().into()),
        }
    }

    async fn reconnect(&mut self) -> Result<(), CliError> {
        let started = Instant::now();
        let mut pause = Duration::from_millis(100);
        loop {
            tokio::time::sleep(pause).await;
            match connect(self.controller).await {
                Ok(client) => {
                    self.client = client;
                    return Ok(());
                }
                Err(e @ CliError::Input(_)) => return Err(e),
                Err(e) if started.elapsed() >= GIVE_UP => return Err(e),
                Err(_) => pause = (pause * 2).min(MOST_BACKOFF),
            }
        }
    }
}
