//! gpuwarden's cluster controller.
//!
//! Agents report their nodes' devices and slot types; the controller merges the slot types of
//! all of them, places sessions onto whole or fractional GPUs, and tells each agent what it
//! holds. This crate grows by issue: today it has the exact resource [`slots`] and the
//! fractional GPU [`allocator`]; the scheduler, the gRPC API, the sled store and the `gpuwarden`
//! CLI come next.
#![deny(missing_docs)]

pub mod allocator;
pub mod slots;
