//! gpuwarden's cluster controller.
//!
//! Agents report their nodes' devices and slot types; the controller merges the slot types of
//! all of them, places sessions onto whole or fractional GPUs, and tells each agent what it
//! holds. The parts, in the order data flows through them:
//!
//! - [`slots`]: the resource slots of `gpuwarden-types` (exact quantities, the parser, the merged
//!   slot-type registry), under the controller's name;
//! - [`allocator`]: the fractional GPU allocator of one node;
//! - [`node`] and [`session`]: what the controller knows of agents and requests, with the
//!   workload each session's quota binds to, its quota policy and the enforcement events its
//!   node reported;
//! - [`scheduler`]: the queue, predicates, filter, score and bind;
//! - [`profile`], [`colocation`] and [`placement`]: workload profiles learned from what agents
//!   measured, the model that predicts how co-located tenants slow each other, and the
//!   placement modes and scores built on it (`binpack`, `spread`, `interference-aware`).
//!
//! - [`store`]: the store that makes every acknowledged change durable: sled embedded on one
//!   machine, or etcd shared by several controllers, each write fenced on its leadership;
//! - [`controller`]: the core both gRPC services, the election and the Kubernetes side share
//!   (the scheduler and the store behind one lock, the session log watchers read, the role);
//! - [`api`]: the gRPC services for clients and agents, and the gate that turns a standby's
//!   calls away;
//! - [`limits`]: the bounds on what clients and agents may send (sizes, caps, rates);
//! - [`auth`]: who may speak to the controller: mutual TLS with agents, the node identity in
//!   their certificates, clients by certificate or token, grants, and minting certificates;
//! - [`screen`]: the tower layer both gates are built on;
//! - [`metrics`]: the controller's OTLP metrics;
//! - [`kubernetes`]: the admission webhook that turns plain pod limits into DRA claims, and the
//!   scheduler extender that scores nodes for pods as sessions are scored;
//! - [`server`]: the `gpuwarden-controller` binary: its configuration, the app that starts and
//!   joins every task, leader election and the commands (its `main` is here, so test binaries
//!   can wrap it).
//!
//! The `gpuwarden` CLI (`gpuwarden-cli`) and the simulator (`gpuwarden-sim`) are crates of their
//! own on top of this one.
#![deny(missing_docs)]

pub mod allocator;
pub mod api;
pub mod auth;
pub mod colocation;
pub mod convert;
pub mod explanation;
pub mod hub;
pub mod kubernetes;
pub mod limits;
pub mod metrics;
pub mod node;
pub mod placement;
pub mod profile;
pub mod quota;
pub mod scheduler;
pub mod screen;
pub mod server;
pub mod session;
pub mod slots;
pub mod store;
