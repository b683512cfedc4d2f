//! `--insecure` is visible where operators look: a controller serving plain text beyond loopback
//! exports `gpuwarden.controller.insecure` = 1 over OTLP (and 0 before it does). Its own test
//! binary, since the flag is process-wide.

use std::time::Duration;

use gpuwarden_controller::{
    api::Timing,
    limits::{Bounds, Limits},
    scheduler::SchedulerConfig,
    server,
};
use gpuwarden_test_support::{
    otlp::{TestReceiver, points},
    scratch,
    wait::wait_for,
};

#[test]
fn insecure_serving_is_exported_as_a_metric() {
    let receiver = TestReceiver::start("127.0.0.1:0");
    let state = scratch("insecure");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let value = || {
        receiver
            .latest("gpuwarden.controller.insecure")
            .and_then(|m| points(&m).first().map(|p| p.1))
    };
    // One set of bounds for the metrics and the server, as the app makes.
    let bounds = Bounds::new(Limits::default());
    // The metrics' callbacks hold the controller: both kept to the end of the test.
    let (controller, _metrics) = rt.block_on(async {
        let controller = server::open(
            &server::sled_in(state.path()),
            SchedulerConfig::default(),
            Timing::default(),
        )
        .await
        .unwrap();
        let metrics = gpuwarden_controller::metrics::start(
            &controller,
            &bounds,
            &gpuwarden_controller::metrics::FollowedFiles::default(),
            &gpuwarden_runtime::otlp::Exporters {
                otlp: Some(format!("http://{}", receiver.addr)),
                interval: Some(Duration::from_millis(300)),
                prometheus: None,
            },
        )
        .unwrap();
        (controller, metrics)
    });
    wait_for("the gauge at 0 before serving", || value() == Some(0.0));
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
        tokio::spawn(
            server::GrpcServer::new(std::sync::Arc::clone(&controller), listener)
                .security(server::Transport::Insecure)
                .bounds(bounds)
                .serve(std::future::pending()),
        );
    });
    wait_for("the gauge at 1 while serving --insecure", || {
        value() == Some(1.0)
    });
}
