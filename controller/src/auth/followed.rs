//! A configuration file followed as it changes: looked at on each use (one `stat`) and parsed
//! again when it changed. The token file and the grant file are read this way; the TLS files
//! (here and the webhook's) are told changed by the same `Stamp`.
//!
//! They grant access, so they fail closed (issue 33: a deleted token file left every token
//! working): a file that is gone grants nothing, and a version that can't be used keeps only
//! what its `Salvage` finds of the last good version still in the new text (for tokens, the
//! hashes still written in it; for grants, nothing). Each unusable version is logged and
//! counted by the file that followed it (`TokenFile::unusable`, `GrantFile::unusable`,
//! exported as `gpuwarden.controller.config.unusable`), which an alert watches.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    fmt::Display,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

/// Which followed file, for the count of unusable versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigFile {
    /// `--token-file`.
    Tokens,
    /// `--grant-file`.
    Grants,
}

impl ConfigFile {
    /// Every file, in the order of the counters.
    pub const ALL: [Self; 2] = [Self::Tokens, Self::Grants];

    /// The value of the `gpuwarden.config.file` attribute.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Tokens => "token_file",
            Self::Grants => "grant_file",
        }
    }

    /// What the log calls it.
    const fn words(self) -> &'static str {
        match self {
            Self::Tokens => "token file",
            Self::Grants => "grant file",
        }
    }
}

/// What is kept of the last good version when the file changed and the new one can't be used:
/// given that version and the new text (`None` when the file is gone or unreadable).
pub(crate) type Salvage<T> = fn(&T, Option<&str>) -> T;

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
    /// Which file it is, for the log and the count.
    what: ConfigFile,
    read: Reader<T, E>,
    salvage: Salvage<T>,
    loaded: Mutex<Loaded<T>>,
    /// Versions that changed and could not be used.
    unusable: AtomicU64,
}

impl<T, E: Display> Followed<T, E> {
    /// Reads `path` now with `read`.
    ///
    /// # Errors
    /// What `read` says.
    pub(crate) fn load(
        path: &Path,
        what: ConfigFile,
        read: Reader<T, E>,
        salvage: Salvage<T>,
    ) -> Result<Self, E> {
        let stamp = Stamp::of(path);
        let value = read(path)?;
        Ok(Self {
            path: path.to_owned(),
            what,
            read,
            salvage,
            loaded: Mutex::new(Loaded {
                stamp,
                value: Arc::new(value),
            }),
            unusable: AtomicU64::new(0),
        })
    }

    /// The file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Versions of the file that changed and could not be used (a parse error, a missing
    /// file) since it was loaded.
    pub(crate) fn unusable(&self) -> u64 {
        self.unusable.load(Ordering::Relaxed)
    }

    /// The current version: read again first when the file changed; when that fails, what the
    /// [`Salvage`] keeps of the last good version (logged and counted once per version).
    pub(crate) fn current(&self) -> Arc<T> {
        let now = Stamp::of(&self.path);
        let mut loaded = self.loaded.locked();
        if now != loaded.stamp {
            let what = self.what.words();
            match (self.read)(&self.path) {
                Ok(value) => {
                    tracing::info!(file = %self.path.display(), "{what} changed: reloaded");
                    loaded.value = Arc::new(value);
                }
                Err(e) => {
                    let text = std::fs::read_to_string(&self.path).ok();
                    loaded.value = Arc::new((self.salvage)(&loaded.value, text.as_deref()));
                    self.unusable.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(
                        file = %self.path.display(),
                        "{what} changed and can't be used; keeping only what the new version still holds: {e}"
                    );
                }
            }
            // This version is dealt with: the next change is read again.
            loaded.stamp = now;
        }
        Arc::clone(&loaded.value)
    }
}
