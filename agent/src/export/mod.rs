//! What the agent shows: the snapshot built from the sensor's maps, OTLP metrics, and `top`.

pub mod metrics;
pub mod snapshot;
pub mod top;
