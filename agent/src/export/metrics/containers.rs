//! The containers' instruments (`gpuwarden.container.*`): what each holds and may hold on each
//! GPU, its compute share against what it got, and what enforcement did to it. Each series
//! carries the container's attributes ([`container_attributes`]).

use std::sync::Arc;

use gpuwarden_agent_api::{Container, EnforcementView, Snapshot};
use gpuwarden_runtime::instrument::Registry;
use opentelemetry::{KeyValue, metrics::AsyncInstrument};

use super::{
    Gpu, Published, Row, container_attributes, gpu_index, instruments, on_snapshot, share_watch,
};
use crate::sensor::gpu_nodes::node_name;

/// The bytes exported per container and GPU.
const BYTES: [Row<ContainerGpu, u64>; 2] = [
    (&instruments::CONTAINER_GPU_MEMORY_USAGE, |c| Some(c.used)),
    (&instruments::CONTAINER_GPU_MEMORY_LIMIT, |c| {
        c.quota.map(|(limit, _)| limit)
    }),
];

/// The counts of what enforcement did, exported as counters.
const ACTIONS: [Row<EnforcementView, u64>; 2] = [
    (&instruments::CONTAINER_ENFORCEMENT_ACTIONS, |e| {
        Some(e.actions)
    }),
    (&instruments::CONTAINER_ENFORCEMENT_DENIED_OPENS, |e| {
        Some(e.denied_opens)
    }),
];

/// The times the snapshot keeps in ms, exported in seconds as counters.
const TIMES: [Row<EnforcementView, f64>; 2] = [
    (&instruments::CONTAINER_THROTTLED, |e| {
        Some(e.throttled_ms as f64 / 1000.0)
    }),
    (&instruments::CONTAINER_GPU_TIME, |e| {
        Some(e.gpu_time_ms as f64 / 1000.0)
    }),
];

/// Builds the containers' instruments on `registry`.
pub(super) fn register(registry: &mut Registry<'_>, gpus: &Arc<Vec<Gpu>>, published: &Published) {
    xid_errors(registry, gpus, published);
    for (instrument, pick) in BYTES {
        registry
            .u64_gauge(instrument)
            .with_callback(on_snapshot(published, each_container_gpu(gpus, pick)))
            .build();
    }
    registry
        .f64_gauge(&instruments::CONTAINER_COMPUTE_SHARE)
        .with_callback(on_snapshot(
            published,
            each_container_gpu(gpus, |c| c.quota.map(|(_, share)| share)),
        ))
        .build();
    compute(registry, published);
    ioctls(registry, published);
    for (instrument, pick) in ACTIONS {
        registry
            .u64_counter(instrument)
            .with_callback(on_snapshot(published, each_enforced(pick)))
            .build();
    }
    for (instrument, pick) in TIMES {
        registry
            .f64_counter(instrument)
            .with_callback(on_snapshot(published, each_enforced(pick)))
            .build();
    }
    registry
        .f64_gauge(&instruments::CONTAINER_GPU_LEDGER)
        .with_callback(on_snapshot(
            published,
            each_enforced(|e| e.ledger_ms.map(|ms| ms as f64 / 1000.0)),
        ))
        .build();
    tables_refused(registry, published);
}

/// Observes `pick` of each container on each GPU it uses or holds a quota on, where known.
fn each_container_gpu<T: 'static>(
    gpus: &Arc<Vec<Gpu>>,
    pick: fn(&ContainerGpu) -> Option<T>,
) -> impl Fn(&Snapshot, &dyn AsyncInstrument<T>) + Send + Sync + 'static {
    let gpus = Arc::clone(gpus);
    move |s, o| {
        for c in container_gpus(s, &gpus) {
            if let Some(v) = pick(&c) {
                o.observe(v, &c.attrs);
            }
        }
    }
}

/// Observes `pick` of each container enforcement reports on, where known.
fn each_enforced<T: 'static>(
    pick: fn(&EnforcementView) -> Option<T>,
) -> impl Fn(&Snapshot, &dyn AsyncInstrument<T>) + Send + Sync + 'static {
    move |s, o| {
        for c in &s.containers {
            if let Some(v) = c.enforcement.as_ref().and_then(pick) {
                o.observe(v, &container_attributes(c));
            }
        }
    }
}

/// `gpuwarden.container.gpu.errors`: the XID errors attributed to each container, per GPU.
fn xid_errors(registry: &mut Registry<'_>, gpus: &Arc<Vec<Gpu>>, published: &Published) {
    let gpus = Arc::clone(gpus);
    registry
        .u64_counter(&instruments::CONTAINER_GPU_ERRORS)
        .with_callback(on_snapshot(published, move |s, o| {
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
        }))
        .build();
}

/// A container's compute share against what it got: `entitled`, `achieved`, and whether the
/// share watch flags it (`deviation`).
fn compute(registry: &mut Registry<'_>, published: &Published) {
    for (instrument, entitled) in [
        (&instruments::CONTAINER_COMPUTE_ENTITLED, true),
        (&instruments::CONTAINER_COMPUTE_ACHIEVED, false),
    ] {
        registry
            .f64_gauge(instrument)
            .with_callback(on_snapshot(published, move |s, o| {
                for c in &s.containers {
                    if let Some((share, achieved, attrs)) = entitled_and_achieved(c) {
                        o.observe(if entitled { share } else { achieved }, &attrs);
                    }
                }
            }))
            .build();
    }
    registry
        .u64_gauge(&instruments::CONTAINER_COMPUTE_DEVIATION)
        .with_callback(on_snapshot(published, |s, o| {
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
        }))
        .build();
}

/// `gpuwarden.container.ioctls`: GPU ioctls by device node and class.
fn ioctls(registry: &mut Registry<'_>, published: &Published) {
    registry
        .u64_counter(&instruments::CONTAINER_IOCTLS)
        .with_callback(on_snapshot(published, |s, o| {
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
        }))
        .build();
}

/// `gpuwarden.container.table.refused`: kernel-table entries refused, by table (those with none
/// left out).
fn tables_refused(registry: &mut Registry<'_>, published: &Published) {
    registry
        .u64_counter(&instruments::CONTAINER_TABLE_REFUSED)
        .with_callback(on_snapshot(published, |s, o| {
            for c in &s.containers {
                for t in c.tables.iter().filter(|t| t.refused != 0) {
                    let mut attrs = container_attributes(c);
                    attrs.push(KeyValue::new("gpuwarden.map", t.table.clone()));
                    o.observe(t.refused, &attrs);
                }
            }
        }))
        .build();
}

/// A container's entitled share and achieved GPU time (both the largest over its GPUs, so they
/// compare), with its attributes and compute policy; `None` without a compute share.
fn entitled_and_achieved(c: &Container) -> Option<(f64, f64, Vec<KeyValue>)> {
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
