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
}

impl DenialReason {
    /// Every reason, in the order of the counters.
    pub const ALL: [Self; 4] = [
        Self::NoClientCertificate,
        Self::NoNodeIdentity,
        Self::NodeMismatch,
        Self::BadClientCertificate,
    ];

    /// The value of the `gpuwarden.auth.reason` attribute.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoClientCertificate => "no_client_certificate",
            Self::NoNodeIdentity => "no_node_identity",
            Self::NodeMismatch => "node_mismatch",
            Self::BadClientCertificate => "bad_client_certificate",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

static DENIED: [AtomicU64; DenialReason::ALL.len()] = [const { AtomicU64::new(0) }; 4];

/// Counts one refusal.
pub fn count(reason: DenialReason) {
    DENIED[reason.index()].fetch_add(1, Ordering::Relaxed);
}

/// Refusals for `reason` since the process started.
#[must_use]
pub fn count_of(reason: DenialReason) -> u64 {
    DENIED[reason.index()].load(Ordering::Relaxed)
}
