//! Kubernetes quantities (`500m`, `256Mi`, `1.5e3`), read exactly: consumed capacities arrive as
//! quantity strings, and a share must stay exact (docs/architecture.md, "Resource slots are
//! exact").

/// A quantity that can't be read or doesn't fit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a quantity this driver takes ({why})")]
pub struct QuantityError {
    /// The text.
    pub value: String,
    /// What is wrong.
    pub why: &'static str,
}

/// A non-negative quantity as an exact fraction `numerator / denominator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fraction {
    numerator: u128,
    denominator: u128,
}

fn parse(text: &str) -> Result<Fraction, QuantityError> {
    let err = |why| QuantityError {
        value: text.to_owned(),
        why,
    };
    let s = text.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.starts_with('-') {
        return Err(err("negative"));
    }
    let number_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(number_end);
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && frac.is_empty() {
        return Err(err("no digits"));
    }
    let digits = format!("{whole}{frac}");
    if digits.len() > 30 {
        return Err(err("too many digits"));
    }
    let mantissa: u128 = digits.parse().map_err(|_| err("not a number"))?;
    let ten = |n: u32| 10u128.checked_pow(n).ok_or_else(|| err("out of range"));
    let frac_digits = u32::try_from(frac.len()).map_err(|_| err("too many digits"))?;
    let mut numerator = mantissa;
    let mut denominator = ten(frac_digits)?;
    let (mul, div) = match suffix {
        "" => (1, 1),
        "n" => (1, ten(9)?),
        "u" => (1, ten(6)?),
        "m" => (1, ten(3)?),
        "k" => (ten(3)?, 1),
        "M" => (ten(6)?, 1),
        "G" => (ten(9)?, 1),
        "T" => (ten(12)?, 1),
        "P" => (ten(15)?, 1),
        "E" => (ten(18)?, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        exp if exp.starts_with(['e', 'E']) => {
            let e: i32 = exp[1..].parse().map_err(|_| err("bad suffix"))?;
            if e.unsigned_abs() > 30 {
                return Err(err("out of range"));
            }
            if e >= 0 {
                (ten(e.unsigned_abs())?, 1)
            } else {
                (1, ten(e.unsigned_abs())?)
            }
        }
        _ => return Err(err("bad suffix")),
    };
    numerator = numerator
        .checked_mul(mul)
        .ok_or_else(|| err("out of range"))?;
    denominator = denominator
        .checked_mul(div)
        .ok_or_else(|| err("out of range"))?;
    Ok(Fraction {
        numerator,
        denominator,
    })
}

/// The quantity in millionths (a share of `500m` is 500 000), exactly.
///
/// # Errors
/// Not a quantity, or finer than a millionth.
pub fn micros(text: &str) -> Result<u64, QuantityError> {
    let f = parse(text)?;
    let scaled = f.numerator.checked_mul(1_000_000).ok_or(QuantityError {
        value: text.to_owned(),
        why: "out of range",
    })?;
    if scaled % f.denominator != 0 {
        return Err(QuantityError {
            value: text.to_owned(),
            why: "finer than a millionth",
        });
    }
    u64::try_from(scaled / f.denominator).map_err(|_| QuantityError {
        value: text.to_owned(),
        why: "out of range",
    })
}

/// The quantity as a whole number, rounded up (Kubernetes rounds byte quantities up too).
///
/// # Errors
/// Not a quantity, or larger than 2^64.
pub fn whole_ceil(text: &str) -> Result<u64, QuantityError> {
    let f = parse(text)?;
    u64::try_from(f.numerator.div_ceil(f.denominator)).map_err(|_| QuantityError {
        value: text.to_owned(),
        why: "out of range",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_exactly_in_every_suffix() {
        assert_eq!(micros("500m"), Ok(500_000));
        assert_eq!(micros("0.5"), Ok(500_000));
        assert_eq!(micros("1"), Ok(1_000_000));
        assert_eq!(micros("1u"), Ok(1));
        assert_eq!(micros("5e-1"), Ok(500_000));
        assert_eq!(micros("250000u"), Ok(250_000));
        assert!(micros("1n").unwrap_err().to_string().contains("millionth"));
        assert_eq!(whole_ceil("256Mi"), Ok(256 << 20));
        assert_eq!(whole_ceil("16G"), Ok(16_000_000_000));
        assert_eq!(whole_ceil("1.5Gi"), Ok(3 << 29));
        assert_eq!(whole_ceil("1k"), Ok(1000));
        assert_eq!(whole_ceil("1E3"), Ok(1000));
        assert_eq!(whole_ceil("2E"), Ok(2_000_000_000_000_000_000));
        assert_eq!(whole_ceil("1500m"), Ok(2));
        assert_eq!(whole_ceil("17179869184"), Ok(16 << 30));
        for bad in ["", "-1", "1Xi", "abc", "1.2.3", "1e99"] {
            assert!(whole_ceil(bad).is_err(), "{bad:?}");
        }
    }
}
