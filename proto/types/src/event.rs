//! Enforcement events: what an agent did to hold a session to its quota, or why it could not.
//!
//! The agent records them (and shows them in its snapshot), sends them up to the controller,
//! which keeps the newest with the session, and the CLI shows them. The [`Action`] is typed;
//! on the wire (`gpuwarden_proto::convert`) and in stored records it is its name (`deny`,
//! `kill`, …), and a name this build doesn't know, from a newer agent, is kept as sent.
//!
//! # Example
//!
//! ```
//! use gpuwarden_types::event::{Action, EnforcementEvent};
//!
//! let event = EnforcementEvent {
//!     action: Action::Kill,
//!     reason: "over its limit".into(),
//!     ..EnforcementEvent::default()
//! };
//! assert_eq!(event.action.as_str(), "kill");
//! assert_eq!("device_denied".parse(), Ok(Action::DeviceDenied));
//! assert!(Action::Kill.is_workload_caused() && !Action::Bound.is_workload_caused());
//! ```

use std::{convert::Infallible, fmt, str::FromStr};

use serde::{Deserialize, Serialize};

/// What an agent did.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", from = "String")]
pub enum Action {
    /// An allocation over the limit was refused (`ENOMEM`).
    Deny,
    /// The process was killed (over its limit, or by request).
    Kill,
    /// The process was stopped (`SIGSTOP`).
    Stop,
    /// An allocation over the limit was let through and reported.
    Report,
    /// An open of a GPU the workload may not use was refused.
    DeviceDenied,
    /// A stopped workload's cgroup is held frozen until it is resumed.
    Hold,
    /// A stopped process was resumed by request.
    Resume,
    /// The quota was bound to its workload's cgroup.
    Bound,
    /// The quota let go of its cgroup.
    Unbound,
    /// No cgroup for the quota's target appeared in time.
    Expired,
    /// The quota could not be bound (its target is outside what it was authorized for, …).
    Refused,
    /// The workload was asked to end (`SIGTERM`) because its session is preempted; it is
    /// killed at the deadline.
    Preempt,
    /// The preempted workload is gone and its quota released: the controller ends the session.
    Preempted,
    /// The GPU time a container got stayed off its entitlement for the agent's share-watch
    /// window: under half its share while it runs, or over a hard share (docs/metrics.md,
    /// "Achieved against entitled"). Reported, not acted on.
    ShareDeviation,
    /// Issue 38: a preempted workload is being suspended (its GPU memory to host memory).
    Suspend,
    /// It is suspended: checkpointed, its GPU memory released, its cgroup frozen.
    Suspended,
    /// The driver refused to suspend it: it is preempted the kill way instead (the reason
    /// names the driver's code).
    SuspendRefused,
    /// A suspended workload is being resumed.
    Resuming,
    /// It is resumed: its GPU memory restored, its processes unlocked, its cgroup thawed.
    Resumed,
    /// The restore failed: its GPU state is lost and it is ended the kill way.
    ResumeFailed,
    /// A resumption onto other GPUs was not made (the driver's restore takes no GPU pairs
    /// before CUDA 13.0): nothing moved and the workload stays suspended where it was.
    ResumeRefused,
    /// Issue 40: the agent let go of the session on the controller's `Release` (its hold and
    /// quota are gone): a terminating session's end is confirmed.
    Released,
    /// An action this build doesn't know (from a newer agent), kept as sent.
    Other(String),
}

impl Action {
    /// Every known action, in the order above.
    pub const KNOWN: [Self; 22] = [
        Self::Deny,
        Self::Kill,
        Self::Stop,
        Self::Report,
        Self::DeviceDenied,
        Self::Hold,
        Self::Resume,
        Self::Bound,
        Self::Unbound,
        Self::Expired,
        Self::Refused,
        Self::Preempt,
        Self::Preempted,
        Self::ShareDeviation,
        Self::Suspend,
        Self::Suspended,
        Self::SuspendRefused,
        Self::Resuming,
        Self::Resumed,
        Self::ResumeFailed,
        Self::ResumeRefused,
        Self::Released,
    ];

    /// Its name on the wire and in tables.
    #[must_use]
    pub fn as_str(&self) -> &str {
        match self {
            Self::Deny => "deny",
            Self::Kill => "kill",
            Self::Stop => "stop",
            Self::Report => "report",
            Self::DeviceDenied => "device_denied",
            Self::Hold => "hold",
            Self::Resume => "resume",
            Self::Bound => "bound",
            Self::Unbound => "unbound",
            Self::Expired => "expired",
            Self::Refused => "refused",
            Self::Preempt => "preempt",
            Self::Preempted => "preempted",
            Self::ShareDeviation => "share_deviation",
            Self::Suspend => "suspend",
            Self::Suspended => "suspended",
            Self::SuspendRefused => "suspend_refused",
            Self::Resuming => "resuming",
            Self::Resumed => "resumed",
            Self::ResumeFailed => "resume_failed",
            Self::ResumeRefused => "resume_refused",
            Self::Released => "released",
            Self::Other(name) => name,
        }
    }

    /// The action named `name`; a name no known action has is [`Action::Other`].
    #[must_use]
    pub fn from_name(name: &str) -> Self {
        Self::KNOWN
            .into_iter()
            .find(|a| a.as_str() == name)
            .unwrap_or_else(|| Self::Other(name.to_owned()))
    }

    /// Whether a workload can cause it as often as it likes (an allocation over its limit, a
    /// refused open in a loop): such events are rate-limited per session.
    #[must_use]
    pub const fn is_workload_caused(&self) -> bool {
        matches!(
            self,
            Self::Deny | Self::Kill | Self::Stop | Self::Report | Self::DeviceDenied
        )
    }
}

/// No name at all (`Other("")`), as a record missing its action reads: never a made-up one.
impl Default for Action {
    fn default() -> Self {
        Self::Other(String::new())
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Action {
    type Err = Infallible;

    /// Never fails: an unknown name is [`Action::Other`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self::from_name(s))
    }
}

impl From<&str> for Action {
    fn from(name: &str) -> Self {
        Self::from_name(name)
    }
}

impl From<String> for Action {
    fn from(name: String) -> Self {
        Self::from_name(&name)
    }
}

impl From<Action> for String {
    fn from(a: Action) -> Self {
        match a {
            Action::Other(name) => name,
            known => known.as_str().to_owned(),
        }
    }
}

/// So tests and filters can write `event.action == "kill"`.
impl PartialEq<str> for Action {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Action {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

/// Something an agent did to enforce a session's quota, or why it could not. The session it
/// concerns is kept apart (the controller files it with the session; the wire message names it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EnforcementEvent {
    /// What was done.
    pub action: Action,
    /// Why, in words.
    pub reason: String,
    /// The container or cgroup path acted on.
    pub container: String,
    /// The process concerned, if any (0: none).
    pub pid: u32,
    /// GPU index (nvidiaN) when one is concerned, `None` when none is (the wire's
    /// `device_index`; stored records from before issue 40 read their `device` number back,
    /// 0 as GPU 0).
    pub device: Option<u32>,
    /// Bytes the process asked for.
    pub requested_bytes: u64,
    /// Bytes the session used.
    pub used_bytes: u64,
    /// The session's limit in bytes.
    pub limit_bytes: u64,
    /// When, ms since the epoch (as the agent saw it).
    pub at_ms: i64,
    /// For [`Action::ResumeRefused`]: a move onto other GPUs cut short by an agent restart
    /// before anything moved, rather than refused by the driver (issue 38).
    pub move_interrupted: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_keep_their_names_and_unknown_ones_are_kept_as_sent() {
        for action in Action::KNOWN {
            assert_eq!(Action::from_name(action.as_str()), action);
            let json = serde_json::to_string(&action).expect("serializes");
            assert_eq!(json, format!("\"{action}\""));
            assert_eq!(
                serde_json::from_str::<Action>(&json).expect("reads"),
                action
            );
        }
        let newer = Action::from_name("throttle");
        assert_eq!(newer, Action::Other("throttle".into()));
        assert_eq!(newer, "throttle");
        assert_eq!(String::from(newer), "throttle");
    }

    #[test]
    fn stored_events_read_as_they_were_written() {
        // A record written when the action was a plain string, and one missing fields.
        let old = r#"{"action":"kill","reason":"r","container":"/a","pid":7,"device":1,
            "requested_bytes":1,"used_bytes":2,"limit_bytes":3,"at_ms":4}"#;
        let e: EnforcementEvent = serde_json::from_str(old).expect("reads");
        assert_eq!((e.action.clone(), e.pid, e.at_ms), (Action::Kill, 7, 4));
        let back = serde_json::to_value(&e).expect("writes");
        assert_eq!(back["action"], "kill");
        let sparse: EnforcementEvent = serde_json::from_str("{}").expect("reads");
        assert_eq!(sparse, EnforcementEvent::default());
    }
}
