//! The workload on a node that a quota binds to.

use std::fmt;

use serde::{Deserialize, Serialize};

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
    /// Checks the target's form as a session asks for it; `pinned_node` is the node the session
    /// is pinned to (a managed target needs one).
    ///
    /// # Errors
    /// The [`TargetError`] naming the bad part.
    pub fn validate(&self, pinned_node: Option<&str>) -> Result<(), TargetError> {
        match self {
            Self::Managed if pinned_node.is_none_or(str::is_empty) => {
                Err(TargetError::ManagedUnpinned)
            }
            _ => self.check_form(),
        }
    }

    /// Checks the target's form alone, as the node told to enforce it does (a managed target
    /// reaching a node is for that node).
    ///
    /// # Errors
    /// The [`TargetError`] naming the bad part.
    pub fn check_form(&self) -> Result<(), TargetError> {
        match self {
            Self::None | Self::Managed => Ok(()),
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
        }
    }

    /// Whether there is a workload to enforce on.
    #[must_use]
    pub const fn is_none(&self) -> bool {
        matches!(self, Self::None)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::ContainerId(id) => write!(f, "container {id}"),
            Self::PodUid(uid) => write!(f, "pod {uid}"),
            Self::CgroupPath(path) => write!(f, "cgroup {path}"),
            Self::Managed => f.write_str("managed"),
        }
    }
}

/// What a session's target was authorized under (docs/architecture.md, "A session binds only
/// what its owner may act on").
///
/// The controller decides it when the session is created, from who asked and the grants an admin
/// configured for the owner; it travels with the allocation so the agent holds the target to it
/// again, independently. The default is the narrowest scope: a managed cgroup or nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TargetScope {
    /// An admin created the session: any workload it names.
    #[serde(default)]
    pub admin: bool,
    /// An admin said explicitly that the target need not be a workload's cgroup (a slice, a
    /// service). Never the cgroup root, a system cgroup, the agent's own or another session's.
    #[serde(default)]
    pub unconfined: bool,
    /// A user's cgroup-path target lies inside one of these.
    #[serde(default)]
    pub cgroup_prefixes: Vec<String>,
    /// A user's pod or container target belongs to a pod in one of these namespaces, as the
    /// node's kubelet reports the pod.
    #[serde(default)]
    pub namespaces: Vec<String>,
}

impl TargetScope {
    /// The scope of an admin's session (`unconfined` when it said so).
    #[must_use]
    pub const fn admin(unconfined: bool) -> Self {
        Self {
            admin: true,
            unconfined,
            cgroup_prefixes: Vec::new(),
            namespaces: Vec::new(),
        }
    }

    /// The scope of a record written before scopes existed: an admin's, since authentication
    /// alone let it be created then.
    #[must_use]
    pub const fn legacy() -> Self {
        Self::admin(false)
    }

    /// Whether `target` is inside the scope by its form alone (a pod's namespace is checked
    /// where the pod is known, on its node).
    ///
    /// # Errors
    /// What puts it outside, in words that name the target.
    pub fn admits(&self, target: &Target) -> Result<(), String> {
        if self.admin {
            return Ok(());
        }
        match target {
            Target::None | Target::Managed => Ok(()),
            Target::CgroupPath(path) => {
                if self.cgroup_prefixes.iter().any(|p| is_within(path, p)) {
                    Ok(())
                } else if self.cgroup_prefixes.is_empty() {
                    Err(format!("{target}: no cgroup prefix is granted"))
                } else {
                    Err(format!(
                        "{target} is outside the granted cgroup prefixes ({})",
                        self.cgroup_prefixes.join(", ")
                    ))
                }
            }
            Target::ContainerId(_) | Target::PodUid(_) => {
                if self.namespaces.is_empty() {
                    Err(format!("{target}: no Kubernetes namespace is granted"))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Whether a pod in `namespace` is inside the scope.
    #[must_use]
    pub fn admits_namespace(&self, namespace: &str) -> bool {
        self.admin || self.namespaces.iter().any(|n| n == namespace)
    }
}

/// Whether cgroup `path` is `prefix` or below it, component by component (`/a/bc` is not below
/// `/a/b`).
#[must_use]
pub fn is_within(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    let path = path.trim_end_matches('/');
    prefix.is_empty()
        || path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Whether `s` is a UUID as Kubernetes writes UIDs: `8-4-4-4-12` hex digits.
#[must_use]
pub fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl Target {
    /// The kind's stable name (`none`, `container_id`, `pod_uid`, `cgroup_path`, `managed`),
    /// as JSON documents show it beside [`Target::value`].
    #[must_use]
    pub const fn kind(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::ContainerId(_) => "container_id",
            Self::PodUid(_) => "pod_uid",
            Self::CgroupPath(_) => "cgroup_path",
            Self::Managed => "managed",
        }
    }

    /// The container id, pod UID or cgroup path; `None` for the kinds without one.
    #[must_use]
    pub fn value(&self) -> Option<&str> {
        match self {
            Self::ContainerId(v) | Self::PodUid(v) | Self::CgroupPath(v) => Some(v),
            Self::None | Self::Managed => None,
        }
    }

    /// The same target in the form the agent matches cgroups against: container ids and pod
    /// UIDs in lowercase (runtimes and the kubelet write them so), cgroup paths without a
    /// trailing `/`.
    #[must_use]
    pub fn normalized(self) -> Self {
        match self {
            Self::ContainerId(id) => Self::ContainerId(id.to_ascii_lowercase()),
            Self::PodUid(uid) => Self::PodUid(uid.to_ascii_lowercase()),
            Self::CgroupPath(path) if path.len() > 1 => {
                Self::CgroupPath(path.trim_end_matches('/').to_owned())
            }
            other => other,
        }
    }
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
    fn targets_keep_their_stored_form() {
        let json = serde_json::to_string(&(
            Target::ContainerId("ab".into()),
            Target::Managed,
            Target::None,
        ))
        .expect("serializes");
        assert_eq!(json, r#"[{"container_id":"ab"},"managed","none"]"#);
    }

    #[test]
    fn normalized_targets_match_what_runtimes_write() {
        assert_eq!(
            Target::ContainerId("ABCdef".into()).normalized(),
            Target::ContainerId("abcdef".into())
        );
        assert_eq!(
            Target::CgroupPath("/a/b/".into()).normalized(),
            Target::CgroupPath("/a/b".into())
        );
        assert_eq!(
            Target::CgroupPath("/".into()).normalized(),
            Target::CgroupPath("/".into())
        );
        assert_eq!(Target::Managed.normalized(), Target::Managed);
    }

    #[test]
    fn cgroup_prefixes_match_whole_components() {
        assert!(is_within("/tenants/alice", "/tenants/alice"));
        assert!(is_within("/tenants/alice/job", "/tenants/alice/"));
        assert!(!is_within("/tenants/alice2", "/tenants/alice"));
        assert!(!is_within("/tenants", "/tenants/alice"));
        assert!(is_within("/anything", "/"));
    }

    #[test]
    fn a_scope_admits_only_what_it_grants() {
        let pod = Target::PodUid("123e4567-e89b-12d3-a456-426614174000".into());
        let narrow = TargetScope::default();
        assert_eq!(narrow.admits(&Target::Managed), Ok(()));
        assert_eq!(narrow.admits(&Target::None), Ok(()));
        let err = narrow.admits(&pod).expect_err("no namespace granted");
        assert!(err.contains("no Kubernetes namespace"), "{err}");
        let err = narrow
            .admits(&Target::CgroupPath("/h1victim.slice".into()))
            .expect_err("no prefix granted");
        assert!(err.contains("/h1victim.slice"), "{err}");

        let alice = TargetScope {
            cgroup_prefixes: vec!["/tenants/alice.slice".into()],
            namespaces: vec!["team-a".into()],
            ..TargetScope::default()
        };
        assert_eq!(
            alice.admits(&Target::CgroupPath("/tenants/alice.slice/job-1".into())),
            Ok(())
        );
        let err = alice
            .admits(&Target::CgroupPath("/tenants/bob.slice".into()))
            .expect_err("outside");
        assert!(err.contains("/tenants/alice.slice"), "{err}");
        assert_eq!(alice.admits(&pod), Ok(()));
        assert!(alice.admits_namespace("team-a"));
        assert!(!alice.admits_namespace("team-b"));
        assert!(TargetScope::admin(false).admits_namespace("kube-system"));
        assert_eq!(
            TargetScope::admin(false).admits(&Target::CgroupPath("/x".into())),
            Ok(())
        );
    }

    #[test]
    fn kinds_and_values_are_named_for_documents() {
        assert_eq!(Target::PodUid("u".into()).kind(), "pod_uid");
        assert_eq!(Target::PodUid("u".into()).value(), Some("u"));
        assert_eq!(Target::Managed.kind(), "managed");
        assert_eq!(Target::Managed.value(), None);
        assert_eq!(Target::None.kind(), "none");
    }
}
