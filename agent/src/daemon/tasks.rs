//! The agent's long-running tasks: event dispatch, map upkeep and usage reports.

use std::{path::Path, sync::Arc, time::Duration};

use gpuwarden_agent_common::event::kind;

use crate::{
    config::AgentConfig,
    control::{
        UsageCounters,
        usage_report::{self, Reporter},
    },
    devices::GpuBackend,
    enforcement::EnforcerHandle,
    export::{SharedTelemetry, Sources, Telemetry, lock, metrics},
    sensor::{
        events::{self, EventRing},
        upkeep,
    },
};

/// Where process information lives.
const PROC_ROOT: &str = "/proc";

/// Expands the globs, updates the path table, and seeds fds of newly watched paths.
pub(super) fn rescan_nodes(state: &mut Telemetry, config: &AgentConfig) {
    let expansion = config.gpu_globs.expand();
    if expansion.nodes == state.nodes {
        return;
    }
    if expansion.nodes.is_empty() {
        tracing::warn!(
            globs = %config.gpu_globs.as_slice().join(","),
            "no GPU device nodes match; watching for them to appear (no NVIDIA driver on this machine?)"
        );
    }
    for (path, why) in &expansion.skipped {
        tracing::warn!(path = %path.display(), "not watched: {why}");
    }
    let maps = state.sensor.maps_mut();
    let (added, removed) = upkeep::sync_paths(maps, &expansion.nodes);
    let (files_added, files_removed, match_inodes) = upkeep::sync_files(maps, &expansion.nodes);
    state.sensor.set_match_inodes(match_inodes);
    state.nodes = expansion.nodes;
    let seeded = upkeep::seed(
        state.sensor.maps_mut(),
        &state.nodes,
        &state.attributor,
        Path::new(PROC_ROOT),
        None,
    );
    tracing::info!(
        watched = state.nodes.len(),
        added,
        removed,
        files_added,
        files_removed,
        by_file = state.sensor.matches_by_file(),
        seeded_fds = seeded.fds,
        seeded_processes = seeded.processes,
        "GPU device nodes: {}",
        state
            .nodes
            .keys()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// Reads the kernel's events and hands each to the stage it concerns: an exec re-reads the
/// process's fds (telemetry), an over-limit allocation or a refused open goes to enforcement.
pub(super) async fn dispatch_events(
    mut ring: EventRing,
    telemetry: SharedTelemetry,
    enforcer: EnforcerHandle,
) {
    while let Some(batch) = events::next_batch(&mut ring).await {
        let mut t = lock(&telemetry);
        t.events_received += batch.len() as u64;
        for e in &batch {
            events::log(e);
            match e.kind {
                kind::EXEC => {
                    // The process lives on: keep the GPU fds that survived the exec.
                    let Telemetry {
                        sensor,
                        nodes,
                        attributor,
                        ..
                    } = &mut *t;
                    upkeep::reseed_after_exec(
                        sensor.maps_mut(),
                        nodes,
                        attributor,
                        Path::new(PROC_ROOT),
                        e.tgid,
                    );
                }
                kind::QUOTA_EXCEEDED | kind::DEVICE_DENIED => enforcer.kernel_event(e),
                _ => {}
            }
        }
    }
}

/// Keeps the maps tidy and the published snapshot fresh: rescans the GPU device nodes (and
/// cross-checks NVML's memory counts), collects garbage, publishes for metrics.
pub(super) async fn upkeep(
    telemetry: SharedTelemetry,
    config: AgentConfig,
    backend: Arc<dyn GpuBackend>,
    enforcer: EnforcerHandle,
    published: Option<metrics::Published>,
    sources: Arc<Sources>,
) {
    // Metrics read the latest snapshot; publishing once a second keeps it fresh for any
    // export interval without the exporter ever taking the state's lock.
    let mut publish = tokio::time::interval(Duration::from_secs(1));
    let mut rescan = tokio::time::interval(config.rescan_interval);
    let mut gc = tokio::time::interval(config.gc_interval);
    let mut share_watch = metrics::share_watch::ShareWatch::default();
    loop {
        tokio::select! {
            _ = publish.tick(), if published.is_some() => {
                let mut snapshot = sources.snapshot().await;
                share_watch.observe(&mut snapshot, std::time::Instant::now());
                if let Some(p) = &published {
                    *p.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(snapshot);
                }
            }
            _ = rescan.tick() => {
                rescan_nodes(&mut lock(&telemetry), &config);
                // NVML's view of per-process memory, read outside the lock (it takes a while).
                let samples = backend.process_memory();
                if !samples.is_empty() {
                    enforcer.cross_check(samples);
                }
            }
            _ = gc.tick() => {
                let mut guard = lock(&telemetry);
                let t = &mut *guard;
                let g = upkeep::collect_garbage(
                    t.sensor.maps_mut(),
                    &mut t.attributor,
                    &mut t.idle,
                    Path::new(PROC_ROOT),
                    std::time::Instant::now(),
                );
                if g != upkeep::Garbage::default() {
                    tracing::debug!(?g, "removed stale entries");
                }
            }
        }
    }
}

/// Sends what each session used over every `interval` to the controller link (see
/// `control::usage_report`). Enforcement and the maps are read first, the usage source after; a
/// full buffer drops the report rather than wait.
pub(super) async fn report_usage(
    telemetry: SharedTelemetry,
    enforcer: EnforcerHandle,
    mut reporter: Reporter,
    interval: Duration,
    upward: tokio::sync::mpsc::Sender<gpuwarden_proto::v1::SessionUsage>,
    counters: Arc<UsageCounters>,
) {
    let (poll, polls_per_report) = usage_report::poll_plan(interval);
    let mut ticker = tokio::time::interval(poll);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut polls = 0;
    loop {
        ticker.tick().await;
        polls += 1;
        let Ok((standing, _)) = enforcer.standing().await else {
            return;
        };
        if polls < polls_per_report {
            reporter.poll(&usage_report::bound_cgroups(&standing));
            continue;
        }
        polls = 0;
        let readings = {
            let counters = lock(&telemetry).sensor.counters();
            usage_report::read_sessions(&standing, &counters)
        };
        for usage in reporter.report(
            readings,
            std::time::Instant::now(),
            gpuwarden_types::now_ms(),
        ) {
            if upward.try_send(usage).is_err() {
                counters.count_dropped();
            }
        }
    }
}
