//! What happens when a workload goes over its GPU-memory limit, and how its compute share is
//! held.

use std::fmt;

use serde::{Deserialize, Serialize};

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

impl fmt::Display for MemoryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for ComputePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn compute_policy_names_round_trip_through_text_and_json() {
        for policy in [ComputePolicy::Hard, ComputePolicy::WorkConserving] {
            assert_eq!(policy.to_string().parse::<ComputePolicy>(), Ok(policy));
            let json = serde_json::to_string(&policy).expect("serializes");
            assert_eq!(json, format!("\"{policy}\""));
            assert_eq!(
                serde_json::from_str::<ComputePolicy>(&json).expect("reads back"),
                policy
            );
        }
        let err = "soft"
            .parse::<ComputePolicy>()
            .expect_err("unknown")
            .to_string();
        assert!(
            err.contains("\"soft\"") && err.contains("hard") && err.contains("work-conserving")
        );
    }

    #[test]
    fn policies_keep_their_stored_form() {
        let json = serde_json::to_string(&QuotaPolicy {
            memory: MemoryPolicy::Report,
            compute: ComputePolicy::WorkConserving,
        })
        .expect("serializes");
        assert_eq!(json, r#"{"memory":"report","compute":"work-conserving"}"#);
    }
}

/// How a preempted session yields its resources (issue 38, docs/suspend.md): the controller
/// decides it, the agent carries it out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreemptionMode {
    /// `SIGTERM`, the grace period, `cgroup.kill`: its work since its last checkpoint is lost.
    #[default]
    Kill,
    /// Its GPU memory to its node's host memory and its workload frozen; resumed there when
    /// room returns. Where the driver refuses, its agent takes the kill path.
    Suspend,
}

impl PreemptionMode {
    /// Its name on the wire: `kill` or `suspend`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::Suspend => "suspend",
        }
    }

    /// The mode a controller's message names: `suspend`, else kill (empty, `kill`, or a word
    /// this build does not know: the safe default).
    #[must_use]
    pub fn from_wire(word: &str) -> Self {
        if word == "suspend" {
            Self::Suspend
        } else {
            Self::Kill
        }
    }
}

impl std::str::FromStr for PreemptionMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "kill" => Ok(Self::Kill),
            "suspend" => Ok(Self::Suspend),
            other => Err(format!("preemption {other:?}: \"kill\" or \"suspend\"")),
        }
    }
}
