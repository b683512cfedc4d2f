//! Sessions: a request for resources that the scheduler places on one node.

use serde::{Deserialize, Serialize};

use crate::{allocator::Allocation, slots::ResourceSlot};

/// Where a session is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// Waiting in the queue.
    Pending,
    /// Placed; the agent has not acknowledged yet.
    Scheduled,
    /// The agent holds its allocation.
    Running,
    /// Being released.
    Terminating,
    /// Ended.
    Terminated,
    /// Could not run (the reason says why).
    Failed,
    /// Its node stopped sending heartbeats.
    Lost,
}

impl SessionState {
    /// Stable lowercase name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Scheduled => "scheduled",
            Self::Running => "running",
            Self::Terminating => "terminating",
            Self::Terminated => "terminated",
            Self::Failed => "failed",
            Self::Lost => "lost",
        }
    }

    /// Whether the session holds (or is about to hold) resources.
    #[must_use]
    pub const fn holds_resources(self) -> bool {
        matches!(self, Self::Scheduled | Self::Running | Self::Lost)
    }

    /// Whether the session is over.
    #[must_use]
    pub const fn is_final(self) -> bool {
        matches!(self, Self::Terminated | Self::Failed)
    }
}

/// A session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// Unique id.
    pub id: String,
    /// Human name (default: the id).
    pub name: String,
    /// Owner (user or project), for limits and fairness.
    pub owner: String,
    /// Higher runs first.
    pub priority: i32,
    /// What it asked for.
    pub requested: ResourceSlot,
    /// Pinned to a node, if set.
    pub pinned_node: Option<String>,
    /// State.
    pub state: SessionState,
    /// The node it is placed on.
    pub node: Option<String>,
    /// Its GPU allocation there.
    pub allocation: Allocation,
    /// Why it failed, or why it still waits.
    pub reason: String,
    /// Arrival order (ties in priority run first-come first-served).
    pub seq: u64,
    /// Scheduling passes it has failed.
    pub failed_passes: u32,
    /// Creation time, ms since the epoch.
    pub created_at_ms: i64,
    /// Last change, ms since the epoch.
    pub updated_at_ms: i64,
}

/// Milliseconds since the Unix epoch.
#[must_use]
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
