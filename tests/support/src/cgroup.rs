//! Cgroups made for a test.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

/// A cgroup v2 directory made for a test (with any parents it needed), removed when dropped.
pub struct TestCgroup {
    /// Its path relative to the cgroup v2 root, as `/proc/<pid>/cgroup` and snapshots show it.
    pub path: String,
    /// Its directory.
    pub dir: PathBuf,
    /// The directories this test made, outermost first: only these are removed.
    created: Vec<PathBuf>,
}

impl TestCgroup {
    /// Makes `path` (e.g. `/kubepods.slice/kubepods-pod….slice/cri-containerd-….scope`) under
    /// the cgroup v2 root.
    ///
    /// # Panics
    /// No cgroup v2 hierarchy, or a directory can't be made (not root).
    #[must_use]
    pub fn create(path: &str) -> Self {
        let root = gpuwarden_runtime::mountinfo::cgroup2_root()
            .unwrap_or_else(|e| panic!("a test cgroup needs cgroup v2: {e}"));
        Self::create_under(&root, path)
    }

    /// Makes `path` under `root`.
    ///
    /// # Panics
    /// A directory can't be made.
    #[must_use]
    pub fn create_under(root: &Path, path: &str) -> Self {
        let mut created = Vec::new();
        let mut dir = root.to_owned();
        for part in path.trim_start_matches('/').split('/') {
            dir = dir.join(part);
            // Tests run in parallel and share parents (`kubepods.slice`): one made by another
            // test is not ours to remove.
            match std::fs::create_dir(&dir) {
                Ok(()) => created.push(dir.clone()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => panic!("mkdir {}: {e}", dir.display()),
            }
        }
        Self {
            path: format!("/{}", path.trim_start_matches('/')),
            dir,
            created,
        }
    }

    /// Its `cgroup.procs`, for moving a child in before exec
    /// ([`gpuwarden_runtime::cgroup::spawn_inside`]).
    #[must_use]
    pub fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for dir in self.created.iter().rev() {
            // Processes may take a moment to leave after exiting.
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}
