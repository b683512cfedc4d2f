//! Between the wire's messages and the shared domain types of `gpuwarden-types`, written once
//! for the agent, the controller and the CLI. A new policy or state is one edit there and one
//! here. (Conversions of the controller's own records — sessions, nodes, allocations,
//! explanations, profiles — stay in the controller, `gpuwarden_controller::convert`.)

use gpuwarden_types::{
    event::{Action, EnforcementEvent},
    mig::{MigGpuLayout, MigProfilePlacements},
    placement::{Placement, UnknownPlacement},
    policy::{ComputePolicy, MemoryPolicy, PolicyError, QuotaPolicy},
    slot::{InvalidSlotName, ResourceSlot, SlotKind, SlotName, SlotValue, ValueError},
    state::{NodeState, SessionState},
    target::{Target, TargetScope},
};

use crate::v1 as pb;

/// A slot kind to its message enum.
#[must_use]
pub fn kind_to_pb(kind: SlotKind) -> pb::SlotKind {
    match kind {
        SlotKind::Count => pb::SlotKind::Count,
        SlotKind::Bytes => pb::SlotKind::Bytes,
        SlotKind::Unique => pb::SlotKind::Unique,
    }
}

/// A message slot kind, if it names one (not `UNSPECIFIED`, not a number from a newer peer).
#[must_use]
pub fn kind_from_pb(kind: i32) -> Option<SlotKind> {
    match pb::SlotKind::try_from(kind).ok()? {
        pb::SlotKind::Count => Some(SlotKind::Count),
        pb::SlotKind::Bytes => Some(SlotKind::Bytes),
        pb::SlotKind::Unique => Some(SlotKind::Unique),
        pb::SlotKind::Unspecified => None,
    }
}

/// A session state to its message enum.
#[must_use]
pub fn state_to_pb(state: SessionState) -> pb::SessionState {
    match state {
        SessionState::Pending => pb::SessionState::Pending,
        SessionState::Scheduled => pb::SessionState::Scheduled,
        SessionState::Running => pb::SessionState::Running,
        SessionState::Terminating => pb::SessionState::Terminating,
        SessionState::Terminated => pb::SessionState::Terminated,
        SessionState::Failed => pb::SessionState::Failed,
        SessionState::Lost => pb::SessionState::Lost,
        SessionState::Preempted => pb::SessionState::Preempted,
        SessionState::Suspended => pb::SessionState::Suspended,
    }
}

/// A message session state, if it names one.
#[must_use]
pub fn state_from_pb(state: i32) -> Option<SessionState> {
    match pb::SessionState::try_from(state).ok()? {
        pb::SessionState::Pending => Some(SessionState::Pending),
        pb::SessionState::Scheduled => Some(SessionState::Scheduled),
        pb::SessionState::Running => Some(SessionState::Running),
        pb::SessionState::Terminating => Some(SessionState::Terminating),
        pb::SessionState::Terminated => Some(SessionState::Terminated),
        pb::SessionState::Failed => Some(SessionState::Failed),
        pb::SessionState::Lost => Some(SessionState::Lost),
        pb::SessionState::Preempted => Some(SessionState::Preempted),
        pb::SessionState::Suspended => Some(SessionState::Suspended),
        pb::SessionState::Unspecified => None,
    }
}

/// A node state to its message enum.
#[must_use]
pub fn node_state_to_pb(state: NodeState) -> pb::NodeState {
    match state {
        NodeState::Ready => pb::NodeState::Ready,
        NodeState::Lost => pb::NodeState::Lost,
    }
}

/// A message node state, if it names one.
#[must_use]
pub fn node_state_from_pb(state: i32) -> Option<NodeState> {
    match pb::NodeState::try_from(state).ok()? {
        pb::NodeState::Ready => Some(NodeState::Ready),
        pb::NodeState::Lost => Some(NodeState::Lost),
        pb::NodeState::Unspecified => None,
    }
}

/// A `Target` message to a target; an absent message or `managed: false` is
/// [`Target::None`]. Its form is checked apart ([`Target::validate`]), where the pinned node is
/// known.
#[must_use]
pub fn target_from_pb(target: Option<&pb::Target>) -> Target {
    use pb::target::Kind;
    match target.and_then(|t| t.kind.as_ref()) {
        None | Some(Kind::Managed(false)) => Target::None,
        Some(Kind::ContainerId(id)) => Target::ContainerId(id.clone()),
        Some(Kind::PodUid(uid)) => Target::PodUid(uid.clone()),
        Some(Kind::CgroupPath(path)) => Target::CgroupPath(path.clone()),
        Some(Kind::Managed(true)) => Target::Managed,
    }
}

/// A target to its message (none for [`Target::None`]).
#[must_use]
pub fn target_to_pb(target: &Target) -> Option<pb::Target> {
    use pb::target::Kind;
    let kind = match target {
        Target::None => return None,
        Target::ContainerId(id) => Kind::ContainerId(id.clone()),
        Target::PodUid(uid) => Kind::PodUid(uid.clone()),
        Target::CgroupPath(path) => Kind::CgroupPath(path.clone()),
        Target::Managed => Kind::Managed(true),
    };
    Some(pb::Target { kind: Some(kind) })
}

/// A `TargetScope` message to a scope; an absent one (a controller from before scopes) is an
/// admin's, not unconfined.
#[must_use]
pub fn scope_from_pb(scope: Option<&pb::TargetScope>) -> TargetScope {
    scope.map_or_else(
        || TargetScope::admin(false),
        |s| TargetScope {
            admin: s.admin,
            unconfined: s.unconfined,
            cgroup_prefixes: s.cgroup_prefixes.clone(),
            namespaces: s.namespaces.clone(),
        },
    )
}

/// A scope to its message.
#[must_use]
pub fn scope_to_pb(scope: &TargetScope) -> pb::TargetScope {
    pb::TargetScope {
        admin: scope.admin,
        unconfined: scope.unconfined,
        cgroup_prefixes: scope.cgroup_prefixes.clone(),
        namespaces: scope.namespaces.clone(),
    }
}

/// Why a `QuotaPolicy` message names no policy: each names the field to blame (a client's
/// `BadRequest` field violation).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyFieldError {
    /// A string that is no policy.
    #[error(transparent)]
    Unknown(#[from] PolicyError),
    /// An enum number that is no policy (from a newer peer, or made up).
    #[error("policy.{field}: {value} is not a {enum_name}")]
    UnknownNumber {
        /// `memory_policy` or `compute_policy`.
        field: &'static str,
        /// The number sent.
        value: i32,
        /// `MemoryPolicy` or `ComputePolicy`.
        enum_name: &'static str,
    },
    /// The string and the enum name different policies.
    #[error(
        "policy.{field} {named:?} and policy.{field}_policy {numbered:?} disagree; give one \
         (the enum; the string is deprecated)"
    )]
    Disagree {
        /// `memory` or `compute`: the string field (its enum is `<field>_policy`).
        field: &'static str,
        /// What the string says.
        named: String,
        /// What the enum says, as its string would.
        numbered: String,
    },
}

impl PolicyFieldError {
    /// The field of `QuotaPolicy` it blames (`memory`, `compute_policy`, ...).
    #[must_use]
    pub fn field(&self) -> &'static str {
        match self {
            Self::Unknown(e) => e.what,
            Self::UnknownNumber { field, .. } | Self::Disagree { field, .. } => field,
        }
    }
}

/// A memory policy as its enum carries it.
#[must_use]
pub fn memory_policy_to_pb(policy: MemoryPolicy) -> pb::MemoryPolicy {
    match policy {
        MemoryPolicy::Kill => pb::MemoryPolicy::Kill,
        MemoryPolicy::Stop => pb::MemoryPolicy::Stop,
        MemoryPolicy::Report => pb::MemoryPolicy::Report,
    }
}

/// A compute policy as its enum carries it.
#[must_use]
pub fn compute_policy_to_pb(policy: ComputePolicy) -> pb::ComputePolicy {
    match policy {
        ComputePolicy::Hard => pb::ComputePolicy::Hard,
        ComputePolicy::WorkConserving => pb::ComputePolicy::WorkConserving,
    }
}

/// One half of a policy from its deprecated string and its enum: either may be given (an
/// empty string, an unspecified enum: not given); both given must agree; neither: `None`.
fn one_policy<T: Copy + PartialEq + std::fmt::Display + std::str::FromStr<Err = PolicyError>>(
    field: &'static str,
    named: &str,
    numbered: Result<Option<T>, PolicyFieldError>,
) -> Result<Option<T>, PolicyFieldError> {
    let numbered = numbered?;
    let named = if named.is_empty() {
        None
    } else {
        Some(named.parse::<T>()?)
    };
    match (named, numbered) {
        (Some(a), Some(b)) if a != b => Err(PolicyFieldError::Disagree {
            field,
            named: a.to_string(),
            numbered: b.to_string(),
        }),
        (a, b) => Ok(b.or(a)),
    }
}

/// A `QuotaPolicy` message to a policy, from its enums (issue 40) or its deprecated strings,
/// as [`one_policy`] reads each half; an absent message, or a half given neither way, is the
/// default.
///
/// # Errors
/// The [`PolicyFieldError`] naming the field: an unknown name or number, or a string and an
/// enum that disagree.
pub fn policy_from_pb(policy: Option<&pb::QuotaPolicy>) -> Result<QuotaPolicy, PolicyFieldError> {
    let Some(p) = policy else {
        return Ok(QuotaPolicy::default());
    };
    let memory = match pb::MemoryPolicy::try_from(p.memory_policy) {
        Ok(pb::MemoryPolicy::Unspecified) => Ok(None),
        Ok(pb::MemoryPolicy::Kill) => Ok(Some(MemoryPolicy::Kill)),
        Ok(pb::MemoryPolicy::Stop) => Ok(Some(MemoryPolicy::Stop)),
        Ok(pb::MemoryPolicy::Report) => Ok(Some(MemoryPolicy::Report)),
        Err(_) => Err(PolicyFieldError::UnknownNumber {
            field: "memory_policy",
            value: p.memory_policy,
            enum_name: "MemoryPolicy",
        }),
    };
    let compute = match pb::ComputePolicy::try_from(p.compute_policy) {
        Ok(pb::ComputePolicy::Unspecified) => Ok(None),
        Ok(pb::ComputePolicy::Hard) => Ok(Some(ComputePolicy::Hard)),
        Ok(pb::ComputePolicy::WorkConserving) => Ok(Some(ComputePolicy::WorkConserving)),
        Err(_) => Err(PolicyFieldError::UnknownNumber {
            field: "compute_policy",
            value: p.compute_policy,
            enum_name: "ComputePolicy",
        }),
    };
    Ok(QuotaPolicy {
        memory: one_policy("memory", &p.memory, memory)?.unwrap_or_default(),
        compute: one_policy("compute", &p.compute, compute)?.unwrap_or_default(),
    })
}

/// A policy to its message, every field filled in: the deprecated strings and the enums.
#[must_use]
pub fn policy_to_pb(policy: QuotaPolicy) -> pb::QuotaPolicy {
    pb::QuotaPolicy {
        memory: policy.memory.as_str().to_owned(),
        compute: policy.compute.as_str().to_owned(),
        memory_policy: memory_policy_to_pb(policy.memory).into(),
        compute_policy: compute_policy_to_pb(policy.compute).into(),
    }
}

/// Why a `ResourceSlot` message isn't slots.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotsError {
    /// A name that is no slot name.
    #[error(transparent)]
    Name(#[from] InvalidSlotName),
    /// A value that is no exact decimal.
    #[error("slot {slot:?}: {source}")]
    Value {
        /// The slot.
        slot: String,
        /// Why its value is refused.
        #[source]
        source: ValueError,
    },
}

/// A `ResourceSlot` message to slots (absent: none), naming the first bad entry. Values travel
/// as exact decimals (`"0.2"`, `"8589934592"`), never with units.
///
/// # Errors
/// A bad name or value, named.
pub fn slots_from_pb(slot: Option<&pb::ResourceSlot>) -> Result<ResourceSlot, SlotsError> {
    let mut out = ResourceSlot::new();
    for (name, value) in slot.map(|s| &s.values).into_iter().flatten() {
        let n = SlotName::new(name)?;
        let v: SlotValue = value.parse().map_err(|source| SlotsError::Value {
            slot: name.clone(),
            source,
        })?;
        out.set(n, v);
    }
    Ok(out)
}

/// Slots to a `ResourceSlot` message.
#[must_use]
pub fn slots_to_pb(slot: &ResourceSlot) -> pb::ResourceSlot {
    pb::ResourceSlot {
        values: slot
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// A placement mode as a message carries it (empty: the controller's).
///
/// # Errors
/// A name that is no mode.
pub fn placement_from_pb(mode: &str) -> Result<Option<Placement>, UnknownPlacement> {
    if mode.is_empty() {
        Ok(None)
    } else {
        mode.parse().map(Some)
    }
}

/// A placement mode to its message field (none: empty).
#[must_use]
pub fn placement_to_pb(mode: Option<Placement>) -> String {
    mode.map(|p| p.to_string()).unwrap_or_default()
}

/// A placement mode as the `PlacementMode` enum carries it (none: unspecified).
#[must_use]
pub fn placement_mode_to_pb(mode: Option<Placement>) -> pb::PlacementMode {
    match mode {
        None => pb::PlacementMode::Unspecified,
        Some(Placement::Binpack) => pb::PlacementMode::Binpack,
        Some(Placement::Spread) => pb::PlacementMode::Spread,
        Some(Placement::InterferenceAware) => pb::PlacementMode::InterferenceAware,
    }
}

/// The mode a request asks for, by its `placement` string and its `placement_mode` enum:
/// either may be given, and both must then agree.
///
/// # Errors
/// A name that is no mode, an enum value that is none, or the two naming different modes.
pub fn placement_request_from_pb(mode: &str, enumerated: i32) -> Result<Option<Placement>, String> {
    let named = placement_from_pb(mode).map_err(|e| e.to_string())?;
    let numbered = match pb::PlacementMode::try_from(enumerated) {
        Ok(pb::PlacementMode::Unspecified) => None,
        Ok(pb::PlacementMode::Binpack) => Some(Placement::Binpack),
        Ok(pb::PlacementMode::Spread) => Some(Placement::Spread),
        Ok(pb::PlacementMode::InterferenceAware) => Some(Placement::InterferenceAware),
        Err(_) => {
            return Err(format!(
                "placement_mode: {enumerated} is not a PlacementMode"
            ));
        }
    };
    match (named, numbered) {
        (Some(a), Some(b)) if a != b => Err(format!(
            "placement {a} and placement_mode {b} disagree; give one"
        )),
        (a, b) => Ok(a.or(b)),
    }
}

/// An action's enum on the wire (issue 40): `Unspecified` for one this proto does not number
/// ([`Action::Other`]), whose name only `EnforcementEvent.action` carries.
#[must_use]
pub const fn action_to_pb(action: &Action) -> pb::EnforcementAction {
    use pb::EnforcementAction as A;
    match action {
        Action::Deny => A::Deny,
        Action::Kill => A::Kill,
        Action::Stop => A::Stop,
        Action::Report => A::Report,
        Action::DeviceDenied => A::DeviceDenied,
        Action::Hold => A::Hold,
        Action::Resume => A::Resume,
        Action::Bound => A::Bound,
        Action::Unbound => A::Unbound,
        Action::Expired => A::Expired,
        Action::Refused => A::Refused,
        Action::Preempt => A::Preempt,
        Action::Preempted => A::Preempted,
        Action::ShareDeviation => A::ShareDeviation,
        Action::Suspend => A::Suspend,
        Action::Suspended => A::Suspended,
        Action::SuspendRefused => A::SuspendRefused,
        Action::Resuming => A::Resuming,
        Action::Resumed => A::Resumed,
        Action::ResumeFailed => A::ResumeFailed,
        Action::ResumeRefused => A::ResumeRefused,
        Action::Released => A::Released,
        Action::Other(_) => A::Unspecified,
    }
}

/// The action an event message says: its `action_kind` where that is one this build numbers,
/// else its `action` string (an older sender fills only the string; a newer one's new action
/// is `Unspecified` beside its name), kept as sent when no known action has that name.
#[must_use]
pub fn action_from_pb(e: &pb::EnforcementEvent) -> Action {
    match pb::EnforcementAction::try_from(e.action_kind) {
        Ok(kind) if kind != pb::EnforcementAction::Unspecified => Action::KNOWN
            .into_iter()
            .find(|a| action_to_pb(a) == kind)
            .unwrap_or_else(|| e.action.as_str().into()),
        _ => e.action.as_str().into(),
    }
}

/// An `EnforcementEvent` message to an event (its session id is kept apart).
#[must_use]
pub fn event_from_pb(e: &pb::EnforcementEvent) -> EnforcementEvent {
    EnforcementEvent {
        action: action_from_pb(e),
        reason: e.reason.clone(),
        container: e.container.clone(),
        pid: e.pid,
        // An agent from before issue 40 says no GPU and GPU 0 alike with 0: only a nonzero
        // `device` names one for sure.
        device: e.device_index.or((e.device != 0).then_some(e.device)),
        requested_bytes: e.requested_bytes,
        used_bytes: e.used_bytes,
        limit_bytes: e.limit_bytes,
        at_ms: e.at_ms,
        move_interrupted: e.move_interrupted,
    }
}

/// An event of session `session_id` to its message.
#[must_use]
pub fn event_to_pb(session_id: &str, e: &EnforcementEvent) -> pb::EnforcementEvent {
    pb::EnforcementEvent {
        session_id: session_id.to_owned(),
        action: e.action.as_str().to_owned(),
        reason: e.reason.clone(),
        container: e.container.clone(),
        pid: e.pid,
        // Both: `device` for v1 readers (0 when none), `device_index` telling none apart.
        device: e.device.unwrap_or_default(),
        requested_bytes: e.requested_bytes,
        used_bytes: e.used_bytes,
        limit_bytes: e.limit_bytes,
        at_ms: e.at_ms,
        device_index: e.device,
        action_kind: action_to_pb(&e.action).into(),
        move_interrupted: e.move_interrupted,
    }
}

/// A reconfigurable GPU's MIG layout to its message (the agent's registration, the node
/// listing).
#[must_use]
pub fn mig_layout_to_pb(l: &MigGpuLayout) -> pb::MigLayout {
    pb::MigLayout {
        gpu_uuid: l.gpu_uuid.clone(),
        gpu_index: l.gpu_index,
        slices: l.slices,
        occupied: l
            .occupied
            .iter()
            .map(|&(start, size)| pb::MigPlacement { start, size })
            .collect(),
        profiles: l
            .profiles
            .iter()
            .map(|p| pb::MigProfilePlacements {
                profile: p.profile.clone(),
                size: p.size,
                starts: p.starts.clone(),
                free: p.free.clone(),
            })
            .collect(),
    }
}

/// A reconfigurable GPU's MIG layout from its message (the controller reads a registration;
/// the bounds are checked before, `limits`).
#[must_use]
pub fn mig_layout_from_pb(l: &pb::MigLayout) -> MigGpuLayout {
    MigGpuLayout {
        gpu_uuid: l.gpu_uuid.clone(),
        gpu_index: l.gpu_index,
        slices: l.slices,
        occupied: l.occupied.iter().map(|p| (p.start, p.size)).collect(),
        profiles: l
            .profiles
            .iter()
            .map(|p| MigProfilePlacements {
                profile: p.profile.clone(),
                size: p.size,
                starts: p.starts.clone(),
                free: p.free.clone(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mig_layout_goes_through_the_wire_unchanged() {
        let layout = MigGpuLayout {
            gpu_uuid: "GPU-1".into(),
            gpu_index: 3,
            slices: 8,
            occupied: vec![(4, 4), (0, 2)],
            profiles: vec![MigProfilePlacements {
                profile: "1g.18gb".into(),
                size: 1,
                starts: (0..7).collect(),
                free: vec![2, 3],
            }],
        };
        let wire = mig_layout_to_pb(&layout);
        // Field by field on the wire, as the proto names them.
        assert_eq!(
            wire.occupied
                .iter()
                .map(|p| (p.start, p.size))
                .collect::<Vec<_>>(),
            [(4, 4), (0, 2)]
        );
        assert_eq!(wire.profiles[0].free, [2, 3]);
        assert_eq!(mig_layout_from_pb(&wire), layout);
    }

    #[test]
    fn scopes_round_trip_and_an_absent_one_is_an_admins() {
        let scope = TargetScope {
            admin: false,
            unconfined: false,
            cgroup_prefixes: vec!["/tenants/a".into()],
            namespaces: vec!["ns".into()],
        };
        assert_eq!(scope_from_pb(Some(&scope_to_pb(&scope))), scope);
        assert_eq!(scope_from_pb(None), TargetScope::admin(false));
    }

    #[test]
    fn targets_round_trip_and_none_has_no_message() {
        for target in [
            Target::ContainerId("ab".into()),
            Target::PodUid("123e4567-e89b-12d3-a456-426614174000".into()),
            Target::CgroupPath("/a".into()),
            Target::Managed,
        ] {
            let wire = target_to_pb(&target);
            assert!(wire.is_some(), "{target}");
            assert_eq!(target_from_pb(wire.as_ref()), target);
        }
        assert_eq!(target_to_pb(&Target::None), None);
        assert_eq!(target_from_pb(None), Target::None);
        let unmanaged = pb::Target {
            kind: Some(pb::target::Kind::Managed(false)),
        };
        assert_eq!(target_from_pb(Some(&unmanaged)), Target::None);
    }

    #[test]
    fn states_kinds_and_policies_round_trip() {
        for state in SessionState::ALL {
            assert_eq!(state_from_pb(state_to_pb(state).into()), Some(state));
        }
        assert_eq!(state_from_pb(0), None);
        for state in [NodeState::Ready, NodeState::Lost] {
            assert_eq!(
                node_state_from_pb(node_state_to_pb(state).into()),
                Some(state)
            );
        }
        assert_eq!(node_state_from_pb(0), None);
        assert_eq!(state_from_pb(99), None);
        for kind in [SlotKind::Count, SlotKind::Bytes, SlotKind::Unique] {
            assert_eq!(kind_from_pb(kind_to_pb(kind).into()), Some(kind));
        }
        assert_eq!(kind_from_pb(0), None);
        let policy = QuotaPolicy {
            memory: MemoryPolicy::Stop,
            compute: ComputePolicy::WorkConserving,
        };
        assert_eq!(policy_from_pb(Some(&policy_to_pb(policy))), Ok(policy));
        assert_eq!(policy_from_pb(None), Ok(QuotaPolicy::default()));
        let bad = pb::QuotaPolicy {
            memory: "evict".into(),
            compute: String::new(),
            ..Default::default()
        };
        let err = policy_from_pb(Some(&bad)).expect_err("unknown");
        assert!(err.to_string().contains("evict"), "{err}");
        assert_eq!(err.field(), "memory");
    }

    #[test]
    fn policies_are_read_from_their_enums_or_strings_and_both_must_agree() {
        let wire = |memory: &str, memory_policy, compute: &str, compute_policy| pb::QuotaPolicy {
            memory: memory.into(),
            compute: compute.into(),
            memory_policy,
            compute_policy,
        };
        let stop = i32::from(pb::MemoryPolicy::Stop);
        let conserving = i32::from(pb::ComputePolicy::WorkConserving);
        let wanted = QuotaPolicy {
            memory: MemoryPolicy::Stop,
            compute: ComputePolicy::WorkConserving,
        };
        // The enums alone, the strings alone, both agreeing: one policy.
        for given in [
            wire("", stop, "", conserving),
            wire("stop", 0, "work-conserving", 0),
            wire("stop", stop, "work-conserving", conserving),
            wire("stop", 0, "", conserving),
        ] {
            assert_eq!(policy_from_pb(Some(&given)), Ok(wanted), "{given:?}");
        }
        // Nothing given: the defaults.
        assert_eq!(
            policy_from_pb(Some(&wire("", 0, "", 0))),
            Ok(QuotaPolicy::default())
        );
        // Disagreeing halves and unknown numbers name their field.
        let kill = i32::from(pb::MemoryPolicy::Kill);
        let hard = i32::from(pb::ComputePolicy::Hard);
        for (given, field) in [
            (wire("stop", kill, "", 0), "memory"),
            (wire("", 0, "work-conserving", hard), "compute"),
            (wire("", 9, "", 0), "memory_policy"),
            (wire("", 0, "", -1), "compute_policy"),
        ] {
            let err = policy_from_pb(Some(&given)).expect_err("refused");
            assert_eq!(err.field(), field, "{err}");
        }
        // Answers carry both, and they agree.
        let both = policy_to_pb(wanted);
        assert_eq!(
            (both.memory.as_str(), both.memory_policy()),
            ("stop", pb::MemoryPolicy::Stop)
        );
        assert_eq!(
            (both.compute.as_str(), both.compute_policy()),
            ("work-conserving", pb::ComputePolicy::WorkConserving)
        );
    }

    #[test]
    fn slots_events_and_placements_round_trip_and_bad_slots_are_named() {
        let slots =
            ResourceSlot::parse_any(&["cpu=1", "mem=2g", "cuda.shares=0.2"]).expect("parses");
        assert_eq!(slots_from_pb(Some(&slots_to_pb(&slots))), Ok(slots));
        assert_eq!(slots_from_pb(None), Ok(ResourceSlot::new()));
        let bad = |name: &str, value: &str| {
            let values = [(name.to_owned(), value.to_owned())].into_iter().collect();
            slots_from_pb(Some(&pb::ResourceSlot { values }))
                .expect_err("refused")
                .to_string()
        };
        assert!(bad("CPU", "1").contains("invalid slot name \"CPU\""));
        assert_eq!(
            bad("cpu", "1.5x"),
            "slot \"cpu\": \"1.5x\" is not a decimal number"
        );
        for action in Action::KNOWN {
            let event = EnforcementEvent {
                action,
                reason: "r".into(),
                pid: 3,
                at_ms: 9,
                ..EnforcementEvent::default()
            };
            let wire = event_to_pb("s", &event);
            assert_eq!(wire.session_id, "s");
            assert_eq!(event_from_pb(&wire), event);
        }
        // No GPU and GPU 0 are told apart on the wire (issue 40); `device` stays 0 for both.
        for device in [None, Some(0), Some(3)] {
            let event = EnforcementEvent {
                device,
                ..EnforcementEvent::default()
            };
            let wire = event_to_pb("s", &event);
            assert_eq!(
                (wire.device, wire.device_index),
                (device.unwrap_or(0), device)
            );
            assert_eq!(event_from_pb(&wire).device, device);
        }
        // An agent from before: only a nonzero `device` names a GPU for sure.
        let old = |device| pb::EnforcementEvent {
            device,
            ..pb::EnforcementEvent::default()
        };
        assert_eq!(event_from_pb(&old(2)).device, Some(2));
        assert_eq!(event_from_pb(&old(0)).device, None);
        for mode in Placement::ALL {
            assert_eq!(
                placement_from_pb(&placement_to_pb(Some(mode))),
                Ok(Some(mode))
            );
        }
        assert_eq!(placement_from_pb(""), Ok(None));
        assert!(placement_from_pb("fastest").is_err());
    }

    #[test]
    fn every_action_has_its_enum_named_as_its_string_and_newer_ones_keep_their_name() {
        // Both ways: each known action has a value named as its string, and each value but
        // UNSPECIFIED is some known action's.
        let mut numbered = std::collections::BTreeSet::new();
        for action in Action::KNOWN {
            let kind = action_to_pb(&action);
            assert_eq!(
                kind.as_str_name(),
                format!("ENFORCEMENT_ACTION_{}", action.as_str().to_uppercase())
            );
            assert!(numbered.insert(kind), "{kind:?} twice");
            let wire = event_to_pb(
                "s",
                &EnforcementEvent {
                    action: action.clone(),
                    ..EnforcementEvent::default()
                },
            );
            assert_eq!(
                (wire.action.as_str(), wire.action_kind),
                (action.as_str(), i32::from(kind))
            );
        }
        let values: Vec<_> = (1..=1000)
            .filter_map(|n| pb::EnforcementAction::try_from(n).ok())
            .collect();
        assert_eq!(values.len(), numbered.len(), "{values:?}");
        // An action this proto does not number: UNSPECIFIED, the string says what.
        let newer = event_to_pb(
            "s",
            &EnforcementEvent {
                action: Action::Other("throttle".into()),
                ..EnforcementEvent::default()
            },
        );
        assert_eq!((newer.action.as_str(), newer.action_kind), ("throttle", 0));
        assert_eq!(
            event_from_pb(&newer).action,
            Action::Other("throttle".into())
        );
        // An agent from before the enum fills only the string; a sender filling only the
        // enum is read by it.
        let only = |action: &str, kind: pb::EnforcementAction| pb::EnforcementEvent {
            action: action.into(),
            action_kind: kind.into(),
            ..pb::EnforcementEvent::default()
        };
        assert_eq!(
            action_from_pb(&only("released", pb::EnforcementAction::Unspecified)),
            Action::Released
        );
        assert_eq!(
            action_from_pb(&only("", pb::EnforcementAction::SuspendRefused)),
            Action::SuspendRefused
        );
    }
}
