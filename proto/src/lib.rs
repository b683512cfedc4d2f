//! gpuwarden's gRPC API, package `gpuwarden.v1`.
//!
//! Empty until the controller's API lands (issue 3); nothing here is used yet.
