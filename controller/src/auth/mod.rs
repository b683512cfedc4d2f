//! Who may speak to the controller: mutual TLS for agents (docs/architecture.md, "Nobody is
//! trusted by default").
//!
//! - [`tls`]: the server's rustls configuration from PEM files, rebuilt when they change, and
//!   the listener's connections through it;
//! - [`identity`]: the node an agent's client certificate names
//!   (`spiffe://gpuwarden/node/<node-id>`), and the check that it speaks only for that node;
//! - [`denials`]: refusals counted by reason (`gpuwarden.auth.denied`);
//! - [`mint`]: a CA, a serving certificate and node certificates without OpenSSL.

pub mod denials;
pub mod identity;
pub mod mint;
pub mod tls;
