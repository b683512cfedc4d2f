//! Kubernetes resource quantities (`500m`, `0.5`, `8Gi`, `1e9`), parsed exactly.
//!
//! The grammar is the API's own (`k8s.io/apimachinery/pkg/api/resource`, quantity.go):
//!
//! ```text
//! <quantity>        ::= <signedNumber><suffix>
//! <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
//! <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
//! <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
//! <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>
//! <signedNumber>    ::= <sign><number>     (sign: "+", "-" or none)
//! <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
//! ```
//!
//! A value comes out in micro-units (six fractional digits, the scale of
//! [`crate::slot::SlotValue`]), never through a float: `0.1` is exactly 100 000 micro-units and
//! `1.5Gi` is exactly 1 610 612 736 units. A quantity finer than a micro-unit (`1n`,
//! `0.0000001`) is refused rather than rounded, so what a user wrote is what is enforced. The
//! agent (claim capacities) and the controller (pod limits) read quantities with this one parser.
//!
//! # Example
//!
//! ```
//! use gpuwarden_types::quantity::Quantity;
//!
//! assert_eq!(Quantity::parse("500m")?.micros(), 500_000);
//! assert_eq!(Quantity::parse("8Gi")?.whole(), Some(8 << 30));
//! assert_eq!(Quantity::parse("1e3")?.whole(), Some(1000));
//! assert!(Quantity::parse("-1")?.is_negative());
//! assert!(Quantity::parse("1.5 Gi").is_err());
//! # Ok::<(), gpuwarden_types::quantity::QuantityError>(())
//! ```

use std::fmt;

/// Micro-units in one unit.
const MICROS: u128 = 1_000_000;
/// Digits of a number accepted at most (u128 holds 38): longer is refused, not truncated.
const MAX_DIGITS: usize = 30;

/// A quantity, exactly, in micro-units with its sign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    negative: bool,
    micros: u128,
}

/// Why a quantity doesn't parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not the grammar above.
    #[error("{text:?} is not a Kubernetes quantity (e.g. 0.5, 500m, 8Gi, 1e9)")]
    Malformed {
        /// The text as given.
        text: String,
    },
    /// Not a suffix the API knows.
    #[error(
        "{text:?} has an unknown suffix {suffix:?} (n, u, m, k, M, G, T, P, E, Ki … Ei, or e<exponent>)"
    )]
    UnknownSuffix {
        /// The text as given.
        text: String,
        /// The suffix.
        suffix: String,
    },
    /// Finer than a micro-unit.
    #[error("{text:?} is finer than 0.000001")]
    TooPrecise {
        /// The text as given.
        text: String,
    },
    /// Larger than held exactly.
    #[error("{text:?} is too large")]
    TooLarge {
        /// The text as given.
        text: String,
    },
}

impl Quantity {
    /// Zero.
    pub const ZERO: Self = Self {
        negative: false,
        micros: 0,
    };

    /// Parses `text` exactly (no surrounding spaces, as the API accepts it).
    ///
    /// # Errors
    /// Not the grammar, an unknown suffix, finer than a micro-unit, or too large.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let malformed = || QuantityError::Malformed {
            text: text.to_owned(),
        };
        let too_large = || QuantityError::TooLarge {
            text: text.to_owned(),
        };
        let (negative, rest) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let number_len = rest
            .bytes()
            .position(|b| !(b.is_ascii_digit() || b == b'.'))
            .unwrap_or(rest.len());
        let (number, suffix) = rest.split_at(number_len);
        let (int, frac) = number.split_once('.').unwrap_or((number, ""));
        // `1.` and `.5` are numbers; `.` and `` are not; one point at most.
        if int.is_empty() && frac.is_empty() || frac.contains('.') {
            return Err(malformed());
        }
        let (ten, two) = exponents(text, suffix)?;
        // Leading zeros carry nothing, trailing fractional zeros neither.
        let int = int.trim_start_matches('0');
        let frac = frac.trim_end_matches('0');
        if int.len() + frac.len() > MAX_DIGITS {
            return Err(too_large());
        }
        let digits = format!("{int}{frac}");
        let mantissa: u128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| too_large())?
        };
        // value = mantissa × 10^(ten − frac.len()) × 2^two; in micro-units, × 10^6.
        let frac_len = i32::try_from(frac.len()).map_err(|_| too_large())?;
        let power = ten + 6 - frac_len;
        let scaled = mantissa
            .checked_mul(2u128.checked_pow(two).ok_or_else(too_large)?)
            .ok_or_else(too_large)?;
        let micros = if power >= 0 {
            let factor = 10u128
                .checked_pow(power.unsigned_abs())
                .ok_or_else(too_large)?;
            scaled.checked_mul(factor).ok_or_else(too_large)?
        } else {
            let too_precise = || QuantityError::TooPrecise {
                text: text.to_owned(),
            };
            let divisor = 10u128
                .checked_pow(power.unsigned_abs())
                .ok_or_else(too_precise)?;
            if !scaled.is_multiple_of(divisor) {
                return Err(too_precise());
            }
            scaled / divisor
        };
        Ok(Self {
            negative: negative && micros != 0,
            micros,
        })
    }

    /// The magnitude in micro-units.
    #[must_use]
    pub const fn micros(self) -> u128 {
        self.micros
    }

    /// Whether it is below zero.
    #[must_use]
    pub const fn is_negative(self) -> bool {
        self.negative
    }

    /// Whether it is zero.
    #[must_use]
    pub const fn is_zero(self) -> bool {
        self.micros == 0
    }

    /// The value as a whole non-negative `u64` (bytes), `None` if negative, fractional or too
    /// large.
    #[must_use]
    pub fn whole(self) -> Option<u64> {
        if self.negative || !self.micros.is_multiple_of(MICROS) {
            return None;
        }
        u64::try_from(self.micros / MICROS).ok()
    }

    /// The value as a whole non-negative `u64`, a fraction rounded up (as the API server rounds
    /// byte quantities), `None` if negative or too large.
    #[must_use]
    pub fn whole_ceil(self) -> Option<u64> {
        if self.negative {
            return None;
        }
        u64::try_from(self.micros.div_ceil(MICROS)).ok()
    }

    /// The value in micro-units as a non-negative `u64` (a share of `500m` is 500,000), `None` if
    /// negative or too large.
    #[must_use]
    pub fn micros_u64(self) -> Option<u64> {
        if self.negative {
            return None;
        }
        u64::try_from(self.micros).ok()
    }
}

impl fmt::Display for Quantity {
    /// The shortest exact decimal (`0.5`, `8589934592`, `-1`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.negative { "-" } else { "" };
        let int = self.micros / MICROS;
        let mut frac = self.micros % MICROS;
        if frac == 0 {
            return write!(f, "{sign}{int}");
        }
        let mut width = 6;
        while frac.is_multiple_of(10) {
            frac /= 10;
            width -= 1;
        }
        write!(f, "{sign}{int}.{frac:0width$}")
    }
}

/// The decimal and binary exponents a suffix stands for.
fn exponents(text: &str, suffix: &str) -> Result<(i32, u32), QuantityError> {
    let unknown = || QuantityError::UnknownSuffix {
        text: text.to_owned(),
        suffix: suffix.to_owned(),
    };
    let known = match suffix {
        "" => Some((0, 0)),
        "n" => Some((-9, 0)),
        "u" => Some((-6, 0)),
        "m" => Some((-3, 0)),
        "k" => Some((3, 0)),
        "M" => Some((6, 0)),
        "G" => Some((9, 0)),
        "T" => Some((12, 0)),
        "P" => Some((15, 0)),
        "E" => Some((18, 0)),
        "Ki" => Some((0, 10)),
        "Mi" => Some((0, 20)),
        "Gi" => Some((0, 30)),
        "Ti" => Some((0, 40)),
        "Pi" => Some((0, 50)),
        "Ei" => Some((0, 60)),
        _ => None,
    };
    if let Some(known) = known {
        return Ok(known);
    }
    // `e<signedNumber>` / `E<signedNumber>`: a whole exponent (the API refuses fractions here).
    let exponent = suffix
        .strip_prefix('e')
        .or_else(|| suffix.strip_prefix('E'))
        .ok_or_else(unknown)?;
    let digits = exponent
        .strip_prefix('-')
        .or_else(|| exponent.strip_prefix('+'))
        .unwrap_or(exponent);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 3 {
        return Err(unknown());
    }
    exponent
        .parse::<i32>()
        .map(|e| (e, 0))
        .map_err(|_| unknown())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn micros(text: &str) -> u128 {
        Quantity::parse(text)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .micros()
    }

    #[test]
    fn decimal_si_binary_si_and_exponents_are_exact() {
        assert_eq!(micros("0.5"), 500_000);
        assert_eq!(micros("500m"), 500_000);
        assert_eq!(micros(".5"), 500_000);
        assert_eq!(micros("1."), 1_000_000);
        assert_eq!(micros("+1"), 1_000_000);
        assert_eq!(micros("250000u"), 250_000);
        assert_eq!(micros("1000n"), 1);
        assert_eq!(micros("1k"), 1_000_000_000);
        assert_eq!(micros("8G"), 8_000_000_000_000_000);
        assert_eq!(micros("8Gi"), (8u128 << 30) * 1_000_000);
        assert_eq!(micros("0.5Gi"), (1u128 << 29) * 1_000_000);
        assert_eq!(micros("1.5Ki"), 1536 * 1_000_000);
        assert_eq!(micros("1e3"), 1_000_000_000);
        assert_eq!(micros("1E3"), 1_000_000_000);
        assert_eq!(micros("5e-1"), 500_000);
        assert_eq!(micros("1E"), 10u128.pow(24));
        assert_eq!(micros("1Ei"), (1u128 << 60) * 1_000_000);
        assert_eq!(micros("000.2500"), 250_000);
        assert_eq!(micros("0"), 0);
        assert!(!Quantity::parse("-0").expect("parses").is_negative());
        assert!(Quantity::parse("-500m").expect("parses").is_negative());
    }

    #[test]
    fn whole_bytes_only_when_whole() {
        assert_eq!(
            Quantity::parse("8Gi").expect("parses").whole(),
            Some(8 << 30)
        );
        assert_eq!(Quantity::parse("100m").expect("parses").whole(), None);
        assert_eq!(Quantity::parse("-1").expect("parses").whole(), None);
        assert_eq!(
            Quantity::parse("1Ei").expect("parses").whole(),
            Some(1 << 60)
        );
        assert_eq!(Quantity::parse("16Ei").expect("parses").whole(), None);
        let ceil = |t: &str| Quantity::parse(t).expect("parses").whole_ceil();
        assert_eq!(ceil("1500m"), Some(2));
        assert_eq!(ceil("1.5Gi"), Some(3 << 29));
        assert_eq!(ceil("-1"), None);
        let micros = |t: &str| Quantity::parse(t).expect("parses").micros_u64();
        assert_eq!(micros("500m"), Some(500_000));
        assert_eq!(micros("5e-1"), Some(500_000));
        assert_eq!(micros("-1"), None);
        assert_eq!(micros("1Ei"), None);
    }

    #[test]
    fn malformed_unknown_and_too_precise_are_refused() {
        for text in [
            "", ".", "-", "1.2.3", "abc", "1 Gi", " 1", "0x10", "--1", "1..5",
        ] {
            assert!(Quantity::parse(text).is_err(), "{text:?} parsed");
        }
        for text in [
            "1gi", "1g", "1KI", "1Kb", "1e", "1e1.5", "1ee2", "1e1000", "1i",
        ] {
            assert!(
                matches!(
                    Quantity::parse(text),
                    Err(QuantityError::UnknownSuffix { .. })
                ),
                "{text:?}: {:?}",
                Quantity::parse(text)
            );
        }
        for text in ["1n", "0.0000001", "1e-7"] {
            assert!(
                matches!(Quantity::parse(text), Err(QuantityError::TooPrecise { .. })),
                "{text:?}"
            );
        }
        for text in [
            "1e100",
            "99999999999999999999999999999999999999",
            "1000000000000000000Ei",
        ] {
            assert!(
                matches!(Quantity::parse(text), Err(QuantityError::TooLarge { .. })),
                "{text:?}: {:?}",
                Quantity::parse(text)
            );
        }
    }

    #[test]
    fn display_is_the_shortest_exact_decimal() {
        for (text, shown) in [
            ("500m", "0.5"),
            ("8Gi", "8589934592"),
            ("-1.25", "-1.25"),
            ("1u", "0.000001"),
        ] {
            assert_eq!(Quantity::parse(text).expect("parses").to_string(), shown);
        }
    }
}
