//! What the CLI end-to-end tests share: a real controller serving on loopback.

use std::path::Path;

use gpuwarden_controller::{api::Timing, scheduler::SchedulerConfig, server};

/// Starts a controller with its store under `scratch` on a runtime of its own; returns the
/// runtime (dropping it stops the controller) and the controller's URL.
pub fn start_controller(scratch: &Path) -> (tokio::runtime::Runtime, String) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let controller = server::open(
        &scratch.join("controller"),
        SchedulerConfig::default(),
        Timing::default(),
    )
    .expect("controller opens");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("binds");
    let url = format!("http://{}", listener.local_addr().expect("bound"));
    rt.spawn(server::serve_on(
        controller,
        listener,
        std::future::pending::<()>(),
    ));
    (rt, url)
}
