//! The agent's local interface: newline-delimited JSON over a Unix socket.
//!
//! A client writes one [`Request`] per line and reads one [`Response`] per line. The socket is
//! node-local (default `/run/gpuwarden/agent.sock`) and only as open as its directory.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::UnixStream,
};

use crate::snapshot::Snapshot;

/// Default socket path.
pub const DEFAULT_SOCKET: &str = "/run/gpuwarden/agent.sock";

/// A request.
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
}

/// A response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    /// The snapshot asked for.
    Snapshot(Box<Snapshot>),
    /// The node.
    Node {
        /// Its name.
        name: String,
    },
    /// A session's cgroup.
    SessionCgroup {
        /// The session.
        session_id: String,
        /// Absolute cgroup v2 directory.
        cgroup_dir: PathBuf,
        /// Whether the quota is enforced there yet.
        bound: bool,
    },
    /// A signal was sent.
    Signalled {
        /// The process.
        pid: u32,
        /// The session it belongs to.
        session_id: String,
    },
    /// The request failed.
    Error(String),
}

/// Errors talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens on the socket.
    #[error("cannot reach the agent at {path}: {source} (is `gpuwarden-agent run` running?)")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The connection broke.
    #[error("talking to the agent at {path}: {source}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The answer isn't a response.
    #[error("the agent at {path} answered something unreadable: {source}")]
    Decode {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The agent closed the connection without answering.
    #[error("the agent at {path} closed the connection without answering")]
    NoAnswer {
        /// The socket.
        path: PathBuf,
    },
    /// The agent answered with an error.
    #[error("the agent refused: {0}")]
    Refused(String),
}

/// Sends one request and reads its response.
///
/// # Errors
/// See [`ClientError`].
pub async fn call(socket: &Path, request: &Request) -> Result<Response, ClientError> {
    let path = socket.to_owned();
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|source| ClientError::Connect {
            path: path.clone(),
            source,
        })?;
    let io = |source| ClientError::Io {
        path: path.clone(),
        source,
    };
    let (read, mut write) = stream.into_split();
    let mut line = serde_json::to_vec(request).map_err(|source| ClientError::Decode {
        path: path.clone(),
        source,
    })?;
    line.push(b'\n');
    write.write_all(&line).await.map_err(io)?;
    let mut answer = String::new();
    let n = BufReader::new(read)
        .read_line(&mut answer)
        .await
        .map_err(io)?;
    if n == 0 {
        return Err(ClientError::NoAnswer { path });
    }
    serde_json::from_str(&answer).map_err(|source| ClientError::Decode { path, source })
}

/// Asks for a snapshot.
///
/// # Errors
/// See [`ClientError`].
pub async fn snapshot(socket: &Path) -> Result<Snapshot, ClientError> {
    match ask(socket, &Request::Snapshot).await? {
        Response::Snapshot(s) => Ok(*s),
        other => Err(ClientError::Refused(format!(
            "expected a snapshot, got {other:?}"
        ))),
    }
}

/// Sends `request` and returns the answer, turning an error response into [`ClientError::Refused`].
///
/// # Errors
/// See [`ClientError`].
pub async fn ask(socket: &Path, request: &Request) -> Result<Response, ClientError> {
    match call(socket, request).await? {
        Response::Error(e) => Err(ClientError::Refused(e)),
        other => Ok(other),
    }
}

/// Parses one request line; a bad line gets an error response naming the problem.
///
/// # Errors
/// The response to send back.
pub fn parse_request(line: &str) -> Result<Request, Response> {
    serde_json::from_str(line.trim()).map_err(|e| {
        Response::Error(format!(
            "malformed request {:?}: {e}; expected e.g. {{\"request\":\"snapshot\"}}",
            line.trim()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_bad_lines_are_named() {
        let line = serde_json::to_string(&Request::Snapshot).unwrap();
        assert_eq!(line, r#"{"request":"snapshot"}"#);
        assert_eq!(parse_request(&line), Ok(Request::Snapshot));
        let Err(Response::Error(msg)) = parse_request(r#"{"request":"reboot"}"#) else {
            panic!("accepted an unknown request");
        };
        assert!(msg.contains("reboot"), "{msg}");
        let line = r#"{"request":"session_cgroup","session_id":"s-1"}"#;
        assert_eq!(
            parse_request(line),
            Ok(Request::SessionCgroup {
                session_id: "s-1".into()
            })
        );
        let answer = Response::SessionCgroup {
            session_id: "s-1".into(),
            cgroup_dir: "/sys/fs/cgroup/gpuwarden/s-1".into(),
            bound: true,
        };
        assert_eq!(
            serde_json::to_string(&answer).unwrap(),
            r#"{"session_cgroup":{"session_id":"s-1","cgroup_dir":"/sys/fs/cgroup/gpuwarden/s-1","bound":true}}"#
        );
        assert_eq!(
            serde_json::to_string(&Response::Node { name: "n".into() }).unwrap(),
            r#"{"node":{"name":"n"}}"#
        );
    }
}
