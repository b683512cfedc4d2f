//! Nodes: what an agent reported, and what is handed out on it.

use serde::{Deserialize, Serialize};

pub use gpuwarden_types::state::NodeState;

use crate::{
    allocator::{DeviceSpec, NodeAllocator},
    slots::{ResourceSlot, SlotKind, SlotName, names},
};

/// What an agent says about its node when it registers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    /// Node id.
    pub node_id: String,
    /// Host name.
    pub hostname: String,
    /// Slot types its device plugins declare.
    pub slot_types: Vec<(SlotName, SlotKind)>,
    /// Non-GPU capacity (cpu, mem, other accelerators); GPU slots come from `devices`.
    pub capacity: ResourceSlot,
    /// GPUs.
    pub devices: Vec<DeviceSpec>,
    /// Device models and MIG flags, by index (for display).
    pub device_models: Vec<(String, bool)>,
    /// eBPF hooks in use.
    pub hooks: Vec<String>,
    /// Agent version.
    pub agent_version: String,
    /// GPUs the node offers to Kubernetes (DRA), not to the controller.
    #[serde(default)]
    pub kubernetes_devices: Vec<DeviceSpec>,
    /// Their models and MIG flags, in the same order (for display).
    #[serde(default)]
    pub kubernetes_device_models: Vec<(String, bool)>,
    /// The GPUs whose MIG layout the operator lets gpuwarden change, as the agent last reported
    /// them (issue 37 §3): where an instance may still be made.
    #[serde(default)]
    pub mig_layouts: Vec<crate::allocator::mig::MigGpuLayout>,
}

impl NodeReport {
    /// A node with the usual slot types (cpu, mem and the GPU slots), no other capacity, and
    /// `gpus` GPUs named `<id>-GPU-<index>`, each with `memory_bytes` and 132 SMs,
    /// `gpus_per_numa` of them to a NUMA node: the node that simulations, benchmarks and tests
    /// register. Set `capacity` for cpu and mem.
    #[must_use]
    pub fn with_gpus(id: &str, gpus: u32, memory_bytes: u64, gpus_per_numa: u32) -> Self {
        let slot_types = [
            (names::CPU, SlotKind::Count),
            (names::MEM, SlotKind::Bytes),
            (names::CUDA_SHARES, SlotKind::Count),
            (names::CUDA_DEVICE, SlotKind::Count),
            (names::CUDA_MEM, SlotKind::Bytes),
        ]
        .iter()
        .filter_map(|(n, k)| SlotName::new(n).ok().map(|n| (n, *k)))
        .collect();
        Self {
            node_id: id.to_owned(),
            hostname: id.to_owned(),
            slot_types,
            capacity: ResourceSlot::new(),
            devices: (0..gpus)
                .map(|i| DeviceSpec {
                    uuid: format!("{id}-GPU-{i}"),
                    index: i,
                    memory_bytes,
                    sm_count: 132,
                    numa_node: i32::try_from(i / gpus_per_numa.max(1)).unwrap_or(0),
                    parent_uuid: String::new(),
                })
                .collect(),
            device_models: vec![],
            hooks: vec![],
            agent_version: String::new(),
            kubernetes_devices: vec![],
            kubernetes_device_models: vec![],
            mig_layouts: vec![],
        }
    }
}

/// The MIG profile slot (`cuda.mig.1g.18gb`) of each device of `report` that is an instance,
/// by device index: read from the model its agent reports (`… MIG 1g.18gb`, as NVML names
/// instances).
#[must_use]
pub fn mig_profiles(report: &NodeReport) -> std::collections::BTreeMap<u32, String> {
    report
        .devices
        .iter()
        .zip(&report.device_models)
        .filter(|(_, (_, is_mig))| *is_mig)
        .filter_map(|(d, (model, _))| {
            let profile = names::mig_profile_in_model(model)?;
            Some((d.index, names::mig_slot(profile)))
        })
        .collect()
}

/// A node in the controller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// What its agent reported.
    pub report: NodeReport,
    /// State.
    pub state: NodeState,
    /// GPU allocations.
    pub allocator: NodeAllocator,
    /// Non-GPU slots handed out.
    pub allocated: ResourceSlot,
    /// Last heartbeat, ms since the epoch.
    pub last_heartbeat_ms: i64,
    /// Non-GPU slots free (capacity − allocated), kept so filtering allocates nothing.
    #[serde(default)]
    free_other: ResourceSlot,
}

impl Node {
    /// A node as its agent reported it, holding `allocated` of its non-GPU slots.
    #[must_use]
    pub fn new(
        report: NodeReport,
        allocator: NodeAllocator,
        allocated: ResourceSlot,
        now_ms: i64,
    ) -> Self {
        let mut node = Self {
            report,
            state: NodeState::Ready,
            allocator,
            allocated,
            last_heartbeat_ms: now_ms,
            free_other: ResourceSlot::new(),
        };
        node.refresh();
        node
    }

    /// Recomputes derived totals (after deserializing).
    pub fn refresh(&mut self) {
        self.free_other = self.report.capacity.saturating_sub(&self.allocated);
        self.allocator.refresh();
    }

    /// Hands out the non-GPU part of `request`.
    pub fn reserve(&mut self, request: &ResourceSlot) {
        let part = Self::non_gpu(request);
        self.allocated = self
            .allocated
            .checked_add(&part)
            .unwrap_or_else(|| self.allocated.clone());
        self.free_other = self.report.capacity.saturating_sub(&self.allocated);
    }

    /// Takes back the non-GPU part of `request`.
    pub fn unreserve(&mut self, request: &ResourceSlot) {
        self.allocated = self.allocated.saturating_sub(&Self::non_gpu(request));
        self.free_other = self.report.capacity.saturating_sub(&self.allocated);
    }

    /// Full capacity: the reported slots plus the GPU slots of its devices.
    #[must_use]
    pub fn capacity(&self) -> ResourceSlot {
        self.report
            .capacity
            .checked_add(&self.allocator.capacity())
            .unwrap_or_else(|| self.report.capacity.clone())
    }

    /// Everything its sessions hold: the non-GPU slots and the GPU slots of its devices.
    #[must_use]
    pub fn holding(&self) -> ResourceSlot {
        self.allocated
            .checked_add(&self.allocator.allocated())
            .unwrap_or_else(|| self.allocated.clone())
    }

    /// Whether it has GPUs (kept for GPU work when a request asks for none).
    #[must_use]
    pub fn has_accelerators(&self) -> bool {
        !self.report.devices.is_empty()
            || self
                .report
                .capacity
                .iter()
                .any(|(k, _)| k.as_str() != names::CPU && k.as_str() != names::MEM)
    }

    /// The non-GPU part of a request.
    #[must_use]
    pub fn non_gpu(request: &ResourceSlot) -> ResourceSlot {
        request
            .iter()
            .filter(|(k, _)| !k.as_str().starts_with(names::CUDA_PREFIX))
            .map(|(k, v)| (k.clone(), v))
            .collect()
    }

    /// Whether `non_gpu` (the non-GPU part of a request) fits in what is free.
    #[must_use]
    pub fn non_gpu_fits(&self, non_gpu: &ResourceSlot) -> bool {
        non_gpu.fits_in(&self.free_other)
    }
}
