//! The controller binary on its stores: sessions acknowledged over gRPC survive `kill -9` on etcd
//! as on sled, a store that can't be reached or named stops it with the reason, and `copy-store`
//! moves a sled store into etcd.

use std::{process::Command, time::Duration};

use gpuwarden_test_support::{
    Etcd,
    controller::{ControllerProcess, request},
    scratch,
};

const CONTROLLER: &str = env!("CARGO_BIN_EXE_gpuwarden-controller");
/// Long enough for a restarted controller to win the election over its dead self's lease.
const SERVING: Duration = Duration::from_secs(20);

/// Creates sessions concurrently, SIGKILLs the controller, and finds every acknowledged one.
async fn acknowledged_sessions_survive_kill_9(store: &str) {
    let controller = ControllerProcess::start(store, &[]);
    controller.until_serving(SERVING).await;
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

    let controller = ControllerProcess::start(store, &[]);
    controller.until_serving(SERVING).await;
    assert_eq!(
        controller.names().await.expect("serves"),
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
        let controller = ControllerProcess::start(&sled, &[]);
        controller.until_serving(SERVING).await;
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
    let controller = ControllerProcess::start(&target, &[]);
    controller.until_serving(SERVING).await;
    assert_eq!(controller.names().await.expect("serves"), ["a", "b"]);
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
