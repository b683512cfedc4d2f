//! A node's allocator state: its devices, what each hands out, and the indexes kept so that
//! refusing a request is cheap.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BTreeSet},
};

use serde::{Deserialize, Serialize};

use super::{
    AllocError, Allocation, AllocatorConfig, DeviceSpec, GpuRequest, Strategy,
    split::share_capacity,
};
use crate::slots::{ResourceSlot, SCALE, SlotValue, names};

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
    /// Offered to Kubernetes (DRA), not to the controller: what it holds are claims its node's
    /// agent prepared (observed sessions), and the controller hands none of it out.
    #[serde(default)]
    pub kubernetes: bool,
    /// The MIG profile slot of an instance (`cuda.mig.1g.18gb`): what requests for that
    /// profile are placed on.
    #[serde(default)]
    pub profile: Option<String>,
}

impl DeviceState {
    /// Free shares for the controller to hand out (none while held exclusively, none on a GPU
    /// offered to Kubernetes).
    #[must_use]
    pub fn free(&self) -> SlotValue {
        if self.is_exclusive() || self.kubernetes {
            SlotValue::ZERO
        } else {
            self.capacity.saturating_sub(self.allocated)
        }
    }

    /// Free memory for the controller to hand out (none while held exclusively, none on a GPU
    /// offered to Kubernetes).
    #[must_use]
    pub fn free_memory(&self) -> u64 {
        if self.is_exclusive() || self.kubernetes {
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

    /// Whether nobody holds any part of it and the controller may hand it out whole (a GPU
    /// offered to Kubernetes never is).
    #[must_use]
    pub fn is_idle(&self) -> bool {
        self.sessions.is_empty() && !self.is_exclusive() && !self.kubernetes
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
    /// Offered to Kubernetes, not to the controller.
    pub kubernetes: bool,
}

/// The allocator of one node's devices.
///
/// It serializes its devices, settings and allocations; the derived indexes are rebuilt when
/// it is deserialized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Persisted")]
pub struct NodeAllocator {
    pub(super) config: AllocatorConfig,
    pub(super) devices: Vec<DeviceState>,
    held: BTreeMap<String, Allocation>,
    /// Totals for fast refusals.
    #[serde(skip)]
    pub(super) free: FreeSummary,
    /// What is free on each shareable device, by free shares ascending (ties: higher index
    /// first): one small contiguous array that placement reads instead of the devices.
    #[serde(skip)]
    pub(super) order: Vec<FreeDevice>,
    /// The distinct NUMA nodes of the devices, in device order.
    #[serde(skip)]
    pub(super) numa_nodes: Vec<i32>,
}

/// What is free on one device that isn't held whole, in [`NodeAllocator`]'s sorted index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FreeDevice {
    pub(super) shares: SlotValue,
    pub(super) memory: u64,
    pub(super) pos: usize,
    pub(super) index: u32,
    pub(super) numa: i32,
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
                kubernetes: false,
                profile: None,
            })
            .collect();
        Persisted {
            config,
            devices,
            held: BTreeMap::new(),
        }
        .into()
    }

    /// Marks the devices that are MIG instances with their profile slot (`cuda.mig.1g.18gb`),
    /// by device index: requests for a profile go to idle instances of it.
    #[must_use]
    pub fn with_profiles(mut self, profiles: &BTreeMap<u32, String>) -> Self {
        for d in &mut self.devices {
            d.profile = profiles.get(&d.spec.index).cloned();
        }
        self
    }

    /// Adds the GPUs the node offers to Kubernetes: shown in the allocation map with the claims
    /// prepared on them ([`Self::restore`]), never handed out by the controller, and left out of
    /// its capacity ([`Self::capacity`], [`Self::allocated`]). A GPU whose index the node's
    /// controller GPUs already use is left out.
    #[must_use]
    pub fn with_kubernetes(mut self, devices: Vec<DeviceSpec>) -> Self {
        for spec in devices {
            if self.devices.iter().any(|d| d.spec.index == spec.index) {
                continue;
            }
            self.devices.push(DeviceState {
                capacity: share_capacity(&spec, &self.config),
                spec,
                allocated: SlotValue::ZERO,
                allocated_memory: 0,
                sessions: BTreeSet::new(),
                exclusive_owner: None,
                kubernetes: true,
                profile: None,
            });
        }
        self.refresh();
        self
    }

    /// The node as Kubernetes' DRA allocator sees it: the GPUs offered to Kubernetes, with the
    /// claims prepared on them, as the ones that can be handed out, and the controller's as not.
    /// The scheduler extender judges pods on it. `None` when the node offers no GPU to
    /// Kubernetes.
    #[must_use]
    pub fn kubernetes_view(&self) -> Option<Self> {
        if !self.devices.iter().any(|d| d.kubernetes) {
            return None;
        }
        let mut view = self.clone();
        for d in &mut view.devices {
            d.kubernetes = !d.kubernetes;
        }
        view.refresh();
        Some(view)
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
                .filter(|(_, d)| !d.is_exclusive() && !d.kubernetes)
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
                kubernetes: d.kubernetes,
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

    /// GPU capacity as slots: `cuda.shares`, `cuda.device`, `cuda.mem` (of the GPUs offered to
    /// the controller: those offered to Kubernetes are no capacity of its own).
    #[must_use]
    pub fn capacity(&self) -> ResourceSlot {
        self.gpu_slots(|d| (d.capacity, d.spec.memory_bytes, true))
    }

    /// GPU slots handed out: `cuda.shares` and `cuda.mem` over the devices offered to the
    /// controller, `cuda.device` the devices held whole.
    #[must_use]
    pub fn allocated(&self) -> ResourceSlot {
        self.gpu_slots(|d| (d.allocated, d.allocated_memory, d.is_exclusive()))
    }

    /// The GPU slots summed over the devices: the shares, the memory and whether it counts as a
    /// whole device, each as `of` reads them from a device.
    fn gpu_slots(&self, of: impl Fn(&DeviceState) -> (SlotValue, u64, bool)) -> ResourceSlot {
        let (shares, memory, whole) = self.devices.iter().filter(|d| !d.kubernetes).fold(
            (SlotValue::ZERO, 0u128, 0u64),
            |(shares, memory, whole), d| {
                let (s, m, w) = of(d);
                (
                    shares.saturating_add(s),
                    memory + u128::from(m),
                    whole + u64::from(w),
                )
            },
        );
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
            // A profile counts only its own idle instances: the choice below does.
            if request.memory_bytes == 0 && !request.is_profile() {
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
            return Err(AllocError::AlreadyAllocated {
                session: session.to_owned(),
            });
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
            return Err(AllocError::AlreadyAllocated {
                session: session.to_owned(),
            });
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
                return Err(AllocError::NoRoom {
                    shares: part.shares,
                    memory_bytes: part.memory_bytes,
                    free: self.free.total,
                    largest: self.free.largest,
                    devices: self.devices.len(),
                });
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

    /// Whether a claim an agent reports (an observed session) fits what the node offers to
    /// Kubernetes: each part on a GPU offered to it, holding something, and with what the other
    /// claims there hold, within the GPU's shares and memory. A node's report can then never book
    /// more than it offers, however many claims it names.
    ///
    /// # Errors
    /// What does not fit, naming the GPU.
    pub fn fits_observed(&self, session: &str, allocation: &Allocation) -> Result<(), String> {
        let mine = self.held.get(session);
        for part in &allocation.parts {
            let Some(d) = self.devices.iter().find(|d| d.spec.index == part.index) else {
                return Err(format!("GPU {} is not on this node", part.index));
            };
            if !d.kubernetes {
                return Err(format!("GPU {} is not offered to Kubernetes", part.index));
            }
            if part.shares == SlotValue::ZERO && part.memory_bytes == 0 {
                return Err(format!("its part on GPU {} holds nothing", part.index));
            }
            let (had_shares, had_memory) = mine
                .and_then(|a| a.parts.iter().find(|p| p.index == part.index))
                .map_or((SlotValue::ZERO, 0), |p| (p.shares, p.memory_bytes));
            let shares = d
                .allocated
                .saturating_sub(had_shares)
                .saturating_add(part.shares);
            let memory = d
                .allocated_memory
                .saturating_sub(had_memory)
                .saturating_add(part.memory_bytes);
            if shares > d.capacity {
                return Err(format!(
                    "GPU {} would hold {shares} of its {} shares",
                    part.index, d.capacity
                ));
            }
            if memory > d.spec.memory_bytes {
                return Err(format!(
                    "GPU {} would hold {memory} of its {} bytes",
                    part.index, d.spec.memory_bytes
                ));
            }
        }
        Ok(())
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
}
