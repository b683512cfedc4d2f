//! Word that the node's device list changed (a MIG instance made or destroyed), to the task
//! that writes the programs' instance table from it, and the wait for that write.
//!
//! The word carries nothing: the receiver reads the list from its backend, which sees every
//! GPU, not only the sender's. A sender that must not go on before the table is written (the
//! controller link registers again after a layout change, and the controller may then place a
//! workload on the new instance at once) waits for it ([`DeviceChanges::written`]): memory
//! allocated on an instance before the table names it would be counted as its parent's.

use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

/// How long a sender waits for the table to be written before it goes on regardless (the
/// writer is a local task; a wait this long means it is stuck or gone).
const WRITE_WAIT: Duration = Duration::from_secs(5);

/// The sending side: cheap to clone.
#[derive(Debug, Clone)]
pub struct DeviceChanges {
    tx: mpsc::UnboundedSender<Option<oneshot::Sender<()>>>,
}

/// The receiving side, held by the task that writes the table.
#[derive(Debug)]
pub struct DeviceChangesRx {
    rx: mpsc::UnboundedReceiver<Option<oneshot::Sender<()>>>,
}

/// A pair of ends.
#[must_use]
pub fn channel() -> (DeviceChanges, DeviceChangesRx) {
    let (tx, rx) = mpsc::unbounded_channel();
    (DeviceChanges { tx }, DeviceChangesRx { rx })
}

impl DeviceChanges {
    /// Says the list changed, without waiting. Nobody listening (the agent stopping) is no
    /// error.
    pub fn notify(&self) {
        let _ = self.tx.send(None);
    }

    /// Says the list changed and waits until the table has been written from the list as it is
    /// now (at most a few seconds; a writer that is gone ends the wait at once).
    pub async fn written(&self) {
        let (done, wait) = oneshot::channel();
        if self.tx.send(Some(done)).is_err() {
            return;
        }
        if tokio::time::timeout(WRITE_WAIT, wait).await.is_err() {
            tracing::warn!(
                "the MIG instance table was not written within {WRITE_WAIT:?} of a layout change; going on"
            );
        }
    }
}

impl DeviceChangesRx {
    /// Waits for the next change; every change waiting by then is taken with it (one write
    /// serves them all). The senders waiting on them are given back, to be told once the write
    /// is done; `None` when every sender is gone.
    pub async fn next(&mut self) -> Option<Vec<oneshot::Sender<()>>> {
        let first = self.rx.recv().await?;
        let mut waiting: Vec<_> = first.into_iter().collect();
        while let Ok(more) = self.rx.try_recv() {
            waiting.extend(more);
        }
        Some(waiting)
    }
}

/// Tells each waiting sender the write is done.
pub fn done(waiting: Vec<oneshot::Sender<()>>) {
    for w in waiting {
        let _ = w.send(());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sender_waits_until_the_write_it_asked_for_is_done() {
        let (changes, mut rx) = channel();
        changes.notify();
        let waiter = tokio::spawn({
            let changes = changes.clone();
            async move { changes.written().await }
        });
        // Both changes are taken by one write; the waiting sender is among them.
        let waiting = loop {
            let w = rx.next().await.expect("a sender");
            if !w.is_empty() {
                break w;
            }
        };
        assert!(!waiter.is_finished(), "it waits for the write");
        done(waiting);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("told once the write is done")
            .expect("no panic");
    }

    #[tokio::test]
    async fn a_writer_that_is_gone_ends_the_wait() {
        let (changes, rx) = channel();
        drop(rx);
        tokio::time::timeout(Duration::from_secs(1), changes.written())
            .await
            .expect("no wait without a writer");
    }
}
