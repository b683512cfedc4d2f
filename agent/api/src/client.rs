//! One request over the agent's socket: connect, write a line, read a line, within a timeout.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::UnixStream,
};

use crate::{
    protocol::{Accepted, Request, Response, SessionCgroup, Signalled},
    snapshot::Snapshot,
};

/// How long one exchange may take: the agent answers from memory, so anything longer means it
/// is stuck.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Why talking to the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens on the socket.
    #[error("cannot reach the agent at {}: {source} (is `gpuwarden-agent run` running?)", path.display())]
    Unreachable {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The connection broke, closed without an answer, or timed out.
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
/// See [`ClientError`]; an error response is returned as `Ok(Response::Error)`.
pub async fn call(socket: &Path, request: &Request) -> Result<Response, ClientError> {
    let io = |reason: String| ClientError::Io {
        path: socket.to_owned(),
        reason,
    };
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|source| ClientError::Unreachable {
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
        serde_json::from_str(&answer).map_err(|e| ClientError::Protocol {
            path: socket.to_owned(),
            reason: format!("{:?}: {e}", answer.trim()),
        })
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| io(format!("no answer within {TIMEOUT:?}")))?
}

/// Sends `request`, turning an error response into [`ClientError::Refused`].
///
/// # Errors
/// See [`ClientError`].
pub async fn ask(socket: &Path, request: &Request) -> Result<Response, ClientError> {
    match call(socket, request).await? {
        Response::Error(message) => Err(ClientError::Refused {
            path: socket.to_owned(),
            message,
        }),
        other => Ok(other),
    }
}

fn unexpected(socket: &Path, response: &Response, wanted: &str) -> ClientError {
    ClientError::Protocol {
        path: socket.to_owned(),
        reason: format!("asked for {wanted}, got {response:?}"),
    }
}

/// The agent's snapshot.
///
/// # Errors
/// See [`ClientError`].
pub async fn snapshot(socket: &Path) -> Result<Snapshot, ClientError> {
    match ask(socket, &Request::Snapshot).await? {
        Response::Snapshot(s) => Ok(*s),
        other => Err(unexpected(socket, &other, "a snapshot")),
    }
}

/// The agent's node name.
///
/// # Errors
/// See [`ClientError`].
pub async fn node(socket: &Path) -> Result<String, ClientError> {
    match ask(socket, &Request::Node).await? {
        Response::Node(n) if !n.name.is_empty() => Ok(n.name),
        Response::Node(_) => Err(ClientError::Protocol {
            path: socket.to_owned(),
            reason: "an empty node name".into(),
        }),
        other => Err(unexpected(socket, &other, "the node")),
    }
}

/// The cgroup of `session_id`, bound or not yet.
///
/// # Errors
/// See [`ClientError`].
pub async fn session_cgroup(socket: &Path, session_id: &str) -> Result<SessionCgroup, ClientError> {
    let request = Request::SessionCgroup {
        session_id: session_id.to_owned(),
    };
    match ask(socket, &request).await? {
        Response::SessionCgroup(c) if c.session_id == session_id => Ok(c),
        Response::SessionCgroup(c) => Err(ClientError::Protocol {
            path: socket.to_owned(),
            reason: format!(
                "asked for session {session_id:?}, got session {:?}",
                c.session_id
            ),
        }),
        other => Err(unexpected(socket, &other, "a session cgroup")),
    }
}

/// Sends a `resume` or `kill` request; what the agent signalled.
///
/// # Errors
/// See [`ClientError`].
pub async fn signal(socket: &Path, request: &Request) -> Result<Signalled, ClientError> {
    match ask(socket, request).await? {
        Response::Signalled(s) => Ok(s),
        other => Err(unexpected(socket, &other, "a signal")),
    }
}

/// Asks for a suspension or resumption ([`Request::Suspend`], [`Request::ResumeSuspended`]).
///
/// # Errors
/// See [`ClientError`].
pub async fn suspend(socket: &Path, request: &Request) -> Result<Accepted, ClientError> {
    match ask(socket, request).await? {
        Response::Accepted(a) => Ok(a),
        other => Err(unexpected(socket, &other, "a suspension")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_socket_is_unreachable_and_names_the_path() {
        let scratch = gpuwarden_test_support::scratch("nosock");
        let path = scratch.path().join("agent.sock");
        let err = node(&path).await.unwrap_err();
        assert!(matches!(err, ClientError::Unreachable { .. }), "{err}");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }

    #[tokio::test]
    async fn an_error_answer_is_refused_with_its_message() {
        let scratch = gpuwarden_test_support::scratch("refuse");
        let path = scratch.path().join("agent.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("binds");
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accepts");
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            BufReader::new(read)
                .read_line(&mut line)
                .await
                .expect("reads");
            write
                .write_all(b"{\"error\":\"no such session\"}\n")
                .await
                .expect("writes");
        });
        let err = session_cgroup(&path, "s-1").await.unwrap_err();
        assert!(
            matches!(&err, ClientError::Refused { message, .. } if message == "no such session"),
            "{err}"
        );
    }
}
