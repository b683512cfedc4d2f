//! Principals: who may speak to the controller and how their certificates name them — the
//! client roles, client and node names, and the SPIFFE URIs that carry them
//! (`spiffe://gpuwarden/{node,user,admin}/<name>`). A leaf: the modules that authenticate
//! ([`super::identity`], [`super::clients`]), mint ([`super::mint`]), read tokens
//! ([`super::tokens`]) and grant ([`super::grants`]) all import it, and it imports none of them.

use std::{fmt, str::FromStr, sync::Arc};

use serde::{Deserialize, Serialize};

use crate::limits::Denials;

/// The prefix every gpuwarden identity URI shares (nodes, users, admins).
pub const IDENTITY_URI_PREFIX: &str = "spiffe://gpuwarden/";

/// The URI SAN prefix that names a user in its client certificate.
pub const USER_URI_PREFIX: &str = "spiffe://gpuwarden/user/";
/// The URI SAN prefix that names an admin in its client certificate.
pub const ADMIN_URI_PREFIX: &str = "spiffe://gpuwarden/admin/";
/// The URI SAN prefix that names a node in its client certificate.
pub const NODE_URI_PREFIX: &str = "spiffe://gpuwarden/node/";

/// The URI SAN that names `node_id`.
#[must_use]
pub fn node_uri(node_id: &str) -> String {
    format!("{NODE_URI_PREFIX}{node_id}")
}

/// What a client may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientRole {
    /// Sees and ends every session; creates sessions for any owner.
    Admin,
    /// Creates, sees, watches and ends only its own sessions.
    User,
}

impl ClientRole {
    /// The role's name, as the token file and the URI SAN spell it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::User => "user",
        }
    }

    /// The URI SAN that names `name` in this role.
    #[must_use]
    pub fn uri(self, name: &str) -> String {
        match self {
            Self::Admin => format!("{ADMIN_URI_PREFIX}{name}"),
            Self::User => format!("{USER_URI_PREFIX}{name}"),
        }
    }
}

impl fmt::Display for ClientRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role name that is neither `admin` nor `user`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("role {0:?}: expected admin or user")]
pub struct UnknownRole(pub String);

impl FromStr for ClientRole {
    type Err = UnknownRole;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "admin" => Ok(Self::Admin),
            "user" => Ok(Self::User),
            other => Err(UnknownRole(other.to_owned())),
        }
    }
}

/// Checks a client's name (an owner): 1 to 128 letters, digits, `.`, `-`, `_` or `@`, not
/// starting with `.` or `-`, so it fits a URI, a TOML string and a log line unescaped.
///
/// # Errors
/// What is wrong with it.
pub fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 128 {
        return Err("must be 1 to 128 characters");
    }
    if name.starts_with(['.', '-']) {
        return Err("must not start with '.' or '-'");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '@'))
    {
        return Err("only letters, digits, '.', '-', '_' and '@'");
    }
    Ok(())
}

/// How a caller proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// Nothing: the controller is open.
    Open,
    /// A bearer token from the token file.
    Token,
    /// A client certificate.
    Certificate,
}

/// Who is calling, and in what role (what it may do is [`super::clients`]' to say).
#[derive(Debug, Clone)]
pub struct Caller {
    /// The name: the owner a user acts as.
    pub name: String,
    /// What it may do.
    pub role: ClientRole,
    /// How it proved it.
    pub credential: Credential,
    /// Where what it is refused is counted: the server's (see [`crate::limits::Bounds`]).
    pub denials: Arc<Denials>,
}

impl Caller {
    /// Whether the caller sees and ends every session.
    #[must_use]
    pub fn is_admin(&self) -> bool {
        self.role == ClientRole::Admin
    }

    /// Whether the caller may see sessions of `owner`.
    #[must_use]
    pub fn may_see(&self, owner: &str) -> bool {
        self.is_admin() || self.name == owner
    }
}
