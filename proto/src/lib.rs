//! gpuwarden's gRPC API, package `gpuwarden.v1`, generated from `proto/gpuwarden/v1/*.proto`
//! with a pure-Rust protobuf compiler.
//!
//! - `AgentService`: an agent registers its node (devices, slot types, hooks) and then keeps one
//!   bidirectional stream: heartbeats and allocation acks up, `Allocate`/`Release` down.
//! - `SchedulerService`: clients create, watch and terminate sessions, and read nodes, the
//!   per-device allocation map and the merged slot types.
//!
//! Slot values travel as exact decimal strings so fractions stay exact end to end.
//!
//! [`convert`] maps the messages to and from the shared domain types (`gpuwarden-types`);
//! [`follow`] is how agents and clients find the leader among several controllers.

pub mod convert;
pub mod follow;

/// The `gpuwarden.v1` package.
#[allow(missing_docs, clippy::pedantic, clippy::all)]
pub mod v1 {
    tonic::include_proto!("gpuwarden.v1");

    /// Encoded file descriptors of the package, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("gpuwarden_descriptor");
}
