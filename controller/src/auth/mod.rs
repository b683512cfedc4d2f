//! Who may speak to the controller (docs/architecture.md, "Nobody is trusted by default"):
//! mutual TLS for agents, a bearer token or a client certificate for clients.
//!
//! - [`tls`]: the server's rustls configuration from PEM files, rebuilt when they change, and
//!   the listener's connections through it;
//! - [`principal`]: the roles, names and SPIFFE URIs that name nodes, users and admins (a leaf
//!   the others import);
//! - [`identity`]: the node an agent's client certificate names
//!   (`spiffe://gpuwarden/node/<node-id>`), and the check that it speaks only for that node;
//! - [`clients`]: who calls the scheduler service (a user or an admin, from a token or a
//!   certificate) and what it may do with whose sessions;
//! - [`tokens`]: the file of hashed bearer tokens, re-read when it changes;
//! - [`grants`]: what a session may bind to: any workload for an admin, a user's own managed
//!   cgroups and what an admin granted it (cgroup prefixes, Kubernetes namespaces);
//! - `followed`: a configuration file re-read when it changes (tokens, grants), and the stamp
//!   that tells a file changed;
//! - [`denials`]: refusals counted by reason (`gpuwarden.auth.denied`), in the server's
//!   [`crate::limits::Bounds`] (the module lives there, below this one);
//! - [`gate`]: the gRPC layer that authenticates callers before their messages are read;
//! - [`mint`]: a CA, a serving certificate and node and client certificates without OpenSSL.

pub mod clients;
pub use crate::limits::denials;
pub mod followed;
pub mod gate;
pub mod grants;
pub mod identity;
pub mod mint;
pub mod principal;
pub mod tls;
pub mod tokens;
