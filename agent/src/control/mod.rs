//! The controller's side of the node: the link that registers the node and carries allocations
//! down and events and usage up, what the node holds (kept in sled), and the usage reports the
//! controller builds its workload profiles from.
//!
//! - [`link`]: registration and the stream, reconnecting with backoff;
//! - [`holdings`]: allocations by session, persisted;
//! - [`observed`]: the GPUs offered to Kubernetes and the claims prepared on them, reported as
//!   sessions the controller observes;
//! - `usage_report`: what each session used, per interval.

pub mod holdings;
pub mod link;
pub mod observed;
pub(crate) mod usage_report;

pub use link::{LinkChannels, LinkConfig};
pub use observed::Observed;
pub use usage_report::UsageCounters;
