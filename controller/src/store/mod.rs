//! The controller's store: the records it keeps (nodes, sessions, slot types, profiles,
//! policies) over a key-value backend, sled on one machine or etcd for many
//! (docs/architecture.md, "One machine embeds, many machines use etcd").
//!
//! Keys are `concern/id`; records are JSON (readable with any sled or etcd tool, and tolerant of
//! added fields). Writes go through group commit ([`Store::submit`], then [`Submitted::durable`]):
//! a reply that says "created" waits until its write is durable, and every change that arrives
//! while a commit is under way shares the next one.
//!
//! - `sled`: the embedded backend, one tree per concern, as stores have always been laid out;
//! - `etcd`: the distributed backend, every key under one prefix;
//! - `group`: group commit over either;
//! - `spec`: where the store lives, as `--store` names it ([`StoreSpec`]).

mod etcd;
mod group;
mod leadership;
mod replica;
mod sled;
mod spec;

use std::sync::Arc;

use serde::{Serialize, de::DeserializeOwned};

pub use self::{
    etcd::{EtcdKv, Fence},
    group::AfterCommit,
    leadership::Office,
    replica::Replica,
    sled::SledKv,
    spec::{DEFAULT_ETCD_PREFIX, StoreSpec},
};
use crate::{
    node::Node, profile::Profile, quota::QuotaConfig, session::Session, slots::SlotTypeRegistry,
};

/// The on-disk format this build reads and writes.
pub const FORMAT_VERSION: u32 = 1;

const FORMAT_KEY: &str = "meta/format_version";
const REVISIONS_KEY: &str = "meta/revisions";
const REGISTRY_KEY: &str = "slot_types/registry";
const NODES: &str = "nodes/";
const SESSIONS: &str = "sessions/";
const POLICIES: &str = "policies/";
const PROFILES: &str = "profiles/";
const SLOT_TYPES: &str = "slot_types/";
/// The team queues as an admin last set them (docs/teams.md): one record, so that removing the
/// last queue is kept too, and its presence says the config file's queues no longer apply.
const QUOTAS_KEY: &str = "policies/quotas";

/// Errors of the store. They carry their cause as text, so that one failed group commit can
/// answer every caller in it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store can't be opened or reached.
    #[error("cannot open the store at {at}: {reason}")]
    Open {
        /// Where: a directory or etcd endpoints.
        at: String,
        /// Why.
        reason: String,
    },
    /// A read or write failed (a full disk, etcd without a leader).
    #[error("store {what}: {reason}")]
    Io {
        /// What was read or written.
        what: String,
        /// Why.
        reason: String,
    },
    /// A group commit failed; its writes are kept and go with the next one.
    #[error("the store did not commit: {reason}")]
    Commit {
        /// Why.
        reason: String,
    },
    /// A fenced commit found that this controller no longer leads: nothing of it landed, and
    /// its writes are dropped (the new leader's state wins).
    #[error("this controller no longer leads: {reason}")]
    Deposed {
        /// Why.
        reason: String,
    },
    /// A record doesn't decode.
    #[error("store record {key:?} is corrupt: {reason}")]
    Corrupt {
        /// Its key.
        key: String,
        /// Why.
        reason: String,
    },
    /// A key outside the `concern/id` layout.
    #[error("store key {0:?} is not of the form concern/id")]
    Key(String),
    /// Written by another format version.
    #[error(
        "the store at {at} has format version {found}; this build reads version {FORMAT_VERSION}"
    )]
    Version {
        /// Where.
        at: String,
        /// The version found.
        found: u32,
    },
    /// `--store` can't be parsed.
    #[error(
        "--store {given:?}: {reason} (expected sled:PATH or etcd://HOST:PORT[,HOST:PORT…][/PREFIX])"
    )]
    Spec {
        /// What was given.
        given: String,
        /// What is wrong.
        reason: String,
    },
}

/// What the store keeps of the session revisions beyond each session's own (docs/architecture.md,
/// "Watching sessions"): written with every commit that forgets a session, so that neither the
/// counter nor the oldest revision a watch can resume from goes back after a restart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RevisionMark {
    /// The counter when it was written: no revision at or below it is handed out again.
    pub last: u64,
    /// The highest revision of a forgotten session's final state: a watch from before it may
    /// have missed that state, and is told to list again.
    pub compacted: u64,
}

/// One write of a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Set `key` to `value`.
    Put {
        /// `concern/id`.
        key: String,
        /// The record.
        value: Vec<u8>,
    },
    /// Remove `key`.
    Delete {
        /// `concern/id`.
        key: String,
    },
}

impl Write {
    /// Its key.
    #[must_use]
    pub fn key(&self) -> &str {
        match self {
            Self::Put { key, .. } | Self::Delete { key } => key,
        }
    }

    /// The value it puts.
    #[must_use]
    pub fn value(&self) -> Option<&[u8]> {
        match self {
            Self::Put { value, .. } => Some(value),
            Self::Delete { .. } => None,
        }
    }

    fn record<T: Serialize>(key: String, value: &T) -> Result<Self, StoreError> {
        let value = serde_json::to_vec(value).map_err(|e| StoreError::Corrupt {
            key: key.clone(),
            reason: e.to_string(),
        })?;
        Ok(Self::Put { key, value })
    }

    /// Writes a session.
    ///
    /// # Errors
    /// It can't be encoded.
    pub fn session(session: &Session) -> Result<Self, StoreError> {
        Self::record(format!("{SESSIONS}{}", session.id), session)
    }

    /// Removes a session (forgotten after it ended).
    #[must_use]
    pub fn remove_session(id: &str) -> Self {
        Self::Delete {
            key: format!("{SESSIONS}{id}"),
        }
    }

    /// Writes a node.
    ///
    /// # Errors
    /// It can't be encoded.
    pub fn node(node: &Node) -> Result<Self, StoreError> {
        Self::record(format!("{NODES}{}", node.report.node_id), node)
    }

    /// Writes the slot-type registry.
    ///
    /// # Errors
    /// It can't be encoded.
    pub fn registry(registry: &SlotTypeRegistry) -> Result<Self, StoreError> {
        Self::record(REGISTRY_KEY.to_owned(), registry)
    }

    /// Writes a workload class's profile.
    ///
    /// # Errors
    /// It can't be encoded.
    pub fn profile(profile: &Profile) -> Result<Self, StoreError> {
        Self::record(format!("{PROFILES}{}", profile.class), profile)
    }

    /// Writes the revision mark.
    ///
    /// # Errors
    /// It can't be encoded.
    pub fn revisions(mark: &RevisionMark) -> Result<Self, StoreError> {
        Self::record(REVISIONS_KEY.to_owned(), mark)
    }

    /// Writes the team queues (every queue and member at once).
    ///
    /// # Errors
    /// They can't be encoded.
    pub fn quotas(quotas: &QuotaConfig) -> Result<Self, StoreError> {
        Self::record(QUOTAS_KEY.to_owned(), quotas)
    }

    /// Writes a policy document.
    ///
    /// # Errors
    /// It can't be encoded.
    pub fn policy<T: Serialize>(name: &str, policy: &T) -> Result<Self, StoreError> {
        Self::record(format!("{POLICIES}{name}"), policy)
    }
}

/// The backend: the few operations the controller needs, on sled or etcd.
#[derive(Debug, Clone)]
pub enum Kv {
    /// sled on local disk.
    Sled(SledKv),
    /// An etcd cluster (boxed: its client is large).
    Etcd(Box<EtcdKv>),
}

impl Kv {
    /// The value at `key`.
    ///
    /// # Errors
    /// The read fails.
    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            Self::Sled(kv) => kv.get(key),
            Self::Etcd(kv) => kv.get(key).await,
        }
    }

    /// Every key under `prefix`, in key order.
    ///
    /// # Errors
    /// A read fails.
    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        match self {
            Self::Sled(kv) => kv.list(prefix),
            Self::Etcd(kv) => kv.list(prefix).await,
        }
    }

    /// Writes `value` at `key` if it holds `expected` (`None`: absent), durably; whether it did.
    ///
    /// # Errors
    /// The write fails.
    pub async fn compare_and_put(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        value: &[u8],
    ) -> Result<bool, StoreError> {
        match self {
            Self::Sled(kv) => kv.compare_and_put(key, expected, value),
            Self::Etcd(kv) => kv.compare_and_put(key, expected, value).await,
        }
    }

    /// Commits `writes` in order, durably; on etcd guarded on `fence` when given (sled has one
    /// writer, and no fence).
    ///
    /// # Errors
    /// The commit fails, or the fence no longer holds.
    pub async fn commit(
        &self,
        writes: Arc<[Write]>,
        fence: Option<&Fence>,
    ) -> Result<(), StoreError> {
        match self {
            // sled flushes with blocking I/O: off the async workers.
            Self::Sled(kv) => {
                let kv = kv.clone();
                tokio::task::spawn_blocking(move || kv.commit(&writes))
                    .await
                    .map_err(|e| StoreError::Commit {
                        reason: e.to_string(),
                    })?
            }
            Self::Etcd(kv) => kv.commit(&writes, fence).await,
        }
    }

    /// Where it is, for messages.
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            Self::Sled(kv) => format!("sled:{}", kv.path().display()),
            Self::Etcd(kv) => kv.describe(),
        }
    }
}

/// The store.
#[derive(Clone)]
pub struct Store {
    kv: Arc<Kv>,
    group: Arc<group::Group>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("kv", &self.kv)
            .finish_non_exhaustive()
    }
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
    /// The session revisions' mark (each session carries its own revision too).
    pub revisions: RevisionMark,
    /// The team queues as an admin last set them; `None`: never set, the config file's apply.
    pub quotas: Option<QuotaConfig>,
}

impl Snapshot {
    /// The state held in `records` (`concern/id` → JSON), as [`Store::load`] or a standby's
    /// warm copy have them; keys of other concerns are passed over.
    ///
    /// # Errors
    /// A record is corrupt.
    pub fn from_records(
        records: impl IntoIterator<Item = (String, Vec<u8>)>,
    ) -> Result<Self, StoreError> {
        fn decode<T: DeserializeOwned>(key: String, value: &[u8]) -> Result<T, StoreError> {
            serde_json::from_slice(value).map_err(|e| StoreError::Corrupt {
                key,
                reason: e.to_string(),
            })
        }
        let mut snapshot = Self::default();
        for (key, value) in records {
            if key == REGISTRY_KEY {
                snapshot.registry = decode(key, &value)?;
            } else if key.starts_with(NODES) {
                snapshot.nodes.push(decode(key, &value)?);
            } else if key.starts_with(SESSIONS) {
                snapshot.sessions.push(decode(key, &value)?);
            } else if key.starts_with(PROFILES) {
                snapshot.profiles.push(decode(key, &value)?);
            } else if key == REVISIONS_KEY {
                snapshot.revisions = decode(key, &value)?;
            } else if key == QUOTAS_KEY {
                snapshot.quotas = Some(decode(key, &value)?);
            }
        }
        Ok(snapshot)
    }
}

/// A change submitted to the store: await [`Submitted::durable`] before saying it happened.
#[must_use = "a change is not durable until `durable()` says so"]
pub struct Submitted {
    store: Store,
    rx: Option<tokio::sync::oneshot::Receiver<Result<(), StoreError>>>,
}

impl Submitted {
    /// Whether it waits for a commit (false: it had nothing to write, and is durable already).
    #[must_use]
    pub fn awaits_commit(&self) -> bool {
        self.rx.is_some()
    }

    /// Waits until the change is durable (committing it, and everything queued with it, if no
    /// commit is under way).
    ///
    /// # Errors
    /// The commit failed; its writes are kept and go with the next one.
    pub async fn durable(self) -> Result<(), StoreError> {
        match self.rx {
            Some(rx) => self.store.group.wait(&self.store.kv, rx).await,
            None => Ok(()),
        }
    }
}

/// How long [`Store::close`] waits for a commit under way to let the backend go.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

impl Store {
    /// Lets the backend go once no commit holds it any more (the committer ends after it has
    /// answered the last change, a moment later): sled's file lock goes with the last handle,
    /// so a store opened on the same place afterwards, in this process, finds it free at once
    /// rather than waiting for a task that may not have been scheduled yet. Gives up waiting
    /// (and drops its own handle) after [`CLOSE_WAIT`].
    pub async fn close(self) {
        let Self { mut kv, group } = self;
        drop(group);
        let started = std::time::Instant::now();
        loop {
            match Arc::try_unwrap(kv) {
                // sled joins its flusher thread on the last drop: off the async workers.
                Ok(last) => {
                    let _ = tokio::task::spawn_blocking(move || drop(last)).await;
                    return;
                }
                Err(shared) if started.elapsed() < CLOSE_WAIT => {
                    kv = shared;
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                Err(_) => return,
            }
        }
    }

    /// Opens the store `spec` names, checking (or, when new, writing) its format version.
    ///
    /// # Errors
    /// It can't be opened or reached, or it has another format version.
    pub async fn open(spec: &StoreSpec) -> Result<Self, StoreError> {
        let kv = match spec {
            StoreSpec::Sled(dir) => Kv::Sled(SledKv::open(dir)?),
            StoreSpec::Etcd {
                endpoints,
                prefix,
                tls,
            } => Kv::Etcd(Box::new(EtcdKv::connect(endpoints, prefix, tls).await?)),
        };
        Self::over(kv).await
    }

    /// The store over `kv`.
    ///
    /// # Errors
    /// It has another format version, or can't be read.
    pub async fn over(kv: Kv) -> Result<Self, StoreError> {
        let version = FORMAT_VERSION.to_string();
        if !kv
            .compare_and_put(FORMAT_KEY, None, version.as_bytes())
            .await?
        {
            let found = kv
                .get(FORMAT_KEY)
                .await?
                .and_then(|v| String::from_utf8(v).ok())
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            if found != FORMAT_VERSION {
                return Err(StoreError::Version {
                    at: kv.describe(),
                    found,
                });
            }
        }
        Ok(Self {
            kv: Arc::new(kv),
            group: Arc::new(group::Group::new(usize::MAX, None)),
        })
    }

    /// This store with every commit guarded on `fence` (a leader's): once another controller
    /// leads, commits fail with [`StoreError::Deposed`] and nothing of them lands.
    #[must_use]
    pub fn fenced(self, fence: Fence) -> Self {
        Self {
            kv: self.kv,
            group: Arc::new(group::Group::new(usize::MAX, Some(fence))),
        }
    }

    /// This store committing one change at a time: the baseline that shows what group commit
    /// saves (benchmarks only; a controller always groups).
    #[must_use]
    pub fn one_change_per_commit(self) -> Self {
        Self {
            kv: self.kv,
            group: Arc::new(group::Group::new(1, None)),
        }
    }

    /// The backend.
    #[must_use]
    pub fn kv(&self) -> &Kv {
        &self.kv
    }

    /// Queues `writes` for the next group commit; `after` runs once they are durable, in the
    /// order changes were submitted (submit under the lock that orders the changes). Nothing to
    /// write is durable at once.
    pub fn submit(&self, writes: Vec<Write>, after: Option<AfterCommit>) -> Submitted {
        if writes.is_empty() {
            if let Some(after) = after {
                after();
            }
            return Submitted {
                store: self.clone(),
                rx: None,
            };
        }
        let rx = self.group.submit(writes, after);
        Submitted {
            store: self.clone(),
            rx: Some(rx),
        }
    }

    /// Writes `writes` and waits until they are durable.
    ///
    /// # Errors
    /// The commit fails.
    pub async fn write(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        self.submit(writes, None).durable().await
    }

    /// Commits made, and the changes they carried: how well group commit groups.
    #[must_use]
    pub fn commit_counts(&self) -> (u64, u64) {
        self.group.counts()
    }

    /// Reads everything back.
    ///
    /// # Errors
    /// A read fails or a record is corrupt.
    pub async fn load(&self) -> Result<Snapshot, StoreError> {
        let mut records = Vec::new();
        for prefix in [SLOT_TYPES, NODES, SESSIONS, PROFILES] {
            records.extend(self.kv.list(prefix).await?);
        }
        for key in [REVISIONS_KEY, QUOTAS_KEY] {
            if let Some(value) = self.kv.get(key).await? {
                records.push((key.to_owned(), value));
            }
        }
        Snapshot::from_records(records)
    }

    /// Copies every record of `self` into `to` (a migration from sled to etcd, say); how many.
    ///
    /// # Errors
    /// A read or the writes fail.
    pub async fn copy_to(&self, to: &Self) -> Result<usize, StoreError> {
        let mut writes = Vec::new();
        for prefix in [SLOT_TYPES, NODES, SESSIONS, PROFILES, POLICIES] {
            for (key, value) in self.kv.list(prefix).await? {
                writes.push(Write::Put { key, value });
            }
        }
        if let Some(value) = self.kv.get(REVISIONS_KEY).await? {
            writes.push(Write::Put {
                key: REVISIONS_KEY.to_owned(),
                value,
            });
        }
        let n = writes.len();
        to.write(writes).await?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests;
