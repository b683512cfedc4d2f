//! The snapshot document: what `gpuwarden-agent snapshot --json` prints and the socket's
//! `snapshot` request answers, with the plain data it embeds (hooks, hook tiers, enforcement
//! records, the kubelet source's status).
//!
//! Key names are part of the interface; add keys, never rename them.

use std::collections::BTreeMap;

use gpuwarden_types::event::{Action, EnforcementEvent};
use serde::{Deserialize, Serialize};

/// Everything the agent knows about GPU use on its node at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The node's name.
    pub node: String,
    /// The hook tier in use.
    pub tier: Option<String>,
    /// Attached programs.
    pub hooks: Vec<Hook>,
    /// Every tier the probe considered, with why it was or wasn't used.
    pub probes: Vec<Candidate>,
    /// One entry per cgroup with GPU activity or a quota, sorted by cgroup path.
    pub containers: Vec<Container>,
    /// The agent's own health.
    pub stats: Stats,
    /// How over-limit GPU-memory allocations are acted on (`lsm_deny`, `tracepoint_signal`).
    #[serde(default)]
    pub memory_tier: Option<String>,
    /// Why that tier.
    #[serde(default)]
    pub memory_tier_reason: Option<String>,
    /// Every quota on the node, bound or waiting, by session.
    #[serde(default)]
    pub bindings: Vec<BindingView>,
    /// Each GPU's utilization and where it was read.
    #[serde(default)]
    pub gpus: Vec<GpuView>,
    /// The kubelet pod-name source, where one is configured.
    #[serde(default)]
    pub kubelet: Option<KubeletStatus>,
    /// Which memory figures are exact and which are bounds, and why (docs/accounting.md).
    #[serde(default)]
    pub accuracy: Vec<Accuracy>,
    /// How the compute-share throttle holds shares (`slots`, `buckets`).
    #[serde(default)]
    pub throttle_mode: Option<String>,
    /// Each GPU's compute-share signal, as the throttle sees it (the slot mode).
    #[serde(default)]
    pub throttle_signals: Vec<SignalView>,
}

/// How exact one figure of the snapshot is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accuracy {
    /// The figure, by its key (`devices.memory_bytes`, `managed_memory_bytes`, …).
    pub figure: String,
    /// `exact`, or `bound` (an upper bound on what it names).
    pub accuracy: String,
    /// What it counts and where it can differ from the GPU's own view.
    pub note: String,
}

/// One GPU's (or MIG instance's) utilization, health and memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    /// `nvidiaN`.
    pub device: String,
    /// Fraction of the time the GPU was busy, `0..=1`; `null` when it can't be read.
    pub utilization: Option<f64>,
    /// Where it comes from: `nvml` (the driver's GPU utilization), or `throttle_stand_in` (mock
    /// devices: the throttle's measured running fraction of the cgroups with a compute share of
    /// the GPU, summed and clamped to 1; CPU time, which says nothing about a GPU).
    pub source: String,
    /// Its health, where the backend reads it (NVML; mock devices from their file).
    #[serde(default)]
    pub health: Option<GpuHealthView>,
    /// Video memory on it as the kernel side counts it: what the containers hold there, summed
    /// (a MIG instance: what is charged to the instance).
    #[serde(default)]
    pub memory_bytes: u64,
    /// Memory in use on it as the driver counts it (NVML's `used`; a MIG instance: that
    /// instance's), which includes what the agent does not see: processes from before it
    /// started, memory the driver allocates for a context, an allocation the decoder misses.
    /// `null` where the backend can't tell (mock devices).
    #[serde(default)]
    pub driver_memory_bytes: Option<u64>,
    /// Of that, what NVML says the driver or firmware reserves; `null` where not read.
    #[serde(default)]
    pub driver_reserved_bytes: Option<u64>,
}

impl Eq for GpuView {}

/// A GPU's health, as OpenTelemetry's hardware conventions name it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuHealthView {
    /// `ok`, `degraded` or `failed`.
    pub state: String,
    /// Power drawn now, in watts.
    pub power_watts: Option<f64>,
    /// Energy used since the driver loaded, in joules.
    pub energy_joules: Option<f64>,
    /// Fraction of the time its memory was read or written.
    pub memory_utilization: Option<f64>,
    /// Errors by type: `xid` (since the agent started), `ecc_corrected`, `ecc_uncorrected`
    /// (the driver's aggregate counts), each where known.
    pub errors: BTreeMap<String, u64>,
}

impl Eq for GpuHealthView {}

/// A session's quota and where it is enforced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingView {
    /// The session.
    pub session_id: String,
    /// The workload it names (`container …`, `pod …`, `cgroup …`, `managed cgroup`).
    pub target: String,
    /// `pending`, `bound` or `expired`.
    pub state: String,
    /// The cgroup it is bound at.
    pub cgroup_path: Option<String>,
    /// The quota.
    pub quota: QuotaView,
}

/// A quota as shown to people.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuotaView {
    /// GPU-memory limit over all its GPUs.
    pub memory_bytes: u64,
    /// Compute share over all its GPUs, in GPUs.
    pub shares: f64,
    /// Memory policy (`kill`, `stop`, `report`).
    pub policy: String,
    /// Compute policy (`hard`, `work-conserving`).
    pub compute_policy: String,
    /// Per GPU.
    pub devices: Vec<DeviceQuotaView>,
}

impl Eq for QuotaView {}

/// One GPU's part of a quota.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceQuotaView {
    /// `nvidiaN`.
    pub device: String,
    /// Limit in bytes.
    pub memory_bytes: u64,
    /// What the quota's cgroups hold there, as the kernel side counts it.
    pub used_bytes: u64,
    /// Share of the device.
    pub shares: f64,
}

/// What enforcement did to a container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnforcementView {
    /// The memory tier in use.
    pub tier: String,
    /// Over-limit allocations acted on.
    pub actions: u64,
    /// Opens of GPU nodes refused.
    pub denied_opens: u64,
    /// Time kept frozen by the compute-share throttle.
    pub throttled_ms: u64,
    /// Frozen right now.
    pub frozen: bool,
    /// The GPU time it got recently, per wall second (over about one throttle period; the
    /// largest over its GPUs): the throttle's usage signal, to compare with its share. `null`
    /// without a compute share (nothing measures it) and from older agents.
    #[serde(default)]
    pub achieved: Option<f64>,
    /// `below_entitled` or `above_hard_share` while its achieved share has stayed that far from
    /// its entitlement for the agent's window (5 minutes); `null` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deviation: Option<String>,
    /// GPU time the throttle measured for it so far, summed over its GPUs (a counter: `rate()`
    /// of it is its achieved share over any window). 0 from older agents.
    #[serde(default)]
    pub gpu_time_ms: u64,
    /// Its ledger in the slot mode: entitled minus used GPU time, the least over its GPUs
    /// (positive: time it is owed). `null` in the bucket mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger_ms: Option<i64>,
}

impl Eq for EnforcementView {}

/// How one GPU's compute-share signal has behaved (the slot mode's: the driver's samples).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalView {
    /// The GPU's device name (`nvidia0`).
    pub device: String,
    /// The usual span between two samples, µs (median of the recent ones); `null` until known.
    pub period_us: Option<u64>,
    /// How far recent spans strayed from it, µs (the largest recent deviation).
    pub jitter_us: Option<u64>,
    /// Spans closed so far.
    pub samples: u64,
    /// Samples that came for time already closed (late or duplicate).
    pub late_samples: u64,
    /// Spans of lost samples (longer than twice the period).
    pub gaps: u64,
    /// GPU busy time that fell in no one's slot, ms.
    pub unattributed_ms: u64,
    /// The slowest read of the signal (one NVML call per GPU and tick), µs.
    #[serde(default)]
    pub read_max_us: u64,
    /// The mean read of the signal, µs.
    #[serde(default)]
    pub read_mean_us: u64,
    /// The GPU keeps no utilization samples (a MIG instance): shares on it are held by time
    /// alone, and the figures above stay empty.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub time_only: bool,
}

/// GPU activity of one cgroup (a container, a pod, a systemd unit or the host).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Container {
    /// Container id; `null` for host processes and unknown layouts.
    pub container_id: Option<String>,
    /// Container runtime (`docker`, `containerd`, `cri`, `cri-o`, `podman`, `systemd`, `host`,
    /// `unknown`).
    pub runtime: String,
    /// Kubernetes pod UID.
    pub pod_uid: Option<String>,
    /// The pod's name, from the kubelet's pod list.
    #[serde(default)]
    pub pod_name: Option<String>,
    /// The pod's namespace, from the kubelet's pod list.
    #[serde(default)]
    pub pod_namespace: Option<String>,
    /// Kubernetes `QoS` class.
    pub qos: Option<String>,
    /// cgroup v2 path (relative to the cgroup root).
    pub cgroup_path: String,
    /// cgroup v2 id (the directory's inode).
    pub cgroup_id: u64,
    /// Processes holding GPU fds, sorted.
    pub pids: Vec<u32>,
    /// Per device node or GPU, sorted by name. Video memory whose GPU can't be told is under
    /// the device `unknown`.
    pub devices: Vec<DeviceUsage>,
    /// Host memory allocated for the GPUs (`NV01_MEMORY_SYSTEM`, pinned user memory): exact,
    /// and not video memory.
    #[serde(default)]
    pub system_memory_bytes: u64,
    /// Managed (UVM) memory mapped: a bound on what it can place on a GPU, not what is there.
    #[serde(default)]
    pub managed_memory_bytes: u64,
    /// The session whose quota applies here.
    #[serde(default)]
    pub session_id: Option<String>,
    /// That quota.
    #[serde(default)]
    pub quota: Option<QuotaView>,
    /// What enforcing it did.
    #[serde(default)]
    pub enforcement: Option<EnforcementView>,
    /// XID errors attributed to it (the GPU's only process was its own), by GPU device name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xid_errors: BTreeMap<String, u64>,
    /// Recent enforcement actions on it, oldest first.
    #[serde(default)]
    pub events: Vec<Record>,
    /// Its entries in each kernel table it can grow, against its budget there
    /// (docs/accounting.md, "Budgets").
    #[serde(default)]
    pub tables: Vec<TableBudget>,
}

/// A container's entries in one kernel table, its budget there, and what it was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableBudget {
    /// `fds`, `processes`, `clients`, `allocations`, `device_objects` or `managed_mappings`.
    pub table: String,
    /// Entries it holds.
    pub used: u64,
    /// The most it may hold.
    pub budget: u64,
    /// Entries refused because it held its budget.
    pub refused: u64,
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
    /// Table entries refused because their container held its budget.
    #[serde(default)]
    pub budget_refused: u64,
    /// Allocations of processes that ended while the open file of their client lived on
    /// ("orphans", docs/accounting.md "Releases"): still charged to their container.
    #[serde(default)]
    pub orphaned_allocations: u64,
    /// Whether the stream to the controller is up; `null` when the node runs on its own.
    #[serde(default)]
    pub controller_connected: Option<bool>,
    /// Usage reports sent to the controller.
    #[serde(default)]
    pub usage_reports: u64,
    /// Usage reports dropped because the controller stream's buffer was full.
    #[serde(default)]
    pub usage_reports_dropped: u64,
    /// Enforcement events a workload caused faster than its session's rate (an allocation loop
    /// over its limit under `report`): counted, and named in the next event sent, not sent one
    /// by one.
    #[serde(default)]
    pub events_suppressed: u64,
}

/// A hook as reported in snapshots and logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hook {
    /// Program name.
    pub program: String,
    /// Program type (`tracepoint`, …).
    pub kind: String,
    /// What it attaches to.
    pub target: String,
}

/// A hook tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// fentry on the NVIDIA driver's ioctl handler.
    DriverFentry,
    /// kprobe on the NVIDIA driver's ioctl handler.
    DriverKprobe,
    /// `syscalls/sys_{enter,exit}_ioctl` tracepoints filtered by the GPU fd table.
    SyscallTracepoint,
}

impl Tier {
    /// Stable name for logs and snapshots.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::DriverFentry => "driver_fentry",
            Self::DriverKprobe => "driver_kprobe",
            Self::SyscallTracepoint => "syscall_tracepoint",
        }
    }
}

/// One candidate tier and what the probe found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    /// The tier.
    pub tier: Tier,
    /// Whether the kernel offers it.
    pub available: bool,
    /// Why it was or wasn't used.
    pub reason: String,
}

/// What the pod-name source has done, for the snapshot and the metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeletStatus {
    /// The URL asked.
    pub url: String,
    /// `ok`, `pending` (no answer yet) or the last error's label.
    pub state: String,
    /// The last error's message, while in error.
    pub error: Option<String>,
    /// Pods in the last list.
    pub pods: u64,
    /// Requests by result (`ok` or an error label).
    pub requests: BTreeMap<String, u64>,
}

/// A recorded enforcement action: the domain's [`EnforcementEvent`] as the snapshot shows it,
/// with its session, the cgroup path under its own name and the GPU only when one is concerned
/// ([`Record::event`] is the event).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The session.
    pub session_id: String,
    /// What was done (`kill`, `stop`, `report`, `deny`, `device_denied`, `bound`, …).
    pub action: Action,
    /// Why.
    pub reason: String,
    /// The cgroup path acted on.
    pub cgroup_path: String,
    /// The process, when one.
    pub pid: u32,
    /// The GPU, when one.
    pub device: Option<u32>,
    /// Bytes the allocation asked for.
    pub requested_bytes: u64,
    /// Bytes the quota held.
    pub used_bytes: u64,
    /// The limit.
    pub limit_bytes: u64,
    /// Milliseconds since the epoch.
    pub at_ms: i64,
}

impl Record {
    /// The event it records (its session kept apart).
    #[must_use]
    pub fn event(&self) -> EnforcementEvent {
        EnforcementEvent {
            action: self.action.clone(),
            reason: self.reason.clone(),
            container: self.cgroup_path.clone(),
            pid: self.pid,
            device: self.device,
            requested_bytes: self.requested_bytes,
            used_bytes: self.used_bytes,
            limit_bytes: self.limit_bytes,
            at_ms: self.at_ms,
            // Told by the controller link, which knows which moves it took up after a restart.
            move_interrupted: false,
        }
    }
}
