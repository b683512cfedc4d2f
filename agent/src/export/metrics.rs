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
//! once, in [`instruments`]; docs/metrics.md's table is checked against it.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use gpuwarden_runtime::instrument::{Instrument, Registry};
use gpuwarden_runtime::otlp::{Exporters, Pipeline, PipelineError};
use opentelemetry::KeyValue;

use gpuwarden_agent_api::{SignalView, Snapshot};

use crate::{
    devices::{GpuDevice, health::HealthState},
    sensor::gpu_nodes::{gpu_name, node_name},
};

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

/// A container's entitled share and achieved GPU time (both the largest over its GPUs, so they
/// compare), with its attributes and compute policy; `None` without a compute share.
fn entitled_and_achieved(c: &gpuwarden_agent_api::Container) -> Option<(f64, f64, Vec<KeyValue>)> {
    let quota = c.quota.as_ref()?;
    let achieved = c.enforcement.as_ref()?.achieved?;
    let share = quota.devices.iter().map(|d| d.shares).fold(0.0, f64::max);
    let mut attrs = container_attributes(c);
    attrs.push(KeyValue::new(
        "gpuwarden.compute.policy",
        quota.compute_policy.clone(),
    ));
    Some((share, achieved, attrs))
}

/// One container on one GPU.
struct ContainerGpu {
    attrs: Vec<KeyValue>,
    /// Bytes it holds there.
    used: u64,
    /// Its quota there: (limit bytes, share).
    quota: Option<(u64, f64)>,
}

/// Every GPU each container uses or holds a quota on.
fn container_gpus(s: &Snapshot, gpus: &[Gpu]) -> Vec<ContainerGpu> {
    let mut out = Vec::new();
    for c in &s.containers {
        let mut indexes: Vec<u32> = c
            .devices
            .iter()
            .filter(|d| d.memory_bytes > 0)
            .filter_map(|d| gpu_index(gpus, &d.device))
            .collect();
        if let Some(q) = &c.quota {
            indexes.extend(q.devices.iter().filter_map(|d| gpu_index(gpus, &d.device)));
        }
        indexes.sort_unstable();
        indexes.dedup();
        for index in indexes {
            // A GPU the list lacks is named by its node.
            let name = gpus
                .iter()
                .find(|g| g.device.index == index)
                .map_or_else(|| node_name(index), Gpu::name);
            let used = c
                .devices
                .iter()
                .find(|d| d.device == name)
                .map_or(0, |d| d.memory_bytes);
            let quota = c.quota.as_ref().and_then(|q| {
                q.devices
                    .iter()
                    .find(|d| d.device == name)
                    .map(|d| (d.memory_bytes, d.shares))
            });
            let mut attrs = container_attributes(c);
            attrs.push(KeyValue::new("gpuwarden.gpu.index", i64::from(index)));
            if let Some(gpu) = gpus.iter().find(|g| g.device.index == index) {
                attrs.push(KeyValue::new("hw.id", gpu.device.uuid.clone()));
            }
            out.push(ContainerGpu { attrs, used, quota });
        }
    }
    out
}

#[expect(
    clippy::too_many_lines,
    reason = "One instrument after another, a few lines each: split, they read worse"
)]
fn register(registry: &mut Registry<'_>, gpus: Vec<Gpu>, published: &Published) {
    type Pick = fn(&gpuwarden_agent_api::EnforcementView) -> u64;
    let gpus = Arc::new(gpus);
    // The instruments live as long as the provider that holds their callbacks.
    {
        let gpus = Arc::clone(&gpus);
        registry
            .u64_gauge(&instruments::HW_GPU_MEMORY_LIMIT)
            .with_callback(move |o| {
                for gpu in gpus.iter() {
                    o.observe(gpu.device.memory_bytes, &gpu.attributes);
                }
            })
            .build();
    }
    {
        let (gpus, published) = (Arc::clone(&gpus), Arc::clone(published));
        registry
            .u64_gauge(&instruments::HW_GPU_MEMORY_USAGE)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for gpu in gpus.iter() {
                        let name = gpu.name();
                        let used: u64 = s
                            .containers
                            .iter()
                            .flat_map(|c| &c.devices)
                            .filter(|d| d.device == name)
                            .map(|d| d.memory_bytes)
                            .sum();
                        o.observe(used, &gpu.attributes);
                    }
                });
            })
            .build();
    }
    {
        let (gpus, published) = (Arc::clone(&gpus), Arc::clone(published));
        registry
            .f64_gauge(&instruments::HW_GPU_UTILIZATION)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for gpu in gpus.iter() {
                        let name = gpu.name();
                        // A GPU whose utilization can't be read is left out, not reported 0.
                        let Some((value, source)) = s
                            .gpus
                            .iter()
                            .find(|g| g.device == name)
                            .and_then(|g| g.utilization.map(|u| (u, g.source.clone())))
                        else {
                            continue;
                        };
                        o.observe(
                            value,
                            &gpu.with([KeyValue::new("gpuwarden.utilization.source", source)]),
                        );
                    }
                });
            })
            .build();
    }
    register_health(registry, &gpus, published);
    {
        let (gpus, published) = (Arc::clone(&gpus), Arc::clone(published));
        registry
            .u64_gauge(&instruments::CONTAINER_GPU_MEMORY_USAGE)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for c in container_gpus(s, &gpus) {
                        o.observe(c.used, &c.attrs);
                    }
                });
            })
            .build();
    }
    {
        let (gpus, published) = (Arc::clone(&gpus), Arc::clone(published));
        registry
            .u64_gauge(&instruments::CONTAINER_GPU_MEMORY_LIMIT)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for c in container_gpus(s, &gpus) {
                        if let Some((limit, _)) = c.quota {
                            o.observe(limit, &c.attrs);
                        }
                    }
                });
            })
            .build();
    }
    {
        let (gpus, published) = (Arc::clone(&gpus), Arc::clone(published));
        registry
            .f64_gauge(&instruments::CONTAINER_COMPUTE_SHARE)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for c in container_gpus(s, &gpus) {
                        if let Some((_, share)) = c.quota {
                            o.observe(share, &c.attrs);
                        }
                    }
                });
            })
            .build();
    }
    for (instrument, entitled) in [
        (&instruments::CONTAINER_COMPUTE_ENTITLED, true),
        (&instruments::CONTAINER_COMPUTE_ACHIEVED, false),
    ] {
        let published = Arc::clone(published);
        registry
            .f64_gauge(instrument)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for c in &s.containers {
                        if let Some((share, achieved, attrs)) = entitled_and_achieved(c) {
                            o.observe(if entitled { share } else { achieved }, &attrs);
                        }
                    }
                });
            })
            .build();
    }
    {
        let published = Arc::clone(published);
        registry
            .u64_gauge(&instruments::CONTAINER_COMPUTE_DEVIATION)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for c in &s.containers {
                        let Some((_, _, attrs)) = entitled_and_achieved(c) else {
                            continue;
                        };
                        let flagged = c.enforcement.as_ref().and_then(|e| e.deviation.as_deref());
                        for d in share_watch::Deviation::ALL {
                            let mut attrs = attrs.clone();
                            attrs.push(KeyValue::new("gpuwarden.share.deviation", d.as_str()));
                            o.observe(u64::from(flagged == Some(d.as_str())), &attrs);
                        }
                    }
                });
            })
            .build();
    }
    {
        let published = Arc::clone(published);
        registry
            .u64_gauge(&instruments::AGENT_CONTROLLER_CONNECTED)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    if let Some(up) = s.stats.controller_connected {
                        o.observe(u64::from(up), &[]);
                    }
                });
            })
            .build();
    }
    {
        let published = Arc::clone(published);
        registry
            .u64_counter(&instruments::CONTAINER_IOCTLS)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for c in &s.containers {
                        let base = container_attributes(c);
                        for d in &c.devices {
                            for (class, n) in &d.ioctls {
                                let mut attrs = base.clone();
                                attrs.push(KeyValue::new("gpuwarden.device", d.device.clone()));
                                attrs.push(KeyValue::new("gpuwarden.ioctl.class", class.clone()));
                                o.observe(*n, &attrs);
                            }
                        }
                    }
                });
            })
            .build();
    }
    let enforcement: [(&Instrument, Pick); 2] = [
        (&instruments::CONTAINER_ENFORCEMENT_ACTIONS, |e| e.actions),
        (&instruments::CONTAINER_ENFORCEMENT_DENIED_OPENS, |e| {
            e.denied_opens
        }),
    ];
    for (instrument, pick) in enforcement {
        let published = Arc::clone(published);
        registry
            .u64_counter(instrument)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for c in &s.containers {
                        if let Some(e) = &c.enforcement {
                            o.observe(pick(e), &container_attributes(c));
                        }
                    }
                });
            })
            .build();
    }
    // Times the snapshot keeps in ms, exported in seconds as counters.
    let times: [(&Instrument, Pick); 2] = [
        (&instruments::CONTAINER_THROTTLED, |e| e.throttled_ms),
        (&instruments::CONTAINER_GPU_TIME, |e| e.gpu_time_ms),
    ];
    for (instrument, pick) in times {
        let published = Arc::clone(published);
        registry
            .f64_counter(instrument)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for c in &s.containers {
                        if let Some(e) = &c.enforcement {
                            o.observe(pick(e) as f64 / 1000.0, &container_attributes(c));
                        }
                    }
                });
            })
            .build();
    }
    {
        let published = Arc::clone(published);
        registry
            .f64_gauge(&instruments::CONTAINER_GPU_LEDGER)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for c in &s.containers {
                        if let Some(ms) = c.enforcement.as_ref().and_then(|e| e.ledger_ms) {
                            o.observe(ms as f64 / 1000.0, &container_attributes(c));
                        }
                    }
                });
            })
            .build();
    }
    for (instrument, pick) in [
        (
            &instruments::GPU_SIGNAL_PERIOD,
            (|v: &SignalView| v.period_us.map(|us| us as f64 / 1e6))
                as fn(&SignalView) -> Option<f64>,
        ),
        (&instruments::GPU_SIGNAL_JITTER, |v| {
            v.jitter_us.map(|us| us as f64 / 1e6)
        }),
        (&instruments::GPU_SIGNAL_UNATTRIBUTED, |v| {
            Some(v.unattributed_ms as f64 / 1000.0)
        }),
        (&instruments::GPU_SIGNAL_LATE_SAMPLES, |v| {
            Some(v.late_samples as f64)
        }),
    ] {
        let published = Arc::clone(published);
        registry
            .f64_gauge(instrument)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for v in &s.throttle_signals {
                        if let Some(value) = pick(v) {
                            o.observe(
                                value,
                                &[KeyValue::new("gpuwarden.device", v.device.clone())],
                            );
                        }
                    }
                });
            })
            .build();
    }
    {
        let published = Arc::clone(published);
        registry
            .u64_counter(&instruments::AGENT_RINGBUF_DROPS)
            .with_callback(move |o| {
                with_snapshot(&published, |s| o.observe(s.stats.ringbuf_drops, &[]));
            })
            .build();
    }
    {
        let published = Arc::clone(published);
        registry
            .u64_gauge(&instruments::AGENT_MAP_ENTRIES)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for (map, n) in [
                        ("fds", s.stats.tracked_fds),
                        ("processes", s.stats.tracked_processes),
                        ("allocations", s.stats.tracked_allocations),
                    ] {
                        o.observe(n, &[KeyValue::new("gpuwarden.map", map)]);
                    }
                });
            })
            .build();
    }
    {
        let published = Arc::clone(published);
        registry
            .u64_counter(&instruments::CONTAINER_TABLE_REFUSED)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for c in &s.containers {
                        for t in c.tables.iter().filter(|t| t.refused != 0) {
                            let mut attrs = container_attributes(c);
                            attrs.push(KeyValue::new("gpuwarden.map", t.table.clone()));
                            o.observe(t.refused, &attrs);
                        }
                    }
                });
            })
            .build();
    }
    {
        let published = Arc::clone(published);
        registry
            .u64_counter(&instruments::AGENT_KUBELET_REQUESTS)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for (result, n) in s.kubelet.iter().flat_map(|k| &k.requests) {
                        o.observe(*n, &[KeyValue::new("gpuwarden.result", result.clone())]);
                    }
                });
            })
            .build();
    }
    {
        let published = Arc::clone(published);
        registry
            // Not "1": Prometheus would read that as a ratio (`_ratio`).
            .u64_gauge(&instruments::AGENT_HOOK_TIER)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    o.observe(
                        1,
                        &[
                            KeyValue::new(
                                "gpuwarden.tier",
                                s.tier.clone().unwrap_or_else(|| "none".to_owned()),
                            ),
                            KeyValue::new(
                                "gpuwarden.memory_tier",
                                s.memory_tier.clone().unwrap_or_else(|| "none".to_owned()),
                            ),
                        ],
                    );
                });
            })
            .build();
    }
}

/// The hardware conventions' health instruments (`hw.status`, `hw.errors`, `hw.power`,
/// `hw.energy`, `hw.gpu.memory.utilization`) and XID errors per container. A figure the backend
/// can't read is left out, not reported as 0.
#[expect(
    clippy::too_many_lines,
    reason = "One instrument after another, as in `register`"
)]
fn register_health(registry: &mut Registry<'_>, gpus: &Arc<Vec<Gpu>>, published: &Published) {
    type Pick = fn(&gpuwarden_agent_api::GpuHealthView) -> Option<f64>;
    let gauges: [(&Instrument, Pick); 2] = [
        (&instruments::HW_GPU_MEMORY_UTILIZATION, |h| {
            h.memory_utilization
        }),
        (&instruments::HW_POWER, |h| h.power_watts),
    ];
    for (instrument, pick) in gauges {
        let (gpus, published) = (Arc::clone(gpus), Arc::clone(published));
        registry
            .f64_gauge(instrument)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for gpu in gpus.iter() {
                        if let Some(v) = gpu.health(s).and_then(pick) {
                            o.observe(v, &gpu.attributes);
                        }
                    }
                });
            })
            .build();
    }
    {
        let (gpus, published) = (Arc::clone(gpus), Arc::clone(published));
        registry
            .f64_counter(&instruments::HW_ENERGY)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for gpu in gpus.iter() {
                        if let Some(v) = gpu.health(s).and_then(|h| h.energy_joules) {
                            o.observe(v, &gpu.attributes);
                        }
                    }
                });
            })
            .build();
    }
    {
        let (gpus, published) = (Arc::clone(gpus), Arc::clone(published));
        registry
            .u64_gauge(&instruments::HW_STATUS)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for gpu in gpus.iter() {
                        let Some(h) = gpu.health(s) else { continue };
                        for state in HealthState::ALL {
                            o.observe(
                                u64::from(h.state == state.as_str()),
                                &gpu.with([
                                    KeyValue::new("hw.type", "gpu"),
                                    KeyValue::new("hw.state", state.as_str()),
                                ]),
                            );
                        }
                    }
                });
            })
            .build();
    }
    {
        let (gpus, published) = (Arc::clone(gpus), Arc::clone(published));
        registry
            .u64_counter(&instruments::HW_ERRORS)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for gpu in gpus.iter() {
                        let Some(h) = gpu.health(s) else { continue };
                        for (kind, n) in &h.errors {
                            o.observe(
                                *n,
                                &gpu.with([
                                    KeyValue::new("hw.type", "gpu"),
                                    KeyValue::new("error.type", kind.clone()),
                                ]),
                            );
                        }
                    }
                });
            })
            .build();
    }
    {
        let (gpus, published) = (Arc::clone(gpus), Arc::clone(published));
        registry
            .u64_counter(&instruments::CONTAINER_GPU_ERRORS)
            .with_callback(move |o| {
                with_snapshot(&published, |s| {
                    for c in &s.containers {
                        for (device, n) in &c.xid_errors {
                            let Some(index) = gpu_index(&gpus, device) else {
                                continue;
                            };
                            let mut attrs = container_attributes(c);
                            attrs.push(KeyValue::new("gpuwarden.gpu.index", i64::from(index)));
                            if let Some(gpu) = gpus.iter().find(|g| g.device.index == index) {
                                attrs.push(KeyValue::new("hw.id", gpu.device.uuid.clone()));
                            }
                            attrs.push(KeyValue::new("error.type", "xid"));
                            o.observe(*n, &attrs);
                        }
                    }
                });
            })
            .build();
    }
}

pub mod instruments;
pub mod share_watch;

#[cfg(test)]
mod tests;
