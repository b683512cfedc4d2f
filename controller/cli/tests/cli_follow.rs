//! The CLI given several controllers sharing a real etcd: whichever it asks first, a dead one or
//! a standby, it ends up asking the leader; `session watch` follows the leader through a
//! failover and misses no change; and given a controller from before `WatchSessionEvents`, it
//! falls back to `WatchSessions` and still misses no change.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    io::BufRead as _,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use gpuwarden_controller::store::StoreSpec;
use gpuwarden_proto::v1 as pb;
use gpuwarden_test_support::{
    Etcd, cli,
    controller::TestController,
    node,
    wait::{self, PATIENCE},
};
use tonic::{
    Status,
    body::Body,
    codegen::{BoxFuture, Service, http},
    server::NamedService,
    transport::Channel,
};

/// The lease of the controllers here: a killed leader's office lapses this long after.
const TTL: Duration = Duration::from_secs(2);

/// A controller campaigning on `store`, on a runtime of its own: [`TestController::kill`] stops
/// it at once, open streams and all, as a crash would (its lease then lapses).
fn start_elected(store: &str) -> TestController {
    let spec: StoreSpec = store.parse().expect("a store spec");
    TestController::elected(&spec, TTL).start()
}

/// Waits until `controller` leads: the CLI's `slot ls` through it succeeds.
fn until_leading(controller: &TestController) {
    let url = controller.url();
    wait::until(&format!("{url} to lead"), PATIENCE, || slot_ls(&url).0);
}

fn slot_ls(controllers: &str) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwarden"))
        .args(["--controller", controllers, "slot", "ls"])
        .output()
        .expect("runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_cli_asks_the_leader_whichever_controller_it_is_given() {
    let etcd = Etcd::start();
    let store = etcd.store_url("cli");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let first = start_elected(&store);
    // The first to start leads: wait until it does, then start a standby.
    until_leading(&first);
    let second = start_elected(&store);
    let (leader, standby) = (first.url(), second.url());
    // Only the leader knows this slot type: seeing it proves whom the CLI asked.
    rt.block_on(node::register(
        &leader,
        pb::NodeInfo {
            slot_types: vec![pb::SlotType {
                name: "tpu.cores".into(),
                kind: pb::SlotKind::Count.into(),
            }],
            ..node::bare("n1")
        },
    ));
    // The standby learns the leader soon after starting: wait until asking it reaches the
    // leader, then every way of naming it must.
    wait::until("the standby to know the leader", PATIENCE, || {
        let (ok, said) = slot_ls(&standby);
        ok && said.contains("tpu.cores")
    });
    for given in [
        standby.clone(),
        format!("http://127.0.0.1:1,{standby}"),
        format!("{standby},{leader}"),
    ] {
        let (ok, said) = slot_ls(&given);
        assert!(
            ok && said.contains("tpu.cores"),
            "--controller {given}: {said}"
        );
    }
}

fn gpuwarden(controllers: &str, args: &[&str]) -> String {
    let (code, out, err) =
        cli::gpuwarden_with("", &[&["--controller", controllers], args].concat(), &[]);
    assert_eq!(code, 0, "{args:?}: {err}");
    out
}

/// Registers a node with 1,000 CPUs on the controller at `url`.
fn register(rt: &tokio::runtime::Runtime, url: &str) {
    rt.block_on(node::register(url, node::with_cpus("n1", 1000)));
}

/// `(id → (revision, state))` of every session `controllers` lists.
fn listed(controllers: &str) -> BTreeMap<String, (u64, String)> {
    let out = gpuwarden(controllers, &["--json", "session", "ls"]);
    let sessions: Vec<serde_json::Value> = serde_json::from_str(&out).expect("JSON");
    sessions
        .iter()
        .map(|s| {
            (
                s["id"].as_str().expect("an id").to_owned(),
                (
                    s["revision"].as_u64().expect("a revision"),
                    s["state"].as_str().expect("a state").to_owned(),
                ),
            )
        })
        .collect()
}

#[test]
fn session_watch_follows_the_leader_through_a_failover_and_misses_no_change() {
    let etcd = Etcd::start();
    let store = etcd.store_url("cli-watch");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let a = start_elected(&store);
    until_leading(&a);
    let b = start_elected(&store);
    let (a_url, b_url) = (a.url(), b.url());
    register(&rt, &a_url);
    let both = format!("{a_url},{b_url}");

    let mut watch = Command::new(env!("CARGO_BIN_EXE_gpuwarden"))
        .args(["--controller", &both, "--json", "session", "watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("watches");
    // Each line as it comes: the latest (revision, state) per session.
    let seen: Arc<Mutex<BTreeMap<String, (u64, String)>>> = Arc::default();
    let lines = watch.stdout.take().expect("stdout");
    let into = Arc::clone(&seen);
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(lines).lines() {
            let Ok(line) = line else { return };
            let s: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
            let id = s["id"].as_str().expect("an id").to_owned();
            let revision = s["revision"].as_u64().expect("a revision");
            let state = s["state"].as_str().expect("a state").to_owned();
            let mut seen = into.lock().expect("not poisoned");
            if seen.get(&id).is_none_or(|(r, _)| *r < revision) {
                seen.insert(id, (revision, state));
            }
        }
    });
    let caught_up = |controllers: &str| {
        let mut truth = BTreeMap::new();
        wait::until(
            "the watch to show the latest state of every session",
            Duration::from_mins(1),
            || {
                truth = listed(controllers);
                let seen = seen.lock().expect("not poisoned");
                truth
                    .iter()
                    .all(|(id, (r, _))| seen.get(id).is_some_and(|(s, _)| s >= r))
            },
        );
        truth
    };

    let create = |controllers: &str, name: &str| {
        gpuwarden(
            controllers,
            &["session", "create", "-r", "cpu=1", "--name", name],
        )
        .trim()
        .to_owned()
    };
    let first: Vec<String> = (0..5).map(|i| create(&a_url, &format!("a-{i}"))).collect();
    caught_up(&a_url);

    a.kill();
    until_leading(&b);
    register(&rt, &b_url);
    for id in &first[..3] {
        gpuwarden(&b_url, &["session", "rm", id]);
    }
    for i in 0..5 {
        create(&b_url, &format!("b-{i}"));
    }
    let truth = caught_up(&b_url);
    assert_eq!(truth.len(), 10);
    // Ended by request (or failed first: their node's agent never connected).
    for id in &first[..3] {
        let (_, state) = &truth[id];
        assert!(state == "terminated" || state == "failed", "{truth:?}");
    }
    let _ = watch.kill();
    let _ = watch.wait();
}

/// The `SchedulerService` of a controller from before issue 40, as the wire shows it: every
/// call passed to a real controller except `WatchSessionEvents`, answered `UNIMPLEMENTED` as
/// tonic's generated router answers a method its proto does not have. Records the methods
/// asked, in order.
#[derive(Clone)]
struct BeforeEvents {
    upstream: Channel,
    asked: Arc<Mutex<Vec<String>>>,
}

impl NamedService for BeforeEvents {
    const NAME: &'static str = "gpuwarden.v1.SchedulerService";
}

impl Service<http::Request<Body>> for BeforeEvents {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = request
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        self.asked
            .lock()
            .expect("not poisoned")
            .push(method.clone());
        let mut upstream = self.upstream.clone();
        Box::pin(async move {
            if method == "WatchSessionEvents" {
                return Ok(Status::unimplemented("").into_http());
            }
            let answer = match std::future::poll_fn(|cx| upstream.poll_ready(cx)).await {
                Ok(()) => upstream.call(request).await,
                Err(e) => Err(e),
            };
            Ok(answer.unwrap_or_else(|e| Status::unavailable(e.to_string()).into_http()))
        })
    }
}

/// Serves [`BeforeEvents`] in front of the controller at `url` on `rt`: its URL, and the methods
/// it was asked.
fn serve_before_events(
    rt: &tokio::runtime::Runtime,
    url: &str,
) -> (String, Arc<Mutex<Vec<String>>>) {
    let asked: Arc<Mutex<Vec<String>>> = Arc::default();
    let older = rt.block_on(async {
        let upstream = tonic::transport::Endpoint::from_shared(url.to_owned())
            .expect("a URL")
            .connect()
            .await
            .expect("connects");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let addr = listener.local_addr().expect("an address");
        let service = BeforeEvents {
            upstream,
            asked: Arc::clone(&asked),
        };
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        format!("http://{addr}")
    });
    (older, asked)
}

#[test]
fn session_watch_falls_back_to_watch_sessions_on_a_controller_without_events() {
    let dir = gpuwarden_test_support::scratch("cli-watch-older");
    let controller = TestController::builder(dir.path()).start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    register(&rt, &controller.url());
    let (older, asked) = serve_before_events(&rt, &controller.url());
    // The CLI as its user runs it, against the older controller only.
    let mut watch = Command::new(env!("CARGO_BIN_EXE_gpuwarden"))
        .args(["--controller", &older, "--json", "session", "watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("watches");
    let seen: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let lines = watch.stdout.take().expect("stdout");
    let into = Arc::clone(&seen);
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(lines).lines() {
            let Ok(line) = line else { return };
            let s: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
            let id = s["id"].as_str().expect("an id").to_owned();
            let revision = s["revision"].as_u64().expect("a revision");
            let mut seen = into.lock().expect("not poisoned");
            let latest = seen.entry(id).or_default();
            *latest = (*latest).max(revision);
        }
    });
    // Until the follower has asked for a watch, so that the creates below come after its
    // listing and only the watch can show them.
    wait::until("the follower to watch", PATIENCE, || {
        asked
            .lock()
            .expect("not poisoned")
            .iter()
            .any(|m| m == "WatchSessions")
    });
    let made: Vec<String> = (0..4)
        .map(|i| {
            gpuwarden(
                &older,
                &[
                    "session",
                    "create",
                    "-r",
                    "cpu=1",
                    "--name",
                    &format!("o-{i}"),
                ],
            )
            .trim()
            .to_owned()
        })
        .collect();
    gpuwarden(&older, &["session", "rm", &made[0]]);
    let mut truth = BTreeMap::new();
    wait::until(
        "the watch to show the latest state of every session",
        Duration::from_mins(1),
        || {
            truth = listed(&controller.url());
            let seen = seen.lock().expect("not poisoned");
            truth
                .iter()
                .all(|(id, (r, _))| seen.get(id).is_some_and(|s| s >= r))
        },
    );
    let _ = watch.kill();
    let _ = watch.wait();
    assert_eq!(truth.len(), made.len(), "{truth:?}");
    let asked = asked.lock().expect("not poisoned").clone();
    let watches: Vec<&String> = asked.iter().filter(|m| m.starts_with("Watch")).collect();
    // Asked for events once, refused, and never again: it watched sessions from then on.
    assert_eq!(
        watches.first().map(|m| m.as_str()),
        Some("WatchSessionEvents"),
        "{asked:?}"
    );
    assert_eq!(
        watches
            .iter()
            .filter(|m| **m == "WatchSessionEvents")
            .count(),
        1,
        "{asked:?}"
    );
    assert!(
        watches[1..].iter().all(|m| *m == "WatchSessions"),
        "{asked:?}"
    );
}
