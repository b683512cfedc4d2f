//! OTLP metrics of the controller: the queue, decisions, sessions, nodes, capacity and
//! fragmentation, pushed to a collector.
//!
//! Configured like the agent's (`OTEL_EXPORTER_OTLP_ENDPOINT` and the other `OTEL_*`
//! variables, read by the OpenTelemetry SDK); off, saying so once, without an endpoint. Gauges
//! read the scheduler at export time on the SDK's own thread; decision latency is recorded as
//! each scheduling pass decides. Failed exports are counted
//! (`gpuwarden.telemetry.exports.failed`), the controller never waits for the collector.
//! Refusals for identity (`gpuwarden.auth.denied`) and for a bound (`gpuwarden.limits.refused`)
//! are counted from the start, metrics on or off, by the [`Bounds`] the server was given, and
//! read at export time; so are the unusable versions of the files it follows
//! (`gpuwarden.controller.config.unusable`), by each [`FollowedFiles`] file.

use std::{collections::BTreeMap, sync::Arc};

use gpuwarden_runtime::{
    instrument::Registry,
    otlp::{Exporters, Pipeline, PipelineError},
};
use opentelemetry::KeyValue;

use crate::{
    auth::{denials::DenialReason, followed::ConfigFile, grants::GrantFile, tokens::TokenFile},
    hub::Hub,
    limits::{Bounds, Refusal},
    node::NodeState,
    scheduler::Scheduler,
    session::SessionState,
};

/// Every instrument the controller exports, each declared once: [`start`] builds them from these
/// constants (the pipeline builds `gpuwarden.telemetry.exports.failed`, declared with it), and
/// docs/metrics.md's "Controller metrics" table is checked against [`instruments::ALL`].
pub mod instruments {
    use gpuwarden_runtime::instrument::Instrument;

    /// `gpuwarden.controller.leader`.
    pub const CONTROLLER_LEADER: Instrument = Instrument {
        name: "gpuwarden.controller.leader",
        unit: "{leader}",
        attributes: "",
        meaning: "1 while this controller leads, 0 while it stands by (always 1 on sled)",
    };

    /// `gpuwarden.controller.insecure`.
    pub const CONTROLLER_INSECURE: Instrument = Instrument {
        name: "gpuwarden.controller.insecure",
        unit: "1",
        attributes: "",
        meaning: "1 while this controller serves plain text beyond loopback (`--insecure`), else 0",
    };

    /// `gpuwarden.controller.terms`.
    pub const CONTROLLER_TERMS: Instrument = Instrument {
        name: "gpuwarden.controller.terms",
        unit: "{term}",
        attributes: "",
        meaning: "times this controller took office",
    };

    /// `gpuwarden.scheduler.queue.length`.
    pub const SCHEDULER_QUEUE_LENGTH: Instrument = Instrument {
        name: "gpuwarden.scheduler.queue.length",
        unit: "{session}",
        attributes: "",
        meaning: "sessions waiting to be placed",
    };

    /// `gpuwarden.scheduler.decision.duration`.
    pub const SCHEDULER_DECISION_DURATION: Instrument = Instrument {
        name: "gpuwarden.scheduler.decision.duration",
        unit: "s",
        attributes: "gpuwarden.placed",
        meaning: "time to decide one pending session in a scheduling pass",
    };

    /// `gpuwarden.sessions`.
    pub const SESSIONS: Instrument = Instrument {
        name: "gpuwarden.sessions",
        unit: "{session}",
        attributes: "gpuwarden.session.state, gpuwarden.session.origin",
        meaning: "sessions by state and origin (`controller`, or `dra` for Kubernetes claims the agents prepared)",
    };

    /// `gpuwarden.session.start.duration`.
    pub const SESSION_START_DURATION: Instrument = Instrument {
        name: "gpuwarden.session.start.duration",
        unit: "s",
        attributes: "gpuwarden.session.origin",
        meaning: "time from a session's creation to RUNNING (its agent confirmed the quota), recorded as this controller hears of it",
    };

    /// `gpuwarden.session.compute.entitled`.
    pub const SESSION_COMPUTE_ENTITLED: Instrument = Instrument {
        name: "gpuwarden.session.compute.entitled",
        unit: "1",
        attributes: "gpuwarden.session.id, gpuwarden.session.class, gpuwarden.node, gpuwarden.compute.policy",
        meaning: "a running session's compute share per GPU (its shares over its GPUs)",
    };

    /// `gpuwarden.session.compute.achieved`.
    pub const SESSION_COMPUTE_ACHIEVED: Instrument = Instrument {
        name: "gpuwarden.session.compute.achieved",
        unit: "1",
        attributes: "gpuwarden.session.id, gpuwarden.session.class, gpuwarden.node, gpuwarden.compute.policy",
        meaning: "a running session's GPU time per wall second per GPU, the mean of its agent's usage reports so far (from the second report on)",
    };

    /// `gpuwarden.nodes`.
    pub const NODES: Instrument = Instrument {
        name: "gpuwarden.nodes",
        unit: "{node}",
        attributes: "gpuwarden.node.state",
        meaning: "nodes by state",
    };

    /// `gpuwarden.slot.capacity`.
    pub const SLOT_CAPACITY: Instrument = Instrument {
        name: "gpuwarden.slot.capacity",
        unit: "{slot}",
        attributes: "gpuwarden.slot",
        meaning: "capacity of the ready nodes per slot type (bytes for byte slots)",
    };

    /// `gpuwarden.slot.allocated`.
    pub const SLOT_ALLOCATED: Instrument = Instrument {
        name: "gpuwarden.slot.allocated",
        unit: "{slot}",
        attributes: "gpuwarden.slot",
        meaning: "what sessions hold per slot type on the ready nodes",
    };

    /// `gpuwarden.gpu.shares.fragmented`.
    pub const GPU_SHARES_FRAGMENTED: Instrument = Instrument {
        name: "gpuwarden.gpu.shares.fragmented",
        unit: "{gpu}",
        attributes: "",
        meaning: "free shares on partly used GPUs: capacity no 1.0-share request could use",
    };

    /// `gpuwarden.auth.denied`.
    pub const AUTH_DENIED: Instrument = Instrument {
        name: "gpuwarden.auth.denied",
        unit: "{request}",
        attributes: "gpuwarden.auth.reason",
        meaning: "agent and client calls and TLS handshakes refused for their identity or permissions",
    };

    /// `gpuwarden.controller.config.unusable`.
    pub const CONTROLLER_CONFIG_UNUSABLE: Instrument = Instrument {
        name: "gpuwarden.controller.config.unusable",
        unit: "{version}",
        attributes: "gpuwarden.config.file",
        meaning: "versions of the token or grant file that changed and could not be used (a parse error, a deleted file): what they granted is withdrawn (token_file, grant_file)",
    };

    /// `gpuwarden.limits.refused`.
    pub const LIMITS_REFUSED: Instrument = Instrument {
        name: "gpuwarden.limits.refused",
        unit: "{request}",
        attributes: "gpuwarden.limits.reason",
        meaning: "requests and agent messages refused or dropped for a bound (oversized, out_of_range, cap, flood, rate, foreign_session, flood_dropped)",
    };

    /// Every instrument, in the docs' order.
    pub const ALL: &[Instrument] = &[
        CONTROLLER_LEADER,
        CONTROLLER_INSECURE,
        CONTROLLER_TERMS,
        SCHEDULER_QUEUE_LENGTH,
        SCHEDULER_DECISION_DURATION,
        SESSIONS,
        SESSION_START_DURATION,
        SESSION_COMPUTE_ENTITLED,
        SESSION_COMPUTE_ACHIEVED,
        NODES,
        SLOT_CAPACITY,
        SLOT_ALLOCATED,
        GPU_SHARES_FRAGMENTED,
        AUTH_DENIED,
        CONTROLLER_CONFIG_UNUSABLE,
        LIMITS_REFUSED,
        gpuwarden_runtime::otlp::EXPORTS_FAILED,
    ];
}

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
fn record_start_latency(controller: &Arc<Hub>, histogram: opentelemetry::metrics::Histogram<f64>) {
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

/// The configuration files a server follows, each counting its own unusable versions.
#[derive(Clone, Default)]
pub struct FollowedFiles {
    /// The token file, if any.
    pub tokens: Option<Arc<TokenFile>>,
    /// The grant file (without one, nothing to count).
    pub grants: Arc<GrantFile>,
}

impl FollowedFiles {
    /// Versions of `file` that changed and could not be used; 0 for a file not followed.
    #[must_use]
    pub fn unusable(&self, file: ConfigFile) -> u64 {
        match file {
            ConfigFile::Tokens => self.tokens.as_ref().map_or(0, |t| t.unusable()),
            ConfigFile::Grants => self.grants.unusable(),
        }
    }
}

/// Starts exporting the controller's metrics, with the refusals counted by its `bounds` and
/// the unusable versions counted by its `files`, to `exporters`, or returns `None` (saying so)
/// when it names none. Must run inside a tokio runtime (the gRPC channel and the listener live
/// there).
///
/// # Errors
/// The exporter can't be built, or the Prometheus address can't be bound.
pub fn start(
    controller: &Arc<Hub>,
    bounds: &Arc<Bounds>,
    files: &FollowedFiles,
    exporters: &Exporters,
) -> Result<Option<Pipeline>, PipelineError> {
    let Some(pipeline) = Pipeline::start(exporters, "gpuwarden-controller", Vec::new(), &[])?
    else {
        tracing::info!("metrics off: no OTEL_EXPORTER_OTLP_ENDPOINT and no prometheus_listen");
        return Ok(None);
    };
    register(
        &mut Registry::new(pipeline.meter()),
        controller,
        bounds,
        files,
    );
    if let Some(endpoint) = &exporters.otlp {
        tracing::info!(%endpoint, "exporting OTLP metrics");
    }
    if let Some(addr) = pipeline.prometheus_addr() {
        tracing::info!(%addr, "serving Prometheus metrics at /metrics");
    }
    Ok(Some(pipeline))
}

/// Builds every instrument but the pipeline's own on `registry`: the controller's office, its
/// scheduling, the capacity it places on, and what it refused.
fn register(
    registry: &mut Registry<'_>,
    controller: &Arc<Hub>,
    bounds: &Arc<Bounds>,
    files: &FollowedFiles,
) {
    office(registry, controller, bounds);
    scheduling(registry, controller);
    capacity(registry, controller);
    refusals(registry, bounds, files);
}

/// Whether this controller leads, how often it took office, and whether it serves insecure.
fn office(registry: &mut Registry<'_>, controller: &Arc<Hub>, bounds: &Arc<Bounds>) {
    let role = controller.role().clone();
    registry
        .u64_gauge(&instruments::CONTROLLER_LEADER)
        .with_callback(move |o| o.observe(u64::from(role.is_leader()), &[]))
        .build();
    let served = Arc::clone(bounds);
    registry
        .u64_gauge(&instruments::CONTROLLER_INSECURE)
        .with_callback(move |o| o.observe(u64::from(served.serving_insecure()), &[]))
        .build();
    let role = controller.role().clone();
    registry
        .u64_counter(&instruments::CONTROLLER_TERMS)
        .with_callback(move |o| o.observe(role.terms(), &[]))
        .build();
}

/// The queue, the decisions, the sessions by state, how long they took to start, and the compute
/// each was entitled to against what it got.
fn scheduling(registry: &mut Registry<'_>, controller: &Arc<Hub>) {
    controller.set_decision_histogram(
        registry
            .f64_histogram(&instruments::SCHEDULER_DECISION_DURATION)
            .with_boundaries(vec![
                1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1,
            ])
            .build(),
    );
    let c = Arc::clone(controller);
    registry
        .u64_gauge(&instruments::SCHEDULER_QUEUE_LENGTH)
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
    registry
        .u64_gauge(&instruments::SESSIONS)
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
        registry
            .f64_histogram(&instruments::SESSION_START_DURATION)
            .with_boundaries(vec![
                0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
            ])
            .build(),
    );
    for (instrument, entitled) in [
        (&instruments::SESSION_COMPUTE_ENTITLED, true),
        (&instruments::SESSION_COMPUTE_ACHIEVED, false),
    ] {
        let c = Arc::clone(controller);
        registry
            .f64_gauge(instrument)
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
}

/// The nodes by state, the slots' capacity and allocation, and the shares left fragmented.
fn capacity(registry: &mut Registry<'_>, controller: &Arc<Hub>) {
    let c = Arc::clone(controller);
    registry
        .u64_gauge(&instruments::NODES)
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
    // Their unit is not "1": Prometheus would read that as a ratio (`_ratio`).
    for (instrument, pick) in [
        (&instruments::SLOT_CAPACITY, true),
        (&instruments::SLOT_ALLOCATED, false),
    ] {
        let c = Arc::clone(controller);
        registry
            .f64_gauge(instrument)
            .with_callback(move |o| {
                let (capacity, allocated) = c.read(slot_totals);
                for (slot, v) in if pick { capacity } else { allocated } {
                    o.observe(v, &[KeyValue::new("gpuwarden.slot", slot)]);
                }
            })
            .build();
    }
    let c = Arc::clone(controller);
    registry
        .f64_gauge(&instruments::GPU_SHARES_FRAGMENTED)
        .with_callback(move |o| o.observe(c.read(fragmented_shares), &[]))
        .build();
}

/// What was refused, by reason: callers for their identity, requests for a bound, and the
/// unusable versions of the files the server follows.
fn refusals(registry: &mut Registry<'_>, bounds: &Arc<Bounds>, files: &FollowedFiles) {
    registry
        .u64_counter(&instruments::AUTH_DENIED)
        .with_callback({
            let denials = Arc::clone(bounds.denials());
            move |o| {
                for reason in DenialReason::ALL {
                    o.observe(
                        denials.count_of(reason),
                        &[KeyValue::new("gpuwarden.auth.reason", reason.as_str())],
                    );
                }
            }
        })
        .build();
    registry
        .u64_counter(&instruments::CONTROLLER_CONFIG_UNUSABLE)
        .with_callback({
            let files = files.clone();
            move |o| {
                for file in ConfigFile::ALL {
                    o.observe(
                        files.unusable(file),
                        &[KeyValue::new("gpuwarden.config.file", file.as_str())],
                    );
                }
            }
        })
        .build();
    registry
        .u64_counter(&instruments::LIMITS_REFUSED)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_docs_list_every_instrument() {
        let docs = include_str!("../../docs/metrics.md");
        let problems = gpuwarden_runtime::instrument::undocumented(
            docs,
            "## Controller metrics",
            "Each metric is declared once",
            instruments::ALL,
        );
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    /// What `register` builds is the table, each once (the pipeline builds the last one).
    #[tokio::test]
    async fn every_instrument_is_registered_once_and_only_those() {
        let dir = tempfile::tempdir().unwrap();
        let spec = crate::store::StoreSpec::Sled(dir.path().join("store"));
        let config = crate::scheduler::SchedulerConfig::default();
        let controller = crate::server::open(&spec, config, crate::hub::Timing::default())
            .await
            .unwrap();
        let bounds = Bounds::new(crate::limits::Limits::default());
        let meter = opentelemetry::global::meter("test");
        let mut registry = Registry::new(&meter);
        register(
            &mut registry,
            &controller,
            &bounds,
            &FollowedFiles::default(),
        );
        let mut registered = registry.registered().to_vec();
        // The pipeline builds this one.
        registered.push(gpuwarden_runtime::otlp::EXPORTS_FAILED.name);
        let problems = gpuwarden_runtime::instrument::unregistered(&registered, instruments::ALL);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}
