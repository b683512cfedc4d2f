//! Reading the wire's enums and points the same way for tables and JSON: state and kind names
//! from the shared types, a profile's mean.

use gpuwarden_proto::convert;
use gpuwarden_types::{
    slot::SlotKind,
    state::{NodeState, SessionState},
};

/// A session state's name (`unknown` for a number this build doesn't know).
#[must_use]
pub fn state(s: i32) -> &'static str {
    convert::state_from_pb(s).map_or("unknown", SessionState::as_str)
}

/// A node state's name (`unknown` for a number this build doesn't know).
#[must_use]
pub fn node_state(s: i32) -> &'static str {
    convert::node_state_from_pb(s).map_or("unknown", NodeState::as_str)
}

/// A slot kind's name (`unknown` for a number this build doesn't know).
#[must_use]
pub fn kind(k: i32) -> &'static str {
    convert::kind_from_pb(k).map_or("unknown", SlotKind::as_str)
}

/// Mean of a profile's points (0 for none).
#[must_use]
pub fn mean(points: &[f64]) -> f64 {
    if points.is_empty() {
        0.0
    } else {
        points.iter().sum::<f64>() / points.len() as f64
    }
}
