//! `gpuwarden-agent run`, in the lifecycle both daemons share (docs/architecture.md,
//! "Lifecycle"): [`AgentConfig`] → [`App::build`] (lock taken, programs loaded, store opened,
//! sockets bound) → [`App::spawn`] → [`Running`] → [`Running::shutdown`] (the tasks stopped and
//! joined in reverse start order).
//!
//! - `app`: the lifecycle: what is built, the order tasks start in, the shutdown;
//! - `start`: the sensor, telemetry and enforcement as they come up (held quotas re-applied);
//! - `tasks`: the long-running tasks: event dispatch, map upkeep, usage reports.

mod app;
mod start;
mod tasks;

use std::path::PathBuf;

pub use app::{App, Running};

use crate::{
    attribution::AttributionError,
    config::AgentConfig,
    control::{holdings::HoldingsError, link::LinkError},
    devices, dra,
    enforcement::throttle,
    lock::LockError,
    sensor::SensorError,
};

/// Errors that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Another agent runs on this node.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// No cgroup v2 hierarchy.
    #[error(transparent)]
    Attribution(#[from] AttributionError),
    /// The programs didn't load or attach.
    #[error(transparent)]
    Sensor(#[from] SensorError),
    /// The socket can't be served.
    #[error("cannot listen on {path}: {source}")]
    Socket {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The ring buffer can't be polled.
    #[error("cannot poll the event ring buffer: {0}")]
    Events(#[source] std::io::Error),
    /// The agent's store can't be used.
    #[error(transparent)]
    Holdings(#[from] HoldingsError),
    /// The GPU backend can't be set up.
    #[error(transparent)]
    Devices(#[from] devices::DeviceError),
    /// The compute-share throttle can't start.
    #[error(transparent)]
    Throttle(#[from] throttle::ThrottleError),
    /// The controller link can't work (an invalid URL, a TLS file): retrying would not help.
    #[error(transparent)]
    Controller(#[from] LinkError),
    /// The DRA kubelet plugin can't start.
    #[error(transparent)]
    Dra(#[from] dra::DraError),
    /// A task of the agent panicked (or was cancelled before it was told to stop).
    #[error(transparent)]
    Task(#[from] gpuwarden_runtime::lifecycle::TaskError),
}

/// Runs the agent until SIGINT or SIGTERM.
///
/// # Errors
/// See [`RunError`].
pub async fn run(config: AgentConfig) -> Result<(), RunError> {
    run_until(config, gpuwarden_runtime::shutdown()).await
}

/// The whole lifecycle: builds the agent `config` describes, spawns it, and runs it until
/// `stop` completes (tests embed the agent this way), then shuts it down.
///
/// # Errors
/// See [`RunError`].
pub async fn run_until(
    config: AgentConfig,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), RunError> {
    App::build(config)?.spawn().run_until(stop).await
}
