//! What a quota may bind to, whoever asked (docs/architecture.md, "A session binds only what
//! its owner may act on").
//!
//! The controller authorizes a session's target per owner; the agent holds every quota to these
//! rules again, so a confused or compromised controller still cannot aim a quota at the node
//! itself. A quota never binds to:
//!
//! - the cgroup root, or a system cgroup: `system.slice`, `user.slice`, `machine.slice`,
//!   `init.scope`, the `kubepods` slice and its `QoS` slices, gpuwarden's own parent of session
//!   cgroups;
//! - the agent's own cgroup or one above it (it would freeze or kill the agent);
//! - a cgroup above or below one another session binds (two quotas on one process);
//! - a cgroup that is not a workload's (a container's, a pod's or a gpuwarden session's) unless
//!   an admin said so explicitly (`unconfined`) or an admin's grant covers it (a cgroup prefix);
//! - for a user's pod or container target: a pod outside the namespaces granted to its owner, as
//!   the kubelet reports the pod.
//!
//! [`check_allocation`] runs when an allocation arrives, on what its target says (the agent
//! refuses with `InvalidQuota`); [`Rules::check_bind`] runs when the target's cgroup is found,
//! on the cgroup itself.

use gpuwarden_types::target::{Target, TargetScope, is_within};

use super::{MANAGED_PARENT, quota::QuotaSpec};
use crate::attribution::{Runtime, kubelet::PodNames, parse_cgroup_path};

/// The longest session id the agent accepts: it names a cgroup directory and a store key.
pub const MAX_SESSION_ID_LEN: usize = 128;

/// Why a quota may not bind where its target points.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A session id that can't name a directory or a key.
    #[error("session id {id:?} {why}")]
    SessionId {
        /// The id (cut to a readable length).
        id: String,
        /// What is wrong.
        why: &'static str,
    },
    /// The cgroup root.
    #[error("the cgroup root: a quota there would hold every process on the node")]
    Root,
    /// A system cgroup.
    #[error(
        "{path} is a system cgroup (the node's slices, kubepods and its QoS slices, init.scope)"
    )]
    System {
        /// Relative cgroup path.
        path: String,
    },
    /// The agent's own cgroup, or one above it.
    #[error("{path} holds the gpuwarden agent itself ({agent})")]
    HoldsAgent {
        /// Relative cgroup path.
        path: String,
        /// The agent's cgroup.
        agent: String,
    },
    /// Not a workload's cgroup, and nobody with the right said it may be.
    #[error(
        "{path} is not a container's, a pod's or a gpuwarden session's cgroup; only an admin's \
         session may bind it (unconfined_target), or a user's inside a cgroup prefix granted to it"
    )]
    NotWorkload {
        /// Relative cgroup path.
        path: String,
    },
    /// Above or below (or the same as) what another session binds. The message names nothing
    /// of the other session (its id, its target): that may be another owner's; the agent's log
    /// has both.
    #[error(
        "{path} overlaps a workload another session holds a quota on: a process would have two quotas"
    )]
    Overlap {
        /// What this quota would bind.
        path: String,
        /// The other session (for the agent's log only).
        other: String,
        /// What it binds (for the agent's log only).
        other_path: String,
    },
    /// Outside the scope the controller authorized.
    #[error("outside what the session's owner was granted: {0}")]
    OutsideScope(String),
    /// A user's container target that is in no Kubernetes pod.
    #[error("{target} is in no Kubernetes pod ({path}); the owner's grant covers namespaces only")]
    NotInPod {
        /// The target.
        target: String,
        /// Its cgroup.
        path: String,
    },
    /// A user's pod in a namespace it was not granted. The message names only what the user
    /// named itself and what it was granted: never the pod's name or namespace, which may be
    /// another tenant's.
    #[error("{target} is not in a namespace granted to the session's owner ({granted})")]
    Namespace {
        /// The target, as the session names it.
        target: String,
        /// The granted ones.
        granted: String,
    },
    /// A user's pod target on a node whose agent has no kubelet to ask.
    #[error(
        "{target}: this agent has no kubelet to tell the pod's namespace (agent setting [kubelet])"
    )]
    NoKubelet {
        /// The target.
        target: String,
    },
}

/// Checks `id` before it names a managed cgroup (`gpuwarden/<id>`) or a key in the agent's
/// store: 1 to [`MAX_SESSION_ID_LEN`] letters, digits, `-`, `_` or `.`, and not `.` or `..`.
///
/// # Errors
/// [`Refusal::SessionId`] saying what is wrong.
pub fn check_session_id(id: &str) -> Result<(), Refusal> {
    let refuse = |why| {
        Err(Refusal::SessionId {
            id: id.chars().take(80).collect(),
            why,
        })
    };
    if id.is_empty() || id.len() > MAX_SESSION_ID_LEN {
        return refuse("must be 1 to 128 characters");
    }
    if id == "." || id == ".." {
        return refuse("must not be \".\" or \"..\"");
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return refuse("may hold only letters, digits, '-', '_' and '.'");
    }
    Ok(())
}

/// Whether `path` is a system cgroup no quota binds to, however it was asked.
fn is_system(path: &str) -> bool {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    match components.as_slice() {
        [] | ["system.slice" | "user.slice" | "machine.slice"] => true,
        [first, ..] if *first == "init.scope" => true,
        [only] if *only == MANAGED_PARENT => true,
        _ => {
            // kubepods (under any prefix) or one of its QoS slices: no pod on the path.
            let w = parse_cgroup_path(path);
            w.runtime == Runtime::Cri && w.pod_uid.is_none()
        }
    }
}

/// Whether `path` is a workload's cgroup: a container's, a pod's, or a gpuwarden session's.
fn is_workload(path: &str) -> bool {
    let w = parse_cgroup_path(path);
    w.container_id.is_some()
        || w.pod_uid.is_some()
        || (is_within(path, &format!("/{MANAGED_PARENT}"))
            && path.trim_end_matches('/') != format!("/{MANAGED_PARENT}"))
}

/// The rules that hold for the cgroup `path` whoever binds it, under `scope`; `agent` is the
/// agent's own cgroup, when known.
fn check_cgroup(path: &str, scope: &TargetScope, agent: Option<&str>) -> Result<(), Refusal> {
    if path.trim_end_matches('/').is_empty() {
        return Err(Refusal::Root);
    }
    if is_system(path) {
        return Err(Refusal::System {
            path: path.to_owned(),
        });
    }
    if let Some(agent) = agent
        && is_within(agent, path)
    {
        return Err(Refusal::HoldsAgent {
            path: path.to_owned(),
            agent: agent.to_owned(),
        });
    }
    // An admin's explicit word, or a prefix an admin granted the owner.
    let vouched = scope.unconfined || scope.cgroup_prefixes.iter().any(|p| is_within(path, p));
    if !vouched && !is_workload(path) {
        return Err(Refusal::NotWorkload {
            path: path.to_owned(),
        });
    }
    Ok(())
}

/// Whether two targets name overlapping workloads by their form alone; the cgroups they resolve
/// to are compared again at binding.
fn overlaps(a: &Target, b: &Target) -> bool {
    match (a, b) {
        (Target::ContainerId(x), Target::ContainerId(y))
        | (Target::PodUid(x), Target::PodUid(y)) => x == y,
        (Target::CgroupPath(x), Target::CgroupPath(y)) => is_within(x, y) || is_within(y, x),
        _ => false,
    }
}

/// Checks a new allocation's quota by what its target says, against the quotas `held` for
/// other sessions; `agent` is the agent's own cgroup.
///
/// # Errors
/// The [`Refusal`] that applies first.
pub fn check_allocation<'a>(
    spec: &QuotaSpec,
    held: impl IntoIterator<Item = &'a QuotaSpec>,
    agent: Option<&str>,
) -> Result<(), Refusal> {
    check_session_id(&spec.session_id)?;
    spec.scope
        .admits(&spec.target)
        .map_err(Refusal::OutsideScope)?;
    if let Target::CgroupPath(path) = &spec.target {
        check_cgroup(path, &spec.scope, agent)?;
    }
    for other in held {
        if other.session_id != spec.session_id && overlaps(&spec.target, &other.target) {
            return Err(Refusal::Overlap {
                path: spec.target.to_string(),
                other: other.session_id.clone(),
                other_path: other.target.to_string(),
            });
        }
    }
    Ok(())
}

/// A pod's namespace as the node knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodLookup {
    /// The kubelet reported the pod in this namespace.
    Known {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The kubelet has not reported the pod (yet).
    Unknown,
    /// No kubelet is configured.
    NoKubelet,
}

/// Where a pod's namespace is looked up.
pub trait PodNamespaces: Send {
    /// The namespace of the pod with `uid`.
    fn lookup(&self, uid: &str) -> PodLookup;
}

impl PodNamespaces for PodNames {
    fn lookup(&self, uid: &str) -> PodLookup {
        if self.status().is_none() {
            return PodLookup::NoKubelet;
        }
        match PodNames::lookup(self, uid) {
            Some(pod) => PodLookup::Known {
                namespace: pod.namespace,
                name: pod.name,
            },
            None => PodLookup::Unknown,
        }
    }
}

/// What binding a quota at a cgroup comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Bind it.
    Bind,
    /// Not yet: what is awaited (the kubelet's word on a pod).
    Wait(String),
    /// Never here.
    Refuse(Refusal),
}

/// The node's side of the rules: the agent's own cgroup and where pods' namespaces are known.
pub struct Rules {
    agent: Option<String>,
    pods: Box<dyn PodNamespaces>,
}

impl std::fmt::Debug for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rules")
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

/// No kubelet: every pod is [`PodLookup::NoKubelet`].
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPods;

impl PodNamespaces for NoPods {
    fn lookup(&self, _: &str) -> PodLookup {
        PodLookup::NoKubelet
    }
}

impl Default for Rules {
    /// No agent cgroup known, no kubelet.
    fn default() -> Self {
        Self {
            agent: None,
            pods: Box::new(NoPods),
        }
    }
}

impl Rules {
    /// The rules for an agent in cgroup `agent` (relative to the root), asking `pods` for pods'
    /// namespaces.
    #[must_use]
    pub fn new(agent: Option<String>, pods: Box<dyn PodNamespaces>) -> Self {
        Self { agent, pods }
    }

    /// The agent's own cgroup, relative to the root.
    #[must_use]
    pub fn agent_cgroup(&self) -> Option<&str> {
        self.agent.as_deref()
    }

    /// Whether `spec` may bind at the cgroup `path` (relative to the root), given the cgroups
    /// `bound` by other sessions as (session, path). A user's pod is authorized (its namespace
    /// known and granted) before overlap is judged, so a refusal never tells a user about a
    /// workload it may not act on.
    pub fn check_bind<'a>(
        &self,
        spec: &QuotaSpec,
        path: &str,
        bound: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Verdict {
        if let Err(r) = check_cgroup(path, &spec.scope, self.agent.as_deref()) {
            return Verdict::Refuse(r);
        }
        if let Some(verdict) = self.authorize_pod(spec, path) {
            return verdict;
        }
        for (other, other_path) in bound {
            if other != spec.session_id
                && (is_within(path, other_path) || is_within(other_path, path))
            {
                return Verdict::Refuse(Refusal::Overlap {
                    path: path.to_owned(),
                    other: other.to_owned(),
                    other_path: other_path.to_owned(),
                });
            }
        }
        Verdict::Bind
    }

    /// For a user's pod or container target found at `path`: `None` when its pod is in a
    /// granted namespace, else what to do (wait for the kubelet, or refuse).
    fn authorize_pod(&self, spec: &QuotaSpec, path: &str) -> Option<Verdict> {
        if spec.scope.admin || !matches!(spec.target, Target::PodUid(_) | Target::ContainerId(_)) {
            return None;
        }
        let Some(uid) = parse_cgroup_path(path).pod_uid else {
            return Some(Verdict::Refuse(Refusal::NotInPod {
                target: spec.target.to_string(),
                path: path.to_owned(),
            }));
        };
        match self.pods.lookup(&uid) {
            PodLookup::Known { namespace, .. } if spec.scope.admits_namespace(&namespace) => None,
            PodLookup::Known { .. } => Some(Verdict::Refuse(Refusal::Namespace {
                target: spec.target.to_string(),
                granted: spec.scope.namespaces.join(", "),
            })),
            PodLookup::Unknown => Some(Verdict::Wait(format!(
                "waiting for the kubelet to report pod {uid}, to check its namespace"
            ))),
            PodLookup::NoKubelet => Some(Verdict::Refuse(Refusal::NoKubelet {
                target: spec.target.to_string(),
            })),
        }
    }
}

/// Authorizes a user's pod target when its allocation arrives, before it holds anything: a pod
/// the kubelet reports outside the owner's namespaces, or a node without a kubelet, refuses it
/// at once. A pod the kubelet does not know yet is held, and authorized at binding; until then
/// it counts for no one's overlap ([`counts_at_arrival`]).
///
/// # Errors
/// [`Refusal::Namespace`] or [`Refusal::NoKubelet`].
pub fn authorize_at_arrival(spec: &QuotaSpec, pods: &dyn PodNamespaces) -> Result<(), Refusal> {
    let Target::PodUid(uid) = &spec.target else {
        return Ok(());
    };
    if spec.scope.admin {
        return Ok(());
    }
    match pods.lookup(uid) {
        PodLookup::Known { namespace, .. } if !spec.scope.admits_namespace(&namespace) => {
            Err(Refusal::Namespace {
                target: spec.target.to_string(),
                granted: spec.scope.namespaces.join(", "),
            })
        }
        PodLookup::NoKubelet => Err(Refusal::NoKubelet {
            target: spec.target.to_string(),
        }),
        PodLookup::Known { .. } | PodLookup::Unknown => Ok(()),
    }
}

/// Whether the held quota `other` stands in the way of `new` when `new` arrives (the squatting
/// of issue 33: a user naming another tenant's pod first must not lock its owner, an admin or a
/// DRA claim out). An admin's holding always counts. A user's counts only once it is
/// authorized: a cgroup path or a managed cgroup (the controller checked its prefix), or a pod
/// the kubelet reports in a namespace granted to it; a container's namespace is only known at
/// binding. An admin's new quota is never held back by a user's: binding judges it against what
/// is bound.
#[must_use]
pub fn counts_at_arrival(new: &QuotaSpec, other: &QuotaSpec, pods: &dyn PodNamespaces) -> bool {
    if other.scope.admin {
        return true;
    }
    if new.scope.admin {
        return false;
    }
    match &other.target {
        Target::PodUid(uid) => matches!(
            pods.lookup(uid),
            PodLookup::Known { namespace, .. } if other.scope.admits_namespace(&namespace)
        ),
        Target::ContainerId(_) => false,
        _ => true,
    }
}

/// The cgroup v2 path of the calling process, relative to the root (its `0::` line).
#[must_use]
pub fn own_cgroup() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines()
        .find_map(crate::attribution::cgroup_path::unified_path)
        .map(str::to_owned)
}

#[cfg(test)]
mod tests;
