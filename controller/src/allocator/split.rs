//! Split arithmetic: a device's share capacity, and a request in near-even parts of whole
//! quanta that add up to exactly what was asked (docs/architecture.md, "Fractional
//! allocation").

use super::{AllocError, AllocatorConfig, DeviceSpec, GpuRequestError};
use crate::slots::{SCALE, SlotValue};

/// A split of `total` shares (and `memory` bytes) into `k` near-even parts of whole quanta,
/// numbered largest first: the first `extra` parts are one quantum larger than the rest.
#[derive(Debug, Clone, Copy)]
pub(super) struct Parts {
    pub(super) k: usize,
    extra: usize,
    /// The smaller and the larger part.
    small: SlotValue,
    big: SlotValue,
    pub(super) memory: u64,
    /// Memory of the parts rounded down, and the remainder that goes to part 0.
    memory_small: u64,
    memory_big: u64,
    memory_rest: u64,
}

impl Parts {
    /// `None` when a part would be zero (or `total` is zero).
    pub(super) fn new(total: SlotValue, k: usize, quantum: SlotValue, memory: u64) -> Option<Self> {
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

    /// The same parts without their memory.
    pub(super) fn shares_only(self) -> Self {
        Self {
            memory: 0,
            memory_small: 0,
            memory_big: 0,
            memory_rest: 0,
            ..self
        }
    }

    /// Part `i` (0 is the largest).
    pub(super) fn share(&self, i: usize) -> SlotValue {
        if i < self.extra { self.big } else { self.small }
    }

    /// The memory of part `i`.
    pub(super) fn memory(&self, i: usize) -> u64 {
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
        return Err(GpuRequestError::NotMultipleOfQuantum {
            requested: total,
            quantum,
        }
        .into());
    }
    let parts = Parts::new(total, k, quantum, 0).ok_or(AllocError::PartRoundsToZero {
        requested: total,
        devices: k,
        quantum,
    })?;
    Ok((0..k).map(|i| parts.share(i)).collect())
}
