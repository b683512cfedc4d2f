//! The decoder of the NVIDIA escapes that create and free objects: what an ioctl's parameters
//! say it will do, and what its exit reads once the driver has answered.
//!
//! The eBPF program runs it on user memory read with `bpf_probe_read_user`; tests run the very
//! same code on byte buffers (its user-space mirror), so it can be fuzzed with arbitrary memory.
//! It is written for the verifier: fixed-size reads only, no loops, every function
//! `#[inline(always)]`, and wrapping address arithmetic, so that a hostile pointer near the top
//! of the address space reads as a bad pointer rather than panicking a test build.
//!
//! # Example
//! ```
//! use gpuwarden_agent_common::{
//!     decode::{self, Escape, UserMemory, op},
//!     nvidia::{esc, ioctl_cmd, nvos00},
//! };
//!
//! /// One buffer at address 0x1000.
//! struct Buffer(Vec<u8>);
//!
//! impl UserMemory for Buffer {
//!     fn words<const N: usize>(&self, addr: u64) -> Option<[u32; N]> {
//!         let start = usize::try_from(addr.checked_sub(0x1000)?).ok()?;
//!         decode::le_words(self.0.get(start..)?)
//!     }
//! }
//!
//! // RM_FREE of object 7 under parent 2 of client 1.
//! let params = [1u32, 2, 7, 0].iter().flat_map(|w| w.to_le_bytes()).collect();
//! let memory = Buffer(params);
//! let escape = Escape::of(&memory, ioctl_cmd(esc::RM_FREE, nvos00::SIZE), 0x1000)?;
//! let call = decode::decode(&memory, escape)?.expect("RM_FREE is decoded");
//! assert_eq!((call.op, call.client, call.object), (op::FREE, 1, 7));
//! assert_eq!(call.status(&memory), Some(0));
//! # Ok::<(), decode::DecodeError>(())
//! ```
#![allow(
    clippy::inline_always,
    reason = "BPF-to-BPF calls cost verifier budget and stack; the eBPF program wants it all inlined"
)]

use crate::{
    event::decode_error,
    nvidia::{
        class, esc, ioctl_nr, ioctl_size, memory_alloc, nvos00, nvos02, nvos21, nvos32, nvos64,
        smc_partition, xfer,
    },
};

/// User memory as the decoder reads it: fixed-size, little-endian words, and fallible (a bad
/// pointer is `None`, never a fault).
pub trait UserMemory {
    /// The `N` 32-bit words at `addr`, or `None` when they can't all be read.
    fn words<const N: usize>(&self, addr: u64) -> Option<[u32; N]>;

    /// The 32-bit word at `addr`.
    #[inline(always)]
    fn u32_at(&self, addr: u64) -> Option<u32> {
        self.words::<1>(addr).map(|[word]| word)
    }

    /// The 64-bit word at `addr`.
    #[inline(always)]
    fn u64_at(&self, addr: u64) -> Option<u64> {
        self.words::<2>(addr).map(|[low, high]| join(low, high))
    }
}

/// The first `N` little-endian 32-bit words of `bytes`; `None` when it is shorter than that. What
/// a [`UserMemory`] over plain bytes (a test's, a user-space caller's) returns.
#[must_use]
pub fn le_words<const N: usize>(bytes: &[u8]) -> Option<[u32; N]> {
    let bytes = bytes.get(..4 * N)?;
    let mut out = [0; N];
    for (word, chunk) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *word = u32::from_le_bytes(chunk.try_into().ok()?);
    }
    Some(out)
}

/// An ioctl that could not be decoded: what the agent reports (as a `DECODE_ERROR` event) and
/// counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeError {
    /// A [`decode_error`] value.
    pub reason: u32,
    /// The escape being decoded.
    pub escape: u32,
    /// A detail: the size found, for [`decode_error::BAD_SIZE`].
    pub detail: u64,
}

impl DecodeError {
    /// `reason` while decoding `escape`.
    #[inline(always)]
    #[must_use]
    pub const fn new(reason: u32, escape: u32, detail: u64) -> Self {
        Self {
            reason,
            escape,
            detail,
        }
    }
}

impl core::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "cannot decode escape {:#x}: reason {} (detail {:#x})",
            self.escape, self.reason, self.detail
        )
    }
}

impl core::error::Error for DecodeError {}

/// The RM escape an ioctl carries: its number, its parameter struct's size and address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Escape {
    /// `NV_ESC_*`.
    pub nr: u32,
    /// Size of the parameter struct.
    pub size: u32,
    /// User address of the parameter struct.
    pub params: u64,
}

impl Escape {
    /// The escape `ioctl(fd, cmd, params)` names itself, without looking inside an
    /// `IOCTL_XFER_CMD`.
    #[inline(always)]
    #[must_use]
    pub const fn direct(cmd: u32, params: u64) -> Self {
        Self {
            nr: ioctl_nr(cmd),
            size: ioctl_size(cmd),
            params,
        }
    }

    /// The escape `ioctl(fd, cmd, params)` carries: its own, or the one an `IOCTL_XFER_CMD`
    /// wraps (escapes with parameters too large for `_IOC`'s 14 size bits travel that way).
    ///
    /// # Errors
    /// An `IOCTL_XFER_CMD` of the wrong size, or whose wrapper can't be read; the ioctl then
    /// counts as its outer escape ([`Escape::direct`]).
    #[inline(always)]
    pub fn of<M: UserMemory>(mem: &M, cmd: u32, params: u64) -> Result<Self, DecodeError> {
        let direct = Self::direct(cmd, params);
        if direct.nr != esc::IOCTL_XFER_CMD {
            return Ok(direct);
        }
        if direct.size != xfer::SIZE {
            return Err(DecodeError::new(
                decode_error::BAD_SIZE,
                esc::IOCTL_XFER_CMD,
                u64::from(direct.size),
            ));
        }
        let Some(raw) = mem.words::<4>(params) else {
            return Err(DecodeError::new(
                decode_error::READ_PARAMS,
                esc::IOCTL_XFER_CMD,
                0,
            ));
        };
        Ok(Self {
            nr: raw[xfer::CMD / 4],
            size: raw[xfer::PARAMS_SIZE / 4],
            params: join(raw[xfer::PTR / 4], raw[xfer::PTR / 4 + 1]),
        })
    }
}

/// What an ioctl in flight will do once the driver answers.
pub mod op {
    /// Creates a client.
    pub const CLIENT: u32 = 1;
    /// Creates a device object; `value` is its `deviceId`.
    pub const DEVICE: u32 = 2;
    /// Creates a subdevice object under `parent`.
    pub const SUBDEVICE: u32 = 3;
    /// Allocates video memory under `parent`; `size_at` points at its size.
    pub const VIDMEM: u32 = 4;
    /// Frees `object` (the client itself when `object == client`).
    pub const FREE: u32 = 5;
    /// Allocates host memory for the GPU under `parent`; `size_at` points at its size.
    pub const SYSMEM: u32 = 6;
    /// Subscribes the client to MIG GPU instance `value` (the `swizzId`) of the GPU of subdevice
    /// `parent` (`AMPERE_SMC_PARTITION_REF`): its video memory on that GPU is the instance's.
    pub const PARTITION: u32 = 7;
}

/// Bits of [`Call::flags`].
pub mod call_flags {
    /// The field at `size_at` is a limit: the size minus one (`NVOS02`).
    pub const SIZE_IS_LIMIT: u32 = 1;
}

/// A decoded ioctl in flight (the value of the eBPF map `PENDING_IOCTL`): what its exit must
/// read and do once the driver has answered.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Call {
    /// One of [`op`].
    pub op: u32,
    /// Offset of `status` in the params.
    pub status_offset: u32,
    /// User address of the params.
    pub params: u64,
    /// User address of the allocation's size (`VIDMEM`, `SYSMEM`) or of the nested allocation
    /// params (others).
    pub size_at: u64,
    /// `hRoot`.
    pub client: u32,
    /// `hObjectParent`.
    pub parent: u32,
    /// `hObjectOld` for a free.
    pub object: u32,
    /// Op-specific value.
    pub value: u32,
    /// Offset of the new object's handle in the params, read at exit.
    pub handle_offset: u32,
    /// [`call_flags`].
    pub flags: u32,
    /// The open file the ioctl was issued on (0: unknown); the decoder leaves it 0.
    pub file: u64,
}

impl Call {
    /// The params' `status`, as the driver left it.
    #[inline(always)]
    pub fn status<M: UserMemory>(&self, mem: &M) -> Option<u32> {
        mem.u32_at(self.params.wrapping_add(u64::from(self.status_offset)))
    }

    /// The handle of the object the call created, as the driver wrote it back.
    #[inline(always)]
    pub fn new_handle<M: UserMemory>(&self, mem: &M) -> Option<u32> {
        mem.u32_at(self.params.wrapping_add(u64::from(self.handle_offset)))
    }

    /// The bytes the field at `size_at` stands for: requested at enter, allocated at exit (the
    /// driver writes back the size it really allocated).
    #[inline(always)]
    pub fn size<M: UserMemory>(&self, mem: &M) -> Option<u64> {
        let raw = mem.u64_at(self.size_at)?;
        Some(if self.flags & call_flags::SIZE_IS_LIMIT != 0 {
            raw.saturating_add(1)
        } else {
            raw
        })
    }
}

/// What `escape` will do, read from its parameters before the driver sees them: `Ok(None)` for
/// escapes that create or free nothing gpuwarden counts.
///
/// # Errors
/// The parameters are of a size no known layout has, or can't be read.
#[inline(always)]
pub fn decode<M: UserMemory>(mem: &M, escape: Escape) -> Result<Option<Call>, DecodeError> {
    match escape.nr {
        esc::RM_ALLOC => alloc(mem, escape),
        esc::RM_FREE => free(mem, escape),
        esc::RM_ALLOC_MEMORY => alloc_memory(mem, escape),
        esc::RM_VID_HEAP_CONTROL => vid_heap(mem, escape),
        _ => Ok(None),
    }
}

/// `RM_ALLOC` (NVOS21 or NVOS64).
#[inline(always)]
fn alloc<M: UserMemory>(mem: &M, escape: Escape) -> Result<Option<Call>, DecodeError> {
    let Escape { size, params, .. } = escape;
    let fail = |reason, detail| DecodeError::new(reason, esc::RM_ALLOC, detail);
    // Both forms share the first 24 bytes; they differ in where paramsSize and status are.
    let (status_offset, params_size_offset) = if size == nvos21::SIZE {
        (nvos21::STATUS, nvos21::PARAMS_SIZE)
    } else if size == nvos64::SIZE {
        (nvos64::STATUS, nvos64::PARAMS_SIZE)
    } else {
        return Err(fail(decode_error::BAD_SIZE, u64::from(size)));
    };
    let head = mem
        .words::<8>(params)
        .ok_or(fail(decode_error::READ_PARAMS, 0))?;
    let h_class = head[nvos21::H_CLASS / 4];
    let alloc_params = join(
        head[nvos21::P_ALLOC_PARMS / 4],
        head[nvos21::P_ALLOC_PARMS / 4 + 1],
    );
    let mut call = Call {
        status_offset: offset(status_offset),
        params,
        size_at: alloc_params,
        client: head[nvos21::H_ROOT / 4],
        parent: head[nvos21::H_OBJECT_PARENT / 4],
        handle_offset: offset(nvos21::H_OBJECT_NEW),
        ..Call::default()
    };
    match h_class {
        c if class::is_client(c) => call.op = op::CLIENT,
        class::DEVICE_0 => {
            call.op = op::DEVICE;
            call.value = mem
                .u32_at(alloc_params)
                .ok_or(fail(decode_error::READ_ALLOC_PARAMS, 0))?;
        }
        class::SUBDEVICE_0 => call.op = op::SUBDEVICE,
        class::SMC_PARTITION_REF => {
            call.op = op::PARTITION;
            call.value = mem
                .u32_at(alloc_params.wrapping_add(smc_partition::SWIZZ_ID as u64))
                .ok_or(fail(decode_error::READ_ALLOC_PARAMS, 0))?;
            // A profiling session of the whole device is no instance's.
            if call.value == smc_partition::DEVICE_PROFILING_SWIZZID {
                return Ok(None);
            }
        }
        class::MEMORY_LOCAL_USER | class::MEMORY_SYSTEM => {
            // NVOS21 carries paramsSize in the head already read; NVOS64 past it.
            let params_size = if size == nvos21::SIZE {
                head[nvos21::PARAMS_SIZE / 4]
            } else {
                mem.u32_at(params.wrapping_add(params_size_offset as u64))
                    .ok_or(fail(decode_error::READ_PARAMS, 0))?
            };
            // Drivers append fields to these params; the ones read here (up to `size` at 64)
            // have kept their offsets, so any size from the oldest known layout up is read.
            // 0 is what CUDA sends in NVOS64 (driver 580): the driver takes the size from the
            // class, not from the caller.
            if params_size != 0 && params_size < memory_alloc::SIZE_OLD {
                // The ioctl's params size above the allocation params' size.
                let detail = (u64::from(size) << 32) | u64::from(params_size);
                return Err(fail(decode_error::BAD_SIZE, detail));
            }
            let fields = mem
                .words::<7>(alloc_params)
                .ok_or(fail(decode_error::READ_ALLOC_PARAMS, 0))?;
            let flags = fields[memory_alloc::FLAGS / 4];
            let location = (fields[memory_alloc::ATTR / 4] >> memory_alloc::ATTR_LOCATION_SHIFT)
                & memory_alloc::ATTR_LOCATION_MASK;
            // A VA reservation holds no memory; system memory, or local memory placed in host
            // memory, is counted apart from video memory.
            if flags & memory_alloc::FLAGS_VIRTUAL != 0 {
                return Ok(None);
            }
            call.op =
                if h_class == class::MEMORY_SYSTEM || location == memory_alloc::ATTR_LOCATION_PCI {
                    op::SYSMEM
                } else {
                    op::VIDMEM
                };
            call.size_at = alloc_params.wrapping_add(memory_alloc::SIZE_FIELD as u64);
        }
        _ => return Ok(None),
    }
    Ok(Some(call))
}

/// `RM_FREE` (NVOS00).
#[inline(always)]
fn free<M: UserMemory>(mem: &M, escape: Escape) -> Result<Option<Call>, DecodeError> {
    if escape.size != nvos00::SIZE {
        let detail = u64::from(escape.size);
        return Err(DecodeError::new(
            decode_error::BAD_SIZE,
            esc::RM_FREE,
            detail,
        ));
    }
    let raw = mem.words::<4>(escape.params).ok_or(DecodeError::new(
        decode_error::READ_PARAMS,
        esc::RM_FREE,
        0,
    ))?;
    Ok(Some(Call {
        op: op::FREE,
        status_offset: offset(nvos00::STATUS),
        params: escape.params,
        client: raw[nvos00::H_ROOT / 4],
        parent: raw[nvos00::H_OBJECT_PARENT / 4],
        object: raw[nvos00::H_OBJECT_OLD / 4],
        ..Call::default()
    }))
}

/// `RM_ALLOC_MEMORY` (`nvos02_with_fd`): system memory and user memory pinned for the GPU are
/// host memory of `limit + 1` bytes; other classes (a framebuffer view) hold none.
#[inline(always)]
fn alloc_memory<M: UserMemory>(mem: &M, escape: Escape) -> Result<Option<Call>, DecodeError> {
    let fail = |reason, detail| DecodeError::new(reason, esc::RM_ALLOC_MEMORY, detail);
    if escape.size != nvos02::SIZE {
        return Err(fail(decode_error::BAD_SIZE, u64::from(escape.size)));
    }
    let head = mem
        .words::<4>(escape.params)
        .ok_or(fail(decode_error::READ_PARAMS, 0))?;
    let h_class = head[nvos02::H_CLASS / 4];
    if h_class != class::MEMORY_SYSTEM && h_class != class::MEMORY_SYSTEM_OS_DESCRIPTOR {
        return Ok(None);
    }
    Ok(Some(Call {
        op: op::SYSMEM,
        status_offset: offset(nvos02::STATUS),
        params: escape.params,
        size_at: escape.params.wrapping_add(nvos02::LIMIT as u64),
        client: head[nvos02::H_ROOT / 4],
        parent: head[nvos02::H_OBJECT_PARENT / 4],
        handle_offset: offset(nvos02::H_OBJECT_NEW),
        flags: call_flags::SIZE_IS_LIMIT,
        ..Call::default()
    }))
}

/// `RM_VID_HEAP_CONTROL` (`NVOS32`): `ALLOC_SIZE` allocates video or host memory by its
/// location (`_ANY` counted as video memory, where the driver prefers to put it; a virtual
/// allocation holds none); `FREE` frees `hMemory`.
#[inline(always)]
fn vid_heap<M: UserMemory>(mem: &M, escape: Escape) -> Result<Option<Call>, DecodeError> {
    let fail = |reason, detail| DecodeError::new(reason, esc::RM_VID_HEAP_CONTROL, detail);
    if escape.size != nvos32::SIZE {
        return Err(fail(decode_error::BAD_SIZE, u64::from(escape.size)));
    }
    // hRoot … data.AllocSize.attr: the first 60 bytes.
    let head = mem
        .words::<15>(escape.params)
        .ok_or(fail(decode_error::READ_PARAMS, 0))?;
    let mut call = Call {
        status_offset: offset(nvos32::STATUS),
        params: escape.params,
        size_at: escape.params.wrapping_add(nvos32::ALLOC_SIZE as u64),
        client: head[nvos32::H_ROOT / 4],
        parent: head[nvos32::H_OBJECT_PARENT / 4],
        handle_offset: offset(nvos32::H_MEMORY),
        ..Call::default()
    };
    match head[nvos32::FUNCTION / 4] {
        nvos32::FUNCTION_ALLOC_SIZE => {
            if head[nvos32::ALLOC_FLAGS / 4] & nvos32::FLAGS_VIRTUAL != 0 {
                return Ok(None);
            }
            let location = (head[nvos32::ALLOC_ATTR / 4] >> nvos32::ATTR_LOCATION_SHIFT)
                & nvos32::ATTR_LOCATION_MASK;
            call.op = if location == nvos32::LOCATION_PCI {
                op::SYSMEM
            } else {
                op::VIDMEM
            };
        }
        nvos32::FUNCTION_FREE => {
            call.op = op::FREE;
            call.object = head[nvos32::H_MEMORY / 4];
        }
        _ => return Ok(None),
    }
    Ok(Some(call))
}

/// A field's offset in its parameter struct (all below 200 bytes), as a [`Call`] keeps it.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "parameter structs are a few hundred bytes; `u32::try_from` is not const"
)]
const fn offset(at: usize) -> u32 {
    at as u32
}

/// A 64-bit value from its little-endian halves.
#[inline(always)]
const fn join(low: u32, high: u32) -> u64 {
    (low as u64) | ((high as u64) << 32)
}

#[cfg(test)]
mod tests;
