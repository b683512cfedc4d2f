//! Why a session went where it went: the candidates a placement scored, their four terms and
//! the weights in force. Placement writes it, the session keeps it and the API shows it, so the
//! nouns live here, below all three (the terms themselves are explained in [`crate::placement`]).

use serde::{Deserialize, Serialize};

use gpuwarden_types::placement::Placement;

/// The weight of each term in the `interference-aware` score.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Weights {
    /// Per unit of added slowdown (one tenant running twice as long: 1.0).
    pub interference: f64,
    /// Per share left unusable by a 1.0-share request.
    pub fragmentation: f64,
    /// Per unit of predicted device utilization (a reward).
    pub packing: f64,
    /// Per NUMA node spanned beyond the first.
    pub topology: f64,
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            interference: 1.0,
            fragmentation: 0.5,
            packing: 0.25,
            topology: 0.2,
        }
    }
}

/// The four figures of a candidate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Terms {
    /// Slowdown it adds on its devices.
    pub interference: f64,
    /// Change in unusable free shares.
    pub fragmentation: f64,
    /// Predicted utilization of its devices (0..=1).
    pub packing: f64,
    /// NUMA nodes spanned beyond the first.
    pub topology: f64,
}

impl Terms {
    /// The weighted total (lower is better).
    #[must_use]
    pub fn total(&self, w: &Weights) -> f64 {
        w.interference * self.interference + w.fragmentation * self.fragmentation
            - w.packing * self.packing
            + w.topology * self.topology
    }

    /// `(name, value, weight, contribution)` for each term, as explanations list them.
    #[must_use]
    pub fn rows(&self, w: &Weights) -> [(&'static str, f64, f64, f64); 4] {
        [
            (
                "interference",
                self.interference,
                w.interference,
                w.interference * self.interference,
            ),
            (
                "fragmentation",
                self.fragmentation,
                w.fragmentation,
                w.fragmentation * self.fragmentation,
            ),
            (
                "packing",
                self.packing,
                w.packing,
                -w.packing * self.packing,
            ),
            (
                "topology",
                self.topology,
                w.topology,
                w.topology * self.topology,
            ),
        ]
    }
}

/// One scored placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// Node.
    pub node: String,
    /// Device indices there.
    pub devices: Vec<u32>,
    /// Its figures.
    pub terms: Terms,
    /// Weighted total.
    pub total: f64,
    /// Predicted summed utilization of its devices with the session (mean over them).
    pub predicted_utilization: f64,
    /// Over the packing cap.
    pub over_cap: bool,
    /// The one taken.
    pub chosen: bool,
}

/// Why a session went where it went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// The mode that decided.
    pub mode: Placement,
    /// The weights in force.
    pub weights: Weights,
    /// The best candidates, best first (at most [`EXPLAINED`]).
    pub candidates: Vec<Candidate>,
    /// Candidates scored in all.
    pub considered: u32,
}

/// Candidates an explanation keeps.
pub const EXPLAINED: usize = 5;
