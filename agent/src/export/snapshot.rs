//! Reading the sensor's maps into a [`Snapshot`]: the kernel side only counts; this names what
//! it counted (device nodes, ioctl classes, containers and their quotas).

use std::collections::{BTreeMap, HashMap};

use gpuwarden_agent_api::snapshot::{
    BindingView, Container, DeviceQuotaView, DeviceUsage, EnforcementView, GpuView, QuotaView,
    Snapshot, Stats,
};
use gpuwarden_agent_common::{
    maps::{MAX_GPUS, family, stat},
    nvidia::{esc, uvm},
};

use crate::{
    attribution::{Attributor, Workload},
    enforcement::{Binding, Enforcer},
    sensor::{Sensor, SensorMaps, device_nodes::device_name},
};

/// The name an ioctl counter is reported under.
#[must_use]
pub fn ioctl_class(family_id: u32, cmd: u32) -> String {
    match family_id {
        family::RM => esc::name(cmd).map_or_else(|| format!("rm_{cmd:#04x}"), str::to_owned),
        family::UVM => uvm::name(cmd).map_or_else(|| format!("uvm_{cmd}"), str::to_owned),
        other => format!("family{other}_{cmd}"),
    }
}

/// Per-cgroup counters gathered from the maps.
#[derive(Default)]
struct CgroupTotals {
    pids: Vec<u32>,
    devices: BTreeMap<u32, (BTreeMap<String, u64>, u64)>,
}

/// Builds the snapshot from the sensor's maps.
pub fn collect(
    sensor: &Sensor,
    enforcer: &Enforcer,
    attributor: &mut Attributor,
    node: &str,
    events_received: u64,
) -> Snapshot {
    let maps = &sensor.maps;
    let mut cgroups: HashMap<u64, CgroupTotals> = HashMap::new();
    // A workload with a quota is listed even while idle.
    for binding in enforcer.bindings().values() {
        if let Some(key) = binding.key {
            cgroups.entry(key).or_default();
        }
    }
    let mut tracked_processes = 0;
    for (tgid, info) in maps.procs.iter().flatten() {
        tracked_processes += 1;
        cgroups.entry(info.cgroup).or_default().pids.push(tgid);
    }
    for (key, per_cpu) in maps.ioctl_counts.iter().flatten() {
        let n: u64 = per_cpu.iter().sum();
        let device = cgroups
            .entry(key.cgroup)
            .or_default()
            .devices
            .entry(key.device)
            .or_default();
        *device
            .0
            .entry(ioctl_class(key.family, key.cmd))
            .or_default() += n;
    }
    for (key, bytes) in maps.cgroup_memory.iter().flatten() {
        let device = cgroups
            .entry(key.cgroup)
            .or_default()
            .devices
            .entry(key.device)
            .or_default();
        device.1 = bytes;
    }

    let mut containers: Vec<Container> = cgroups
        .into_iter()
        .map(|(id, mut totals)| {
            totals.pids.sort_unstable();
            let workload = attributor.resolve(id);
            let mut c = container(id, workload.as_deref(), totals);
            add_quota(&mut c, sensor, enforcer);
            c
        })
        .collect();
    containers.sort_by(|a, b| (&a.cgroup_path, a.cgroup_id).cmp(&(&b.cgroup_path, b.cgroup_id)));

    Snapshot {
        node: node.to_owned(),
        tier: sensor.probe.chosen.map(|t| t.as_str().to_owned()),
        hooks: sensor.hooks.clone(),
        probes: sensor.probe.candidates.clone(),
        containers,
        stats: Stats {
            ringbuf_drops: stat_sum(maps, stat::RINGBUF_DROPS),
            fd_table_full: stat_sum(maps, stat::FD_TABLE_FULL),
            handle_table_full: stat_sum(maps, stat::HANDLE_TABLE_FULL),
            proc_table_full: stat_sum(maps, stat::PROC_TABLE_FULL),
            decode_errors: stat_sum(maps, stat::DECODE_ERRORS),
            gpu_ioctls: stat_sum(maps, stat::GPU_IOCTLS),
            events_received,
            tracked_fds: maps.gpu_fds.keys().count() as u64,
            tracked_processes,
            tracked_allocations: maps.allocations.keys().count() as u64,
            // Filled in by the daemon, which keeps those counters.
            usage_reports: 0,
            usage_reports_dropped: 0,
        },
        memory_tier: Some(sensor.memory_tier.0.as_str().to_owned()),
        memory_tier_reason: Some(sensor.memory_tier.1.clone()),
        bindings: enforcer
            .bindings()
            .iter()
            .map(|(session, b)| BindingView {
                session_id: session.clone(),
                target: b.spec.target.to_string(),
                state: serde_json::to_value(b.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                cgroup_path: b.dir.as_deref().map(|d| enforcer.tree().relative(d)),
                quota: quota_view(b, sensor),
            })
            .collect(),
        gpus: Vec::new(),
        kubelet: None,
    }
}

/// Each GPU's utilization: `measured` where the backend reads one (NVML), else the throttle's
/// stand-in — the measured running fraction of every cgroup with a compute share of the GPU,
/// summed and clamped to 1 (with mock devices that is CPU time, not a GPU figure).
#[must_use]
pub fn gpu_utilization(
    indexes: &[u32],
    measured: Option<&BTreeMap<u32, f64>>,
    enforcer: &Enforcer,
) -> Vec<GpuView> {
    indexes
        .iter()
        .map(|&index| match measured {
            Some(measured) => GpuView {
                device: device_name(index),
                utilization: measured.get(&index).copied(),
                source: "nvml".to_owned(),
            },
            None => {
                let busy: f64 = enforcer
                    .bindings()
                    .values()
                    .filter(|b| {
                        b.spec
                            .devices
                            .iter()
                            .any(|d| d.index == index && d.shares_ppm > 0)
                    })
                    .filter_map(|b| b.key)
                    .filter_map(|key| enforcer.throttle().and_then(|t| t.stats(key)))
                    .map(|s| s.running_fraction)
                    .sum();
                GpuView {
                    device: device_name(index),
                    utilization: Some(busy.clamp(0.0, 1.0)),
                    source: "throttle_stand_in".to_owned(),
                }
            }
        })
        .collect()
}

/// The quota of a binding, with what the kernel side counts against it.
fn quota_view(b: &Binding, sensor: &Sensor) -> QuotaView {
    let kernel = b.key.and_then(|k| sensor.maps.quotas.get(&k, 0).ok());
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
                device: device_name(d.index),
                memory_bytes: d.memory_bytes,
                used_bytes: kernel.map_or(0, |q| q.used[d.index as usize % MAX_GPUS]),
                shares: f64::from(d.shares_ppm) / f64::from(crate::enforcement::quota::PPM),
            })
            .collect(),
    }
}

/// Fills a container's quota, enforcement and events from the binding it is mapped under.
fn add_quota(c: &mut Container, sensor: &Sensor, enforcer: &Enforcer) {
    let Some((session, b)) = enforcer
        .bindings()
        .iter()
        .find(|(_, b)| b.members().contains(&c.cgroup_id))
    else {
        return;
    };
    let kernel = b.key.and_then(|k| sensor.maps.quotas.get(&k, 0).ok());
    let throttled = b
        .key
        .and_then(|k| enforcer.throttle().and_then(|t| t.stats(k)));
    c.session_id = Some(session.clone());
    c.quota = Some(quota_view(b, sensor));
    c.enforcement = Some(EnforcementView {
        tier: sensor.memory_tier.0.as_str().to_owned(),
        actions: kernel.map_or(0, |q| q.actions),
        denied_opens: kernel.map_or(0, |q| q.denied_opens),
        throttled_ms: throttled.map_or(0, |t| {
            u64::try_from(t.throttled.as_millis()).unwrap_or(u64::MAX)
        }),
        frozen: throttled.is_some_and(|t| t.frozen),
    });
    c.events = enforcer
        .history()
        .filter(|r| &r.session_id == session)
        .cloned()
        .collect();
}

fn container(id: u64, workload: Option<&Workload>, totals: CgroupTotals) -> Container {
    let devices = totals
        .devices
        .into_iter()
        .map(|(device, (ioctls, memory_bytes))| DeviceUsage {
            device: device_name(device),
            ioctls,
            memory_bytes,
        })
        .collect();
    match workload {
        Some(w) => Container {
            container_id: w.container_id.clone(),
            runtime: w.runtime.as_str().to_owned(),
            pod_uid: w.pod_uid.clone(),
            pod_name: None,
            pod_namespace: None,
            qos: w.qos.map(|q| q.as_str().to_owned()),
            cgroup_path: w.cgroup_path.clone(),
            cgroup_id: id,
            pids: totals.pids,
            devices,
            session_id: None,
            quota: None,
            enforcement: None,
            events: Vec::new(),
        },
        // The cgroup is gone (or never was v2): say so rather than guess.
        None => Container {
            container_id: None,
            runtime: "unknown".to_owned(),
            pod_uid: None,
            pod_name: None,
            pod_namespace: None,
            qos: None,
            cgroup_path: format!("<cgroup {id} not found>"),
            cgroup_id: id,
            pids: totals.pids,
            devices,
            session_id: None,
            quota: None,
            enforcement: None,
            events: Vec::new(),
        },
    }
}

fn stat_sum(maps: &SensorMaps, index: u32) -> u64 {
    maps.stats
        .get(&index, 0)
        .map(|per_cpu| per_cpu.iter().sum())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_ioctl_classes() {
        assert_eq!(ioctl_class(family::RM, esc::RM_ALLOC), "rm_alloc");
        assert_eq!(ioctl_class(family::RM, esc::RM_FREE), "rm_free");
        assert_eq!(ioctl_class(family::RM, 0x99), "rm_0x99");
        assert_eq!(ioctl_class(family::RM, 0x05), "rm_0x05");
        assert_eq!(ioctl_class(family::UVM, uvm::INITIALIZE), "uvm_initialize");
        assert_eq!(ioctl_class(family::UVM, 12), "uvm_12");
    }
}
