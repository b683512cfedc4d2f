//! gpuwarden's node agent.
//!
//! The agent watches every process that talks to an NVIDIA GPU from below the workload: eBPF
//! programs (crate `gpuwarden-agent-ebpf`) keep a table of GPU file descriptors, decode the
//! driver's ioctls and count ioctls and GPU memory per cgroup. This crate loads those programs,
//! names what they count, attributes each cgroup to its container or pod, enforces the quotas
//! the controller allocates, and serves snapshots over a local socket.
//!
//! The folders follow the data path, kernel → agent → controller → client (docs/architecture.md,
//! "The code shows the data path"):
//!
//! - `sensor`: loading the programs, probing and attaching the cheapest hooks the kernel
//!   allows, the GPU device nodes, the maps and their upkeep, the ring buffer of events;
//! - [`attribution`]: cgroup id → container, pod, systemd unit or host; pod UID → name and
//!   namespace, from the node's kubelet;
//! - [`enforcement`]: quotas bound to their cgroups in the BPF maps and device programs, behind
//!   narrow traits to the kernel; the compute-share throttle;
//! - [`control`]: the controller link, the allocations held in sled, usage reports;
//! - [`export`]: telemetry (the sensor's maps and attribution, a task behind a handle), the
//!   snapshot, the local socket, OTLP metrics and `top`;
//!
//! and beside them [`dra`] (the agent as a Kubernetes DRA driver: ResourceSlices, and claims
//! prepared into the same quotas), [`devices`] (the GPU inventory: NVML or mock), [`config`], [`cli`], `lock`
//! and [`daemon`] (`gpuwarden-agent run`, tying the stages together). The socket protocol and
//! the snapshot document are in crate `gpuwarden-agent-api`, re-exported as [`api`].
#![deny(missing_docs)]

pub mod attribution;
#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod control;
pub mod daemon;
pub mod devices;
pub mod dra;
pub mod enforcement;
pub mod export;
pub(crate) mod lock;
pub(crate) mod sensor;

/// The local socket protocol and the snapshot document (crate `gpuwarden-agent-api`).
pub use gpuwarden_agent_api as api;
