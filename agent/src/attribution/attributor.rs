//! The stateful half of attribution: cgroup id → its directory under the cgroup v2 mount →
//! [`Workload`], with a cache that forgets directories once they are gone.

use std::{
    collections::HashMap,
    fs, io,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use super::cgroup_path::{Workload, parse_cgroup_path, unified_path};

/// Where process information is read by an [`Attributor::detect`]ed attributor.
const PROC: &str = "/proc";

/// How long an id that a walk didn't find is answered `None` without walking again.
///
/// Cgroup ids are not reused on 64-bit kernels, so a miss is final for a real cgroup; the limit
/// keeps the set small and heals a walk that raced a rename.
const MISS_TTL: Duration = Duration::from_secs(10);

/// Errors finding cgroups.
#[derive(Debug, thiserror::Error)]
pub enum AttributionError {
    /// The mount table could not be read.
    #[error("cannot read the mount table {path}: {source}")]
    ReadMountinfo {
        /// The mount table.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// No cgroup v2 hierarchy is mounted.
    #[error("no cgroup v2 file system is mounted (per {mountinfo})")]
    NoCgroup2 {
        /// The mount table read.
        mountinfo: PathBuf,
    },
    /// A process's cgroup file could not be read (usually: the process is gone).
    #[error("cannot read {path}: {source}")]
    ReadProcCgroup {
        /// The `/proc/<pid>/cgroup` file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The process is not in a cgroup v2 hierarchy.
    #[error("{path} has no cgroup v2 entry (\"0::\")")]
    NoUnifiedEntry {
        /// The `/proc/<pid>/cgroup` file.
        path: PathBuf,
    },
    /// The cgroup path climbs above the root (a process in another cgroup namespace shows as
    /// `/../..`).
    #[error("cgroup {cgroup} lies outside the cgroup root {root}")]
    OutsideRoot {
        /// The cgroup path asked for.
        cgroup: String,
        /// The cgroup v2 mount.
        root: PathBuf,
    },
    /// The cgroup directory could not be examined (usually: it was removed).
    #[error("cannot stat cgroup {path}: {source}")]
    Stat {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The path names something other than a directory.
    #[error("{path} is not a cgroup directory")]
    NotACgroup {
        /// The path.
        path: PathBuf,
    },
}

/// A cached answer, with the directory it came from (to tell when it's gone).
#[derive(Debug)]
struct Entry {
    dir: PathBuf,
    workload: Arc<Workload>,
}

/// Resolves cgroup ids to workloads, with a cache.
///
/// A miss walks the whole cgroup tree once and caches every directory it sees, so later lookups
/// hit. Cached answers stay until [`Attributor::forget_dead`] finds their directory gone.
#[derive(Debug)]
pub struct Attributor {
    cgroup_root: PathBuf,
    proc_root: PathBuf,
    cache: HashMap<u64, Entry>,
    /// Ids no walk found, and when: asked again soon, they don't cost another walk.
    missing: HashMap<u64, Instant>,
}

impl Attributor {
    /// Finds the cgroup v2 mount from `/proc/self/mountinfo`; processes are read from `/proc`.
    ///
    /// # Errors
    /// The mount table can't be read, or lists no cgroup v2 file system.
    pub fn detect() -> Result<Self, AttributionError> {
        let mountinfo = PathBuf::from(gpuwarden_runtime::mountinfo::SELF);
        let text =
            fs::read_to_string(&mountinfo).map_err(|source| AttributionError::ReadMountinfo {
                path: mountinfo.clone(),
                source,
            })?;
        let root = gpuwarden_runtime::mountinfo::cgroup2_mount(&text)
            .ok_or(AttributionError::NoCgroup2 { mountinfo })?;
        Ok(Self::with_roots(root, PathBuf::from(PROC)))
    }

    /// Uses `cgroup_root` as the cgroup v2 mount and `proc_root` as `/proc`.
    #[must_use]
    pub fn with_roots(cgroup_root: PathBuf, proc_root: PathBuf) -> Self {
        Self {
            cgroup_root,
            proc_root,
            cache: HashMap::new(),
            missing: HashMap::new(),
        }
    }

    /// The cgroup v2 mount.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.cgroup_root
    }

    /// The workload of cgroup `id`, or `None` if no cgroup has that id (any more).
    ///
    /// A miss walks the tree at most once per call; an id that walk didn't find is answered
    /// `None` without walking for a few seconds after.
    pub fn resolve(&mut self, id: u64) -> Option<Arc<Workload>> {
        if let Some(entry) = self.cache.get(&id) {
            return Some(Arc::clone(&entry.workload));
        }
        if self
            .missing
            .get(&id)
            .is_some_and(|at| at.elapsed() < MISS_TTL)
        {
            return None;
        }
        let started = Instant::now();
        self.walk();
        let found = self.cache.get(&id).map(|e| Arc::clone(&e.workload));
        if found.is_none() {
            self.missing.insert(id, started);
        }
        found
    }

    /// Caches every directory under the root. Iterative, doesn't follow symlinks, and skips what
    /// vanishes meanwhile (cgroups come and go during the walk).
    fn walk(&mut self) {
        let Ok(meta) = fs::metadata(&self.cgroup_root) else {
            return;
        };
        let root = self.cgroup_root.clone();
        self.remember(meta.ino(), &root, "/");
        let mut stack = vec![(root, String::new())];
        while let Some((dir, rel)) = stack.pop() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                // DirEntry::metadata doesn't follow symlinks.
                let Ok(meta) = entry.metadata() else {
                    continue;
                };
                let child_rel = format!("{rel}/{}", entry.file_name().to_string_lossy());
                let child = entry.path();
                self.remember(meta.ino(), &child, &child_rel);
                stack.push((child, child_rel));
            }
        }
    }

    fn remember(&mut self, id: u64, dir: &Path, rel: &str) {
        if self.cache.get(&id).is_some_and(|e| e.dir == dir) {
            return;
        }
        let entry = Entry {
            dir: dir.to_owned(),
            workload: Arc::new(parse_cgroup_path(rel)),
        };
        self.cache.insert(id, entry);
    }

    /// Drops cached entries whose directory is gone or has another inode now, and expired misses.
    pub fn forget_dead(&mut self) {
        self.cache.retain(|id, entry| {
            fs::symlink_metadata(&entry.dir).is_ok_and(|m| m.is_dir() && m.ino() == *id)
        });
        self.missing.retain(|_, at| at.elapsed() < MISS_TTL);
    }

    /// The cgroup v2 id of the directory at `rel` (relative to the root; `/` is the root).
    ///
    /// # Errors
    /// `rel` climbs above the root, or names no directory.
    pub fn cgroup_id_of_path(&self, rel: &str) -> Result<u64, AttributionError> {
        let mut path = self.cgroup_root.clone();
        for component in rel.split('/').filter(|c| !c.is_empty() && *c != ".") {
            if component == ".." {
                return Err(AttributionError::OutsideRoot {
                    cgroup: rel.to_owned(),
                    root: self.cgroup_root.clone(),
                });
            }
            path.push(component);
        }
        let meta = fs::metadata(&path).map_err(|source| AttributionError::Stat {
            path: path.clone(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(AttributionError::NotACgroup { path });
        }
        Ok(meta.ino())
    }

    /// The cgroup v2 id of process `pid`, from its `0::` line in `/proc/<pid>/cgroup`.
    ///
    /// # Errors
    /// The process is gone, not in a cgroup v2 hierarchy, in a cgroup outside the root (another
    /// cgroup namespace), or in a cgroup removed since (a zombie's line ends in ` (deleted)`).
    pub fn cgroup_id_of_pid(&self, pid: u32) -> Result<u64, AttributionError> {
        let path = self.proc_root.join(pid.to_string()).join("cgroup");
        let text =
            fs::read_to_string(&path).map_err(|source| AttributionError::ReadProcCgroup {
                path: path.clone(),
                source,
            })?;
        let cgroup = text
            .lines()
            .find_map(unified_path)
            .ok_or(AttributionError::NoUnifiedEntry { path })?;
        self.cgroup_id_of_path(cgroup)
    }
}

/// What the sensor's map upkeep asks of attribution.
impl crate::sensor::upkeep::Cgroups for Attributor {
    fn cgroup_of_pid(&self, pid: u32) -> Option<u64> {
        self.cgroup_id_of_pid(pid).ok()
    }

    fn forget_dead(&mut self) {
        Attributor::forget_dead(self);
    }

    fn exists(&mut self, id: u64) -> bool {
        self.resolve(id).is_some()
    }
}

#[cfg(test)]
mod tests;
