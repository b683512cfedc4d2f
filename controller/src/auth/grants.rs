//! What a session may bind to (docs/architecture.md, "A session binds only what its owner may
//! act on").
//!
//! Authentication says who calls; a quota also acts on a workload, so the controller decides per
//! owner which targets a session may name:
//!
//! - an admin: any target; with `unconfined_target` also a cgroup that is not a workload's;
//! - a user: what the system vouches for (the cgroup the agent makes for its `gpuwarden run`
//!   session, or no target at all) and targets inside the grants an admin configured for that
//!   owner: cgroup prefixes, and Kubernetes namespaces for pod and container targets (the agent
//!   checks the pod's namespace through its kubelet). No grant, no raw target.
//!
//! A user also picks only the memory policies its grant allows: `kill` and `stop` unless the
//! grant names others, so no tenant turns its limit into a mere `report` on a shared GPU.
//!
//! Grants live in a TOML file, followed as it changes like the token file, and failing closed
//! the same way: a missing file, or a version that can't be used, grants nothing (logged and
//! counted) until a good version is written:
//!
//! ```toml
//! [[grants]]
//! owner = "alice"
//! cgroup_prefixes = ["/tenants/alice.slice"]
//! namespaces = ["team-a"]
//! memory_policies = ["kill", "stop", "report"]   # optional; default kill, stop
//! ```
//!
//! What the controller decided travels with the allocation as a [`TargetScope`], and the agent
//! holds the target to it again.

use std::{collections::HashMap, path::Path, sync::Arc};

use gpuwarden_types::{
    dns::is_dns_label,
    policy::{MemoryPolicy, QuotaPolicy},
    target::{Target, TargetScope},
};
use serde::Deserialize;

use super::{
    followed::{ConfigFile, Followed},
    principal::{Caller, ClientRole, Credential, check_name},
};

/// The memory policies a user may pick when its grant names none.
pub const DEFAULT_USER_MEMORY_POLICIES: [MemoryPolicy; 2] =
    [MemoryPolicy::Kill, MemoryPolicy::Stop];

/// Why the grant file can't be used.
#[derive(Debug, thiserror::Error)]
pub enum GrantFileError {
    /// The file can't be read.
    #[error("grant file {path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML of the expected shape, or an entry is unusable.
    #[error("grant file {path}: {reason}")]
    Parse {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong, with the entry or the parser's line and column.
        reason: String,
    },
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFormat {
    #[serde(default)]
    grants: Vec<RawGrant>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGrant {
    owner: String,
    #[serde(default)]
    cgroup_prefixes: Vec<String>,
    #[serde(default)]
    namespaces: Vec<String>,
    #[serde(default)]
    memory_policies: Option<Vec<MemoryPolicy>>,
}

/// What an admin granted one owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Cgroup paths (and everything below them) its sessions may bind to.
    pub cgroup_prefixes: Vec<String>,
    /// Kubernetes namespaces whose pods and containers its sessions may bind to.
    pub namespaces: Vec<String>,
    /// The memory policies it may pick.
    pub memory_policies: Vec<MemoryPolicy>,
}

impl Default for Grant {
    fn default() -> Self {
        Self {
            cgroup_prefixes: Vec::new(),
            namespaces: Vec::new(),
            memory_policies: DEFAULT_USER_MEMORY_POLICIES.to_vec(),
        }
    }
}

/// Every owner's grant; an owner without one has the default (no raw targets).
#[derive(Debug, Default, Clone)]
pub struct Grants {
    by_owner: HashMap<String, Grant>,
}

impl Grants {
    /// Parses a grant file's text (`path` names it in errors).
    ///
    /// # Errors
    /// Not TOML of the expected shape, an invalid owner (or one twice), a prefix that is not an
    /// absolute cgroup path without `..`, or a namespace that is not a DNS label.
    pub fn parse(text: &str, path: &Path) -> Result<Self, GrantFileError> {
        let parse = |reason: String| GrantFileError::Parse {
            path: path.to_owned(),
            reason,
        };
        let file: FileFormat = toml::from_str(text).map_err(|e| parse(e.to_string()))?;
        let mut by_owner = HashMap::with_capacity(file.grants.len());
        for (i, raw) in file.grants.into_iter().enumerate() {
            let entry = |reason: String| parse(format!("entry {}: {reason}", i + 1));
            check_name(&raw.owner).map_err(|reason| entry(format!("owner: {reason}")))?;
            for prefix in &raw.cgroup_prefixes {
                Target::CgroupPath(prefix.clone())
                    .check_form()
                    .map_err(|e| entry(e.to_string()))?;
                if prefix.trim_end_matches('/').is_empty() {
                    return Err(entry(
                        "cgroup prefix \"/\" would grant every cgroup on every node; make the \
                         owner an admin instead"
                            .to_owned(),
                    ));
                }
            }
            for namespace in &raw.namespaces {
                if !is_dns_label(namespace) {
                    return Err(entry(format!(
                        "namespace {namespace:?} is not a DNS label (1 to 63 lowercase letters, \
                         digits and '-')"
                    )));
                }
            }
            let grant = Grant {
                cgroup_prefixes: raw
                    .cgroup_prefixes
                    .into_iter()
                    .map(|p| p.trim_end_matches('/').to_owned())
                    .collect(),
                namespaces: raw.namespaces,
                memory_policies: raw
                    .memory_policies
                    .unwrap_or_else(|| DEFAULT_USER_MEMORY_POLICIES.to_vec()),
            };
            if by_owner.insert(raw.owner.clone(), grant).is_some() {
                return Err(entry(format!("owner {:?} has an earlier entry", raw.owner)));
            }
        }
        Ok(Self { by_owner })
    }

    /// What `owner` was granted (the default when nothing).
    #[must_use]
    pub fn of(&self, owner: &str) -> Grant {
        self.by_owner.get(owner).cloned().unwrap_or_default()
    }
}

fn read(path: &Path) -> Result<Grants, GrantFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| GrantFileError::Io {
        path: path.to_owned(),
        source,
    })?;
    Grants::parse(&text, path)
}

/// The grant file, followed as it changes; without one every user has the default grant.
pub struct GrantFile(Option<Followed<Grants, GrantFileError>>);

impl std::fmt::Debug for GrantFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("GrantFile")
            .field(&self.0.as_ref().map(Followed::path))
            .finish()
    }
}

impl Default for GrantFile {
    fn default() -> Self {
        Self::none()
    }
}

impl GrantFile {
    /// No file: users bind only managed cgroups (or nothing).
    #[must_use]
    pub const fn none() -> Self {
        Self(None)
    }

    /// Reads `path` now.
    ///
    /// # Errors
    /// The file can't be read or parsed.
    pub fn load(path: &Path) -> Result<Self, GrantFileError> {
        Followed::load(path, ConfigFile::Grants, read, |_, _| Grants::default())
            .map(|f| Self(Some(f)))
    }

    /// Versions of the file that changed and could not be used since it was loaded; 0 without
    /// a file (`gpuwarden.controller.config.unusable{gpuwarden.config.file="grant_file"}`).
    #[must_use]
    pub fn unusable(&self) -> u64 {
        self.0.as_ref().map_or(0, Followed::unusable)
    }

    /// The grants now: none while the file is gone or its new version can't be used.
    #[must_use]
    pub fn current(&self) -> Arc<Grants> {
        self.0
            .as_ref()
            .map_or_else(|| Arc::new(Grants::default()), Followed::current)
    }
}

/// Why a session's target or policy is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetDenied {
    /// A user named a target outside its grants.
    #[error("owner {owner:?} may not bind a session to {detail}")]
    NotGranted {
        /// The session's owner.
        owner: String,
        /// The target and what is missing.
        detail: String,
    },
    /// A user asked for an unconfined target.
    #[error(
        "owner {owner:?}: only an admin may bind a session to a cgroup that is not a workload's (unconfined_target)"
    )]
    Unconfined {
        /// The session's owner.
        owner: String,
    },
    /// A user picked a memory policy its grant does not allow.
    #[error(
        "owner {owner:?} may not choose memory policy {policy} (granted: {granted}); an admin \
         grants more in the grant file"
    )]
    Policy {
        /// The session's owner.
        owner: String,
        /// What it picked.
        policy: MemoryPolicy,
        /// What it may pick.
        granted: String,
    },
}

/// The scope a session of `owner` created by `caller` may bind its `target` under, with
/// `policy` as asked.
///
/// # Errors
/// [`TargetDenied`] naming the target (or policy) and the owner.
pub fn authorize(
    caller: &Caller,
    owner: &str,
    target: &Target,
    policy: QuotaPolicy,
    unconfined: bool,
    grants: &Grants,
) -> Result<TargetScope, TargetDenied> {
    if caller.is_admin() {
        return Ok(TargetScope::admin(unconfined));
    }
    if unconfined {
        return Err(TargetDenied::Unconfined {
            owner: owner.to_owned(),
        });
    }
    let grant = grants.of(owner);
    if !grant.memory_policies.contains(&policy.memory) {
        return Err(TargetDenied::Policy {
            owner: owner.to_owned(),
            policy: policy.memory,
            granted: grant
                .memory_policies
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let scope = TargetScope {
        admin: false,
        unconfined: false,
        cgroup_prefixes: grant.cgroup_prefixes,
        namespaces: grant.namespaces,
    };
    scope
        .admits(target)
        .map_err(|detail| TargetDenied::NotGranted {
            owner: owner.to_owned(),
            detail,
        })?;
    Ok(scope)
}

/// Whether a session of `owner` for `target` with `policy`, authorized under `scope`, still
/// stands under `grants` (re-checked when the grant file changes: a removed grant ends what it
/// let a user create). An admin's session always does.
///
/// # Errors
/// What the grants no longer allow, as [`authorize`] would refuse it now.
pub fn still_granted(
    owner: &str,
    scope: &TargetScope,
    target: &Target,
    policy: &QuotaPolicy,
    grants: &Grants,
) -> Result<(), TargetDenied> {
    if scope.admin {
        return Ok(());
    }
    let caller = Caller {
        name: owner.to_owned(),
        role: ClientRole::User,
        credential: Credential::Open,
        // Nothing is refused to a caller here: only the grants are asked.
        denials: Arc::default(),
    };
    authorize(&caller, owner, target, *policy, false, grants).map(|_| ())
}

#[cfg(test)]
mod tests;
