//! Test peers for gpuwarden's end-to-end tests, for machines without a GPU.
//!
//! - [`fake_driver`]: a FUSE file system whose `nvidia0`, `nvidia1`, `nvidiactl` and
//!   `nvidia-uvm` files answer the NVIDIA driver's ioctls with the real encodings and parameter
//!   layouts, writing results back into the caller's memory as the driver does;
//! - [`gpu_client`]: a synthetic GPU client that issues those ioctls, as a library and as the
//!   line-driven `gpu-client` binary a test can step inside a cgroup.
//!
//! The eBPF programs can't tell these files from the real device nodes: they match paths and
//! decode the same bytes.
#![deny(missing_docs)]

pub mod fake_driver;
pub mod gpu_client;
