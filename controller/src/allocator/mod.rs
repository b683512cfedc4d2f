//! The fractional GPU allocator of one node (ARCHITECTURE decision 3).
//!
//! A request for `cuda.shares` goes to one device that fits — the fullest that fits when
//! packing ([`Strategy::Binpack`]), the emptiest when spreading ([`Strategy::Spread`]) — and
//! otherwise is split over the fewest devices that can hold it, in near-even parts that add up
//! to exactly what was asked: 1.2 shares on two devices is 0.6 + 0.6, and 1.75 is 0.88 + 0.87
//! with a quantum of 0.01 (never 0.75 + 0.75, which would hand the user less). Splits prefer
//! devices on one NUMA node. `cuda.device` asks for whole devices held alone. `cuda.mem` is
//! split in proportion to the shares and checked against each device's free memory.
//!
//! Allocation is all or nothing, and release is idempotent.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::slots::{ResourceSlot, SCALE, SlotValue, names};

/// Settings of the allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AllocatorConfig {
    /// Shares are handed out in multiples of this (default 0.01).
    pub quantum: SlotValue,
    /// With `unit_proc`, a device's share capacity is min(memory / unit_mem, SMs / unit_proc),
    /// as Backend.AI computes it; otherwise 1.0.
    pub unit_mem: Option<u64>,
    /// See `unit_mem`.
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

/// Where a fractional request goes when several devices fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// The fullest device that fits: keeps whole devices free.
    #[default]
    Binpack,
    /// The emptiest device: keeps tenants apart.
    Spread,
}

/// A device as its agent reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSpec {
    /// Device UUID.
    pub uuid: String,
    /// Index on the node.
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

/// What a session holds on a node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    /// One part per device.
    pub parts: Vec<DevicePart>,
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

/// Why a request can't be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// `cuda.device` and `cuda.shares` together.
    #[error("cuda.device and cuda.shares can't be combined in one request")]
    DeviceAndShares,
    /// Shares not in whole quanta.
    #[error("cuda.shares={requested} is not a multiple of the quantum {quantum}")]
    NotMultipleOfQuantum {
        /// Asked.
        requested: SlotValue,
        /// The quantum.
        quantum: SlotValue,
    },
    /// A split part would be zero.
    #[error(
        "cuda.shares={requested} split over {devices} devices rounds to zero per device (quantum {quantum})"
    )]
    PartRoundsToZero {
        /// Asked.
        requested: SlotValue,
        /// Devices it would take.
        devices: usize,
        /// The quantum.
        quantum: SlotValue,
    },
    /// A value too large for its slot.
    #[error("{slot}={value} is out of range")]
    OutOfRange {
        /// The slot.
        slot: &'static str,
        /// The value.
        value: SlotValue,
    },
    /// Not enough free capacity on this node.
    #[error("insufficient GPU capacity: {0}")]
    Insufficient(String),
    /// The session already holds an allocation here.
    #[error("session {0} already holds an allocation on this node")]
    AlreadyAllocated(String),
}

impl GpuRequest {
    /// The GPU slots of `slots`.
    ///
    /// # Errors
    /// `cuda.device` with `cuda.shares`, or values out of range.
    pub fn from_slots(slots: &ResourceSlot) -> Result<Self, AllocError> {
        let shares = slots.get(names::CUDA_SHARES);
        let devices = slots.get(names::CUDA_DEVICE);
        let mem = slots.get(names::CUDA_MEM);
        if !shares.is_zero() && !devices.is_zero() {
            return Err(AllocError::DeviceAndShares);
        }
        Ok(Self {
            shares,
            devices: u32::try_from(devices.trunc()).map_err(|_| AllocError::OutOfRange {
                slot: names::CUDA_DEVICE,
                value: devices,
            })?,
            memory_bytes: u64::try_from(mem.trunc()).map_err(|_| AllocError::OutOfRange {
                slot: names::CUDA_MEM,
                value: mem,
            })?,
        })
    }

    /// Whether it asks for no GPU at all.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.shares.is_zero() && self.devices == 0 && self.memory_bytes == 0
    }
}

/// A device's state in the allocator.
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
    /// Held whole by one session.
    pub exclusive: bool,
}

impl DeviceState {
    /// Free shares.
    #[must_use]
    pub fn free(&self) -> SlotValue {
        if self.exclusive {
            SlotValue::ZERO
        } else {
            self.capacity.saturating_sub(self.allocated)
        }
    }

    /// Free memory.
    #[must_use]
    pub fn free_memory(&self) -> u64 {
        if self.exclusive {
            0
        } else {
            self.spec.memory_bytes.saturating_sub(self.allocated_memory)
        }
    }

    fn idle(&self) -> bool {
        self.sessions.is_empty() && !self.exclusive
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
}

/// The allocator of one node's devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAllocator {
    config: AllocatorConfig,
    devices: Vec<DeviceState>,
    held: BTreeMap<String, Allocation>,
    #[serde(default)]
    free: FreeSummary,
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
                exclusive: false,
            })
            .collect();
        let mut allocator = Self {
            config,
            devices,
            held: BTreeMap::new(),
            free: FreeSummary::default(),
        };
        allocator.summarize();
        allocator
    }

    /// What is free, in summary.
    #[must_use]
    pub fn free(&self) -> FreeSummary {
        self.free
    }

    /// Recomputes the free summary (after deserializing).
    pub fn refresh(&mut self) {
        self.summarize();
    }

    fn summarize(&mut self) {
        self.free = FreeSummary {
            total: self
                .devices
                .iter()
                .fold(SlotValue::ZERO, |a, d| a.checked_add(d.free()).unwrap_or(a)),
            largest: self
                .devices
                .iter()
                .map(DeviceState::free)
                .max()
                .unwrap_or_default(),
            idle: self.devices.iter().filter(|d| d.idle()).count(),
        };
    }

    /// The devices and what is handed out on each: the `gpu_alloc_map`.
    #[must_use]
    pub fn devices(&self) -> &[DeviceState] {
        &self.devices
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
        let shares = self.devices.iter().fold(SlotValue::ZERO, |a, d| {
            a.checked_add(d.capacity).unwrap_or(a)
        });
        let memory: u64 = self.devices.iter().map(|d| d.spec.memory_bytes).sum();
        ResourceSlot::new()
            .with(names::CUDA_SHARES, shares)
            .with(
                names::CUDA_DEVICE,
                SlotValue::from_int(self.devices.len() as u64),
            )
            .with(names::CUDA_MEM, SlotValue::from_int(memory))
    }

    /// Whether `request` would fit now (no side effects). Most answers come from the summary;
    /// only a split or a memory check plans for real.
    #[must_use]
    pub fn can_fit(&self, request: &GpuRequest) -> bool {
        if request.is_empty() {
            return true;
        }
        if request.devices > 0 {
            // Whole idle devices hold all their memory: only a memory ask needs a plan.
            if (request.devices as usize) > self.free.idle {
                return false;
            }
            if request.memory_bytes == 0 {
                return true;
            }
        } else if request.shares > self.free.total {
            return false;
        } else if request.memory_bytes == 0
            && request.shares <= self.free.largest
            && !request.shares.is_zero()
        {
            return true;
        }
        self.plan(request, Strategy::Binpack).is_ok()
    }

    /// Reserves `request` for `session`.
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
            return Err(AllocError::AlreadyAllocated(session.to_owned()));
        }
        let allocation = self.plan(request, strategy)?;
        self.apply(session, allocation.clone());
        Ok(allocation)
    }

    /// Records an allocation decided elsewhere (an agent's report after a restart).
    pub fn restore(&mut self, session: &str, allocation: Allocation) {
        self.release(session);
        self.apply(session, allocation);
    }

    /// Frees what `session` holds; `None` if it holds nothing (releasing twice is harmless).
    pub fn release(&mut self, session: &str) -> Option<Allocation> {
        let allocation = self.held.remove(session)?;
        for part in &allocation.parts {
            if let Some(d) = self.devices.iter_mut().find(|d| d.spec.index == part.index) {
                d.allocated = d.allocated.saturating_sub(part.shares);
                d.allocated_memory = d.allocated_memory.saturating_sub(part.memory_bytes);
                d.sessions.remove(session);
                if part.exclusive {
                    d.exclusive = false;
                }
            }
        }
        self.summarize();
        Some(allocation)
    }

    fn apply(&mut self, session: &str, allocation: Allocation) {
        for part in &allocation.parts {
            if let Some(d) = self.devices.iter_mut().find(|d| d.spec.index == part.index) {
                d.allocated = d.allocated.checked_add(part.shares).unwrap_or(d.allocated);
                d.allocated_memory += part.memory_bytes;
                d.sessions.insert(session.to_owned());
                d.exclusive |= part.exclusive;
            }
        }
        self.held.insert(session.to_owned(), allocation);
        self.summarize();
    }

    /// Decides where `request` goes, without reserving.
    fn plan(&self, request: &GpuRequest, strategy: Strategy) -> Result<Allocation, AllocError> {
        if request.devices > 0 {
            return self.plan_whole(request);
        }
        if request.shares.is_zero() {
            if request.memory_bytes == 0 {
                return Ok(Allocation::default());
            }
            // Memory alone: one device with room, no shares.
            return self
                .pick_one(SlotValue::ZERO, request.memory_bytes, strategy)
                .map(|d| Allocation {
                    parts: vec![part(d, SlotValue::ZERO, request.memory_bytes, false)],
                })
                .ok_or_else(|| {
                    AllocError::Insufficient(format!(
                        "no device has {} bytes of GPU memory free",
                        request.memory_bytes
                    ))
                });
        }
        let quantum = self.config.quantum;
        if !quantum.is_zero() && !request.shares.micros().is_multiple_of(quantum.micros()) {
            return Err(AllocError::NotMultipleOfQuantum {
                requested: request.shares,
                quantum,
            });
        }
        if let Some(d) = self.pick_one(request.shares, request.memory_bytes, strategy) {
            return Ok(Allocation {
                parts: vec![part(d, request.shares, request.memory_bytes, false)],
            });
        }
        for k in 2..=self.devices.len() {
            let parts = split(request.shares, k, quantum)?;
            if let Some(chosen) = self.pick_many(&parts, request.memory_bytes, request.shares) {
                return Ok(Allocation { parts: chosen });
            }
        }
        Err(AllocError::Insufficient(format!(
            "cuda.shares={} with cuda.mem={} fits on no set of this node's {} devices",
            request.shares,
            request.memory_bytes,
            self.devices.len()
        )))
    }

    /// The device a single-device request goes to.
    fn pick_one(&self, shares: SlotValue, memory: u64, strategy: Strategy) -> Option<&DeviceState> {
        let fits = self
            .devices
            .iter()
            .filter(|d| !d.exclusive && d.free() >= shares && d.free_memory() >= memory);
        match strategy {
            Strategy::Binpack => fits.min_by_key(|d| (d.free(), d.spec.index)),
            Strategy::Spread => fits.max_by_key(|d| (d.free(), std::cmp::Reverse(d.spec.index))),
        }
    }

    /// `parts.len()` devices holding `parts` (largest first), one NUMA node if possible.
    fn pick_many(
        &self,
        parts: &[SlotValue],
        memory: u64,
        total: SlotValue,
    ) -> Option<Vec<DevicePart>> {
        let memory_parts = split_memory(memory, parts, total);
        let try_set = |candidates: Vec<&DeviceState>| -> Option<Vec<DevicePart>> {
            let mut candidates = candidates;
            candidates.sort_by_key(|d| (std::cmp::Reverse(d.free()), d.spec.index));
            let chosen = candidates.get(..parts.len())?;
            let fits = chosen
                .iter()
                .zip(parts.iter().zip(&memory_parts))
                .all(|(d, (s, m))| d.free() >= *s && d.free_memory() >= *m);
            fits.then(|| {
                chosen
                    .iter()
                    .zip(parts.iter().zip(&memory_parts))
                    .map(|(d, (s, m))| part(d, *s, *m, false))
                    .collect()
            })
        };
        let mut by_numa: BTreeMap<i32, Vec<&DeviceState>> = BTreeMap::new();
        for d in self.devices.iter().filter(|d| !d.exclusive) {
            by_numa.entry(d.spec.numa_node).or_default().push(d);
        }
        by_numa
            .values()
            .find_map(|group| try_set(group.clone()))
            .or_else(|| try_set(self.devices.iter().filter(|d| !d.exclusive).collect()))
    }

    /// Whole, idle devices for a `cuda.device` request, one NUMA node if possible.
    fn plan_whole(&self, request: &GpuRequest) -> Result<Allocation, AllocError> {
        let n = request.devices as usize;
        let idle: Vec<&DeviceState> = self.devices.iter().filter(|d| d.idle()).collect();
        let mut by_numa: BTreeMap<i32, Vec<&DeviceState>> = BTreeMap::new();
        for d in &idle {
            by_numa.entry(d.spec.numa_node).or_default().push(d);
        }
        let chosen: Vec<&DeviceState> = by_numa
            .values()
            .find(|g| g.len() >= n)
            .map(|g| g[..n].to_vec())
            .or_else(|| (idle.len() >= n).then(|| idle[..n].to_vec()))
            .ok_or_else(|| {
                AllocError::Insufficient(format!(
                    "cuda.device={n}: {} of {} devices are idle",
                    idle.len(),
                    self.devices.len()
                ))
            })?;
        let memory: u64 = chosen.iter().map(|d| d.spec.memory_bytes).sum();
        if request.memory_bytes > memory {
            return Err(AllocError::Insufficient(format!(
                "cuda.mem={} exceeds the {memory} bytes of {n} whole devices",
                request.memory_bytes
            )));
        }
        Ok(Allocation {
            parts: chosen
                .iter()
                .map(|d| part(d, d.capacity, d.spec.memory_bytes, true))
                .collect(),
        })
    }
}

fn part(d: &DeviceState, shares: SlotValue, memory_bytes: u64, exclusive: bool) -> DevicePart {
    DevicePart {
        index: d.spec.index,
        uuid: d.spec.uuid.clone(),
        shares,
        memory_bytes,
        exclusive,
    }
}

/// A device's share capacity: 1.0, or min(memory / unit_mem, SMs / unit_proc) rounded down to
/// the quantum when both units are set.
#[must_use]
pub fn share_capacity(spec: &DeviceSpec, config: &AllocatorConfig) -> SlotValue {
    match (config.unit_mem, config.unit_proc) {
        (Some(mem), Some(proc)) if mem > 0 && proc > 0 => {
            let by_mem = u128::from(spec.memory_bytes) * SCALE / u128::from(mem);
            let by_proc = u128::from(spec.sm_count) * SCALE / u128::from(proc);
            SlotValue::from_micros(by_mem.min(by_proc)).floor_to(config.quantum)
        }
        _ => SlotValue::ONE,
    }
}

/// `total` in `k` near-even parts of whole quanta, largest first, adding up to exactly `total`.
///
/// # Errors
/// A part would be zero.
pub fn split(total: SlotValue, k: usize, quantum: SlotValue) -> Result<Vec<SlotValue>, AllocError> {
    let q = if quantum.is_zero() {
        1
    } else {
        quantum.micros()
    };
    let quanta = total.micros() / q;
    let k128 = k as u128;
    let (base, extra) = (quanta / k128, quanta % k128);
    if base == 0 {
        return Err(AllocError::PartRoundsToZero {
            requested: total,
            devices: k,
            quantum,
        });
    }
    Ok((0..k128)
        .map(|i| SlotValue::from_micros((base + u128::from(i < extra)) * q))
        .collect())
}

/// `memory` split in proportion to `parts` (of `total`), the remainder on the first part.
fn split_memory(memory: u64, parts: &[SlotValue], total: SlotValue) -> Vec<u64> {
    if memory == 0 || total.is_zero() {
        return vec![0; parts.len()];
    }
    let mut out: Vec<u64> = parts
        .iter()
        .map(|p| {
            u64::try_from(u128::from(memory) * p.micros() / total.micros()).unwrap_or(u64::MAX)
        })
        .collect();
    let assigned: u64 = out.iter().sum();
    if let Some(first) = out.first_mut() {
        *first += memory - assigned;
    }
    out
}

#[cfg(test)]
mod tests;
