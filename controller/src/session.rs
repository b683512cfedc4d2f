//! Sessions: a request for resources that the scheduler places on one node.

use serde::{Deserialize, Serialize};

pub use gpuwarden_types::{
    event::{Action, EnforcementEvent},
    now_ms,
    policy::{ComputePolicy, MemoryPolicy, PolicyError, PreemptionMode, QuotaPolicy},
    state::SessionState,
    target::{Target, TargetError, TargetScope},
};

use gpuwarden_types::placement::Placement;

use crate::{
    allocator::Allocation, explanation::Explanation, profile::UsageSeries, slots::ResourceSlot,
};

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
    /// What its target was authorized under (records from before scopes: an admin's, as
    /// authentication alone let them be created).
    #[serde(default = "TargetScope::legacy")]
    pub scope: TargetScope,
    /// The local uid of the `gpuwarden run` that created it, if it said: the agent gives the
    /// session's cgroup to that uid only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_uid: Option<u32>,
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
    /// What its agent measured while it ran. Not stored until there is a sample: a record is
    /// encoded at every change of its session, and an empty histogram is most of one.
    #[serde(default, skip_serializing_if = "UsageSeries::is_empty")]
    pub usage: UsageSeries,
    /// Who placed it: a client through the controller, or Kubernetes (records from before
    /// origins: the controller).
    #[serde(default)]
    pub origin: Origin,
    /// The revision of its latest change (0: none since before revisions), stamped by the
    /// controller as the change is stored (docs/architecture.md, "Watching sessions").
    #[serde(default)]
    pub revision: u64,
    /// It opted out of preemption (`--no-preempt`): never a victim, and admitted only within
    /// its queue's guarantee.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_preempt: bool,
    /// Set while it is being preempted (it still runs until its agent reports the workload
    /// gone): the reason it will end with, naming whom it yields to and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempting: Option<String>,
    /// While it is being preempted: the waiting session its release is for (a gang's first
    /// member for a gang), so that another waiting session does not count on that room.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_for: Option<String>,
    /// The scheduler's decisions about it, newest last (at most [`MAX_DECISIONS`]): why it
    /// waited, whom it preempted, whom it yielded to (`session show --explain`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<Decision>,
    /// The gang it belongs to (records from before gangs: none): placed all at once with the
    /// gang's other members or not at all (docs/teams.md, "Gangs").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<Gang>,
    /// How it yields when preempted, where it said (`None`: its queue's mode, else kill).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<PreemptionMode>,
    /// Where it waits to resume, while [`SessionState::Suspended`] (issue 38): its GPU memory is
    /// in that node's host memory, so it resumes there, on the GPUs it left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<Home>,
    /// The request id it was created with, if any: a create retried with it answers this
    /// session (`scheduler::requests`). Kept on the record so a restart or a new leader still
    /// recognises the retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Why it waits, while pending and tried at least once (issue 40): its `Scheduled`
    /// condition's reason. `reason` says the same in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<WaitKind>,
    /// When the scheduler placed it (records from before: unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placed_at_ms: Option<i64>,
    /// While [`SessionState::Terminating`]: when its node was told to release it (issue 40).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub releasing_since_ms: Option<i64>,
}

/// Where a suspended session resumes: the node and GPUs it left (its agent restores its GPU
/// memory there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Home {
    /// Its node.
    pub node: String,
    /// What it held there.
    pub allocation: Allocation,
    /// When it was suspended, ms since the epoch.
    pub since_ms: i64,
    /// The session it yielded to.
    pub yielded_to: String,
    /// Bytes of its GPU memory now in its node's host memory, as its agent counted them.
    #[serde(default)]
    pub host_bytes: u64,
    /// Only the GPUs it left will do: its agent refused to restore it onto others (a driver
    /// whose restore takes no GPU pairs).
    #[serde(default)]
    pub home_only: bool,
}

/// Why a pending session waits, as a client's condition names it (docs/api.md, "Conditions").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaitKind {
    /// No node has room for it now.
    Capacity,
    /// A team queue's limit or a per-owner predicate holds it back.
    QueueLimit,
    /// Its gang has fewer members than its size.
    GangIncomplete,
    /// Sessions were preempted for it; it waits until they release.
    Preemption,
}

impl WaitKind {
    /// The stable CamelCase reason of its `Scheduled` condition.
    #[must_use]
    pub fn reason(self) -> &'static str {
        match self {
            Self::Capacity => "WaitingForCapacity",
            Self::QueueLimit => "QueueLimit",
            Self::GangIncomplete => "GangIncomplete",
            Self::Preemption => "WaitingForPreemption",
        }
    }
}

/// A gang (issue 24 §3): sessions of one owner that are placed all at once or not at all. The
/// name is scoped to the owner: two owners' gangs of one name are two gangs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Gang {
    /// Its name within its owner.
    pub name: String,
    /// How many members it has.
    pub size: u32,
}

/// Why a gang is refused at creation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GangError {
    /// The name is empty, too long, or has characters other than letters, digits, `-`, `_`
    /// and `.` (or starts with other than a letter or digit).
    #[error(
        "gang.name {0:?}: 1 to {max} letters, digits, '-', '_' or '.', starting with a letter or digit",
        max = Gang::MAX_NAME_LEN
    )]
    Name(String),
    /// Fewer than two members.
    #[error("gang.size {0}: a gang has at least 2 members")]
    TooSmall(u32),
    /// More members than the bound.
    #[error("gang.size {size}: more than the limit of {max} members")]
    TooLarge {
        /// The size asked for.
        size: u32,
        /// The bound.
        max: u32,
    },
    /// Another size than the gang's live members name.
    #[error("gang.size {size}: gang {name:?} already has members of size {existing}")]
    SizeMismatch {
        /// The gang.
        name: String,
        /// The size asked for.
        size: u32,
        /// The size its members name.
        existing: u32,
    },
    /// The gang already has all its members.
    #[error("gang {name:?} already has all its {size} members")]
    Full {
        /// The gang.
        name: String,
        /// Its size.
        size: u32,
    },
}

impl Gang {
    /// The longest gang name.
    pub const MAX_NAME_LEN: usize = 63;
    /// The largest gang the scheduler accepts, whatever the limits (the API also bounds it by
    /// `limits.max_sessions_per_owner`, as a larger gang could never be complete).
    pub const MAX_SIZE: u32 = 1024;

    /// Checks the name's form and the size's bounds.
    ///
    /// # Errors
    /// The name is malformed, or the size below 2 or above [`Self::MAX_SIZE`].
    pub fn validate(&self) -> Result<(), GangError> {
        let well_formed = !self.name.is_empty()
            && self.name.len() <= Self::MAX_NAME_LEN
            && self.name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !well_formed {
            return Err(GangError::Name(self.name.clone()));
        }
        if self.size < 2 {
            return Err(GangError::TooSmall(self.size));
        }
        if self.size > Self::MAX_SIZE {
            return Err(GangError::TooLarge {
                size: self.size,
                max: Self::MAX_SIZE,
            });
        }
        Ok(())
    }
}

/// A scheduling decision about a session, kept with it so that it can be explained later.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// When, ms since the epoch.
    pub at_ms: i64,
    /// What was decided.
    pub kind: DecisionKind,
    /// Why, in words: the reason it waited for, whom it preempted and for what.
    pub detail: String,
}

/// What a [`Decision`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// It was placed after waiting: the detail is how long, and the last reason it waited.
    Waited,
    /// Others were preempted to make room for it: the detail names them and the rule.
    Preempted,
    /// It was preempted for another: the detail names that one and the rule.
    Yielded,
    /// It was suspended (preempted in mode `suspend`): the detail says where it waits.
    Suspended,
    /// It was resumed on its node: the detail says on which GPUs (those it left, or others of
    /// the same model) and after how long.
    Resumed,
}

impl DecisionKind {
    /// Its name on the wire and in JSON: `waited`, `preempted`, `yielded`, `suspended` or
    /// `resumed`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Waited => "waited",
            Self::Preempted => "preempted",
            Self::Yielded => "yielded",
            Self::Suspended => "suspended",
            Self::Resumed => "resumed",
        }
    }
}

/// Who placed a session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// A client asked the controller, which placed it.
    #[default]
    Controller,
    /// Kubernetes allocated it (DRA) and its node's agent prepared the claim: the controller
    /// observes it, counts what it holds, and learns from its usage, but neither placed it nor
    /// may end it (docs/kubernetes.md, "The agent as DRA driver").
    Dra(KubernetesClaim),
}

impl Origin {
    /// The origin's name on the wire: `controller` or `dra`.
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Controller => "controller",
            Self::Dra(_) => "dra",
        }
    }

    /// The claim, for a session Kubernetes placed.
    #[must_use]
    pub fn claim(&self) -> Option<&KubernetesClaim> {
        match self {
            Self::Controller => None,
            Self::Dra(claim) => Some(claim),
        }
    }
}

/// The Kubernetes objects an observed session stands for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KubernetesClaim {
    /// The namespace of the claim and its pod.
    pub namespace: String,
    /// The ResourceClaim's name.
    pub claim_name: String,
    /// The ResourceClaim's UID.
    pub claim_uid: String,
    /// The reserving pod's name.
    pub pod_name: String,
    /// The reserving pod's UID.
    pub pod_uid: String,
}

impl KubernetesClaim {
    /// The owner its session is filed under: `k8s:<namespace>`.
    #[must_use]
    pub fn owner(&self) -> String {
        format!("k8s:{}", self.namespace)
    }
}

/// How many enforcement events a session keeps (the newest).
pub const MAX_EVENTS: usize = 32;

/// How many scheduling decisions a session keeps (the newest).
pub const MAX_DECISIONS: usize = 16;

impl Session {
    /// Records a scheduling decision made now, keeping the newest [`MAX_DECISIONS`].
    pub fn record_decision(&mut self, kind: DecisionKind, detail: String) {
        self.decisions.push(Decision {
            at_ms: now_ms(),
            kind,
            detail,
        });
        if self.decisions.len() > MAX_DECISIONS {
            let extra = self.decisions.len() - MAX_DECISIONS;
            self.decisions.drain(..extra);
        }
    }

    /// Records, as it is placed, that it waited and the last reason why (nothing when it was
    /// placed in the pass after it was created, with no reason to wait).
    pub fn record_wait(&mut self) {
        if self.reason.is_empty() {
            return;
        }
        let waited_ms = now_ms().saturating_sub(self.created_at_ms).max(0);
        let detail = format!("{waited_ms} ms; the last reason: {}", self.reason);
        self.record_decision(DecisionKind::Waited, detail);
    }

    /// Records an event, keeping the newest [`MAX_EVENTS`], newest last.
    pub fn record_event(&mut self, event: EnforcementEvent) {
        self.events.push(event);
        if self.events.len() > MAX_EVENTS {
            let extra = self.events.len() - MAX_EVENTS;
            self.events.drain(..extra);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> Session {
        Session {
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
            request_id: None,
            wait: None,
            placed_at_ms: None,
            releasing_since_ms: None,
            seq: 0,
            failed_passes: 0,
            created_at_ms: 0,
            updated_at_ms: 0,
            target: Target::Managed,
            policy: QuotaPolicy::default(),
            scope: TargetScope::default(),
            events: Vec::new(),
            class: String::new(),
            placement: None,
            explanation: None,
            usage: UsageSeries::default(),
            origin: Origin::Controller,
            revision: 0,
            no_preempt: false,
            preempting: None,
            preempted_for: None,
            gang: None,
            preemption: None,
            home: None,
            run_uid: None,
            decisions: Vec::new(),
        }
    }

    #[test]
    fn a_session_keeps_its_newest_events_newest_last() {
        let mut s = session();
        for at_ms in 0..40 {
            s.record_event(EnforcementEvent {
                action: Action::Deny,
                at_ms,
                ..EnforcementEvent::default()
            });
        }
        assert_eq!(s.events.len(), MAX_EVENTS);
        assert_eq!(s.events.first().map(|e| e.at_ms), Some(8));
        assert_eq!(s.events.last().map(|e| e.at_ms), Some(39));
    }

    /// A record is encoded at every change of its session: one without usage samples leaves the
    /// empty histogram out, and reads back the same; one with a sample keeps it.
    #[test]
    fn usage_is_stored_only_once_sampled() {
        let mut s = session();
        let text = serde_json::to_string(&s).unwrap();
        assert!(!text.contains("usage"), "{text}");
        assert_eq!(serde_json::from_str::<Session>(&text).unwrap(), s);
        s.usage.record(crate::profile::UsageSample {
            utilization: 0.5,
            memory_bytes: 1 << 20,
            ioctls_per_sec: 3.0,
        });
        let text = serde_json::to_string(&s).unwrap();
        assert!(text.contains("\"usage\""), "{text}");
        assert_eq!(serde_json::from_str::<Session>(&text).unwrap(), s);
    }
}
