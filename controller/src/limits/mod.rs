//! Bounds on what clients and agents may send, in one place.
//!
//! [`Limits`] holds every bound with its default; the controller's config file overrides any of
//! them in a `[limits]` table (keys as the field names). [`Bounds`] is what a server's parts
//! share at run time: the limits, the open Watch streams per caller, a token bucket ([`Bucket`])
//! per client, and the counters of what was refused ([`Refusals`]) and of who was refused for
//! identity ([`Denials`]). The app makes one and hands it to the gRPC services (with their
//! identity checks and client authorizer), the connection caps and TLS listener, the webhook and
//! extender, and the metrics.
//!
//! Refusals follow one rule: a malformed or oversized value is `INVALID_ARGUMENT` naming the
//! field and the limit's key; a cap or a rate is `RESOURCE_EXHAUSTED` naming the limit's key.
//! Each refusal is counted by a bounded reason ([`Refusal`]) in the bounds that refused it
//! ([`Bounds::refuse`]). Values are checked *before* they are parsed further, so an error
//! message never echoes a megabyte back.

mod bounds;
mod bucket;
mod config;
pub mod denials;
mod error;
mod refusals;
#[cfg(test)]
mod tests;
mod validate;

pub use bounds::{Bounds, WatchGuard};
pub use bucket::Bucket;
pub use config::Limits;
pub use denials::{DenialReason, Denials};
pub use error::LimitError;
pub use refusals::{Refusal, Refusals};
