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

/// Entries of `MIG_INSTANCES`: seven instances on each of the 16 GPUs the programs count
/// (`maps::MAX_GPUS`).
pub const MAX_INSTANCES: u32 = 7 * 16;

pod!(MigKey, Partition);
