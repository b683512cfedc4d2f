//! Refusals for identity, counted by a bounded reason for the `gpuwarden.auth.denied` metric.
//!
//! The counts are process-wide, like the log lines that go with them, so they exist before
//! the metrics pipeline starts and whether it starts at all. The log lines are rate-limited
//! (one a second per reason, naming how many were held back), so a caller refused in a loop
//! cannot fill the controller's log; the counters count every refusal.

use std::{
    fmt::Display,
    sync::atomic::{AtomicU64, Ordering},
    time::{SystemTime, UNIX_EPOCH},
};

/// Why a request or a TLS handshake was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DenialReason {
    /// An agent call over TLS without a client certificate.
    NoClientCertificate,
    /// A client certificate that names no node, or several.
    NoNodeIdentity,
    /// A node certificate speaking for another node.
    NodeMismatch,
    /// A TLS handshake refused for its client certificate (another CA, expired, wrong usage).
    BadClientCertificate,
    /// A scheduler call with neither a bearer token nor a client certificate.
    NoCredentials,
    /// A bearer token that is malformed, unknown or revoked (or sent where none are accepted).
    BadToken,
    /// A client certificate that names no user or admin, or several.
    NoClientIdentity,
    /// A node's certificate calling the scheduler service.
    NodeAsClient,
    /// A user acting on another owner's sessions.
    OtherOwner,
    /// A session's target or memory policy outside what its owner was granted.
    TargetNotGranted,
    /// A user calling what only an admin may (changing team queues).
    AdminOnly,
    /// An agent call over plain text while clients must authenticate, without `--insecure`.
    PlainTextAgent,
}

impl DenialReason {
    /// Every reason, in the order of the counters.
    pub const ALL: [Self; 12] = [
        Self::NoClientCertificate,
        Self::NoNodeIdentity,
        Self::NodeMismatch,
        Self::BadClientCertificate,
        Self::NoCredentials,
        Self::BadToken,
        Self::NoClientIdentity,
        Self::NodeAsClient,
        Self::OtherOwner,
        Self::TargetNotGranted,
        Self::AdminOnly,
        Self::PlainTextAgent,
    ];

    /// The value of the `gpuwarden.auth.reason` attribute.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoClientCertificate => "no_client_certificate",
            Self::NoNodeIdentity => "no_node_identity",
            Self::NodeMismatch => "node_mismatch",
            Self::BadClientCertificate => "bad_client_certificate",
            Self::NoCredentials => "no_credentials",
            Self::BadToken => "bad_token",
            Self::NoClientIdentity => "no_client_identity",
            Self::NodeAsClient => "node_as_client",
            Self::OtherOwner => "other_owner",
            Self::TargetNotGranted => "target_not_granted",
            Self::AdminOnly => "admin_only",
            Self::PlainTextAgent => "plain_text_agent",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

static DENIED: [AtomicU64; DenialReason::ALL.len()] =
    [const { AtomicU64::new(0) }; DenialReason::ALL.len()];

/// Per reason: the second of the last refusal logged, and the refusals not logged since.
static LOGGED_AT: [AtomicU64; DenialReason::ALL.len()] =
    [const { AtomicU64::new(0) }; DenialReason::ALL.len()];
static HELD_BACK: [AtomicU64; DenialReason::ALL.len()] =
    [const { AtomicU64::new(0) }; DenialReason::ALL.len()];

/// Logs a refusal of `who` for `reason`, at most once a second per reason; the lines held back
/// in between are counted in the next one. Returns whether this one was logged.
pub fn log(reason: DenialReason, who: &str, error: &dyn Display) -> bool {
    let second = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let i = reason.index();
    let last = LOGGED_AT[i].load(Ordering::Relaxed);
    if last == second
        || LOGGED_AT[i]
            .compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        HELD_BACK[i].fetch_add(1, Ordering::Relaxed);
        return false;
    }
    let held_back = HELD_BACK[i].swap(0, Ordering::Relaxed);
    if held_back == 0 {
        tracing::warn!(client = %who, reason = reason.as_str(), "refused: {error}");
    } else {
        tracing::warn!(client = %who, reason = reason.as_str(), held_back, "refused: {error} ({held_back} more refusals for this reason since the last line)");
    }
    true
}

/// Counts one refusal.
pub fn count(reason: DenialReason) {
    DENIED[reason.index()].fetch_add(1, Ordering::Relaxed);
}

/// Refusals for `reason` since the process started.
#[must_use]
pub fn count_of(reason: DenialReason) -> u64 {
    DENIED[reason.index()].load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_counter_and_name() {
        for (i, reason) in DenialReason::ALL.into_iter().enumerate() {
            assert_eq!(reason.index(), i, "{reason:?} is out of order in ALL");
        }
        let names: std::collections::HashSet<_> =
            DenialReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), DenialReason::ALL.len());
    }

    #[test]
    fn a_refusal_storm_logs_a_line_a_second_per_reason() {
        let reason = DenialReason::NodeMismatch;
        let logged = (0..1000).filter(|_| log(reason, "storm", &"test")).count();
        // A second boundary may fall inside the loop (and another test may take a second's
        // line): at most two lines, never a thousand.
        assert!(logged <= 2, "{logged} lines for 1000 refusals");
    }
}
