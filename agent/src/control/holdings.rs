//! What the node holds for the controller: allocations by session, persisted in the agent's sled
//! store so a restarted agent reports them (docs/architecture.md, "The agent is the source of
//! truth for its node").

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
};

use gpuwarden_proto::v1 as pb;
use prost::Message as _;

const TREE: &str = "holdings";

/// Errors of the holdings store.
#[derive(Debug, thiserror::Error)]
pub enum HoldingsError {
    /// The store can't be opened.
    #[error("cannot open the agent store at {path}: {source}")]
    Open {
        /// Its directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: sled::Error,
    },
    /// A write or flush failed (e.g. a full disk).
    #[error("agent store: {0}")]
    Io(#[from] sled::Error),
    /// A record doesn't decode.
    #[error("agent store: holding {session:?} is corrupt: {source}")]
    Corrupt {
        /// Its key.
        session: String,
        /// Why.
        #[source]
        source: prost::DecodeError,
    },
}

/// Allocations by session, in memory and (when opened on a directory) on disk.
#[derive(Debug, Default)]
pub struct Holdings {
    sessions: BTreeMap<String, pb::Allocate>,
    /// Allocations on other GPUs that suspended sessions are resuming onto (issue 38): held in
    /// place of the old ones once the resumption succeeds ([`Self::settle_move`]).
    moves: BTreeMap<String, pb::Allocate>,
    tree: Option<sled::Tree>,
    db: Option<sled::Db>,
}

impl Holdings {
    /// Opens the store in `dir` and loads what it holds.
    ///
    /// # Errors
    /// The store can't be opened or a record is corrupt.
    pub fn open(dir: &Path) -> Result<Self, HoldingsError> {
        let db = sled::open(dir).map_err(|source| HoldingsError::Open {
            path: dir.to_owned(),
            source,
        })?;
        let tree = db.open_tree(TREE)?;
        let mut sessions = BTreeMap::new();
        for item in &tree {
            let (k, v) = item?;
            let session = String::from_utf8_lossy(&k).into_owned();
            let allocate =
                pb::Allocate::decode(v.as_ref()).map_err(|source| HoldingsError::Corrupt {
                    session: session.clone(),
                    source,
                })?;
            sessions.insert(session, allocate);
        }
        Ok(Self {
            sessions,
            moves: BTreeMap::new(),
            tree: Some(tree),
            db: Some(db),
        })
    }

    /// Another tree of the same store (the DRA plugin's prepared claims); `None` for holdings
    /// kept in memory only.
    ///
    /// # Errors
    /// The tree can't be opened.
    pub fn open_tree(&self, name: &str) -> Result<Option<sled::Tree>, HoldingsError> {
        Ok(self.db.as_ref().map(|db| db.open_tree(name)).transpose()?)
    }

    /// Sessions held.
    #[must_use]
    pub fn sessions(&self) -> Vec<String> {
        self.sessions.keys().cloned().collect()
    }

    /// What `session` holds.
    #[must_use]
    pub fn get(&self, session: &str) -> Option<&pb::Allocate> {
        self.sessions.get(session)
    }

    /// Holds `allocate`, durably before returning.
    ///
    /// # Errors
    /// The write failed; nothing is held then.
    pub fn hold(&mut self, allocate: pb::Allocate) -> Result<(), HoldingsError> {
        if let Some(tree) = &self.tree {
            tree.insert(allocate.session_id.as_bytes(), allocate.encode_to_vec())?;
            tree.flush()?;
        }
        self.sessions.insert(allocate.session_id.clone(), allocate);
        Ok(())
    }

    /// Notes that `allocate`'s session is resuming onto its GPUs, other than those it holds:
    /// held only once it has ([`Self::settle_move`]), so that a refused move leaves the old ones.
    pub fn propose_move(&mut self, allocate: pb::Allocate) {
        self.moves.insert(allocate.session_id.clone(), allocate);
    }

    /// The move of `session` ended: held if it `resumed`, forgotten otherwise.
    ///
    /// # Errors
    /// The write failed.
    pub fn settle_move(&mut self, session: &str, resumed: bool) -> Result<(), HoldingsError> {
        match self.moves.remove(session) {
            Some(allocate) if resumed && self.sessions.contains_key(session) => self.hold(allocate),
            _ => Ok(()),
        }
    }

    /// Lets go of `session`.
    ///
    /// # Errors
    /// The write failed; it is forgotten in memory all the same (the controller ended it).
    pub fn release(&mut self, session: &str) -> Result<(), HoldingsError> {
        self.sessions.remove(session);
        self.moves.remove(session);
        if let Some(tree) = &self.tree {
            tree.remove(session.as_bytes())?;
            tree.flush()?;
        }
        Ok(())
    }
}

/// Holdings shared between the link and the local interface.
pub type SharedHoldings = Arc<Mutex<Holdings>>;

/// Locks the holdings (a panicked holder leaves them as they were).
pub fn lock(h: &SharedHoldings) -> MutexGuard<'_, Holdings> {
    h.locked()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holdings_survive_a_restart() {
        let scratch = gpuwarden_test_support::scratch("holdings");
        let dir = scratch.path().join("store");
        {
            let mut h = Holdings::open(&dir).unwrap();
            for id in ["s1", "s2"] {
                h.hold(pb::Allocate {
                    session_id: id.into(),
                    ..Default::default()
                })
                .unwrap();
            }
            h.release("s1").unwrap();
        }
        let h = Holdings::open(&dir).unwrap();
        assert_eq!(h.sessions(), vec!["s2".to_owned()]);
        assert!(h.get("s2").is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
