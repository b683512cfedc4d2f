//! OTLP metrics of the controller: the queue, decisions, sessions, nodes, capacity and
//! fragmentation, pushed to a collector.
//!
//! Configured like the agent's (`OTEL_EXPORTER_OTLP_ENDPOINT` and the other `OTEL_*`
//! variables, read by the OpenTelemetry SDK); off, saying so once, without an endpoint. Gauges
//! read the scheduler at export time on the SDK's own thread; decision latency is recorded as
//! each scheduling pass decides. Failed exports are counted
//! (`gpuwarden.telemetry.exports.failed`), the controller never waits for the collector.
//! Refusals for identity (`gpuwarden.auth.denied`) are counted from the start, metrics on or
//! off, and read at export time; so are refusals for a bound (`gpuwarden.limits.refused`), by
//! the [`Bounds`] the server was given.

use std::{collections::BTreeMap, sync::Arc};

use gpuwarden_runtime::otlp::{Exporters, Pipeline, PipelineError};
use opentelemetry::KeyValue;

use crate::{
    auth::{
        denials::{self, DenialReason},
        followed::{self, ConfigFile},
    },
    controller::Controller,
    limits::{Bounds, Refusal},
    node::NodeState,
    scheduler::Scheduler,
    session::SessionState,
};

/// One instrument: (name, unit, attributes, meaning).
pub type Instrument = (&'static str, &'static str, &'static str, &'static str);

/// Every instrument the controller exports, as documented in docs/metrics.md.
pub const INSTRUMENTS: &[Instrument] = &[
    (
        "gpuwarden.controller.leader",
        "{leader}",
        "—",
        "1 while this controller leads, 0 while it stands by (always 1 on sled)",
    ),
    (
        "gpuwarden.controller.insecure",
        "1",
        "—",
        "1 while this controller serves plain text beyond loopback (`--insecure`), else 0",
    ),
    (
        "gpuwarden.controller.terms",
        "{term}",
        "—",
        "times this controller took office",
    ),
    (
        "gpuwarden.scheduler.queue.length",
        "{session}",
        "—",
        "sessions waiting to be placed",
    ),
    (
        "gpuwarden.scheduler.decision.duration",
        "s",
        "gpuwarden.placed",
        "time to decide one pending session in a scheduling pass",
    ),
    (
        "gpuwarden.sessions",
        "{session}",
        "gpuwarden.session.state, gpuwarden.session.origin",
        "sessions by state and origin (`controller`, or `dra` for Kubernetes claims the agents prepared)",
    ),
    (
        "gpuwarden.session.start.duration",
        "s",
        "gpuwarden.session.origin",
        "time from a session's creation to RUNNING (its agent confirmed the quota), recorded as this controller hears of it",
    ),
    (
        "gpuwarden.session.compute.entitled",
        "1",
        "gpuwarden.session.id, gpuwarden.session.class, gpuwarden.node, gpuwarden.compute.policy",
        "a running session's compute share per GPU (its shares over its GPUs)",
    ),
    (
        "gpuwarden.session.compute.achieved",
        "1",
        "gpuwarden.session.id, gpuwarden.session.class, gpuwarden.node, gpuwarden.compute.policy",
        "a running session's GPU time per wall second per GPU, the mean of its agent's usage reports so far (from the second report on)",
    ),
    (
        "gpuwarden.nodes",
        "{node}",
        "gpuwarden.node.state",
        "nodes by state",
    ),
    (
        "gpuwarden.slot.capacity",
        "{slot}",
        "gpuwarden.slot",
        "capacity of the ready nodes per slot type (bytes for byte slots)",
    ),
    (
        "gpuwarden.slot.allocated",
        "{slot}",
        "gpuwarden.slot",
        "what sessions hold per slot type on the ready nodes",
    ),
    (
        "gpuwarden.gpu.shares.fragmented",
        "{gpu}",
        "—",
        "free shares on partly used GPUs: capacity no 1.0-share request could use",
    ),
    (
        "gpuwarden.auth.denied",
        "{request}",
        "gpuwarden.auth.reason",
        "agent and client calls and TLS handshakes refused for their identity or permissions",
    ),
    (
        "gpuwarden.controller.config.unusable",
        "{version}",
        "gpuwarden.config.file",
        "versions of the token or grant file that changed and could not be used (a parse error, a deleted file): what they granted is withdrawn (token_file, grant_file)",
    ),
    (
        "gpuwarden.limits.refused",
        "{request}",
        "gpuwarden.limits.reason",
        "requests and agent messages refused or dropped for a bound (oversized, out_of_range, cap, flood, rate, foreign_session, flood_dropped)",
    ),
    (
        "gpuwarden.telemetry.exports.failed",
        "{export}",
        "—",
        "metric exports the collector did not take (dropped)",
    ),
];

/// The endpoint from the standard variables.
pub use gpuwarden_runtime::otlp::endpoint_from_env;

/// Capacity and allocation per slot type over the ready nodes.
fn slot_totals(s: &Scheduler) -> (BTreeMap<String, f64>, BTreeMap<String, f64>) {
    let (mut capacity, mut allocated) = (BTreeMap::new(), BTreeMap::new());
    for node in s.nodes().values().filter(|n| n.state == NodeState::Ready) {
        for (name, value) in node.capacity().iter() {
            *capacity.entry(name.to_string()).or_default() += value.as_f64();
        }
        for (name, value) in node.holding().iter() {
            *allocated.entry(name.to_string()).or_default() += value.as_f64();
        }
    }
    (capacity, allocated)
}

/// Free shares on GPUs that are partly used: what no whole-GPU (1.0-share) request could use.
#[must_use]
pub fn fragmented_shares(s: &Scheduler) -> f64 {
    s.nodes()
        .values()
        .filter(|n| n.state == NodeState::Ready)
        .flat_map(|n| n.allocator.devices())
        .filter(|d| !d.allocated.is_zero() && d.exclusive_owner.is_none())
        .map(|d| d.free().as_f64())
        .sum()
}

/// Each running session with a compute share: its attributes, its share per GPU, and the mean
/// of the utilization its agent reported (`None` before the first report).
fn compute_shares(s: &Scheduler) -> Vec<(Vec<KeyValue>, f64, Option<f64>)> {
    s.sessions()
        .values()
        .filter(|x| x.state == SessionState::Running && !x.allocation.parts.is_empty())
        .filter_map(|x| {
            let shares = x.allocation.shares().as_f64();
            if shares <= 0.0 {
                return None;
            }
            let per_gpu = shares / x.allocation.parts.len() as f64;
            // The usage reports' utilization is averaged over the session's GPUs, so it compares
            // with the share per GPU; the deciles' mean is the mean of the samples to 1/20.
            let achieved = (x.usage.samples > 0).then(|| {
                let deciles = x.usage.deciles();
                let n = deciles.len() as f64;
                deciles.iter().sum::<f64>() / n
            });
            let attrs = vec![
                KeyValue::new("gpuwarden.session.id", x.id.clone()),
                KeyValue::new("gpuwarden.session.class", x.class.clone()),
                KeyValue::new("gpuwarden.node", x.node.clone().unwrap_or_default()),
                KeyValue::new("gpuwarden.compute.policy", x.policy.compute.to_string()),
            ];
            Some((attrs, per_gpu, achieved))
        })
        .collect()
}

/// Records, for each session this controller hears turn RUNNING, the time since its creation.
/// Each session counts once (a running session changes again with its events); the ones that
/// ended are forgotten.
fn record_start_latency(
    controller: &Arc<Controller>,
    histogram: opentelemetry::metrics::Histogram<f64>,
) {
    use gpuwarden_proto::v1::SessionState as Pb;
    let controller = Arc::clone(controller);
    tokio::spawn(async move {
        let mut running = std::collections::HashSet::new();
        let mut changes = controller.subscribe();
        loop {
            // A term ended (or the watch fell behind): follow the next from now; what changed
            // between only misses samples.
            let Some(Ok(session)) = changes.recv().await else {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                changes = controller.subscribe();
                continue;
            };
            match Pb::try_from(session.state) {
                Ok(Pb::Running) => {
                    if running.insert(session.id.clone()) {
                        let secs =
                            (session.updated_at_ms - session.created_at_ms).max(0) as f64 / 1000.0;
                        histogram.record(
                            secs,
                            &[KeyValue::new("gpuwarden.session.origin", session.origin)],
                        );
                    }
                }
                // A lost session that comes back was already counted.
                Ok(Pb::Pending | Pb::Scheduled | Pb::Unspecified | Pb::Lost) | Err(_) => {}
                Ok(_) => {
                    running.remove(&session.id);
                }
            }
        }
    });
}

/// Starts exporting the controller's metrics, with the refusals counted by its `bounds`, to
/// `exporters`, or returns `None` (saying so) when it names none. Must run inside a tokio
/// runtime (the gRPC channel and the listener live there).
///
/// # Errors
/// The exporter can't be built, or the Prometheus address can't be bound.
#[expect(
    clippy::too_many_lines,
    reason = "one instrument after another, a few lines each"
)]
pub fn start(
    controller: &Arc<Controller>,
    bounds: &Arc<Bounds>,
    exporters: &Exporters,
) -> Result<Option<Pipeline>, PipelineError> {
    let Some(pipeline) = Pipeline::start(exporters, "gpuwarden-controller", Vec::new(), &[])?
    else {
        tracing::info!("metrics off: no OTEL_EXPORTER_OTLP_ENDPOINT and no prometheus_listen");
        return Ok(None);
    };
    let meter = pipeline.meter();
    controller.set_decision_histogram(
        meter
            .f64_histogram("gpuwarden.scheduler.decision.duration")
            .with_unit("s")
            .with_description("Time to decide one pending session in a scheduling pass")
            .with_boundaries(vec![
                1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1,
            ])
            .build(),
    );
    let role = controller.role().clone();
    meter
        .u64_observable_gauge("gpuwarden.controller.leader")
        .with_unit("{leader}")
        .with_description("1 while this controller leads, 0 while it stands by")
        .with_callback(move |o| o.observe(u64::from(role.is_leader()), &[]))
        .build();
    let served = Arc::clone(bounds);
    meter
        .u64_observable_gauge("gpuwarden.controller.insecure")
        .with_unit("1")
        .with_description("1 while this controller serves plain text beyond loopback (--insecure)")
        .with_callback(move |o| o.observe(u64::from(served.serving_insecure()), &[]))
        .build();
    let role = controller.role().clone();
    meter
        .u64_observable_counter("gpuwarden.controller.terms")
        .with_unit("{term}")
        .with_description("Times this controller took office (leadership changes it won)")
        .with_callback(move |o| o.observe(role.terms(), &[]))
        .build();
    let c = Arc::clone(controller);
    meter
        .u64_observable_gauge("gpuwarden.scheduler.queue.length")
        .with_unit("{session}")
        .with_description("Sessions waiting to be placed")
        .with_callback(move |o| {
            let n = c.read(|s| {
                s.sessions()
                    .values()
                    .filter(|x| x.state == SessionState::Pending)
                    .count()
            });
            o.observe(n as u64, &[]);
        })
        .build();
    let c = Arc::clone(controller);
    meter
        .u64_observable_gauge("gpuwarden.sessions")
        .with_unit("{session}")
        .with_description("Sessions by state and origin")
        .with_callback(move |o| {
            let by_state = c.read(|s| {
                let mut by: BTreeMap<(&'static str, &'static str), u64> = BTreeMap::new();
                for x in s.sessions().values() {
                    *by.entry((x.state.as_str(), x.origin.as_str())).or_default() += 1;
                }
                by
            });
            for ((state, origin), n) in by_state {
                o.observe(
                    n,
                    &[
                        KeyValue::new("gpuwarden.session.state", state),
                        KeyValue::new("gpuwarden.session.origin", origin),
                    ],
                );
            }
        })
        .build();
    record_start_latency(
        controller,
        meter
            .f64_histogram("gpuwarden.session.start.duration")
            .with_unit("s")
            .with_description("Time from a session's creation to RUNNING")
            .with_boundaries(vec![
                0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
            ])
            .build(),
    );
    for (name, description, entitled) in [
        (
            "gpuwarden.session.compute.entitled",
            "A running session's compute share per GPU",
            true,
        ),
        (
            "gpuwarden.session.compute.achieved",
            "A running session's GPU time per wall second per GPU, the mean of its usage reports",
            false,
        ),
    ] {
        let c = Arc::clone(controller);
        meter
            .f64_observable_gauge(name)
            .with_unit("1")
            .with_description(description)
            .with_callback(move |o| {
                for (attrs, share, achieved) in c.read(compute_shares) {
                    match (entitled, achieved) {
                        (true, _) => o.observe(share, &attrs),
                        (false, Some(achieved)) => o.observe(achieved, &attrs),
                        (false, None) => {}
                    }
                }
            })
            .build();
    }
    let c = Arc::clone(controller);
    meter
        .u64_observable_gauge("gpuwarden.nodes")
        .with_unit("{node}")
        .with_description("Nodes by state")
        .with_callback(move |o| {
            let (ready, lost) = c.read(|s| {
                let ready = s
                    .nodes()
                    .values()
                    .filter(|n| n.state == NodeState::Ready)
                    .count();
                (ready, s.nodes().len() - ready)
            });
            o.observe(
                ready as u64,
                &[KeyValue::new("gpuwarden.node.state", "ready")],
            );
            o.observe(
                lost as u64,
                &[KeyValue::new("gpuwarden.node.state", "lost")],
            );
        })
        .build();
    for (name, description, pick) in [
        (
            "gpuwarden.slot.capacity",
            "Capacity of the ready nodes per slot type",
            true,
        ),
        (
            "gpuwarden.slot.allocated",
            "What sessions hold per slot type on the ready nodes",
            false,
        ),
    ] {
        let c = Arc::clone(controller);
        meter
            .f64_observable_gauge(name)
            // Not "1": Prometheus would read that as a ratio (`_ratio`).
            .with_unit("{slot}")
            .with_description(description)
            .with_callback(move |o| {
                let (capacity, allocated) = c.read(slot_totals);
                for (slot, v) in if pick { capacity } else { allocated } {
                    o.observe(v, &[KeyValue::new("gpuwarden.slot", slot)]);
                }
            })
            .build();
    }
    let c = Arc::clone(controller);
    meter
        .f64_observable_gauge("gpuwarden.gpu.shares.fragmented")
        .with_unit("{gpu}")
        .with_description("Free shares on partly used GPUs")
        .with_callback(move |o| o.observe(c.read(fragmented_shares), &[]))
        .build();
    meter
        .u64_observable_counter("gpuwarden.auth.denied")
        .with_unit("{request}")
        .with_description(
            "Agent and client calls and TLS handshakes refused for their identity or permissions",
        )
        .with_callback(|o| {
            for reason in DenialReason::ALL {
                o.observe(
                    denials::count_of(reason),
                    &[KeyValue::new("gpuwarden.auth.reason", reason.as_str())],
                );
            }
        })
        .build();
    meter
        .u64_observable_counter("gpuwarden.controller.config.unusable")
        .with_unit("{version}")
        .with_description("Versions of the token or grant file that changed and could not be used")
        .with_callback(|o| {
            for file in ConfigFile::ALL {
                o.observe(
                    followed::unusable(file),
                    &[KeyValue::new("gpuwarden.config.file", file.as_str())],
                );
            }
        })
        .build();
    meter
        .u64_observable_counter("gpuwarden.limits.refused")
        .with_unit("{request}")
        .with_description("Requests and agent messages refused or dropped for a bound")
        .with_callback({
            let bounds = Arc::clone(bounds);
            move |o| {
                for reason in Refusal::ALL {
                    o.observe(
                        bounds.refusals().count_of(reason),
                        &[KeyValue::new("gpuwarden.limits.reason", reason.as_str())],
                    );
                }
            }
        })
        .build();
    if let Some(endpoint) = &exporters.otlp {
        tracing::info!(%endpoint, "exporting OTLP metrics");
    }
    if let Some(addr) = pipeline.prometheus_addr() {
        tracing::info!(%addr, "serving Prometheus metrics at /metrics");
    }
    Ok(Some(pipeline))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_docs_list_every_instrument() {
        let docs = include_str!("../../docs/metrics.md");
        for (name, unit, attributes, meaning) in INSTRUMENTS {
            let row = format!("| `{name}` | {unit} | {attributes} | {meaning} |");
            assert!(docs.contains(&row), "docs/metrics.md lacks the row\n{row}");
        }
        let section = docs
            .split("## Controller metrics")
            .nth(1)
            .and_then(|rest| rest.split("Both tables").next())
            .unwrap_or_default();
        let rows = section.lines().filter(|l| l.starts_with("| `")).count();
        assert_eq!(
            rows,
            INSTRUMENTS.len(),
            "docs/metrics.md lists metrics the controller lacks"
        );
    }
}
