//! What the agent shows: the snapshot built from the sensor's maps, the local socket that serves
//! it, OTLP metrics, and `top`.

pub mod metrics;
pub mod snapshot;
pub mod socket;
pub mod top;
