//! Enforcement: what an allocation asks the node to enforce, bound to the workload's cgroups
//! and kept in step with the kernel side (docs/architecture.md, "Enforcement tiers").
//!
//! - [`quota`]: an allocation's quota, validated;
//! - `cgroup_tree`: a quota's target → its cgroup and every cgroup below it;
//! - [`confinement`]: what a quota may bind to, whoever asked (never the root, a system cgroup,
//!   the agent's own, one another session binds; a user's pod only in its granted namespaces);
//! - `enforcer`: binding quotas into the BPF maps and device programs, and their events;
//!   `task`: the enforcer as a task behind a handle;
//! - `kernel`: the narrow traits the enforcer talks to (quota maps, device access, signals,
//!   the driver's own limit); [`dmem`]: that limit through the kernel's `dmem` controller;
//! - [`throttle`]: compute share, by freezing and thawing cgroups in short periods;
//! - `suspend`: a preempted workload's GPU memory to host memory and back (issue 38).

pub(crate) mod cgroup_tree;
pub mod confinement;
pub mod dmem;
pub(crate) mod enforcer;
#[cfg(test)]
pub(crate) mod fake;
pub(crate) mod kernel;
pub mod quota;
pub mod suspend;
pub(crate) mod task;
pub mod throttle;

pub use cgroup_tree::{BindError, MANAGED_PARENT};
pub use enforcer::Record;
pub(crate) use enforcer::{BindState, BindingReport, Enforcer, Standing};
pub use suspend::{PreemptionMode, SuspendConfig};
pub(crate) use task::EnforcerHandle;
pub use task::QuotaCommand;
