//! The local socket: newline-delimited JSON requests in, responses out
//! (protocol: `gpuwarden-agent-api`). The server only dispatches; what it answers from is the
//! daemon's state behind [`Answers`], so the dispatch is tested without a daemon.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use gpuwarden_agent_api::{
    NodeName, Request, Response, SessionCgroup, Signalled, parse_request, snapshot::Snapshot,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
    task::JoinSet,
};

/// What the socket's requests are answered from.
pub trait Answers: Send + Sync + 'static {
    /// The node's snapshot now.
    fn snapshot(&self) -> Snapshot;
    /// The node's name.
    fn node(&self) -> String;
    /// A session's cgroup directory and whether its quota is bound there.
    ///
    /// # Errors
    /// Why there is none, in words.
    fn session_cgroup(&self, session_id: &str) -> Result<(PathBuf, bool), String>;
    /// Resumes (SIGCONT) or kills (SIGKILL) a process of a bound workload; its session.
    ///
    /// # Errors
    /// Why it was refused, in words.
    fn signal(&self, pid: u32, resume: bool) -> Result<String, String>;
}

/// The response to one request.
pub fn answer(answers: &impl Answers, request: Request) -> Response {
    match request {
        Request::Snapshot => Response::Snapshot(Box::new(answers.snapshot())),
        Request::Node => Response::Node(NodeName {
            name: answers.node(),
        }),
        Request::SessionCgroup { session_id } => match answers.session_cgroup(&session_id) {
            Ok((cgroup_dir, bound)) => Response::SessionCgroup(SessionCgroup {
                session_id,
                cgroup_dir,
                bound,
            }),
            Err(e) => Response::Error(e),
        },
        Request::Resume { pid } => signalled(answers.signal(pid, true), pid),
        Request::Kill { pid } => signalled(answers.signal(pid, false), pid),
    }
}

fn signalled(result: Result<String, String>, pid: u32) -> Response {
    match result {
        Ok(session_id) => Response::Signalled(Signalled { pid, session_id }),
        Err(e) => Response::Error(e),
    }
}

/// Binds the socket at `path`, making its directory; a file left by a dead agent is replaced
/// (the caller holds the node's lock, so no live agent owns it).
///
/// # Errors
/// The directory can't be made, the old file can't be removed, or the bind fails.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
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

/// Serves clients until dropped, each on a task of `clients`.
pub async fn serve<A: Answers>(listener: UnixListener, answers: Arc<A>, clients: &mut JoinSet<()>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                clients.spawn(serve_client(stream, Arc::clone(&answers)));
            }
            Err(e) => tracing::warn!("accept on the agent socket: {e}"),
        }
    }
}

async fn serve_client<A: Answers>(stream: UnixStream, answers: Arc<A>) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let response = match parse_request(&line) {
            Ok(request) => {
                // Snapshots read maps and NVML: off the async workers.
                let answers = Arc::clone(&answers);
                tokio::task::spawn_blocking(move || answer(&*answers, request))
                    .await
                    .unwrap_or_else(|e| Response::Error(format!("the agent failed to answer: {e}")))
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A node with one bound session `s-1` holding process 42.
    struct Fake;

    impl Answers for Fake {
        fn snapshot(&self) -> Snapshot {
            Snapshot {
                node: "n1".into(),
                ..Snapshot::default()
            }
        }
        fn node(&self) -> String {
            "n1".into()
        }
        fn session_cgroup(&self, session_id: &str) -> Result<(PathBuf, bool), String> {
            (session_id == "s-1")
                .then(|| (PathBuf::from("/sys/fs/cgroup/gpuwarden/s-1"), true))
                .ok_or_else(|| format!("no session {session_id:?}"))
        }
        fn signal(&self, pid: u32, _resume: bool) -> Result<String, String> {
            (pid == 42)
                .then(|| "s-1".to_owned())
                .ok_or_else(|| format!("process {pid} is not in a workload with a quota"))
        }
    }

    #[test]
    fn each_request_gets_its_answer_and_refusals_say_why() {
        assert_eq!(
            answer(&Fake, Request::Node),
            Response::Node(NodeName { name: "n1".into() })
        );
        let Response::Snapshot(s) = answer(&Fake, Request::Snapshot) else {
            panic!("not a snapshot");
        };
        assert_eq!(s.node, "n1");
        assert_eq!(
            answer(
                &Fake,
                Request::SessionCgroup {
                    session_id: "s-1".into()
                }
            ),
            Response::SessionCgroup(SessionCgroup {
                session_id: "s-1".into(),
                cgroup_dir: "/sys/fs/cgroup/gpuwarden/s-1".into(),
                bound: true,
            })
        );
        assert_eq!(
            answer(
                &Fake,
                Request::SessionCgroup {
                    session_id: "s-9".into()
                }
            ),
            Response::Error("no session \"s-9\"".into())
        );
        assert_eq!(
            answer(&Fake, Request::Kill { pid: 42 }),
            Response::Signalled(Signalled {
                pid: 42,
                session_id: "s-1".into()
            })
        );
        let Response::Error(why) = answer(&Fake, Request::Resume { pid: 1 }) else {
            panic!("signalled a process outside every quota");
        };
        assert!(why.contains("not in a workload with a quota"), "{why}");
    }

    #[tokio::test]
    async fn a_client_is_answered_line_by_line_over_the_socket() {
        let scratch = gpuwarden_test_support::scratch("sock");
        let path = scratch.path().join("run/agent.sock");
        let listener = bind(&path).expect("binds");
        let mut clients = JoinSet::new();
        let server =
            tokio::spawn(async move { serve(listener, Arc::new(Fake), &mut clients).await });
        let node = gpuwarden_agent_api::client::node(&path)
            .await
            .expect("answers");
        assert_eq!(node, "n1");
        let bad = gpuwarden_agent_api::client::call(&path, &Request::Kill { pid: 7 })
            .await
            .expect("answers");
        assert!(matches!(bad, Response::Error(_)), "{bad:?}");
        // A stale socket file is replaced by the next bind.
        server.abort();
        assert!(bind(&path).is_ok());
    }
}
