//! Mutual TLS between agents and the controller over real gRPC on loopback: real tonic, real
//! rustls, certificates minted in the test. An agent speaks only for the node its certificate
//! names; clients of the scheduler service need the CA and an identity of their own (here an
//! admin's certificate; see `clients.rs` for the rest); the serving certificate is rotated
//! without a restart.

use std::{path::Path, process::Command, sync::Arc, time::Duration};

use gpuwarden_controller::{
    auth::{
        clients::ClientRole,
        denials::DenialReason,
        mint::{self, Ca},
        tls::{ReloadingConfig, ServerTlsFiles},
    },
    limits::{Bounds, Limits},
    server::{self, Transport},
};
use gpuwarden_proto::v1::{
    self as pb, agent_service_client::AgentServiceClient,
    scheduler_service_client::SchedulerServiceClient,
};
use gpuwarden_runtime::tls::ClientTls;
use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject as _};
use tonic::{Code, transport::Channel};

/// A controller serving TLS with certificates from `mint_into` in a scratch directory.
struct TlsController {
    dir: tempfile::TempDir,
    url: String,
    /// Its bounds, which count whom it refused.
    bounds: Arc<Bounds>,
}

impl TlsController {
    async fn start(nodes: &[&str]) -> Self {
        let dir = gpuwarden_test_support::scratch("tls");
        let nodes: Vec<String> = nodes.iter().map(|n| (*n).to_owned()).collect();
        mint::mint_into(
            &dir.path().join("certs"),
            &nodes,
            &["localhost".to_owned(), "127.0.0.1".to_owned()],
            1,
        )
        .expect("minted");
        mint::mint_clients_into(
            &dir.path().join("certs"),
            &[("ops".to_owned(), ClientRole::Admin)],
            1,
        )
        .expect("minted the admin");
        let certs = dir.path().join("certs");
        let tls = ReloadingConfig::load(ServerTlsFiles::minted(&certs)).expect("TLS files load");
        let bounds = Bounds::new(Limits::default());
        let addr = gpuwarden_test_support::controller::serve_in_process(
            &dir.path().join("state"),
            Transport::Tls(Arc::new(tls)),
            Arc::clone(&bounds),
        )
        .await;
        let url = format!("https://{addr}");
        Self { dir, url, bounds }
    }

    fn certs(&self) -> std::path::PathBuf {
        self.dir.path().join("certs")
    }

    /// TLS as the agent of `node` sets it up: the CA, and that node's certificate.
    fn as_node(&self, node: &str) -> ClientTls {
        ClientTls {
            ca: Some(self.certs().join(mint::CA_CERT)),
            cert: Some(self.certs().join(format!("{node}.pem"))),
            key: Some(self.certs().join(format!("{node}.key"))),
        }
    }

    /// TLS as an admin of the scheduler service: the CA and the admin's certificate.
    fn as_admin(&self) -> ClientTls {
        ClientTls {
            ca: Some(self.certs().join(mint::CA_CERT)),
            cert: Some(self.certs().join("admin-ops.pem")),
            key: Some(self.certs().join("admin-ops.key")),
        }
    }

    /// TLS with the CA only (no identity).
    fn ca_only(&self) -> ClientTls {
        ClientTls {
            ca: Some(self.certs().join(mint::CA_CERT)),
            ..ClientTls::default()
        }
    }

    async fn channel(&self, tls: &ClientTls) -> Result<Channel, tonic::transport::Error> {
        tls.apply(
            tonic::transport::Endpoint::from_shared(self.url.clone())
                .expect("a URL")
                .connect_timeout(Duration::from_secs(5)),
        )
        .expect("TLS settings")
        .connect()
        .await
    }

    async fn agent(&self, tls: &ClientTls) -> AgentServiceClient<Channel> {
        AgentServiceClient::new(self.channel(tls).await.expect("connects"))
    }
}

fn node_info(node: &str) -> pb::NodeInfo {
    gpuwarden_test_support::node::bare(node)
}

fn heartbeat(node: &str) -> pb::AgentMessage {
    pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Heartbeat(pb::Heartbeat {
            node_id: node.to_owned(),
            seq: 0,
            running_sessions: vec![],
        })),
    }
}

/// Waits (bounded) until the counter of `bounds` for `reason` passes `before`; the server
/// counts in its own task, after the client has seen the refusal.
async fn counted_past(bounds: &Bounds, reason: DenialReason, before: u64) -> bool {
    for _ in 0..50 {
        if bounds.denials().count_of(reason) > before {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

#[tokio::test]
async fn a_node_with_its_certificate_registers_and_heartbeats() {
    let controller = TlsController::start(&["node-1"]).await;
    let mut agent = controller.agent(&controller.as_node("node-1")).await;
    let registered = agent
        .register(node_info("node-1"))
        .await
        .expect("node-1 may register as node-1")
        .into_inner();
    assert_eq!(registered.node_id, "node-1");

    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(heartbeat("node-1")).await.expect("queued");
    let _stream = agent
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("node-1 may hold node-1's stream");

    // The controller saw the heartbeat: the node is listed, ready, to an admin.
    let mut client = SchedulerServiceClient::new(
        controller
            .channel(&controller.as_admin())
            .await
            .expect("connects"),
    );
    let nodes = client
        .list_nodes(pb::ListNodesRequest::default())
        .await
        .expect("lists")
        .into_inner()
        .nodes;
    let node = nodes
        .iter()
        .find(|n| n.info.as_ref().is_some_and(|i| i.node_id == "node-1"))
        .expect("node-1 is listed");
    assert!(node.last_heartbeat_ms > 0, "{node:?}");
}

#[tokio::test]
async fn an_agent_without_a_client_certificate_is_unauthenticated() {
    let controller = TlsController::start(&["node-1"]).await;
    let mut agent = controller.agent(&controller.ca_only()).await;
    let status = agent
        .register(node_info("node-1"))
        .await
        .expect_err("no certificate, no registration");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(
        status.message().contains("no client certificate"),
        "{}",
        status.message()
    );
    let status = agent
        .connect(tokio_stream::iter([heartbeat("node-1")]))
        .await
        .expect_err("no certificate, no stream");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    // Both refused at the gate, each counted once by this server.
    let denials = controller.bounds.denials();
    assert_eq!(denials.count_of(DenialReason::NoClientCertificate), 2);
}

/// A TLS setup presenting a certificate that names node-1 the right way, signed by a CA of
/// the attacker's own (written under `dir`), trusting the controller's CA in `certs`.
fn rogue_node(dir: &Path, certs: &Path) -> ClientTls {
    let rogue_dir = dir.join("rogue");
    std::fs::create_dir_all(&rogue_dir).expect("made");
    let rogue = Ca::new(1).expect("a CA").node("node-1", 1).expect("minted");
    std::fs::write(rogue_dir.join("node-1.pem"), &rogue.cert_pem).expect("written");
    std::fs::write(rogue_dir.join("node-1.key"), &rogue.key_pem).expect("written");
    ClientTls {
        ca: Some(certs.join(mint::CA_CERT)),
        cert: Some(rogue_dir.join("node-1.pem")),
        key: Some(rogue_dir.join("node-1.key")),
    }
}

/// Tries to register at `url` over `tls`, which must fail; what the client saw. TLS 1.3 lets
/// the client finish before the server checks its certificate, so the refusal shows either
/// when connecting or on the first call.
async fn refused_registration(url: &str, tls: &ClientTls) -> String {
    let endpoint = tls
        .apply(
            tonic::transport::Endpoint::from_shared(url.to_owned())
                .expect("a URL")
                .connect_timeout(Duration::from_secs(5)),
        )
        .expect("TLS settings");
    match endpoint.connect().await {
        Err(e) => format!("{e:?}"),
        Ok(channel) => {
            let status = AgentServiceClient::new(channel)
                .register(node_info("node-1"))
                .await
                .expect_err("a rogue CA's certificate must not register");
            assert_ne!(status.code(), Code::Ok);
            format!("{status:?}")
        }
    }
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused_in_the_handshake() {
    let controller = TlsController::start(&["node-1"]).await;
    let tls = rogue_node(controller.dir.path(), &controller.certs());
    let refused = refused_registration(&controller.url, &tls).await;
    assert!(
        counted_past(&controller.bounds, DenialReason::BadClientCertificate, 0).await,
        "the controller did not count the refused handshake ({refused})"
    );
}

/// `GET /metrics` on `addr`: the whole answer, or `None` while nothing answers.
async fn scrape(addr: std::net::SocketAddr) -> Option<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_string(&mut answer))
        .await
        .ok()?
        .ok()?;
    Some(answer)
}

/// The value of the sample of `gpuwarden.auth.denied` for `reason` in Prometheus' text.
fn exported_denials(text: &str, reason: DenialReason) -> Option<f64> {
    let label = format!("gpuwarden_auth_reason=\"{}\"", reason.as_str());
    text.lines()
        .filter(|l| l.starts_with("gpuwarden_auth_denied_total{") && l.contains(&label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

/// End to end through the controller's own lifecycle (`App::build`, `App::spawn`): a handshake
/// refused for its certificate is counted by the server that refused it and exported, at that
/// count, as `gpuwarden.auth.denied` on its Prometheus endpoint; no other reason is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_handshake_is_exported_as_auth_denied() {
    let dir = gpuwarden_test_support::scratch("tls-metrics");
    let certs = dir.path().join("certs");
    mint::mint_into(&certs, &["node-1".to_owned()], &["127.0.0.1".to_owned()], 1).expect("minted");
    let tls = ReloadingConfig::load(ServerTlsFiles::minted(&certs)).expect("TLS files load");
    let prometheus = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let mut config = server::RunConfig::new(
        "127.0.0.1:0".parse().expect("an address"),
        server::sled_in(&dir.path().join("state")),
    );
    config.security = Transport::Tls(Arc::new(tls)).into();
    config.exporters = gpuwarden_runtime::otlp::Exporters {
        prometheus: Some(prometheus),
        ..Default::default()
    };
    let app = server::App::build(config).await.expect("builds");
    let bounds = Arc::clone(app.bounds());
    let url = format!("https://{}", app.addr());
    let running = app.spawn();

    let refused = refused_registration(&url, &rogue_node(dir.path(), &certs)).await;
    assert!(
        counted_past(&bounds, DenialReason::BadClientCertificate, 0).await,
        "the controller did not count the refused handshake ({refused})"
    );
    let counted = bounds
        .denials()
        .count_of(DenialReason::BadClientCertificate);
    let started = std::time::Instant::now();
    let text = loop {
        let text = scrape(prometheus).await.unwrap_or_default();
        if exported_denials(&text, DenialReason::BadClientCertificate).is_some() {
            break text;
        }
        assert!(
            started.elapsed() < gpuwarden_test_support::wait::PATIENCE,
            "no gpuwarden.auth.denied sample on {prometheus}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    #[expect(clippy::cast_precision_loss, reason = "a handful of refusals")]
    let counted = counted as f64;
    assert_eq!(
        exported_denials(&text, DenialReason::BadClientCertificate),
        Some(counted),
        "{text}"
    );
    for other in DenialReason::ALL {
        if other != DenialReason::BadClientCertificate {
            assert_eq!(
                exported_denials(&text, other),
                Some(0.0),
                "{other:?}: {text}"
            );
        }
    }
    running.shutdown().await.expect("shuts down");
}

#[tokio::test]
async fn a_node_speaking_for_another_is_permission_denied_naming_both() {
    let controller = TlsController::start(&["node-1", "node-2"]).await;
    let mut agent = controller.agent(&controller.as_node("node-1")).await;
    let status = agent
        .register(node_info("node-2"))
        .await
        .expect_err("node-1 must not register as node-2");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    for id in ["\"node-1\"", "\"node-2\""] {
        assert!(status.message().contains(id), "{}", status.message());
    }

    // node-2 registers for itself; node-1 still can't hold node-2's stream.
    let mut node2 = controller.agent(&controller.as_node("node-2")).await;
    node2
        .register(node_info("node-2"))
        .await
        .expect("node-2 registers itself");
    let status = agent
        .connect(tokio_stream::iter([heartbeat("node-2")]))
        .await
        .expect_err("node-1 must not heartbeat for node-2");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    // Each refused by its handler, counted once by this server.
    let denials = controller.bounds.denials();
    assert_eq!(denials.count_of(DenialReason::NodeMismatch), 2);
}

/// The certificate the controller serves to a new connection.
async fn served_certificate(url: &str, ca: &Path) -> CertificateDer<'static> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("CA file") {
        roots.add(cert.expect("a CA certificate")).expect("added");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let addr = url.trim_start_matches("https://");
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").expect("a name"), tcp)
        .await
        .expect("handshake");
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .expect("a served certificate")
        .clone()
        .into_owned()
}

#[tokio::test]
async fn a_rotated_serving_certificate_is_served_without_a_restart() {
    let controller = TlsController::start(&["node-1"]).await;
    let certs = controller.certs();
    let ca = certs.join(mint::CA_CERT);
    let first = served_certificate(&controller.url, &ca).await;
    assert_eq!(
        first,
        CertificateDer::from_pem_file(certs.join(mint::SERVER_CERT)).expect("read")
    );
    // An agent connected before the rotation.
    let mut before = controller.agent(&controller.as_node("node-1")).await;

    // Rotate: a new serving certificate and key from the same CA, written atomically.
    let minted = mint::mint_into(
        &certs,
        &[],
        &["localhost".to_owned(), "127.0.0.1".to_owned()],
        1,
    )
    .expect("minted again");
    assert!(minted.reused_ca);
    let rotated = CertificateDer::from_pem_file(certs.join(mint::SERVER_CERT)).expect("read");
    assert_ne!(first, rotated, "minting made the same certificate");

    let second = served_certificate(&controller.url, &ca).await;
    assert_eq!(
        second, rotated,
        "a new connection still sees the old certificate"
    );

    // Agents on new connections and on the old one both still work.
    let mut after = controller.agent(&controller.as_node("node-1")).await;
    after
        .register(node_info("node-1"))
        .await
        .expect("registers after the rotation");
    before
        .register(node_info("node-1"))
        .await
        .expect("the connection from before the rotation still works");
}

#[tokio::test]
async fn a_broken_rotation_keeps_the_last_good_certificate() {
    let controller = TlsController::start(&[]).await;
    let certs = controller.certs();
    let ca = certs.join(mint::CA_CERT);
    let first = served_certificate(&controller.url, &ca).await;
    // A key that does not match the certificate (half a rotation).
    let stray = Ca::new(1)
        .expect("a CA")
        .server(&["localhost".to_owned()], 1)
        .expect("minted");
    // Written to a new file renamed over the key, so the change is seen for certain (a new
    // inode): rewritten in place, the same length within the same clock tick could leave the
    // file's stamp unchanged, and the test would pass without a reload being tried.
    let staged = certs.join("stray.key");
    std::fs::write(&staged, stray.key_pem).expect("written");
    std::fs::rename(&staged, certs.join(mint::SERVER_KEY)).expect("renamed");
    assert_eq!(served_certificate(&controller.url, &ca).await, first);
}

#[tokio::test]
async fn a_scheduler_client_needs_the_ca_and_an_identity() {
    let controller = TlsController::start(&[]).await;
    let mut client = SchedulerServiceClient::new(
        controller
            .channel(&controller.ca_only())
            .await
            .expect("connects with the CA alone"),
    );
    let status = client
        .list_slot_types(pb::ListSlotTypesRequest::default())
        .await
        .expect_err("the CA alone proves no identity");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let mut client = SchedulerServiceClient::new(
        controller
            .channel(&controller.as_admin())
            .await
            .expect("connects as the admin"),
    );
    client
        .list_slot_types(pb::ListSlotTypesRequest::default())
        .await
        .expect("answers the admin");

    // Without the CA the controller's certificate is not trusted.
    let untrusted = ClientTls {
        ca: Some(controller.dir.path().join("other-ca.pem")),
        ..ClientTls::default()
    };
    std::fs::write(
        controller.dir.path().join("other-ca.pem"),
        Ca::new(1).expect("a CA").cert_pem(),
    )
    .expect("written");
    let result = match controller.channel(&untrusted).await {
        Err(e) => Err(format!("{e:?}")),
        Ok(channel) => SchedulerServiceClient::new(channel)
            .list_slot_types(pb::ListSlotTypesRequest::default())
            .await
            .map(|_| ())
            .map_err(|s| format!("{s:?}")),
    };
    let err = result.expect_err("a controller signed by another CA must not be trusted");
    assert!(err.contains("InvalidCertificate"), "{err}");
}

#[tokio::test]
async fn a_plain_text_client_gets_nothing_from_a_tls_port() {
    let controller = TlsController::start(&[]).await;
    // The port answers over TLS: the failure below is its refusing plain text, not a port
    // nobody listens on.
    served_certificate(&controller.url, &controller.certs().join(mint::CA_CERT)).await;
    let url = controller.url.replace("https://", "http://");
    let result = async {
        let channel = tonic::transport::Endpoint::from_shared(url)
            .expect("a URL")
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(2))
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        SchedulerServiceClient::new(channel)
            .list_slot_types(pb::ListSlotTypesRequest::default())
            .await
            .map_err(|s| s.to_string())
    }
    .await;
    assert!(result.is_err(), "plain text was answered on the TLS port");
}

#[test]
fn the_binary_mints_certificates_and_refuses_half_the_tls_flags() {
    let scratch = gpuwarden_test_support::scratch("mint");
    let out = scratch.path().join("certs");
    let run = Command::new(env!("CARGO_BIN_EXE_gpuwarden-controller"))
        .args([
            "certs",
            "mint",
            "--nodes",
            "node-1,node-2",
            "--users",
            "alice",
            "--admins",
            "ops",
            "--out",
        ])
        .arg(&out)
        .output()
        .expect("runs");
    assert!(run.status.success(), "{run:?}");
    for file in [
        "ca.pem",
        "ca.key",
        "server.pem",
        "server.key",
        "node-1.pem",
        "node-1.key",
        "node-2.pem",
        "node-2.key",
        "user-alice.pem",
        "user-alice.key",
        "admin-ops.pem",
        "admin-ops.key",
    ] {
        assert!(out.join(file).is_file(), "{file} missing: {run:?}");
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_gpuwarden-controller"))
        .args(["certs", "mint", "--nodes", "../etc", "--out"])
        .arg(&out)
        .output()
        .expect("runs");
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("\"../etc\""),
        "{bad:?}"
    );

    let half = Command::new(env!("CARGO_BIN_EXE_gpuwarden-controller"))
        .args(["run", "--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(out.join("server.pem"))
        .arg("--state-dir")
        .arg(scratch.path().join("state"))
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&half.stderr);
    assert_eq!(half.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--tls-key") && err.contains("--tls-client-ca"),
        "{err}"
    );

    // The config file's keys count too: with cert and key there, only the CA is missing.
    let config = scratch.path().join("controller.toml");
    std::fs::write(
        &config,
        format!(
            "tls_cert = {:?}\ntls_key = {:?}\n",
            out.join("server.pem"),
            out.join("server.key")
        ),
    )
    .expect("written");
    let from_file = Command::new(env!("CARGO_BIN_EXE_gpuwarden-controller"))
        .args(["run", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(scratch.path().join("state"))
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&from_file.stderr);
    assert_eq!(from_file.status.code(), Some(2), "{err}");
    assert!(
        err.contains("missing: --tls-client-ca") && !err.contains("--tls-key"),
        "{err}"
    );
}
