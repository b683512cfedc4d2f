//! gpuwarden's node agent.
//!
//! The agent watches every process that talks to an NVIDIA GPU from below the workload: eBPF
//! programs (crate `gpuwarden-agent-ebpf`) keep a table of GPU file descriptors, decode the
//! driver's ioctls and count ioctls and GPU memory per cgroup. This crate loads those programs,
//! names what they count, attributes each cgroup to its container or pod, enforces the quotas
//! the controller allocates, and serves snapshots over a local socket.
//!
//! The data path, one module each:
//!
//! - [`hooks`]: loading the programs, probing and attaching the cheapest hooks the kernel allows;
//! - [`gpu_nodes`]: which paths are GPU device nodes;
//! - [`telemetry`]: reading the maps into a snapshot (`gpuwarden_agent_api::snapshot`), and
//!   their housekeeping;
//! - [`attribution`]: cgroup id → container, pod, systemd unit or host; [`kubelet`]: pod UID →
//!   name and namespace, from the node's kubelet;
//! - [`quota`]: what an allocation asks the node to enforce, validated;
//! - [`binding`]: a quota's target (container, pod, cgroup, managed) → its cgroups;
//! - [`enforcement`]: binding quotas into the BPF maps and device programs, and their events;
//! - [`throttle`]: compute share, by freezing and thawing cgroups in short periods;
//! - [`controller_link`] and [`holdings`]: allocations from the controller, kept in sled;
//! - [`usage_report`]: what each session used, reported to the controller for its profiles;
//! - [`metrics`]: the snapshot as OTLP metrics, pushed to a collector;
//! - the local socket's protocol and the snapshot document are the `gpuwarden-agent-api`
//!   crate, shared with every client;
//! - [`daemon`]: `gpuwarden-agent run`, tying them together; [`cli`]: its command line.
#![deny(missing_docs)]

pub mod attribution;
pub mod binding;
pub mod cli;
pub mod config;
pub mod controller_link;
pub mod daemon;
pub mod devices;
pub mod enforcement;
pub mod gpu_nodes;
pub mod holdings;
pub mod hooks;
pub mod kubelet;
pub mod lock;
pub mod metrics;
pub mod quota;
pub mod telemetry;
pub mod throttle;
pub mod top;
pub mod usage_report;
