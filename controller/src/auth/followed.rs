//! A configuration file followed as it changes: looked at on each use (one `stat`), parsed again
//! when it changed, and the last good version kept when the new one can't be used, so a bad
//! edit never locks everyone out. The token file and the grant file are read this way; the TLS
//! files (here and the webhook's) are told changed by the same [`Stamp`].

use gpuwarden_runtime::sync::Lock as _;
use std::{
    fmt::Display,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

/// What identifies one version of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    modified: Option<std::time::SystemTime>,
    len: u64,
    dev: u64,
    ino: u64,
}

impl Stamp {
    /// Follows symlinks, as Kubernetes secret volumes need.
    pub(crate) fn of(path: &Path) -> Option<Self> {
        let m = std::fs::metadata(path).ok()?;
        Some(Self {
            modified: m.modified().ok(),
            len: m.len(),
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

/// How to read one version of a followed file.
pub(crate) type Reader<T, E> = fn(&Path) -> Result<T, E>;

struct Loaded<T> {
    stamp: Option<Stamp>,
    value: Arc<T>,
}

/// A file of `T`, read again when it changes.
pub(crate) struct Followed<T, E> {
    path: PathBuf,
    /// What the file is, for the log ("token file").
    what: &'static str,
    read: Reader<T, E>,
    loaded: Mutex<Loaded<T>>,
}

impl<T, E: Display> Followed<T, E> {
    /// Reads `path` now with `read`.
    ///
    /// # Errors
    /// What `read` says.
    pub(crate) fn load(path: &Path, what: &'static str, read: Reader<T, E>) -> Result<Self, E> {
        let stamp = Stamp::of(path);
        let value = read(path)?;
        Ok(Self {
            path: path.to_owned(),
            what,
            read,
            loaded: Mutex::new(Loaded {
                stamp,
                value: Arc::new(value),
            }),
        })
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The current version: read again first when the file changed, the last good one when
    /// that fails.
    pub(crate) fn current(&self) -> Arc<T> {
        let now = Stamp::of(&self.path);
        let mut loaded = self.loaded.locked();
        if now != loaded.stamp {
            match (self.read)(&self.path) {
                Ok(value) => {
                    tracing::info!(file = %self.path.display(), "{} changed: reloaded", self.what);
                    loaded.value = Arc::new(value);
                    loaded.stamp = now;
                }
                // The stamp stays old, so the next use tries again.
                Err(e) => tracing::warn!(
                    "{} changed but can't be used, keeping the previous version: {e}",
                    self.what
                ),
            }
        }
        Arc::clone(&loaded.value)
    }
}
