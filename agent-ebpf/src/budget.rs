//! Per-cgroup budgets of the tables a container can grow (fds, processes, clients,
//! allocations, device objects, managed mappings), so no container fills a table every other
//! container relies on.
//!
//! An entry is charged to the cgroup its process is charged to; past the cgroup's budget
//! (`Config::budgets`) the entry is refused and counted, with one event the first time. What a
//! refusal costs the container is in docs/accounting.md ("Budgets"): an fd past the budget is
//! still told at its ioctl; while a bound container is at its budget of processes, clients or
//! allocations, its allocations are acted on by its memory policy, since their bytes could go
//! uncounted.
//! The programs count entries as they add and remove them (`CGROUP_TABLES`); the entries the
//! agent removes itself (of processes that died unseen, stale handles) it counts apart
//! (`CGROUP_TABLES_RELEASED`), so each side writes only its own counts.

use gpuwarden_agent_common::{
    event::{Event, kind},
    maps::{TableReleased, TableUse, stat, table},
};

use crate::{
    atomic::atomic_add,
    config,
    events::{count, emit},
    maps::{CGROUP_TABLES, CGROUP_TABLES_RELEASED},
};

/// What the agent removed of `cgroup`'s entries in `which`.
#[inline(always)]
fn released(cgroup: u64, which: usize) -> u64 {
    // SAFETY: the value is copied out at once.
    unsafe { CGROUP_TABLES_RELEASED.get(cgroup) }
        .and_then(|r: &TableReleased| r.released.get(which).copied())
        .unwrap_or(0)
}

/// Entries `cgroup` holds in `which`, given its counts at `entry`.
///
/// # Safety
/// `entry` must point to a live `CGROUP_TABLES` value.
#[inline(always)]
unsafe fn held(entry: *const TableUse, cgroup: u64, which: usize) -> u64 {
    // SAFETY: guaranteed by the caller.
    let used = unsafe { (*entry).used.get(which).copied() }.unwrap_or(0);
    used.saturating_sub(released(cgroup, which))
}

/// Takes one entry of `table` for `cgroup`; false (counted, reported the first time) when the
/// cgroup is at its budget. A cgroup the budget table has no room for is let through: the
/// tables it would guard are bounded by the budgets of the cgroups it holds.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "`which` is below the table count, a handful"
)]
pub fn take(cgroup: u64, which: usize) -> bool {
    // Callers pass a `table` constant; the check lets the verifier see every index in bounds.
    if which >= table::COUNT {
        return true;
    }
    let budget = u64::from(config().budgets[which]);
    let entry = if let Some(p) = CGROUP_TABLES.get_ptr_mut(cgroup) {
        p
    } else {
        let _ = CGROUP_TABLES.insert(cgroup, TableUse::default(), 1);
        match CGROUP_TABLES.get_ptr_mut(cgroup) {
            Some(p) => p,
            None => return true,
        }
    };
    // SAFETY: a live map value; the index is in bounds.
    unsafe {
        if held(entry, cgroup, which) >= budget {
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
    if which >= table::COUNT {
        return;
    }
    if let Some(entry) = CGROUP_TABLES.get_ptr_mut(cgroup) {
        // SAFETY: a live map value; the index is in bounds. An entry the programs never
        // counted (seeded by the agent from /proc) may take it to zero: never wrap.
        unsafe {
            if (*entry).used[which] != 0 {
                atomic_add(&raw mut (*entry).used[which], u64::MAX);
            }
        }
    }
}

/// Whether `cgroup` is at its budget of processes, clients, allocations or device objects: the
/// allocation about to be made (or its process's or client's entry) would be refused and its
/// bytes could go uncounted, or be counted on no GPU (its device object unknown), so a bound
/// cgroup's allocation is acted on by its policy instead.
#[inline(always)]
pub fn exhausted(cgroup: u64) -> bool {
    let budgets = config().budgets;
    CGROUP_TABLES.get_ptr(cgroup).is_some_and(|entry| {
        // SAFETY: a live map value.
        unsafe {
            held(entry, cgroup, table::PROCS) >= u64::from(budgets[table::PROCS])
                || held(entry, cgroup, table::CLIENTS) >= u64::from(budgets[table::CLIENTS])
                || held(entry, cgroup, table::ALLOCATIONS) >= u64::from(budgets[table::ALLOCATIONS])
                || held(entry, cgroup, table::OBJECTS) >= u64::from(budgets[table::OBJECTS])
        }
    })
}

/// Whether `cgroup` is at its budget of GPU fds (the device program then refuses it GPU opens).
#[inline(always)]
pub fn fds_exhausted(cgroup: u64) -> bool {
    let budget = u64::from(config().budgets[table::FDS]);
    CGROUP_TABLES.get_ptr(cgroup).is_some_and(|entry| {
        // SAFETY: a live map value.
        unsafe { held(entry, cgroup, table::FDS) >= budget }
    })
}
