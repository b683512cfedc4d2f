//! Running the `gpuwarden` CLI as its end-to-end tests do: against a controller's URL, as a
//! process of its own, and with the node agent's local socket played for `gpuwarden run`.
#![expect(
    clippy::missing_panics_doc,
    reason = "a test helper: a CLI that does not run should fail the test where it happened"
)]

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixListener,
    path::{Path, PathBuf},
};

/// Runs the `gpuwarden` CLI against the controller at `url`: its exit code, stdout and stderr.
#[must_use]
pub fn gpuwarden(url: &str, args: &[&str]) -> (i32, String, String) {
    gpuwarden_with(url, args, &[])
}

/// The `gpuwarden` CLI's settings a test names itself (credentials, the controller); none of
/// the test process's own is passed on.
const SETTINGS: [&str; 5] = [
    "GPUWARDEN_CONTROLLER",
    "GPUWARDEN_TOKEN_FILE",
    "GPUWARDEN_CA",
    "GPUWARDEN_CERT",
    "GPUWARDEN_KEY",
];

/// [`gpuwarden`] with the settings `env` names (a token file, a CA, a client certificate) and no
/// other `GPUWARDEN_*` setting than `url`; an empty `url` leaves the controller to `args`
/// (`--controller`).
#[must_use]
pub fn gpuwarden_with(url: &str, args: &[&str], env: &[(&str, &Path)]) -> (i32, String, String) {
    let out = command(url, env)
        .args(args)
        .output()
        .expect("gpuwarden runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `gpuwarden` CLI as [`gpuwarden_with`] runs it, arguments still to add: for a test that
/// reads its output as bytes or gives it a stdin.
#[must_use]
pub fn command(url: &str, env: &[(&str, &Path)]) -> std::process::Command {
    let mut command = std::process::Command::new(crate::bin("gpuwarden"));
    for name in SETTINGS {
        command.env_remove(name);
    }
    if !url.is_empty() {
        command.env("GPUWARDEN_CONTROLLER", url);
    }
    for (name, value) in env {
        command.env(name, value);
    }
    command
}

/// [`gpuwarden`], which must succeed: what it printed.
#[must_use]
pub fn ok(url: &str, args: &[&str]) -> String {
    let (code, out, err) = gpuwarden(url, args);
    assert_eq!(code, 0, "{args:?}: {err}");
    out
}

/// [`gpuwarden`] with `--json`, which must succeed: the document it printed.
#[must_use]
pub fn json(url: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let (code, out, err) = gpuwarden(url, &all);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

/// Waits until the controller at `url` lists node `node` (its fake agent registered).
pub fn wait_for_node(url: &str, node: &str) {
    crate::wait::until(
        &format!("node {node} to register"),
        crate::wait::PATIENCE,
        || gpuwarden(url, &["--json", "node", "ls"]).1.contains(node),
    );
}

/// Plays the node agent's local socket for `gpuwarden run` on `node`: answers its two requests,
/// handing out `cgroup_dir` for every session; the first cgroup answer is "not bound yet".
pub fn fake_agent_socket(path: &Path, node: &str, cgroup_dir: PathBuf) {
    let node = node.to_owned();
    let listener = UnixListener::bind(path).expect("binds the agent socket");
    std::thread::spawn(move || {
        let mut asked = 0;
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let mut reader = BufReader::new(&stream);
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let request: serde_json::Value =
                serde_json::from_str(&line).unwrap_or(serde_json::Value::Null);
            let answer = match request["request"].as_str() {
                Some("node") => serde_json::json!({"node": {"name": node}}),
                Some("session_cgroup") => {
                    asked += 1;
                    serde_json::json!({"session_cgroup": {
                        "session_id": request["session_id"],
                        "cgroup_dir": cgroup_dir,
                        "bound": asked > 1,
                    }})
                }
                _ => serde_json::json!({"error": format!("unknown request {line:?}")}),
            };
            let _ = writeln!(&stream, "{answer}");
        }
    });
}
