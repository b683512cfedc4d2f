//! The snapshot document: what `gpuwarden-agent snapshot --json` prints.
//!
//! Key names are part of the interface; add keys, never rename them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::hooks::{Hook, probe::Candidate};

/// Everything the agent knows about GPU use on its node at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The node's name.
    pub node: String,
    /// The hook tier in use.
    pub tier: Option<String>,
    /// Attached programs.
    pub hooks: Vec<Hook>,
    /// Every tier the probe considered, with why it was or wasn't used.
    pub probes: Vec<Candidate>,
    /// One entry per cgroup with GPU activity, sorted by cgroup path.
    pub containers: Vec<Container>,
    /// The agent's own health.
    pub stats: Stats,
}

/// GPU activity of one cgroup (a container, a pod, a systemd unit or the host).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    /// Container id; `null` for host processes and unknown layouts.
    pub container_id: Option<String>,
    /// Container runtime (`docker`, `containerd`, `cri`, `cri-o`, `podman`, `systemd`, `host`,
    /// `unknown`).
    pub runtime: String,
    /// Kubernetes pod UID.
    pub pod_uid: Option<String>,
    /// Kubernetes QoS class.
    pub qos: Option<String>,
    /// cgroup v2 path (relative to the cgroup root).
    pub cgroup_path: String,
    /// cgroup v2 id (the directory's inode).
    pub cgroup_id: u64,
    /// Processes holding GPU fds, sorted.
    pub pids: Vec<u32>,
    /// Per device node or GPU, sorted by name.
    pub devices: Vec<DeviceUsage>,
}

/// One device's counters for a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceUsage {
    /// Device name (`nvidia0`, `nvidiactl`, `nvidia-uvm`, …).
    pub device: String,
    /// ioctl counts by class (`rm_alloc`, `rm_free`, `uvm_initialize`, …).
    pub ioctls: BTreeMap<String, u64>,
    /// GPU memory the container holds on this GPU, as the driver allocated it.
    pub memory_bytes: u64,
}

/// The agent's own counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Events the kernel dropped because the ring buffer was full.
    pub ringbuf_drops: u64,
    /// GPU fds not tracked because the fd table was full.
    pub fd_table_full: u64,
    /// Allocations not tracked because the handle table was full.
    pub handle_table_full: u64,
    /// Processes not tracked because the process table was full.
    pub proc_table_full: u64,
    /// ioctls whose parameters could not be decoded.
    pub decode_errors: u64,
    /// ioctls seen on GPU fds.
    pub gpu_ioctls: u64,
    /// Events received from the kernel.
    pub events_received: u64,
    /// Entries in the GPU fd table.
    pub tracked_fds: u64,
    /// Entries in the process table.
    pub tracked_processes: u64,
    /// Entries in the allocation table.
    pub tracked_allocations: u64,
}
