//! Machine-readable refusals (issue 40; docs/api.md, "Errors"), after Google's AIP-193: a
//! refusal a client may act on carries, beside its code and English message, a `google.rpc.Status`
//! in the `grpc-status-details-bin` trailer whose details hold
//!
//! - an `ErrorInfo` with a stable `reason` (in capitals, listed in docs/api.md) in the
//!   [`DOMAIN`] domain, and metadata naming what it concerns (a field, a limit's config key, a
//!   slot, a node);
//! - a `BadRequest` with one field violation per bad field (`INVALID_ARGUMENT`);
//! - a `QuotaFailure` naming the cap or rate reached (`RESOURCE_EXHAUSTED`);
//! - a `RetryInfo` when retrying after its delay can succeed (a rate limit, a store that failed);
//!   a cap reached has none: retrying will not help until sessions end;
//! - a [`pb::NotLeader`] naming the leader when a standby was called (it did nothing).
//!
//! [`Details`] builds them on the controller; [`reason`], [`retry_delay`] and [`not_leader`]
//! read them back for clients (any gRPC client can: they are the googleapis messages).

use std::time::Duration;

use prost::Message as _;
use prost_types::Any;
use tonic::{Code, Status, metadata::MetadataMap};
use tonic_types::pb as rpc;

use crate::v1 as pb;

/// The `ErrorInfo.domain` of every gpuwarden refusal.
pub const DOMAIN: &str = "gpuwarden.io";

/// The type URL of a message packed in an `Any`.
fn type_url(name: &str) -> String {
    format!("type.googleapis.com/{name}")
}

fn pack(name: &str, message: &impl prost::Message) -> Any {
    Any {
        type_url: type_url(name),
        value: message.encode_to_vec(),
    }
}

/// The details of one refusal, built up and then turned into a [`Status`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Details {
    reason: String,
    metadata: Vec<(String, String)>,
    violations: Vec<(String, String)>,
    quota: Vec<(String, String)>,
    retry: Option<Duration>,
    leader: Option<String>,
}

impl Details {
    /// A refusal for `reason` (one of docs/api.md's).
    #[must_use]
    pub fn new(reason: &str) -> Self {
        Self {
            reason: reason.to_owned(),
            ..Self::default()
        }
    }

    /// Adds `key = value` to the `ErrorInfo`'s metadata.
    #[must_use]
    pub fn meta(mut self, key: &str, value: impl Into<String>) -> Self {
        self.metadata.push((key.to_owned(), value.into()));
        self
    }

    /// Adds a `BadRequest` field violation: `field` (a path such as `gang.size`) and why.
    #[must_use]
    pub fn field(mut self, field: &str, description: impl Into<String>) -> Self {
        self.violations.push((field.to_owned(), description.into()));
        self
    }

    /// Adds a `QuotaFailure` violation: what is capped (`owner:alice/sessions`) and why.
    #[must_use]
    pub fn quota(mut self, subject: impl Into<String>, description: impl Into<String>) -> Self {
        self.quota.push((subject.into(), description.into()));
        self
    }

    /// Adds a `RetryInfo`: retrying after `delay` can succeed.
    #[must_use]
    pub fn retry_after(mut self, delay: Duration) -> Self {
        self.retry = Some(delay);
        self
    }

    /// Adds a [`pb::NotLeader`] naming `leader` (empty: none known).
    #[must_use]
    pub fn leader(mut self, leader: impl Into<String>) -> Self {
        self.leader = Some(leader.into());
        self
    }

    /// The status: `code`, `message`, and these details.
    #[must_use]
    pub fn status(self, code: Code, message: impl Into<String>) -> Status {
        self.status_with(code, message, MetadataMap::new())
    }

    /// [`Details::status`] with `metadata` (kept for clients that read it, such as the
    /// `gpuwarden-leader` hint older clients follow).
    #[must_use]
    pub fn status_with(
        self,
        code: Code,
        message: impl Into<String>,
        metadata: MetadataMap,
    ) -> Status {
        let message = message.into();
        let mut details = vec![pack(
            "google.rpc.ErrorInfo",
            &rpc::ErrorInfo {
                reason: self.reason,
                domain: DOMAIN.to_owned(),
                metadata: self.metadata.into_iter().collect(),
            },
        )];
        if !self.violations.is_empty() {
            details.push(pack(
                "google.rpc.BadRequest",
                &rpc::BadRequest {
                    field_violations: self
                        .violations
                        .into_iter()
                        .map(|(field, description)| rpc::bad_request::FieldViolation {
                            field,
                            description,
                            ..Default::default()
                        })
                        .collect(),
                },
            ));
        }
        if !self.quota.is_empty() {
            details.push(pack(
                "google.rpc.QuotaFailure",
                &rpc::QuotaFailure {
                    violations: self
                        .quota
                        .into_iter()
                        .map(|(subject, description)| rpc::quota_failure::Violation {
                            subject,
                            description,
                            ..Default::default()
                        })
                        .collect(),
                },
            ));
        }
        if let Some(delay) = self.retry {
            details.push(pack(
                "google.rpc.RetryInfo",
                &rpc::RetryInfo {
                    retry_delay: Some(prost_types::Duration {
                        seconds: i64::try_from(delay.as_secs()).unwrap_or(i64::MAX),
                        // Below a billion: fits.
                        nanos: i32::try_from(delay.subsec_nanos()).unwrap_or(0),
                    }),
                },
            ));
        }
        if let Some(leader) = self.leader {
            details.push(pack("gpuwarden.v1.NotLeader", &pb::NotLeader { leader }));
        }
        let status = rpc::Status {
            code: code as i32,
            message: message.clone(),
            details,
        };
        Status::with_details_and_metadata(code, message, status.encode_to_vec().into(), metadata)
    }
}

/// The details `status` carries (none when it has no `google.rpc.Status`).
fn details(status: &Status) -> Vec<Any> {
    rpc::Status::decode(status.details())
        .map(|s| s.details)
        .unwrap_or_default()
}

fn find<M: prost::Message + Default>(status: &Status, name: &str) -> Option<M> {
    let url = type_url(name);
    details(status)
        .into_iter()
        .find(|a| a.type_url == url)
        .and_then(|a| M::decode(a.value.as_slice()).ok())
}

/// The `ErrorInfo` reason of a gpuwarden refusal.
#[must_use]
pub fn reason(status: &Status) -> Option<String> {
    find::<rpc::ErrorInfo>(status, "google.rpc.ErrorInfo")
        .filter(|e| e.domain == DOMAIN)
        .map(|e| e.reason)
}

/// How long to wait before a retry can succeed, when the refusal says.
#[must_use]
pub fn retry_delay(status: &Status) -> Option<Duration> {
    let d = find::<rpc::RetryInfo>(status, "google.rpc.RetryInfo")?.retry_delay?;
    Some(Duration::new(
        u64::try_from(d.seconds).ok()?,
        u32::try_from(d.nanos).ok()?,
    ))
}

/// The fields a refusal's `BadRequest` blames, in order.
#[must_use]
pub fn bad_fields(status: &Status) -> Vec<String> {
    find::<rpc::BadRequest>(status, "google.rpc.BadRequest")
        .map(|b| b.field_violations.into_iter().map(|v| v.field).collect())
        .unwrap_or_default()
}

/// The standby's answer: where the leader is (empty: none known yet).
#[must_use]
pub fn not_leader(status: &Status) -> Option<pb::NotLeader> {
    find(status, "gpuwarden.v1.NotLeader")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_built_reads_back() {
        let status = Details::new("RATE")
            .meta("caller", "alice")
            .quota("caller:alice/calls", "100 calls/s")
            .retry_after(Duration::from_millis(10))
            .status(Code::ResourceExhausted, "slow down");
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(status.message(), "slow down");
        assert_eq!(reason(&status).as_deref(), Some("RATE"));
        assert_eq!(retry_delay(&status), Some(Duration::from_millis(10)));
        assert_eq!(not_leader(&status), None);
        let standby = Details::new("NOT_LEADER")
            .leader("10.0.0.1:7070")
            .status(Code::Unavailable, "standby");
        assert_eq!(
            not_leader(&standby).map(|n| n.leader).as_deref(),
            Some("10.0.0.1:7070")
        );
        assert_eq!(retry_delay(&standby), None);
        // A bare status has none of them.
        let bare = Status::unavailable("x");
        assert_eq!((reason(&bare), retry_delay(&bare)), (None, None));
    }
}
