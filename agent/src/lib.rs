//! gpuwarden's node agent.
//!
//! The agent watches every process that talks to an NVIDIA GPU from below the workload: eBPF
//! programs (crate `gpuwarden-agent-ebpf`) keep a table of GPU file descriptors, decode the
//! driver's ioctls and count ioctls and GPU memory per cgroup. This crate loads those programs,
//! names what they count, attributes each cgroup to its container or pod, enforces the quotas
//! the controller allocates, and serves snapshots over a local socket.
//!
//! The modules follow the data path (docs/architecture.md, "The code shows the data path"):
//!
//! - [`sensor`]: the eBPF programs as one unit — loading them, probing and attaching the
//!   cheapest hooks the kernel allows, pins, the maps, GPU device nodes, and the maps' upkeep;
//! - [`attribution`]: cgroup id → container, pod, systemd unit or host, and pod names from the
//!   node's kubelet;
//! - [`enforcement`]: what an allocation asks the node to enforce (`quota`), the cgroups a
//!   target binds to (`cgroup_tree`), binding quotas into the BPF maps and device programs
//!   with their events, and the compute-share `throttle`;
//! - [`control`]: the link to the controller, what the node holds (kept in sled), and usage
//!   reports for the controller's profiles;
//! - [`export`]: the snapshot built from the maps, OTLP metrics, and `top`;
//! - [`devices`]: the GPUs, from NVML or a mock list;
//! - [`daemon`]: `gpuwarden-agent run`, tying them together; [`cli`]: its command line;
//!   [`config`] and [`lock`] (one agent per node).
//!
//! The local socket's protocol and the snapshot document are the `gpuwarden-agent-api` crate,
//! shared with every client.
#![deny(missing_docs)]

pub mod attribution;
pub mod cli;
pub mod config;
pub mod control;
pub mod daemon;
pub mod devices;
pub mod enforcement;
pub mod export;
pub mod lock;
pub mod sensor;
