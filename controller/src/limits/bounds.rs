//! [`Bounds`]: what a server's parts share at run time: the limits, the open Watch streams per
//! caller ([`WatchGuard`]), each client's token bucket, the counters of what was refused and of
//! who was refused for identity, and whether plain text is served beyond loopback.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use tonic::Status;

use super::{Bucket, Denials, LimitError, Limits, Refusal, Refusals};

/// What a server's parts share at run time: the limits, the open Watch streams, and the
/// counters of what was refused.
#[derive(Debug, Default)]
pub struct Bounds {
    /// The limits.
    pub limits: Limits,
    /// What was refused or dropped, by reason.
    refusals: Refusals,
    /// Who was refused for identity, by reason (shared with each [`crate::auth::clients::Caller`]).
    denials: Arc<Denials>,
    /// Open Watch streams per caller, and in total.
    watches: Mutex<(HashMap<String, usize>, usize)>,
    /// Each client's calls.
    pub(super) clients: Mutex<HashMap<String, Bucket>>,
    /// Set once the server behind these bounds serves plain text beyond loopback (`--insecure`).
    insecure: AtomicBool,
}

/// Clients whose buckets are kept before full ones (idle clients) are forgotten. Callers are
/// authenticated, so there are no more of them than credentials; this only keeps memory in step
/// with the clients that call.
pub(super) const CLIENT_BUCKETS: usize = 4_096;

impl Bounds {
    /// Bounds with `limits` and nothing open.
    #[must_use]
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            refusals: Refusals::default(),
            denials: Arc::default(),
            watches: Mutex::default(),
            clients: Mutex::default(),
            insecure: AtomicBool::new(false),
        })
    }

    /// Whether the server behind these bounds serves plain text on an address other machines
    /// reach (`--insecure`): the `gpuwarden.controller.insecure` gauge.
    #[must_use]
    pub fn serving_insecure(&self) -> bool {
        self.insecure.load(Ordering::Relaxed)
    }

    /// Marks the server behind these bounds as serving plain text beyond loopback.
    pub fn mark_serving_insecure(&self) {
        self.insecure.store(true, Ordering::Relaxed);
    }

    /// What these bounds refused or dropped, by reason.
    #[must_use]
    pub fn refusals(&self) -> &Refusals {
        &self.refusals
    }

    /// Who these bounds' server refused for identity, by reason: counted by the TLS listener,
    /// the identity checks and the client authorizer, read by the metrics.
    #[must_use]
    pub fn denials(&self) -> &Arc<Denials> {
        &self.denials
    }

    /// Counts one refusal or drop that is not a [`LimitError`] (a connection over a cap, an
    /// agent's message dropped).
    pub fn count(&self, reason: Refusal) {
        self.refusals.count(reason);
    }

    /// Counts `e` under its reason, then answers the status a caller gets for it
    /// ([`LimitError::to_status`]).
    #[must_use]
    pub fn refuse(&self, e: &LimitError) -> Status {
        self.count(e.reason());
        e.to_status()
    }

    /// What a check of these bounds' limits found, for a gRPC method: its value, or its
    /// refusal counted and answered ([`Self::refuse`]).
    ///
    /// # Errors
    /// `checked` is a refusal.
    pub fn counted<T>(&self, checked: Result<T, LimitError>) -> Result<T, Status> {
        checked.map_err(|e| self.refuse(&e))
    }

    /// Takes one call of `caller` from its bucket.
    ///
    /// # Errors
    /// The caller is over its rate: `RESOURCE_EXHAUSTED`, naming the limits.
    pub fn admit_call(&self, caller: &str) -> Result<(), LimitError> {
        let (rate, burst) = (
            self.limits.client_requests_per_sec,
            self.limits.client_request_burst,
        );
        let mut clients = self.clients.locked();
        if clients.len() >= CLIENT_BUCKETS && !clients.contains_key(caller) {
            // A full bucket is what a new one would be: forgetting it changes nothing.
            clients.retain(|_, b| !b.is_full());
        }
        let bucket = clients
            .entry(caller.to_owned())
            .or_insert_with(|| Bucket::new(rate, burst));
        if bucket.take() {
            Ok(())
        } else {
            Err(LimitError::Rate {
                caller: caller.to_owned(),
                rate,
                burst,
            })
        }
    }

    /// Opens a Watch stream for `caller`; the stream holds the returned guard, whose drop
    /// closes it.
    ///
    /// # Errors
    /// The caller's or the total cap is reached.
    pub fn open_watch(self: &Arc<Self>, caller: &str) -> Result<WatchGuard, LimitError> {
        let mut w = self.watches.locked();
        let (per_caller, total) = &mut *w;
        if *total >= self.limits.max_watches {
            return Err(LimitError::Exhausted {
                what: "open Watch streams".to_owned(),
                max: self.limits.max_watches,
                key: "max_watches",
            });
        }
        let mine = per_caller.entry(caller.to_owned()).or_default();
        if *mine >= self.limits.max_watches_per_caller {
            return Err(LimitError::Exhausted {
                what: format!("open Watch streams of {caller:?}"),
                max: self.limits.max_watches_per_caller,
                key: "max_watches_per_caller",
            });
        }
        *mine += 1;
        *total += 1;
        Ok(WatchGuard {
            bounds: Arc::clone(self),
            caller: caller.to_owned(),
        })
    }

    /// Open Watch streams in total.
    #[must_use]
    pub fn open_watches(&self) -> usize {
        self.watches.locked().1
    }
}

/// One open Watch stream; dropping it (the client went away) frees its place.
#[derive(Debug)]
pub struct WatchGuard {
    bounds: Arc<Bounds>,
    caller: String,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        let mut w = self.bounds.watches.locked();
        let (per_caller, total) = &mut *w;
        *total = total.saturating_sub(1);
        if let Some(n) = per_caller.get_mut(&self.caller) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                per_caller.remove(&self.caller);
            }
        }
    }
}
