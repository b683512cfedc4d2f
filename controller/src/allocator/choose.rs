//! Device choice: where a request goes on one node, decided without side effects: one device
//! that fits, else the fewest devices that can hold its parts, else whole idle devices.

use std::cmp::Reverse;

use super::{
    AllocError, Allocation, DevicePart, DeviceState, GpuRequest, GpuRequestError, NodeAllocator,
    Strategy, split::Parts,
};
use crate::slots::SlotValue;

/// Where a request goes, decided without side effects and without allocating.
#[derive(Debug, Clone, Copy)]
pub(super) enum Choice {
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

impl NodeAllocator {
    /// The NUMA groups to try in turn: each node, then all devices; just all devices when they
    /// share one node.
    pub(super) fn candidate_sets(&self) -> impl Iterator<Item = Option<i32>> + '_ {
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
    pub(super) fn choose(
        &self,
        request: &GpuRequest,
        strategy: Strategy,
    ) -> Result<Choice, AllocError> {
        if request.devices > 0 {
            if !request.shares.is_zero() {
                return Err(GpuRequestError::DeviceAndShares.into());
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
                .ok_or(AllocError::NoDeviceWithMemory {
                    memory_bytes: request.memory_bytes,
                    largest_free: self.free.largest_memory,
                });
        }
        self.choose_shares(request, strategy, false)
    }

    /// Where a request for shares goes; with `only_whether`, any choice that proves it fits
    /// (cheaper, for [`Self::can_fit`]).
    pub(super) fn choose_shares(
        &self,
        request: &GpuRequest,
        strategy: Strategy,
        only_whether: bool,
    ) -> Result<Choice, AllocError> {
        let quantum = self.config.effective_quantum();
        let shares = request.shares;
        if shares < quantum {
            return Err(AllocError::PartRoundsToZero {
                requested: shares,
                devices: 1,
                quantum,
            });
        }
        if !shares.is_multiple_of(quantum) {
            return Err(GpuRequestError::NotMultipleOfQuantum {
                requested: shares,
                quantum,
            }
            .into());
        }
        if shares <= self.free.largest
            && let Some(pos) = self.pick_one(shares, request.memory_bytes, strategy)
        {
            return Ok(Choice::One(pos));
        }
        let no_room = AllocError::NoRoom {
            shares,
            memory_bytes: request.memory_bytes,
            free: self.free.total,
            largest: self.free.largest,
            devices: self.devices.len(),
        };
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
                return Err(AllocError::PartRoundsToZero {
                    requested: shares,
                    devices: k,
                    quantum,
                });
            };
            // Whether the shares alone fit on k devices: exact, and cheap (the spreading walk
            // stops at the first device that can't hold its part).
            let shares_only = parts.shares_only();
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
    pub(super) fn pick_one(
        &self,
        shares: SlotValue,
        memory: u64,
        strategy: Strategy,
    ) -> Option<usize> {
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
    pub(super) fn walk(
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
    pub(super) fn choose_whole(
        &self,
        request: &GpuRequest,
        strategy: Strategy,
    ) -> Result<Choice, AllocError> {
        let n = request.devices as usize;
        if n > self.free.idle {
            return Err(AllocError::NotEnoughIdleDevices {
                requested: request.devices,
                idle: self.free.idle,
                devices: self.devices.len(),
            });
        }
        // (idle devices in the set, memory of the first n of them)
        let profile = request.profile.as_deref();
        let measure = |numa: Option<i32>| {
            let mut idle = 0usize;
            let mut memory = 0u64;
            for d in self.idle_devices(numa, profile) {
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
        let (idle, memory) = measure(None);
        if let Some(profile) = profile
            && idle < n
        {
            return Err(AllocError::NotEnoughInstances {
                profile: profile.to_owned(),
                requested: request.devices,
                idle,
            });
        }
        if memory < request.memory_bytes {
            return Err(AllocError::WholeDevicesLackMemory {
                memory_bytes: request.memory_bytes,
                devices: request.devices,
                available: memory,
            });
        }
        Ok(Choice::Whole { n, numa: None })
    }

    /// The idle devices within `numa` (any when `None`), only instances of `profile` when one
    /// is given.
    pub(super) fn idle_devices<'a>(
        &'a self,
        numa: Option<i32>,
        profile: Option<&'a str>,
    ) -> impl Iterator<Item = &'a DeviceState> {
        self.devices.iter().filter(move |d| {
            d.is_idle()
                && numa.is_none_or(|n| d.spec.numa_node == n)
                && profile.is_none_or(|p| d.profile.as_deref() == Some(p))
        })
    }

    /// The parts of a decision.
    pub(super) fn materialize(&self, choice: Choice, request: &GpuRequest) -> Allocation {
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
                .idle_devices(numa, request.profile.as_deref())
                .take(n)
                .map(|d| part(d, d.capacity, d.spec.memory_bytes, true))
                .collect(),
        };
        parts.sort_by_key(|p| p.index);
        Allocation { parts }
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
}
