//! A gpuwarden controller for a test, three ways:
//!
//! - [`TestController`]: in the test's process, on a runtime of its own, started through the
//!   controller's own lifecycle by one builder ([`TestControllerBuilder`]): on sled in a state
//!   directory, or campaigning on an etcd store, served on a loopback port (TLS where its
//!   security says so); [`runtime`] gives the test one of its own beside it. Stopped gracefully when dropped, or killed ([`TestController::kill`]): its runtime dropped
//!   with every task mid-flight, as abrupt as a crash (an elected one's lease then lapses).
//! - [`serve_in_process`]: its gRPC server alone, on the test's own runtime.
//! - [`ControllerProcess`]: the `gpuwarden-controller` binary in a process of its own, killed
//!   (SIGKILL) when dropped.
#![expect(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "a test helper: a failed start should fail the test where it happened"
)]

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Weak},
    time::{Duration, Instant},
};

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
};

use gpuwarden_controller::{
    api::Timing,
    hub::Hub,
    limits::Bounds,
    scheduler::SchedulerConfig,
    server::{self, Security},
    store::StoreSpec,
};
use gpuwarden_proto::v1::{self as pb, scheduler_service_client::SchedulerServiceClient};
use gpuwarden_runtime::otlp::Exporters;
use tonic::transport::Channel;

/// Short heartbeats and scheduling passes, so tests wait milliseconds rather than seconds; a
/// node is lost after `heartbeat_timeout` of silence.
#[must_use]
pub fn fast_timing(heartbeat_timeout: Duration) -> Timing {
    Timing {
        heartbeat_interval: Duration::from_millis(200),
        heartbeat_timeout,
        pass_interval: Duration::from_millis(50),
    }
}

/// How long a controller dropped gracefully has to shut down before its runtime is dropped.
const GRACE: Duration = Duration::from_millis(100);

/// A controller on its own runtime: dropping that runtime is as abrupt as killing the process.
pub struct TestController {
    /// Where it serves (a loopback port), plain text unless its security says TLS.
    pub addr: SocketAddr,
    /// `https` where it serves TLS, else `http`.
    scheme: &'static str,
    /// Its state directory (empty for one on etcd).
    pub state_dir: PathBuf,
    /// Its bounds, which count what it refuses (the metrics it exports read them).
    pub bounds: Arc<Bounds>,
    /// The controller while its runtime runs it (held weakly: the runtime owns it, and its
    /// store must close when the runtime goes).
    controller: Weak<Hub>,
    stop: Option<std::sync::mpsc::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How a [`TestController`] is to run: built by [`TestController::builder`] (sled in a state
/// directory) or [`TestController::elected`] (campaigning on etcd), changed by its setters, run
/// by [`TestControllerBuilder::start`]. Unless told otherwise it schedules with the default
/// [`SchedulerConfig`] and [`Timing`], serves plain text on any free loopback port with no token
/// file, and exports no metrics.
#[must_use = "a builder does nothing until started"]
pub struct TestControllerBuilder {
    state_dir: PathBuf,
    store: StoreSpec,
    lease_ttl: Option<Duration>,
    config: SchedulerConfig,
    timing: Timing,
    security: server::Security,
    exporters: Exporters,
    addr: SocketAddr,
}

impl TestControllerBuilder {
    /// Schedules with `config`.
    pub fn config(mut self, config: SchedulerConfig) -> Self {
        self.config = config;
        self
    }

    /// Runs the agent protocol with `timing` (see [`fast_timing`]).
    pub fn timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    /// Authenticates clients as `security` says (a token file, grants): a controller whose users
    /// are tenants. Its port is plain-text loopback, so `security`'s transport must be
    /// `Insecure` for agents to register beside a token file.
    pub fn security(mut self, security: impl Into<server::Security>) -> Self {
        self.security = security.into();
        self
    }

    /// Sends its metrics to `exporters`.
    pub fn exporters(mut self, exporters: Exporters) -> Self {
        self.exporters = exporters;
        self
    }

    /// Exports OTLP metrics to `endpoint` every 300 ms.
    pub fn otlp(self, endpoint: impl Into<String>) -> Self {
        self.exporters(Exporters {
            otlp: Some(endpoint.into()),
            interval: Some(Duration::from_millis(300)),
            prometheus: None,
        })
    }

    /// Serves on `addr`: started again where one that was killed served
    /// ([`TestController::addr`]), so that agents given its URL find it again by themselves.
    pub fn addr(mut self, addr: SocketAddr) -> Self {
        self.addr = addr;
        self
    }

    /// Starts it, through the controller's own lifecycle (`App::build`, then `App::spawn`), on a
    /// runtime of its own in a thread of its own.
    ///
    /// # Panics
    /// It can't be built (a port in use, a store that can't be opened).
    #[must_use = "dropping it stops it"]
    pub fn start(self) -> TestController {
        let mut config = server::RunConfig::new(self.addr, self.store);
        config.scheduler = self.config;
        config.timing = self.timing;
        config.security = self.security;
        config.exporters = self.exporters;
        if let Some(ttl) = self.lease_ttl {
            config.lease_ttl = ttl;
        }
        let scheme = if matches!(config.security.transport, server::Transport::Tls(_)) {
            "https"
        } else {
            "http"
        };
        TestController::on_own_runtime(self.state_dir, config, scheme)
    }
}

impl TestController {
    /// A controller on sled in `state_dir`.
    pub fn builder(state_dir: &Path) -> TestControllerBuilder {
        TestControllerBuilder {
            state_dir: state_dir.to_owned(),
            store: server::sled_in(state_dir),
            lease_ttl: None,
            config: SchedulerConfig::default(),
            timing: Timing::default(),
            security: server::Transport::PlainText.into(),
            exporters: Exporters::default(),
            addr: local_port(),
        }
    }

    /// A controller on the etcd store `store`, campaigning with a lease of `ttl`: a standby
    /// until it wins. Killed, its lease's keep-alive stops with everything else.
    pub fn elected(store: &StoreSpec, ttl: Duration) -> TestControllerBuilder {
        TestControllerBuilder {
            state_dir: PathBuf::new(),
            store: store.clone(),
            lease_ttl: Some(ttl),
            ..Self::builder(Path::new(""))
        }
    }

    /// Builds and spawns the controller `config` describes on a runtime of its own in a thread
    /// of its own. Stopping gracefully shuts it down (for at most [`GRACE`]); killing drops the
    /// runtime with every task mid-flight.
    fn on_own_runtime(state_dir: PathBuf, config: server::RunConfig, scheme: &'static str) -> Self {
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<bool>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let running = rt.block_on(async {
                let app = server::App::build(config).await.unwrap();
                started_tx
                    .send((
                        app.addr(),
                        Arc::clone(app.bounds()),
                        Arc::downgrade(app.controller()),
                    ))
                    .unwrap();
                app.spawn()
            });
            if stopped.recv().unwrap_or(false) {
                rt.block_on(async {
                    let _ = tokio::time::timeout(GRACE, running.shutdown()).await;
                });
            } else {
                // Every task dropped mid-flight, its store handle with them; the stop they
                // share is let go of only after, so none of them sees it.
                rt.shutdown_background();
                drop(running);
                return;
            }
            rt.shutdown_background();
        });
        let (addr, bounds, controller) = started_rx.recv().unwrap();
        Self {
            addr,
            scheme,
            state_dir,
            bounds,
            controller,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Whether it answers as the leader.
    pub async fn leads(&self) -> bool {
        let Ok(channel) = tonic::transport::Endpoint::from_shared(self.url())
            .unwrap()
            .connect()
            .await
        else {
            return false;
        };
        SchedulerServiceClient::new(channel)
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .is_ok()
    }

    /// Waits until the controller has run `n` more scheduling passes that had a session to try
    /// (every pass tries each pending session), so a test checks that a state lasts over passes
    /// rather than over a guessed time.
    ///
    /// # Panics
    /// The controller stopped, or did not run `n` passes in 30 s.
    pub async fn passes(&self, n: u64) {
        let target = passes_run(&self.controller) + n;
        crate::wait::until_async(
            &format!("{n} scheduling passes"),
            crate::wait::PATIENCE,
            || async { passes_run(&self.controller) >= target },
        )
        .await;
    }

    /// Its URL.
    #[must_use]
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// A scheduler client connected to it.
    pub async fn client(&self) -> SchedulerServiceClient<Channel> {
        let channel = tonic::transport::Endpoint::from_shared(self.url())
            .unwrap()
            .connect()
            .await
            .unwrap();
        SchedulerServiceClient::new(channel)
    }

    /// Stops abruptly: no graceful shutdown, tasks dropped mid-flight.
    pub fn kill(mut self) {
        self.crash();
    }

    /// [`Self::kill`], in place: for a test that starts another where it was
    /// ([`TestControllerBuilder::addr`]) and drops this one then.
    pub fn crash(&mut self) {
        self.halt(false);
    }

    fn halt(&mut self, graceful: bool) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(graceful);
        }
        if let Some(t) = self.thread.take() {
            // A panic there was already reported by its thread.
            let _ = t.join();
        }
        // The store's lock is released once its last handle drops; give the OS a moment.
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Any free loopback port.
fn local_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

impl Drop for TestController {
    fn drop(&mut self) {
        self.halt(true);
    }
}

/// A controller in this process with its sled store in `dir`, served over `security` and held
/// to `bounds` (which count what it refuses) on a loopback port, until the test's runtime ends;
/// its address. The gRPC server without the daemon's lifecycle: for tests of what the server
/// alone refuses.
pub async fn serve_in_process(
    dir: &Path,
    security: impl Into<Security> + Send + 'static,
    bounds: Arc<Bounds>,
) -> SocketAddr {
    let controller = server::open(
        &server::sled_in(dir),
        SchedulerConfig::default(),
        Timing::default(),
    )
    .await
    .expect("opens");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let addr = listener.local_addr().expect("bound");
    let grpc = server::GrpcServer::new(controller, listener)
        .security(security.into())
        .bounds(bounds);
    tokio::spawn(grpc.serve(std::future::pending::<()>()));
    addr
}

/// A running `gpuwarden-controller run --store STORE`.
pub struct ControllerProcess {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl ControllerProcess {
    /// Starts it on `store` with `extra` arguments, and waits until it listens.
    ///
    /// It binds port 0 and says where in its log: a port picked here and handed over could be
    /// taken by another test's controller in between, and then this one would fail to bind
    /// while the other answered in its place.
    #[must_use]
    pub fn start(store: &str, extra: &[&str]) -> Self {
        let dir = crate::scratch("ctl");
        let mut child = Command::new(crate::bin("gpuwarden-controller"))
            .args(["run", "--listen", "127.0.0.1:0", "--store", store])
            .args(extra)
            .arg("--state-dir")
            .arg(dir.path())
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starts");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (said, heard) = std::sync::mpsc::channel();
        // Reads the log to its end, so the controller never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut said = Some(said);
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = listening_on(&line)
                    && let Some(said) = said.take()
                {
                    let _ = said.send(addr);
                }
            }
        });
        let addr = heard
            .recv_timeout(Duration::from_mins(1))
            .expect("the controller logs where it listens within a minute");
        Self {
            child,
            addr,
            _dir: dir,
        }
    }

    /// Sends it `signal`.
    pub fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.child.id()).expect("a pid");
        // SAFETY: a plain syscall on our own child.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }

    /// A channel to it.
    pub async fn channel(&self) -> Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("a URL")
            .connect()
            .await
            .expect("connects")
    }

    /// A scheduler client connected to it.
    pub async fn client(&self) -> SchedulerServiceClient<Channel> {
        SchedulerServiceClient::new(self.channel().await)
    }

    /// The names of its sessions, sorted.
    ///
    /// # Errors
    /// The status it refuses with (a standby).
    pub async fn names(&self) -> Result<Vec<String>, tonic::Status> {
        let mut names: Vec<String> = self
            .client()
            .await
            .list_sessions(pb::ListSessionsRequest::default())
            .await?
            .into_inner()
            .sessions
            .into_iter()
            .map(|s| s.name)
            .collect();
        names.sort();
        Ok(names)
    }

    /// Waits until it answers as the leader (on etcd, once it has won the election); how long.
    /// A refused connection counts as not serving yet: a restarted controller may still be
    /// opening its store behind the port.
    pub async fn until_serving(&self, within: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
                .expect("a URL");
            if let Ok(channel) = endpoint.connect().await
                && SchedulerServiceClient::new(channel)
                    .list_sessions(pb::ListSessionsRequest::default())
                    .await
                    .is_ok()
            {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < within,
                "{} did not serve within {within:?}",
                self.addr
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Registers node `n1` with 1,000 CPUs, so that sessions asking for `cpu` are valid.
    pub async fn register_node(&self) {
        crate::node::register(
            &format!("http://{}", self.addr),
            crate::node::with_cpus("n1", 1000),
        )
        .await;
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The address in a controller's "controller listening … addr=…" log line.
fn listening_on(line: &str) -> Option<SocketAddr> {
    if !line.contains("controller listening") {
        return None;
    }
    let (_, rest) = line.split_once("addr=")?;
    rest.split_whitespace().next()?.parse().ok()
}

/// A session of one CPU named `name`, owned by alice.
#[must_use]
pub fn request(name: &str) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        requested: Some(pb::ResourceSlot {
            values: [("cpu".to_owned(), "1".to_owned())].into(),
        }),
        owner: "alice".into(),
        name: name.into(),
        ..Default::default()
    }
}

/// A runtime for a test's own tasks beside a [`TestController`] (fake agents, clients, its
/// `block_on`s); dropped before the controller, it stops them first.
#[must_use]
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// How many scheduling passes that had a session to try `controller` has run.
fn passes_run(controller: &Weak<Hub>) -> u64 {
    controller
        .upgrade()
        .expect("a running controller")
        .pass_times()
        .0
}
