//! The local socket: one [`Request`] per line in, one [`Response`] per line out, each checked
//! against who is asking first (see [`super::access`]).

use std::{
    future::Future,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    sync::Arc,
};

use gpuwarden_agent_api::{
    Accepted, NodeName, Request, Response, SessionCgroup, Signalled, parse_request,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
};

use super::{
    Sources,
    access::{self, Caller, Claim, Claims},
};
use crate::enforcement::kernel::Pinned;

/// What answers the socket's requests once they are allowed: the agent's [`Sources`], or a
/// fake in tests.
pub(crate) trait Answer: Send + Sync + 'static {
    /// The response to an allowed `request` (`resume` and `kill` go to [`Self::signal`]).
    fn answer(&self, request: Request) -> impl Future<Output = Response> + Send;
    /// The response to an allowed `resume` (or `kill`) of the pinned `process`.
    fn signal(&self, process: Pinned, resume: bool) -> impl Future<Output = Response> + Send;
    /// The uid of the `gpuwarden run` that created `session`, where its allocation says.
    fn run_uid(&self, session: &str) -> Option<u32>;
}

/// Binds the socket at `path`, readable and writable by root only, or also by `group` (mode
/// 0660 with that group); a file left by a dead agent is replaced (the caller holds the node's
/// lock).
///
/// The socket is bound under a temporary name beside `path`, given its mode and group, and only
/// then renamed to `path`, so no one ever finds it there with looser permissions.
///
/// # Errors
/// The directory can't be made, or the socket bound, chowned, chmoded or renamed.
pub(crate) fn bind(path: &Path, group: Option<u32>) -> std::io::Result<UnixListener> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("socket path {} names no file", path.display()),
        )
    })?;
    let tmp: PathBuf = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(&tmp)?;
    let prepared = (|| {
        if let Some(gid) = group {
            std::os::unix::fs::chown(&tmp, None, Some(gid))?;
        }
        let mode = if group.is_some() { 0o660 } else { 0o600 };
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = prepared {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(listener)
}

/// Accepts clients until dropped; each is served by a task of its own.
pub(crate) async fn serve<A: Answer>(listener: UnixListener, agent: Arc<A>, socket: &Path) {
    let claims = Arc::new(Claims::default());
    let mut clients = tokio::task::JoinSet::new();
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                clients.spawn(serve_client(
                    stream,
                    Arc::clone(&agent),
                    Arc::clone(&claims),
                ));
            }
            Err(e) => tracing::warn!("accept on {}: {e}", socket.display()),
        }
        // Reap finished clients.
        while clients.try_join_next().is_some() {}
    }
}

/// The longest request line read; requests are a few dozen bytes.
const MAX_REQUEST_BYTES: u64 = 64 * 1024;

async fn serve_client<A: Answer>(stream: UnixStream, agent: Arc<A>, claims: Arc<Claims>) {
    let caller = match Caller::of(&stream) {
        Ok(caller) => Some(caller),
        Err(e) => {
            // Only requests that act on something need it; those are refused.
            tracing::warn!("SO_PEERCRED on the socket failed: {e}");
            None
        }
    };
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    loop {
        // A line is read up to the limit and no further, so a client that never sends a newline
        // holds at most that much of the agent's memory.
        let mut line = Vec::new();
        match (&mut reader)
            .take(MAX_REQUEST_BYTES + 1)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let too_long = line.last() != Some(&b'\n') && line.len() as u64 > MAX_REQUEST_BYTES;
        let response = if too_long {
            Response::Error(format!(
                "request longer than {MAX_REQUEST_BYTES} bytes; closing the connection"
            ))
        } else {
            match parse_request(&String::from_utf8_lossy(&line)) {
                Ok(request) => checked(&*agent, &claims, caller, request).await,
                Err(response) => response,
            }
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
        if too_long {
            // End our side, then drop what the client is still sending for a moment: closing
            // with unread data would reset the connection before it reads the reason.
            let _ = write.shutdown().await;
            let (mut rest, mut sink) = (reader.take(16 << 20), tokio::io::sink());
            let drain = tokio::io::copy(&mut rest, &mut sink);
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), drain).await;
            return;
        }
    }
}

/// Answers `request` if `caller` may ask it, else the refusal.
async fn checked<A: Answer>(
    agent: &A,
    claims: &Claims,
    caller: Option<Caller>,
    request: Request,
) -> Response {
    let refused = |refusal: access::Refusal| {
        tracing::warn!(
            uid = caller.map(|c| c.uid),
            pid = caller.and_then(|c| c.pid),
            "socket request {request:?} {refusal}"
        );
        Response::Error(refusal.to_string())
    };
    match &request {
        // Whoever the socket's mode lets in may read these.
        Request::Snapshot | Request::Node => agent.answer(request).await,
        // Only root suspends a session: it stops whoever's workload it names.
        Request::Suspend { .. } | Request::ResumeSuspended { .. } => {
            if caller.is_some_and(|c| c.uid == 0) {
                agent.answer(request).await
            } else {
                tracing::warn!(
                    uid = caller.map(|c| c.uid),
                    "socket request {request:?} refused"
                );
                Response::Error("refused: suspending or resuming a session needs root".to_owned())
            }
        }
        Request::Resume { pid } | Request::Kill { pid } => match access::may_signal(caller, *pid) {
            Ok(process) => {
                let resume = matches!(request, Request::Resume { .. });
                agent.signal(process, resume).await
            }
            Err(refusal) => refused(refusal),
        },
        // The uid its allocation names, where it names one: no first come, first served.
        Request::SessionCgroup { session_id } if agent.run_uid(session_id).is_some() => {
            match access::is_run_caller(caller, session_id, agent.run_uid(session_id)) {
                Ok(()) => agent.answer(request).await,
                Err(refusal) => refused(refusal),
            }
        }
        Request::SessionCgroup { session_id } => match claims.take(caller, session_id) {
            Ok(claim) => {
                let session = session_id.clone();
                let response = agent.answer(request).await;
                // No such session here: claiming its id would hold nothing but memory.
                if claim == Claim::New && matches!(response, Response::Error(_)) {
                    claims.forget(&session);
                }
                response
            }
            Err(refusal) => refused(refusal),
        },
    }
}

impl Answer for Sources {
    async fn answer(&self, request: Request) -> Response {
        let stopped = |e: crate::enforcement::task::Stopped| Response::Error(e.to_string());
        let resume = matches!(request, Request::ResumeSuspended { .. });
        match request {
            Request::Snapshot => Response::Snapshot(Box::new(self.snapshot().await)),
            Request::Node => Response::Node(NodeName {
                name: self.node.clone(),
            }),
            Request::SessionCgroup { session_id } => {
                match self.enforcer.session_cgroup(session_id.clone()).await {
                    Ok(Ok((cgroup_dir, bound))) => Response::SessionCgroup(SessionCgroup {
                        session_id,
                        cgroup_dir,
                        bound,
                    }),
                    Ok(Err(e)) => Response::Error(e.to_string()),
                    Err(e) => stopped(e),
                }
            }
            Request::Suspend { session_id } | Request::ResumeSuspended { session_id } => {
                match self.enforcer.session_cgroup(session_id.clone()).await {
                    Ok(Ok(_)) => match self.enforcer.suspend(session_id.clone(), resume) {
                        Ok(()) => Response::Accepted(Accepted { session_id }),
                        Err(e) => stopped(e),
                    },
                    Ok(Err(e)) => Response::Error(e.to_string()),
                    Err(e) => stopped(e),
                }
            }
            // Only through the ownership check, which pins the process ([`checked`]).
            Request::Resume { pid } | Request::Kill { pid } => Response::Error(format!(
                "process {pid}: a signal goes through its owner's check"
            )),
        }
    }

    fn run_uid(&self, session: &str) -> Option<u32> {
        crate::control::holdings::lock(&self.holdings)
            .get(session)
            .and_then(|a| a.run_caller.as_ref())
            .map(|c| c.uid)
    }

    async fn signal(&self, process: Pinned, resume: bool) -> Response {
        let pid = process.pid();
        match self.enforcer.signal(process, resume).await {
            Ok(Ok(session_id)) => Response::Signalled(Signalled { pid, session_id }),
            Ok(Err(e)) => Response::Error(e.to_string()),
            Err(e) => Response::Error(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests;
