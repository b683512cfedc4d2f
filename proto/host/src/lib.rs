//! What a gpuwarden process takes from its host, written once and free of telemetry.
//!
//! Every binary (the agent, the controller, the `gpuwarden` CLI, the tests' workloads) starts
//! processes inside cgroups, finds the cgroup v2 hierarchy, reads TLS files and shares state
//! between threads. Those pieces live here, apart from the daemons' start-up
//! (`gpuwarden-runtime`: logging, the OTLP pipeline, the Prometheus endpoint), so the CLI links
//! no exporter:
//!
//! - [`cgroup`]: moving a child into a cgroup v2 between `fork` and `exec`;
//! - [`mountinfo`]: where a file system (the cgroup v2 hierarchy) is mounted;
//! - [`tls`]: PEM certificates and keys, and a client's TLS to the controller;
//! - [`sync`]: a lock that outlives a panicking holder.
#![deny(missing_docs)]

pub mod cgroup;
pub mod mountinfo;
pub mod sync;
pub mod tls;
