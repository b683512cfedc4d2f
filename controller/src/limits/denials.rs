//! Refusals for identity, counted by a bounded reason for the `gpuwarden.auth.denied` metric.
//!
//! The counts are the server's: its [`super::Bounds`] hold one [`Denials`], which the TLS
//! listener, the identity checks and the client authorizer count in and the metrics read, so
//! they exist before the metrics pipeline starts and whether it starts at all. The log lines
//! are rate-limited (one a second per reason, naming how many were held back), so a caller
//! refused in a loop cannot fill the controller's log; the counters count every refusal.
//!
//! The reasons are the authentication layer's (`crate::auth`), kept here below it so that
//! the bounds can own their counters without an import running back up.

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

/// One counter per [`DenialReason`].
type PerReason = [AtomicU64; DenialReason::ALL.len()];

/// A server's refusals for identity by reason, and the state of their rate-limited log lines.
#[derive(Default)]
pub struct Denials {
    denied: PerReason,
    /// Per reason: the second of the last refusal logged, and the refusals not logged since.
    logged_at: PerReason,
    held_back: PerReason,
}

/// The reasons counted so far and their counts (a [`crate::auth::clients::Caller`] carries its
/// server's counters: its debug output names these, not three arrays of 12).
impl std::fmt::Debug for Denials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(
                DenialReason::ALL
                    .iter()
                    .map(|&r| (r.as_str(), self.count_of(r)))
                    .filter(|&(_, n)| n > 0),
            )
            .finish()
    }
}

impl Denials {
    /// Counts one refusal of `who` for `reason` and logs it, at most once a second per reason.
    pub fn refuse(&self, reason: DenialReason, who: &str, error: &dyn Display) {
        self.denied[reason.index()].fetch_add(1, Ordering::Relaxed);
        self.log(reason, who, error);
    }

    /// Refusals for `reason` since these counters were made.
    #[must_use]
    pub fn count_of(&self, reason: DenialReason) -> u64 {
        self.denied[reason.index()].load(Ordering::Relaxed)
    }

    /// Logs a refusal of `who` for `reason`, at most once a second per reason; the lines held
    /// back in between are counted in the next one. Returns whether this one was logged.
    fn log(&self, reason: DenialReason, who: &str, error: &dyn Display) -> bool {
        let second = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let i = reason.index();
        let last = self.logged_at[i].load(Ordering::Relaxed);
        if last == second
            || self.logged_at[i]
                .compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            self.held_back[i].fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let held_back = self.held_back[i].swap(0, Ordering::Relaxed);
        if held_back == 0 {
            tracing::warn!(client = %who, reason = reason.as_str(), "refused: {error}");
        } else {
            tracing::warn!(client = %who, reason = reason.as_str(), held_back, "refused: {error} ({held_back} more refusals for this reason since the last line)");
        }
        true
    }
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
        let denials = Denials::default();
        let reason = DenialReason::NodeMismatch;
        let logged = (0..1000)
            .filter(|_| denials.log(reason, "storm", &"test"))
            .count();
        // The first is logged; a second boundary may fall inside the loop: at most two lines,
        // never a thousand.
        assert!(
            (1..=2).contains(&logged),
            "{logged} lines for 1000 refusals"
        );
        // Another reason has a line of its own in the same second.
        assert!(denials.log(DenialReason::BadToken, "storm", &"test"));
    }

    #[test]
    fn each_set_of_counters_counts_only_its_own_refusals() {
        let (mine, other) = (Denials::default(), Denials::default());
        for _ in 0..3 {
            mine.refuse(DenialReason::OtherOwner, "user-a", &"test");
        }
        other.refuse(DenialReason::BadToken, "someone", &"test");
        assert_eq!(mine.count_of(DenialReason::OtherOwner), 3);
        assert_eq!(mine.count_of(DenialReason::BadToken), 0);
        assert_eq!(other.count_of(DenialReason::OtherOwner), 0);
        assert_eq!(other.count_of(DenialReason::BadToken), 1);
        assert_eq!(format!("{mine:?}"), r#"{"other_owner": 3}"#);
    }
}
