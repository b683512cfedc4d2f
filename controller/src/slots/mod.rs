//! Resource slots: exact quantities by name (`cpu=1`, `mem=2g`, `cuda.shares=0.2`).
//!
//! A [`ResourceSlot`] maps slot names to [`SlotValue`]s; a name that is absent is zero in every
//! comparison and arithmetic, so slots of agents with different slot types combine (ARCHITECTURE
//! decisions 1 and 2). The order between slots is partial: `a <= b` means every slot of `a` fits
//! in `b`, and both `a <= b` and `b <= a` may be false.

mod parse;
mod registry;
mod value;

use std::{collections::BTreeMap, fmt, str::FromStr};

use serde::{Deserialize, Serialize};

pub use parse::{ParseError, default_kind, parse_value};
pub use registry::{RegistryError, SlotTypeRegistry};
pub use value::{SCALE, SlotValue, ValueError};

/// Well-known slot names.
pub mod names {
    /// CPU cores.
    pub const CPU: &str = "cpu";
    /// Host memory, bytes.
    pub const MEM: &str = "mem";
    /// Fractional GPU shares.
    pub const CUDA_SHARES: &str = "cuda.shares";
    /// Whole, exclusive GPUs.
    pub const CUDA_DEVICE: &str = "cuda.device";
    /// GPU memory, bytes.
    pub const CUDA_MEM: &str = "cuda.mem";
}

/// How a slot's values are read and compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotKind {
    /// A quantity, possibly fractional.
    Count,
    /// A number of bytes (whole; accepts unit suffixes).
    Bytes,
    /// Held only whole and alone: requested as 1.
    Unique,
}

impl SlotKind {
    /// Stable name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Count => "count",
            Self::Bytes => "bytes",
            Self::Unique => "unique",
        }
    }
}

impl fmt::Display for SlotKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A slot name: lowercase letters, digits, `.`, `_` and `-`, starting with a letter.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SlotName(String);

/// A slot name that isn't one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid slot name {name:?}: use lowercase letters, digits, '.', '_' and '-', starting with a letter"
)]
pub struct InvalidSlotName {
    /// The name.
    pub name: String,
}

impl SlotName {
    /// Checks `name`.
    ///
    /// # Errors
    /// It has other characters or doesn't start with a letter.
    pub fn new(name: &str) -> Result<Self, InvalidSlotName> {
        let ok = name.len() <= 64
            && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
            && name.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
            });
        if ok {
            Ok(Self(name.to_owned()))
        } else {
            Err(InvalidSlotName {
                name: name.to_owned(),
            })
        }
    }

    /// The name.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SlotName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for SlotName {
    type Err = InvalidSlotName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for SlotName {
    type Error = InvalidSlotName;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(&s)
    }
}

impl From<SlotName> for String {
    fn from(n: SlotName) -> Self {
        n.0
    }
}

/// Slot values by name; absent names are zero. Zeros are never stored, so equal slots compare
/// equal whichever names they spell out.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ResourceSlot(BTreeMap<SlotName, SlotValue>);

/// A subtraction that would go below zero.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{slot}: {have} - {take} is negative")]
pub struct Underflow {
    /// The slot.
    pub slot: SlotName,
    /// What there was.
    pub have: SlotValue,
    /// What was taken.
    pub take: SlotValue,
}

impl ResourceSlot {
    /// The empty (all-zero) slot.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of `name` (zero when absent).
    #[must_use]
    pub fn get(&self, name: &str) -> SlotValue {
        SlotName::new(name)
            .ok()
            .and_then(|n| self.0.get(&n).copied())
            .unwrap_or_default()
    }

    /// Sets `name` (removing it when zero).
    pub fn set(&mut self, name: SlotName, value: SlotValue) {
        if value.is_zero() {
            self.0.remove(&name);
        } else {
            self.0.insert(name, value);
        }
    }

    /// Builder form of [`Self::set`] for well-formed names.
    ///
    /// # Panics
    /// If `name` is not a valid slot name (a programming error).
    #[must_use]
    pub fn with(mut self, name: &str, value: SlotValue) -> Self {
        #[allow(clippy::expect_used)]
        self.set(SlotName::new(name).expect("a valid slot name"), value);
        self
    }

    /// The non-zero entries, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&SlotName, SlotValue)> {
        self.0.iter().map(|(k, v)| (k, *v))
    }

    /// Whether every slot is zero.
    #[must_use]
    pub fn is_zero(&self) -> bool {
        self.0.is_empty()
    }

    /// `self + other`, `None` on overflow.
    #[must_use]
    pub fn checked_add(&self, other: &Self) -> Option<Self> {
        let mut out = self.clone();
        for (k, v) in &other.0 {
            let sum = out.0.get(k).copied().unwrap_or_default().checked_add(*v)?;
            out.0.insert(k.clone(), sum);
        }
        Some(out)
    }

    /// `self - other`.
    ///
    /// # Errors
    /// A slot of `other` is larger than the same slot of `self`.
    pub fn checked_sub(&self, other: &Self) -> Result<Self, Underflow> {
        let mut out = self.clone();
        for (k, v) in &other.0 {
            let have = out.0.get(k).copied().unwrap_or_default();
            let diff = have.checked_sub(*v).ok_or_else(|| Underflow {
                slot: k.clone(),
                have,
                take: *v,
            })?;
            out.set(k.clone(), diff);
        }
        Ok(out)
    }

    /// `self - other`, each slot floored at zero.
    #[must_use]
    pub fn saturating_sub(&self, other: &Self) -> Self {
        let mut out = self.clone();
        for (k, v) in &other.0 {
            let have = out.0.get(k).copied().unwrap_or_default();
            out.set(k.clone(), have.saturating_sub(*v));
        }
        out
    }

    /// Whether every slot of `self` fits in the same slot of `other`.
    #[must_use]
    pub fn fits_in(&self, other: &Self) -> bool {
        self.0
            .iter()
            .all(|(k, v)| *v <= other.0.get(k).copied().unwrap_or_default())
    }
}

impl PartialOrd for ResourceSlot {
    /// The partial order of [`Self::fits_in`]: `None` when neither fits in the other.
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        match (self.fits_in(other), other.fits_in(self)) {
            (true, true) => Some(std::cmp::Ordering::Equal),
            (true, false) => Some(std::cmp::Ordering::Less),
            (false, true) => Some(std::cmp::Ordering::Greater),
            (false, false) => None,
        }
    }
}

impl fmt::Display for ResourceSlot {
    /// `name=value` pairs, comma-separated, bytes in their largest exact binary unit.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (k, v) in &self.0 {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            write!(f, "{k}=")?;
            if default_kind(k.as_str()) == SlotKind::Bytes {
                f.write_str(&parse::format_bytes(*v))?;
            } else {
                write!(f, "{v}")?;
            }
        }
        Ok(())
    }
}

impl FromIterator<(SlotName, SlotValue)> for ResourceSlot {
    fn from_iter<I: IntoIterator<Item = (SlotName, SlotValue)>>(iter: I) -> Self {
        let mut out = Self::new();
        for (k, v) in iter {
            out.set(k, v);
        }
        out
    }
}

#[cfg(test)]
mod tests;
