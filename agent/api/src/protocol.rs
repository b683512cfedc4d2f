//! The request and response lines.
//!
//! - `{"request":"snapshot"}` → `{"snapshot":{…}}`;
//! - `{"request":"node"}` → `{"node":{"name":"<node name>"}}`;
//! - `{"request":"session_cgroup","session_id":"<id>"}` →
//!   `{"session_cgroup":{"session_id":"<id>","cgroup_dir":"<absolute path>","bound":true}}`
//!   (`bound` is false until the agent has made the cgroup and bound the quota to it);
//! - `{"request":"resume","pid":N}` and `{"request":"kill","pid":N}` →
//!   `{"signalled":{"pid":N,"session_id":"<id>"}}`;
//! - `{"request":"suspend","session_id":"<id>"}` and
//!   `{"request":"resume_suspended","session_id":"<id>"}` → `{"accepted":{"session_id":"<id>"}}`:
//!   the suspension (issue 38) or resumption is under way; its end shows in the events;
//! - any failure → `{"error":"<message>"}`; a request the caller may not make is refused the
//!   same way, the message starting `refused:` and naming the reason.
//!
//! Who may ask what: anyone the socket file's mode lets in (root, or the agent's
//! `socket_group`) reads `snapshot` and `node`; `resume` and `kill` need root or the process's
//! owner; `session_cgroup` needs root or the uid that first asked for that session's cgroup (its
//! `gpuwarden run`); `suspend` and `resume_suspended` need root. The agent takes the caller's uid from the kernel (`SO_PEERCRED`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::snapshot::Snapshot;

/// Default socket path.
pub const DEFAULT_SOCKET: &str = "/run/gpuwarden/agent.sock";

/// A request line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    /// The current snapshot.
    Snapshot,
    /// The node's name (`gpuwarden run` pins its session there).
    Node,
    /// The cgroup a session's quota is bound at (`gpuwarden run` moves its command there).
    SessionCgroup {
        /// The session.
        session_id: String,
    },
    /// Resume a process stopped by the `stop` policy (SIGCONT).
    Resume {
        /// The process.
        pid: u32,
    },
    /// Kill a process of a bound workload (SIGKILL).
    Kill {
        /// The process.
        pid: u32,
    },
    /// Suspend a session's workload to host memory, as a preemption in mode `suspend` does
    /// (where the driver refuses, it is preempted the kill way).
    Suspend {
        /// The session.
        session_id: String,
    },
    /// Resume a suspended session.
    ResumeSuspended {
        /// The session.
        session_id: String,
    },
}

/// A response line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    /// Answers [`Request::Snapshot`].
    Snapshot(Box<Snapshot>),
    /// Answers [`Request::Node`].
    Node(NodeName),
    /// Answers [`Request::SessionCgroup`].
    SessionCgroup(SessionCgroup),
    /// Answers [`Request::Resume`] and [`Request::Kill`].
    Signalled(Signalled),
    /// Answers [`Request::Suspend`] and [`Request::ResumeSuspended`].
    Accepted(Accepted),
    /// The request failed.
    Error(String),
}

/// The agent's node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeName {
    /// The node id it registered with the controller.
    pub name: String,
}

/// A session's cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionCgroup {
    /// The session.
    pub session_id: String,
    /// Absolute path of the cgroup v2 directory.
    pub cgroup_dir: PathBuf,
    /// Whether the agent has made it and bound the quota to it.
    pub bound: bool,
}

/// A suspension or resumption under way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    /// The session.
    pub session_id: String,
}

/// A signal the agent sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signalled {
    /// The process.
    pub pid: u32,
    /// The session it belongs to.
    pub session_id: String,
}

/// Parses one request line; a bad line gets the error response naming the problem.
///
/// # Errors
/// The response to send back.
pub fn parse_request(line: &str) -> Result<Request, Response> {
    let line = line.trim();
    serde_json::from_str(line).map_err(|e| {
        // Quote the start of the line only: an answer never grows with a hostile request.
        let shown: String = line.chars().take(SHOWN_CHARS).collect();
        let cut = if shown.len() < line.len() { "…" } else { "" };
        Response::Error(format!(
            "malformed request {shown:?}{cut}: {e}; expected e.g. {{\"request\":\"snapshot\"}}"
        ))
    })
}

/// How much of a malformed request its error quotes.
const SHOWN_CHARS: usize = 80;

#[cfg(test)]
mod tests;
