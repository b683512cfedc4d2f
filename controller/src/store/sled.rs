//! The embedded backend: sled on local disk, one tree per concern.
//!
//! A key `concern/id` is `id` in the tree `concern`, so stores written before the store
//! interface existed read back unchanged. A commit applies each tree's writes as one sled batch
//! and then flushes once: every write of a group is durable when the commit returns.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use super::{StoreError, Write};

/// sled on disk.
#[derive(Debug, Clone)]
pub struct SledKv {
    db: sled::Db,
    path: PathBuf,
}

/// How long to wait for a previous handle's file lock (see [`SledKv::open`]).
const LOCK_WAIT: Duration = Duration::from_secs(15);

impl SledKv {
    /// Opens (or creates) the store in `dir`.
    ///
    /// # Errors
    /// It can't be opened.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        // sled's flusher thread may hold the previous handle's file lock for a moment after it
        // is dropped (a restart in the same process): retry before giving up. On a loaded
        // 2-core machine that moment was seen to pass 1 s, and once 5 s; another controller
        // that really holds the store is still named within `LOCK_WAIT`.
        let started = std::time::Instant::now();
        let db = loop {
            match sled::Config::new().path(dir).open() {
                Ok(db) => break db,
                Err(sled::Error::Io(e))
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        && started.elapsed() < LOCK_WAIT =>
                {
                    std::thread::sleep(Duration::from_millis(25));
                }
                Err(source) => {
                    return Err(StoreError::Open {
                        at: dir.display().to_string(),
                        reason: source.to_string(),
                    });
                }
            }
        };
        Ok(Self {
            db,
            path: dir.to_owned(),
        })
    }

    /// Where it is.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn tree(&self, name: &str) -> Result<sled::Tree, StoreError> {
        self.db.open_tree(name).map_err(|e| io(name, &e))
    }

    /// The value at `key`.
    ///
    /// # Errors
    /// The read fails.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let (tree, id) = split(key)?;
        Ok(self
            .tree(tree)?
            .get(id)
            .map_err(|e| io(key, &e))?
            .map(|v| v.to_vec()))
    }

    /// Every key under `prefix` (a concern and the start of an id), in key order.
    ///
    /// # Errors
    /// A read fails.
    pub fn list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let (tree, start) = split(prefix)?;
        self.tree(tree)?
            .scan_prefix(start)
            .map(|item| {
                let (k, v) = item.map_err(|e| io(prefix, &e))?;
                Ok((
                    format!("{tree}/{}", String::from_utf8_lossy(&k)),
                    v.to_vec(),
                ))
            })
            .collect()
    }

    /// Writes `value` at `key` if it holds `expected` (`None`: absent), durably; whether it did.
    ///
    /// # Errors
    /// The write fails.
    pub fn compare_and_put(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        value: &[u8],
    ) -> Result<bool, StoreError> {
        let (tree, id) = split(key)?;
        let swapped = self
            .tree(tree)?
            .compare_and_swap(id, expected, Some(value))
            .map_err(|e| io(key, &e))?
            .is_ok();
        if swapped {
            self.flush()?;
        }
        Ok(swapped)
    }

    /// Applies `writes` in order and flushes once.
    ///
    /// # Errors
    /// A write or the flush fails (e.g. a full disk).
    pub fn commit(&self, writes: &[Write]) -> Result<(), StoreError> {
        // One batch per tree, each applied atomically; writes to one key keep their order.
        let mut batches: BTreeMap<&str, sled::Batch> = BTreeMap::new();
        for write in writes {
            let (tree, id) = split(write.key())?;
            let batch = batches.entry(tree).or_default();
            match write {
                Write::Put { value, .. } => batch.insert(id, value.as_slice()),
                Write::Delete { .. } => batch.remove(id),
            }
        }
        for (tree, batch) in batches {
            self.tree(tree)?
                .apply_batch(batch)
                .map_err(|e| io(tree, &e))?;
        }
        self.flush()
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map(|_| ()).map_err(|e| io("flush", &e))
    }
}

/// `concern/id` → (`concern`, `id`).
fn split(key: &str) -> Result<(&str, &str), StoreError> {
    key.split_once('/')
        .ok_or_else(|| StoreError::Key(key.to_owned()))
}

fn io(what: &str, e: &sled::Error) -> StoreError {
    StoreError::Io {
        what: what.to_owned(),
        reason: e.to_string(),
    }
}
