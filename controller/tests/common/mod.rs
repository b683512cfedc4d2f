//! Controllers as the integration tests run them: in this process on a loopback port
//! ([`serve_in_process`]), or as the binary in a process of its own with a scratch state
//! directory, killed (SIGKILL) when dropped ([`ControllerProcess`]).
#![allow(
    dead_code,
    reason = "each test binary includes this module and uses a different part of it"
)]

use std::{
    io::{BufRead as _, BufReader},
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use gpuwarden_controller::{
    api::Timing,
    limits::Bounds,
    scheduler::SchedulerConfig,
    server::{self, Security},
};
use gpuwarden_proto::v1::{self as pb, scheduler_service_client::SchedulerServiceClient};
use tonic::transport::Channel;

/// A controller in this process with its sled store in `dir`, served over `security` and held
/// to `bounds` (which count what it refuses) on a loopback port, until the test's runtime ends;
/// its address.
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
    tokio::spawn(
        server::GrpcServer::new(controller, listener)
            .security(security)
            .bounds(bounds)
            .serve(std::future::pending::<()>()),
    );
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
    pub fn start(store: &str, extra: &[&str]) -> Self {
        let dir = gpuwarden_test_support::scratch("ctl");
        let mut child = Command::new(env!("CARGO_BIN_EXE_gpuwarden-controller"))
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

    pub async fn channel(&self) -> Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("a URL")
            .connect()
            .await
            .expect("connects")
    }

    pub async fn client(&self) -> SchedulerServiceClient<Channel> {
        SchedulerServiceClient::new(self.channel().await)
    }

    /// The names of its sessions, sorted; `Err` with the status when it refuses (a standby).
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
        gpuwarden_test_support::node::register(
            &format!("http://{}", self.addr),
            gpuwarden_test_support::node::with_cpus("n1", 1000),
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
