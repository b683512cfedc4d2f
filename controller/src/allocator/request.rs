//! The GPU part of a request (`cuda.shares`, `cuda.device`, `cuda.mem`, a MIG profile
//! `cuda.mig.<profile>`) and why one is malformed, apart from whether it fits.

use crate::slots::{ResourceSlot, SlotValue, names};

/// The GPU part of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuRequest {
    /// Fractional shares (`cuda.shares`).
    pub shares: SlotValue,
    /// Whole exclusive devices (`cuda.device`, or instances of [`Self::profile`]).
    pub devices: u32,
    /// GPU memory (`cuda.mem`).
    pub memory_bytes: u64,
    /// The MIG profile slot (`cuda.mig.1g.18gb`) the whole devices must be instances of.
    pub profile: Option<String>,
}

/// Why the GPU part of a request is malformed, whatever the node: the caller's mistake
/// (`InvalidArgument`), never a matter of room.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuRequestError {
    /// `cuda.device` and `cuda.shares` together.
    #[error("cuda.device and cuda.shares can't be combined in one request")]
    DeviceAndShares,
    /// A MIG profile with another GPU slot, or two profiles.
    #[error("{profile} can't be combined with {other} in one request")]
    ProfileAndOther {
        /// The profile slot.
        profile: String,
        /// The other GPU slot.
        other: String,
    },
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

impl GpuRequest {
    /// Fractional shares only.
    #[must_use]
    pub const fn shares(shares: SlotValue) -> Self {
        Self {
            shares,
            devices: 0,
            memory_bytes: 0,
            profile: None,
        }
    }

    /// Whole exclusive devices only.
    #[must_use]
    pub const fn devices(devices: u32) -> Self {
        Self {
            shares: SlotValue::ZERO,
            devices,
            memory_bytes: 0,
            profile: None,
        }
    }

    /// `count` instances of MIG profile slot `profile` (`cuda.mig.1g.18gb`), each held whole.
    #[must_use]
    pub fn profile(profile: &str, count: u32) -> Self {
        Self {
            profile: Some(profile.to_owned()),
            ..Self::devices(count)
        }
    }

    /// The same request with `memory_bytes` of GPU memory.
    #[must_use]
    pub fn with_memory(self, memory_bytes: u64) -> Self {
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
        let mut request = Self {
            shares,
            devices: u32::try_from(whole(names::CUDA_DEVICE, devices)?).map_err(|_| {
                GpuRequestError::OutOfRange {
                    slot: names::CUDA_DEVICE,
                    value: devices,
                }
            })?,
            memory_bytes: whole(names::CUDA_MEM, mem)?,
            profile: None,
        };
        // A MIG profile: that many instances of it, whole, and nothing else of the GPU slots.
        for (name, value) in slots.iter() {
            if value.is_zero() || !name.as_str().starts_with(names::CUDA_MIG_PREFIX) {
                continue;
            }
            let other = if let Some(p) = &request.profile {
                Some(p.clone())
            } else if !shares.is_zero() {
                Some(names::CUDA_SHARES.to_owned())
            } else if !devices.is_zero() {
                Some(names::CUDA_DEVICE.to_owned())
            } else {
                None
            };
            if let Some(other) = other {
                return Err(GpuRequestError::ProfileAndOther {
                    profile: name.to_string(),
                    other,
                });
            }
            let slot = mig_slot_name(name.as_str());
            let count = whole(slot, value)?;
            request.devices =
                u32::try_from(count).map_err(|_| GpuRequestError::OutOfRange { slot, value })?;
            request.profile = Some(name.to_string());
        }
        Ok(request)
    }

    /// Whether it asks for instances of a MIG profile.
    #[must_use]
    pub fn is_profile(&self) -> bool {
        self.profile.is_some()
    }

    /// Whether it asks for no GPU at all.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.shares.is_zero() && self.devices == 0 && self.memory_bytes == 0
    }

    /// Whether its shares are a whole number of `quantum`s (any shares when `quantum` is zero):
    /// rounding would hand out less, or more, than was asked.
    ///
    /// # Errors
    /// [`GpuRequestError::NotMultipleOfQuantum`].
    pub fn check_quantum(&self, quantum: SlotValue) -> Result<(), GpuRequestError> {
        if quantum.is_zero() || self.shares.micros().is_multiple_of(quantum.micros()) {
            Ok(())
        } else {
            Err(GpuRequestError::NotMultipleOfQuantum {
                requested: self.shares,
                quantum,
            })
        }
    }
}

/// The name errors give a profile slot (their slot names are `&'static str`).
fn mig_slot_name(_name: &str) -> &'static str {
    "cuda.mig.<profile>"
}
