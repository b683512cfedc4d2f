//! Binding a quota's target to the cgroup that holds the workload.
//!
//! A container id or pod UID is found by reading the cgroup tree with the same layout rules as
//! attribution ([`parse_cgroup_path`]), so whatever attribution names a container here is what a
//! quota for it binds to. A quota applies to the cgroup it binds at and to every cgroup below it
//! (a pod's containers, a container's own children): [`CgroupTree::members`] lists them.

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use crate::{attribution::parse_cgroup_path, enforcement::quota::Target};

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
        source: std::io::Error,
    },
}

/// The cgroup v2 hierarchy, read from its root.
#[derive(Debug, Clone)]
pub struct CgroupTree {
    root: PathBuf,
}

impl CgroupTree {
    /// The tree mounted at `root`.
    #[must_use]
    pub fn new(root: PathBuf) -> Self {
        Self { root }
    }

    /// The mount point.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The cgroup path relative to the root (`/a/b`).
    #[must_use]
    pub fn relative(&self, dir: &Path) -> String {
        let rel = dir.strip_prefix(&self.root).unwrap_or(dir);
        format!("/{}", rel.display()).replace("//", "/")
    }

    /// The directory of the managed cgroup of `session`.
    #[must_use]
    pub fn managed_dir(&self, session: &str) -> PathBuf {
        self.root.join(MANAGED_PARENT).join(session)
    }

    /// The directory `target` binds to now, if it exists; a managed one is made; `None` binds to
    /// nothing.
    ///
    /// # Errors
    /// The managed cgroup can't be made.
    pub fn find(&self, target: &Target, session: &str) -> Result<Option<PathBuf>, BindError> {
        match target {
            Target::None => Ok(None),
            Target::Managed => {
                let dir = self.managed_dir(session);
                std::fs::create_dir_all(&dir).map_err(|source| BindError::Create {
                    path: dir.clone(),
                    source,
                })?;
                Ok(Some(dir))
            }
            Target::CgroupPath(path) => {
                let dir = self.root.join(path.trim_start_matches('/'));
                Ok(dir.is_dir().then_some(dir))
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
                let Ok(entries) = std::fs::read_dir(dir) else {
                    continue;
                };
                for entry in entries.flatten() {
                    if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                        continue;
                    }
                    let path = entry.path();
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
    #[must_use]
    pub fn members(&self, dir: &Path) -> Vec<(u64, PathBuf)> {
        let mut out = Vec::new();
        let mut stack = vec![(dir.to_owned(), 0)];
        while let Some((d, depth)) = stack.pop() {
            let Ok(meta) = std::fs::metadata(&d) else {
                continue;
            };
            out.push((meta.ino(), d.clone()));
            if depth >= MAX_DEPTH {
                continue;
            }
            let Ok(entries) = std::fs::read_dir(&d) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push((entry.path(), depth + 1));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_find_the_shallowest_matching_cgroup() {
        let scratch = gpuwarden_test_support::scratch("bind");
        let root = scratch.path().to_owned();
        let id = "a".repeat(64);
        let pod = "0b5e5b2c-1d7e-4c1e-9d7a-2f9b5d3c4e6f";
        let pod_dir = root.join(format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            pod.replace('-', "_")
        ));
        let container = pod_dir.join(format!("cri-containerd-{id}.scope"));
        std::fs::create_dir_all(container.join("child")).unwrap();
        let tree = CgroupTree::new(root.clone());

        let found = tree.find(&Target::ContainerId(id.clone()), "s").unwrap();
        assert_eq!(found.as_deref(), Some(container.as_path()));
        let found = tree.find(&Target::PodUid(pod.to_owned()), "s").unwrap();
        assert_eq!(found.as_deref(), Some(pod_dir.as_path()));
        assert_eq!(
            tree.find(&Target::ContainerId("b".repeat(64)), "s")
                .unwrap(),
            None
        );
        let rel = tree.relative(&container);
        let found = tree.find(&Target::CgroupPath(rel.clone()), "s").unwrap();
        assert_eq!(found.as_deref(), Some(container.as_path()));
        assert!(rel.starts_with("/kubepods.slice/"), "{rel}");

        // The pod's members: itself, its container and the container's child.
        assert_eq!(tree.members(&pod_dir).len(), 3);
        let managed = tree.find(&Target::Managed, "s-42").unwrap().unwrap();
        assert_eq!(managed, root.join("gpuwarden/s-42"));
        assert!(managed.is_dir());
        std::fs::remove_dir_all(&root).unwrap();
        assert!(tree.members(&pod_dir).is_empty());
    }
}
