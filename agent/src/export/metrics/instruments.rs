//! Every instrument the agent exports, each declared once: `register` builds them from these
//! constants (the metrics pipeline builds `gpuwarden.telemetry.exports.failed`, declared with
//! it), and docs/metrics.md's "Agent metrics" table is checked against [`ALL`].

use gpuwarden_runtime::instrument::Instrument;

/// `hw.gpu.memory.limit`.
pub const HW_GPU_MEMORY_LIMIT: Instrument = Instrument {
    name: "hw.gpu.memory.limit",
    unit: "By",
    attributes: "GPU attributes",
    meaning: "memory of each GPU",
};

/// `hw.gpu.memory.usage`.
pub const HW_GPU_MEMORY_USAGE: Instrument = Instrument {
    name: "hw.gpu.memory.usage",
    unit: "By",
    attributes: "GPU attributes",
    meaning: "GPU memory held by the processes the agent sees, per GPU",
};

/// `hw.gpu.memory.utilization`.
pub const HW_GPU_MEMORY_UTILIZATION: Instrument = Instrument {
    name: "hw.gpu.memory.utilization",
    unit: "1",
    attributes: "GPU attributes",
    meaning: "fraction of the time each GPU's memory was read or written (NVML; mock devices: `memory_utilization`)",
};

/// `hw.status`.
pub const HW_STATUS: Instrument = Instrument {
    name: "hw.status",
    unit: "1",
    attributes: "GPU attributes, hw.type, hw.state",
    meaning: "1 for each GPU's state (`ok`, `degraded`: uncorrected ECC errors or an XID since start, `failed`: out of NVML's reach), 0 for the other two",
};

/// `hw.errors`.
pub const HW_ERRORS: Instrument = Instrument {
    name: "hw.errors",
    unit: "{error}",
    attributes: "GPU attributes, hw.type, error.type",
    meaning: "errors per GPU by type: `xid` (since the agent started), `ecc_corrected`, `ecc_uncorrected` (the driver's aggregate counts)",
};

/// `hw.power`.
pub const HW_POWER: Instrument = Instrument {
    name: "hw.power",
    unit: "W",
    attributes: "GPU attributes",
    meaning: "power each GPU draws now",
};

/// `hw.energy`.
pub const HW_ENERGY: Instrument = Instrument {
    name: "hw.energy",
    unit: "J",
    attributes: "GPU attributes",
    meaning: "energy each GPU used since the driver loaded",
};

/// `hw.gpu.utilization`.
pub const HW_GPU_UTILIZATION: Instrument = Instrument {
    name: "hw.gpu.utilization",
    unit: "1",
    attributes: "GPU attributes, gpuwarden.utilization.source",
    meaning: "fraction of the time each GPU was busy: NVML's GPU utilization (`nvml`); with mock devices the throttle's stand-in (`throttle_stand_in`: measured running fraction of the cgroups with a compute share of the GPU, summed, at most 1; CPU time, not a GPU figure)",
};

/// `gpuwarden.gpu.memory.driver_usage`.
pub const GPU_MEMORY_DRIVER_USAGE: Instrument = Instrument {
    name: "gpuwarden.gpu.memory.driver_usage",
    unit: "By",
    attributes: "GPU attributes",
    meaning: "memory in use on each GPU or MIG instance as its driver counts it (NVML's `used`; on an instance, that instance's), with what the agent does not see: processes from before it started, memory the driver allocates for contexts and reserves, an allocation the ioctl decoder misses; absent where the backend can't read it (mock devices)",
};

/// `gpuwarden.gpu.memory.unseen`.
pub const GPU_MEMORY_UNSEEN: Instrument = Instrument {
    name: "gpuwarden.gpu.memory.unseen",
    unit: "By",
    attributes: "GPU attributes",
    meaning: "`gpuwarden.gpu.memory.driver_usage` minus `hw.gpu.memory.usage` on each GPU or MIG instance: memory the driver counts that the kernel side did not (negative: the agent counts memory the driver no longer does); a figure, not judged: NVIDIA documents no bound on the driver's own share",
};

/// `gpuwarden.container.gpu.memory.usage`.
pub const CONTAINER_GPU_MEMORY_USAGE: Instrument = Instrument {
    name: "gpuwarden.container.gpu.memory.usage",
    unit: "By",
    attributes: "container attributes, hw.id, gpuwarden.gpu.index",
    meaning: "GPU memory a container holds on each GPU (0 for a GPU it holds a quota on and does not use)",
};

/// `gpuwarden.container.gpu.memory.limit`.
pub const CONTAINER_GPU_MEMORY_LIMIT: Instrument = Instrument {
    name: "gpuwarden.container.gpu.memory.limit",
    unit: "By",
    attributes: "container attributes, hw.id, gpuwarden.gpu.index",
    meaning: "a container's GPU-memory limit on each GPU of its quota",
};

/// `gpuwarden.container.compute.share`.
pub const CONTAINER_COMPUTE_SHARE: Instrument = Instrument {
    name: "gpuwarden.container.compute.share",
    unit: "1",
    attributes: "container attributes, hw.id, gpuwarden.gpu.index",
    meaning: "a container's compute share of each GPU of its quota",
};

/// `gpuwarden.container.compute.entitled`.
pub const CONTAINER_COMPUTE_ENTITLED: Instrument = Instrument {
    name: "gpuwarden.container.compute.entitled",
    unit: "1",
    attributes: "container attributes, gpuwarden.compute.policy",
    meaning: "a container's compute share, the largest over the GPUs of its quota (what `achieved` is measured against)",
};

/// `gpuwarden.container.compute.achieved`.
pub const CONTAINER_COMPUTE_ACHIEVED: Instrument = Instrument {
    name: "gpuwarden.container.compute.achieved",
    unit: "1",
    attributes: "container attributes, gpuwarden.compute.policy",
    meaning: "the GPU time a container with a compute share got recently, per wall second (over about one throttle period, the largest over its GPUs): the throttle's usage signal (NVML's device utilization apportioned among processes; with mock devices the cgroup's CPU time)",
};

/// `gpuwarden.container.compute.deviation`.
pub const CONTAINER_COMPUTE_DEVIATION: Instrument = Instrument {
    name: "gpuwarden.container.compute.deviation",
    unit: "{flag}",
    attributes: "container attributes, gpuwarden.compute.policy, gpuwarden.share.deviation",
    meaning: "1 while a container's smoothed achieved share has been `below_entitled` (it runs, yet gets under half its share) or `above_hard_share` (over 1.2 × its hard share + 0.05) for 5 minutes, else 0; each raised flag is also a warning in the agent's log and, for a session's container, a `share_deviation` event to the controller",
};

/// `gpuwarden.container.gpu.errors`.
pub const CONTAINER_GPU_ERRORS: Instrument = Instrument {
    name: "gpuwarden.container.gpu.errors",
    unit: "{error}",
    attributes: "container attributes, hw.id, gpuwarden.gpu.index, error.type",
    meaning: "XID errors attributed to a container (the GPU's only process when the error came was its own)",
};

/// `gpuwarden.container.ioctls`.
pub const CONTAINER_IOCTLS: Instrument = Instrument {
    name: "gpuwarden.container.ioctls",
    unit: "{ioctl}",
    attributes: "container attributes, gpuwarden.device, gpuwarden.ioctl.class",
    meaning: "GPU ioctls by device node and class",
};

/// `gpuwarden.container.enforcement.actions`.
pub const CONTAINER_ENFORCEMENT_ACTIONS: Instrument = Instrument {
    name: "gpuwarden.container.enforcement.actions",
    unit: "{action}",
    attributes: "container attributes",
    meaning: "over-limit allocations acted on",
};

/// `gpuwarden.container.enforcement.denied_opens`.
pub const CONTAINER_ENFORCEMENT_DENIED_OPENS: Instrument = Instrument {
    name: "gpuwarden.container.enforcement.denied_opens",
    unit: "{open}",
    attributes: "container attributes",
    meaning: "opens of GPU nodes refused",
};

/// `gpuwarden.container.throttled`.
pub const CONTAINER_THROTTLED: Instrument = Instrument {
    name: "gpuwarden.container.throttled",
    unit: "s",
    attributes: "container attributes",
    meaning: "time kept frozen by the compute-share throttle",
};

/// `gpuwarden.container.gpu.time`.
pub const CONTAINER_GPU_TIME: Instrument = Instrument {
    name: "gpuwarden.container.gpu.time",
    unit: "s",
    attributes: "container attributes",
    meaning: "GPU time the compute-share throttle measured for it (rate() is its achieved share)",
};

/// `gpuwarden.container.gpu.ledger`.
pub const CONTAINER_GPU_LEDGER: Instrument = Instrument {
    name: "gpuwarden.container.gpu.ledger",
    unit: "s",
    attributes: "container attributes",
    meaning: "entitled minus used GPU time in the slot mode (positive: owed to it)",
};

/// `gpuwarden.gpu.signal.period`.
pub const GPU_SIGNAL_PERIOD: Instrument = Instrument {
    name: "gpuwarden.gpu.signal.period",
    unit: "s",
    attributes: "gpuwarden.device",
    meaning: "the compute-share signal's sample period (median of the recent ones)",
};

/// `gpuwarden.gpu.signal.jitter`.
pub const GPU_SIGNAL_JITTER: Instrument = Instrument {
    name: "gpuwarden.gpu.signal.jitter",
    unit: "s",
    attributes: "gpuwarden.device",
    meaning: "how far recent sample periods strayed from the median",
};

/// `gpuwarden.gpu.signal.late_samples`.
pub const GPU_SIGNAL_LATE_SAMPLES: Instrument = Instrument {
    name: "gpuwarden.gpu.signal.late_samples",
    unit: "{sample}",
    attributes: "gpuwarden.device",
    meaning: "samples that came for time already closed",
};

/// `gpuwarden.gpu.signal.unattributed`.
pub const GPU_SIGNAL_UNATTRIBUTED: Instrument = Instrument {
    name: "gpuwarden.gpu.signal.unattributed",
    unit: "s",
    attributes: "gpuwarden.device",
    meaning: "GPU busy time that fell in no one's slot",
};

/// `gpuwarden.agent.controller.connected`.
pub const AGENT_CONTROLLER_CONNECTED: Instrument = Instrument {
    name: "gpuwarden.agent.controller.connected",
    unit: "{link}",
    attributes: "",
    meaning: "1 while the stream to the controller is up, 0 while it is down (absent when the node runs on its own)",
};

/// `gpuwarden.agent.ringbuf.drops`.
pub const AGENT_RINGBUF_DROPS: Instrument = Instrument {
    name: "gpuwarden.agent.ringbuf.drops",
    unit: "{event}",
    attributes: "",
    meaning: "kernel events dropped because the ring buffer was full",
};

/// `gpuwarden.agent.map.entries`.
pub const AGENT_MAP_ENTRIES: Instrument = Instrument {
    name: "gpuwarden.agent.map.entries",
    unit: "{entry}",
    attributes: "gpuwarden.map",
    meaning: "entries in the fd, process and allocation tables",
};

/// `gpuwarden.container.table.refused`.
pub const CONTAINER_TABLE_REFUSED: Instrument = Instrument {
    name: "gpuwarden.container.table.refused",
    unit: "{entry}",
    attributes: "container attributes, gpuwarden.map",
    meaning: "kernel-table entries refused because the container held its budget there (`fds`, `processes`, `clients`, `allocations`, `device_objects`, `managed_mappings`)",
};

/// `gpuwarden.agent.hook.tier`.
pub const AGENT_HOOK_TIER: Instrument = Instrument {
    name: "gpuwarden.agent.hook.tier",
    unit: "{tier}",
    attributes: "gpuwarden.tier, gpuwarden.memory_tier",
    meaning: "1 for the hook tier and memory-enforcement tier in use",
};

/// `gpuwarden.agent.kubelet.requests`.
pub const AGENT_KUBELET_REQUESTS: Instrument = Instrument {
    name: "gpuwarden.agent.kubelet.requests",
    unit: "{request}",
    attributes: "gpuwarden.result",
    meaning: "requests for the kubelet's pod list (pod names) by result: ok, unreachable, timeout, tls, unauthorized, forbidden, http_error, malformed, token, config",
};

/// Every instrument, in the docs' order.
pub const ALL: &[Instrument] = &[
    HW_GPU_MEMORY_LIMIT,
    HW_GPU_MEMORY_USAGE,
    HW_GPU_MEMORY_UTILIZATION,
    HW_STATUS,
    HW_ERRORS,
    HW_POWER,
    HW_ENERGY,
    HW_GPU_UTILIZATION,
    GPU_MEMORY_DRIVER_USAGE,
    GPU_MEMORY_UNSEEN,
    CONTAINER_GPU_MEMORY_USAGE,
    CONTAINER_GPU_MEMORY_LIMIT,
    CONTAINER_COMPUTE_SHARE,
    CONTAINER_COMPUTE_ENTITLED,
    CONTAINER_COMPUTE_ACHIEVED,
    CONTAINER_COMPUTE_DEVIATION,
    CONTAINER_GPU_ERRORS,
    CONTAINER_IOCTLS,
    CONTAINER_ENFORCEMENT_ACTIONS,
    CONTAINER_ENFORCEMENT_DENIED_OPENS,
    CONTAINER_THROTTLED,
    CONTAINER_GPU_TIME,
    CONTAINER_GPU_LEDGER,
    GPU_SIGNAL_PERIOD,
    GPU_SIGNAL_JITTER,
    GPU_SIGNAL_LATE_SAMPLES,
    GPU_SIGNAL_UNATTRIBUTED,
    AGENT_CONTROLLER_CONNECTED,
    AGENT_RINGBUF_DROPS,
    AGENT_MAP_ENTRIES,
    CONTAINER_TABLE_REFUSED,
    AGENT_HOOK_TIER,
    AGENT_KUBELET_REQUESTS,
    gpuwarden_runtime::otlp::EXPORTS_FAILED,
];
