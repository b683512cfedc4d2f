//! Kubernetes: plain pod specs turned into DRA claims, and the controller's placement score in
//! kube-scheduler (docs/architecture.md, "Kubernetes asks through DRA; the agent enforces").
//!
//! - [`pod`]: what a pod asks (`gpuwarden.io/gpu-milli` or `gpu-shares`,
//!   `gpuwarden.io/gpu-memory`), checked, the `ResourceClaimTemplate` asking the same in the
//!   slice's whole units, and the pod's workload class;
//! - [`admission`]: the mutating admission webhook (`AdmissionReview` v1 → `JSONPatch`);
//! - [`apiserver`]: the small API-server client that makes claim templates (a trait, so tests
//!   and other deployments put their own behind it);
//! - [`templates`]: what the webhook remembers of the templates it made, and the rate it makes
//!   new ones at;
//! - [`extender`]: the scheduler extender's `filter` and `prioritize`, scored like sessions;
//! - [`serve`]: the HTTPS listener (webhook and extender) and the plain-HTTP extender listener.
//!
//! The agent is the DRA driver (it publishes the GPUs and enforces claims); nothing here talks
//! to it.

pub mod admission;
pub mod apiserver;
pub mod extender;
pub mod pod;
pub mod serve;
pub mod templates;
