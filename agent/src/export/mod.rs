//! What the agent shows: the snapshot document (built here, defined in `gpuwarden-agent-api`),
//! the local socket that serves it, OTLP metrics and `top`.
//!
//! - `snapshot`: counters + enforcement + utilization + pod names → [`Snapshot`];
//! - `server`: the local socket, and `access`: who may ask it what (its file's mode and group,
//!   the caller's `SO_PEERCRED` before it signals a process or hands out a session's cgroup);
//! - [`metrics`]: the snapshot as OTLP metrics;
//! - [`top`]: the snapshot as a table.

pub(crate) mod access;
pub mod metrics;
pub(crate) mod server;
pub(crate) mod snapshot;
pub mod top;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use gpuwarden_agent_api::Snapshot;
use gpuwarden_agent_common::maps::GpuNode;

use crate::{
    attribution::{Attributor, kubelet::PodNames},
    control::UsageCounters,
    devices::GpuBackend,
    enforcement::EnforcerHandle,
    sensor::Sensor,
};

/// What the sensor's readers share: the event reader, map upkeep and snapshots. Data flows one
/// way: the kernel fills the maps, these read and tidy them.
pub(crate) struct Telemetry {
    /// The sensor (its telemetry maps).
    pub sensor: Sensor,
    /// cgroup id → workload.
    pub attributor: Attributor,
    /// The GPU device nodes watched.
    pub nodes: BTreeMap<PathBuf, GpuNode>,
    /// Events read from the ring buffer.
    pub events_received: u64,
    /// When each idle cgroup's counters last changed (map upkeep ages them out).
    pub idle: crate::sensor::upkeep::Idle,
}

/// The telemetry state, shared.
pub(crate) type SharedTelemetry = Arc<Mutex<Telemetry>>;

/// Locks the telemetry state; a panicked task leaves the maps as they were, so keep serving.
pub(crate) fn lock(state: &SharedTelemetry) -> MutexGuard<'_, Telemetry> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Everything a snapshot is built from.
pub(crate) struct Sources {
    /// The maps and attribution.
    pub telemetry: SharedTelemetry,
    /// Enforcement.
    pub enforcer: EnforcerHandle,
    /// GPU utilization.
    pub backend: Arc<dyn GpuBackend>,
    /// Pod names.
    pub pods: PodNames,
    /// The node's name.
    pub node: String,
    /// The GPUs' indexes.
    pub indexes: Vec<u32>,
    /// Usage reports sent and dropped.
    pub usage_counters: Arc<UsageCounters>,
}

impl Sources {
    /// A full snapshot: the maps read under the lock; enforcement asked, NVML and the pod names
    /// read outside it.
    pub(crate) async fn snapshot(&self) -> Snapshot {
        let (standing, _) = self.enforcer.standing().await.unwrap_or_default();
        let measured = self.backend.utilization();
        let mut snapshot = {
            let mut guard = lock(&self.telemetry);
            let t = &mut *guard;
            let counters = t.sensor.counters();
            snapshot::build(
                &t.sensor,
                counters,
                &standing,
                &mut t.attributor,
                &self.node,
                t.events_received,
            )
        };
        snapshot.gpus = snapshot::gpu_utilization(&self.indexes, measured.as_ref(), &standing);
        snapshot::add_health(&mut snapshot, &self.backend.health());
        (
            snapshot.stats.usage_reports,
            snapshot.stats.usage_reports_dropped,
        ) = self.usage_counters.get();
        snapshot.stats.controller_connected = self.usage_counters.connected();
        snapshot::annotate_pods(&mut snapshot, &self.pods);
        snapshot
    }
}
