//! The gRPC API: the services over the controller's [`Hub`] ([`crate::hub`]).
//!
//! The services are thin: [`SchedulerApi`] for clients (sessions, nodes, team queues), [`AgentApi`] for agents. Watchers read
//! the [`SessionLog`], where every change to a session is numbered by a revision; a standby's
//! calls are turned away by the [`StandbyGate`].

mod agents;
mod pages;
mod queues;
pub mod role;
mod scheduler_api;
mod sessions;

pub use agents::AgentApi;
pub use role::{LEADER_METADATA, StandbyGate};
pub use scheduler_api::SchedulerApi;

// The hub moved to `crate::hub`, and the conversions below it to `crate::convert` (the hub
// announces sessions as messages); these paths stay for callers that name them here.
pub use crate::{
    convert,
    hub::{Hub, Pending, Role, SessionLog, Timing, store_status, watch},
};
