//! Placement modes: how the scheduler chooses a node and devices for a session
//! (docs/architecture.md, "Placement"); the scoring behind `interference-aware` is the
//! controller's.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How a session's placement is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// The fullest node and device that fit: keeps whole devices free.
    #[default]
    Binpack,
    /// The emptiest: keeps tenants apart.
    Spread,
    /// The lowest weighted score of predicted interference, fragmentation, packing and
    /// topology, under the packing cap.
    InterferenceAware,
}

impl Placement {
    /// All modes, in the order tables show them.
    pub const ALL: [Self; 3] = [Self::Binpack, Self::Spread, Self::InterferenceAware];

    /// Its name as users type it.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Binpack => "binpack",
            Self::Spread => "spread",
            Self::InterferenceAware => "interference-aware",
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A placement mode that doesn't exist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown placement mode {0:?} (expected binpack, spread or interference-aware)")]
pub struct UnknownPlacement(pub String);

impl std::str::FromStr for Placement {
    type Err = UnknownPlacement;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "binpack" => Ok(Self::Binpack),
            "spread" => Ok(Self::Spread),
            "interference-aware" => Ok(Self::InterferenceAware),
            _ => Err(UnknownPlacement(s.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_as_users_type_them() {
        for mode in Placement::ALL {
            assert_eq!(mode.as_str().parse::<Placement>(), Ok(mode));
        }
        assert_eq!(
            "Interference_Aware".parse::<Placement>(),
            Ok(Placement::InterferenceAware)
        );
        let err = "fastest".parse::<Placement>().unwrap_err();
        assert!(err.to_string().contains("\"fastest\""), "{err}");
    }
}
