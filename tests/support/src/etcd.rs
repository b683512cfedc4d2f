//! A real etcd for tests: Debian's `etcd-server` (installed by `cargo xtask setup`), one member on
//! loopback ports, its data in a scratch directory, killed when dropped.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// How long etcd may take to answer `/health` after it starts: generous, as several tests start
/// their own etcd at once on a shared two-CPU machine.
const READY: Duration = Duration::from_mins(1);

/// One etcd member.
pub struct Etcd {
    child: Option<Child>,
    client_port: u16,
    peer_port: u16,
    data: PathBuf,
    log: PathBuf,
    tls: Option<EtcdTls>,
    _scratch: tempfile::TempDir,
}

/// The files of an etcd that serves clients over TLS and asks for their certificates.
#[derive(Debug, Clone)]
pub struct EtcdTls {
    /// The CA that signs etcd's certificate and its clients'.
    pub ca: PathBuf,
    /// etcd's serving certificate (for 127.0.0.1).
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

impl Etcd {
    /// Starts etcd and waits until it is healthy.
    ///
    /// # Panics
    /// etcd is not installed, or does not become healthy in time (its log is in the message).
    #[must_use]
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// Starts etcd serving clients over TLS with `tls`, requiring a client certificate signed by
    /// its CA (`--client-cert-auth`).
    ///
    /// # Panics
    /// As [`Etcd::start`].
    #[must_use]
    pub fn start_tls(tls: EtcdTls) -> Self {
        Self::start_with(Some(tls))
    }

    fn start_with(tls: Option<EtcdTls>) -> Self {
        let scratch = crate::scratch("etcd");
        let mut etcd = Self {
            child: None,
            client_port: free_port(),
            peer_port: free_port(),
            data: scratch.path().join("data"),
            log: scratch.path().join("etcd.log"),
            tls,
            _scratch: scratch,
        };
        etcd.resume();
        etcd
    }

    /// `127.0.0.1:PORT`, its client address.
    #[must_use]
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The controller's `--store` for this etcd, keys under `prefix`.
    #[must_use]
    pub fn store_url(&self, prefix: &str) -> String {
        format!("etcd://{}/{prefix}", self.endpoint())
    }

    /// Kills it (SIGKILL), keeping its data.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same ports and data, and waits until it is healthy.
    ///
    /// # Panics
    /// As [`Etcd::start`].
    pub fn resume(&mut self) {
        self.kill();
        let log = std::fs::File::create(&self.log)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", self.log.display()));
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut command = Command::new("etcd");
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        let child = command
            .args(["--name", "test", "--data-dir"])
            .arg(&self.data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("test={peer}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start etcd ({e}): install Debian's etcd-server (`cargo xtask setup` does)"
                )
            });
        self.child = Some(child);
        let started = Instant::now();
        while !self.healthy() {
            assert!(
                started.elapsed() < READY,
                "etcd not healthy after {READY:?}; its log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether `/health` says so (over TLS: whether etcd logged that it serves clients).
    #[must_use]
    pub fn healthy(&self) -> bool {
        if self.tls.is_some() {
            return std::fs::read_to_string(&self.log)
                .is_ok_and(|log| log.contains("ready to serve client requests"));
        }
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.client_port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(b"GET /health HTTP/1.0\r\n\r\n").is_err() {
            return false;
        }
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer.contains("\"health\":\"true\"")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback port nobody listens on now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or_else(|e| panic!("cannot find a free port: {e}"), |a| a.port())
}
