//! The words gpuwarden's parts share, defined once.
//!
//! The agent enforces what the controller decided and the CLI shows both, so a quota's target,
//! its policies, the resource slots and the life of a session must mean the same thing
//! in all three. They live here, free of gRPC, eBPF and storage, so each side can depend on them;
//! the conversions to and from the wire types live beside the proto (`gpuwarden_proto::convert`).
//!
//! - [`target`]: the workload a quota binds to (container, pod, cgroup, a managed cgroup);
//! - [`policy`]: what happens over a GPU-memory limit, and how a compute share is held;
//! - [`slot`]: resource slots — names, kinds, exact values, their parser and arithmetic, limits;
//! - [`mig`]: the MIG layout of a GPU whose instances gpuwarden may make, and the H100's and
//!   H200's MIG profiles and where each may be placed;
//! - [`placement`]: how a session's node and devices are chosen;
//! - [`event`]: what an agent did to enforce a quota;
//! - [`state`]: where a session and a node are in their lives;
//! - [`quantity`]: Kubernetes resource quantities (`500m`, `8Gi`), parsed exactly;
//! - [`units`]: quantities as tables show them;
//! - [`workload`]: the workload class of a Kubernetes pod;
//! - [`dns`]: Kubernetes object names (DNS labels and subdomains), checked;
//! - [`now_ms`]: the wall clock every record is stamped with.
//!
//! # Example
//!
//! ```
//! use gpuwarden_types::{policy::QuotaPolicy, target::Target};
//!
//! let target = Target::PodUid("123e4567-e89b-12d3-a456-426614174000".into());
//! assert_eq!(target.validate(None), Ok(()));
//! let policy = QuotaPolicy::parse("stop", "")?;
//! assert_eq!(policy.compute.as_str(), "hard");
//! # Ok::<(), gpuwarden_types::policy::PolicyError>(())
//! ```
#![deny(missing_docs)]

pub mod dns;
pub mod event;
pub mod mig;
pub mod placement;
pub mod policy;
pub mod quantity;
pub mod slot;
pub mod state;
pub mod target;
pub mod units;
pub mod workload;

/// Milliseconds since the Unix epoch (0 if the clock is before it).
#[must_use]
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
