//! The maps' counters, named: per cgroup, its processes and, per device, its ioctls by class and
//! the GPU memory it holds; and the programs' own statistics.

use std::collections::{BTreeMap, HashMap};

use gpuwarden_agent_common::{
    maps::{TableUse, family, memory_kind, stat, table, table_held},
    nvidia::{esc, uvm},
};

use super::maps::TelemetryMaps;

/// The name an ioctl counter is reported under.
#[must_use]
pub(crate) fn ioctl_class(family_id: u32, cmd: u32) -> String {
    match family_id {
        family::RM => esc::name(cmd).map_or_else(|| format!("rm_{cmd:#04x}"), str::to_owned),
        family::UVM => uvm::name(cmd).map_or_else(|| format!("uvm_{cmd}"), str::to_owned),
        other => format!("family{other}_{cmd}"),
    }
}

/// One cgroup's counters.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct CgroupCounters {
    /// Processes holding GPU fds, sorted.
    pub pids: Vec<u32>,
    /// Per device: ioctl counts by class, and GPU memory held.
    pub devices: BTreeMap<u32, (BTreeMap<String, u64>, u64)>,
    /// Host memory allocated or pinned for the GPUs.
    pub system_bytes: u64,
    /// Managed (UVM) memory mapped.
    pub managed_bytes: u64,
    /// Its entries in the tables it can grow, and its refusals past their budgets.
    pub tables: TableUse,
}

impl CgroupCounters {
    /// GPU ioctls over every device and class.
    pub(crate) fn ioctls(&self) -> u64 {
        self.devices
            .values()
            .flat_map(|(classes, _)| classes.values())
            .fold(0, |a, n| a.saturating_add(*n))
    }
}

/// Everything the maps count, at one moment.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Counters {
    /// By cgroup id.
    pub cgroups: HashMap<u64, CgroupCounters>,
    /// The programs' statistics (`stat::*` index → sum over CPUs).
    pub stats: BTreeMap<u32, u64>,
    /// Entries in the GPU fd table.
    pub tracked_fds: u64,
    /// Entries in the process table.
    pub tracked_processes: u64,
    /// Entries in the allocation table.
    pub tracked_allocations: u64,
    /// Allocations of ended processes that their client's open file still holds (orphans).
    pub orphaned_allocations: u64,
}

impl Counters {
    /// The statistic at `index` (`stat::*`).
    pub(crate) fn stat(&self, index: u32) -> u64 {
        self.stats.get(&index).copied().unwrap_or(0)
    }
}

/// One cgroup's counters on one device: ioctls by class, and bytes held.
fn device(
    cgroups: &mut HashMap<u64, CgroupCounters>,
    cgroup: u64,
    device: u32,
) -> &mut (BTreeMap<String, u64>, u64) {
    cgroups
        .entry(cgroup)
        .or_default()
        .devices
        .entry(device)
        .or_default()
}

/// Reads every counter.
pub(crate) fn read(maps: &TelemetryMaps) -> Counters {
    let mut cgroups: HashMap<u64, CgroupCounters> = HashMap::new();
    let procs = maps.procs.entries();
    for (tgid, info) in &procs {
        cgroups.entry(info.cgroup).or_default().pids.push(*tgid);
    }
    for (key, n) in maps.ioctl_counts.entries() {
        *device(&mut cgroups, key.cgroup, key.device)
            .0
            .entry(ioctl_class(key.family, key.cmd))
            .or_default() += n;
    }
    for (key, bytes) in maps.cgroup_memory.entries() {
        match key.kind {
            memory_kind::SYSTEM => cgroups.entry(key.cgroup).or_default().system_bytes = bytes,
            memory_kind::MANAGED => cgroups.entry(key.cgroup).or_default().managed_bytes = bytes,
            _ => device(&mut cgroups, key.cgroup, key.device).1 = bytes,
        }
    }
    for (cgroup, mut tables) in maps.cgroup_tables.entries() {
        // Only cgroups with something else to show: a cgroup is not listed for its budgets alone.
        if let Some(c) = cgroups.get_mut(&cgroup) {
            let released = maps.cgroup_tables_released.get(&cgroup).unwrap_or_default();
            for which in 0..table::COUNT {
                tables.used[which] = table_held(&tables, &released, which);
            }
            c.tables = tables;
        }
    }
    for c in cgroups.values_mut() {
        c.pids.sort_unstable();
    }
    let stats = [
        stat::RINGBUF_DROPS,
        stat::FD_TABLE_FULL,
        stat::HANDLE_TABLE_FULL,
        stat::PROC_TABLE_FULL,
        stat::DECODE_ERRORS,
        stat::GPU_IOCTLS,
        stat::BUDGET_REFUSED,
    ]
    .into_iter()
    .map(|i| (i, maps.stats.get(&i).unwrap_or(0)))
    .collect();
    Counters {
        cgroups,
        stats,
        tracked_fds: maps.gpu_fds.keys().len() as u64,
        tracked_processes: procs.len() as u64,
        tracked_allocations: maps.allocations.keys().len() as u64,
        orphaned_allocations: maps
            .clients
            .entries()
            .iter()
            .map(|(_, c)| u64::from(c.orphans))
            .sum(),
    }
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
