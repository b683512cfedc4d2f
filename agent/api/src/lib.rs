//! The gpuwarden agent's local interface, spoken by the agent and every client of it.
//!
//! The agent serves newline-delimited JSON on a Unix socket (default [`DEFAULT_SOCKET`]): a
//! client writes one [`Request`] line and reads one [`Response`] line. `gpuwarden-agent
//! snapshot` and `top` read [`snapshot::Snapshot`]s through it, `gpuwarden run` asks it for the
//! node and for a session's cgroup, and an operator resumes or kills a stopped process. The
//! protocol lives in this small crate, free of eBPF and gRPC, so any client can depend on it.
//!
//! - [`protocol`]: the request and response lines;
//! - [`client`]: one request over the socket, with a timeout and typed errors;
//! - [`snapshot`]: the snapshot document (its key names are an interface: added to, never
//!   renamed).
//!
//! # Example
//!
//! ```
//! use gpuwarden_agent_api::{Request, parse_request};
//!
//! assert_eq!(parse_request(r#"{"request":"node"}"#), Ok(Request::Node));
//! assert!(parse_request(r#"{"request":"reboot"}"#).is_err());
//! ```
#![deny(missing_docs)]

pub mod client;
pub mod protocol;
pub mod snapshot;

pub use client::{ClientError, ask, call, snapshot};
pub use protocol::{
    Accepted, DEFAULT_SOCKET, NodeName, Request, Response, SessionCgroup, Signalled, parse_request,
};
pub use snapshot::{
    Accuracy, BindingView, Candidate, Container, DeviceQuotaView, DeviceUsage, EnforcementView,
    GpuHealthView, GpuView, Hook, KubeletStatus, QuotaView, Record, SignalView, Snapshot, Stats,
    TableBudget, Tier,
};
