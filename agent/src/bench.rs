//! For `cargo xtask bench telemetry` (`agent/benches/telemetry.rs`) only, not an API: the
//! telemetry state on a loaded sensor, driven the way the agent drives it ([`Design::Task`]: a
//! task behind a handle, its work on blocking threads) and the way it did before
//! ([`Design::Mutex`]: one `std::sync::Mutex`, held on the runtime's worker threads while
//! `/proc` is read), so one run measures both.

use gpuwarden_runtime::sync::Lock as _;
use std::sync::{Arc, Mutex};

use crate::{
    attribution::{AttributionError, Attributor},
    enforcement::Standing,
    export::{Telemetry, TelemetryHandle, telemetry},
    sensor::{
        Sensor, SensorError,
        gpu_nodes::{GpuNodeError, GpuNodeGlobs},
    },
};

/// How telemetry is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Design {
    /// Before: `Arc<Mutex<Telemetry>>`, locked by each reader on its own worker thread.
    Mutex,
    /// Now: a task behind a handle.
    Task,
}

/// The rig can't start.
#[derive(Debug, thiserror::Error)]
pub enum RigError {
    /// No cgroup v2 hierarchy.
    #[error(transparent)]
    Attribution(#[from] AttributionError),
    /// The programs didn't load (not root?).
    #[error(transparent)]
    Sensor(#[from] SensorError),
    /// The default GPU device globs don't parse.
    #[error(transparent)]
    Globs(#[from] GpuNodeError),
}

enum Shared {
    Mutex(Arc<Mutex<Telemetry>>),
    Task(TelemetryHandle, tokio::task::JoinHandle<()>),
}

/// Telemetry on a loaded sensor (no pins, no GPU nodes watched), shared the `design` way.
pub struct Rig {
    shared: Shared,
}

impl Rig {
    /// Loads the programs and starts telemetry; needs root and a tokio runtime.
    ///
    /// # Errors
    /// See [`RigError`].
    pub fn start(design: Design) -> Result<Self, RigError> {
        let attributor = Attributor::detect()?;
        let sensor = Sensor::load(1 << 20, None)?;
        let globs = GpuNodeGlobs::new::<&str>(&[])?;
        let state = Telemetry::new(sensor, attributor, globs);
        let shared = match design {
            Design::Mutex => Shared::Mutex(Arc::new(Mutex::new(state))),
            Design::Task => {
                let (handle, task) = telemetry::spawn(state);
                Shared::Task(handle, task)
            }
        };
        Ok(Self { shared })
    }

    /// A batch of `received` kernel events of which `execs` are processes that exec'd, handed
    /// over as the event reader does.
    pub async fn events(&self, received: u64, execs: Vec<u32>) {
        match &self.shared {
            // As the reader did: the lock held for the whole batch.
            Shared::Mutex(state) => {
                let mut t = state.locked();
                t.count_events(received);
                for tgid in execs {
                    t.on_exec(tgid);
                }
            }
            Shared::Task(handle, _) => {
                let _ = handle.events(received, execs).await;
            }
        }
    }

    /// Returns once every event handed over is handled.
    pub async fn settled(&self) {
        // Under the mutex, `events` returned only once they were.
        if let Shared::Task(handle, _) = &self.shared {
            let _ = handle.settled().await;
        }
    }

    /// A snapshot's telemetry part (no quotas bound); returns its container count.
    pub async fn snapshot(&self) -> usize {
        let standing = Standing::default();
        let snapshot = match &self.shared {
            Shared::Mutex(state) => state.locked().snapshot(&standing, "bench"),
            Shared::Task(handle, _) => handle
                .snapshot(standing, "bench".to_owned())
                .await
                .unwrap_or_default(),
        };
        snapshot.containers.len()
    }

    /// Stops telemetry and unloads the programs.
    pub async fn stop(self) {
        if let Shared::Task(handle, task) = self.shared {
            handle.stop();
            let _ = task.await;
        }
    }
}
