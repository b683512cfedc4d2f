//! The socket over a real Unix socket: its file's mode and group, and the caller checks with
//! real `SO_PEERCRED` credentials — callers of other uids are helper processes started under
//! `setpriv`, which needs root. A fake stands in for the agent behind the checks.

use std::{
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    time::Duration,
};

use gpuwarden_agent_api::client;

use super::*;

/// Answers what it is asked, signalling nothing; only session `s-1` exists.
struct Fake;

impl Answer for Fake {
    async fn answer(&self, request: Request) -> Response {
        match request {
            Request::Resume { pid } | Request::Kill { pid } => Response::Signalled(Signalled {
                pid,
                session_id: "s-1".into(),
            }),
            Request::SessionCgroup { session_id }
                if session_id == "s-1" || session_id == "s-run" =>
            {
                Response::SessionCgroup(SessionCgroup {
                    session_id,
                    cgroup_dir: "/sys/fs/cgroup/gpuwarden/s-1".into(),
                    bound: true,
                })
            }
            Request::SessionCgroup { session_id } => {
                Response::Error(format!("no quota for session {session_id:?} here"))
            }
            Request::Node => Response::Node(NodeName {
                name: "node-fake".into(),
            }),
            Request::Snapshot => Response::Error("the fake has no snapshot".into()),
            Request::Suspend { session_id } | Request::ResumeSuspended { session_id } => {
                Response::Accepted(gpuwarden_agent_api::Accepted { session_id })
            }
        }
    }

    fn run_uid(&self, session: &str) -> Option<u32> {
        // `s-run` is a `gpuwarden run` of nobody's.
        (session == "s-run").then_some(NOBODY)
    }

    async fn signal(&self, process: Pinned, _resume: bool) -> Response {
        Response::Signalled(Signalled {
            pid: process.pid(),
            session_id: "s-1".into(),
        })
    }
}

/// `nobody` and its group on Debian; a second uid that is not root and not nobody.
const NOBODY: u32 = 65534;
const OTHER: u32 = 65533;

/// One request line through the socket, as a client of `uid` and `gid` with no other groups;
/// what it read back, or `connect: <error>`.
const CLIENT: &str = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("connect:", type(e).__name__)
    sys.exit(0)
s.sendall(sys.argv[2].encode() + b"\n")
print(s.makefile().readline().strip())
"#;

fn setpriv(uid: u32, gid: u32) -> tokio::process::Command {
    let mut command = tokio::process::Command::new("setpriv");
    command
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .kill_on_drop(true);
    command
}

async fn ask_as(uid: u32, gid: u32, socket: &Path, request: &Request) -> String {
    let line = serde_json::to_string(request).expect("encodes");
    let out = setpriv(uid, gid)
        .args(["/usr/bin/python3", "-c", CLIENT])
        .arg(socket)
        .arg(line)
        .output()
        .await
        .expect("setpriv runs");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Waits (bounded) until process `pid` runs as `uid` (setpriv changes it before its exec).
async fn runs_as(pid: u32, uid: u32) {
    for _ in 0..200 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(&uid.to_string()))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("process {pid} never ran as uid {uid}");
}

#[tokio::test]
async fn without_a_group_the_socket_is_root_only_and_replaces_a_stale_file() {
    let scratch = gpuwarden_test_support::scratch("sock-mode");
    let path = scratch.path().join("agent.sock");
    std::fs::write(&path, "left by a dead agent").expect("written");
    let _listener = bind(&path, None).expect("binds");
    let meta = std::fs::metadata(&path).expect("the socket is there");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // SAFETY: getuid can't fail.
    assert_eq!(meta.uid(), unsafe { libc::getuid() });
    assert!(std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()));
    let names: Vec<_> = std::fs::read_dir(scratch.path())
        .expect("listed")
        .map(|e| e.expect("an entry").file_name())
        .collect();
    assert_eq!(names, ["agent.sock"], "the temporary name is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root"]
async fn callers_signal_only_their_own_processes_and_claim_sessions() {
    gpuwarden_test_support::require_root();
    let scratch = gpuwarden_test_support::scratch("sock-peer");
    // The helpers run as other users: they must reach the socket's directory.
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let socket = scratch.path().join("agent.sock");
    let listener = bind(&socket, Some(NOBODY)).expect("binds");
    let meta = std::fs::metadata(&socket).expect("the socket is there");
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    assert_eq!((meta.uid(), meta.gid()), (0, NOBODY));
    let server = tokio::spawn({
        let socket = socket.clone();
        async move { serve(listener, Arc::new(Fake), &socket).await }
    });

    // A process of root's and one of nobody's.
    let root_sleeper = tokio::process::Command::new("sleep")
        .arg("60")
        .kill_on_drop(true)
        .spawn()
        .expect("sleep starts");
    let root_pid = root_sleeper.id().expect("a pid");
    let nobody_sleeper = setpriv(NOBODY, NOBODY)
        .args(["sleep", "60"])
        .spawn()
        .expect("sleep starts as nobody");
    let nobody_pid = nobody_sleeper.id().expect("a pid");
    runs_as(nobody_pid, NOBODY).await;

    // nobody may kill or resume its own process, not root's.
    let answer = ask_as(NOBODY, NOBODY, &socket, &Request::Kill { pid: root_pid }).await;
    assert!(
        answer.contains("refused")
            && answer.contains(&format!("process {root_pid} belongs to uid 0")),
        "{answer}"
    );
    let answer = ask_as(NOBODY, NOBODY, &socket, &Request::Resume { pid: root_pid }).await;
    assert!(answer.contains("refused"), "{answer}");
    let answer = ask_as(NOBODY, NOBODY, &socket, &Request::Kill { pid: nobody_pid }).await;
    assert!(
        answer.contains("\"signalled\"") && answer.contains(&nobody_pid.to_string()),
        "{answer}"
    );
    // Root may signal anyone's.
    for pid in [root_pid, nobody_pid] {
        let done = client::signal(&socket, &Request::Kill { pid })
            .await
            .expect("root may signal any process");
        assert_eq!(done.pid, pid);
    }
    // Anyone in the group reads the node.
    let answer = ask_as(NOBODY, NOBODY, &socket, &Request::Node).await;
    assert!(answer.contains("node-fake"), "{answer}");

    // The first non-root caller claims a session's cgroup; another uid is refused it, root not.
    let cgroup = Request::SessionCgroup {
        session_id: "s-1".into(),
    };
    let answer = ask_as(NOBODY, NOBODY, &socket, &cgroup).await;
    assert!(answer.contains("\"session_cgroup\""), "{answer}");
    let answer = ask_as(NOBODY, NOBODY, &socket, &cgroup).await;
    assert!(
        answer.contains("\"session_cgroup\""),
        "the claimant again: {answer}"
    );
    let answer = ask_as(OTHER, NOBODY, &socket, &cgroup).await;
    assert!(
        answer.contains("refused") && answer.contains("claimed by uid 65534"),
        "{answer}"
    );
    client::session_cgroup(&socket, "s-1")
        .await
        .expect("root is never refused");
    // A session that does not exist is claimed by no one.
    let unknown = Request::SessionCgroup {
        session_id: "s-unknown".into(),
    };
    let answer = ask_as(NOBODY, NOBODY, &socket, &unknown).await;
    assert!(answer.contains("no quota for session"), "{answer}");
    let answer = ask_as(OTHER, NOBODY, &socket, &unknown).await;
    assert!(answer.contains("no quota for session"), "{answer}");

    // A session whose allocation names its `gpuwarden run`'s uid goes to that uid alone, however
    // early another asks (issue 33, attack 7: on main the first uid to ask claimed it).
    let run = Request::SessionCgroup {
        session_id: "s-run".into(),
    };
    let answer = ask_as(OTHER, NOBODY, &socket, &run).await;
    assert!(
        answer.contains("refused") && answer.contains("another user's `gpuwarden run`"),
        "{answer}"
    );
    let answer = ask_as(NOBODY, NOBODY, &socket, &run).await;
    assert!(answer.contains("\"session_cgroup\""), "{answer}");
    client::session_cgroup(&socket, "s-run")
        .await
        .expect("root is never refused");

    // Outside the group, the socket's mode keeps a caller out before any request.
    let answer = ask_as(OTHER, OTHER, &socket, &Request::Node).await;
    assert_eq!(answer, "connect: PermissionError");
    server.abort();
}

#[tokio::test]
async fn a_request_line_past_the_limit_is_refused_and_the_connection_closed() {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};

    let scratch = gpuwarden_test_support::scratch("sock-long");
    let path = scratch.path().join("agent.sock");
    let listener = bind(&path, None).expect("binds");
    let socket = path.clone();
    let agent = tokio::spawn(async move { serve(listener, Arc::new(Fake), &socket).await });
    let stream = tokio::net::UnixStream::connect(&path)
        .await
        .expect("connects");
    let (read, mut write) = stream.into_split();
    // A megabyte with no newline: the agent must not wait for (or keep) all of it.
    let flood = vec![b'{'; 1 << 20];
    let writer = tokio::spawn(async move {
        let _ = write.write_all(&flood).await;
        write
    });
    let mut lines = tokio::io::BufReader::new(read).lines();
    let answer = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("answers in time")
        .expect("reads")
        .expect("a line");
    assert!(
        answer.contains("request longer than 65536 bytes"),
        "{answer}"
    );
    let after = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("closes in time")
        .expect("reads");
    assert_eq!(after, None, "the connection stays open");
    drop(writer);
    agent.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root"]
async fn only_root_suspends_or_resumes_a_session() {
    gpuwarden_test_support::require_root();
    let scratch = gpuwarden_test_support::scratch("sock-suspend");
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    let socket = scratch.path().join("agent.sock");
    let listener = bind(&socket, Some(NOBODY)).expect("binds");
    let server = tokio::spawn({
        let socket = socket.clone();
        async move { serve(listener, Arc::new(Fake), &socket).await }
    });
    for request in [
        Request::Suspend {
            session_id: "s-1".into(),
        },
        Request::ResumeSuspended {
            session_id: "s-1".into(),
        },
    ] {
        let answer = ask_as(NOBODY, NOBODY, &socket, &request).await;
        assert!(
            answer.contains("refused") && answer.contains("root"),
            "{answer}"
        );
        let done = client::suspend(&socket, &request)
            .await
            .expect("root may suspend");
        assert_eq!(done.session_id, "s-1");
    }
    server.abort();
}
