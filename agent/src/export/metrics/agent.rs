//! The agent's own instruments: its link to the controller, its kernel side (ring buffer, tables,
//! hook tiers), the kubelet requests, and the compute-share signal per device.

use gpuwarden_agent_api::SignalView;
use gpuwarden_runtime::instrument::Registry;
use opentelemetry::KeyValue;

use super::{Published, Row, instruments, on_snapshot};

/// The signal's figures, in seconds or as counts, where known.
const SIGNAL: [Row<SignalView, f64>; 4] = [
    (&instruments::GPU_SIGNAL_PERIOD, |v| {
        v.period_us.map(|us| us as f64 / 1e6)
    }),
    (&instruments::GPU_SIGNAL_JITTER, |v| {
        v.jitter_us.map(|us| us as f64 / 1e6)
    }),
    (&instruments::GPU_SIGNAL_UNATTRIBUTED, |v| {
        Some(v.unattributed_ms as f64 / 1000.0)
    }),
    (&instruments::GPU_SIGNAL_LATE_SAMPLES, |v| {
        Some(v.late_samples as f64)
    }),
];

/// Builds the agent's own instruments on `registry`.
pub(super) fn register(registry: &mut Registry<'_>, published: &Published) {
    registry
        .u64_gauge(&instruments::AGENT_CONTROLLER_CONNECTED)
        .with_callback(on_snapshot(published, |s, o| {
            if let Some(up) = s.stats.controller_connected {
                o.observe(u64::from(up), &[]);
            }
        }))
        .build();
    for (instrument, pick) in SIGNAL {
        registry
            .f64_gauge(instrument)
            .with_callback(on_snapshot(published, move |s, o| {
                for v in &s.throttle_signals {
                    if let Some(value) = pick(v) {
                        o.observe(
                            value,
                            &[KeyValue::new("gpuwarden.device", v.device.clone())],
                        );
                    }
                }
            }))
            .build();
    }
    registry
        .u64_counter(&instruments::AGENT_RINGBUF_DROPS)
        .with_callback(on_snapshot(published, |s, o| {
            o.observe(s.stats.ringbuf_drops, &[]);
        }))
        .build();
    registry
        .u64_gauge(&instruments::AGENT_MAP_ENTRIES)
        .with_callback(on_snapshot(published, |s, o| {
            for (map, n) in [
                ("fds", s.stats.tracked_fds),
                ("processes", s.stats.tracked_processes),
                ("allocations", s.stats.tracked_allocations),
            ] {
                o.observe(n, &[KeyValue::new("gpuwarden.map", map)]);
            }
        }))
        .build();
    registry
        .u64_counter(&instruments::AGENT_KUBELET_REQUESTS)
        .with_callback(on_snapshot(published, |s, o| {
            for (result, n) in s.kubelet.iter().flat_map(|k| &k.requests) {
                o.observe(*n, &[KeyValue::new("gpuwarden.result", result.clone())]);
            }
        }))
        .build();
    hook_tier(registry, published);
}

/// `gpuwarden.agent.hook.tier`: 1 for the tiers in use (`none` where there is none).
fn hook_tier(registry: &mut Registry<'_>, published: &Published) {
    let tier = |t: &Option<String>| t.clone().unwrap_or_else(|| "none".to_owned());
    registry
        // Not "1": Prometheus would read that as a ratio (`_ratio`).
        .u64_gauge(&instruments::AGENT_HOOK_TIER)
        .with_callback(on_snapshot(published, move |s, o| {
            o.observe(
                1,
                &[
                    KeyValue::new("gpuwarden.tier", tier(&s.tier)),
                    KeyValue::new("gpuwarden.memory_tier", tier(&s.memory_tier)),
                ],
            );
        }))
        .build();
}
