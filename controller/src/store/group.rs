//! Group commit: every change submitted while a commit is under way goes into the next one, so
//! the store is flushed (or sent one etcd transaction) per group, not per change, and each caller
//! is answered when its own change is durable.
//!
//! The first waiter that finds no committer running starts one: a task that commits what is
//! queued, then what was queued meanwhile, until the queue is empty, and answers each change as
//! its group lands. Waiters only wait for their own answer; they never queue behind one another
//! (when each had to take a lane in turn to learn its change had landed, a group's 64 waiters
//! woke one after another, and that, not the flush, set the latency of a create). The committer
//! is a task of its own, so a caller that goes away (a client that hangs up) cannot cut a group
//! off half-way, and one committer at a time commits groups in the order their changes were
//! submitted.

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
    /// A committer task runs (see [`Group::start_committer`]).
    committing: bool,
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

/// The queue of one store.
pub(super) struct Group {
    queue: Mutex<Queue>,
    /// Changes per commit at most: unbounded, or 1 to measure what grouping saves.
    most: usize,
    /// What every commit is guarded on, for a leader.
    fence: Option<Fence>,
}

impl Group {
    pub(super) fn new(most: usize, fence: Option<Fence>) -> Self {
        Self {
            queue: Mutex::new(Queue::default()),
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

    /// Waits until the change behind `rx` is durable, starting the committer if none runs.
    pub(super) async fn wait(
        self: &Arc<Self>,
        kv: &Arc<Kv>,
        mut rx: oneshot::Receiver<Result<(), StoreError>>,
    ) -> Result<(), StoreError> {
        if let Some(result) = answered(&mut rx) {
            return result;
        }
        self.start_committer(kv);
        rx.await.unwrap_or_else(|_| {
            Err(StoreError::Commit {
                reason: "the commit carrying this change ended without an answer".to_owned(),
            })
        })
    }

    /// Starts the committer unless one runs. It commits group after group while changes are
    /// queued, so a waiter is answered by the commit that carries its change and never queues
    /// behind the other waiters.
    fn start_committer(self: &Arc<Self>, kv: &Arc<Kv>) {
        {
            let mut q = self.queue();
            if q.committing || q.entries.is_empty() {
                return;
            }
            q.committing = true;
        }
        let group = Arc::clone(self);
        let kv = Arc::clone(kv);
        tokio::spawn(async move {
            // Clears `committing` however the task ends (a panicking commit included), so the
            // next waiter starts another.
            let mut running = Committing {
                group: &group,
                stopped: false,
            };
            while let Some(batch) = running.next_batch() {
                group.commit(&kv, batch.0, batch.1).await;
            }
        });
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

/// The committer's hold on its group: takes the next batch, and stops the committer (under the
/// same lock a waiter checks) once none is queued or the task ends.
struct Committing<'a> {
    group: &'a Group,
    /// `next_batch` found the queue empty and stopped the committer under the lock: another may
    /// run by now, and dropping this must not touch its flag.
    stopped: bool,
}

/// A batch to commit: the queued changes, and a failed commit's writes to write with them.
type Batch = (Vec<Entry>, (Vec<Write>, Vec<AfterCommit>));

impl Committing<'_> {
    fn next_batch(&mut self) -> Option<Batch> {
        let mut q = self.group.queue();
        if q.entries.is_empty() {
            q.committing = false;
            self.stopped = true;
            return None;
        }
        let take = q.entries.len().min(self.group.most);
        let entries: Vec<Entry> = q.entries.drain(..take).collect();
        let retry = (
            std::mem::take(&mut q.retry),
            std::mem::take(&mut q.retry_after),
        );
        Some((entries, retry))
    }
}

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        if !self.stopped {
            self.group.queue().committing = false;
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
