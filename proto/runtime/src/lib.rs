//! What every gpuwarden binary starts with, written once.
//!
//! The agent, the controller and the CLI each need to stop cleanly on the signals Kubernetes and
//! a terminal send, log the same way, push metrics over OTLP, and (`gpuwarden run`, the tests'
//! workloads) start a process inside a cgroup. Those pieces live here so a fix reaches every
//! binary at once:
//!
//! - [`shutdown`]: a future that completes on SIGINT or SIGTERM;
//! - [`logging`]: `tracing` to standard error, filtered by `RUST_LOG`;
//! - [`otlp`]: the metrics pipeline: OTLP/gRPC to an OpenTelemetry collector, and
//!   [`prometheus`], the scrape endpoint;
//! - [`cgroup`]: moving a child into a cgroup v2 between `fork` and `exec`;
//! - [`mountinfo`]: where a file system (the cgroup v2 hierarchy) is mounted;
//! - [`private`]: state directories only their owner can read;
//! - [`tls`]: PEM certificates and keys, and a client's TLS to the controller;
//! - [`sync`]: a lock that outlives a panicking holder.
//!
//! HTTPS to Kubernetes is a crate of its own beside this one, `gpuwarden-kube`.
#![deny(missing_docs)]

pub mod cgroup;
pub mod logging;
pub mod mountinfo;
pub mod otlp;
pub mod private;
pub mod prometheus;
pub mod sync;
pub mod tls;

/// Completes on SIGINT or SIGTERM (what Kubernetes sends before it kills a pod), so a daemon can
/// close its store and pins cleanly. Where SIGTERM can't be watched, SIGINT alone ends it.
pub async fn shutdown() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
