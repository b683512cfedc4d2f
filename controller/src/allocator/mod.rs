//! The fractional GPU allocator of one node (docs/architecture.md, "Fractional allocation").
//!
//! A request for `cuda.shares` goes to one device that fits — the fullest that fits when
//! packing ([`Strategy::Binpack`]), the emptiest when spreading ([`Strategy::Spread`]). When no
//! single device fits, it is split over the fewest devices that can hold it, in near-even parts
//! of whole quanta that add up to exactly what was asked: 1.2 shares on two devices is
//! 0.6 + 0.6, and 1.75 is 0.88 + 0.87 with the default quantum of 0.01 (never 0.75 + 0.75,
//! which would hand the user less). A split prefers devices on one NUMA node; among sets of
//! the same size a packing split takes the fullest devices that hold their parts, a spreading
//! split the emptiest.
//!
//! Shares must be a whole number of quanta: a request below one quantum, or whose parts would
//! round below one quantum on the devices it needs, is refused with the reason, and so is a
//! request that isn't a multiple of the quantum — rounding it would hand out less, or more,
//! than was asked.
//!
//! `cuda.device` asks for whole devices, held alone: nothing else lands on them, and they are
//! given only when idle. Together with `cuda.shares` it is an error.
//!
//! `cuda.mem` is split in proportion to the shares (the rounding remainder goes to the largest
//! part) and each part is checked against its device's free memory; with `cuda.device` it must
//! fit in the whole devices' memory; alone it reserves memory, and no shares, on one device.
//!
//! A device's share capacity is 1.0, or with `unit_mem`/`unit_proc` configured,
//! `min(memory / unit_mem, SMs / unit_proc)` rounded down to the quantum, as Backend.AI computes
//! it (with one of the two configured, that one alone).
//!
//! Allocation is all or nothing, and release is idempotent. [`NodeAllocator::can_fit`]
//! answers exactly what [`NodeAllocator::allocate`] would for a new session, with either
//! strategy, and is cheap: it allocates nothing, answers most requests from running totals, and
//! otherwise reads one small array of free capacity kept sorted by the allocator: at worst
//! O(devices²) steps for a split.
//!
//! # Example
//!
//! Backend.AI's documented case: two devices, a 0.2 session, then a 1.2 session.
//!
//! ```
//! use gpuwarden_controller::allocator::{
//!     AllocatorConfig, DeviceSpec, GpuRequest, NodeAllocator, Strategy,
//! };
//!
//! let gpu = |index| DeviceSpec {
//!     uuid: format!("GPU-{index}"),
//!     index,
//!     memory_bytes: 16 << 30,
//!     sm_count: 132,
//!     numa_node: 0,
//!     parent_uuid: String::new(),
//! };
//! let mut node = NodeAllocator::new(vec![gpu(0), gpu(1)], AllocatorConfig::default());
//! node.allocate("s1", &GpuRequest::shares("0.2".parse()?), Strategy::Binpack)?;
//! let split = node.allocate("s2", &GpuRequest::shares("1.2".parse()?), Strategy::Binpack)?;
//! let parts: Vec<String> = split.parts.iter().map(|p| p.shares.to_string()).collect();
//! assert_eq!(parts, ["0.6", "0.6"]);
//! let map: Vec<String> = node.alloc_map().iter().map(|d| d.shares.to_string()).collect();
//! assert_eq!(map, ["0.8", "0.6"]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The parts: [`GpuRequest`] reads and checks the GPU part of a request ([`GpuRequestError`]
//! when it is malformed); the split arithmetic ([`split()`], [`share_capacity`]); the choice of
//! devices; and the node's state ([`NodeAllocator`], [`AllocError`] when a request doesn't fit).

mod choose;
mod error;
pub mod mig;
mod request;
mod split;
mod state;

use serde::{Deserialize, Serialize};

pub use error::AllocError;
pub use request::{GpuRequest, GpuRequestError};
pub use split::{share_capacity, split};
pub use state::{DeviceAlloc, DeviceState, FreeSummary, NodeAllocator};

use crate::slots::{SCALE, SlotValue};

/// Settings of the allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AllocatorConfig {
    /// Shares are handed out in whole multiples of this (default 0.01; zero means the finest,
    /// one micro-unit).
    pub quantum: SlotValue,
    /// Bytes of device memory per share: a device's capacity is at most memory / `unit_mem`.
    pub unit_mem: Option<u64>,
    /// SMs per share: a device's capacity is at most SMs / `unit_proc`.
    pub unit_proc: Option<u32>,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        Self {
            quantum: SlotValue::from_micros(SCALE / 100),
            unit_mem: None,
            unit_proc: None,
        }
    }
}

impl AllocatorConfig {
    /// The quantum in force: [`Self::quantum`], or one micro-unit when that is zero.
    #[must_use]
    pub fn effective_quantum(&self) -> SlotValue {
        if self.quantum.is_zero() {
            SlotValue::from_micros(1)
        } else {
            self.quantum
        }
    }
}

/// Where a request goes when several devices fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// The fullest devices that fit: keeps whole devices free.
    #[default]
    Binpack,
    /// The emptiest devices: keeps tenants apart.
    Spread,
}

impl Strategy {
    const fn other(self) -> Self {
        match self {
            Self::Binpack => Self::Spread,
            Self::Spread => Self::Binpack,
        }
    }
}

/// A device as its agent reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSpec {
    /// Device UUID.
    pub uuid: String,
    /// Index on the node (unique on the node).
    pub index: u32,
    /// Memory in bytes.
    pub memory_bytes: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// NUMA node (-1 when unknown).
    pub numa_node: i32,
    /// For a MIG instance, the UUID of its GPU; empty for a whole GPU (stores from before
    /// issue 37 read as empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub parent_uuid: String,
}

/// One device's part of an allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicePart {
    /// Device index on the node.
    pub index: u32,
    /// Device UUID.
    pub uuid: String,
    /// Shares of the device.
    pub shares: SlotValue,
    /// GPU memory reserved on it.
    pub memory_bytes: u64,
    /// Held whole and alone (`cuda.device`).
    pub exclusive: bool,
}

/// What a session holds on a node: one part per device, by device index.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// One part per device.
    pub parts: Vec<DevicePart>,
}

impl Allocation {
    /// The shares of all parts.
    #[must_use]
    pub fn shares(&self) -> SlotValue {
        self.parts
            .iter()
            .fold(SlotValue::ZERO, |a, p| a.saturating_add(p.shares))
    }

    /// The GPU memory of all parts.
    #[must_use]
    pub fn memory_bytes(&self) -> u64 {
        self.parts
            .iter()
            .fold(0, |a: u64, p| a.saturating_add(p.memory_bytes))
    }

    /// Whether it holds no device.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }
}

#[cfg(test)]
mod tests;
