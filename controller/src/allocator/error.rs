//! Why a request can't be placed on a node: one error for the allocator's state, its device
//! choice and its splitting of shares, below all three.

use super::GpuRequestError;
use crate::slots::SlotValue;

/// Why a request can't be placed on a node: it is malformed, or it doesn't fit there now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// The request itself is malformed.
    #[error(transparent)]
    Request(#[from] GpuRequestError),
    /// The request, or each of its parts over the devices it needs, is below one quantum.
    #[error(
        "cuda.shares={requested} rounds to zero on each of {devices} device(s) in quanta of {quantum}"
    )]
    PartRoundsToZero {
        /// Asked.
        requested: SlotValue,
        /// Devices it would take.
        devices: usize,
        /// The quantum.
        quantum: SlotValue,
    },
    /// Fewer idle devices than whole devices asked.
    #[error("cuda.device={requested}: {idle} of the node's {devices} devices are idle")]
    NotEnoughIdleDevices {
        /// Devices asked.
        requested: u32,
        /// Idle devices.
        idle: usize,
        /// All devices.
        devices: usize,
    },
    /// Fewer idle instances of a MIG profile than asked.
    #[error("{profile}={requested}: {idle} of the node's instances of that profile are idle")]
    NotEnoughInstances {
        /// The profile slot.
        profile: String,
        /// Instances asked.
        requested: u32,
        /// Idle instances of it.
        idle: usize,
    },
    /// Whole devices are idle, but their memory is less than asked.
    #[error(
        "cuda.mem={memory_bytes} exceeds the {available} bytes of {devices} idle whole device(s)"
    )]
    WholeDevicesLackMemory {
        /// Memory asked.
        memory_bytes: u64,
        /// Devices asked.
        devices: u32,
        /// Their memory.
        available: u64,
    },
    /// No device has the memory free.
    #[error("cuda.mem={memory_bytes} fits on no device (the most free on one is {largest_free})")]
    NoDeviceWithMemory {
        /// Memory asked.
        memory_bytes: u64,
        /// The most free memory on one shareable device.
        largest_free: u64,
    },
    /// Not enough free shares (or memory beside them) on any set of devices.
    #[error(
        "cuda.shares={shares} with cuda.mem={memory_bytes} fits on no set of the node's {devices} \
         devices ({free} shares free, at most {largest} on one)"
    )]
    NoRoom {
        /// Shares asked.
        shares: SlotValue,
        /// Memory asked.
        memory_bytes: u64,
        /// Free shares on the node.
        free: SlotValue,
        /// Free shares on the emptiest device.
        largest: SlotValue,
        /// Devices on the node.
        devices: usize,
    },
    /// The session already holds an allocation here.
    #[error("session {session:?} already holds an allocation on this node")]
    AlreadyAllocated {
        /// The session.
        session: String,
    },
}
