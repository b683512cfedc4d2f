//! Secure by default, over real sockets (issue 21, §2 and the listener half of §3): plain text
//! is refused beyond loopback unless `--insecure`; `certs mint` never replaces the CA; node,
//! user and admin certificates from one CA never pass for one another (real rustls, real
//! tonic); unauthenticated gRPC callers are refused before their messages are read; the
//! webhook's HTTPS listener keeps its memory bounded under parallel 16 MiB bodies (the
//! controller binary's own `VmHWM`), drops a slow sender, and holds its connection cap.

use std::{
    io::Read as _,
    net::{SocketAddr, TcpListener},
    path::Path,
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use gpuwarden_controller::{
    auth::{
        clients::ClientRole,
        mint::{self, CA_CERT, CA_KEY},
        tls::{ReloadingConfig, ServerTlsFiles},
    },
    limits::{Bounds, Limits},
    server::{self, ServeError, Transport},
};
use gpuwarden_proto::v1::{
    self as pb, agent_service_client::AgentServiceClient,
    scheduler_service_client::SchedulerServiceClient,
};
use gpuwarden_runtime::tls::ClientTls;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::{Code, transport::Channel};

const CONTROLLER: &str = env!("CARGO_BIN_EXE_gpuwarden-controller");
const MIB: usize = 1 << 20;

/// Waits (bounded) for `child` to exit; its status, or `None` while it still runs.
fn exit_within(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let started = Instant::now();
    while started.elapsed() < within {
        if let Some(status) = child.try_wait().expect("waits") {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn stderr_of(child: &mut Child) -> String {
    let mut text = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut text);
    }
    text
}

// ---- §2: plain text only on loopback ----------------------------------------------------------

#[test]
fn plain_text_on_a_non_loopback_address_is_refused_naming_the_flags() {
    let dir = gpuwarden_test_support::scratch("secure");
    let listen = format!("0.0.0.0:{}", free_port());
    let mut child = Command::new(CONTROLLER)
        .args(["run", "--listen", &listen, "--state-dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let status = exit_within(&mut child, Duration::from_secs(30));
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the controller served plain text on {listen}");
    }
    let stderr = stderr_of(&mut child);
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{stderr}");
    for flag in ["--tls-cert", "--tls-key", "--tls-client-ca", "--insecure"] {
        assert!(stderr.contains(flag), "the refusal names {flag}: {stderr}");
    }
    // The extender's plain-HTTP port likewise.
    let refused = Command::new(CONTROLLER)
        .args(["run", "--listen", "127.0.0.1:0", "--extender-listen"])
        .arg(format!("0.0.0.0:{}", free_port()))
        .arg("--state-dir")
        .arg(dir.path())
        .output()
        .expect("runs");
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--extender-listen"),
        "{refused:?}"
    );
}

#[test]
fn insecure_serves_plain_text_beyond_loopback_and_warns() {
    let dir = gpuwarden_test_support::scratch("secure");
    let port = free_port();
    let mut child = Command::new(CONTROLLER)
        .args(["run", "--insecure", "--listen", &format!("0.0.0.0:{port}")])
        .arg("--state-dir")
        .arg(dir.path())
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    // The log, as it comes (the subscriber writes to stdout or stderr).
    let log = Arc::new(std::sync::Mutex::new(String::new()));
    let readers: Vec<_> = [
        child
            .stdout
            .take()
            .map(|o| Box::new(o) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|e| Box::new(e) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|mut pipe| {
        let log = Arc::clone(&log);
        std::thread::spawn(move || {
            let mut buf = [0_u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                log.lock()
                    .expect("lock")
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    })
    .collect();
    let warned =
        |log: &str| log.contains("--insecure") && log.contains("gpuwarden.controller.insecure");
    let started = Instant::now();
    loop {
        let serving = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        if serving && warned(&log.lock().expect("lock")) {
            break;
        }
        if child.try_wait().expect("waits").is_some() || started.elapsed() > Duration::from_mins(1)
        {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "not serving with the warning (serving: {serving}): {}",
                log.lock().expect("lock")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    for reader in readers {
        let _ = reader.join();
    }
}

#[tokio::test]
async fn the_library_refuses_plain_text_beyond_loopback_too_and_flags_insecure() {
    let dir = gpuwarden_test_support::scratch("secure");
    let controller = server::open(
        &server::sled_in(dir.path()),
        gpuwarden_controller::scheduler::SchedulerConfig::default(),
        gpuwarden_controller::api::Timing::default(),
    )
    .await
    .expect("opens");
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0")
        .await
        .expect("binds");
    let refused = Box::pin(
        server::GrpcServer::new(Arc::clone(&controller), listener)
            .security(Transport::PlainText)
            .serve(std::future::ready(())),
    )
    .await;
    assert!(
        matches!(refused, Err(ServeError::PlainTextExposed { .. })),
        "{refused:?}"
    );
    let bounds =
        gpuwarden_controller::limits::Bounds::new(gpuwarden_controller::limits::Limits::default());
    assert!(!bounds.serving_insecure());
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0")
        .await
        .expect("binds");
    let port = listener.local_addr().expect("bound").port();
    tokio::spawn(
        server::GrpcServer::new(controller, listener)
            .security(Transport::Insecure)
            .bounds(Arc::clone(&bounds))
            .serve(std::future::pending()),
    );
    let channel = connect(&format!("http://127.0.0.1:{port}"), &ClientTls::default()).await;
    SchedulerServiceClient::new(channel)
        .list_nodes(pb::ListNodesRequest::default())
        .await
        .expect("served with --insecure");
    // What the gpuwarden.controller.insecure gauge reports.
    assert!(bounds.serving_insecure());
}

// ---- §2: certs mint never replaces the CA ------------------------------------------------------

#[test]
fn certs_mint_refuses_a_node_named_ca_and_keeps_the_ca_key() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let out = dir.path().to_str().expect("utf-8");
    let mint = |nodes: &str| {
        Command::new(CONTROLLER)
            .args(["certs", "mint", "--out", out, "--nodes", nodes])
            .output()
            .expect("runs")
    };
    assert!(mint("node-1").status.success());
    let key = std::fs::read(dir.path().join(CA_KEY)).expect("a CA key");
    let cert = std::fs::read(dir.path().join(CA_CERT)).expect("a CA certificate");
    for node in ["ca", "server", "user-alice"] {
        let refused = mint(node);
        assert_eq!(refused.status.code(), Some(2), "node {node:?}: {refused:?}");
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains("reserved"),
            "{refused:?}"
        );
        assert_eq!(
            std::fs::read(dir.path().join(CA_KEY)).expect("still there"),
            key
        );
        assert_eq!(
            std::fs::read(dir.path().join(CA_CERT)).expect("still there"),
            cert
        );
    }
}

// ---- §2: roles from one CA never pass for one another ------------------------------------------

/// A TLS controller whose CA also signed hand-made certificates.
struct Pki {
    dir: tempfile::TempDir,
    url: String,
}

impl Pki {
    async fn start() -> Self {
        let dir = gpuwarden_test_support::scratch("roles");
        let certs = dir.path().join("certs");
        mint::mint_into(
            &certs,
            &["node-1".to_owned()],
            &["localhost".to_owned(), "127.0.0.1".to_owned()],
            1,
        )
        .expect("minted");
        mint::mint_clients_into(&certs, &[("alice".to_owned(), ClientRole::User)], 1)
            .expect("minted");
        let tls = ReloadingConfig::load(ServerTlsFiles::minted(&certs)).expect("loads");
        let addr = gpuwarden_test_support::controller::serve_in_process(
            &dir.path().join("state"),
            Transport::Tls(Arc::new(tls)),
            Bounds::new(Limits::default()),
        )
        .await;
        Self {
            dir,
            url: format!("https://{addr}"),
        }
    }

    fn certs(&self) -> std::path::PathBuf {
        self.dir.path().join("certs")
    }

    /// Signs, with the same CA, a client certificate carrying `uris` and `eku`, written as
    /// `<name>.pem`/`<name>.key`.
    fn sign(&self, name: &str, uris: &[&str], eku: rcgen::ExtendedKeyUsagePurpose) -> ClientTls {
        let ca_key = rcgen::KeyPair::from_pem(
            &std::fs::read_to_string(self.certs().join(CA_KEY)).expect("ok"),
        )
        .expect("ok");
        // The CA's name as `certs mint` gives it, so the chain builds.
        let mut ca = rcgen::CertificateParams::default();
        ca.distinguished_name = rcgen::DistinguishedName::new();
        ca.distinguished_name
            .push(rcgen::DnType::OrganizationName, "gpuwarden");
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "gpuwarden CA");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let mut params = rcgen::CertificateParams::default();
        params.subject_alt_names = uris
            .iter()
            .map(|u| rcgen::SanType::URI((*u).try_into().expect("ok")))
            .collect();
        params.extended_key_usages = vec![eku];
        let key = rcgen::KeyPair::generate().expect("ok");
        let cert = params.signed_by(&key, &issuer).expect("ok");
        std::fs::write(self.certs().join(format!("{name}.pem")), cert.pem()).expect("ok");
        std::fs::write(
            self.certs().join(format!("{name}.key")),
            key.serialize_pem(),
        )
        .expect("ok");
        self.identity(name)
    }

    fn identity(&self, name: &str) -> ClientTls {
        ClientTls {
            ca: Some(self.certs().join(CA_CERT)),
            cert: Some(self.certs().join(format!("{name}.pem"))),
            key: Some(self.certs().join(format!("{name}.key"))),
        }
    }

    async fn agent(&self, tls: &ClientTls) -> AgentServiceClient<Channel> {
        AgentServiceClient::new(connect(&self.url, tls).await)
    }

    async fn client(&self, tls: &ClientTls) -> SchedulerServiceClient<Channel> {
        SchedulerServiceClient::new(connect(&self.url, tls).await)
    }
}

async fn connect(url: &str, tls: &ClientTls) -> Channel {
    tls.apply(
        tonic::transport::Endpoint::from_shared(url.to_owned())
            .expect("a URL")
            .connect_timeout(Duration::from_secs(10)),
    )
    .expect("TLS settings")
    .connect()
    .await
    .expect("connects")
}

fn node_info(node: &str) -> pb::NodeInfo {
    gpuwarden_test_support::node::bare(node)
}

#[tokio::test]
async fn a_certificate_naming_a_node_and_a_user_passes_for_neither() {
    let pki = Pki::start().await;
    let both = pki.sign(
        "both",
        &[
            "spiffe://gpuwarden/node/node-1",
            "spiffe://gpuwarden/user/alice",
        ],
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    );
    let status = pki
        .agent(&both)
        .await
        .register(node_info("node-1"))
        .await
        .expect_err("not a node");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(
        status
            .message()
            .contains("node certificate names its node only"),
        "{status:?}"
    );
    let status = pki
        .client(&both)
        .await
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect_err("not a client");
    assert!(
        matches!(
            status.code(),
            Code::Unauthenticated | Code::PermissionDenied
        ),
        "{status:?}"
    );
}

#[tokio::test]
async fn node_and_user_certificates_stay_on_their_own_service() {
    let pki = Pki::start().await;
    // A node's certificate is no client.
    let status = pki
        .client(&pki.identity("node-1"))
        .await
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect_err("a node is no client");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    // A user's certificate is no node.
    let status = pki
        .agent(&pki.identity("user-alice"))
        .await
        .register(node_info("alice"))
        .await
        .expect_err("a user is no node");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    // Each on its own service is fine.
    pki.agent(&pki.identity("node-1"))
        .await
        .register(node_info("node-1"))
        .await
        .expect("the node registers");
    pki.client(&pki.identity("user-alice"))
        .await
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("the user lists");
}

#[tokio::test]
async fn a_certificate_for_serving_is_refused_as_a_client_certificate() {
    let pki = Pki::start().await;
    // The node's name, but the EKU of a serving certificate: refused at the handshake.
    let server_eku = pki.sign(
        "server-eku",
        &["spiffe://gpuwarden/node/node-1"],
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
    );
    let channel = server_eku
        .apply(tonic::transport::Endpoint::from_shared(pki.url.clone()).expect("a URL"))
        .expect("TLS settings")
        .connect()
        .await;
    let refused = match channel {
        Err(_) => true,
        Ok(channel) => AgentServiceClient::new(channel)
            .register(node_info("node-1"))
            .await
            .is_err(),
    };
    assert!(refused, "a serverAuth-only certificate acted as node-1");
}

#[tokio::test]
async fn an_unauthenticated_caller_is_refused_before_its_message_is_read() {
    let pki = Pki::start().await;
    let ca_only = ClientTls {
        ca: Some(pki.certs().join(CA_CERT)),
        ..ClientTls::default()
    };
    // Larger than the controller decodes (4 MiB): read first, it would be refused for its size.
    let big = pb::CreateSessionRequest {
        name: "x".repeat(6 * MIB),
        ..Default::default()
    };
    let status = pki
        .client(&ca_only)
        .await
        .max_encoding_message_size(64 * MIB)
        .create_session(big)
        .await
        .expect_err("no credentials");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let status = pki
        .agent(&ca_only)
        .await
        .max_encoding_message_size(64 * MIB)
        .register(pb::NodeInfo {
            hostname: "x".repeat(6 * MIB),
            ..node_info("node-1")
        })
        .await
        .expect_err("no certificate");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
}

// ---- §3: the webhook's HTTPS listener ----------------------------------------------------------

/// `gpuwarden-controller run` serving the webhook on loopback; killed when dropped.
struct Webhook {
    child: Child,
    addr: SocketAddr,
    ca: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Webhook {
    fn start() -> Self {
        Self::start_with(&[])
    }

    /// Also requiring client certificates from the minted CA (`--webhook-client-ca`); the
    /// directory holds `admin-apiserver.pem`/`.key`, a client certificate from it.
    fn requiring_client_certificates() -> Self {
        Self::start_with(&["--webhook-client-ca"])
    }

    fn start_with(client_ca_flag: &[&str]) -> Self {
        let dir = gpuwarden_test_support::scratch("webhook");
        let certs = dir.path().join("certs");
        mint::mint_into(&certs, &[], &["localhost".to_owned()], 1).expect("minted");
        mint::mint_clients_into(&certs, &[("apiserver".to_owned(), ClientRole::Admin)], 1)
            .expect("minted");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port())
            .parse()
            .expect("an address");
        let child = Command::new(CONTROLLER)
            .args(["run", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(dir.path().join("state"))
            .arg("--webhook-listen")
            .arg(addr.to_string())
            .arg("--webhook-cert")
            .arg(certs.join(mint::SERVER_CERT))
            .arg("--webhook-key")
            .arg(certs.join(mint::SERVER_KEY))
            // Never called: no review in these tests gets that far.
            .args(["--kube-api", "https://127.0.0.1:9", "--kube-ca"])
            .arg(certs.join(CA_CERT))
            .args(client_ca_flag)
            .args(client_ca_flag.iter().map(|_| certs.join(CA_CERT)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts");
        let started = Instant::now();
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(started.elapsed() < Duration::from_secs(30), "not listening");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            addr,
            ca: certs.join(CA_CERT),
            _dir: dir,
        }
    }

    /// The child's peak resident memory (`VmHWM`), in KiB.
    fn peak_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("its status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("a VmHWM line")
    }

    async fn tls(&self) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        tls_to(self.addr, &self.ca).await.expect("a TLS connection")
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn tls_to(
    addr: SocketAddr,
    ca: &Path,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    tls_as(addr, ca, None).await
}

/// A TLS connection trusting `ca`, presenting `identity` (certificate and key files) if given.
async fn tls_as(
    addr: SocketAddr,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in gpuwarden_runtime::tls::read_certs(ca, "CA").expect("reads") {
        roots.add(cert).expect("adds");
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                gpuwarden_runtime::tls::read_certs(cert, "client certificate").expect("reads"),
                gpuwarden_runtime::tls::read_key(key).expect("reads"),
            )
            .expect("a client identity"),
    };
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            rustls_pki_types::ServerName::try_from("localhost").expect("a name"),
            tcp,
        )
        .await
}

/// Sends a 16 MiB body to `/mutate` (declared, or chunked without a length) as fast as the
/// server takes it, then reads whatever answer comes. Whether it connected (TLS and all): the
/// server may cut the body short, but a sender that never got through tested nothing.
async fn send_16_mib(webhook_addr: SocketAddr, ca: std::path::PathBuf, chunked: bool) -> bool {
    let Ok(mut tls) = tls_to(webhook_addr, &ca).await else {
        return false;
    };
    let head = if chunked {
        "POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n".to_owned()
    } else {
        format!(
            "POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            16 * MIB
        )
    };
    if tls.write_all(head.as_bytes()).await.is_err() {
        return true;
    }
    let block = vec![b' '; MIB];
    for _ in 0..16 {
        let sent = if chunked {
            let mut framed = format!("{:x}\r\n", block.len()).into_bytes();
            framed.extend_from_slice(&block);
            framed.extend_from_slice(b"\r\n");
            tls.write_all(&framed).await
        } else {
            tls.write_all(&block).await
        };
        if sent.is_err() {
            return true;
        }
    }
    if chunked {
        let _ = tls.write_all(b"0\r\n\r\n").await;
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_mins(1), tls.read_to_end(&mut answer)).await;
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_16_mib_bodies_leave_the_controllers_memory_bounded() {
    const PARALLEL: usize = 32;
    let webhook = Webhook::start();
    // Warm: one small request, so the baseline includes the TLS and HTTP machinery.
    {
        let mut tls = webhook.tls().await;
        tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
            .await
            .expect("sends");
        let mut answer = Vec::new();
        tls.read_to_end(&mut answer).await.expect("an answer");
        assert!(
            answer.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&answer)
        );
    }
    let before = webhook.peak_kib();
    let senders: Vec<_> = (0..PARALLEL)
        .map(|i| tokio::spawn(send_16_mib(webhook.addr, webhook.ca.clone(), i % 2 == 1)))
        .collect();
    let mut connected = 0;
    for sender in senders {
        connected += usize::from(sender.await.expect("the sender ran"));
    }
    // Far below the connection cap: every sender gets through, or the bound was never tested.
    assert_eq!(
        connected, PARALLEL,
        "only {connected} of {PARALLEL} senders connected to the webhook"
    );
    let after = webhook.peak_kib();
    let grew_mib = (after.saturating_sub(before)) / 1024;
    eprintln!(
        "webhook VmHWM: {} MiB before, {} MiB after {PARALLEL} parallel 16 MiB bodies (+{grew_mib} MiB)",
        before / 1024,
        after / 1024
    );
    // The bodies total 512 MiB; buffering them would show. The budget (24 MiB of bodies) and
    // TLS/HTTP buffers per connection stay far below this.
    assert!(
        grew_mib < 128,
        "the controller's peak memory grew by {grew_mib} MiB under {PARALLEL} parallel 16 MiB bodies"
    );
    // And it still answers.
    let mut tls = webhook.tls().await;
    tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await
        .expect("sends");
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer).await.expect("an answer");
    assert!(answer.starts_with(b"HTTP/1.1 200"));
}

#[tokio::test]
async fn a_slow_sender_is_answered_and_dropped() {
    let webhook = Webhook::start();
    let mut tls = webhook.tls().await;
    tls.write_all(
        b"POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"apiVersion\"",
    )
    .await
    .expect("sends the start");
    // Then nothing: the server must answer and close on its own (generous deadline).
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_mins(2), tls.read_to_end(&mut answer)).await;
    assert!(
        read.is_ok(),
        "the slow sender was still connected after 120 s"
    );
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 408") || answer.starts_with("HTTP/1.1 503"),
        "{answer}"
    );
}

#[tokio::test]
async fn connections_past_the_cap_are_closed() {
    use gpuwarden_controller::kubernetes::serve::MAX_CONNECTIONS;
    let webhook = Webhook::start();
    // Silent peers holding every slot (each would be dropped at the 10 s handshake timeout).
    let mut held = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        held.push(
            tokio::net::TcpStream::connect(webhook.addr)
                .await
                .expect("connects"),
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let refused = tls_to(webhook.addr, &webhook.ca).await;
    assert!(
        refused.is_err(),
        "a connection past the cap of {MAX_CONNECTIONS} got a TLS session"
    );
    drop(held);
    // Slots come back as connections close.
    let started = Instant::now();
    loop {
        if tls_to(webhook.addr, &webhook.ca).await.is_ok() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_mins(1),
            "no slot came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// GET /healthz over `tls`; the status line, or the error that ended the exchange.
async fn healthz(
    tls: std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
) -> Result<String, std::io::Error> {
    let mut tls = tls?;
    tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await?;
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer).await?;
    Ok(String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned())
}

#[tokio::test]
async fn with_a_client_ca_the_webhook_takes_only_certified_clients() {
    let webhook = Webhook::requiring_client_certificates();
    let certs = webhook.ca.parent().expect("the certs directory").to_owned();
    let anonymous = healthz(tls_to(webhook.addr, &webhook.ca).await).await;
    assert!(
        !anonymous.as_deref().is_ok_and(|l| l.contains("200")),
        "a client without a certificate was answered: {anonymous:?}"
    );
    let certified = healthz(
        tls_as(
            webhook.addr,
            &webhook.ca,
            Some((
                &certs.join("admin-apiserver.pem"),
                &certs.join("admin-apiserver.key"),
            )),
        )
        .await,
    )
    .await
    .expect("a certified client is answered");
    assert!(certified.starts_with("HTTP/1.1 200"), "{certified}");
    // Without the flag, the same anonymous client is answered (the test's control).
    let open = Webhook::start();
    let anonymous = healthz(tls_to(open.addr, &open.ca).await)
        .await
        .expect("answered");
    assert!(anonymous.starts_with("HTTP/1.1 200"), "{anonymous}");
}
