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
/// Moves onto other GPUs under way (issue 38), kept so that an agent that restarts in the
/// middle of one knows, and says so to the controller, which booked the new GPUs.
const MOVES_TREE: &str = "moves";

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
    /// Moves a previous run of the agent began and never settled: found on disk at open.
    interrupted: BTreeMap<String, pb::Allocate>,
    /// Those of them this run took up ([`Self::take_up_move`]), until they settle.
    taken_up: std::collections::BTreeSet<String>,
    tree: Option<sled::Tree>,
    moves_tree: Option<sled::Tree>,
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
        let moves_tree = db.open_tree(MOVES_TREE)?;
        Ok(Self {
            sessions: load(&tree)?,
            moves: BTreeMap::new(),
            taken_up: std::collections::BTreeSet::new(),
            interrupted: load(&moves_tree)?,
            tree: Some(tree),
            moves_tree: Some(moves_tree),
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
    /// The move is written down first, so that a restart in its middle is known
    /// ([`Self::interrupted`]).
    ///
    /// # Errors
    /// The write failed: the move must not start.
    pub fn propose_move(&mut self, allocate: pb::Allocate) -> Result<(), HoldingsError> {
        if let Some(tree) = &self.moves_tree {
            tree.insert(allocate.session_id.as_bytes(), allocate.encode_to_vec())?;
            tree.flush()?;
        }
        self.moves.insert(allocate.session_id.clone(), allocate);
        Ok(())
    }

    /// The move of `session` ended: held if it `resumed`, forgotten otherwise.
    ///
    /// # Errors
    /// The write failed.
    pub fn settle_move(&mut self, session: &str, resumed: bool) -> Result<(), HoldingsError> {
        let moved = self.moves.remove(session);
        if let Some(allocate) = moved
            && resumed
            && self.sessions.contains_key(session)
        {
            self.hold(allocate)?;
        }
        self.forget_move(session)
    }

    /// Moves onto other GPUs that an earlier run of the agent began and did not settle (it
    /// stopped between the controller's `Resume` and its answer), with the allocation each was
    /// going to, for sessions still held.
    #[must_use]
    pub fn interrupted(&self) -> Vec<pb::Allocate> {
        self.interrupted
            .values()
            .filter(|a| self.sessions.contains_key(&a.session_id))
            .cloned()
            .collect()
    }

    /// Takes up the interrupted move of `session` as this run's own: no longer listed by
    /// [`Self::interrupted`], kept on disk until it settles ([`Self::settle_move`]).
    pub fn take_up_move(&mut self, session: &str) {
        if let Some(allocate) = self.interrupted.remove(session) {
            self.moves.insert(session.to_owned(), allocate);
            self.taken_up.insert(session.to_owned());
        }
    }

    /// Whether the move of `session` is one an earlier run began and this run took up.
    #[must_use]
    pub fn took_up(&self, session: &str) -> bool {
        self.taken_up.contains(session)
    }

    /// Forgets the move of `session` on disk (and an interrupted one in memory).
    ///
    /// # Errors
    /// The write failed.
    pub fn forget_move(&mut self, session: &str) -> Result<(), HoldingsError> {
        self.interrupted.remove(session);
        self.taken_up.remove(session);
        if let Some(tree) = &self.moves_tree
            && tree.remove(session.as_bytes())?.is_some()
        {
            tree.flush()?;
        }
        Ok(())
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
        self.forget_move(session)
    }
}

/// The allocations of a tree, by session.
fn load(tree: &sled::Tree) -> Result<BTreeMap<String, pb::Allocate>, HoldingsError> {
    let mut out = BTreeMap::new();
    for item in tree {
        let (k, v) = item?;
        let session = String::from_utf8_lossy(&k).into_owned();
        let allocate =
            pb::Allocate::decode(v.as_ref()).map_err(|source| HoldingsError::Corrupt {
                session: session.clone(),
                source,
            })?;
        out.insert(session, allocate);
    }
    Ok(out)
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

    fn on(session: &str, index: u32) -> pb::Allocate {
        pb::Allocate {
            session_id: session.into(),
            devices: vec![pb::DeviceShare {
                index,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// A move begun and not settled is found by the next run, which still holds the old GPUs;
    /// a settled one (either way) and a released session's are not.
    #[test]
    fn a_move_cut_short_by_a_restart_is_found_by_the_next_run() {
        let scratch = gpuwarden_test_support::scratch("holdings-moves");
        let dir = scratch.path().join("store");
        {
            let mut h = Holdings::open(&dir).unwrap();
            for id in ["cut", "done", "refused", "gone"] {
                h.hold(on(id, 0)).unwrap();
                h.propose_move(on(id, 1)).unwrap();
            }
            h.settle_move("done", true).unwrap();
            h.settle_move("refused", false).unwrap();
            h.release("gone").unwrap();
            assert!(
                h.interrupted().is_empty(),
                "this run's own moves are not interrupted"
            );
        }
        let mut h = Holdings::open(&dir).unwrap();
        let cut = h.interrupted();
        assert_eq!(cut.len(), 1, "{cut:?}");
        assert_eq!(
            (cut[0].session_id.as_str(), cut[0].devices[0].index),
            ("cut", 1)
        );
        assert_eq!(
            h.get("cut").unwrap().devices[0].index,
            0,
            "the old GPU is held"
        );
        assert_eq!(h.get("done").unwrap().devices[0].index, 1);
        assert_eq!(h.get("refused").unwrap().devices[0].index, 0);
        h.forget_move("cut").unwrap();
        drop(h);
        assert!(Holdings::open(&dir).unwrap().interrupted().is_empty());
    }
}
