//! Byte sizes as people type them, following Backend.AI's `BinarySize` (docs/slots.md).
//!
//! ```text
//! <size>   ::= <number> <spaces>? <unit>
//! <number> ::= <digits> | <digits> "." <digits> | "." <digits>
//! <digits> ::= digits, with "_" allowed between two of them (11_021_204)
//! <unit>   ::= "" | "b" | "byte" | "bytes"
//!            | <scale> "i"? ("" | "b" | "byte" | "bytes")      (any case)
//! <scale>  ::= k | m | g | t | p | e                           (2^10 … 2^60)
//! ```
//!
//! Every scale is binary, as in Backend.AI: `1k`, `1 KiB`, `1KB` and `2 KiBytes` are 1024 and
//! 2048 bytes. A size must come out a whole number of bytes: where Backend.AI truncates
//! (`1.1k` is 1126 there, `124.32 KiB` 127303), gpuwarden refuses and names the exact value and
//! the nearest whole one, so what a user wrote is what is enforced.

use super::{SCALE, SlotValue};

/// Digits a number may have at most (`u128` holds 38).
const MAX_DIGITS: usize = 38;

/// Scales by letter: binary, 2^10 to 2^60.
const SCALES: [(u8, u32); 6] = [
    (b'k', 10),
    (b'm', 20),
    (b'g', 30),
    (b't', 40),
    (b'p', 50),
    (b'e', 60),
];

/// Why a byte size doesn't parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BytesError {
    /// No number, or not a plain decimal one (no sign, no exponent).
    #[error("not a decimal number")]
    NotANumber,
    /// A suffix that is no unit.
    #[error(
        "unknown unit suffix {suffix:?} (use k, m, g, t, p or e, optionally followed by i, b or ib)"
    )]
    UnknownSuffix {
        /// The suffix as typed.
        suffix: String,
    },
    /// A fraction of a byte: refused, not rounded.
    #[error("not a whole number of bytes ({exact} bytes; the nearest whole number is {nearest})")]
    Fractional {
        /// The exact value, in bytes, as a decimal.
        exact: String,
        /// The nearest whole number of bytes (halves up).
        nearest: u128,
    },
    /// Larger than a value holds.
    #[error("too large")]
    TooLarge,
}

/// Parses a byte size (`512m`, `1.5Gi`, `1 KiB`, `2 KiBytes`, `12_345 bytes`) exactly.
///
/// Fractional bytes are refused rather than rounded: `1.1k` is 1126.4 bytes, and the error
/// names that and 1126 (Backend.AI would take 1126; a limit that isn't what was typed is
/// refused here instead). `text` is taken as given: no surrounding spaces.
///
/// # Errors
/// Not a number, an unknown unit, not a whole number of bytes, or too large.
pub fn parse_bytes(text: &str) -> Result<SlotValue, BytesError> {
    let number_len = text
        .bytes()
        .position(|b| !(b.is_ascii_digit() || b == b'.' || b == b'_'))
        .unwrap_or(text.len());
    let (number, rest) = text.split_at(number_len);
    let unit = rest.trim_start_matches(' ');
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty()
        || number.ends_with('.')
        || !well_grouped(int)
        || !well_grouped(frac)
    {
        return Err(BytesError::NotANumber);
    }
    let shift = unit_shift(unit).ok_or_else(|| BytesError::UnknownSuffix {
        suffix: unit.to_owned(),
    })?;
    let int: String = int.chars().filter(|c| *c != '_').collect();
    let frac: String = frac.chars().filter(|c| *c != '_').collect();
    // Leading zeros and trailing fractional zeros carry nothing.
    let int = int.trim_start_matches('0');
    let frac = frac.trim_end_matches('0');
    if int.len() + frac.len() > MAX_DIGITS {
        return Err(BytesError::TooLarge);
    }
    let digits = format!("{int}{frac}");
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| BytesError::TooLarge)?
    };
    // value = mantissa × 2^shift / 10^frac.len(), exactly.
    let frac_digits = u32::try_from(frac.len()).map_err(|_| BytesError::TooLarge)?;
    let denominator = 10u128
        .checked_pow(frac_digits)
        .ok_or(BytesError::TooLarge)?;
    let numerator = mantissa
        .checked_mul(1u128 << shift)
        .ok_or(BytesError::TooLarge)?;
    let (whole, rest) = (numerator / denominator, numerator % denominator);
    if rest != 0 {
        // rest < denominator ≤ 10^38, so 2 × rest fits.
        let nearest = whole + u128::from(2 * rest >= denominator);
        let exact = format!("{whole}.{rest:0width$}", width = frac.len());
        return Err(BytesError::Fractional {
            exact: exact.trim_end_matches('0').to_owned(),
            nearest,
        });
    }
    whole
        .checked_mul(SCALE)
        .map(SlotValue::from_micros)
        .ok_or(BytesError::TooLarge)
}

/// Whether `digits` is digits with `_` only between two of them (empty is fine).
fn well_grouped(digits: &str) -> bool {
    let bytes = digits.as_bytes();
    bytes.iter().enumerate().all(|(i, b)| {
        b.is_ascii_digit()
            || *b == b'_'
                && i > 0
                && bytes[i - 1].is_ascii_digit()
                && bytes.get(i + 1).is_some_and(u8::is_ascii_digit)
    })
}

/// The power of two a unit stands for, if it is one.
fn unit_shift(unit: &str) -> Option<u32> {
    let lower = unit.to_ascii_lowercase();
    let bytes_word = |s: &str| matches!(s, "" | "b" | "byte" | "bytes");
    if bytes_word(&lower) {
        return Some(0);
    }
    let (&letter, rest) = lower.as_bytes().split_first()?;
    let (_, shift) = SCALES.iter().find(|(scale, _)| *scale == letter)?;
    let rest = std::str::from_utf8(rest).ok()?;
    let rest = rest.strip_prefix('i').unwrap_or(rest);
    bytes_word(rest).then_some(*shift)
}

#[cfg(test)]
mod tests;
