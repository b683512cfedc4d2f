//! Keeping the sensor's maps tidy: the GPU device-node path table, seeding the fd table from
//! `/proc` at start, and removing what the kernel can't see go away (entries of processes that
//! died while nobody watched, counters of removed or long-idle cgroups).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use aya::maps::MapError;
use gpuwarden_agent_common::maps::{
    CgroupDeviceKey, FdKey, GpuNode, IoctlKey, MAX_GPUS, PATH_LEN, PathKey, ProcInfo,
};

use crate::{attribution::Attributor, sensor::SensorMaps};

/// Makes the path table hold exactly `nodes`. Returns how many paths were added and removed.
pub fn sync_paths(maps: &mut SensorMaps, nodes: &BTreeMap<PathBuf, GpuNode>) -> (usize, usize) {
    let wanted: HashMap<PathKey, GpuNode> = nodes
        .iter()
        .filter_map(|(p, n)| path_key(p).map(|k| (k, *n)))
        .collect();
    let present: HashSet<PathKey> = maps.gpu_paths.keys().flatten().collect();
    let mut removed = 0;
    for key in present.iter().filter(|k| !wanted.contains_key(k)) {
        if maps.gpu_paths.remove(key).is_ok() {
            removed += 1;
        }
    }
    let mut added = 0;
    for (key, node) in &wanted {
        if !present.contains(key) {
            match maps.gpu_paths.insert(key, node, 0) {
                Ok(()) => added += 1,
                Err(e) => tracing::warn!("cannot watch a GPU path: {e}"),
            }
        }
    }
    (added, removed)
}

/// The NUL-padded key of `path`, `None` if it is too long.
#[must_use]
pub fn path_key(path: &Path) -> Option<PathKey> {
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
pub struct SeedReport {
    /// GPU fds added to the table.
    pub fds: usize,
    /// Processes registered.
    pub processes: usize,
}

/// Adds GPU fds that processes opened before the programs were attached, from `/proc/*/fd`.
pub fn seed(
    maps: &mut SensorMaps,
    nodes: &BTreeMap<PathBuf, GpuNode>,
    attributor: &Attributor,
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
            let Ok(target) = std::fs::read_link(entry.path()) else {
                continue;
            };
            if let Some(node) = nodes.get(&target) {
                found.push((fd, *node));
            }
        }
        if found.is_empty() {
            continue;
        }
        let max_fd = found.iter().map(|(fd, _)| *fd).max().unwrap_or(0);
        for (fd, node) in &found {
            if maps
                .gpu_fds
                .insert(FdKey { tgid, fd: *fd }, node, 0)
                .is_ok()
            {
                report.fds += 1;
            }
        }
        if maps.procs.get(&tgid, 0).is_err() {
            let Ok(cgroup) = attributor.cgroup_id_of_pid(tgid) else {
                continue;
            };
            let info = ProcInfo {
                cgroup,
                generation: monotonic_ns(),
                max_fd,
                _pad: 0,
                vidmem: [0; MAX_GPUS],
            };
            // BPF_NOEXIST: the programs may have registered it meanwhile.
            if maps.procs.insert(tgid, info, 1).is_ok() {
                report.processes += 1;
            }
        }
    }
    report
}

/// Whether process `tgid` exists.
fn alive(proc_root: &Path, tgid: u32) -> bool {
    proc_root.join(tgid.to_string()).exists()
}

/// What [`collect_garbage`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Garbage {
    /// fd-table entries of dead processes.
    pub fds: usize,
    /// Process entries of dead processes.
    pub processes: usize,
    /// Client, allocation and device-object entries whose owner is gone.
    pub handles: usize,
    /// Counter entries of removed cgroups, and of cgroups idle past [`IDLE_TTL`].
    pub cgroups: usize,
}

/// How long a cgroup's counters stay listed once it has no live GPU process, no GPU memory and
/// no quota: long enough to see what a short job did, short enough that counters left in the
/// pinned maps by earlier runs (a host shell that once ran `nvidia-smi`) leave `top`.
pub const IDLE_TTL: Duration = Duration::from_secs(60);

/// When each idle cgroup was first seen idle, so its counters age out after [`IDLE_TTL`].
#[derive(Debug)]
pub struct IdleCgroups {
    ttl: Duration,
    since: HashMap<u64, Instant>,
}

impl Default for IdleCgroups {
    fn default() -> Self {
        Self::new(IDLE_TTL)
    }
}

impl IdleCgroups {
    /// Ages idle cgroups out after `ttl`.
    #[must_use]
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            since: HashMap::new(),
        }
    }

    /// Of the cgroups idle now, those idle for the whole TTL as of `now`; a cgroup not in `idle`
    /// is active again and starts over next time.
    pub fn expired(&mut self, idle: &HashSet<u64>, now: Instant) -> HashSet<u64> {
        self.since.retain(|cgroup, _| idle.contains(cgroup));
        idle.iter()
            .filter(|cgroup| {
                let since = *self.since.entry(**cgroup).or_insert(now);
                now.saturating_duration_since(since) >= self.ttl
            })
            .copied()
            .collect()
    }
}

/// Removes entries the kernel side can't see go stale: fds and processes of processes that died
/// unseen, handles of released clients, counters of removed cgroups and of cgroups idle (no
/// live process, no GPU memory, not in `bound`) for longer than `idle`'s TTL.
pub fn collect_garbage(
    maps: &mut SensorMaps,
    attributor: &mut Attributor,
    proc_root: &Path,
    idle: &mut IdleCgroups,
    bound: &HashSet<u64>,
) -> Garbage {
    let mut garbage = Garbage::default();
    let dead_fds: Vec<FdKey> = maps
        .gpu_fds
        .keys()
        .flatten()
        .filter(|k| !alive(proc_root, k.tgid))
        .collect();
    garbage.fds += remove_all(&dead_fds, |k| maps.gpu_fds.remove(k));
    let procs: HashMap<u32, ProcInfo> = maps.procs.iter().flatten().collect();
    for (tgid, info) in &procs {
        if !alive(proc_root, *tgid) {
            if info.vidmem.iter().any(|b| *b != 0) {
                tracing::warn!(tgid, "process died unseen while holding GPU memory");
            }
            garbage.processes += usize::from(maps.procs.remove(tgid).is_ok());
        }
    }
    let live_clients: HashMap<u32, u64> = maps
        .clients
        .iter()
        .flatten()
        .filter(|(_, c)| {
            procs
                .get(&c.tgid)
                .is_some_and(|p| p.generation == c.proc_generation)
        })
        .map(|(h, c)| (h, c.generation))
        .collect();
    let stale_clients: Vec<u32> = maps
        .clients
        .keys()
        .flatten()
        .filter(|h| !live_clients.contains_key(h))
        .collect();
    garbage.handles += remove_all(&stale_clients, |k| maps.clients.remove(k));
    let stale_allocations: Vec<_> = maps
        .allocations
        .iter()
        .flatten()
        .filter(|(k, a)| live_clients.get(&k.client) != Some(&a.client_generation))
        .map(|(k, _)| k)
        .collect();
    garbage.handles += remove_all(&stale_allocations, |k| maps.allocations.remove(k));
    let stale_objects: Vec<_> = maps
        .object_devices
        .keys()
        .flatten()
        .filter(|k| !live_clients.contains_key(&k.client))
        .collect();
    garbage.handles += remove_all(&stale_objects, |k| maps.object_devices.remove(k));

    attributor.forget_dead();
    let with_procs: HashSet<u64> = maps.procs.iter().flatten().map(|(_, p)| p.cgroup).collect();
    let holding: HashSet<u64> = maps
        .cgroup_memory
        .iter()
        .flatten()
        .filter(|(_, bytes)| *bytes != 0)
        .map(|(k, _)| k.cgroup)
        .collect();
    let counted: HashSet<u64> = maps
        .ioctl_counts
        .keys()
        .flatten()
        .map(|k| k.cgroup)
        .chain(maps.cgroup_memory.keys().flatten().map(|k| k.cgroup))
        .collect();
    let idle_now: HashSet<u64> = counted
        .into_iter()
        .filter(|c| !with_procs.contains(c) && !holding.contains(c) && !bound.contains(c))
        .collect();
    let expired = idle.expired(&idle_now, Instant::now());
    let mut gone = |cgroup: u64| {
        expired.contains(&cgroup)
            || (!with_procs.contains(&cgroup) && attributor.resolve(cgroup).is_none())
    };
    let dead_counters: Vec<IoctlKey> = maps
        .ioctl_counts
        .keys()
        .flatten()
        .filter(|k| gone(k.cgroup))
        .collect();
    garbage.cgroups += remove_all(&dead_counters, |k| maps.ioctl_counts.remove(k));
    let dead_memory: Vec<CgroupDeviceKey> = maps
        .cgroup_memory
        .keys()
        .flatten()
        .filter(|k| gone(k.cgroup))
        .collect();
    garbage.cgroups += remove_all(&dead_memory, |k| maps.cgroup_memory.remove(k));
    garbage
}

/// Removes each of `keys` with `remove`; returns how many removals took.
fn remove_all<K>(keys: &[K], mut remove: impl FnMut(&K) -> Result<(), MapError>) -> usize {
    keys.iter().filter(|k| remove(k).is_ok()).count()
}

/// Re-reads one process's fds after it exec'd: close-on-exec GPU fds are gone, others stay.
pub fn reseed_after_exec(
    maps: &mut SensorMaps,
    nodes: &BTreeMap<PathBuf, GpuNode>,
    attributor: &Attributor,
    proc_root: &Path,
    tgid: u32,
) {
    let stale: Vec<FdKey> = maps
        .gpu_fds
        .keys()
        .flatten()
        .filter(|k| k.tgid == tgid)
        .collect();
    for key in stale {
        let link = proc_root
            .join(tgid.to_string())
            .join("fd")
            .join(key.fd.to_string());
        let still_gpu = std::fs::read_link(link).is_ok_and(|t| nodes.contains_key(&t));
        if !still_gpu {
            let _ = maps.gpu_fds.remove(&key);
        }
    }
    seed(maps, nodes, attributor, proc_root, Some(tgid));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_keys_are_nul_padded_and_bounded() {
        let key = path_key(Path::new("/dev/nvidia0")).unwrap();
        assert_eq!(&key.path[..12], b"/dev/nvidia0");
        assert!(key.path[12..].iter().all(|b| *b == 0));
        let long = format!("/{}", "x".repeat(PATH_LEN - 1));
        assert!(path_key(Path::new(&long)).is_none());
        let longest = format!("/{}", "x".repeat(PATH_LEN - 2));
        assert!(path_key(Path::new(&longest)).is_some());
    }

    #[test]
    fn idle_cgroups_age_out_after_the_ttl_and_start_over_when_active() {
        let mut idle = IdleCgroups::new(Duration::from_secs(60));
        let t0 = Instant::now();
        let both: HashSet<u64> = [1, 2].into();
        assert!(idle.expired(&both, t0).is_empty(), "nothing is old yet");
        assert!(idle.expired(&both, t0 + Duration::from_secs(59)).is_empty());
        // Cgroup 2 ran something again: it leaves the idle set and starts over.
        let one: HashSet<u64> = [1].into();
        assert_eq!(
            idle.expired(&one, t0 + Duration::from_secs(60)),
            HashSet::from([1])
        );
        assert!(idle.expired(&both, t0 + Duration::from_secs(61)) == HashSet::from([1]));
        assert_eq!(
            idle.expired(&both, t0 + Duration::from_secs(121)),
            HashSet::from([1, 2])
        );
    }
}
