//! [`SlotKind`]: how a slot's values are read and checked.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How a slot's values are read and checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotKind {
    /// A quantity, possibly fractional (`cpu=1.5`, `cuda.shares=0.2`).
    Count,
    /// A whole number of bytes; accepts unit suffixes (`mem=2g`).
    Bytes,
    /// Held whole and alone: can only be requested as 1.
    Unique,
}

impl SlotKind {
    /// Stable lowercase name.
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
