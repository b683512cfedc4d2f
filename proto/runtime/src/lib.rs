//! What the gpuwarden daemons start with, written once.
//!
//! The agent and the controller each need to stop cleanly on the signals Kubernetes and a
//! terminal send, log the same way, and push metrics over OTLP or serve them to Prometheus.
//! Those pieces live here so a fix reaches every daemon at once:
//!
//! - [`shutdown`]: a future that completes on SIGINT or SIGTERM;
//! - [`logging`]: `tracing` to standard error, filtered by `RUST_LOG`;
//! - [`otlp`]: the metrics pipeline: OTLP/gRPC to an OpenTelemetry collector, and
//!   [`prometheus`], the scrape endpoint; [`instrument`]: each metric declared once;
//! - [`private`]: state directories only their owner can read;
//! - [`lifecycle`]: build, spawn, shut down: the tasks a daemon started, stopped and joined in
//!   reverse start order.
//!
//! What every process needs from its host without telemetry (cgroups, the mount table, TLS
//! files, a lock that outlives a panic) is the crate `gpuwarden-host`, which the `gpuwarden` CLI
//! links instead of this one; its modules are re-exported here under their old paths
//! ([`cgroup`], [`mountinfo`], [`tls`], [`sync`]) so the daemons' imports stay as they are.
//! HTTPS to Kubernetes is a crate of its own beside this one, `gpuwarden-kube`.
#![deny(missing_docs)]

pub mod instrument;
pub mod lifecycle;
pub mod logging;
pub mod otlp;
pub mod private;
pub mod prometheus;

pub use gpuwarden_host::{cgroup, mountinfo, sync, tls};

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
