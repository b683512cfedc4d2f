//! `gpuwarden-agent top` as a script or a pager meets it: stdout is a pipe, not a terminal.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::net::UnixListener,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use gpuwarden_agent_api::{Response, parse_request, snapshot::Snapshot};

/// Answers every connection's request with a snapshot of node `node-top`.
fn fake_agent(listener: UnixListener) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let mut line = String::new();
            if BufReader::new(&stream).read_line(&mut line).is_err() {
                continue;
            }
            assert!(parse_request(&line).is_ok(), "{line}");
            let snapshot = Snapshot {
                node: "node-top".into(),
                ..Snapshot::default()
            };
            let mut answer =
                serde_json::to_vec(&Response::Snapshot(Box::new(snapshot))).expect("encodes");
            answer.push(b'\n');
            let _ = (&stream).write_all(&answer);
        }
    });
}

#[test]
fn piped_top_prints_one_frame_without_escapes_and_exits() {
    let scratch = gpuwarden_test_support::scratch("top");
    let socket = scratch.path().join("agent.sock");
    fake_agent(UnixListener::bind(&socket).expect("binds"));
    for once in [false, true] {
        let mut top = Command::new(env!("CARGO_BIN_EXE_gpuwarden-agent"));
        top.args(["top", "--interval", "0.1", "--socket"])
            .arg(&socket)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if once {
            top.arg("--once");
        }
        let mut child = top.spawn().expect("starts");
        let started = Instant::now();
        while child.try_wait().expect("waits").is_none() {
            if started.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                panic!("top with stdout piped (--once: {once}) kept running");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().expect("output");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!stdout.contains('\x1b'), "escapes in a pipe: {stdout:?}");
        assert_eq!(stdout.matches("node node-top").count(), 1, "{stdout}");
    }
}
