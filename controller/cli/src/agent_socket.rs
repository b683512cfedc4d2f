//! The node agent's local socket, as `gpuwarden run` uses it: newline-delimited JSON over a Unix
//! socket, one request line and one response line per connection.
//!
//! Spoken here rather than borrowed from the agent crate, so the CLI builds without the agent's
//! eBPF toolchain. The requests and answers:
//!
//! - `{"request":"node"}` → `{"node":{"name":"<node name>"}}`;
//! - `{"request":"session_cgroup","session_id":"<id>"}` →
//!   `{"session_cgroup":{"session_id":"<id>","cgroup_dir":"<absolute path>","bound":true}}`
//!   (`bound` is false until the agent has made the cgroup and bound the quota to it);
//! - any failure → `{"error":"<message>"}`.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::UnixStream,
};

/// Default socket path.
pub const DEFAULT_SOCKET: &str = "/run/gpuwarden/agent.sock";

/// How long one request may take: the agent answers from memory.
const TIMEOUT: Duration = Duration::from_secs(5);

/// A request line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    /// The agent's node.
    Node,
    /// The cgroup the agent made for a session with a managed target.
    SessionCgroup {
        /// The session.
        session_id: String,
    },
}

/// A response line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    /// Answers [`Request::Node`].
    Node(NodeName),
    /// Answers [`Request::SessionCgroup`].
    SessionCgroup(SessionCgroup),
    /// The request failed.
    Error(String),
}

/// The agent's node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeName {
    /// The node id it registered with the controller.
    pub name: String,
}

/// A session's managed cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionCgroup {
    /// The session.
    pub session_id: String,
    /// Absolute path of the cgroup v2 directory.
    pub cgroup_dir: PathBuf,
    /// Whether the agent has made it and bound the quota to it.
    pub bound: bool,
}

/// Errors talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Nothing listens on the socket.
    #[error("cannot reach the agent at {}: {source} (is `gpuwarden-agent run` running?)", path.display())]
    Unreachable {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The connection broke or timed out.
    #[error("talking to the agent at {}: {reason}", path.display())]
    Io {
        /// The socket.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The answer isn't a response, or not the one asked for.
    #[error("the agent at {} answered something unexpected: {reason}", path.display())]
    Protocol {
        /// The socket.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The agent answered with an error.
    #[error("the agent at {} refused: {message}", path.display())]
    Refused {
        /// The socket.
        path: PathBuf,
        /// Its message.
        message: String,
    },
}

/// Sends one request and reads its response.
///
/// # Errors
/// See [`AgentError`]; an error response is returned as `Ok(Response::Error)`.
pub async fn call(socket: &Path, request: &Request) -> Result<Response, AgentError> {
    let io = |reason: String| AgentError::Io {
        path: socket.to_owned(),
        reason,
    };
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|source| AgentError::Unreachable {
            path: socket.to_owned(),
            source,
        })?;
    let exchange = async {
        let (read, mut write) = stream.into_split();
        let mut line = serde_json::to_vec(request).map_err(|e| io(e.to_string()))?;
        line.push(b'\n');
        write
            .write_all(&line)
            .await
            .map_err(|e| io(e.to_string()))?;
        let mut answer = String::new();
        let n = BufReader::new(read)
            .read_line(&mut answer)
            .await
            .map_err(|e| io(e.to_string()))?;
        if n == 0 {
            return Err(io("it closed the connection without answering".into()));
        }
        serde_json::from_str(&answer).map_err(|e| AgentError::Protocol {
            path: socket.to_owned(),
            reason: format!("{:?}: {e}", answer.trim()),
        })
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| io(format!("no answer within {TIMEOUT:?}")))?
}

fn refused_or_unexpected(socket: &Path, response: Response, wanted: &str) -> AgentError {
    match response {
        Response::Error(message) => AgentError::Refused {
            path: socket.to_owned(),
            message,
        },
        other => AgentError::Protocol {
            path: socket.to_owned(),
            reason: format!("asked for {wanted}, got {other:?}"),
        },
    }
}

/// The agent's node name.
///
/// # Errors
/// See [`AgentError`].
pub async fn node(socket: &Path) -> Result<String, AgentError> {
    match call(socket, &Request::Node).await? {
        Response::Node(n) if !n.name.is_empty() => Ok(n.name),
        Response::Node(_) => Err(AgentError::Protocol {
            path: socket.to_owned(),
            reason: "an empty node name".into(),
        }),
        other => Err(refused_or_unexpected(socket, other, "the node")),
    }
}

/// The cgroup of `session_id`, bound or not yet.
///
/// # Errors
/// See [`AgentError`].
pub async fn session_cgroup(socket: &Path, session_id: &str) -> Result<SessionCgroup, AgentError> {
    let request = Request::SessionCgroup {
        session_id: session_id.to_owned(),
    };
    match call(socket, &request).await? {
        Response::SessionCgroup(c) if c.session_id == session_id => Ok(c),
        Response::SessionCgroup(c) => Err(AgentError::Protocol {
            path: socket.to_owned(),
            reason: format!(
                "asked for session {session_id:?}, got session {:?}",
                c.session_id
            ),
        }),
        other => Err(refused_or_unexpected(socket, other, "a session cgroup")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_forms_are_the_agreed_ones() {
        assert_eq!(
            serde_json::to_string(&Request::Node).unwrap(),
            r#"{"request":"node"}"#
        );
        assert_eq!(
            serde_json::to_string(&Request::SessionCgroup {
                session_id: "s-1".into()
            })
            .unwrap(),
            r#"{"request":"session_cgroup","session_id":"s-1"}"#
        );
        let node: Response = serde_json::from_str(r#"{"node":{"name":"n1"}}"#).unwrap();
        assert_eq!(node, Response::Node(NodeName { name: "n1".into() }));
        let cg: Response = serde_json::from_str(
            r#"{"session_cgroup":{"session_id":"s-1","cgroup_dir":"/sys/fs/cgroup/x","bound":false}}"#,
        )
        .unwrap();
        assert_eq!(
            cg,
            Response::SessionCgroup(SessionCgroup {
                session_id: "s-1".into(),
                cgroup_dir: "/sys/fs/cgroup/x".into(),
                bound: false,
            })
        );
        let err: Response = serde_json::from_str(r#"{"error":"no such session"}"#).unwrap();
        assert_eq!(err, Response::Error("no such session".into()));
    }

    #[tokio::test]
    async fn a_missing_socket_is_unreachable_and_names_the_path() {
        let path = std::env::temp_dir().join("gpuwarden-no-such-agent.sock");
        let err = node(&path).await.unwrap_err();
        assert!(matches!(err, AgentError::Unreachable { .. }), "{err}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }
}
