//! Placement modes and the scoring of candidate placements.
//!
//! A candidate is a node and the devices a session's GPU part would take there. Every
//! candidate is described by four terms (lower totals win):
//!
//! | term | figure | enters as |
//! |---|---|---|
//! | `interference` | the slowdown the session adds on its devices: `Σ(slowdownᵢ − 1)` over their tenants with it, minus the same without it ([`crate::colocation`]) | `+w·x` |
//! | `fragmentation` | change in free shares that no 1.0-share request could use, on its devices (negative when it fills a gap) | `+w·x` |
//! | `packing` | predicted summed utilization of its devices with it there (capped at 1) | `−w·x` |
//! | `topology` | NUMA nodes its devices span, beyond the first | `+w·x` |
//!
//! `interference-aware` ranks by that total and, by the packing cap, never adds a shared
//! tenant to a device whose predicted summed utilization would pass the cap unless nothing
//! else fits. `binpack` and `spread` keep their plain orders (fullest / emptiest node and
//! device first); their explanations show the same terms for the placement they chose.

mod score;

use serde::{Deserialize, Serialize};

pub(crate) use score::{ExcessCache, Scorer};

/// Placement modes are domain words the CLI and the simulator share.
pub use gpuwarden_types::placement::{Placement, UnknownPlacement};

/// What a placement leaves on the session it placed; the session keeps it, so it lives below both.
pub use crate::explanation::{Candidate, EXPLAINED, Explanation, Terms, Weights};

/// Scoring settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScoringConfig {
    /// Term weights.
    pub weights: Weights,
    /// A shared device whose predicted summed utilization would pass this takes no further
    /// tenant unless nothing else fits.
    pub packing_cap: f64,
    /// Nodes scored per decision at most: half from the fullest nodes that fit, half from the
    /// emptiest (like kube-scheduler's `percentageOfNodesToScore`, it bounds a decision's cost
    /// on a large cluster; the ends hold the best packing and the least contended options).
    pub max_nodes: usize,
}

impl Default for ScoringConfig {
    fn default() -> Self {
        Self {
            weights: Weights::default(),
            packing_cap: 0.7,
            max_nodes: 32,
        }
    }
}

/// Invalid scoring settings.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScoringError {
    /// A weight is negative or not a number.
    #[error("scoring weight {name} = {value} must be a finite number ≥ 0")]
    Weight {
        /// Its name.
        name: &'static str,
        /// Its value.
        value: f64,
    },
    /// The cap is out of range.
    #[error("packing_cap = {0} must be in (0, 2]")]
    Cap(f64),
    /// No node would be scored.
    #[error("max_nodes must be at least 1")]
    NoNodes,
}

impl ScoringConfig {
    /// Checks the settings.
    ///
    /// # Errors
    /// A weight is negative or not finite, or the cap is out of range.
    pub fn validate(&self) -> Result<(), ScoringError> {
        let w = self.weights;
        for (name, value) in [
            ("interference", w.interference),
            ("fragmentation", w.fragmentation),
            ("packing", w.packing),
            ("topology", w.topology),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(ScoringError::Weight { name, value });
            }
        }
        if !(self.packing_cap > 0.0 && self.packing_cap <= 2.0) {
            return Err(ScoringError::Cap(self.packing_cap));
        }
        if self.max_nodes == 0 {
            return Err(ScoringError::NoNodes);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
