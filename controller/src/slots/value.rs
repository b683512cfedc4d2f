//! [`SlotValue`]: an exact, non-negative fixed-point quantity.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

/// Fractional digits a value keeps: micro-units, so a share of 0.000001 is exact.
pub const SCALE_DIGITS: u32 = 6;
/// `10^SCALE_DIGITS`.
pub const SCALE: u128 = 1_000_000;

/// An exact non-negative quantity with six fractional digits, stored as micro-units.
///
/// Never a float: `0.2 + 0.4 == 0.6` holds exactly. Bytes are whole numbers of micro-units
/// times [`SCALE`], up to about 3.4 × 10^32.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(into = "String", try_from = "String")]
pub struct SlotValue(u128);

/// Why a number doesn't parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// Not a decimal number.
    #[error("{text:?} is not a number")]
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

    /// A whole number.
    #[must_use]
    pub const fn from_int(n: u64) -> Self {
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

    /// Parses a plain decimal number, scaled by `multiplier` (e.g. 2^30 for `g`).
    ///
    /// # Errors
    /// Not a number, too many fractional digits after scaling, or too large.
    pub fn parse_scaled(text: &str, multiplier: u128) -> Result<Self, ValueError> {
        let not_a_number = || ValueError::NotANumber {
            text: text.to_owned(),
        };
        let too_large = || ValueError::TooLarge {
            text: text.to_owned(),
        };
        let (int, frac) = text.split_once('.').unwrap_or((text, ""));
        let digits_ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if (int.is_empty() && frac.is_empty()) || !digits_ok(int) || !digits_ok(frac) {
            return Err(not_a_number());
        }
        if text.ends_with('.') {
            return Err(not_a_number());
        }
        // Exact rational int.frac × multiplier, then it must land on a micro-unit.
        let int_part: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| too_large())?
        };
        let frac_digits = u32::try_from(frac.len()).map_err(|_| too_large())?;
        let frac_part: u128 = if frac.is_empty() {
            0
        } else {
            frac.parse().map_err(|_| too_large())?
        };
        let denominator = 10u128.checked_pow(frac_digits).ok_or_else(too_large)?;
        let numerator = int_part
            .checked_mul(denominator)
            .and_then(|v| v.checked_add(frac_part))
            .and_then(|v| v.checked_mul(multiplier))
            .and_then(|v| v.checked_mul(SCALE))
            .ok_or_else(too_large)?;
        if numerator % denominator != 0 {
            return Err(ValueError::TooPrecise {
                text: text.to_owned(),
            });
        }
        Ok(Self(numerator / denominator))
    }
}

impl fmt::Display for SlotValue {
    /// The shortest exact decimal: `0.2`, `1`, `8589934592`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let int = self.0 / SCALE;
        let frac = self.0 % SCALE;
        if frac == 0 {
            return write!(f, "{int}");
        }
        let digits = format!("{frac:06}");
        write!(f, "{int}.{}", digits.trim_end_matches('0'))
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
