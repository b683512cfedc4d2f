//! The controller's embedded store: sled, one tree per concern, with a format version.
//!
//! Records are JSON (readable with any sled tool, and tolerant of added fields). A write the
//! API acknowledges is flushed first, so a reply that says "created" survives `kill -9`.

use std::path::{Path, PathBuf};

use serde::{Serialize, de::DeserializeOwned};

use crate::{node::Node, profile::Profile, session::Session, slots::SlotTypeRegistry};

/// The on-disk format this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

const META: &str = "meta";
const SLOT_TYPES: &str = "slot_types";
const NODES: &str = "nodes";
const SESSIONS: &str = "sessions";
const POLICIES: &str = "policies";
const PROFILES: &str = "profiles";

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database can't be opened.
    #[error("cannot open the store at {path}: {source}")]
    Open {
        /// Its directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: sled::Error,
    },
    /// A read or write failed (e.g. a full disk).
    #[error("store {tree}: {source}")]
    Io {
        /// The tree.
        tree: &'static str,
        /// Why.
        #[source]
        source: sled::Error,
    },
    /// A record doesn't decode.
    #[error("store {tree}: record {key:?} is corrupt: {source}")]
    Corrupt {
        /// The tree.
        tree: &'static str,
        /// Its key.
        key: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// Written by another format version.
    #[error(
        "the store at {path} has format version {found}; this build reads version {FORMAT_VERSION}"
    )]
    Version {
        /// Its directory.
        path: PathBuf,
        /// The version found.
        found: u32,
    },
}

/// The store.
#[derive(Debug, Clone)]
pub struct Store {
    db: sled::Db,
}

/// Everything the store holds, for a restart.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The merged slot types.
    pub registry: SlotTypeRegistry,
    /// Nodes.
    pub nodes: Vec<Node>,
    /// Sessions.
    pub sessions: Vec<Session>,
    /// Learned workload profiles.
    pub profiles: Vec<Profile>,
}

impl Store {
    /// Opens (or creates) the store in `dir`.
    ///
    /// # Errors
    /// It can't be opened, or it has another format version.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        // sled's flusher thread may hold the previous handle's file lock for a moment after it
        // is dropped (a restart in the same process): retry before giving up. On a loaded
        // 2-core machine that moment was seen to pass 1 s, so allow 5 s.
        let mut attempts = 0;
        let db = loop {
            match sled::Config::new().path(dir).open() {
                Ok(db) => break db,
                Err(sled::Error::Io(e))
                    if e.kind() == std::io::ErrorKind::WouldBlock && attempts < 200 =>
                {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(25));
                }
                Err(source) => {
                    return Err(StoreError::Open {
                        path: dir.to_owned(),
                        source,
                    });
                }
            }
        };
        let store = Self { db };
        let meta = store.tree(META)?;
        match meta
            .get("format_version")
            .map_err(|source| StoreError::Io { tree: META, source })?
        {
            Some(v) => {
                let found = std::str::from_utf8(&v)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                if found != FORMAT_VERSION {
                    return Err(StoreError::Version {
                        path: dir.to_owned(),
                        found,
                    });
                }
            }
            None => {
                meta.insert("format_version", FORMAT_VERSION.to_string().as_bytes())
                    .map_err(|source| StoreError::Io { tree: META, source })?;
                store.flush()?;
            }
        }
        Ok(store)
    }

    fn tree(&self, name: &'static str) -> Result<sled::Tree, StoreError> {
        self.db
            .open_tree(name)
            .map_err(|source| StoreError::Io { tree: name, source })
    }

    fn put<T: Serialize>(
        &self,
        tree: &'static str,
        key: &str,
        value: &T,
    ) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec(value).map_err(|source| StoreError::Corrupt {
            tree,
            key: key.to_owned(),
            source,
        })?;
        self.tree(tree)?
            .insert(key, bytes)
            .map_err(|source| StoreError::Io { tree, source })?;
        Ok(())
    }

    fn all<T: DeserializeOwned>(&self, tree: &'static str) -> Result<Vec<T>, StoreError> {
        self.tree(tree)?
            .iter()
            .map(|item| {
                let (k, v) = item.map_err(|source| StoreError::Io { tree, source })?;
                serde_json::from_slice(&v).map_err(|source| StoreError::Corrupt {
                    tree,
                    key: String::from_utf8_lossy(&k).into_owned(),
                    source,
                })
            })
            .collect()
    }

    /// Writes a session.
    ///
    /// # Errors
    /// The write fails.
    pub fn put_session(&self, session: &Session) -> Result<(), StoreError> {
        self.put(SESSIONS, &session.id, session)
    }

    /// Removes a session (a rolled-back create).
    ///
    /// # Errors
    /// The write fails.
    pub fn remove_session(&self, id: &str) -> Result<(), StoreError> {
        self.tree(SESSIONS)?
            .remove(id)
            .map_err(|source| StoreError::Io {
                tree: SESSIONS,
                source,
            })?;
        Ok(())
    }

    /// Writes a node.
    ///
    /// # Errors
    /// The write fails.
    pub fn put_node(&self, node: &Node) -> Result<(), StoreError> {
        self.put(NODES, &node.report.node_id, node)
    }

    /// Writes the slot-type registry.
    ///
    /// # Errors
    /// The write fails.
    pub fn put_registry(&self, registry: &SlotTypeRegistry) -> Result<(), StoreError> {
        self.put(SLOT_TYPES, "registry", registry)
    }

    /// Writes a workload class's profile.
    ///
    /// # Errors
    /// The write fails.
    pub fn put_profile(&self, profile: &Profile) -> Result<(), StoreError> {
        self.put(PROFILES, &profile.class, profile)
    }

    /// Writes a policy document.
    ///
    /// # Errors
    /// The write fails.
    pub fn put_policy<T: Serialize>(&self, name: &str, policy: &T) -> Result<(), StoreError> {
        self.put(POLICIES, name, policy)
    }

    /// Makes every write so far durable.
    ///
    /// # Errors
    /// The flush fails (e.g. a full disk).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db
            .flush()
            .map(|_| ())
            .map_err(|source| StoreError::Io {
                tree: "flush",
                source,
            })
    }

    /// Reads everything back.
    ///
    /// # Errors
    /// A read fails or a record is corrupt.
    pub fn load(&self) -> Result<Snapshot, StoreError> {
        let registry = self
            .all::<SlotTypeRegistry>(SLOT_TYPES)?
            .into_iter()
            .next()
            .unwrap_or_default();
        Ok(Snapshot {
            registry,
            nodes: self.all(NODES)?,
            sessions: self.all(SESSIONS)?,
            profiles: self.all(PROFILES)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        allocator::Allocation,
        session::SessionState,
        slots::{ResourceSlot, SlotKind, SlotName},
    };

    /// A scratch directory (removed when dropped) and the store's path inside it.
    fn dir(name: &str) -> (tempfile::TempDir, PathBuf) {
        let scratch = gpuwarden_test_support::scratch(name);
        let d = scratch.path().join("store");
        (scratch, d)
    }

    fn session(id: &str) -> Session {
        Session {
            id: id.into(),
            name: id.into(),
            owner: "u".into(),
            priority: 0,
            requested: ResourceSlot::parse_any(&["cuda.shares=0.2"]).unwrap(),
            pinned_node: None,
            state: SessionState::Pending,
            node: None,
            allocation: Allocation::default(),
            reason: String::new(),
            seq: 0,
            failed_passes: 0,
            created_at_ms: 1,
            updated_at_ms: 1,
            target: crate::session::Target::None,
            policy: crate::session::QuotaPolicy::default(),
            events: vec![],
            class: String::new(),
            placement: None,
            explanation: None,
            usage: Default::default(),
        }
    }

    #[test]
    fn session_records_from_before_targets_still_load() {
        let mut old = serde_json::to_value(session("s1")).unwrap();
        for key in ["target", "policy", "events"] {
            old.as_object_mut().unwrap().remove(key);
        }
        let back: Session = serde_json::from_value(old).unwrap();
        assert_eq!(back, session("s1"));
    }

    #[test]
    fn records_survive_reopening() {
        let (_scratch, d) = dir("reopen");
        {
            let store = Store::open(&d).unwrap();
            store.put_session(&session("s1")).unwrap();
            let mut r = SlotTypeRegistry::new();
            r.merge(
                "n",
                &[(SlotName::new("cuda.shares").unwrap(), SlotKind::Count)],
            )
            .unwrap();
            store.put_registry(&r).unwrap();
            store.flush().unwrap();
        }
        let back = Store::open(&d).unwrap().load().unwrap();
        assert_eq!(back.sessions, vec![session("s1")]);
        assert_eq!(back.registry.kind("cuda.shares"), Some(SlotKind::Count));
    }

    #[test]
    fn another_format_version_is_refused() {
        let (_scratch, d) = dir("version");
        {
            let store = Store::open(&d).unwrap();
            store
                .tree(META)
                .unwrap()
                .insert("format_version", b"99")
                .unwrap();
            store.flush().unwrap();
        }
        let err = Store::open(&d).unwrap_err();
        assert!(err.to_string().contains("format version 99"), "{err}");
    }
}
