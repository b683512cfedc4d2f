//! MIG instances as the programs see them (docs/mig.md): which device index a GPU instance
//! is counted as, and which instance each RM client subscribed to.

use crate::pod;

/// A GPU instance of a GPU: the key of `MIG_INSTANCES`, written by the agent.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash, PartialOrd, Ord)]
pub struct MigKey {
    /// The parent GPU's index (its `/dev/nvidia<N>` minor).
    pub gpu: u32,
    /// The GPU instance id (the partition's `swizzId`).
    pub gpu_instance: u32,
}

/// A client's subscription to a GPU instance: the value of `CLIENT_PARTITIONS`, by client.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Partition {
    /// The device index the instance is counted as.
    pub instance: u32,
    /// The device object (of the client) whose subdevice subscribed: video memory under that
    /// device is the instance's.
    pub device_handle: u32,
    /// The client's generation when it subscribed (`ClientInfo::generation`, 0 when the client
    /// was not tracked): a later client reusing the handle is not subscribed.
    pub client_generation: u64,
}

/// A capability node a bound cgroup may open: the key of `CAP_ACCESS`, written by the agent
/// for each quota on a MIG instance (its GPU and compute instance's `nvidia-cap<minor>`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash, PartialOrd, Ord)]
pub struct CapKey {
    /// The quota's key (its bound cgroup's id).
    pub quota: u64,
    /// The capability node's minor.
    pub minor: u32,
    /// Padding (zero).
    pub _pad: u32,
}

/// Entries of `CAP_ACCESS`: two capability nodes for each of the quotas a node holds.
pub const MAX_CAP_GRANTS: u32 = 2 * crate::maps::MAX_QUOTAS;

/// Entries of `MIG_INSTANCES`: seven instances on each of the 16 GPUs the programs count
/// (`maps::MAX_GPUS`).
pub const MAX_INSTANCES: u32 = 7 * 16;

pod!(MigKey, Partition, CapKey);
