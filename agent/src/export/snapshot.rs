//! Building the snapshot document: the sensor's counters, named and attributed to workloads,
//! joined with what enforcement holds, GPU utilization and pod names.

use std::collections::BTreeMap;

use gpuwarden_agent_api::{
    Accuracy, BindingView, Container, DeviceQuotaView, DeviceUsage, EnforcementView, GpuHealthView,
    GpuView, QuotaView, SignalView, Snapshot, Stats, TableBudget,
};
use gpuwarden_agent_common::maps::{MAX_GPUS, stat, table};

use crate::{
    attribution::{Attributor, Workload, kubelet::PodNames},
    devices::{DriverMemory, health::GpuHealth},
    enforcement::{BindingReport, Standing, quota::PPM},
    sensor::{CgroupCounters, Counters, Sensor, gpu_nodes::DeviceNames},
};

/// Builds the snapshot from the sensor's counters and enforcement's standing.
pub(crate) fn build(
    sensor: &Sensor,
    counters: Counters,
    standing: &Standing,
    attributor: &mut Attributor,
    node: &str,
    events_received: u64,
) -> Snapshot {
    let stats = Stats {
        ringbuf_drops: counters.stat(stat::RINGBUF_DROPS),
        fd_table_full: counters.stat(stat::FD_TABLE_FULL),
        handle_table_full: counters.stat(stat::HANDLE_TABLE_FULL),
        proc_table_full: counters.stat(stat::PROC_TABLE_FULL),
        decode_errors: counters.stat(stat::DECODE_ERRORS),
        gpu_ioctls: counters.stat(stat::GPU_IOCTLS),
        events_received,
        tracked_fds: counters.tracked_fds,
        tracked_processes: counters.tracked_processes,
        tracked_allocations: counters.tracked_allocations,
        orphaned_allocations: counters.orphaned_allocations,
        budget_refused: counters.stat(stat::BUDGET_REFUSED),
        // Filled in by the daemon, which keeps those counters.
        usage_reports: 0,
        usage_reports_dropped: 0,
        events_suppressed: standing.suppressed_events,
        controller_connected: None,
    };
    let mut cgroups = counters.cgroups;
    // A workload with a quota is listed even while idle.
    for binding in &standing.bindings {
        if let Some(key) = binding.key {
            cgroups.entry(key).or_default();
        }
    }
    let tier = sensor.memory_tier().0.as_str();
    let names = sensor.device_names();
    let mut containers: Vec<Container> = cgroups
        .into_iter()
        .map(|(id, totals)| {
            let workload = attributor.resolve(id);
            let mut c = container(id, workload.as_deref(), totals, names);
            add_quota(&mut c, standing, tier, names);
            c
        })
        .collect();
    containers.sort_by(|a, b| (&a.cgroup_path, a.cgroup_id).cmp(&(&b.cgroup_path, b.cgroup_id)));

    Snapshot {
        node: node.to_owned(),
        tier: sensor.probe().chosen.map(|t| t.as_str().to_owned()),
        hooks: sensor.hooks().to_vec(),
        probes: sensor.probe().candidates.clone(),
        containers,
        stats,
        memory_tier: Some(tier.to_owned()),
        memory_tier_reason: Some(sensor.memory_tier().1.to_owned()),
        bindings: standing
            .bindings
            .iter()
            .map(|b| BindingView {
                session_id: b.session_id.clone(),
                target: b.spec.target.to_string(),
                state: serde_json::to_value(b.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                cgroup_path: b.cgroup_path.clone(),
                quota: quota_view(b, names),
            })
            .collect(),
        gpus: Vec::new(),
        kubelet: None,
        accuracy: accuracy(),
        throttle_mode: standing.throttle_mode.map(str::to_owned),
        throttle_signals: standing
            .signals
            .iter()
            .map(|(gpu, h)| SignalView {
                device: names.name(*gpu),
                period_us: h.period.map(micros),
                jitter_us: h.jitter.map(micros),
                samples: h.samples,
                late_samples: h.late_samples,
                gaps: h.gaps,
                unattributed_ms: u64::try_from(h.unattributed.as_millis()).unwrap_or(u64::MAX),
                read_max_us: micros(h.read_max),
                read_mean_us: micros(h.read_mean),
                time_only: h.time_only,
            })
            .collect(),
    }
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Which figures are exact and which are bounds (docs/accounting.md says the same at length).
const ACCURACY: &[(&str, &str, &str)] = &[
    (
        "devices.memory_bytes",
        "exact",
        "video memory the driver allocated (RM_ALLOC, RM_VID_HEAP_CONTROL), at the size it wrote \
         back; device \"unknown\" when the GPU of a device handle made before the agent started \
         can't be told; allocations made before the agent started are not seen",
    ),
    (
        "system_memory_bytes",
        "exact",
        "host memory allocated or pinned for the GPUs (NV01_MEMORY_SYSTEM, RM_ALLOC_MEMORY, \
         OS descriptors): not video memory",
    ),
    (
        "managed_memory_bytes",
        "bound",
        "managed (UVM) memory mapped: the most a process may place on a GPU; how much is \
         resident in video memory is the UVM driver's and not seen; a mapping is released when \
         unmapped from its start or when its process ends",
    ),
    (
        "quota.devices.used_bytes",
        "exact",
        "the video memory the kernel side counted against the quota (device-unknown bytes are \
         checked against the sum of the quota's limits)",
    ),
    (
        "devices.ioctls",
        "exact",
        "ioctls on tracked GPU fds, by escape or UVM command",
    ),
];

fn accuracy() -> Vec<Accuracy> {
    ACCURACY
        .iter()
        .map(|(figure, accuracy, note)| Accuracy {
            figure: (*figure).to_owned(),
            accuracy: (*accuracy).to_owned(),
            note: (*note).to_owned(),
        })
        .collect()
}

/// Each GPU's utilization: `measured` where the backend reads one (NVML), else the throttle's
/// stand-in — the measured running fraction of every cgroup with a compute share of the GPU,
/// summed and clamped to 1 (with mock devices that is CPU time, not a GPU figure). Each is
/// named as `names` says.
pub(crate) fn gpu_utilization(
    indexes: &[u32],
    names: &DeviceNames,
    measured: Option<&BTreeMap<u32, f64>>,
    standing: &Standing,
) -> Vec<GpuView> {
    indexes
        .iter()
        .map(|&index| {
            if let Some(measured) = measured {
                GpuView {
                    device: names.name(index),
                    utilization: measured.get(&index).copied(),
                    source: "nvml".to_owned(),
                    ..GpuView::default()
                }
            } else {
                let busy: f64 = standing
                    .bindings
                    .iter()
                    .filter(|b| {
                        b.spec
                            .devices
                            .iter()
                            .any(|d| d.index == index && d.shares_ppm > 0)
                    })
                    .filter_map(|b| b.throttle)
                    .map(|s| s.running_fraction)
                    .sum();
                GpuView {
                    device: names.name(index),
                    utilization: Some(busy.clamp(0.0, 1.0)),
                    source: "throttle_stand_in".to_owned(),
                    ..GpuView::default()
                }
            }
        })
        .collect()
}

/// Fills each GPU's memory: the kernel side's count (the containers' bytes on it, summed) and,
/// where the backend reads it, the driver's (`driver`, by index), the GPUs found by the names
/// `names` gives them.
pub(crate) fn add_memory(
    snapshot: &mut Snapshot,
    driver: &BTreeMap<u32, DriverMemory>,
    names: &DeviceNames,
) {
    for g in &mut snapshot.gpus {
        g.memory_bytes = snapshot
            .containers
            .iter()
            .flat_map(|c| &c.devices)
            .filter(|d| d.device == g.device)
            .map(|d| d.memory_bytes)
            .sum();
    }
    for (&index, m) in driver {
        let device = names.name(index);
        if let Some(g) = snapshot.gpus.iter_mut().find(|g| g.device == device) {
            g.driver_memory_bytes = Some(m.used);
            g.driver_reserved_bytes = Some(m.reserved);
        }
    }
}

/// Fills each GPU's health, and counts each attributed XID error on the container whose cgroup
/// it names (the GPUs found by the names `names` gives them).
pub(crate) fn add_health(snapshot: &mut Snapshot, health: &[GpuHealth], names: &DeviceNames) {
    for h in health {
        let device = names.name(h.index);
        let mut errors = BTreeMap::new();
        errors.insert("xid".to_owned(), h.xids.len() as u64);
        if let Some(n) = h.ecc_corrected {
            errors.insert("ecc_corrected".to_owned(), n);
        }
        if let Some(n) = h.ecc_uncorrected {
            errors.insert("ecc_uncorrected".to_owned(), n);
        }
        let view = GpuHealthView {
            state: h.state.as_str().to_owned(),
            power_watts: h.power_watts,
            energy_joules: h.energy_joules,
            memory_utilization: h.memory_utilization,
            errors,
        };
        if let Some(g) = snapshot.gpus.iter_mut().find(|g| g.device == device) {
            g.health = Some(view);
        }
        for xid in &h.xids {
            let Some(cgroup) = &xid.cgroup else { continue };
            if let Some(c) = snapshot
                .containers
                .iter_mut()
                .find(|c| &c.cgroup_path == cgroup)
            {
                *c.xid_errors.entry(device.clone()).or_default() += 1;
            }
        }
    }
}

/// Fills the pod name and namespace of every container whose pod the kubelet named, and the
/// kubelet's status.
pub(crate) fn annotate_pods(snapshot: &mut Snapshot, pods: &PodNames) {
    let Some(status) = pods.status() else {
        return;
    };
    for c in &mut snapshot.containers {
        if let Some(pod) = c.pod_uid.as_deref().and_then(|uid| pods.lookup(uid)) {
            c.pod_name = Some(pod.name);
            c.pod_namespace = Some(pod.namespace);
        }
    }
    snapshot.kubelet = Some(status);
}

/// The quota of a binding, with what the kernel side counts against it.
fn quota_view(b: &BindingReport, names: &DeviceNames) -> QuotaView {
    QuotaView {
        memory_bytes: b.spec.memory_bytes(),
        shares: b.spec.shares(),
        policy: b.spec.memory_policy.as_str().to_owned(),
        compute_policy: b.spec.compute_policy.as_str().to_owned(),
        devices: b
            .spec
            .devices
            .iter()
            .map(|d| DeviceQuotaView {
                device: names.name(d.index),
                memory_bytes: d.memory_bytes,
                used_bytes: b.kernel.map_or(0, |q| q.used[d.index as usize % MAX_GPUS]),
                shares: f64::from(d.shares_ppm) / f64::from(PPM),
            })
            .collect(),
    }
}

/// Fills a container's quota, enforcement and events from the binding it is mapped under.
fn add_quota(c: &mut Container, standing: &Standing, tier: &str, names: &DeviceNames) {
    let Some(b) = standing
        .bindings
        .iter()
        .find(|b| b.members.contains(&c.cgroup_id))
    else {
        return;
    };
    c.session_id = Some(b.session_id.clone());
    c.quota = Some(quota_view(b, names));
    c.enforcement = Some(EnforcementView {
        // The driver's own limit, where it holds this workload's, is the tier that refuses.
        tier: b.driver_tier.unwrap_or(tier).to_owned(),
        actions: b.kernel.map_or(0, |q| q.actions),
        denied_opens: b.kernel.map_or(0, |q| q.denied_opens),
        throttled_ms: b.throttle.map_or(0, |t| {
            u64::try_from(t.throttled.as_millis()).unwrap_or(u64::MAX)
        }),
        frozen: b.throttle.is_some_and(|t| t.frozen),
        achieved: b.throttle.map(|t| t.running_fraction),
        // Set by the metrics' share watch, which sees the snapshots over time.
        deviation: None,
        gpu_time_ms: b.throttle.map_or(0, |t| {
            u64::try_from(t.gpu_time.as_millis()).unwrap_or(u64::MAX)
        }),
        #[expect(
            clippy::cast_possible_truncation,
            reason = "a ledger of seconds, in ms"
        )]
        ledger_ms: b
            .throttle
            .and_then(|t| t.balance)
            .map(|s| (s * 1000.0).round() as i64),
    });
    c.events = standing
        .history
        .iter()
        .filter(|r| r.session_id == b.session_id)
        .cloned()
        .collect();
}

/// The per-cgroup budgets the programs were loaded with.
fn sensor_budgets() -> [u32; table::COUNT] {
    gpuwarden_agent_common::config::Config::DEFAULT.budgets
}

fn container(
    id: u64,
    workload: Option<&Workload>,
    totals: CgroupCounters,
    names: &DeviceNames,
) -> Container {
    let devices = totals
        .devices
        .into_iter()
        .map(|(device, (ioctls, memory_bytes))| DeviceUsage {
            device: names.name(device),
            ioctls,
            memory_bytes,
        })
        .collect();
    let budgets = sensor_budgets();
    let tables = (0..table::COUNT)
        .map(|i| TableBudget {
            table: table::NAMES[i].to_owned(),
            used: totals.tables.used[i],
            budget: u64::from(budgets[i]),
            refused: totals.tables.refused[i],
        })
        .collect();
    let base = Container {
        cgroup_id: id,
        tables,
        pids: totals.pids,
        devices,
        system_memory_bytes: totals.system_bytes,
        managed_memory_bytes: totals.managed_bytes,
        ..Container::default()
    };
    match workload {
        Some(w) => Container {
            container_id: w.container_id.clone(),
            runtime: w.runtime.as_str().to_owned(),
            pod_uid: w.pod_uid.clone(),
            qos: w.qos.map(|q| q.as_str().to_owned()),
            cgroup_path: w.cgroup_path.clone(),
            ..base
        },
        // The cgroup is gone (or never was v2): say so rather than guess.
        None => Container {
            runtime: "unknown".to_owned(),
            cgroup_path: format!("<cgroup {id} not found>"),
            ..base
        },
    }
}

#[cfg(test)]
mod tests;
