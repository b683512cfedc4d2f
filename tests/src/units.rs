//! Numbers as the peers' command lines write them: decimal or `0x` hex, sizes with a binary
//! `k`/`m`/`g` suffix.

/// A number or size that doesn't parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NumberError {
    /// Not decimal or `0x` hex.
    #[error("not a number: {word:?}")]
    NotANumber {
        /// The word as written.
        word: String,
    },
    /// Larger than the field it goes into.
    #[error("too large: {word:?}")]
    TooLarge {
        /// The word as written.
        word: String,
    },
}

/// Parses a `u64` in decimal or `0x` hex.
///
/// # Errors
/// [`NumberError::NotANumber`] when it is neither.
pub fn number(word: &str) -> Result<u64, NumberError> {
    let parsed = match word.strip_prefix("0x").or_else(|| word.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => word.parse(),
    };
    parsed.map_err(|_| NumberError::NotANumber {
        word: word.to_owned(),
    })
}

/// Parses a `u32` in decimal or `0x` hex (handles, classes, commands).
///
/// # Errors
/// Not a number, or over `u32::MAX`.
pub fn number32(word: &str) -> Result<u32, NumberError> {
    u32::try_from(number(word)?).map_err(|_| NumberError::TooLarge {
        word: word.to_owned(),
    })
}

/// Parses a byte count with an optional binary suffix: `4096`, `0x1000`, `64k`, `3m`, `1g`
/// (either case).
///
/// # Errors
/// Not a number, or over `u64::MAX` once scaled.
pub fn size(word: &str) -> Result<u64, NumberError> {
    let (digits, shift) = match word.as_bytes().last() {
        Some(b'k' | b'K') => (&word[..word.len() - 1], 10),
        Some(b'm' | b'M') => (&word[..word.len() - 1], 20),
        Some(b'g' | b'G') => (&word[..word.len() - 1], 30),
        _ => (word, 0),
    };
    let n = number(digits).map_err(|_| NumberError::NotANumber {
        word: word.to_owned(),
    })?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| NumberError::TooLarge {
            word: word.to_owned(),
        })
}

#[cfg(test)]
mod tests;
