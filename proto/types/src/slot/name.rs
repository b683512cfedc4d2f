//! [`SlotName`]: what a slot is called.

use std::{borrow::Borrow, fmt, str::FromStr};

use serde::{Deserialize, Serialize};

/// A slot name: 1 to 64 of lowercase letters, digits, `.`, `_` and `-`, starting with a letter
/// (`cpu`, `cuda.shares`, `mock.accel-2`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SlotName(String);

/// A slot name that isn't one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid slot name {name:?}: use 1 to 64 lowercase letters, digits, '.', '_' and '-', starting with a letter"
)]
pub struct InvalidSlotName {
    /// The name.
    pub name: String,
}

impl SlotName {
    /// The longest name.
    pub const MAX_LEN: usize = 64;

    /// Checks `name`.
    ///
    /// # Errors
    /// It is empty or too long, has other characters, or doesn't start with a letter.
    pub fn new(name: &str) -> Result<Self, InvalidSlotName> {
        if Self::is_valid(name) {
            Ok(Self(name.to_owned()))
        } else {
            Err(InvalidSlotName {
                name: name.to_owned(),
            })
        }
    }

    /// Whether `name` is a valid slot name.
    #[must_use]
    pub fn is_valid(name: &str) -> bool {
        name.len() <= Self::MAX_LEN
            && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
            && name.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
            })
    }

    /// The name.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Lets maps keyed by `SlotName` be searched with a plain `&str`, without allocating.
impl Borrow<str> for SlotName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for SlotName {
    fn as_ref(&self) -> &str {
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
        if Self::is_valid(&s) {
            Ok(Self(s))
        } else {
            Err(InvalidSlotName { name: s })
        }
    }
}

impl From<SlotName> for String {
    fn from(n: SlotName) -> Self {
        n.0
    }
}
