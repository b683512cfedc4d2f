//! Keeping the maps tidy: the kernel side only counts; this module tells it which paths are
//! GPU device nodes, seeds the fd table with what processes opened before the programs were
//! attached, and removes what the kernel can't see go away: entries of processes that died while
//! nobody watched, counters of cgroups that were removed, and counters of cgroups that have
//! been idle (no process, no GPU memory, no new ioctl) for [`IDLE_TTL`] — such as what pinned
//! maps kept from an earlier run — so they age out of snapshots and `top`.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use gpuwarden_agent_common::maps::{
    CgroupDeviceKey, ClientInfo, FdInfo, FdKey, FileId, FileRefs, GpuNode, IoctlKey, MEMORY_SLOTS,
    PATH_LEN, PathKey, ProcInfo, kernel_dev, node_kind, table,
};

use super::maps::{MapError, TelemetryMaps};

/// What map upkeep asks of attribution (`attribution::Attributor` answers it): attribution comes
/// after the sensor on the data path, so upkeep names what it needs instead of importing it.
pub(crate) trait Cgroups {
    /// The id of process `pid`'s cgroup v2 cgroup; `None` when it can't be read (it exited).
    fn cgroup_of_pid(&self, pid: u32) -> Option<u64>;
    /// Forgets the cgroups that were removed.
    fn forget_dead(&mut self);
    /// Whether cgroup `id` still exists.
    fn exists(&mut self, id: u64) -> bool;
}

/// Makes the path table hold exactly `nodes`. Returns how many paths were added and removed.
pub(crate) fn sync_paths(
    maps: &mut TelemetryMaps,
    nodes: &BTreeMap<PathBuf, GpuNode>,
) -> (usize, usize) {
    let wanted: HashMap<PathKey, GpuNode> = nodes
        .iter()
        .filter_map(|(p, n)| path_key(p).map(|k| (k, *n)))
        .collect();
    let present: HashSet<PathKey> = maps.gpu_paths.keys().into_iter().collect();
    let mut removed = 0;
    for key in present.iter().filter(|k| !wanted.contains_key(k)) {
        if maps.gpu_paths.remove(key).is_ok() {
            removed += 1;
        }
    }
    let mut added = 0;
    for (key, node) in &wanted {
        if !present.contains(key) {
            match maps.gpu_paths.insert(*key, *node) {
                Ok(()) => added += 1,
                Err(e) => tracing::warn!("cannot watch a GPU path: {e}"),
            }
        }
    }
    (added, removed)
}

/// What identifies the file at `path` (following symlinks) as the programs see an opened file: a
/// device file by its device number, anything else by its file system's device and its inode.
#[must_use]
pub(crate) fn file_id(path: &Path) -> Option<FileId> {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let meta = std::fs::metadata(path).ok()?;
    let dev = |d: u64| kernel_dev(libc::major(d), libc::minor(d));
    Some(if meta.file_type().is_char_device() {
        FileId {
            dev: dev(meta.rdev()),
            _pad: 0,
            ino: 0,
        }
    } else {
        FileId {
            dev: dev(meta.dev()),
            _pad: 0,
            ino: meta.ino(),
        }
    })
}

/// The nodes by what identifies their files.
fn node_ids(nodes: &BTreeMap<PathBuf, GpuNode>) -> BTreeMap<FileId, GpuNode> {
    nodes
        .iter()
        .filter_map(|(p, n)| file_id(p).map(|id| (id, *n)))
        .collect()
}

/// Makes the file table hold exactly the files of `nodes`. Returns how many were added and
/// removed, and whether any node is not a device file (so the programs must match inodes too).
pub(crate) fn sync_files(
    maps: &mut TelemetryMaps,
    nodes: &BTreeMap<PathBuf, GpuNode>,
) -> (usize, usize, bool) {
    let wanted = node_ids(nodes);
    let present: HashSet<FileId> = maps.gpu_files.keys().into_iter().collect();
    let mut removed = 0;
    for key in present.iter().filter(|k| !wanted.contains_key(k)) {
        if maps.gpu_files.remove(key).is_ok() {
            removed += 1;
        }
    }
    let mut added = 0;
    for (key, node) in &wanted {
        if !present.contains(key) {
            match maps.gpu_files.insert(*key, *node) {
                Ok(()) => added += 1,
                Err(e) => tracing::warn!("cannot watch a GPU node: {e}"),
            }
        }
    }
    (added, removed, wanted.keys().any(|k| k.ino != 0))
}

/// The NUL-padded key of `path`, `None` if it is too long.
#[must_use]
pub(crate) fn path_key(path: &Path) -> Option<PathKey> {
    let bytes = path.as_os_str().as_encoded_bytes();
    if bytes.len() >= PATH_LEN {
        return None;
    }
    let mut key = PathKey {
        path: [0; PATH_LEN],
    };
    key.path[..bytes.len()].copy_from_slice(bytes);
    Some(key)
}

/// Monotonic clock in ns: the clock `bpf_ktime_get_ns` reads, for generation stamps.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// What [`seed`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SeedReport {
    /// GPU fds added to the table.
    pub(crate) fds: usize,
    /// Processes registered.
    pub processes: usize,
}

/// Adds GPU fds that processes opened before the programs were attached, from `/proc/*/fd`.
pub(crate) fn seed(
    maps: &mut TelemetryMaps,
    nodes: &BTreeMap<PathBuf, GpuNode>,
    cgroups: &impl Cgroups,
    proc_root: &Path,
    only: Option<u32>,
) -> SeedReport {
    let mut report = SeedReport::default();
    let pids: Vec<u32> = match only {
        Some(pid) => vec![pid],
        None => std::fs::read_dir(proc_root)
            .map(|dir| {
                dir.flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default(),
    };
    let ids = node_ids(nodes);
    for tgid in pids {
        let Ok(fds) = std::fs::read_dir(proc_root.join(tgid.to_string()).join("fd")) else {
            continue;
        };
        let mut found: Vec<(u32, GpuNode)> = Vec::new();
        for entry in fds.flatten() {
            let Some(fd) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            else {
                continue;
            };
            // The file the fd refers to, whatever path opened it; else the path it names.
            let by_file = file_id(&entry.path()).and_then(|id| ids.get(&id));
            let by_path = || {
                std::fs::read_link(entry.path())
                    .ok()
                    .and_then(|t| nodes.get(&t))
            };
            if let Some(node) = by_file.or_else(by_path) {
                found.push((fd, *node));
            }
        }
        if found.is_empty() {
            continue;
        }
        let max_fd = found.iter().map(|(fd, _)| *fd).max().unwrap_or(0);
        for (fd, node) in &found {
            // The programs learn the fd's open file at its first ioctl.
            let info = FdInfo {
                node: *node,
                file: 0,
            };
            // Only where absent: the programs may have tracked it meanwhile, with its file.
            if maps
                .gpu_fds
                .insert_new(FdKey { tgid, fd: *fd }, info)
                .is_ok()
            {
                report.fds += 1;
            }
        }
        if maps.procs.get(&tgid).is_none() {
            let Some(cgroup) = cgroups.cgroup_of_pid(tgid) else {
                continue;
            };
            let info = ProcInfo {
                cgroup,
                generation: monotonic_ns(),
                max_fd,
                gpu_nodes: gpu_nodes(found.iter().map(|(_, node)| *node)),
                vidmem: [0; MEMORY_SLOTS],
                sysmem: 0,
                managed: 0,
                outlived: 0,
                _pad: 0,
            };
            // Only where absent: the programs may have registered it meanwhile.
            if maps.procs.insert_new(tgid, info).is_ok() {
                report.processes += 1;
            }
        }
    }
    report
}

/// The `ProcInfo::gpu_nodes` bits of `nodes`: which GPUs' nodes a process holds, telling the GPU
/// of allocations under device handles made before the agent started.
pub(crate) fn gpu_nodes(nodes: impl IntoIterator<Item = GpuNode>) -> u32 {
    nodes
        .into_iter()
        .filter(|n| n.kind == node_kind::RM && n.device < 32)
        .fold(0, |bits, n| bits | 1 << n.device)
}

/// Whether process `tgid` exists.
fn alive(proc_root: &Path, tgid: u32) -> bool {
    proc_root.join(tgid.to_string()).exists()
}

/// How long a cgroup with no process and no GPU memory keeps its ioctl counters after they last
/// grew (they outlive its processes that long, then age out).
pub(crate) const IDLE_TTL: Duration = Duration::from_mins(5);

/// When each idle cgroup's ioctl total last changed.
#[derive(Debug, Default)]
pub(crate) struct Idle {
    seen: HashMap<u64, (u64, Instant)>,
}

impl Idle {
    /// Records `total` for idle `cgroup` at `now`; whether it has stayed unchanged past
    /// [`IDLE_TTL`].
    fn expired(&mut self, cgroup: u64, total: u64, now: Instant) -> bool {
        let entry = self.seen.entry(cgroup).or_insert((total, now));
        if entry.0 != total {
            *entry = (total, now);
        }
        now.saturating_duration_since(entry.1) >= IDLE_TTL
    }
}

/// What [`collect_garbage`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Garbage {
    /// fd-table entries of dead processes.
    pub(crate) fds: usize,
    /// Process entries of dead processes.
    pub processes: usize,
    /// Client, allocation and device-object entries whose owner is gone.
    pub handles: usize,
    /// Counter entries of removed cgroups.
    pub cgroups: usize,
}

/// Removes entries the kernel side can't see go stale: fds and processes of processes that died
/// unseen, handles of released clients, counters of removed cgroups, and counters of cgroups
/// idle for [`IDLE_TTL`] (see [`Idle`]).
pub(crate) fn collect_garbage(
    maps: &mut TelemetryMaps,
    cgroups: &mut impl Cgroups,
    idle: &mut Idle,
    proc_root: &Path,
    now: Instant,
) -> Garbage {
    let mut garbage = Garbage::default();
    // Entries removed here, by the cgroup they were counted against (see `release_tables`).
    let mut released: HashMap<u64, [u64; table::COUNT]> = HashMap::new();
    let mut release = |cgroup: u64, which: usize| released.entry(cgroup).or_default()[which] += 1;
    let procs: HashMap<u32, ProcInfo> = maps.procs.entries().into_iter().collect();
    let dead_fds: Vec<FdKey> = maps
        .gpu_fds
        .keys()
        .into_iter()
        .filter(|k| !alive(proc_root, k.tgid))
        .collect();
    for key in &dead_fds {
        if maps.gpu_fds.remove(key).is_ok() {
            garbage.fds += 1;
            if let Some(p) = procs.get(&key.tgid) {
                release(p.cgroup, table::FDS);
            }
        }
    }
    for (tgid, info) in &procs {
        if !alive(proc_root, *tgid) {
            if info.vidmem.iter().any(|b| *b != 0) {
                tracing::warn!(tgid, "process died unseen while holding GPU memory");
            }
            if maps.procs.remove(tgid).is_ok() {
                garbage.processes += 1;
                release(info.cgroup, table::PROCS);
            }
        }
    }
    // Each table is read before the one its entries depend on (an allocation or a device
    // object before its client, a file before the fds that refer to it), so an entry the
    // programs add during this pass is never judged against a read that predates its owner.
    let allocations = maps.allocations.entries();
    let objects = maps.object_devices.entries();
    let files: HashMap<u64, FileRefs> = maps.files.entries().into_iter().collect();
    let clients = maps.clients.entries();
    let live_clients = live_clients(&clients, &procs, &files, proc_root);
    for (handle, client) in &clients {
        if !live_clients.contains_key(handle) && maps.clients.remove(handle).is_ok() {
            garbage.handles += 1;
            release(client.cgroup, table::CLIENTS);
        }
    }
    for (key, allocation) in &allocations {
        if live_clients.get(&key.client) != Some(&allocation.client_generation)
            && maps.allocations.remove(key).is_ok()
        {
            garbage.handles += 1;
            release(allocation.cgroup, table::ALLOCATIONS);
        }
    }
    for (key, object) in &objects {
        if !live_clients.contains_key(&key.client) && maps.object_devices.remove(key).is_ok() {
            garbage.handles += 1;
            release(object.cgroup, table::OBJECTS);
        }
    }
    // Open files no tracked fd refers to any more (their fds went unseen: exec, or past the
    // fds the programs walk), unless the programs kept one that someone they don't follow
    // holds (`FileRefs::held`), for the clients it keeps.
    let open: HashSet<u64> = maps
        .gpu_fds
        .entries()
        .into_iter()
        .map(|(_, info)| info.file)
        .collect();
    let stale_files: Vec<u64> = files
        .iter()
        .filter(|(f, refs)| !open.contains(f) && (refs.held == 0 || refs.count == 0))
        .map(|(f, _)| *f)
        .collect();
    garbage.handles += remove_all(&stale_files, |k| maps.files.remove(k));
    // Mappings of processes that are gone (their bytes went with the process).
    for (key, mapping) in maps.mappings.entries() {
        let gone = procs
            .get(&key.tgid)
            .is_none_or(|_| !alive(proc_root, key.tgid));
        if gone && maps.mappings.remove(&key).is_ok() {
            garbage.handles += 1;
            release(mapping.cgroup, table::MAPPINGS);
        }
    }

    cgroups.forget_dead();
    let with_procs: HashSet<u64> = maps.procs.entries().iter().map(|(_, p)| p.cgroup).collect();
    let mut gone = |cgroup: u64| !with_procs.contains(&cgroup) && !cgroups.exists(cgroup);
    let dead_counters: Vec<IoctlKey> = maps
        .ioctl_counts
        .keys()
        .into_iter()
        .filter(|k| gone(k.cgroup))
        .collect();
    garbage.cgroups += remove_all(&dead_counters, |k| maps.ioctl_counts.remove(k));
    let dead_memory: Vec<CgroupDeviceKey> = maps
        .cgroup_memory
        .keys()
        .into_iter()
        .filter(|k| gone(k.cgroup))
        .collect();
    garbage.cgroups += remove_all(&dead_memory, |k| maps.cgroup_memory.remove(k));

    garbage.cgroups += age_out_idle(maps, &with_procs, idle, now);
    release_tables(maps, &released, &mut gone);
    garbage
}

/// The clients that are live, with their generations: a client is live while its creator is
/// (the process read in `procs` with the same generation, or one registered since, not read
/// there, that is alive), or while its open file is, when it holds allocations of ended
/// processes (orphans: the file keeps them).
fn live_clients(
    clients: &[(u32, ClientInfo)],
    procs: &HashMap<u32, ProcInfo>,
    files: &HashMap<u64, FileRefs>,
    proc_root: &Path,
) -> HashMap<u32, u64> {
    clients
        .iter()
        .filter(|(h, c)| {
            let creator = match procs.get(&c.tgid) {
                Some(p) => p.generation == c.proc_generation,
                None => alive(proc_root, c.tgid),
            };
            creator || (c.orphans != 0 && files.get(&c.file).is_some_and(|f| f.lists(*h)))
        })
        .map(|(h, c)| (*h, c.generation))
        .collect()
}

/// Adds the entries this pass removed, by cgroup, to what the agent released of each cgroup's
/// budget (`CGROUP_TABLES_RELEASED`: the agent's own counts, which the programs subtract from
/// theirs, so neither side overwrites the other), and drops both counts of cgroups that are
/// gone.
pub(crate) fn release_tables(
    maps: &mut TelemetryMaps,
    removed: &HashMap<u64, [u64; table::COUNT]>,
    gone: &mut impl FnMut(u64) -> bool,
) {
    for (cgroup, counts) in removed {
        let mut entry = maps.cgroup_tables_released.get(cgroup).unwrap_or_default();
        for (total, n) in entry.released.iter_mut().zip(counts) {
            *total += n;
        }
        if let Err(e) = maps.cgroup_tables_released.insert(*cgroup, entry) {
            tracing::debug!("cannot note the entries released of cgroup {cgroup}: {e}");
        }
    }
    for cgroup in maps.cgroup_tables.keys() {
        if gone(cgroup) {
            let _ = maps.cgroup_tables.remove(&cgroup);
            let _ = maps.cgroup_tables_released.remove(&cgroup);
        }
    }
}

/// Removes the counters of cgroups with no process and no GPU memory whose ioctl total has not
/// changed for [`IDLE_TTL`]; returns how many entries went.
fn age_out_idle(
    maps: &mut TelemetryMaps,
    with_procs: &HashSet<u64>,
    idle: &mut Idle,
    now: Instant,
) -> usize {
    let holding: HashSet<u64> = maps
        .cgroup_memory
        .entries()
        .into_iter()
        .filter(|(_, bytes)| *bytes > 0)
        .map(|(k, _)| k.cgroup)
        .collect();
    let mut totals: HashMap<u64, u64> = HashMap::new();
    let counters = maps.ioctl_counts.entries();
    for (key, n) in &counters {
        let t = totals.entry(key.cgroup).or_default();
        *t = t.saturating_add(*n);
    }
    idle.seen.retain(|cgroup, _| totals.contains_key(cgroup));
    let expired: HashSet<u64> = totals
        .into_iter()
        .filter(|(cgroup, _)| !with_procs.contains(cgroup) && !holding.contains(cgroup))
        .filter(|&(cgroup, total)| idle.expired(cgroup, total, now))
        .map(|(cgroup, _)| cgroup)
        .collect();
    for cgroup in with_procs {
        idle.seen.remove(cgroup);
    }
    let aged: Vec<IoctlKey> = counters
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| expired.contains(&k.cgroup))
        .collect();
    let mut removed = remove_all(&aged, |k| maps.ioctl_counts.remove(k));
    let aged_memory: Vec<CgroupDeviceKey> = maps
        .cgroup_memory
        .keys()
        .into_iter()
        .filter(|k| expired.contains(&k.cgroup))
        .collect();
    removed += remove_all(&aged_memory, |k| maps.cgroup_memory.remove(k));
    for cgroup in &expired {
        idle.seen.remove(cgroup);
    }
    removed
}

/// Removes each of `keys` with `remove`; returns how many removals took.
fn remove_all<K>(keys: &[K], mut remove: impl FnMut(&K) -> Result<(), MapError>) -> usize {
    keys.iter().filter(|k| remove(k).is_ok()).count()
}

/// Re-reads one process's fds after it exec'd: close-on-exec GPU fds are gone, others stay.
pub(crate) fn reseed_after_exec(
    maps: &mut TelemetryMaps,
    nodes: &BTreeMap<PathBuf, GpuNode>,
    cgroups: &impl Cgroups,
    proc_root: &Path,
    tgid: u32,
) {
    let stale: Vec<FdKey> = maps
        .gpu_fds
        .keys()
        .into_iter()
        .filter(|k| k.tgid == tgid)
        .collect();
    for key in stale {
        let link = proc_root
            .join(tgid.to_string())
            .join("fd")
            .join(key.fd.to_string());
        let ids = node_ids(nodes);
        let still_gpu = file_id(&link).is_some_and(|id| ids.contains_key(&id))
            || std::fs::read_link(link).is_ok_and(|t| nodes.contains_key(&t));
        if !still_gpu {
            let _ = maps.gpu_fds.remove(&key);
        }
    }
    seed(maps, nodes, cgroups, proc_root, Some(tgid));
}

#[cfg(test)]
mod tests;
