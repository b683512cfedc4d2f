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

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BTreeSet},
};

use serde::{Deserialize, Serialize};

use crate::slots::{ResourceSlot, SCALE, SlotValue, names};

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

/// The GPU part of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuRequest {
    /// Fractional shares (`cuda.shares`).
    pub shares: SlotValue,
    /// Whole exclusive devices (`cuda.device`).
    pub devices: u32,
    /// GPU memory (`cuda.mem`).
    pub memory_bytes: u64,
}

/// Why a GPU request is malformed, whatever the node: refused when a session is created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuRequestError {
    /// `cuda.device` and `cuda.shares` together.
    #[error("cuda.device and cuda.shares can't be combined in one request")]
    DeviceAndShares,
    /// A slot that takes whole numbers got a fraction.
    #[error("{slot}={value} is not a whole number")]
    NotWhole {
        /// The slot.
        slot: &'static str,
        /// The value.
        value: SlotValue,
    },
    /// A value too large for its slot.
    #[error("{slot}={value} is out of range")]
    OutOfRange {
        /// The slot.
        slot: &'static str,
        /// The value.
        value: SlotValue,
    },
    /// Shares not in whole quanta.
    #[error("cuda.shares={requested} is not a multiple of the quantum {quantum}")]
    NotMultipleOfQuantum {
        /// Asked.
        requested: SlotValue,
        /// The quantum.
        quantum: SlotValue,
    },
}

/// Why a well-formed request does not fit on a node now: the session waits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoFit {
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

/// Why the allocator refused: the request is malformed, or it does not fit here now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// Malformed whatever the node.
    #[error(transparent)]
    Request(#[from] GpuRequestError),
    /// Does not fit on this node now.
    #[error(transparent)]
    NoFit(#[from] NoFit),
}

impl GpuRequest {
    /// Fractional shares only.
    #[must_use]
    pub const fn shares(shares: SlotValue) -> Self {
        Self {
            shares,
            devices: 0,
            memory_bytes: 0,
        }
    }

    /// Whole exclusive devices only.
    #[must_use]
    pub const fn devices(devices: u32) -> Self {
        Self {
            shares: SlotValue::ZERO,
            devices,
            memory_bytes: 0,
        }
    }

    /// The same request with `memory_bytes` of GPU memory.
    #[must_use]
    pub const fn with_memory(self, memory_bytes: u64) -> Self {
        Self {
            memory_bytes,
            ..self
        }
    }

    /// The GPU slots of `slots` (`cuda.shares`, `cuda.device`, `cuda.mem`).
    ///
    /// # Errors
    /// `cuda.device` with `cuda.shares`, a fraction of a device or a byte, or values out of
    /// range.
    pub fn from_slots(slots: &ResourceSlot) -> Result<Self, GpuRequestError> {
        let shares = slots.get(names::CUDA_SHARES);
        let devices = slots.get(names::CUDA_DEVICE);
        let mem = slots.get(names::CUDA_MEM);
        if !shares.is_zero() && !devices.is_zero() {
            return Err(GpuRequestError::DeviceAndShares);
        }
        let whole = |slot: &'static str, value: SlotValue| {
            if !value.is_integer() {
                return Err(GpuRequestError::NotWhole { slot, value });
            }
            value
                .to_u64()
                .ok_or(GpuRequestError::OutOfRange { slot, value })
        };
        Ok(Self {
            shares,
            devices: u32::try_from(whole(names::CUDA_DEVICE, devices)?).map_err(|_| {
                GpuRequestError::OutOfRange {
                    slot: names::CUDA_DEVICE,
                    value: devices,
                }
            })?,
            memory_bytes: whole(names::CUDA_MEM, mem)?,
        })
    }

    /// Whether it asks for no GPU at all.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.shares.is_zero() && self.devices == 0 && self.memory_bytes == 0
    }
}

/// A device's state in the allocator: one entry of the `gpu_alloc_map`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceState {
    /// The device.
    pub spec: DeviceSpec,
    /// Shares it can hand out.
    pub capacity: SlotValue,
    /// Shares handed out.
    pub allocated: SlotValue,
    /// Memory handed out.
    pub allocated_memory: u64,
    /// Sessions holding parts of it.
    pub sessions: BTreeSet<String>,
    /// The session holding it whole and alone (`cuda.device`), if any.
    pub exclusive_owner: Option<String>,
}

impl DeviceState {
    /// Free shares (none while held exclusively).
    #[must_use]
    pub fn free(&self) -> SlotValue {
        if self.is_exclusive() {
            SlotValue::ZERO
        } else {
            self.capacity.saturating_sub(self.allocated)
        }
    }

    /// Free memory (none while held exclusively).
    #[must_use]
    pub fn free_memory(&self) -> u64 {
        if self.is_exclusive() {
            0
        } else {
            self.spec.memory_bytes.saturating_sub(self.allocated_memory)
        }
    }

    /// Whether one session holds it whole.
    #[must_use]
    pub fn is_exclusive(&self) -> bool {
        self.exclusive_owner.is_some()
    }

    /// Whether nobody holds any part of it.
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.sessions.is_empty() && !self.is_exclusive()
    }
}

/// Totals kept up to date so the scheduler can rule a node out without planning.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeSummary {
    /// Free shares over all devices.
    pub total: SlotValue,
    /// Free shares of the emptiest device.
    pub largest: SlotValue,
    /// Devices nobody holds any part of.
    pub idle: usize,
    /// Free memory over all shareable devices.
    pub memory: u64,
    /// Free memory of the shareable device with the most.
    pub largest_memory: u64,
}

/// One device's row of [`NodeAllocator::alloc_map`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceAlloc {
    /// Device index.
    pub index: u32,
    /// Device UUID.
    pub uuid: String,
    /// Share capacity.
    pub capacity: SlotValue,
    /// Shares handed out.
    pub shares: SlotValue,
    /// Device memory.
    pub memory_bytes: u64,
    /// Memory handed out.
    pub allocated_memory: u64,
    /// The session holding it whole, if any.
    pub exclusive_owner: Option<String>,
}

/// The allocator of one node's devices.
///
/// It serializes its devices, settings and allocations; the derived indexes are rebuilt when
/// it is deserialized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Persisted")]
pub struct NodeAllocator {
    config: AllocatorConfig,
    devices: Vec<DeviceState>,
    held: BTreeMap<String, Allocation>,
    /// Totals for fast refusals.
    #[serde(skip)]
    free: FreeSummary,
    /// What is free on each shareable device, by free shares ascending (ties: higher index
    /// first): one small contiguous array that placement reads instead of the devices.
    #[serde(skip)]
    order: Vec<FreeDevice>,
    /// The distinct NUMA nodes of the devices, in device order.
    #[serde(skip)]
    numa_nodes: Vec<i32>,
}

/// What is free on one device that isn't held whole, in [`NodeAllocator`]'s sorted index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FreeDevice {
    shares: SlotValue,
    memory: u64,
    pos: usize,
    index: u32,
    numa: i32,
}

/// What [`NodeAllocator`] stores.
#[derive(Deserialize)]
struct Persisted {
    config: AllocatorConfig,
    devices: Vec<DeviceState>,
    held: BTreeMap<String, Allocation>,
}

impl From<Persisted> for NodeAllocator {
    fn from(p: Persisted) -> Self {
        let mut allocator = Self {
            config: p.config,
            devices: p.devices,
            held: p.held,
            free: FreeSummary::default(),
            order: Vec::new(),
            numa_nodes: Vec::new(),
        };
        allocator.refresh();
        allocator
    }
}

/// Where a request goes, decided without side effects and without allocating.
#[derive(Debug, Clone, Copy)]
enum Choice {
    /// No GPU.
    Nothing,
    /// Everything on the device at this position.
    One(usize),
    /// Parts over devices, chosen by walking in `walk`'s order within `numa` (any when `None`).
    Split {
        parts: Parts,
        numa: Option<i32>,
        walk: Strategy,
    },
    /// The first `n` idle devices within `numa` (any when `None`).
    Whole { n: usize, numa: Option<i32> },
}

/// A split of `total` shares (and `memory` bytes) into `k` near-even parts of whole quanta,
/// numbered largest first: the first `extra` parts are one quantum larger than the rest.
#[derive(Debug, Clone, Copy)]
struct Parts {
    k: usize,
    extra: usize,
    /// The smaller and the larger part.
    small: SlotValue,
    big: SlotValue,
    memory: u64,
    /// Memory of the parts rounded down, and the remainder that goes to part 0.
    memory_small: u64,
    memory_big: u64,
    memory_rest: u64,
}

impl Parts {
    /// `None` when a part would be zero (or `total` is zero).
    fn new(total: SlotValue, k: usize, quantum: SlotValue, memory: u64) -> Option<Self> {
        let q = quantum.micros().max(1);
        let quanta = total.micros() / q;
        // Requests are far below 2^64 quanta; the rest is plain 64-bit arithmetic.
        let quanta = u64::try_from(quanta).ok()?;
        let k64 = u64::try_from(k).ok()?;
        let base = quanta.checked_div(k64)?;
        if base == 0 {
            return None;
        }
        let extra = quanta % k64;
        let small = u128::from(base) * q;
        let big = small + q;
        let (mut memory_small, mut memory_big, mut memory_rest) = (0, 0, 0);
        if memory > 0 {
            // memory × part / total ≤ memory, so it fits in u64.
            let share_of = |part: u128| -> u64 {
                u128::from(memory)
                    .checked_mul(part)
                    .and_then(|m| u64::try_from(m / total.micros()).ok())
                    .unwrap_or(0)
            };
            memory_small = share_of(small);
            memory_big = share_of(big);
            let assigned = u128::from(memory_small) * u128::from(k64 - extra)
                + u128::from(memory_big) * u128::from(extra);
            memory_rest = u64::try_from(u128::from(memory).saturating_sub(assigned)).unwrap_or(0);
        }
        Some(Self {
            k,
            // extra < k
            extra: usize::try_from(extra).ok()?,
            small: SlotValue::from_micros(small),
            big: SlotValue::from_micros(big),
            memory,
            memory_small,
            memory_big,
            memory_rest,
        })
    }

    /// Part `i` (0 is the largest).
    fn share(&self, i: usize) -> SlotValue {
        if i < self.extra { self.big } else { self.small }
    }

    /// The memory of part `i`.
    fn memory(&self, i: usize) -> u64 {
        let rounded = if i < self.extra {
            self.memory_big
        } else {
            self.memory_small
        };
        if i == 0 {
            rounded + self.memory_rest
        } else {
            rounded
        }
    }
}

impl NodeAllocator {
    /// An allocator over `devices`, all free.
    #[must_use]
    pub fn new(devices: Vec<DeviceSpec>, config: AllocatorConfig) -> Self {
        let devices = devices
            .into_iter()
            .map(|spec| DeviceState {
                capacity: share_capacity(&spec, &config),
                spec,
                allocated: SlotValue::ZERO,
                allocated_memory: 0,
                sessions: BTreeSet::new(),
                exclusive_owner: None,
            })
            .collect();
        Persisted {
            config,
            devices,
            held: BTreeMap::new(),
        }
        .into()
    }

    /// What is free, in summary.
    #[must_use]
    pub fn free(&self) -> FreeSummary {
        self.free
    }

    /// Recomputes the derived indexes. Deserializing does this already; it is kept for callers
    /// that change nothing else.
    pub fn refresh(&mut self) {
        let mut numa_nodes = Vec::new();
        for d in &self.devices {
            if !numa_nodes.contains(&d.spec.numa_node) {
                numa_nodes.push(d.spec.numa_node);
            }
        }
        self.numa_nodes = numa_nodes;
        self.reindex();
    }

    fn reindex(&mut self) {
        let mut free = FreeSummary::default();
        for d in &self.devices {
            free.total = free.total.saturating_add(d.free());
            free.largest = free.largest.max(d.free());
            free.idle += usize::from(d.is_idle());
            free.memory = free.memory.saturating_add(d.free_memory());
            free.largest_memory = free.largest_memory.max(d.free_memory());
        }
        self.free = free;
        self.order.clear();
        self.order.extend(
            self.devices
                .iter()
                .enumerate()
                .filter(|(_, d)| !d.is_exclusive())
                .map(|(pos, d)| FreeDevice {
                    shares: d.free(),
                    memory: d.free_memory(),
                    pos,
                    index: d.spec.index,
                    numa: d.spec.numa_node,
                }),
        );
        self.order.sort_by_key(|d| (d.shares, Reverse(d.index)));
    }

    /// The devices and what is handed out on each.
    #[must_use]
    pub fn devices(&self) -> &[DeviceState] {
        &self.devices
    }

    /// The `gpu_alloc_map`: per device, its capacity and the shares and memory handed out.
    #[must_use]
    pub fn alloc_map(&self) -> Vec<DeviceAlloc> {
        self.devices
            .iter()
            .map(|d| DeviceAlloc {
                index: d.spec.index,
                uuid: d.spec.uuid.clone(),
                capacity: d.capacity,
                shares: d.allocated,
                memory_bytes: d.spec.memory_bytes,
                allocated_memory: d.allocated_memory,
                exclusive_owner: d.exclusive_owner.clone(),
            })
            .collect()
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// What `session` holds here.
    #[must_use]
    pub fn allocation(&self, session: &str) -> Option<&Allocation> {
        self.held.get(session)
    }

    /// Sessions holding allocations here.
    pub fn sessions(&self) -> impl Iterator<Item = &str> {
        self.held.keys().map(String::as_str)
    }

    /// GPU capacity as slots: `cuda.shares`, `cuda.device`, `cuda.mem`.
    #[must_use]
    pub fn capacity(&self) -> ResourceSlot {
        let shares = self
            .devices
            .iter()
            .fold(SlotValue::ZERO, |a, d| a.saturating_add(d.capacity));
        let memory: u128 = self
            .devices
            .iter()
            .map(|d| u128::from(d.spec.memory_bytes))
            .sum();
        ResourceSlot::new()
            .with(names::CUDA_SHARES, shares)
            .with(
                names::CUDA_DEVICE,
                SlotValue::from_int(self.devices.len() as u64),
            )
            .with(names::CUDA_MEM, SlotValue::from_micros(memory * SCALE))
    }

    /// What its sessions hold, as slots: `cuda.shares` (every part, whole devices included),
    /// `cuda.device` (devices held whole) and `cuda.mem`.
    #[must_use]
    pub fn allocated(&self) -> ResourceSlot {
        let shares = self
            .devices
            .iter()
            .fold(SlotValue::ZERO, |a, d| a.saturating_add(d.allocated));
        let memory: u128 = self
            .devices
            .iter()
            .map(|d| u128::from(d.allocated_memory))
            .sum();
        let whole = self
            .devices
            .iter()
            .filter(|d| d.exclusive_owner.is_some())
            .count() as u64;
        ResourceSlot::new()
            .with(names::CUDA_SHARES, shares)
            .with(names::CUDA_DEVICE, SlotValue::from_int(whole))
            .with(names::CUDA_MEM, SlotValue::from_micros(memory * SCALE))
    }

    /// Whether `request` would fit now, with either strategy: the same answer as
    /// [`Self::allocate`] for a new session, without side effects or allocating memory.
    #[must_use]
    pub fn can_fit(&self, request: &GpuRequest) -> bool {
        if request.is_empty() {
            return true;
        }
        if request.devices > 0 {
            if !request.shares.is_zero() || request.devices as usize > self.free.idle {
                return false;
            }
            if request.memory_bytes == 0 {
                return true;
            }
        } else {
            if request.shares > self.free.total || request.memory_bytes > self.free.memory {
                return false;
            }
            let quantum = self.config.effective_quantum();
            if request.memory_bytes == 0
                && request.shares <= self.free.largest
                && request.shares >= quantum
                && request.shares.is_multiple_of(quantum)
            {
                return true;
            }
            if !request.shares.is_zero() {
                return self.choose_shares(request, Strategy::Binpack, true).is_ok();
            }
        }
        self.choose(request, Strategy::Binpack).is_ok()
    }

    /// Reserves `request` for `session`, all or nothing.
    ///
    /// # Errors
    /// See [`AllocError`]; nothing is reserved then.
    pub fn allocate(
        &mut self,
        session: &str,
        request: &GpuRequest,
        strategy: Strategy,
    ) -> Result<Allocation, AllocError> {
        if self.held.contains_key(session) {
            return Err(AllocError::NoFit(NoFit::AlreadyAllocated {
                session: session.to_owned(),
            }));
        }
        let choice = self.choose(request, strategy)?;
        let allocation = self.materialize(choice, request);
        self.apply(session, allocation.clone());
        Ok(allocation)
    }

    /// What [`Self::allocate`] would reserve for a new session, reserving nothing.
    ///
    /// # Errors
    /// See [`AllocError`].
    pub fn plan(&self, request: &GpuRequest, strategy: Strategy) -> Result<Allocation, AllocError> {
        let choice = self.choose(request, strategy)?;
        Ok(self.materialize(choice, request))
    }

    /// Every single device a request for shares could go to, as allocations (empty when it
    /// needs whole devices, several devices, or nothing): the options a scorer weighs.
    #[must_use]
    pub fn single_device_plans(&self, request: &GpuRequest) -> Vec<Allocation> {
        let quantum = self.config.effective_quantum();
        if request.devices > 0
            || request.shares.is_zero()
            || request.shares > self.free.largest
            || request.shares < quantum
            || !request.shares.is_multiple_of(quantum)
        {
            return Vec::new();
        }
        self.order
            .iter()
            .filter(|d| d.shares >= request.shares && d.memory >= request.memory_bytes)
            .map(|d| self.materialize(Choice::One(d.pos), request))
            .collect()
    }

    /// Reserves a planned allocation ([`Self::plan`], [`Self::single_device_plans`]) for
    /// `session`, checking that each part still fits.
    ///
    /// # Errors
    /// The session already holds an allocation, or a part no longer fits its device.
    pub fn allocate_planned(
        &mut self,
        session: &str,
        allocation: Allocation,
    ) -> Result<Allocation, AllocError> {
        if self.held.contains_key(session) {
            return Err(AllocError::NoFit(NoFit::AlreadyAllocated {
                session: session.to_owned(),
            }));
        }
        for part in &allocation.parts {
            let fits = self.devices.iter().any(|d| {
                d.spec.index == part.index
                    && if part.exclusive {
                        d.is_idle()
                    } else {
                        d.free() >= part.shares && d.free_memory() >= part.memory_bytes
                    }
            });
            if !fits {
                return Err(AllocError::NoFit(NoFit::NoRoom {
                    shares: part.shares,
                    memory_bytes: part.memory_bytes,
                    free: self.free.total,
                    largest: self.free.largest,
                    devices: self.devices.len(),
                }));
            }
        }
        self.apply(session, allocation.clone());
        Ok(allocation)
    }

    /// Records an allocation decided elsewhere (an agent's report after a restart), replacing
    /// what `session` held. It is trusted, not checked against free capacity: the agent is the
    /// source of truth for its node. Parts naming devices this node doesn't have are kept in
    /// the record but reserve nothing.
    pub fn restore(&mut self, session: &str, allocation: Allocation) {
        self.release(session);
        self.apply(session, allocation);
    }

    /// Frees what `session` holds; `None` if it holds nothing here (releasing twice is
    /// harmless).
    pub fn release(&mut self, session: &str) -> Option<Allocation> {
        let allocation = self.held.remove(session)?;
        for part in &allocation.parts {
            if let Some(d) = self.device_mut(part.index) {
                d.allocated = d.allocated.saturating_sub(part.shares);
                d.allocated_memory = d.allocated_memory.saturating_sub(part.memory_bytes);
                d.sessions.remove(session);
                if d.exclusive_owner.as_deref() == Some(session) {
                    d.exclusive_owner = None;
                }
            }
        }
        self.reindex();
        Some(allocation)
    }

    fn device_mut(&mut self, index: u32) -> Option<&mut DeviceState> {
        self.devices.iter_mut().find(|d| d.spec.index == index)
    }

    fn apply(&mut self, session: &str, allocation: Allocation) {
        for part in &allocation.parts {
            if let Some(d) = self.device_mut(part.index) {
                d.allocated = d.allocated.saturating_add(part.shares);
                d.allocated_memory = d.allocated_memory.saturating_add(part.memory_bytes);
                d.sessions.insert(session.to_owned());
                if part.exclusive {
                    d.exclusive_owner = Some(session.to_owned());
                }
            }
        }
        self.held.insert(session.to_owned(), allocation);
        self.reindex();
    }

    /// The NUMA groups to try in turn: each node, then all devices; just all devices when they
    /// share one node.
    fn candidate_sets(&self) -> impl Iterator<Item = Option<i32>> + '_ {
        let groups = if self.numa_nodes.len() > 1 {
            &self.numa_nodes[..]
        } else {
            &[]
        };
        groups
            .iter()
            .copied()
            .map(Some)
            .chain(std::iter::once(None))
    }

    /// Decides where `request` goes.
    fn choose(&self, request: &GpuRequest, strategy: Strategy) -> Result<Choice, AllocError> {
        if request.devices > 0 {
            if !request.shares.is_zero() {
                return Err(AllocError::Request(GpuRequestError::DeviceAndShares));
            }
            return self.choose_whole(request, strategy);
        }
        if request.shares.is_zero() {
            if request.memory_bytes == 0 {
                return Ok(Choice::Nothing);
            }
            // Memory alone: one device with room, no shares.
            return self
                .pick_one(SlotValue::ZERO, request.memory_bytes, strategy)
                .map(Choice::One)
                .ok_or(AllocError::NoFit(NoFit::NoDeviceWithMemory {
                    memory_bytes: request.memory_bytes,
                    largest_free: self.free.largest_memory,
                }));
        }
        self.choose_shares(request, strategy, false)
    }

    /// Where a request for shares goes; with `only_whether`, any choice that proves it fits
    /// (cheaper, for [`Self::can_fit`]).
    fn choose_shares(
        &self,
        request: &GpuRequest,
        strategy: Strategy,
        only_whether: bool,
    ) -> Result<Choice, AllocError> {
        let quantum = self.config.effective_quantum();
        let shares = request.shares;
        if shares < quantum {
            return Err(AllocError::NoFit(NoFit::PartRoundsToZero {
                requested: shares,
                devices: 1,
                quantum,
            }));
        }
        if !shares.is_multiple_of(quantum) {
            return Err(AllocError::Request(GpuRequestError::NotMultipleOfQuantum {
                requested: shares,
                quantum,
            }));
        }
        if shares <= self.free.largest
            && let Some(pos) = self.pick_one(shares, request.memory_bytes, strategy)
        {
            return Ok(Choice::One(pos));
        }
        let no_room = AllocError::NoFit(NoFit::NoRoom {
            shares,
            memory_bytes: request.memory_bytes,
            free: self.free.total,
            largest: self.free.largest,
            devices: self.devices.len(),
        });
        let largest = self.free.largest.micros();
        if largest == 0 || shares > self.free.total {
            return Err(no_room);
        }
        // No fewer devices than the emptiest one could make up, in shares and in memory.
        let memory = u128::from(request.memory_bytes);
        let largest_memory = u128::from(self.free.largest_memory);
        if memory > 0 && largest_memory == 0 {
            return Err(no_room);
        }
        let by_memory = memory
            .checked_div(largest_memory)
            .map_or(0, |_| memory.div_ceil(largest_memory));
        let fewest = shares.micros().div_ceil(largest).max(by_memory);
        let fewest = usize::try_from(fewest).unwrap_or(usize::MAX);
        // Shares alone: a set within one NUMA node fits only if some set of all devices does,
        // and either walk finds a set whenever one exists; so one walk over all devices settles
        // each k, and the other walk can't help. Memory can make the walks disagree.
        let walks: &[Strategy] = if memory == 0 {
            &[strategy]
        } else {
            &[strategy, strategy.other()]
        };
        for k in fewest.max(2)..=self.devices.len() {
            let Some(parts) = Parts::new(shares, k, quantum, request.memory_bytes) else {
                return Err(AllocError::NoFit(NoFit::PartRoundsToZero {
                    requested: shares,
                    devices: k,
                    quantum,
                }));
            };
            // Whether the shares alone fit on k devices: exact, and cheap (the spreading walk
            // stops at the first device that can't hold its part).
            let shares_only = Parts {
                memory: 0,
                memory_small: 0,
                memory_big: 0,
                memory_rest: 0,
                ..parts
            };
            if !self.walk(&shares_only, None, Strategy::Spread, &mut |_, _, _| {}) {
                continue;
            }
            if memory == 0 && only_whether {
                return Ok(Choice::Split {
                    parts,
                    numa: None,
                    walk: Strategy::Spread,
                });
            }
            for numa in self.candidate_sets() {
                for &walk in walks {
                    if self.walk(&parts, numa, walk, &mut |_, _, _| {}) {
                        return Ok(Choice::Split { parts, numa, walk });
                    }
                }
            }
        }
        Err(no_room)
    }

    /// The device a single-device request goes to: the fullest that fits when packing, the
    /// emptiest when spreading (ties: the lowest index).
    fn pick_one(&self, shares: SlotValue, memory: u64, strategy: Strategy) -> Option<usize> {
        let fits = self
            .order
            .iter()
            .filter(|d| d.shares >= shares && d.memory >= memory);
        match strategy {
            Strategy::Binpack => fits.min_by_key(|d| (d.shares, d.memory, d.index)),
            Strategy::Spread => fits.max_by_key(|d| (d.shares, d.memory, Reverse(d.index))),
        }
        .map(|d| d.pos)
    }

    /// Matches `parts` to devices of `numa` (all when `None`), calling `take` for each match;
    /// whether all parts found a device.
    ///
    /// Packing walks the devices from the fullest, giving each the smallest part not yet
    /// placed that it holds; spreading walks from the emptiest, giving each the largest. For
    /// shares alone either walk finds a match whenever one exists (the devices and the parts
    /// are both sorted); memory can make them disagree, so callers try both.
    fn walk(
        &self,
        parts: &Parts,
        numa: Option<i32>,
        walk: Strategy,
        take: &mut dyn FnMut(usize, SlotValue, u64),
    ) -> bool {
        let k = parts.k;
        let n = self.order.len();
        let mut placed = 0;
        for step in 0..n {
            if placed == k {
                break;
            }
            let (d, part) = match walk {
                Strategy::Binpack => (&self.order[step], k - 1 - placed),
                Strategy::Spread => (&self.order[n - 1 - step], placed),
            };
            if numa.is_some_and(|numa| d.numa != numa) {
                continue;
            }
            let (share, memory) = (parts.share(part), parts.memory(part));
            if d.shares >= share && d.memory >= memory {
                take(d.pos, share, memory);
                placed += 1;
            } else if walk == Strategy::Spread && parts.memory == 0 {
                // The devices left have no more free than this one: none holds this part.
                return false;
            }
        }
        placed == k
    }

    /// Whole, idle devices for a `cuda.device` request: within one NUMA node if one has
    /// enough (packing takes the node with the fewest idle devices that suffice, spreading
    /// the most), else any; the lowest indices first.
    fn choose_whole(&self, request: &GpuRequest, strategy: Strategy) -> Result<Choice, AllocError> {
        let n = request.devices as usize;
        if n > self.free.idle {
            return Err(AllocError::NoFit(NoFit::NotEnoughIdleDevices {
                requested: request.devices,
                idle: self.free.idle,
                devices: self.devices.len(),
            }));
        }
        // (idle devices in the set, memory of the first n of them)
        let measure = |numa: Option<i32>| {
            let mut idle = 0usize;
            let mut memory = 0u64;
            for d in self.idle_devices(numa) {
                if idle < n {
                    memory = memory.saturating_add(d.spec.memory_bytes);
                }
                idle += 1;
            }
            (idle, memory)
        };
        if self.numa_nodes.len() > 1 {
            let fitting = self.numa_nodes.iter().filter_map(|&numa| {
                let (idle, memory) = measure(Some(numa));
                (idle >= n && memory >= request.memory_bytes).then_some((idle, numa))
            });
            let best = match strategy {
                Strategy::Binpack => fitting.min_by_key(|&(idle, _)| idle),
                Strategy::Spread => fitting.max_by_key(|&(idle, numa)| (idle, Reverse(numa))),
            };
            if let Some((_, numa)) = best {
                return Ok(Choice::Whole {
                    n,
                    numa: Some(numa),
                });
            }
        }
        let (_, memory) = measure(None);
        if memory < request.memory_bytes {
            return Err(AllocError::NoFit(NoFit::WholeDevicesLackMemory {
                memory_bytes: request.memory_bytes,
                devices: request.devices,
                available: memory,
            }));
        }
        Ok(Choice::Whole { n, numa: None })
    }

    fn idle_devices(&self, numa: Option<i32>) -> impl Iterator<Item = &DeviceState> {
        self.devices
            .iter()
            .filter(move |d| d.is_idle() && numa.is_none_or(|n| d.spec.numa_node == n))
    }

    /// The parts of a decision.
    fn materialize(&self, choice: Choice, request: &GpuRequest) -> Allocation {
        let part = |d: &DeviceState, shares, memory_bytes, exclusive| DevicePart {
            index: d.spec.index,
            uuid: d.spec.uuid.clone(),
            shares,
            memory_bytes,
            exclusive,
        };
        let mut parts = match choice {
            Choice::Nothing => Vec::new(),
            Choice::One(pos) => vec![part(
                &self.devices[pos],
                request.shares,
                request.memory_bytes,
                false,
            )],
            Choice::Split { parts, numa, walk } => {
                let mut out = Vec::with_capacity(parts.k);
                self.walk(&parts, numa, walk, &mut |pos, shares, memory| {
                    out.push(part(&self.devices[pos], shares, memory, false));
                });
                out
            }
            Choice::Whole { n, numa } => self
                .idle_devices(numa)
                .take(n)
                .map(|d| part(d, d.capacity, d.spec.memory_bytes, true))
                .collect(),
        };
        parts.sort_by_key(|p| p.index);
        Allocation { parts }
    }
}

/// A device's share capacity: 1.0, or with `unit_mem` and/or `unit_proc` configured,
/// min(memory / `unit_mem`, SMs / `unit_proc`) (of those configured) rounded down to the quantum.
#[must_use]
pub fn share_capacity(spec: &DeviceSpec, config: &AllocatorConfig) -> SlotValue {
    let by_mem = config
        .unit_mem
        .filter(|&u| u > 0)
        .map(|u| u128::from(spec.memory_bytes) * SCALE / u128::from(u));
    let by_proc = config
        .unit_proc
        .filter(|&u| u > 0)
        .map(|u| u128::from(spec.sm_count) * SCALE / u128::from(u));
    let micros = match (by_mem, by_proc) {
        (None, None) => return SlotValue::ONE,
        (Some(m), Some(p)) => m.min(p),
        (Some(v), None) | (None, Some(v)) => v,
    };
    SlotValue::from_micros(micros).floor_to(config.effective_quantum())
}

/// `total` in `k` near-even parts of whole quanta, largest first, adding up to exactly `total`:
/// 1.75 in two is 0.88 + 0.87 with a quantum of 0.01.
///
/// # Errors
/// `total` isn't a multiple of `quantum`, or a part would be below one quantum.
pub fn split(total: SlotValue, k: usize, quantum: SlotValue) -> Result<Vec<SlotValue>, AllocError> {
    if !total.is_multiple_of(quantum) {
        return Err(AllocError::Request(GpuRequestError::NotMultipleOfQuantum {
            requested: total,
            quantum,
        }));
    }
    let parts =
        Parts::new(total, k, quantum, 0).ok_or(AllocError::NoFit(NoFit::PartRoundsToZero {
            requested: total,
            devices: k,
            quantum,
        }))?;
    Ok((0..k).map(|i| parts.share(i)).collect())
}

#[cfg(test)]
mod tests;
