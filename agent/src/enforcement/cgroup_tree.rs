//! The cgroup v2 tree as enforcement walks it: a quota's target (container, pod, cgroup path,
//! managed) → the cgroup that holds the workload, and every cgroup below it.
//!
//! A container id or pod UID is found by reading the tree with the same layout rules as
//! attribution ([`parse_cgroup_path`]), so whatever attribution names a container here is what a
//! quota for it binds to. A quota applies to the cgroup it binds at and to every cgroup below it
//! (a pod's containers, a container's own children): [`CgroupTree::members`] lists them.
//!
//! The file system is behind [`CgroupFs`]: [`HostCgroups`] reads the real one, tests use an
//! in-memory tree.

use std::{
    io,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use crate::{
    attribution::{cgroup_path::unified_path, parse_cgroup_path},
    enforcement::quota::Target,
};

/// Where managed cgroups (`gpuwarden run`) are made, under the cgroup v2 root.
pub const MANAGED_PARENT: &str = "gpuwarden";

/// How deep the tree is searched; real layouts are about 6 levels deep.
const MAX_DEPTH: usize = 12;

/// Errors binding a target.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// The managed cgroup can't be made.
    #[error("cannot make the session's cgroup {path}: {source}")]
    Create {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// What the tree walk reads and writes.
pub(crate) trait CgroupFs: Send {
    /// The directories directly below `dir` (none when it can't be read).
    fn subdirs(&self, dir: &Path) -> Vec<PathBuf>;
    /// The cgroup id of the directory `dir` (its inode), if it is one.
    fn id(&self, dir: &Path) -> Option<u64>;
    /// Makes `dir` and its parents.
    ///
    /// # Errors
    /// Not allowed, or not a cgroup file system.
    fn create(&self, dir: &Path) -> io::Result<()>;
    /// Removes the (empty) cgroup `dir`.
    ///
    /// # Errors
    /// Processes are still in it, or it is gone.
    fn remove(&self, dir: &Path) -> io::Result<()>;
    /// The cgroup v2 path of process `pid` relative to the root (its `0::` line), if it lives.
    fn cgroup_of_pid(&self, pid: u32) -> Option<String>;
    /// The processes directly in the cgroup `dir` (its `cgroup.procs`; none when unreadable).
    fn procs(&self, dir: &Path) -> Vec<u32>;
    /// Kills every process in the cgroup `dir` and below it at once (`1` to its `cgroup.kill`).
    ///
    /// # Errors
    /// [`io::ErrorKind::NotFound`] where the kernel has no `cgroup.kill` (before 5.14): the
    /// caller signals each process instead.
    fn kill(&self, dir: &Path) -> io::Result<()>;
}

/// The host's cgroup file system and `/proc`.
pub(crate) struct HostCgroups {
    proc_root: PathBuf,
}

impl HostCgroups {
    /// Processes read under `proc_root` (normally `/proc`).
    pub(crate) fn new(proc_root: PathBuf) -> Self {
        Self { proc_root }
    }
}

impl CgroupFs for HostCgroups {
    fn subdirs(&self, dir: &Path) -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect()
    }

    fn id(&self, dir: &Path) -> Option<u64> {
        std::fs::metadata(dir)
            .ok()
            .filter(std::fs::Metadata::is_dir)
            .map(|m| m.ino())
    }

    fn create(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn remove(&self, dir: &Path) -> io::Result<()> {
        std::fs::remove_dir(dir)
    }

    fn cgroup_of_pid(&self, pid: u32) -> Option<String> {
        let text =
            std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("cgroup")).ok()?;
        text.lines().find_map(unified_path).map(str::to_owned)
    }

    fn procs(&self, dir: &Path) -> Vec<u32> {
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    fn kill(&self, dir: &Path) -> io::Result<()> {
        let file = dir.join("cgroup.kill");
        // Opened without create: on a kernel without the file, NotFound says so.
        let mut f = std::fs::OpenOptions::new().write(true).open(file)?;
        io::Write::write_all(&mut f, b"1")
    }
}

/// The cgroup v2 hierarchy, read from its root.
pub(crate) struct CgroupTree {
    root: PathBuf,
    fs: Box<dyn CgroupFs>,
}

impl CgroupTree {
    /// The tree mounted at `root`, read through `fs`.
    pub(crate) fn new(root: PathBuf, fs: Box<dyn CgroupFs>) -> Self {
        Self { root, fs }
    }

    /// The host's tree mounted at `root`.
    pub(crate) fn host(root: PathBuf) -> Self {
        Self::new(root, Box::new(HostCgroups::new(PathBuf::from("/proc"))))
    }

    /// The mount point.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The cgroup path relative to the root (`/a/b`).
    pub(crate) fn relative(&self, dir: &Path) -> String {
        let rel = dir.strip_prefix(&self.root).unwrap_or(dir);
        format!("/{}", rel.display()).replace("//", "/")
    }

    /// The directory of the managed cgroup of `session`.
    pub(crate) fn managed_dir(&self, session: &str) -> PathBuf {
        self.root.join(MANAGED_PARENT).join(session)
    }

    /// Removes the managed cgroup of `session`, if its processes have left.
    pub(crate) fn remove_managed(&self, session: &str) {
        let dir = self.managed_dir(session);
        if let Err(e) = self.fs.remove(&dir)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), "session cgroup left in place: {e}");
        }
    }

    /// The directory `target` binds to now, if it exists; a managed one is made; `None` binds to
    /// nothing.
    ///
    /// # Errors
    /// The managed cgroup can't be made.
    pub(crate) fn find(
        &self,
        target: &Target,
        session: &str,
    ) -> Result<Option<PathBuf>, BindError> {
        match target {
            Target::None => Ok(None),
            Target::Managed => {
                let dir = self.managed_dir(session);
                self.fs.create(&dir).map_err(|source| BindError::Create {
                    path: dir.clone(),
                    source,
                })?;
                Ok(Some(dir))
            }
            Target::CgroupPath(path) => {
                let dir = self.root.join(path.trim_start_matches('/'));
                Ok(self.fs.id(&dir).is_some().then_some(dir))
            }
            // The shallowest match: the container's own cgroup (not its children), the pod's
            // cgroup (not its containers').
            Target::ContainerId(id) => Ok(self
                .search(|rel| parse_cgroup_path(rel).container_id.as_deref() == Some(id.as_str()))),
            Target::PodUid(uid) => Ok(self.search(|rel| {
                let w = parse_cgroup_path(rel);
                w.pod_uid.as_deref() == Some(uid.as_str()) && w.container_id.is_none()
            })),
        }
    }

    /// The shallowest directory whose relative path satisfies `matches` (breadth first).
    fn search(&self, matches: impl Fn(&str) -> bool) -> Option<PathBuf> {
        let mut level = vec![self.root.clone()];
        for _ in 0..MAX_DEPTH {
            let mut next = Vec::new();
            for dir in &level {
                for path in self.fs.subdirs(dir) {
                    if matches(&self.relative(&path)) {
                        return Some(path);
                    }
                    next.push(path);
                }
            }
            if next.is_empty() {
                break;
            }
            level = next;
        }
        None
    }

    /// `dir` and every cgroup below it, as (cgroup id, directory); empty once `dir` is gone.
    pub(crate) fn members(&self, dir: &Path) -> Vec<(u64, PathBuf)> {
        let mut out = Vec::new();
        let mut stack = vec![(dir.to_owned(), 0)];
        while let Some((d, depth)) = stack.pop() {
            let Some(id) = self.fs.id(&d) else {
                continue;
            };
            out.push((id, d.clone()));
            if depth >= MAX_DEPTH {
                continue;
            }
            for sub in self.fs.subdirs(&d) {
                stack.push((sub, depth + 1));
            }
        }
        out
    }

    /// Every process in `dir` and the cgroups below it.
    pub(crate) fn procs_below(&self, dir: &Path) -> Vec<u32> {
        self.members(dir)
            .iter()
            .flat_map(|(_, d)| self.fs.procs(d))
            .collect()
    }

    /// Kills every process in `dir` and below through `cgroup.kill`.
    ///
    /// # Errors
    /// The file is absent (an older kernel) or can't be written.
    pub(crate) fn kill(&self, dir: &Path) -> io::Result<()> {
        self.fs.kill(dir)
    }

    /// The cgroup id of process `pid`, read under this tree's root.
    pub(crate) fn cgroup_id_of_pid(&self, pid: u32) -> Option<u64> {
        let rel = self.fs.cgroup_of_pid(pid)?;
        self.fs
            .id(&self.root.join(rel.trim().trim_start_matches('/')))
    }
}

#[cfg(test)]
mod tests;
