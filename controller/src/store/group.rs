//! Group commit: every change submitted while a commit is under way goes into the next one, so
//! the store is flushed (or sent one etcd transaction) per group, not per change, and each caller
//! is answered when its own change is durable.
//!
//! There is no committer task. The first waiter that finds no commit under way takes the lane and
//! commits everything queued, its own change and the others'; the others find their answer when
//! they get the lane. The commit itself runs in a task of its own that holds the lane, so a
//! caller that goes away (a client that hangs up) cannot cut a group off half-way, and groups are
//! committed in the order their changes were submitted.

use gpuwarden_runtime::sync::Lock as _;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::{Fence, Kv, StoreError, Write};

/// What to run once a change is durable (announce it to watchers, say).
pub type AfterCommit = Box<dyn FnOnce() + Send>;

/// One submitted change.
struct Entry {
    writes: Vec<Write>,
    after: Option<AfterCommit>,
    done: oneshot::Sender<Result<(), StoreError>>,
}

/// Changes waiting for the next commit, and the commits done (for tests and metrics).
#[derive(Default)]
struct Queue {
    entries: Vec<Entry>,
    /// Writes of a failed commit, written with the next one (the change is still in memory).
    retry: Vec<Write>,
    /// What was to run once those writes were durable, in submission order: run when they
    /// are, before anything submitted since (so watchers still hear of every change, in order).
    retry_after: Vec<AfterCommit>,
    commits: u64,
    changes: u64,
}

/// The answer to a change, once there is one. A commit task that ended without answering (it
/// panicked) leaves no way to know whether the change landed: that is an error, not a wait for
/// ever.
fn answered(rx: &mut oneshot::Receiver<Result<(), StoreError>>) -> Option<Result<(), StoreError>> {
    match rx.try_recv() {
        Ok(result) => Some(result),
        Err(oneshot::error::TryRecvError::Empty) => None,
        Err(oneshot::error::TryRecvError::Closed) => Some(Err(StoreError::Commit {
            reason: "the commit carrying this change ended without an answer".to_owned(),
        })),
    }
}

/// The queue and the lane of one store.
pub(super) struct Group {
    queue: Mutex<Queue>,
    lane: Arc<tokio::sync::Mutex<()>>,
    /// Changes per commit at most: unbounded, or 1 to measure what grouping saves.
    most: usize,
    /// What every commit is guarded on, for a leader.
    fence: Option<Fence>,
}

impl Group {
    pub(super) fn new(most: usize, fence: Option<Fence>) -> Self {
        Self {
            queue: Mutex::new(Queue::default()),
            lane: Arc::new(tokio::sync::Mutex::new(())),
            most: most.max(1),
            fence,
        }
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.locked()
    }

    /// Queues `writes`; `after` runs once they are durable, in submission order.
    pub(super) fn submit(
        &self,
        writes: Vec<Write>,
        after: Option<AfterCommit>,
    ) -> oneshot::Receiver<Result<(), StoreError>> {
        let (done, rx) = oneshot::channel();
        self.queue().entries.push(Entry {
            writes,
            after,
            done,
        });
        rx
    }

    /// Commits done and changes they carried.
    pub(super) fn counts(&self) -> (u64, u64) {
        let q = self.queue();
        (q.commits, q.changes)
    }

    /// Waits until the change behind `rx` is durable, committing the queue if nobody is.
    pub(super) async fn wait(
        self: &Arc<Self>,
        kv: &Arc<Kv>,
        mut rx: oneshot::Receiver<Result<(), StoreError>>,
    ) -> Result<(), StoreError> {
        loop {
            if let Some(result) = answered(&mut rx) {
                return result;
            }
            let lane = Arc::clone(&self.lane).lock_owned().await;
            // Whoever held the lane before may have committed this change already; if not, it
            // is still queued, and this caller commits the queue (up to `most` changes of it).
            if let Some(result) = answered(&mut rx) {
                return result;
            }
            let (entries, retry) = {
                let mut q = self.queue();
                let take = q.entries.len().min(self.most);
                let entries: Vec<Entry> = q.entries.drain(..take).collect();
                let retry = (
                    std::mem::take(&mut q.retry),
                    std::mem::take(&mut q.retry_after),
                );
                (entries, retry)
            };
            let group = Arc::clone(self);
            let kv = Arc::clone(kv);
            let commit = tokio::spawn(async move {
                let _lane = lane;
                group.commit(&kv, entries, retry).await;
            });
            // Its answer is in `rx` now, or this change was beyond `most`: take the lane again.
            let _ = commit.await;
        }
    }

    async fn commit(
        &self,
        kv: &Kv,
        mut entries: Vec<Entry>,
        (retry, mut retry_after): (Vec<Write>, Vec<AfterCommit>),
    ) {
        let mut writes = retry;
        for e in &mut entries {
            writes.append(&mut e.writes);
        }
        // Shared with the commit rather than copied: the bytes are copied only to keep them
        // after a failure.
        let writes: Arc<[Write]> = latest_per_key(writes).into();
        let result = if writes.is_empty() {
            Ok(())
        } else {
            kv.commit(Arc::clone(&writes), self.fence.as_ref()).await
        };
        {
            let mut q = self.queue();
            q.commits += 1;
            q.changes += entries.len() as u64;
            // Keep what failed, ahead of anything queued since; but a deposed leader's writes
            // must never land.
            if result.is_err() && !matches!(result, Err(StoreError::Deposed { .. })) {
                let mut kept = writes.to_vec();
                kept.append(&mut q.retry);
                q.retry = kept;
                let mut after = std::mem::take(&mut retry_after);
                after.extend(entries.iter_mut().filter_map(|e| e.after.take()));
                after.append(&mut q.retry_after);
                q.retry_after = after;
            }
        }
        match &result {
            Err(e @ StoreError::Deposed { .. }) => {
                tracing::error!(changes = entries.len(), "commit refused, dropped: {e}");
            }
            Err(e) => tracing::error!(
                changes = entries.len(),
                "committing to the store failed (kept, written with the next commit): {e}"
            ),
            Ok(()) => {}
        }
        if result.is_ok() {
            for after in retry_after {
                after();
            }
        }
        for entry in entries {
            if result.is_ok()
                && let Some(after) = entry.after
            {
                after();
            }
            let _ = entry.done.send(result.clone());
        }
    }
}

/// The last write of each key, in the order of those last writes: what the group leaves behind
/// is the same, and etcd refuses a transaction that names a key twice.
fn latest_per_key(writes: Vec<Write>) -> Vec<Write> {
    let mut seen = std::collections::HashSet::new();
    let mut kept: Vec<Write> = writes
        .into_iter()
        .rev()
        .filter(|w| seen.insert(w.key().to_owned()))
        .collect();
    kept.reverse();
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, value: &str) -> Write {
        Write::Put {
            key: key.to_owned(),
            value: value.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_group_keeps_the_last_write_of_each_key_in_order() {
        let writes = vec![
            put("sessions/a", "1"),
            put("sessions/b", "1"),
            put("sessions/a", "2"),
            Write::Delete {
                key: "sessions/b".to_owned(),
            },
            put("nodes/n", "1"),
        ];
        assert_eq!(
            latest_per_key(writes),
            [
                put("sessions/a", "2"),
                Write::Delete {
                    key: "sessions/b".to_owned()
                },
                put("nodes/n", "1"),
            ]
        );
    }
}
