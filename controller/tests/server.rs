//! The controller as operators and stock gRPC tools meet it: the binary's configuration
//! errors, and server reflection in both versions clients ask for.

use std::process::Command;

use gpuwarden_controller::{
    limits::{Bounds, Limits},
    server,
};
use tokio_stream::StreamExt as _;

#[test]
fn a_bad_scoring_config_stops_the_controller_naming_the_key() {
    let scratch = gpuwarden_test_support::scratch("scoring");
    let dir = scratch.path();
    for (toml, words) in [
        (
            "[scheduler.scoring.weights]\npacking = -1\n",
            "scoring weight packing = -1",
        ),
        ("[scheduler.scoring]\npacking_cap = 0\n", "packing_cap = 0"),
        ("[scheduler]\nstrategy = \"fastest\"\n", "fastest"),
        (
            "[limits]\nconcurrency_per_connection = 0\n",
            "[limits]: concurrency_per_connection = 0",
        ),
        ("[limits]\nmax_everything = 1\n", "max_everything"),
        (
            "[scheduler.quotas.queues.Team_A]\nguaranteed = { \"cuda.shares\" = \"1\" }\n",
            "[scheduler.quotas]: name \"Team_A\"",
        ),
        (
            "[scheduler.quotas.queues.lab]\nguaranteed = { \"cuda.shares\" = \"4\" }\nlimit = { \"cuda.shares\" = \"2\" }\n",
            "[scheduler.quotas]: guaranteed[cuda.shares]: 4 is above the limit of 2",
        ),
        (
            "[scheduler.quotas.members]\nalice = \"lba\"\n",
            "[scheduler.quotas]: members: \"alice\" is put in queue \"lba\"",
        ),
    ] {
        let file = dir.join("controller.toml");
        std::fs::write(&file, toml).expect("written");
        let out = Command::new(env!("CARGO_BIN_EXE_gpuwarden-controller"))
            .args(["run", "--listen", "127.0.0.1:0", "--config"])
            .arg(&file)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{toml}: {err}");
        assert!(
            err.contains(words) && err.contains("controller.toml"),
            "{toml}: {err}"
        );
    }
}

/// The services a reflection client of either version lists, over real gRPC on loopback.
#[tokio::test]
async fn reflection_answers_v1_and_v1alpha_clients() {
    use tonic_reflection::pb::{v1, v1alpha};

    let scratch = gpuwarden_test_support::scratch("reflect");
    let addr = gpuwarden_test_support::controller::serve_in_process(
        scratch.path(),
        server::Transport::PlainText,
        Bounds::new(Limits::default()),
    )
    .await;
    let url = format!("http://{addr}");
    let channel = tonic::transport::Endpoint::from_shared(url)
        .expect("a URL")
        .connect()
        .await
        .expect("connects");

    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("v1 is served")
        .into_inner();
    let Some(Ok(v1::ServerReflectionResponse {
        message_response:
            Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)),
        ..
    })) = answers.next().await
    else {
        panic!("v1 did not list the services");
    };
    let v1_names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();

    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("v1alpha is served")
        .into_inner();
    let Some(Ok(v1alpha::ServerReflectionResponse {
        message_response:
            Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)),
        ..
    })) = answers.next().await
    else {
        panic!("v1alpha did not list the services");
    };
    let v1alpha_names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();

    for names in [&v1_names, &v1alpha_names] {
        for service in [
            "gpuwarden.v1.SchedulerService",
            "gpuwarden.v1.AgentService",
            "grpc.health.v1.Health",
        ] {
            assert!(
                names.iter().any(|n| n == service),
                "{service} not in {names:?}"
            );
        }
    }
}

#[test]
fn help_says_what_the_controller_is() {
    let (first, help) = gpuwarden_test_support::help(env!("CARGO_BIN_EXE_gpuwarden-controller"));
    assert!(first.contains("cluster controller"), "{help}");
    assert!(!first.contains("CLI"), "{help}");
}

/// The lifecycle's build step: a port in use stops `App::build` with an error naming it,
/// before the store is touched.
#[tokio::test]
async fn a_taken_port_stops_the_build_naming_it_before_the_store_opens() {
    let scratch = gpuwarden_test_support::scratch("build");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
    let addr = taken.local_addr().expect("bound");
    let state = scratch.path().join("state");
    let built = server::App::build(server::RunConfig::new(addr, server::sled_in(&state))).await;
    let Err(e) = built else {
        panic!("built on a taken port");
    };
    assert!(
        matches!(&e, server::ServeError::Bind { addr: a, .. } if *a == addr),
        "{e}"
    );
    assert!(e.to_string().contains(&addr.to_string()), "{e}");
    assert!(
        !state.exists(),
        "the store was touched before the port was bound"
    );
}

/// The lifecycle's shutdown step stops every task: once `Running::shutdown` returns, the
/// background loop and the server no longer hold the controller, so its sled store (which one
/// process at a time may open) opens again and the port it served closes. Both within a moment
/// rather than at once: a commit already in flight and the listener's acceptor finish on their
/// own after the server returns. A task left running (the background loop holds the controller
/// for as long as it runs) would keep the store locked for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shut_down_controller_lets_go_of_its_store_and_port() {
    let scratch = gpuwarden_test_support::scratch("lifecycle");
    let any = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let config = || server::RunConfig::new(any, server::sled_in(scratch.path()));
    let running = server::App::build(config()).await.expect("builds").spawn();
    let url = format!("http://{}", running.addr());
    let connect = || async {
        tonic::transport::Endpoint::from_shared(url.clone())
            .expect("a URL")
            .connect()
            .await
    };
    {
        let channel = connect().await.expect("it serves");
        tonic_health::pb::health_client::HealthClient::new(channel)
            .check(tonic_health::pb::HealthCheckRequest::default())
            .await
            .expect("it answers");
    }
    // While it runs, its store can't be opened a second time.
    assert!(
        matches!(
            server::App::build(config()).await,
            Err(server::ServeError::Store(_))
        ),
        "a second controller opened the store of a running one"
    );
    running.shutdown().await.expect("shuts down cleanly");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let again = loop {
        match server::App::build(config()).await {
            Ok(app) => break app,
            Err(e) => assert!(
                std::time::Instant::now() < deadline,
                "the store is still held 5 s after shutdown: {e}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    while connect().await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the old port still answers 5 s after shutdown"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    again.spawn().shutdown().await.expect("shuts down cleanly");
}
