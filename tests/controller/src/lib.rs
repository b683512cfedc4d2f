//! A gpuwarden controller in the test's process, on a runtime of its own ([`TestController`]):
//! on sled in a state directory, or campaigning on an etcd store, served in plain text on a
//! loopback port. Stopped gracefully when dropped, or killed ([`TestController::kill`]): its
//! runtime dropped with every task mid-flight, as abrupt as a crash (an elected one's lease then
//! lapses).
//!
//! The CLI's tests and the end-to-end tests share it; the controller's own tests cannot (it
//! would make a second copy of the controller crate), and serve in process themselves.
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

use gpuwarden_controller::{
    api::Timing,
    controller::Controller,
    limits::{Bounds, Limits},
    scheduler::SchedulerConfig,
    server,
    store::StoreSpec,
};
use gpuwarden_proto::v1::{self as pb, scheduler_service_client::SchedulerServiceClient};
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

/// A controller on its own runtime: dropping that runtime is as abrupt as killing the process.
pub struct TestController {
    /// Where it serves plain text (a loopback port).
    pub addr: SocketAddr,
    /// Its state directory (empty for one on etcd).
    pub state_dir: PathBuf,
    /// Its bounds, which count what it refuses (the metrics it exports read them).
    pub bounds: Arc<Bounds>,
    /// The controller while its runtime runs it (held weakly: the runtime owns it, and its
    /// store must close when the runtime goes); none for an elected one.
    controller: Weak<Controller>,
    stop: Option<std::sync::mpsc::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestController {
    /// A controller on sled in `state_dir`, scheduling with `config` and `timing`.
    #[must_use = "dropping it stops it"]
    pub fn start(state_dir: &Path, config: SchedulerConfig, timing: Timing) -> Self {
        Self::start_with_metrics(state_dir, config, timing, None)
    }

    /// [`Self::start`], exporting OTLP metrics to `otlp` every 300 ms when given.
    #[must_use = "dropping it stops it"]
    pub fn start_with_metrics(
        state_dir: &Path,
        config: SchedulerConfig,
        timing: Timing,
        otlp: Option<String>,
    ) -> Self {
        Self::start_with_exporters(
            state_dir,
            config,
            timing,
            gpuwarden_runtime::otlp::Exporters {
                otlp,
                interval: Some(Duration::from_millis(300)),
                prometheus: None,
            },
        )
    }

    /// [`Self::start`], with its metrics going to `exporters`.
    #[must_use = "dropping it stops it"]
    pub fn start_with_exporters(
        state_dir: &Path,
        config: SchedulerConfig,
        timing: Timing,
        exporters: gpuwarden_runtime::otlp::Exporters,
    ) -> Self {
        Self::serve_on(
            state_dir,
            config,
            timing,
            exporters,
            local_port(),
            server::Transport::PlainText.into(),
        )
    }

    /// [`Self::start`], authenticating clients as `security` says (a token file, grants): a
    /// controller whose users are tenants. Its port is plain-text loopback, so `security`'s
    /// transport must be `Insecure` for agents to register beside a token file.
    #[must_use = "dropping it stops it"]
    pub fn start_secured(
        state_dir: &Path,
        config: SchedulerConfig,
        timing: Timing,
        security: server::Security,
    ) -> Self {
        Self::serve_on(
            state_dir,
            config,
            timing,
            gpuwarden_runtime::otlp::Exporters::default(),
            local_port(),
            security,
        )
    }

    /// A controller on sled in `state_dir` serving on `addr`: started again where one that was
    /// killed served ([`Self::addr`]), so that agents given its URL find it again by themselves.
    #[must_use = "dropping it stops it"]
    pub fn start_on(
        state_dir: &Path,
        config: SchedulerConfig,
        timing: Timing,
        addr: SocketAddr,
    ) -> Self {
        Self::serve_on(
            state_dir,
            config,
            timing,
            gpuwarden_runtime::otlp::Exporters::default(),
            addr,
            server::Transport::PlainText.into(),
        )
    }

    fn serve_on(
        state_dir: &Path,
        config: SchedulerConfig,
        timing: Timing,
        exporters: gpuwarden_runtime::otlp::Exporters,
        addr: SocketAddr,
        security: server::Security,
    ) -> Self {
        let dir = state_dir.to_owned();
        Self::on_own_runtime(state_dir.to_owned(), move |rt, bounds, shutdown| {
            rt.block_on(async {
                let controller = server::open(&server::sled_in(&dir), config, timing)
                    .await
                    .unwrap();
                let held = Arc::downgrade(&controller);
                let metrics =
                    gpuwarden_controller::metrics::start(&controller, &bounds, &exporters).unwrap();
                let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
                let addr = listener.local_addr().unwrap();
                tokio::spawn(server::serve_bounded(
                    controller,
                    listener,
                    security,
                    bounds,
                    None,
                    async {
                        let _ = shutdown.await;
                    },
                ));
                // The metrics' callbacks hold the controller (and its store): kept until the
                // controller stops, let go of before its runtime.
                (addr, held, metrics)
            })
        })
    }

    /// A controller on the etcd store `store`, campaigning with a lease of `ttl`: a standby
    /// until it wins. Killed, its lease's keep-alive stops with everything else.
    #[must_use = "dropping it stops it"]
    pub fn start_elected(store: &StoreSpec, timing: Timing, ttl: Duration) -> Self {
        Self::start_elected_with(store, SchedulerConfig::default(), timing, ttl)
    }

    /// [`Self::start_elected`], scheduling with `config` once it leads.
    #[must_use = "dropping it stops it"]
    pub fn start_elected_with(
        store: &StoreSpec,
        config: SchedulerConfig,
        timing: Timing,
        ttl: Duration,
    ) -> Self {
        let store = store.clone();
        Self::on_own_runtime(PathBuf::new(), move |rt, bounds, shutdown| {
            let addr = rt
                .block_on(server::spawn_elected(
                    &store,
                    config,
                    timing,
                    ttl,
                    bounds,
                    async {
                        let _ = shutdown.await;
                    },
                ))
                .unwrap();
            (addr, Weak::new(), ())
        })
    }

    /// Runs `start` on a runtime of its own in a thread of its own, with the bounds the
    /// controller is to be held to; it returns the address, the controller (weakly, if it has
    /// one at hand) and what is kept until the controller stops. Stopping gracefully lets the server shut down first; killing drops the
    /// runtime with every task mid-flight.
    fn on_own_runtime<G>(
        state_dir: PathBuf,
        start: impl FnOnce(
            &tokio::runtime::Runtime,
            Arc<Bounds>,
            tokio::sync::oneshot::Receiver<()>,
        ) -> (SocketAddr, Weak<Controller>, G)
        + Send
        + 'static,
    ) -> Self {
        let bounds = Bounds::new(Limits::default());
        let held = Arc::clone(&bounds);
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<bool>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
            let (addr, controller, kept) = start(&rt, held, shutdown_rx);
            started_tx.send((addr, controller)).unwrap();
            if stopped.recv().unwrap_or(false) {
                let _ = shutdown_tx.send(());
                rt.block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
            }
            drop(kept);
            // Dropping the runtime drops every task, its store handle with them.
            rt.shutdown_background();
        });
        let (addr, controller) = started_rx.recv().unwrap();
        Self {
            addr,
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
    /// rather than over a guessed time. Only a controller started on sled is held for this.
    ///
    /// # Panics
    /// The controller was elected, or stopped, or did not run `n` passes in 30 s.
    pub async fn passes(&self, n: u64) {
        let count = || {
            self.controller
                .upgrade()
                .expect("a running controller started on sled")
                .pass_times()
                .0
        };
        let target = count() + n;
        let started = Instant::now();
        while count() < target {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the controller did not run {n} scheduling passes in 30 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Its URL.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
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
    /// ([`Self::start_on`]) and drops this one then.
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
