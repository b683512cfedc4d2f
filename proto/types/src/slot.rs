//! Slot kinds and the well-known slot names.

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

/// Well-known slot names.
pub mod names {
    /// CPU cores (count).
    pub const CPU: &str = "cpu";
    /// Host memory (bytes).
    pub const MEM: &str = "mem";
    /// Fractional GPU shares (count; one device has a capacity of 1.0 unless configured).
    pub const CUDA_SHARES: &str = "cuda.shares";
    /// Whole, exclusive GPUs (count, whole numbers only).
    pub const CUDA_DEVICE: &str = "cuda.device";
    /// GPU memory (bytes).
    pub const CUDA_MEM: &str = "cuda.mem";
    /// The prefix every GPU slot shares.
    pub const CUDA_PREFIX: &str = "cuda.";

    /// The slot types every node with NVIDIA GPUs declares, with their kinds.
    pub const GPU_SLOTS: [(&str, super::SlotKind); 3] = [
        (CUDA_DEVICE, super::SlotKind::Count),
        (CUDA_SHARES, super::SlotKind::Count),
        (CUDA_MEM, super::SlotKind::Bytes),
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_keep_their_lowercase_names() {
        for kind in [SlotKind::Count, SlotKind::Bytes, SlotKind::Unique] {
            let json = serde_json::to_string(&kind).expect("serializes");
            assert_eq!(json, format!("\"{kind}\""));
            assert_eq!(
                serde_json::from_str::<SlotKind>(&json).expect("reads back"),
                kind
            );
        }
    }

    #[test]
    fn gpu_slots_share_the_prefix() {
        for (name, _) in names::GPU_SLOTS {
            assert!(name.starts_with(names::CUDA_PREFIX), "{name}");
        }
    }
}
