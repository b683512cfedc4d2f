//! The real agent link against a controller that serves mutual TLS, on loopback: the agent
//! registers with its node certificate, and one configured as another node is refused.

use std::{path::Path, sync::Arc, time::Duration};

use gpuwarden_agent::{
    control::{
        holdings::SharedHoldings,
        link::{self as controller_link, LinkConfig},
    },
    devices::{GpuBackend, NoGpus},
};
use gpuwarden_controller::{
    api::Timing,
    auth::{
        clients::ClientRole,
        denials::DenialReason,
        mint,
        tls::{ReloadingConfig, ServerTlsFiles},
    },
    limits::{Bounds, Limits},
    scheduler::SchedulerConfig,
    server::{self, Transport},
};
use gpuwarden_proto::v1::{self as pb, scheduler_service_client::SchedulerServiceClient};
use gpuwarden_runtime::tls::ClientTls;

/// A controller serving mutual TLS with certificates minted under `dir`: its URL, and its
/// bounds (which count whom it refused).
async fn start_controller(dir: &Path) -> (String, Arc<Bounds>) {
    let certs = dir.join("certs");
    mint::mint_into(&certs, &["node-1".to_owned()], &["127.0.0.1".to_owned()], 1).expect("minted");
    mint::mint_clients_into(&certs, &[("ops".to_owned(), ClientRole::Admin)], 1)
        .expect("minted the admin");
    let controller = server::open(
        &server::sled_in(&dir.join("state")),
        SchedulerConfig::default(),
        Timing::default(),
    )
    .await
    .expect("controller opens");
    let tls = ReloadingConfig::load(ServerTlsFiles::minted(&certs)).expect("TLS files load");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let url = format!("https://{}", listener.local_addr().expect("bound"));
    let bounds = Bounds::new(Limits::default());
    tokio::spawn(
        server::GrpcServer::new(controller, listener)
            .security(Transport::Tls(Arc::new(tls)))
            .bounds(Arc::clone(&bounds))
            .serve(std::future::pending::<()>()),
    );
    (url, bounds)
}

/// The link of an agent named `node` presenting node-1's certificate.
fn link(url: &str, certs: &Path, node: &str) -> tokio::task::JoinHandle<()> {
    let config = LinkConfig {
        controller: url.to_owned(),
        tls: ClientTls {
            ca: Some(certs.join(mint::CA_CERT)),
            cert: Some(certs.join("node-1.pem")),
            key: Some(certs.join("node-1.key")),
        },
        node_id: node.to_owned(),
        hostname: node.to_owned(),
        hooks: vec![],
        mig_reconfigurable: vec![],
    };
    let backend: Arc<dyn GpuBackend> = Arc::new(NoGpus);
    tokio::spawn(controller_link::run(
        config,
        backend,
        SharedHoldings::default(),
        None,
        std::future::pending(),
    ))
}

/// The nodes an admin of the scheduler service sees.
async fn node_ids(url: &str, ca: &Path) -> Vec<String> {
    let certs = ca
        .parent()
        .expect("the CA is in the certificates' directory");
    let endpoint = ClientTls {
        ca: Some(ca.to_owned()),
        cert: Some(certs.join("admin-ops.pem")),
        key: Some(certs.join("admin-ops.key")),
    }
    .apply(tonic::transport::Endpoint::from_shared(url.to_owned()).expect("a URL"))
    .expect("TLS settings");
    let mut client = SchedulerServiceClient::new(endpoint.connect().await.expect("connects"));
    client
        .list_nodes(pb::ListNodesRequest::default())
        .await
        .expect("lists nodes")
        .into_inner()
        .nodes
        .into_iter()
        .filter_map(|n| n.info.map(|i| i.node_id))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_registers_over_mutual_tls_only_as_its_own_node() {
    let dir = gpuwarden_test_support::scratch("link-tls");
    let (url, bounds) = start_controller(dir.path()).await;
    let certs = dir.path().join("certs");
    let ca = certs.join(mint::CA_CERT);

    let impostor = link(&url, &certs, "node-2");
    let honest = link(&url, &certs, "node-1");
    let deadline = tokio::time::Instant::now() + gpuwarden_test_support::wait::PATIENCE;
    while !node_ids(&url, &ca).await.contains(&"node-1".to_owned()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "node-1 never registered over TLS"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The impostor keeps trying (a refusal is not fatal: its certificate may be rotated), and
    // is refused and counted every time.
    while bounds.denials().count_of(DenialReason::NodeMismatch) < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "node-1's certificate speaking as node-2 was not refused"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(node_ids(&url, &ca).await, ["node-1"]);
    assert!(!impostor.is_finished() && !honest.is_finished());
    impostor.abort();
    honest.abort();
}
