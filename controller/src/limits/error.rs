//! [`LimitError`]: why a value or a request is refused, the reason it is counted under, and the
//! gRPC status a caller gets (`INVALID_ARGUMENT` for a value, `RESOURCE_EXHAUSTED` for a cap or a
//! rate). It is counted where it is answered, by the bounds that refused it
//! ([`super::Bounds::refuse`]).

use std::time::Duration;

use gpuwarden_proto::details::Details;
use tonic::{Code, Status};

use super::refusals::Refusal;

/// Why a value or a request is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LimitError {
    /// A string longer than its limit.
    #[error("{field}: {len} bytes, more than the limit of {max} (limits.{key})")]
    TooLong {
        /// The field.
        field: String,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
        /// The limit's config key.
        key: &'static str,
    },
    /// A list or map with more entries than its limit.
    #[error("{field}: {count} entries, more than the limit of {max} (limits.{key})")]
    TooMany {
        /// The field.
        field: String,
        /// How many.
        count: usize,
        /// The limit.
        max: usize,
        /// The limit's config key.
        key: &'static str,
    },
    /// A number above its limit.
    #[error("{field}: {value}, more than the limit of {max} (limits.{key})")]
    TooLarge {
        /// The field.
        field: String,
        /// The value.
        value: u64,
        /// The limit.
        max: u64,
        /// The limit's config key.
        key: &'static str,
    },
    /// A float that is NaN, infinite or negative.
    #[error("{field}: {value} is not a finite, non-negative number")]
    NotFinite {
        /// The field.
        field: String,
        /// The value.
        value: f64,
    },
    /// A cap on how many of something exist at once.
    #[error("{what}: the limit of {max} is reached (limits.{key})")]
    Exhausted {
        /// What is capped, and for whom.
        what: String,
        /// The cap.
        max: usize,
        /// The limit's config key.
        key: &'static str,
    },
    /// An agent stream sent faster than its rate.
    #[error(
        "agent stream of {node:?}: more than {rate} messages/s with bursts of {burst} (limits.agent_messages_per_sec, limits.agent_message_burst); closed"
    )]
    Flood {
        /// The node.
        node: String,
        /// The sustained rate.
        rate: u32,
        /// The burst.
        burst: u32,
    },
    /// A client called faster than its rate.
    #[error(
        "client {caller:?}: more than {rate} calls/s with bursts of {burst} (limits.client_requests_per_sec, limits.client_request_burst); retry later"
    )]
    Rate {
        /// Who called.
        caller: String,
        /// The sustained rate.
        rate: u32,
        /// The burst.
        burst: u32,
    },
}

impl LimitError {
    /// The bounded reason it is counted under.
    #[must_use]
    pub fn reason(&self) -> Refusal {
        match self {
            Self::TooLong { .. } | Self::TooMany { .. } | Self::TooLarge { .. } => {
                Refusal::Oversized
            }
            Self::NotFinite { .. } => Refusal::OutOfRange,
            Self::Exhausted { .. } => Refusal::Cap,
            Self::Flood { .. } => Refusal::Flood,
            Self::Rate { .. } => Refusal::Rate,
        }
    }

    /// The gRPC status a caller gets: `INVALID_ARGUMENT` for a value, `RESOURCE_EXHAUSTED` for
    /// a cap or a rate, with details (docs/api.md, "Errors"): an `ErrorInfo` whose reason is the
    /// [`Refusal`] it is counted under in capitals (`OVERSIZED`, `CAP`, `RATE` ...), the field
    /// as a `BadRequest` violation, a cap or rate as a `QuotaFailure`, and a `RetryInfo` for a
    /// rate only: a cap reached stays reached until sessions end.
    #[must_use]
    pub fn to_status(&self) -> Status {
        let message = self.to_string();
        let details = Details::new(&self.reason().as_str().to_ascii_uppercase());
        match self {
            Self::TooLong { field, key, .. }
            | Self::TooMany { field, key, .. }
            | Self::TooLarge { field, key, .. } => details
                .meta("field", field.as_str())
                .meta("limit", format!("limits.{key}"))
                .field(field, &message)
                .status(Code::InvalidArgument, message),
            Self::NotFinite { field, .. } => details
                .meta("field", field.as_str())
                .field(field, &message)
                .status(Code::InvalidArgument, message),
            Self::Exhausted { what, key, .. } => details
                .meta("limit", format!("limits.{key}"))
                .quota(what.as_str(), &message)
                .status(Code::ResourceExhausted, message),
            Self::Flood { node, .. } => details
                .meta("node", node.as_str())
                .quota(format!("node:{node}/messages"), &message)
                .status(Code::ResourceExhausted, message),
            Self::Rate { caller, rate, .. } => details
                .meta("caller", caller.as_str())
                .quota(format!("caller:{caller}/calls"), &message)
                // One call's worth of the rate: the bucket holds a call again by then.
                .retry_after(Duration::from_nanos(
                    1_000_000_000 / u64::from((*rate).max(1)),
                ))
                .status(Code::ResourceExhausted, message),
        }
    }
}
