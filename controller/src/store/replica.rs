//! A standby's warm copy of an etcd store: every record, kept current by a watch, so that taking
//! office reads nothing but what changed last (docs/architecture.md, "One machine embeds, many
//! use etcd").
//!
//! The copy starts from one consistent read (every page at the same revision), then applies the
//! watch's events from the revision after. Before a new leader uses it, [`Replica::caught_up`]
//! waits until the copy has seen the revision at which it won: every write of the previous
//! leader was committed before that, so none is missing.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use etcd_client::{EventType, WatchOptions};
use tokio::sync::watch;

use super::{EtcdKv, StoreError};

/// The records and the revision they are current at.
#[derive(Debug, Default)]
struct Copy {
    records: BTreeMap<String, Vec<u8>>,
    /// Errors end the copy; a new one is made on the next takeover.
    failed: Option<String>,
}

/// A warm copy of every record under the store's prefix.
#[derive(Debug)]
pub struct Replica {
    copy: Arc<Mutex<Copy>>,
    revision: watch::Receiver<i64>,
    progress: tokio::sync::mpsc::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Replica {
    /// Every record, as of the last revision applied.
    #[must_use]
    pub fn records(&self) -> Vec<(String, Vec<u8>)> {
        self.lock()
            .records
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Whether the watch ended (the copy no longer follows the store).
    #[must_use]
    pub fn failed(&self) -> bool {
        self.lock().failed.is_some() || self.task.is_finished()
    }

    /// The revision the copy is current at.
    #[must_use]
    pub fn revision(&self) -> i64 {
        *self.revision.borrow()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Copy> {
        self.copy.locked()
    }

    /// Waits until the copy has applied everything up to `revision`.
    ///
    /// # Errors
    /// The watch ended, or it did not catch up within `within`.
    pub async fn caught_up(&self, revision: i64, within: Duration) -> Result<(), StoreError> {
        let lagging = |reason: String| StoreError::Io {
            what: "the standby's copy of the store".to_owned(),
            reason,
        };
        let mut seen = self.revision.clone();
        // etcd answers a progress request with the current revision once the watch has sent
        // everything before it.
        let _ = self.progress.try_send(());
        let wait = async {
            loop {
                if *seen.borrow_and_update() >= revision {
                    return Ok(());
                }
                if let Some(failed) = self.lock().failed.clone() {
                    return Err(lagging(failed));
                }
                if seen.changed().await.is_err() {
                    return Err(lagging("the watch ended".to_owned()));
                }
            }
        };
        tokio::time::timeout(within, wait)
            .await
            .unwrap_or_else(|_| {
                Err(lagging(format!(
                    "at revision {} after {within:?}, {revision} needed",
                    self.revision()
                )))
            })
    }
}

impl EtcdKv {
    /// Starts a warm copy of every record under this store's prefix.
    ///
    /// # Errors
    /// The first read or the watch can't be started.
    pub async fn replicate(&self) -> Result<Replica, StoreError> {
        let (records, at) = self.list_at("", None).await?;
        let copy = Arc::new(Mutex::new(Copy {
            records: records.into_iter().collect(),
            failed: None,
        }));
        let (revision_tx, revision) = watch::channel(at);
        let (progress, mut progress_rx) = tokio::sync::mpsc::channel::<()>(4);
        let io = |e: &etcd_client::Error| StoreError::Io {
            what: format!("watching {}", self.describe()),
            reason: e.to_string(),
        };
        let (mut requests, mut events) = self
            .client()
            .clone()
            .watch(
                self.prefix().to_owned(),
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(at + 1)
                        .with_progress_notify(),
                ),
            )
            .await
            .map_err(|e| io(&e))?
            .split();
        let prefix = self.prefix().to_owned();
        let shared = Arc::clone(&copy);
        let task = tokio::spawn(async move {
            let fail = |reason: String| {
                shared.locked().failed = Some(reason);
            };
            loop {
                tokio::select! {
                    Some(()) = progress_rx.recv() => {
                        if let Err(e) = requests.request_progress().await {
                            fail(e.to_string());
                            return;
                        }
                    }
                    message = events.message() => {
                        let response = match message {
                            Ok(Some(response)) => response,
                            Ok(None) => return fail("the watch closed".to_owned()),
                            Err(e) => return fail(e.to_string()),
                        };
                        if response.canceled() {
                            return fail(format!("the watch was cancelled: {}", response.cancel_reason()));
                        }
                        // Events carry their own revisions; a response with none is a progress
                        // report, whose header says everything before it has been sent.
                        let mut applied = response
                            .header()
                            .filter(|_| response.events().is_empty())
                            .map_or(0, etcd_client::ResponseHeader::revision);
                        {
                            let mut copy = shared.locked();
                            for event in response.events() {
                                let Some(kv) = event.kv() else { continue };
                                applied = applied.max(kv.mod_revision());
                                let key = String::from_utf8_lossy(kv.key());
                                let key = key.strip_prefix(&prefix).unwrap_or(&key).to_owned();
                                match event.event_type() {
                                    EventType::Put => {
                                        copy.records.insert(key, kv.value().to_vec());
                                    }
                                    EventType::Delete => {
                                        copy.records.remove(&key);
                                    }
                                }
                            }
                        }
                        revision_tx.send_modify(|r| *r = (*r).max(applied));
                    }
                }
            }
        });
        Ok(Replica {
            copy,
            revision,
            progress,
            task,
        })
    }
}
