//! The local socket: one [`Request`] per line in, one [`Response`] per line out.

use std::{path::Path, sync::Arc};

use gpuwarden_agent_api::{NodeName, Request, Response, SessionCgroup, Signalled, parse_request};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
};

use super::Sources;

/// Binds the socket; a file left by a dead agent is replaced (the caller holds the node's lock).
///
/// # Errors
/// The directory can't be made, the old file removed, or the socket bound.
pub(crate) fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    UnixListener::bind(path)
}

/// Accepts clients until dropped; each is served by a task of its own.
pub(crate) async fn serve(listener: UnixListener, sources: Arc<Sources>, socket: &Path) {
    let mut clients = tokio::task::JoinSet::new();
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                clients.spawn(serve_client(stream, Arc::clone(&sources)));
            }
            Err(e) => tracing::warn!("accept on {}: {e}", socket.display()),
        }
        // Reap finished clients.
        while clients.try_join_next().is_some() {}
    }
}

async fn serve_client(stream: UnixStream, sources: Arc<Sources>) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let response = match parse_request(&line) {
            Ok(request) => answer(&sources, request).await,
            Err(response) => response,
        };
        let mut out = match serde_json::to_vec(&response) {
            Ok(out) => out,
            Err(e) => {
                tracing::error!("cannot encode a response: {e}");
                return;
            }
        };
        out.push(b'\n');
        if write.write_all(&out).await.is_err() {
            return;
        }
    }
}

async fn answer(sources: &Sources, request: Request) -> Response {
    let stopped = |e: crate::enforcement::task::Stopped| Response::Error(e.to_string());
    match request {
        Request::Snapshot => Response::Snapshot(Box::new(sources.snapshot().await)),
        Request::Node => Response::Node(NodeName {
            name: sources.node.clone(),
        }),
        Request::SessionCgroup { session_id } => {
            match sources.enforcer.session_cgroup(session_id.clone()).await {
                Ok(Ok((cgroup_dir, bound))) => Response::SessionCgroup(SessionCgroup {
                    session_id,
                    cgroup_dir,
                    bound,
                }),
                Ok(Err(e)) => Response::Error(e.to_string()),
                Err(e) => stopped(e),
            }
        }
        Request::Resume { pid } | Request::Kill { pid } => {
            let resume = matches!(request, Request::Resume { .. });
            match sources.enforcer.signal(pid, resume).await {
                Ok(Ok(session_id)) => Response::Signalled(Signalled { pid, session_id }),
                Ok(Err(e)) => Response::Error(e.to_string()),
                Err(e) => stopped(e),
            }
        }
    }
}
