//! The agent and the controller: the link (register, one bidirectional stream, reconnecting),
//! what the node holds for the controller (persisted in sled), and usage reports.

pub mod holdings;
pub mod link;
pub mod usage;
