//! The agent's long-running tasks: event dispatch, map upkeep and usage reports.

use crate::devices::changes::{self, DeviceChangesRx};
use gpuwarden_runtime::sync::Lock as _;
use std::{sync::Arc, time::Duration};

use gpuwarden_agent_common::event::kind;

use crate::{
    config::AgentConfig,
    control::{
        UsageCounters,
        usage_report::{self, Reporter},
    },
    devices::GpuBackend,
    enforcement::EnforcerHandle,
    export::{Sources, TelemetryHandle, metrics},
    sensor::{
        events::{self, EventRing},
        gpu_nodes::DeviceNames,
    },
};

/// Reads the kernel's events and hands each to the stage it concerns: an exec re-reads the
/// process's fds (telemetry), an over-limit allocation or a refused open goes to enforcement.
/// Each is logged with its device named as `names` says.
pub(super) async fn dispatch_events(
    mut ring: EventRing,
    telemetry: TelemetryHandle,
    enforcer: EnforcerHandle,
    names: tokio::sync::watch::Receiver<DeviceNames>,
) {
    while let Some(batch) = events::next_batch(&mut ring).await {
        let mut execs = Vec::new();
        let names = names.borrow().clone();
        for e in &batch {
            events::log(e, &names);
            match e.kind {
                // The process lives on: telemetry keeps the GPU fds that survived the exec.
                kind::EXEC => execs.push(e.tgid),
                kind::QUOTA_EXCEEDED | kind::DEVICE_DENIED => enforcer.kernel_event(e),
                _ => {}
            }
        }
        if telemetry.events(batch.len() as u64, execs).await.is_err() {
            return;
        }
    }
}

/// Writes the device list to the programs' MIG instance table again each time the link says it
/// changed (an instance made or destroyed), through the telemetry task that owns the sensor,
/// and passes on the names the instances are reported under. Changes told while one is being
/// written are written once.
pub(super) async fn follow_devices(
    mut changes: DeviceChangesRx,
    telemetry: TelemetryHandle,
    backend: Arc<dyn GpuBackend>,
    names: tokio::sync::watch::Sender<DeviceNames>,
) {
    while let Some(waiting) = changes.next().await {
        let Ok(now) = telemetry
            .set_devices(backend.devices(), backend.caps_major())
            .await
        else {
            return;
        };
        names.send_replace(now);
        changes::done(waiting);
    }
}

/// How often the GPU files the programs kept for a holder they don't follow are swept (the
/// garbage collection sweeps too): the longest a released file's memory stays counted.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Keeps the maps tidy and the published snapshot fresh: rescans the GPU device nodes (and
/// cross-checks NVML's memory counts), collects garbage, publishes for metrics.
pub(super) async fn upkeep(
    telemetry: TelemetryHandle,
    config: AgentConfig,
    backend: Arc<dyn GpuBackend>,
    enforcer: EnforcerHandle,
    published: Option<metrics::Published>,
    sources: Arc<Sources>,
) {
    // Metrics read the latest snapshot; publishing once a second keeps it fresh for any
    // export interval without the exporter ever waiting on telemetry.
    let mut publish = tokio::time::interval(Duration::from_secs(1));
    let mut rescan = tokio::time::interval(config.rescan_interval);
    let mut gc = tokio::time::interval(config.gc_interval);
    // Files kept past their last tracked fd (a process's own mappings hold them at its exit
    // tracepoint from kernel 6.16 on) count their memory until a sweep sees them released.
    let mut sweep = tokio::time::interval(SWEEP_INTERVAL.min(config.gc_interval));
    let mut share_watch = metrics::share_watch::ShareWatch::default();
    loop {
        tokio::select! {
            _ = publish.tick(), if published.is_some() => {
                let mut snapshot = sources.snapshot().await;
                // A raised flag is also an event for the controller (`share_deviation`).
                for raised in share_watch.observe(&mut snapshot, std::time::Instant::now()) {
                    let reason = raised.reason();
                    enforcer.share_deviation(raised.session_id, raised.cgroup_path, reason);
                }
                if let Some(p) = &published {
                    *p.locked() = Some(snapshot);
                }
            }
            _ = rescan.tick() => {
                if telemetry.rescan().await.is_err() {
                    return;
                }
                // NVML's view of per-process memory, read apart from telemetry (it takes a while).
                let samples = backend.process_memory();
                if !samples.is_empty() {
                    enforcer.cross_check(samples);
                }
            }
            _ = gc.tick() => {
                if telemetry.collect_garbage().await.is_err() {
                    return;
                }
            }
            _ = sweep.tick() => {
                if telemetry.sweep_files().await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Sends what each session used over every `interval` to the controller link (see
/// `control::usage_report`). Enforcement and the maps are read first, the usage source after; a
/// full buffer drops the report rather than wait.
pub(super) async fn report_usage(
    telemetry: TelemetryHandle,
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
        let Ok(maps) = telemetry.counters().await else {
            return;
        };
        let readings = usage_report::read_sessions(&standing, &maps);
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
