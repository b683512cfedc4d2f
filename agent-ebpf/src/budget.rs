//! Per-cgroup budgets of the tables a container can grow (fds, processes, clients,
//! allocations), so no container fills a table every other container relies on.
//!
//! An entry is charged to the cgroup its process is charged to; past the cgroup's budget
//! (`Config::budgets`) the entry is refused and counted, with one event the first time. What a
//! refusal costs the container is in docs/accounting.md ("Budgets"): an fd past the budget is
//! still told at its ioctl; while a bound container is at its budget of processes, clients or
//! allocations, its allocations are acted on by its memory policy, since their bytes could go
//! uncounted.
//! The programs count entries as they add and remove them; the agent recounts from the tables
//! at each upkeep pass (entries it removes itself, and removals the programs can't attribute).

use gpuwarden_agent_common::{
    event::{Event, kind},
    maps::{TableUse, stat, table},
};

use crate::{
    config,
    events::{count, emit},
    maps::CGROUP_TABLES,
    memory::atomic_add,
};

/// Takes one entry of `table` for `cgroup`; false (counted, reported the first time) when the
/// cgroup is at its budget. A cgroup the budget table has no room for is let through: the
/// tables it would guard are bounded by the budgets of the cgroups it holds.
#[inline(always)]
pub fn take(cgroup: u64, which: usize) -> bool {
    let which = which & (table::COUNT - 1);
    let budget = u64::from(config().budgets[which]);
    let entry = match CGROUP_TABLES.get_ptr_mut(&cgroup) {
        Some(p) => p,
        None => {
            let _ = CGROUP_TABLES.insert(&cgroup, &TableUse::default(), 1);
            match CGROUP_TABLES.get_ptr_mut(&cgroup) {
                Some(p) => p,
                None => return true,
            }
        }
    };
    // SAFETY: a live map value; the index is in bounds.
    unsafe {
        if (*entry).used[which] >= budget {
            let first = (*entry).refused[which] == 0;
            atomic_add(&raw mut (*entry).refused[which], 1);
            count(stat::BUDGET_REFUSED);
            // One event (the agent logs it), not one per refusal.
            if first {
                emit(Event {
                    kind: kind::TABLE_BUDGET,
                    cgroup,
                    code: which as u32,
                    limit: budget,
                    ..Event::default()
                });
            }
            return false;
        }
        atomic_add(&raw mut (*entry).used[which], 1);
    }
    true
}

/// Gives back one entry of `table` for `cgroup`.
#[inline(always)]
pub fn give(cgroup: u64, which: usize) {
    let which = which & (table::COUNT - 1);
    if let Some(entry) = CGROUP_TABLES.get_ptr_mut(&cgroup) {
        // SAFETY: a live map value; the index is in bounds. A count the agent's recount lowered
        // meanwhile may already be zero: never wrap.
        unsafe {
            if (*entry).used[which] != 0 {
                atomic_add(&raw mut (*entry).used[which], u64::MAX);
            }
        }
    }
}

/// Whether `cgroup` is at its budget of processes, clients or allocations: the allocation about
/// to be made (or its process's or client's entry) would be refused and its bytes could go
/// uncounted, so a bound cgroup's allocation is acted on by its policy instead.
#[inline(always)]
pub fn exhausted(cgroup: u64) -> bool {
    let budgets = config().budgets;
    CGROUP_TABLES.get_ptr(&cgroup).is_some_and(|entry| {
        // SAFETY: a live map value.
        unsafe {
            (*entry).used[table::PROCS] >= u64::from(budgets[table::PROCS])
                || (*entry).used[table::CLIENTS] >= u64::from(budgets[table::CLIENTS])
                || (*entry).used[table::ALLOCATIONS] >= u64::from(budgets[table::ALLOCATIONS])
        }
    })
}

/// Whether `cgroup` is at its budget of GPU fds (the device program then refuses it GPU opens).
#[inline(always)]
pub fn fds_exhausted(cgroup: u64) -> bool {
    let budget = u64::from(config().budgets[table::FDS]);
    CGROUP_TABLES.get_ptr(&cgroup).is_some_and(|entry| {
        // SAFETY: a live map value.
        unsafe { (*entry).used[table::FDS] >= budget }
    })
}
