//! Test peers for gpuwarden's end-to-end tests, for machines without a GPU.
//!
//! CI has no NVIDIA GPU, so the tests bring both ends of the conversation the agent watches:
//!
//! - [`fake_driver`]: a FUSE file system whose `nvidia0`, `nvidia1`, `nvidiactl` and
//!   `nvidia-uvm` files answer the NVIDIA driver's ioctls with the real encodings and parameter
//!   layouts, writing results back into the caller's memory as the driver does, and keeping a
//!   ledger of the video memory each GPU and client holds (the `fake-nvidia` binary serves one
//!   by hand);
//! - [`gpu_client`]: a synthetic GPU client that issues those ioctls, as a library and as the
//!   line-driven `gpu-client` binary a test steps inside a cgroup;
//! - [`harness`]: what the end-to-end tests run on, over these peers and the agent and
//!   controller harnesses of `gpuwarden-test-support`.
//!
//! The agent's eBPF programs can't tell these files from the real device nodes: they match the
//! paths they are told to watch and decode the same bytes. Mounting the driver needs root.
//!
//! # Example
//!
//! ```no_run
//! use std::path::Path;
//!
//! use gpuwarden_tests::{
//!     fake_driver::{FakeConfig, FakeDriver},
//!     gpu_client::{Form, GpuClient, ParamsLayout},
//! };
//!
//! let driver = FakeDriver::mount(Path::new("/tmp/fake-dev"), &FakeConfig::default())?;
//! let gpu = GpuClient::open(driver.dir())?;
//! let client = gpu.alloc_client()?;
//! let device = gpu.alloc_device(client, 0)?;
//! let (_, size) = gpu.alloc_vidmem(client, device, 3 << 20, Form::Nvos64, ParamsLayout::V128)?;
//! assert_eq!(size, 4 << 20, "rounded up to 2 MiB pages");
//! assert_eq!(driver.ledger(), vec![4 << 20, 0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

pub mod abi;
mod bytes;
pub mod fake_driver;
pub mod gpu_client;
pub mod harness;
pub mod units;
