//! The GPUs' instruments, named by the hardware conventions (`hw.*`): memory, utilization and
//! health, one series per GPU with its attributes. A figure the backend can't read is left out,
//! not reported as 0.

use std::sync::Arc;

use gpuwarden_agent_api::{GpuHealthView, Snapshot};
use gpuwarden_runtime::instrument::Registry;
use opentelemetry::{KeyValue, metrics::AsyncInstrument};

use super::{Gpu, Published, Row, instruments, on_snapshot};
use crate::devices::health::HealthState;

/// The health figures exported as gauges as they are read.
const HEALTH_GAUGES: [Row<GpuHealthView, f64>; 2] = [
    (&instruments::HW_GPU_MEMORY_UTILIZATION, |h| {
        h.memory_utilization
    }),
    (&instruments::HW_POWER, |h| h.power_watts),
];

/// Builds the GPUs' instruments on `registry`.
pub(super) fn register(registry: &mut Registry<'_>, gpus: &Arc<Vec<Gpu>>, published: &Published) {
    memory_limit(registry, gpus);
    memory_usage(registry, gpus, published);
    utilization(registry, gpus, published);
    driver_memory(registry, gpus, published);
    for (instrument, pick) in HEALTH_GAUGES {
        registry
            .f64_gauge(instrument)
            .with_callback(on_snapshot(published, each_health(gpus, pick)))
            .build();
    }
    registry
        .f64_counter(&instruments::HW_ENERGY)
        .with_callback(on_snapshot(
            published,
            each_health(gpus, |h| h.energy_joules),
        ))
        .build();
    status(registry, gpus, published);
    errors(registry, gpus, published);
}

/// Observes `pick` of each GPU's health, leaving out a GPU where it is unknown.
fn each_health(
    gpus: &Arc<Vec<Gpu>>,
    pick: fn(&GpuHealthView) -> Option<f64>,
) -> impl Fn(&Snapshot, &dyn AsyncInstrument<f64>) + Send + Sync + 'static {
    let gpus = Arc::clone(gpus);
    move |s, o| {
        for gpu in gpus.iter() {
            if let Some(v) = gpu.health(s).and_then(pick) {
                o.observe(v, &gpu.attributes);
            }
        }
    }
}

/// `hw.gpu.memory.limit`: each GPU's memory, from the device list (no snapshot needed).
fn memory_limit(registry: &mut Registry<'_>, gpus: &Arc<Vec<Gpu>>) {
    let gpus = Arc::clone(gpus);
    registry
        .u64_gauge(&instruments::HW_GPU_MEMORY_LIMIT)
        .with_callback(move |o| {
            for gpu in gpus.iter() {
                o.observe(gpu.device.memory_bytes, &gpu.attributes);
            }
        })
        .build();
}

/// `hw.gpu.memory.usage`: the bytes every container holds on each GPU, summed.
fn memory_usage(registry: &mut Registry<'_>, gpus: &Arc<Vec<Gpu>>, published: &Published) {
    let gpus = Arc::clone(gpus);
    registry
        .u64_gauge(&instruments::HW_GPU_MEMORY_USAGE)
        .with_callback(on_snapshot(published, move |s, o| {
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
        }))
        .build();
}

/// `gpuwarden.gpu.memory.driver_usage` and `gpuwarden.gpu.memory.unseen`: the driver's count
/// of each GPU's memory and how far the kernel side's is from it, where the driver's is read.
fn driver_memory(registry: &mut Registry<'_>, gpus: &Arc<Vec<Gpu>>, published: &Published) {
    let both = |s: &Snapshot, gpu: &Gpu| {
        let name = gpu.name();
        let g = s.gpus.iter().find(|g| g.device == name)?;
        Some((g.driver_memory_bytes?, g.memory_bytes))
    };
    let each = Arc::clone(gpus);
    registry
        .u64_gauge(&instruments::GPU_MEMORY_DRIVER_USAGE)
        .with_callback(on_snapshot(published, move |s, o| {
            for gpu in each.iter() {
                if let Some((driver, _)) = both(s, gpu) {
                    o.observe(driver, &gpu.attributes);
                }
            }
        }))
        .build();
    let each = Arc::clone(gpus);
    registry
        .f64_gauge(&instruments::GPU_MEMORY_UNSEEN)
        .with_callback(on_snapshot(published, move |s, o| {
            for gpu in each.iter() {
                if let Some((driver, kernel)) = both(s, gpu) {
                    #[expect(
                        clippy::cast_precision_loss,
                        reason = "bytes of one GPU: exact below 2^53"
                    )]
                    let unseen = driver as f64 - kernel as f64;
                    o.observe(unseen, &gpu.attributes);
                }
            }
        }))
        .build();
}

/// `hw.gpu.utilization`, with where the figure came from.
fn utilization(registry: &mut Registry<'_>, gpus: &Arc<Vec<Gpu>>, published: &Published) {
    let gpus = Arc::clone(gpus);
    registry
        .f64_gauge(&instruments::HW_GPU_UTILIZATION)
        .with_callback(on_snapshot(published, move |s, o| {
            for gpu in gpus.iter() {
                let name = gpu.name();
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
        }))
        .build();
}

/// `hw.status`: 1 for each GPU's state, 0 for the others.
fn status(registry: &mut Registry<'_>, gpus: &Arc<Vec<Gpu>>, published: &Published) {
    let gpus = Arc::clone(gpus);
    registry
        .u64_gauge(&instruments::HW_STATUS)
        .with_callback(on_snapshot(published, move |s, o| {
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
        }))
        .build();
}

/// `hw.errors`: each GPU's errors by type.
fn errors(registry: &mut Registry<'_>, gpus: &Arc<Vec<Gpu>>, published: &Published) {
    let gpus = Arc::clone(gpus);
    registry
        .u64_counter(&instruments::HW_ERRORS)
        .with_callback(on_snapshot(published, move |s, o| {
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
        }))
        .build();
}
