//! Refusals for identity, counted by a bounded reason for the `gpuwarden.auth.denied` metric.
//!
//! The counts are process-wide, like the log lines that go with them, so they exist before
//! the metrics pipeline starts and whether it starts at all.

use std::sync::atomic::{AtomicU64, Ordering};

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
}

impl DenialReason {
    /// Every reason, in the order of the counters.
    pub const ALL: [Self; 9] = [
        Self::NoClientCertificate,
        Self::NoNodeIdentity,
        Self::NodeMismatch,
        Self::BadClientCertificate,
        Self::NoCredentials,
        Self::BadToken,
        Self::NoClientIdentity,
        Self::NodeAsClient,
        Self::OtherOwner,
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
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

static DENIED: [AtomicU64; DenialReason::ALL.len()] =
    [const { AtomicU64::new(0) }; DenialReason::ALL.len()];

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
}
