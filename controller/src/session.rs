//! Sessions: a request for resources that the scheduler places on one node.

use serde::{Deserialize, Serialize};

use crate::{
    allocator::Allocation,
    placement::{Explanation, Placement},
    profile::UsageSeries,
    slots::ResourceSlot,
};

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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// The workload its quota binds to on its node (records from before targets: none).
    #[serde(default)]
    pub target: Target,
    /// How its quota is enforced.
    #[serde(default)]
    pub policy: QuotaPolicy,
    /// The latest enforcement events its node reported, newest last (at most [`MAX_EVENTS`]).
    #[serde(default)]
    pub events: Vec<EnforcementEvent>,
    /// The workload class its usage profile is filed under (default: its name).
    #[serde(default)]
    pub class: String,
    /// The placement mode it asked for (`None`: the controller's).
    #[serde(default)]
    pub placement: Option<Placement>,
    /// Why it went where it went (set once placed).
    #[serde(default)]
    pub explanation: Option<Explanation>,
    /// What its agent measured while it ran.
    #[serde(default)]
    pub usage: UsageSeries,
}

/// The workload on the node whose quota a session is. The agent binds the quota as soon as a
/// matching cgroup exists.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// Nothing: the allocation is only booked, nothing is enforced.
    #[default]
    None,
    /// A container, by the id its runtime gave it (hex digits).
    ContainerId(String),
    /// A Kubernetes pod, by UID: every container of the pod shares the quota.
    PodUid(String),
    /// A cgroup v2 path relative to the cgroup root, e.g. `/system.slice/my.service`.
    CgroupPath(String),
    /// A cgroup the agent makes for the session (`gpuwarden run`).
    Managed,
}

/// Why a target is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// `container_id` is empty.
    #[error("target container id must not be empty")]
    EmptyContainerId,
    /// `container_id` has something other than hex digits, or too many.
    #[error("target container id {0:?} is not 1 to 64 hex digits")]
    ContainerId(String),
    /// `pod_uid` is not a UUID.
    #[error("target pod UID {0:?} is not a UUID (8-4-4-4-12 hex digits)")]
    PodUid(String),
    /// `cgroup_path` does not start with `/`.
    #[error("target cgroup path {0:?} is not absolute (it must start with \"/\")")]
    RelativeCgroupPath(String),
    /// `cgroup_path` climbs out with `..`.
    #[error("target cgroup path {0:?} must not contain \"..\"")]
    DotDotCgroupPath(String),
    /// `managed` without a node to make the cgroup on.
    #[error("a managed target needs the session pinned to a node (node_id)")]
    ManagedUnpinned,
}

impl Target {
    /// Checks the target's form; `pinned_node` is the node the session is pinned to.
    ///
    /// # Errors
    /// The [`TargetError`] naming the bad part.
    pub fn validate(&self, pinned_node: Option<&str>) -> Result<(), TargetError> {
        match self {
            Self::None => Ok(()),
            Self::ContainerId(id) if id.is_empty() => Err(TargetError::EmptyContainerId),
            Self::ContainerId(id) => {
                if id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
                    Ok(())
                } else {
                    Err(TargetError::ContainerId(id.clone()))
                }
            }
            Self::PodUid(uid) => {
                if is_uuid(uid) {
                    Ok(())
                } else {
                    Err(TargetError::PodUid(uid.clone()))
                }
            }
            Self::CgroupPath(path) => {
                if !path.starts_with('/') {
                    Err(TargetError::RelativeCgroupPath(path.clone()))
                } else if path.split('/').any(|c| c == "..") {
                    Err(TargetError::DotDotCgroupPath(path.clone()))
                } else {
                    Ok(())
                }
            }
            Self::Managed if pinned_node.is_none_or(str::is_empty) => {
                Err(TargetError::ManagedUnpinned)
            }
            Self::Managed => Ok(()),
        }
    }

    /// Whether there is a workload to enforce on.
    #[must_use]
    pub const fn is_none(&self) -> bool {
        matches!(self, Self::None)
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::ContainerId(id) => write!(f, "container {id}"),
            Self::PodUid(uid) => write!(f, "pod {uid}"),
            Self::CgroupPath(path) => write!(f, "cgroup {path}"),
            Self::Managed => f.write_str("managed"),
        }
    }
}

/// `8-4-4-4-12` hex digits.
fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A policy name that is not one of the accepted ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} policy {value:?} (accepted: {accepted})")]
pub struct PolicyError {
    /// `memory` or `compute`.
    pub what: &'static str,
    /// What was given.
    pub value: String,
    /// The accepted names, comma-separated.
    pub accepted: &'static str,
}

/// What the agent does when a workload goes over its GPU-memory limit and the allocating ioctl
/// can't be refused (no BPF LSM).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryPolicy {
    /// Kill the process.
    #[default]
    Kill,
    /// Stop it (SIGSTOP); resume or kill by hand.
    Stop,
    /// Only report it.
    Report,
}

impl MemoryPolicy {
    /// The accepted names.
    pub const ACCEPTED: &'static str = "kill, stop, report";

    /// Stable lowercase name (the wire form).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::Stop => "stop",
            Self::Report => "report",
        }
    }
}

impl std::str::FromStr for MemoryPolicy {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "kill" => Ok(Self::Kill),
            "stop" => Ok(Self::Stop),
            "report" => Ok(Self::Report),
            _ => Err(PolicyError {
                what: "memory",
                value: s.to_owned(),
                accepted: Self::ACCEPTED,
            }),
        }
    }
}

/// How a compute share is held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ComputePolicy {
    /// Never above the share.
    #[default]
    Hard,
    /// May use idle capacity; back to its share when others contend.
    WorkConserving,
}

impl ComputePolicy {
    /// The accepted names.
    pub const ACCEPTED: &'static str = "hard, work-conserving";

    /// Stable name (the wire form).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Hard => "hard",
            Self::WorkConserving => "work-conserving",
        }
    }
}

impl std::str::FromStr for ComputePolicy {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "hard" => Ok(Self::Hard),
            "work-conserving" => Ok(Self::WorkConserving),
            _ => Err(PolicyError {
                what: "compute",
                value: s.to_owned(),
                accepted: Self::ACCEPTED,
            }),
        }
    }
}

/// How a session's quota is enforced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct QuotaPolicy {
    /// Over the GPU-memory limit.
    pub memory: MemoryPolicy,
    /// The compute share.
    pub compute: ComputePolicy,
}

impl QuotaPolicy {
    /// Parses the wire form, where an empty string means the default.
    ///
    /// # Errors
    /// The [`PolicyError`] of the unknown name.
    pub fn parse(memory: &str, compute: &str) -> Result<Self, PolicyError> {
        Ok(Self {
            memory: if memory.is_empty() {
                MemoryPolicy::default()
            } else {
                memory.parse()?
            },
            compute: if compute.is_empty() {
                ComputePolicy::default()
            } else {
                compute.parse()?
            },
        })
    }
}

/// Something the agent did to enforce a session's quota, or why it could not.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EnforcementEvent {
    /// What acted: `deny`, `kill`, `stop`, `report`, `resume`, `throttle`, `bound`, ….
    pub action: String,
    /// Why, in words.
    pub reason: String,
    /// The container or cgroup path acted on.
    pub container: String,
    /// The process concerned, if any (0: none).
    pub pid: u32,
    /// GPU index (nvidiaN), when one is concerned.
    pub device: u32,
    /// Bytes the process asked for.
    pub requested_bytes: u64,
    /// Bytes the session used.
    pub used_bytes: u64,
    /// The session's limit in bytes.
    pub limit_bytes: u64,
    /// When, ms since the epoch (as the agent saw it).
    pub at_ms: i64,
}

/// How many enforcement events a session keeps (the newest).
pub const MAX_EVENTS: usize = 32;

impl Session {
    /// Records an event, keeping the newest [`MAX_EVENTS`], newest last.
    pub fn record_event(&mut self, event: EnforcementEvent) {
        self.events.push(event);
        if self.events.len() > MAX_EVENTS {
            let extra = self.events.len() - MAX_EVENTS;
            self.events.drain(..extra);
        }
    }
}

/// Milliseconds since the Unix epoch.
#[must_use]
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_checked_and_the_error_names_the_bad_part() {
        let ok = [
            Target::None,
            Target::ContainerId("0123456789abcdef".repeat(4)),
            Target::ContainerId("ABCDEF0123".into()),
            Target::PodUid("123e4567-e89b-12d3-a456-426614174000".into()),
            Target::CgroupPath("/system.slice/my.service".into()),
            Target::CgroupPath("/odd..name".into()),
        ];
        for t in ok {
            assert_eq!(t.validate(None), Ok(()), "{t}");
        }
        assert_eq!(Target::Managed.validate(Some("n1")), Ok(()));

        let bad = [
            (
                Target::ContainerId(String::new()),
                None,
                "must not be empty",
            ),
            (Target::ContainerId("abc-123".into()), None, "\"abc-123\""),
            (
                Target::ContainerId("a".repeat(65)),
                None,
                "1 to 64 hex digits",
            ),
            (Target::PodUid("not-a-uuid".into()), None, "\"not-a-uuid\""),
            (
                Target::PodUid("123e4567e89b12d3a456426614174000".into()),
                None,
                "not a UUID",
            ),
            (
                Target::CgroupPath("system.slice".into()),
                None,
                "not absolute",
            ),
            (Target::CgroupPath("/a/../b".into()), None, "\"..\""),
            (Target::CgroupPath("/a/..".into()), None, "\"..\""),
            (Target::Managed, None, "pinned to a node"),
            (Target::Managed, Some(""), "pinned to a node"),
        ];
        for (t, node, words) in bad {
            let err = t.validate(node).expect_err(&t.to_string()).to_string();
            assert!(err.contains(words), "{t}: {err}");
        }
    }

    #[test]
    fn policies_parse_their_names_and_list_the_accepted_ones() {
        assert_eq!(QuotaPolicy::parse("", ""), Ok(QuotaPolicy::default()));
        assert_eq!(
            QuotaPolicy::parse("stop", "work-conserving"),
            Ok(QuotaPolicy {
                memory: MemoryPolicy::Stop,
                compute: ComputePolicy::WorkConserving,
            })
        );
        assert_eq!("report".parse(), Ok(MemoryPolicy::Report));
        assert_eq!("kill".parse(), Ok(MemoryPolicy::Kill));
        assert_eq!("hard".parse(), Ok(ComputePolicy::Hard));
        for m in [MemoryPolicy::Kill, MemoryPolicy::Stop, MemoryPolicy::Report] {
            assert_eq!(m.as_str().parse(), Ok(m));
        }
        for c in [ComputePolicy::Hard, ComputePolicy::WorkConserving] {
            assert_eq!(c.as_str().parse(), Ok(c));
        }
        let err = QuotaPolicy::parse("evict", "").unwrap_err().to_string();
        assert_eq!(
            err,
            "unknown memory policy \"evict\" (accepted: kill, stop, report)"
        );
        let err = QuotaPolicy::parse("", "soft").unwrap_err().to_string();
        assert_eq!(
            err,
            "unknown compute policy \"soft\" (accepted: hard, work-conserving)"
        );
        // Names are exact: no case folding, no underscores.
        assert!("Kill".parse::<MemoryPolicy>().is_err());
        assert!("work_conserving".parse::<ComputePolicy>().is_err());
    }

    #[test]
    fn a_session_keeps_its_newest_events_newest_last() {
        let mut s = Session {
            id: "s".into(),
            name: "s".into(),
            owner: "u".into(),
            priority: 0,
            requested: ResourceSlot::new(),
            pinned_node: None,
            state: SessionState::Running,
            node: None,
            allocation: Allocation::default(),
            reason: String::new(),
            seq: 0,
            failed_passes: 0,
            created_at_ms: 0,
            updated_at_ms: 0,
            target: Target::Managed,
            policy: QuotaPolicy::default(),
            events: Vec::new(),
            class: String::new(),
            placement: None,
            explanation: None,
            usage: Default::default(),
        };
        for at_ms in 0..40 {
            s.record_event(EnforcementEvent {
                action: "deny".into(),
                at_ms,
                ..EnforcementEvent::default()
            });
        }
        assert_eq!(s.events.len(), MAX_EVENTS);
        assert_eq!(s.events.first().map(|e| e.at_ms), Some(8));
        assert_eq!(s.events.last().map(|e| e.at_ms), Some(39));
    }

    #[test]
    fn targets_and_policies_keep_their_stored_form() {
        let json = serde_json::to_string(&(
            Target::ContainerId("ab".into()),
            Target::Managed,
            QuotaPolicy {
                memory: MemoryPolicy::Report,
                compute: ComputePolicy::WorkConserving,
            },
        ))
        .unwrap();
        assert_eq!(
            json,
            r#"[{"container_id":"ab"},"managed",{"memory":"report","compute":"work-conserving"}]"#
        );
    }
}
