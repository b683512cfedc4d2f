//! [`SlotValue`]: an exact, non-negative fixed-point quantity.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

/// Fractional digits a value keeps: micro-units, so a share of 0.000001 is exact.
pub const SCALE_DIGITS: u32 = 6;
/// `10^SCALE_DIGITS`: the micro-units in one unit.
pub const SCALE: u128 = 1_000_000;

/// An exact non-negative quantity with six fractional digits, stored as a `u128` of micro-units.
///
/// Never a float: `0.2 + 0.4 == 0.6` holds exactly. One scale serves every kind: shares keep
/// six decimals (the allocator's quantum is 0.01 by default), and whole bytes are exact up to
/// about 3.4 × 10^32 — far past exabytes (2^60 bytes is 1.2 × 10^24 micro-units).
///
/// It serializes as its decimal text (`"0.2"`), so stored values stay exact in any format.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(into = "String", try_from = "String")]
pub struct SlotValue(u128);

/// Why a number doesn't parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// Not a plain decimal number (no sign, no exponent).
    #[error("{text:?} is not a decimal number")]
    NotANumber {
        /// The text.
        text: String,
    },
    /// More fractional digits than a value keeps.
    #[error("{text:?} has more than {SCALE_DIGITS} fractional digits")]
    TooPrecise {
        /// The text.
        text: String,
    },
    /// Larger than a value holds.
    #[error("{text:?} is too large")]
    TooLarge {
        /// The text.
        text: String,
    },
}

impl SlotValue {
    /// Zero.
    pub const ZERO: Self = Self(0);
    /// One.
    pub const ONE: Self = Self(SCALE);
    /// The largest value.
    pub const MAX: Self = Self(u128::MAX);

    /// A value from micro-units.
    #[must_use]
    pub const fn from_micros(micros: u128) -> Self {
        Self(micros)
    }

    /// The value in micro-units.
    #[must_use]
    pub const fn micros(self) -> u128 {
        self.0
    }

    /// The value in units as a float: for gauges, scores and reports, never for accounting
    /// (floats lose the exactness the slots keep).
    #[must_use]
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / SCALE as f64
    }

    /// A whole number (a count, or bytes).
    #[must_use]
    pub const fn from_int(n: u64) -> Self {
        // u64::MAX × 10^6 < u128::MAX: never overflows.
        Self(n as u128 * SCALE)
    }

    /// Whether it is zero.
    #[must_use]
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Whether it has no fractional part.
    #[must_use]
    pub const fn is_integer(self) -> bool {
        self.0.is_multiple_of(SCALE)
    }

    /// The integer part.
    #[must_use]
    pub const fn trunc(self) -> u128 {
        self.0 / SCALE
    }

    /// The value as a whole `u64` (bytes, device counts), `None` if fractional or too large.
    #[must_use]
    pub fn to_u64(self) -> Option<u64> {
        if self.is_integer() {
            u64::try_from(self.trunc()).ok()
        } else {
            None
        }
    }

    /// `self + other`, `None` on overflow.
    #[must_use]
    pub const fn checked_add(self, other: Self) -> Option<Self> {
        match self.0.checked_add(other.0) {
            Some(v) => Some(Self(v)),
            None => None,
        }
    }

    /// `self - other`, `None` if it would be negative.
    #[must_use]
    pub const fn checked_sub(self, other: Self) -> Option<Self> {
        match self.0.checked_sub(other.0) {
            Some(v) => Some(Self(v)),
            None => None,
        }
    }

    /// `self + other`, [`Self::MAX`] on overflow.
    #[must_use]
    pub const fn saturating_add(self, other: Self) -> Self {
        Self(self.0.saturating_add(other.0))
    }

    /// `self - other`, zero if it would be negative.
    #[must_use]
    pub const fn saturating_sub(self, other: Self) -> Self {
        Self(self.0.saturating_sub(other.0))
    }

    /// Rounds down to a multiple of `quantum` (a zero quantum leaves the value as it is).
    #[must_use]
    pub const fn floor_to(self, quantum: Self) -> Self {
        match self.0.checked_div(quantum.0) {
            Some(n) => Self(n * quantum.0),
            None => self,
        }
    }

    /// Whether it is a whole multiple of `quantum` (anything is, of a zero quantum).
    #[must_use]
    pub const fn is_multiple_of(self, quantum: Self) -> bool {
        quantum.0 == 0 || self.0.is_multiple_of(quantum.0)
    }

    /// Parses a plain decimal number (`1`, `0.25`, `.5`) times `multiplier` (e.g. 2^30 for
    /// `g`), exactly: `1.5` × 2^30 is whole, `0.3` × 2^10 is 307.2.
    ///
    /// # Errors
    /// Not a number, more than six fractional digits after scaling, or too large.
    pub fn parse_scaled(text: &str, multiplier: u128) -> Result<Self, ValueError> {
        let not_a_number = || ValueError::NotANumber {
            text: text.to_owned(),
        };
        let too_large = || ValueError::TooLarge {
            text: text.to_owned(),
        };
        let too_precise = || ValueError::TooPrecise {
            text: text.to_owned(),
        };
        let (int, frac) = text.split_once('.').unwrap_or((text, ""));
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        // `.5` is a number; `.`, `1.` and `` are not.
        if int.is_empty() && frac.is_empty() || text.ends_with('.') || !digits(int) || !digits(frac)
        {
            return Err(not_a_number());
        }
        // Trailing zeros add nothing; past 38 digits a fraction can't land on a micro-unit
        // for any multiplier we use.
        let frac = frac.trim_end_matches('0');
        let frac_digits = u32::try_from(frac.len()).map_err(|_| too_precise())?;
        let denominator = 10u128.checked_pow(frac_digits).ok_or_else(too_precise)?;
        let int_part: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| too_large())?
        };
        let frac_part: u128 = if frac.is_empty() {
            0
        } else {
            frac.parse().map_err(|_| too_precise())?
        };
        // The exact rational int.frac × multiplier × SCALE / 10^digits must be whole.
        let scaled_frac = frac_part
            .checked_mul(multiplier)
            .and_then(|v| v.checked_mul(SCALE))
            .ok_or_else(too_precise)?;
        if !scaled_frac.is_multiple_of(denominator) {
            return Err(too_precise());
        }
        int_part
            .checked_mul(multiplier)
            .and_then(|v| v.checked_mul(SCALE))
            .and_then(|v| v.checked_add(scaled_frac / denominator))
            .map(Self)
            .ok_or_else(too_large)
    }
}

impl fmt::Display for SlotValue {
    /// The shortest exact decimal: `0.2`, `1`, `8589934592`; it parses back to the same value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let int = self.0 / SCALE;
        let frac = self.0 % SCALE;
        if frac == 0 {
            return write!(f, "{int}");
        }
        let mut digits = SCALE_DIGITS as usize;
        let mut frac = frac;
        while frac.is_multiple_of(10) {
            frac /= 10;
            digits -= 1;
        }
        write!(f, "{int}.{frac:0digits$}")
    }
}

impl FromStr for SlotValue {
    type Err = ValueError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_scaled(s, 1)
    }
}

impl From<SlotValue> for String {
    fn from(v: SlotValue) -> Self {
        v.to_string()
    }
}

impl TryFrom<String> for SlotValue {
    type Error = ValueError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}
