//! Refusals and drops counted by a bounded reason ([`Refusal`]) in the [`Refusals`] of the
//! bounds they were refused by, for the `gpuwarden.limits.refused` metric.

use std::sync::atomic::{AtomicU64, Ordering};

/// Why something was refused or dropped, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A string, list or number over its limit.
    Oversized,
    /// A float that is NaN, infinite or negative.
    OutOfRange,
    /// A cap on sessions or Watch streams.
    Cap,
    /// An agent stream closed for its rate.
    Flood,
    /// A client's call refused for its rate.
    Rate,
    /// An agent's usage or event for a session not on its node, dropped.
    ForeignSession,
    /// An agent's event, usage report or heartbeat over its stream's rate, dropped: the stream
    /// stays open (a tenant allocating in a loop must not cut its node off).
    FloodDropped,
}

impl Refusal {
    /// Every reason, in the order of the counters.
    pub const ALL: [Self; 7] = [
        Self::Oversized,
        Self::OutOfRange,
        Self::Cap,
        Self::Flood,
        Self::Rate,
        Self::ForeignSession,
        Self::FloodDropped,
    ];

    /// A stable name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Oversized => "oversized",
            Self::OutOfRange => "out_of_range",
            Self::Cap => "cap",
            Self::Flood => "flood",
            Self::Rate => "rate",
            Self::ForeignSession => "foreign_session",
            Self::FloodDropped => "flood_dropped",
        }
    }
}

/// Refusals and drops by reason, owned by the [`super::Bounds`] they were refused by: one
/// set per server, read by its metrics.
#[derive(Debug, Default)]
pub struct Refusals([AtomicU64; Refusal::ALL.len()]);

impl Refusals {
    /// Counts one refusal or drop.
    pub fn count(&self, reason: Refusal) {
        self.0[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Refusals or drops for `reason` since these bounds were made.
    #[must_use]
    pub fn count_of(&self, reason: Refusal) -> u64 {
        self.0[reason as usize].load(Ordering::Relaxed)
    }
}
