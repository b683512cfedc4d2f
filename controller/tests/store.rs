//! The controller binary on its stores: sessions acknowledged over gRPC survive `kill -9` on etcd
//! as on sled, a store that can't be reached or named stops it with the reason, and `copy-store`
//! moves a sled store into etcd.

use std::{
    net::{SocketAddr, TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use gpuwarden_proto::v1::{
    self as pb, agent_service_client::AgentServiceClient,
    scheduler_service_client::SchedulerServiceClient,
};
use gpuwarden_test_support::{Etcd, scratch};

const CONTROLLER: &str = env!("CARGO_BIN_EXE_gpuwarden-controller");

/// A controller process, killed (SIGKILL) when dropped.
struct Running(Child, SocketAddr);

impl Running {
    fn start(store: &str, state_dir: &std::path::Path) -> Self {
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let child = Command::new(CONTROLLER)
            .args(["run", "--listen", &addr.to_string(), "--store", store])
            .arg("--state-dir")
            .arg(state_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starts");
        let started = Instant::now();
        while TcpStream::connect(addr).is_err() {
            assert!(started.elapsed() < Duration::from_secs(20), "not listening");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self(child, addr)
    }

    /// Waits until it serves (on etcd it leads only once it has won the election).
    async fn until_serving(&self) {
        let started = Instant::now();
        while self
            .client()
            .await
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .is_err()
        {
            assert!(started.elapsed() < Duration::from_secs(20), "never led");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.1))
            .expect("a URL")
            .connect()
            .await
            .expect("connects")
    }

    /// Registers a node with 64 CPUs, so that sessions asking for `cpu` are valid.
    async fn register_node(&self) {
        self.until_serving().await;
        let mut agent = AgentServiceClient::new(self.channel().await);
        agent
            .register(pb::NodeInfo {
                node_id: "n1".into(),
                hostname: "n1".into(),
                slot_types: vec![pb::SlotType {
                    name: "cpu".into(),
                    kind: pb::SlotKind::Count.into(),
                }],
                capacity: Some(pb::ResourceSlot {
                    values: [("cpu".to_owned(), "64".to_owned())].into(),
                }),
                ..Default::default()
            })
            .await
            .expect("registers");
    }

    async fn client(&self) -> SchedulerServiceClient<tonic::transport::Channel> {
        SchedulerServiceClient::new(self.channel().await)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn request(name: &str) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        requested: Some(pb::ResourceSlot {
            values: [("cpu".to_owned(), "1".to_owned())].into(),
        }),
        owner: "alice".into(),
        name: name.into(),
        ..Default::default()
    }
}

async fn names(client: &mut SchedulerServiceClient<tonic::transport::Channel>) -> Vec<String> {
    let mut names: Vec<String> = client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("lists")
        .into_inner()
        .sessions
        .into_iter()
        .map(|s| s.name)
        .collect();
    names.sort();
    names
}

/// Creates sessions concurrently, SIGKILLs the controller, and finds every acknowledged one.
async fn acknowledged_sessions_survive_kill_9(store: &str) {
    let dir = scratch("kill9");
    let controller = Running::start(store, dir.path());
    controller.register_node().await;
    let client = controller.client().await;
    let mut tasks = Vec::new();
    for i in 0..40 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            let name = format!("job-{i:02}");
            client.create_session(request(&name)).await.map(|_| name)
        }));
    }
    let mut acknowledged: Vec<String> = Vec::new();
    for t in tasks {
        acknowledged.push(t.await.expect("joins").expect("created"));
    }
    acknowledged.sort();
    drop(controller);

    let controller = Running::start(store, dir.path());
    controller.until_serving().await;
    assert_eq!(
        names(&mut controller.client().await).await,
        acknowledged,
        "{store}"
    );
}

#[tokio::test]
async fn acknowledged_sessions_survive_kill_9_on_sled() {
    let dir = scratch("sled");
    let store = format!("sled:{}", dir.path().join("store").display());
    acknowledged_sessions_survive_kill_9(&store).await;
}

#[tokio::test]
async fn acknowledged_sessions_survive_kill_9_on_etcd() {
    let etcd = Etcd::start();
    acknowledged_sessions_survive_kill_9(&etcd.store_url("kill9")).await;
}

#[test]
fn an_unreachable_or_malformed_store_stops_the_controller_with_the_reason() {
    let dir = scratch("badstore");
    // Nothing listens on port 1.
    for (store, words) in [
        ("etcd://127.0.0.1:1", "127.0.0.1:1"),
        ("etcd://nowhere", "\"nowhere\" is not HOST:PORT"),
        ("postgres://db", "unknown scheme"),
    ] {
        let out = Command::new(CONTROLLER)
            .args(["run", "--listen", "127.0.0.1:0", "--store", store])
            .arg("--state-dir")
            .arg(dir.path())
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{store}: {err}");
        assert!(err.contains(words), "{store}: {err}");
    }
}

#[tokio::test]
async fn copy_store_moves_a_sled_store_into_etcd() {
    let dir = scratch("copy");
    let sled = format!("sled:{}", dir.path().join("store").display());
    {
        let controller = Running::start(&sled, dir.path());
        controller.register_node().await;
        let mut client = controller.client().await;
        for name in ["a", "b"] {
            client.create_session(request(name)).await.expect("created");
        }
    }
    let etcd = Etcd::start();
    let target = etcd.store_url("copied");
    let out = Command::new(CONTROLLER)
        .args(["copy-store", "--from", &sled, "--to", &target])
        .output()
        .expect("runs");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("copied"), "{said}");
    let controller = Running::start(&target, dir.path());
    controller.until_serving().await;
    assert_eq!(names(&mut controller.client().await).await, ["a", "b"]);
}

/// etcd with TLS and client certificates (`--client-cert-auth`), certificates minted by
/// `certs mint`: the store speaks TLS with the controller's etcd files and is refused without.
#[tokio::test]
async fn an_etcd_store_over_tls_needs_the_ca_and_a_client_certificate() {
    use gpuwarden_controller::{auth::mint, store::Store, store::StoreSpec};
    use gpuwarden_runtime::tls::ClientTls;

    let dir = scratch("etcdtls");
    let certs = dir.path().join("certs");
    mint::mint_into(
        &certs,
        &["controller-1".to_owned()],
        &["127.0.0.1".to_owned()],
        1,
    )
    .expect("minted");
    // etcd's own certificate serves and dials (its gateway connects to its port).
    let ca = mint::Ca::reuse(
        std::fs::read_to_string(certs.join(mint::CA_CERT)).expect("the CA"),
        &std::fs::read_to_string(certs.join(mint::CA_KEY)).expect("the CA key"),
    )
    .expect("reused");
    let peer = ca.peer(&["127.0.0.1".to_owned()], 1).expect("minted");
    std::fs::write(certs.join("etcd.pem"), &peer.cert_pem).expect("written");
    std::fs::write(certs.join("etcd.key"), &peer.key_pem).expect("written");
    let etcd = Etcd::start_tls(gpuwarden_test_support::EtcdTls {
        ca: certs.join(mint::CA_CERT),
        cert: certs.join("etcd.pem"),
        key: certs.join("etcd.key"),
    });
    let with = |tls: ClientTls| -> StoreSpec {
        let mut spec: StoreSpec = etcd.store_url("tls").parse().expect("a store spec");
        if let StoreSpec::Etcd { tls: t, .. } = &mut spec {
            *t = tls;
        }
        spec
    };
    let full = ClientTls {
        ca: Some(certs.join(mint::CA_CERT)),
        cert: Some(certs.join("controller-1.pem")),
        key: Some(certs.join("controller-1.key")),
    };
    let store = Store::open(&with(full.clone()))
        .await
        .expect("opens over TLS");
    assert!(store.load().await.expect("reads").sessions.is_empty());

    // Plain text, or TLS without a client certificate, is refused, with the reason.
    for (tls, what) in [
        (ClientTls::default(), "plain text"),
        (
            ClientTls {
                ca: full.ca.clone(),
                ..ClientTls::default()
            },
            "no client certificate",
        ),
    ] {
        let err = Store::open(&with(tls)).await.expect_err(what);
        assert!(
            err.to_string().contains("cannot open the store at etcd"),
            "{what}: {err}"
        );
    }
    // A missing file is named.
    let err = Store::open(&with(ClientTls {
        ca: Some(dir.path().join("nope.pem")),
        ..full
    }))
    .await
    .expect_err("a missing CA");
    assert!(err.to_string().contains("nope.pem"), "{err}");
}
