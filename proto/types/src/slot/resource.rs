//! [`ResourceSlot`]: slot values by name, absent names zero.

use std::{
    cmp::Ordering,
    collections::BTreeMap,
    fmt,
    ops::{Add, Sub},
};

use serde::{Deserialize, Serialize};

use super::{SlotName, SlotValue, format::format_value};

/// Slot values by name; a name that is absent is zero.
///
/// Zeros are never stored (setting, subtracting or deserializing a zero drops the key), so two
/// slots that agree on every value are equal whichever names they spell out.
///
/// The order is partial: `a <= b` means every slot of `a` fits in the same slot of `b`, and both
/// `a <= b` and `b <= a` may be false (`cpu=1` against `cuda.shares=0.5`); `partial_cmp` is
/// then `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "BTreeMap<SlotName, SlotValue>")]
pub struct ResourceSlot(BTreeMap<SlotName, SlotValue>);

/// Arithmetic on slots that has no exact answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArithmeticError {
    /// A subtraction would go below zero (it never wraps or clamps).
    #[error("slot {slot}: {have} - {take} is negative")]
    Underflow {
        /// The slot.
        slot: SlotName,
        /// What there was.
        have: SlotValue,
        /// What was taken.
        take: SlotValue,
    },
    /// A sum larger than a value holds.
    #[error("slot {slot}: {left} + {right} overflows")]
    Overflow {
        /// The slot.
        slot: SlotName,
        /// The left operand's value.
        left: SlotValue,
        /// The right operand's value.
        right: SlotValue,
    },
}

impl ResourceSlot {
    /// The empty (all-zero) slot.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of `name` (zero when absent). Doesn't allocate.
    #[must_use]
    pub fn get(&self, name: &str) -> SlotValue {
        self.0.get(name).copied().unwrap_or_default()
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
        #[expect(clippy::expect_used, reason = "a programming error, not input")]
        self.set(SlotName::new(name).expect("a valid slot name"), value);
        self
    }

    /// The non-zero entries, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&SlotName, SlotValue)> {
        self.0.iter().map(|(k, v)| (k, *v))
    }

    /// How many slots are non-zero.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether every slot is zero.
    #[must_use]
    pub fn is_zero(&self) -> bool {
        self.0.is_empty()
    }

    /// Same as [`Self::is_zero`].
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `self + other`.
    ///
    /// # Errors
    /// A slot's sum overflows (over 3.4 × 10^32 units).
    pub fn try_add(&self, other: &Self) -> Result<Self, ArithmeticError> {
        let mut out = self.clone();
        for (k, v) in &other.0 {
            let have = out.get(k.as_str());
            let sum = have
                .checked_add(*v)
                .ok_or_else(|| ArithmeticError::Overflow {
                    slot: k.clone(),
                    left: have,
                    right: *v,
                })?;
            out.0.insert(k.clone(), sum);
        }
        Ok(out)
    }

    /// `self + other`, `None` on overflow.
    #[must_use]
    pub fn checked_add(&self, other: &Self) -> Option<Self> {
        self.try_add(other).ok()
    }

    /// `self - other`.
    ///
    /// # Errors
    /// A slot of `other` is larger than the same slot of `self` ([`ArithmeticError::Underflow`]
    /// names the first).
    pub fn checked_sub(&self, other: &Self) -> Result<Self, ArithmeticError> {
        let mut out = self.clone();
        for (k, v) in &other.0 {
            let have = out.get(k.as_str());
            let diff = have
                .checked_sub(*v)
                .ok_or_else(|| ArithmeticError::Underflow {
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
            let have = out.get(k.as_str());
            out.set(k.clone(), have.saturating_sub(*v));
        }
        out
    }

    /// Whether every slot of `self` fits in the same slot of `other` (`self <= other`).
    /// Doesn't allocate.
    #[must_use]
    pub fn fits_in(&self, other: &Self) -> bool {
        self.0.iter().all(|(k, v)| *v <= other.get(k.as_str()))
    }
}

impl PartialOrd for ResourceSlot {
    /// The partial order of [`ResourceSlot::fits_in`]: `None` when neither fits in the other.
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        match (self.fits_in(other), other.fits_in(self)) {
            (true, true) => Some(Ordering::Equal),
            (true, false) => Some(Ordering::Less),
            (false, true) => Some(Ordering::Greater),
            (false, false) => None,
        }
    }
}

impl Add for &ResourceSlot {
    type Output = Result<ResourceSlot, ArithmeticError>;

    /// [`ResourceSlot::try_add`]: `(&a + &b)?`.
    fn add(self, other: Self) -> Self::Output {
        self.try_add(other)
    }
}

impl Sub for &ResourceSlot {
    type Output = Result<ResourceSlot, ArithmeticError>;

    /// [`ResourceSlot::checked_sub`]: `(&a - &b)?`, an error rather than a negative value.
    fn sub(self, other: Self) -> Self::Output {
        self.checked_sub(other)
    }
}

impl fmt::Display for ResourceSlot {
    /// `name=value` pairs, comma-separated, in name order; `mem` and `cuda.mem` in their
    /// shortest exact spelling with binary units (`mem=1.5g`), everything else as a plain
    /// decimal. Each pair parses back to the same value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{k}={}", format_value(k.as_str(), *v))?;
        }
        Ok(())
    }
}

impl FromIterator<(SlotName, SlotValue)> for ResourceSlot {
    /// Later values for the same name replace earlier ones; zeros are dropped.
    fn from_iter<I: IntoIterator<Item = (SlotName, SlotValue)>>(iter: I) -> Self {
        let mut out = Self::new();
        for (k, v) in iter {
            out.set(k, v);
        }
        out
    }
}

impl From<BTreeMap<SlotName, SlotValue>> for ResourceSlot {
    fn from(map: BTreeMap<SlotName, SlotValue>) -> Self {
        map.into_iter().collect()
    }
}
