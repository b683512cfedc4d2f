//! What the node does for Kubernetes, as the controller hears of it: the GPUs offered to
//! Kubernetes and the claims prepared on them, reported up the stream as sessions the controller
//! observes but did not place (docs/kubernetes.md, "The agent as DRA driver").
//!
//! The DRA plugin records each prepared claim here and forgets it when unprepared; the link
//! sends the whole set at each registration and, while connected, each change as it happens.
//! Changes made while no controller listens are not queued: the next registration carries the
//! set as it is then, so nothing grows while the controller is away.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Mutex, MutexGuard},
};

use gpuwarden_proto::v1 as pb;
use tokio::sync::Notify;

/// The GPUs offered to Kubernetes and the claims held on them.
#[derive(Debug, Default)]
pub struct Observed {
    /// As the DRA plugin last read them (MIG instances come and go while the agent runs).
    gpus: Mutex<Vec<pb::Device>>,
    inner: Mutex<Inner>,
    changed: Notify,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: BTreeMap<String, pb::ObservedSession>,
    /// Sessions changed since the controller last heard of them.
    dirty: BTreeSet<String>,
}

impl Observed {
    /// Nothing held yet on `gpus`, the GPUs offered to Kubernetes.
    #[must_use]
    pub fn new(gpus: Vec<pb::Device>) -> Self {
        Self {
            gpus: Mutex::new(gpus),
            ..Self::default()
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.locked()
    }

    /// The GPUs offered to Kubernetes now, for the registration.
    #[must_use]
    pub fn kubernetes_devices(&self) -> Vec<pb::Device> {
        self.gpus.locked().clone()
    }

    /// The GPUs offered to Kubernetes are `gpus` from now on (a MIG instance made or destroyed
    /// by the operator); the next registration carries them.
    pub fn set_kubernetes_devices(&self, gpus: Vec<pb::Device>) {
        *self.gpus.locked() = gpus;
    }

    /// The node holds `session` (a claim prepared, or prepared before a restart).
    pub fn hold(&self, session: pb::ObservedSession) {
        let mut inner = self.lock();
        if inner.sessions.get(&session.session_id) == Some(&session) {
            return;
        }
        inner.dirty.insert(session.session_id.clone());
        inner.sessions.insert(session.session_id.clone(), session);
        drop(inner);
        self.changed.notify_one();
    }

    /// The node no longer holds session `id` (its claim was unprepared).
    pub fn end(&self, id: &str) {
        let mut inner = self.lock();
        if inner.sessions.remove(id).is_none() {
            return;
        }
        inner.dirty.insert(id.to_owned());
        drop(inner);
        self.changed.notify_one();
    }

    /// Every session held, for a registration; the controller rebuilds its view from it, so
    /// earlier changes need not be sent again.
    #[must_use]
    pub fn registration(&self) -> Vec<pb::ObservedSession> {
        let mut inner = self.lock();
        inner.dirty.clear();
        inner.sessions.values().cloned().collect()
    }

    /// What changed since the last registration or call: each session held as it is now, each
    /// ended one as its end.
    #[must_use]
    pub fn take_changes(&self) -> Vec<pb::ObservedSession> {
        let mut inner = self.lock();
        let dirty = std::mem::take(&mut inner.dirty);
        dirty
            .into_iter()
            .map(|id| {
                inner
                    .sessions
                    .get(&id)
                    .cloned()
                    .unwrap_or(pb::ObservedSession {
                        session_id: id,
                        ended: true,
                        ..pb::ObservedSession::default()
                    })
            })
            .collect()
    }

    /// Resolves once something changed since the last [`Self::take_changes`] (at once if a
    /// change came while nobody waited).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(id: &str, shares: &str) -> pb::ObservedSession {
        pb::ObservedSession {
            session_id: id.into(),
            devices: vec![pb::DeviceShare {
                index: 2,
                shares: shares.into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn changes_go_up_once_and_a_registration_carries_the_whole_set() {
        let observed = Observed::new(vec![]);
        observed.hold(session("k8s-a", "0.5"));
        observed.hold(session("k8s-b", "0.25"));
        // Nobody waited: the change is kept for the next wait.
        observed.changed().await;
        let ids: Vec<String> = observed
            .take_changes()
            .into_iter()
            .map(|s| s.session_id)
            .collect();
        assert_eq!(ids, ["k8s-a", "k8s-b"]);
        assert!(observed.take_changes().is_empty());
        // The same again is no change.
        observed.hold(session("k8s-a", "0.5"));
        assert!(observed.take_changes().is_empty());
        observed.end("k8s-a");
        observed.end("k8s-unknown");
        let ended = observed.take_changes();
        assert_eq!(ended.len(), 1);
        assert!(ended[0].ended && ended[0].session_id == "k8s-a");
        // Changed while away: the registration has the set as it is, and nothing stays queued.
        observed.hold(session("k8s-c", "0.1"));
        observed.end("k8s-b");
        let held: Vec<String> = observed
            .registration()
            .into_iter()
            .map(|s| s.session_id)
            .collect();
        assert_eq!(held, ["k8s-c"]);
        assert!(observed.take_changes().is_empty());
    }
}
