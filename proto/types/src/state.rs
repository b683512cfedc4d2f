//! Where a session and a node are in their lives.

use serde::{Deserialize, Serialize};

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
    /// Ended by a client; its node's agent was told to release it and has not confirmed yet.
    /// It still holds (books) what it was placed on.
    Terminating,
    /// Ended.
    Terminated,
    /// Could not run (the reason says why).
    Failed,
    /// Its node stopped sending heartbeats.
    Lost,
    /// Ended by preemption: its resources went to another session (the reason names it).
    Preempted,
    /// Preempted in mode `suspend` (issue 38): its GPU memory is in its node's host memory and
    /// its workload frozen; it holds no GPU and waits to be resumed on its node.
    Suspended,
}

impl SessionState {
    /// Every state, in the order of a session's life.
    pub const ALL: [Self; 9] = [
        Self::Pending,
        Self::Scheduled,
        Self::Running,
        Self::Terminating,
        Self::Terminated,
        Self::Failed,
        Self::Lost,
        Self::Preempted,
        Self::Suspended,
    ];

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
            Self::Preempted => "preempted",
            Self::Suspended => "suspended",
        }
    }

    /// Whether the session holds (or is about to hold, or has not yet been confirmed to have
    /// let go of) resources.
    #[must_use]
    pub const fn holds_resources(self) -> bool {
        matches!(
            self,
            Self::Scheduled | Self::Running | Self::Lost | Self::Terminating
        )
    }

    /// Whether the session is over.
    #[must_use]
    pub const fn is_final(self) -> bool {
        matches!(self, Self::Terminated | Self::Failed | Self::Preempted)
    }
}

/// Whether a node is usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Heartbeating.
    Ready,
    /// Missed heartbeats past the timeout: its capacity left the pool.
    Lost,
}

impl NodeState {
    /// Stable lowercase name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ready => "ready",
            Self::Lost => "lost",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_keep_their_stored_names() {
        for state in SessionState::ALL {
            let json = serde_json::to_string(&state).expect("serializes");
            assert_eq!(json, format!("\"{}\"", state.as_str()));
        }
        assert_eq!(
            serde_json::to_string(&NodeState::Lost).expect("serializes"),
            "\"lost\""
        );
        assert!(SessionState::Lost.holds_resources());
        // Booked until its agent confirms the release (issue 40).
        assert!(SessionState::Terminating.holds_resources());
        assert!(!SessionState::Terminating.is_final());
        assert!(!SessionState::Failed.holds_resources());
        assert!(SessionState::Terminated.is_final());
    }
}
