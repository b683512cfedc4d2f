//! The agent's metrics: its snapshot as OpenTelemetry instruments, pushed to a collector over
//! OTLP and/or served to Prometheus (`prometheus_listen`; see docs/metrics.md).
//!
//! OTLP is configured the standard way: `OTEL_EXPORTER_OTLP_ENDPOINT` (or the config file's
//! `otlp_endpoint`), `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_SERVICE_NAME` and `OTEL_METRIC_EXPORT_INTERVAL` are read by the OpenTelemetry SDK; with
//! neither an endpoint nor a Prometheus address the pipeline is off, and the agent says so once.
//!
//! Data flows one way: the daemon publishes each fresh [`Snapshot`] into a [`Published`] slot;
//! the SDK's reader thread observes it at every export. An unreachable or slow collector only
//! delays that thread (each export has a timeout): the agent never waits for it, the aggregated
//! state is bounded by the instruments' attribute sets, and failed exports are counted
//! (`gpuwarden.telemetry.exports.failed`).
//!
//! Names follow the OpenTelemetry semantic conventions where they exist (`hw.gpu.*`, `hw.status`,
//! `hw.errors`, `hw.power`, `hw.energy` with `hw.id`, `hw.name`, `hw.model`, `hw.vendor`,
//! `hw.driver_version`; `container.id`, `k8s.pod.uid`, `k8s.pod.name`, `k8s.namespace.name`),
//! with a `gpuwarden.` prefix for the rest; no pid or handle attributes. Each instrument is declared
//! once, in [`instruments`]; docs/metrics.md's table is checked against it. They are built by
//! what they read: the GPUs' (`gpus`), the containers' (`containers`) and the agent's own
//! (`agent`), those of one kind from a table of (instrument, figure) rows and one loop.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use gpuwarden_runtime::instrument::{Instrument, Registry};
use gpuwarden_runtime::otlp::{Exporters, Pipeline, PipelineError};
use opentelemetry::{KeyValue, metrics::AsyncInstrument};

use gpuwarden_agent_api::Snapshot;

use crate::{devices::GpuDevice, sensor::gpu_nodes::gpu_name};

/// The latest snapshot, published by the daemon and read at each export.
pub type Published = Arc<Mutex<Option<Snapshot>>>;

/// Where and how often to export.
#[derive(Debug, Clone, Default)]
pub struct MetricsConfig {
    /// OTLP/gRPC endpoint; `None` turns metrics off.
    pub endpoint: Option<String>,
    /// Export interval; `None` leaves it to `OTEL_METRIC_EXPORT_INTERVAL` (default 60 s).
    pub interval: Option<Duration>,
    /// Where to serve Prometheus' text format; `None`: no endpoint.
    pub prometheus: Option<SocketAddr>,
    /// `k8s.node.name` / `host.name` resource attribute.
    pub node: String,
    /// The GPU driver's version (`hw.driver_version` on every GPU series), where known.
    pub driver_version: Option<String>,
}

impl MetricsConfig {
    /// The endpoint from `file` (the config file) or `OTEL_EXPORTER_OTLP_ENDPOINT`.
    #[must_use]
    pub fn endpoint(file: Option<String>) -> Option<String> {
        file.filter(|e| !e.is_empty())
            .or_else(gpuwarden_runtime::otlp::endpoint_from_env)
    }
}

/// Starts exporting what `published` holds, or returns `None` (saying so) with neither an OTLP
/// endpoint nor a Prometheus address. Must run inside a tokio runtime (the gRPC channel and the
/// listener live there).
///
/// # Errors
/// The exporter can't be built, or the Prometheus address can't be bound.
pub fn start(
    config: &MetricsConfig,
    gpus: Vec<GpuDevice>,
    published: &Published,
) -> Result<Option<Pipeline>, PipelineError> {
    let exporters = Exporters {
        otlp: config.endpoint.clone(),
        interval: config.interval,
        prometheus: config.prometheus,
    };
    let Some(pipeline) = Pipeline::start(
        &exporters,
        "gpuwarden-agent",
        vec![
            KeyValue::new("host.name", config.node.clone()),
            KeyValue::new("k8s.node.name", config.node.clone()),
        ],
        // Every series names its node, so a dashboard can group GPUs and tenants by node.
        &["k8s.node.name"],
    )?
    else {
        tracing::info!(
            "metrics off: no OTEL_EXPORTER_OTLP_ENDPOINT (or otlp_endpoint in the config file) and no prometheus_listen"
        );
        return Ok(None);
    };
    let gpus = gpus
        .into_iter()
        .map(|d| Gpu::new(d, config.driver_version.as_deref()))
        .collect();
    register(&mut Registry::new(pipeline.meter()), gpus, published);
    if let Some(endpoint) = &config.endpoint {
        tracing::info!(%endpoint, "exporting OTLP metrics");
    }
    if let Some(addr) = pipeline.prometheus_addr() {
        tracing::info!(%addr, "serving Prometheus metrics at /metrics");
    }
    Ok(Some(pipeline))
}

/// The attributes of a container: its id, pod and cgroup (bounded by the containers alive).
fn container_attributes(c: &gpuwarden_agent_api::Container) -> Vec<KeyValue> {
    let mut attrs = vec![KeyValue::new(
        "gpuwarden.cgroup.path",
        c.cgroup_path.clone(),
    )];
    if let Some(id) = &c.container_id {
        attrs.push(KeyValue::new("container.id", id.clone()));
    }
    if let Some(uid) = &c.pod_uid {
        attrs.push(KeyValue::new("k8s.pod.uid", uid.clone()));
    }
    if let Some(name) = &c.pod_name {
        attrs.push(KeyValue::new("k8s.pod.name", name.clone()));
    }
    if let Some(namespace) = &c.pod_namespace {
        attrs.push(KeyValue::new("k8s.namespace.name", namespace.clone()));
    }
    if let Some(session) = &c.session_id {
        attrs.push(KeyValue::new("gpuwarden.session.id", session.clone()));
    }
    attrs
}

/// A GPU and the attributes of its series (`hw.*` of the hardware conventions).
struct Gpu {
    device: GpuDevice,
    attributes: Vec<KeyValue>,
}

impl Gpu {
    fn new(device: GpuDevice, driver: Option<&str>) -> Self {
        let mut attributes = vec![
            KeyValue::new("hw.id", device.uuid.clone()),
            KeyValue::new("hw.name", device.model.clone()),
            KeyValue::new("hw.model", device.model.clone()),
            KeyValue::new("hw.vendor", "NVIDIA"),
            KeyValue::new("gpuwarden.gpu.index", i64::from(device.index)),
        ];
        if let Some(driver) = driver {
            attributes.push(KeyValue::new("hw.driver_version", driver.to_owned()));
        }
        // A MIG instance: its profile and its parent GPU (docs/mig.md).
        if let Some(m) = &device.mig {
            attributes.push(KeyValue::new(
                "gpuwarden.gpu.mig.profile",
                m.profile.clone(),
            ));
            attributes.push(KeyValue::new("hw.parent", m.parent_uuid.clone()));
        }
        Self { device, attributes }
    }

    /// Its attributes with `extra` after them.
    fn with(&self, extra: impl IntoIterator<Item = KeyValue>) -> Vec<KeyValue> {
        let mut attrs = self.attributes.clone();
        attrs.extend(extra);
        attrs
    }

    /// The name the snapshot reports it under (`nvidia0`, a MIG instance `nvidia1/gi9`).
    fn name(&self) -> String {
        gpu_name(&self.device)
    }

    /// Its health in the snapshot, if known.
    fn health<'a>(&self, s: &'a Snapshot) -> Option<&'a gpuwarden_agent_api::GpuHealthView> {
        let name = self.name();
        s.gpus
            .iter()
            .find(|g| g.device == name)
            .and_then(|g| g.health.as_ref())
    }
}

/// The index of the GPU (or MIG instance) the snapshot names `device` (`nvidia3` → 3,
/// `nvidia1/gi9` → the instance's index), among `gpus`; a GPU node the device list lacks (no
/// NVML, no mock list) by its number.
fn gpu_index(gpus: &[Gpu], device: &str) -> Option<u32> {
    gpus.iter()
        .find(|g| g.name() == device)
        .map(|g| g.device.index)
        .or_else(|| {
            let index: u32 = device.strip_prefix("nvidia")?.parse().ok()?;
            // An index the list has is named as the list says (`nvidia15` is not instance 15).
            (!gpus.iter().any(|g| g.device.index == index)).then_some(index)
        })
}

/// Runs `f` on the published snapshot, if there is one.
fn with_snapshot(published: &Published, f: impl FnOnce(&Snapshot)) {
    let guard = published.locked();
    if let Some(s) = guard.as_ref() {
        f(s);
    }
}

/// A callback that runs `observe` on the published snapshot at each export (none while nothing
/// is published).
fn on_snapshot<T: 'static>(
    published: &Published,
    observe: impl Fn(&Snapshot, &dyn AsyncInstrument<T>) + Send + Sync + 'static,
) -> impl Fn(&dyn AsyncInstrument<T>) + Send + Sync + 'static {
    let published = Arc::clone(published);
    move |o| with_snapshot(&published, |s| observe(s, o))
}

/// One row of a table of like instruments: the instrument and the figure it reads from a `T`,
/// where known.
type Row<T, V> = (&'static Instrument, fn(&T) -> Option<V>);

/// Builds every instrument but the pipeline's own on `registry`: the GPUs', the containers' and
/// the agent's own. They live as long as the provider that holds their callbacks.
fn register(registry: &mut Registry<'_>, gpus: Vec<Gpu>, published: &Published) {
    let gpus = Arc::new(gpus);
    gpus::register(registry, &gpus, published);
    containers::register(registry, &gpus, published);
    agent::register(registry, published);
}

mod agent;
mod containers;
mod gpus;
pub mod instruments;
pub mod share_watch;

#[cfg(test)]
mod tests;
