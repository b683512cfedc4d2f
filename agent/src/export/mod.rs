//! What the agent shows: the snapshot document (built here, defined in `gpuwarden-agent-api`),
//! the local socket that serves it, OTLP metrics and `top`.
//!
//! - `telemetry`: the sensor's maps, attribution and the watched GPU nodes, as a task behind a
//!   handle (its blocking work on blocking threads);
//! - `snapshot`: counters + enforcement + utilization + pod names → [`Snapshot`];
//! - `server`: the local socket, and `access`: who may ask it what (its file's mode and group,
//!   the caller's `SO_PEERCRED` before it signals a process or hands out a session's cgroup);
//! - [`metrics`]: the snapshot as OTLP metrics;
//! - [`top`]: the snapshot as a table.

pub(crate) mod access;
pub mod metrics;
pub(crate) mod server;
pub(crate) mod snapshot;
pub(crate) mod telemetry;
pub mod top;

use std::sync::Arc;

use gpuwarden_agent_api::Snapshot;

use crate::{
    attribution::kubelet::PodNames, control::UsageCounters, devices::GpuBackend,
    enforcement::EnforcerHandle, sensor::gpu_nodes::DeviceNames,
};
pub(crate) use telemetry::{Telemetry, TelemetryHandle};

/// Everything a snapshot is built from.
pub(crate) struct Sources {
    /// The maps and attribution.
    pub telemetry: TelemetryHandle,
    /// Enforcement.
    pub enforcer: EnforcerHandle,
    /// GPU utilization.
    pub backend: Arc<dyn GpuBackend>,
    /// Pod names.
    pub pods: PodNames,
    /// The node's name.
    pub node: String,
    /// Usage reports sent and dropped.
    pub usage_counters: Arc<UsageCounters>,
    /// What the node holds for the controller: whose `gpuwarden run` a session is.
    pub holdings: crate::control::holdings::SharedHoldings,
}

impl Sources {
    /// A full snapshot: enforcement asked, the maps read by the telemetry task; NVML and the pod
    /// names read here. Once telemetry has stopped (the agent is stopping) the maps' part is
    /// empty.
    pub(crate) async fn snapshot(&self) -> Snapshot {
        let (standing, _) = self.enforcer.standing().await.unwrap_or_default();
        let measured = self.backend.utilization();
        // Read at each snapshot: the link may have made or destroyed a MIG instance since.
        let devices = self.backend.devices();
        let indexes: Vec<u32> = devices.iter().map(|d| d.index).collect();
        let names = DeviceNames::new(&devices);
        let gpus = snapshot::gpu_utilization(&indexes, &names, measured.as_ref(), &standing);
        let mut snapshot = self
            .telemetry
            .snapshot(standing, self.node.clone())
            .await
            .unwrap_or_default();
        snapshot.gpus = gpus;
        snapshot::add_health(&mut snapshot, &self.backend.health(), &names);
        snapshot::add_memory(&mut snapshot, &self.backend.driver_memory(), &names);
        (
            snapshot.stats.usage_reports,
            snapshot.stats.usage_reports_dropped,
        ) = self.usage_counters.get();
        snapshot.stats.controller_connected = self.usage_counters.connected();
        snapshot::annotate_pods(&mut snapshot, &self.pods);
        snapshot
    }
}
