//! What the CLI end-to-end tests share: a real controller serving on loopback.
#![allow(
    dead_code,
    reason = "each test binary includes this module and uses a different part of it"
)]

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixListener,
    path::{Path, PathBuf},
    sync::Weak,
};

use gpuwarden_controller::{
    api::Timing, controller::Controller, scheduler::SchedulerConfig, server,
};

/// Starts a controller with its store under `scratch` on a runtime of its own; returns the
/// runtime (dropping it stops the controller) and the controller's URL.
pub fn start_controller(scratch: &Path) -> (tokio::runtime::Runtime, String) {
    start_controller_with(scratch, server::Transport::PlainText.into())
}

/// [`start_controller`] with `security`: TLS (the URL is then `https://`), client
/// authentication (a token file), or both.
pub fn start_controller_with(
    scratch: &Path,
    security: server::Security,
) -> (tokio::runtime::Runtime, String) {
    start_controller_scheduling(scratch, security, SchedulerConfig::default())
}

/// [`start_controller_with`], scheduling with `config` (team quotas, a preemption grace).
pub fn start_controller_scheduling(
    scratch: &Path,
    security: server::Security,
    config: SchedulerConfig,
) -> (tokio::runtime::Runtime, String) {
    let (rt, url, _) = start(scratch, security, config);
    (rt, url)
}

/// [`start_controller`], with the controller itself, held weakly (the runtime owns it), for
/// [`wait_passes`].
pub fn start_controller_held(
    scratch: &Path,
) -> (tokio::runtime::Runtime, String, Weak<Controller>) {
    start(
        scratch,
        server::Transport::PlainText.into(),
        SchedulerConfig::default(),
    )
}

/// Waits until `controller` has run `n` more scheduling passes that had a session to try (every
/// pass tries each pending session): a state that lasts over them lasted over passes, not over
/// a guessed time.
pub fn wait_passes(controller: &Weak<Controller>, n: u64) {
    let count = || {
        controller
            .upgrade()
            .expect("the controller runs")
            .pass_times()
            .0
    };
    let target = count() + n;
    gpuwarden_test_support::wait::until(
        &format!("{n} scheduling passes"),
        gpuwarden_test_support::wait::PATIENCE,
        || count() >= target,
    );
}

fn start(
    scratch: &Path,
    security: server::Security,
    config: SchedulerConfig,
) -> (tokio::runtime::Runtime, String, Weak<Controller>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let controller = rt
        .block_on(server::open(
            &server::sled_in(&scratch.join("controller")),
            config,
            Timing::default(),
        ))
        .expect("controller opens");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("binds");
    let scheme = if matches!(security.transport, server::Transport::Tls(_)) {
        "https"
    } else {
        "http"
    };
    let url = format!("{scheme}://{}", listener.local_addr().expect("bound"));
    let held = std::sync::Arc::downgrade(&controller);
    rt.spawn(
        server::GrpcServer::new(controller, listener)
            .security(security)
            .serve(std::future::pending::<()>()),
    );
    (rt, url, held)
}

/// Runs the `gpuwarden` CLI against the controller at `url`: its exit code, stdout and stderr.
pub fn gpuwarden(url: &str, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpuwarden"))
        .args(args)
        .env("GPUWARDEN_CONTROLLER", url)
        .output()
        .expect("gpuwarden runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`gpuwarden`] with `--json`, which must succeed: the document it printed.
pub fn json(url: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let (code, out, err) = gpuwarden(url, &all);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

/// Waits until the controller at `url` lists node `node` (its fake agent registered).
pub fn wait_for_node(url: &str, node: &str) {
    gpuwarden_test_support::wait::until(
        &format!("node {node} to register"),
        gpuwarden_test_support::wait::PATIENCE,
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
