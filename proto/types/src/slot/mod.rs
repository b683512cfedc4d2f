//! Resource slots: exact quantities by name (`cpu=1`, `mem=2g`, `cuda.shares=0.2`).
//!
//! A [`SlotValue`] is fixed-point — a `u128` of micro-units — never a float, so `0.2 + 0.4`
//! is exactly `0.6` (docs/architecture.md, "Resource slots are exact"). A [`ResourceSlot`] maps
//! [`SlotName`]s to values; a name that is absent is zero in every comparison and arithmetic,
//! so the slots of agents with different slot types combine ("Slot types are merged"). Its order
//! is partial: `a <= b` means every slot of `a` fits in `b`, and both `a <= b` and `b <= a` may
//! be false.
//!
//! Each slot has a [`SlotKind`]: a count (`cpu`, `cuda.shares`, `cuda.device`), bytes (`mem`,
//! `cuda.mem`; typed with binary units as Backend.AI takes them, `512m`, `1.5Gi`, `2 KiB`,
//! `12_345 bytes`) or unique (held alone, requested as 1). The [`SlotTypeRegistry`] is the union
//! of the kinds every agent declared; an agent that declares a known slot with another kind is
//! refused, with the reason. Where a limit is meant, [`Limit`] adds `unlimited` (`inf`) to the
//! values.
//!
//! # Example
//!
//! ```
//! use gpuwarden_types::slot::{ResourceSlot, SlotValue};
//!
//! let a = ResourceSlot::parse_any(&["cpu=1", "mem=2g", "cuda.shares=0.2"])?;
//! let b = ResourceSlot::parse_any(&["cuda.shares=0.4"])?;
//! let sum = (&a + &b)?;
//! assert_eq!(sum.get("cuda.shares"), "0.6".parse::<SlotValue>()?);
//! assert_eq!(sum.to_string(), "cpu=1,cuda.shares=0.6,mem=2g");
//! assert!(b <= sum && a.partial_cmp(&b).is_none()); // neither fits in the other
//! assert!((&b - &a).is_err()); // cpu would go negative
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod bytes;
mod format;
mod kind;
mod limit;
mod name;
mod parse;
mod registry;
mod resource;
mod value;

pub use bytes::{BytesError, parse_bytes};
pub use format::{default_kind, format_bytes, format_value};
pub use kind::SlotKind;
pub use limit::{Limit, SlotLimits};
pub use name::{InvalidSlotName, SlotName};
pub use parse::{BadValue, ParseError, parse_value};
pub use registry::{RegistryError, SlotTypeRegistry};
pub use resource::{ArithmeticError, ResourceSlot};
pub use value::{SCALE, SCALE_DIGITS, SlotValue, ValueError};

/// Well-known slot names.
pub mod names {
    /// CPU cores (count).
    pub const CPU: &str = "cpu";
    /// Host memory (bytes).
    pub const MEM: &str = "mem";
    /// Fractional GPU shares (count; one device has a capacity of 1.0 unless configured).
    pub const CUDA_SHARES: &str = "cuda.shares";
    /// Whole, exclusive GPUs (count, whole numbers only).
    pub const CUDA_DEVICE: &str = "cuda.device";
    /// GPU memory (bytes).
    pub const CUDA_MEM: &str = "cuda.mem";
    /// The prefix every GPU slot shares.
    pub const CUDA_PREFIX: &str = "cuda.";
    /// The prefix of MIG profile slots (`cuda.mig.1g.18gb`: one instance of that profile, held
    /// whole; docs/mig.md).
    pub const CUDA_MIG_PREFIX: &str = "cuda.mig.";

    /// The MIG profile a device's model names (`NVIDIA H200 MIG 1g.18gb` → `1g.18gb`: how NVML
    /// names MIG devices, and the agent its instances).
    #[must_use]
    pub fn mig_profile_in_model(model: &str) -> Option<&str> {
        let (_, profile) = model.rsplit_once(" MIG ")?;
        let profile = profile.trim();
        (!profile.is_empty()).then_some(profile)
    }

    /// The slot of MIG profile `profile` (`1g.18gb` → `cuda.mig.1g.18gb`; a `+`, which slot
    /// names don't take, is written `_`: `1g.10gb+me` → `cuda.mig.1g.10gb_me`).
    #[must_use]
    pub fn mig_slot(profile: &str) -> String {
        format!("{CUDA_MIG_PREFIX}{}", profile.replace('+', "_"))
    }

    /// Whether `slot` is [`mig_slot`]`(profile)`, without building the name (the scheduler
    /// asks it of every profile of every node it walks).
    #[must_use]
    pub fn is_mig_slot(slot: &str, profile: &str) -> bool {
        slot.strip_prefix(CUDA_MIG_PREFIX).is_some_and(|rest| {
            rest.len() == profile.len()
                && rest
                    .bytes()
                    .zip(profile.bytes())
                    .all(|(r, p)| r == if p == b'+' { b'_' } else { p })
        })
    }

    /// The slot types every node with NVIDIA GPUs declares, with their kinds.
    pub const GPU_SLOTS: [(&str, super::SlotKind); 3] = [
        (CUDA_DEVICE, super::SlotKind::Count),
        (CUDA_SHARES, super::SlotKind::Count),
        (CUDA_MEM, super::SlotKind::Bytes),
    ];
}

#[cfg(test)]
mod tests;
