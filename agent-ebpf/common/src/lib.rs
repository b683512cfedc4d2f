//! Types and constants that gpuwarden's eBPF programs and its agent both read.
//!
//! The crate is `#![no_std]` so it builds for `bpfel-unknown-none` as well as for the host. Each
//! module holds one concern:
//!
//! - [`nvidia`]: the NVIDIA driver's ioctl ABI (escape numbers, parameter layouts, classes);
//! - [`decode`]: the decoder of the escapes that create and free objects, over a
//!   [`decode::UserMemory`] (the eBPF program's user memory, or a test's bytes);
//! - [`maps`]: keys and values of the BPF maps the agent reads;
//! - [`event`]: records sent to user space through the ring buffer;
//! - [`config`]: the knobs user space writes before the programs run.
//!
//! With the `user` feature every map type implements [`aya::Pod`].
#![expect(
    clippy::pub_underscore_fields,
    reason = "`_pad` names the explicit padding of the `#[repr(C)]` structs the kernel shares; public so both sides can build them with `_pad: 0`"
)]
#![no_std]
#![deny(missing_docs)]

// The tests run on the host, with std.
#[cfg(test)]
extern crate std;

pub mod config;
pub mod decode;
pub mod event;
pub mod maps;
pub mod mig;
pub mod nvidia;

/// Implements `aya::Pod` for plain `#[repr(C)]` types when built for user space.
macro_rules! pod {
    ($($t:ty),* $(,)?) => {
        $(
            #[cfg(feature = "user")]
            // SAFETY: the type is `#[repr(C)]`, `Copy`, has no padding holes that matter for reads,
            // and every bit pattern is a valid value.
            unsafe impl aya::Pod for $t {}
        )*
    };
}
pub(crate) use pod;
