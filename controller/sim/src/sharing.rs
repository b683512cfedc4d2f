//! [`Sharing`]: how the team replay shares the cluster. The replay runs each way and a stuck
//! run's [`SimError`](crate::SimError) names it, so it sits below both.

use serde::Serialize;

/// How the cluster is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    /// Today's scheduler: no queues, FIFO over everyone.
    NoQueues,
    /// The trace's team queues, with reclaim by preemption.
    QueuesWithReclaim,
    /// The same queues, reclaim suspending the victims instead of killing them (issue 38).
    QueuesWithSuspend,
    /// The same, where the driver refuses to checkpoint one job in four
    /// ([`crate::teams::checkpoint_refused`]) and those are killed as under reclaim.
    QueuesWithSuspendRefusing,
}

impl Sharing {
    /// All four, in the order the table shows them.
    pub const ALL: [Self; 4] = [
        Self::NoQueues,
        Self::QueuesWithReclaim,
        Self::QueuesWithSuspend,
        Self::QueuesWithSuspendRefusing,
    ];
}

impl std::fmt::Display for Sharing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NoQueues => "no queues",
            Self::QueuesWithReclaim => "queues + reclaim",
            Self::QueuesWithSuspend => "queues + suspend",
            Self::QueuesWithSuspendRefusing => "queues + suspend, 1 in 4 refused",
        })
    }
}
