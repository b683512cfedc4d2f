//! The NVML MIG calls nvml-wrapper 0.13 does not wrap, made on its loaded library
//! (`Nvml::lib()`): GPU instance profiles and their possible placements, the GPU instances
//! there are, and creating and destroying GPU and compute instances (docs/mig.md, "Instances
//! made on demand"). Every `unsafe` block of the MIG layout code is here; the rest of the
//! backend sees plain values and [`CallError`]s.
//!
//! A function the loaded library lacks (an older driver) is the call's error with NVML's own
//! `NVML_ERROR_FUNCTION_NOT_FOUND`, never a panic: the symbols are read from the library's
//! table (`Result` fields), not through the sys crate's methods, which panic on a missing one.

use std::ffi::c_uint;

use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings as b;

use super::layout::{CallError, RawCiProfile, RawGiProfile, RawGpuInstance};
use crate::devices::placement::Placement;

/// Bounds every list NVML is asked for: an H100 or H200 has 7 profiles' worth of placements
/// and instances at most, so a count past this is a driver answer not trusted.
const MAX_LIST: c_uint = 64;

/// The function `name` of the loaded library, or the call's error when the library lacks it.
macro_rules! sym {
    ($nvml:expr, $name:ident) => {
        $nvml.lib().$name.as_ref().map_err(|_| {
            CallError::new(
                stringify!($name),
                b::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND,
            )
        })?
    };
}

/// A status as the call's result.
fn check(call: &'static str, status: b::nvmlReturn_t) -> Result<(), CallError> {
    if status == b::nvmlReturn_enum_NVML_SUCCESS {
        Ok(())
    } else {
        Err(CallError::new(call, status))
    }
}

/// A GPU instance handle, valid while the instance exists and NVML is loaded.
#[derive(Debug, Clone, Copy)]
pub(super) struct GiHandle(b::nvmlGpuInstance_t);

/// A compute instance handle, valid while the instance exists and NVML is loaded.
#[derive(Debug, Clone, Copy)]
pub(super) struct CiHandle(b::nvmlComputeInstance_t);

/// `nvmlGpuInstanceProfileInfo_v2`: the struct's size with version 2 in the top byte, as
/// nvml.h's `NVML_STRUCT_VERSION` makes it.
fn gi_profile_info_v2() -> c_uint {
    let size = c_uint::try_from(size_of::<b::nvmlGpuInstanceProfileInfo_v2_t>()).unwrap_or(0);
    size | (2 << 24)
}

/// `nvmlDeviceGetGpuInstanceProfileInfoV` for profile index `index`
/// (`NVML_GPU_INSTANCE_PROFILE_*`); `None` where the GPU has no such profile
/// (`NOT_SUPPORTED` or `INVALID_ARGUMENT`).
pub(super) fn gi_profile(
    nvml: &Nvml,
    device: &nvml_wrapper::Device<'_>,
    index: u32,
) -> Result<Option<RawGiProfile>, CallError> {
    let f = sym!(nvml, nvmlDeviceGetGpuInstanceProfileInfoV);
    // SAFETY: an all-zero `nvmlGpuInstanceProfileInfo_v2_t` is a valid value (integers and a
    // char array).
    let mut info: b::nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
    info.version = gi_profile_info_v2();
    // SAFETY: the device handle is live for `device`'s lifetime; `info` is a valid, writable
    // struct of the version it says.
    let status = unsafe { f(device.handle(), index, &raw mut info) };
    match status {
        b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
        | b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => return Ok(None),
        s => check("nvmlDeviceGetGpuInstanceProfileInfoV", s)?,
    }
    Ok(Some(RawGiProfile {
        index,
        id: info.id,
        slice_count: info.sliceCount,
        instance_count: info.instanceCount,
        memory_mib: info.memorySizeMB,
        name: c_name(&info.name),
    }))
}

/// The NUL-terminated name in a fixed `char` array (lossy UTF-8; no NUL: the whole array).
fn c_name(raw: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c.to_ne_bytes()[0])
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: every placement the hardware allows the
/// profile `profile_id`, free or not. Asked twice: for the count, then for that many.
pub(super) fn possible_placements(
    nvml: &Nvml,
    device: &nvml_wrapper::Device<'_>,
    profile_id: u32,
) -> Result<Vec<Placement>, CallError> {
    const CALL: &str = "nvmlDeviceGetGpuInstancePossiblePlacements_v2";
    let f = sym!(nvml, nvmlDeviceGetGpuInstancePossiblePlacements_v2);
    let mut count: c_uint = 0;
    // SAFETY: a null `placements` asks only for the count, written to the valid `count`.
    check(CALL, unsafe {
        f(
            device.handle(),
            profile_id,
            std::ptr::null_mut(),
            &raw mut count,
        )
    })?;
    let count = count.min(MAX_LIST);
    let mut out = vec![b::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    let mut written = count;
    // SAFETY: `out` holds `count` placements, the number NVML said it writes; `written` is
    // a valid out pointer and says how many it wrote.
    check(CALL, unsafe {
        f(
            device.handle(),
            profile_id,
            out.as_mut_ptr(),
            &raw mut written,
        )
    })?;
    out.truncate(written.min(count) as usize);
    Ok(out
        .into_iter()
        .map(|p| Placement {
            start: p.start,
            size: p.size,
        })
        .collect())
}

/// `nvmlDeviceGetGpuInstances` and `nvmlGpuInstanceGetInfo`: the GPU instances of profile
/// `profile_id` there are, at most `max` (the profile's instance count).
pub(super) fn gpu_instances(
    nvml: &Nvml,
    device: &nvml_wrapper::Device<'_>,
    profile_id: u32,
    max: u32,
) -> Result<Vec<(GiHandle, RawGpuInstance)>, CallError> {
    let list = sym!(nvml, nvmlDeviceGetGpuInstances);
    let max = max.min(MAX_LIST);
    let mut handles: Vec<b::nvmlGpuInstance_t> = vec![std::ptr::null_mut(); max as usize];
    let mut count: c_uint = 0;
    // SAFETY: `handles` has room for `max` instances, the profile's instance count, which is
    // as many as the driver can hold of it; `count` is a valid out pointer.
    check("nvmlDeviceGetGpuInstances", unsafe {
        list(
            device.handle(),
            profile_id,
            handles.as_mut_ptr(),
            &raw mut count,
        )
    })?;
    handles.truncate(count.min(max) as usize);
    handles
        .into_iter()
        .map(|h| {
            let gi = GiHandle(h);
            Ok((gi, gpu_instance_info(nvml, gi)?))
        })
        .collect()
}

/// `nvmlGpuInstanceGetInfo`: a GPU instance's id, profile and placement.
pub(super) fn gpu_instance_info(nvml: &Nvml, gi: GiHandle) -> Result<RawGpuInstance, CallError> {
    let f = sym!(nvml, nvmlGpuInstanceGetInfo);
    // SAFETY: an all-zero `nvmlGpuInstanceInfo_t` is valid (a null device handle, integers).
    let mut info: b::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `gi` is a live GPU instance handle NVML gave; `info` is a valid out pointer.
    check("nvmlGpuInstanceGetInfo", unsafe { f(gi.0, &raw mut info) })?;
    Ok(RawGpuInstance {
        id: info.id,
        profile_id: info.profileId,
        placement: Placement {
            start: info.placement.start,
            size: info.placement.size,
        },
    })
}

/// `nvmlDeviceGetGpuInstanceById`.
pub(super) fn gpu_instance_by_id(
    nvml: &Nvml,
    device: &nvml_wrapper::Device<'_>,
    id: u32,
) -> Result<GiHandle, CallError> {
    let f = sym!(nvml, nvmlDeviceGetGpuInstanceById);
    let mut h: b::nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: live device handle; `h` is a valid out pointer.
    check("nvmlDeviceGetGpuInstanceById", unsafe {
        f(device.handle(), id, &raw mut h)
    })?;
    Ok(GiHandle(h))
}

/// `nvmlDeviceCreateGpuInstanceWithPlacement`: a GPU instance of profile `profile_id` at
/// `placement`.
pub(super) fn create_gpu_instance(
    nvml: &Nvml,
    device: &nvml_wrapper::Device<'_>,
    profile_id: u32,
    placement: Placement,
) -> Result<GiHandle, CallError> {
    let f = sym!(nvml, nvmlDeviceCreateGpuInstanceWithPlacement);
    let at = b::nvmlGpuInstancePlacement_t {
        start: placement.start,
        size: placement.size,
    };
    let mut h: b::nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: live device handle; `at` is read during the call only; `h` a valid out pointer.
    check("nvmlDeviceCreateGpuInstanceWithPlacement", unsafe {
        f(device.handle(), profile_id, &raw const at, &raw mut h)
    })?;
    Ok(GiHandle(h))
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfo` for compute profile index `index`
/// (`NVML_COMPUTE_INSTANCE_PROFILE_*`, shared engines); `None` where the GPU instance has no
/// such profile.
pub(super) fn ci_profile(
    nvml: &Nvml,
    gi: GiHandle,
    index: u32,
) -> Result<Option<RawCiProfile>, CallError> {
    let f = sym!(nvml, nvmlGpuInstanceGetComputeInstanceProfileInfo);
    // SAFETY: an all-zero `nvmlComputeInstanceProfileInfo_t` is valid (integers).
    let mut info: b::nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: live GPU instance handle; `info` is a valid out pointer.
    let status = unsafe {
        f(
            gi.0,
            index,
            b::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            &raw mut info,
        )
    };
    match status {
        b::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED
        | b::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => return Ok(None),
        s => check("nvmlGpuInstanceGetComputeInstanceProfileInfo", s)?,
    }
    Ok(Some(RawCiProfile {
        index,
        id: info.id,
        slice_count: info.sliceCount,
    }))
}

/// `nvmlGpuInstanceCreateComputeInstance` of compute profile `profile_id`.
pub(super) fn create_compute_instance(
    nvml: &Nvml,
    gi: GiHandle,
    profile_id: u32,
) -> Result<CiHandle, CallError> {
    let f = sym!(nvml, nvmlGpuInstanceCreateComputeInstance);
    let mut h: b::nvmlComputeInstance_t = std::ptr::null_mut();
    // SAFETY: live GPU instance handle; `h` is a valid out pointer.
    check("nvmlGpuInstanceCreateComputeInstance", unsafe {
        f(gi.0, profile_id, &raw mut h)
    })?;
    Ok(CiHandle(h))
}

/// `nvmlGpuInstanceGetComputeInstanceById`.
pub(super) fn compute_instance_by_id(
    nvml: &Nvml,
    gi: GiHandle,
    id: u32,
) -> Result<CiHandle, CallError> {
    let f = sym!(nvml, nvmlGpuInstanceGetComputeInstanceById);
    let mut h: b::nvmlComputeInstance_t = std::ptr::null_mut();
    // SAFETY: live GPU instance handle; `h` is a valid out pointer.
    check("nvmlGpuInstanceGetComputeInstanceById", unsafe {
        f(gi.0, id, &raw mut h)
    })?;
    Ok(CiHandle(h))
}

/// `nvmlComputeInstanceDestroy`: the handle is dead after it succeeds.
pub(super) fn destroy_compute_instance(nvml: &Nvml, ci: CiHandle) -> Result<(), CallError> {
    let f = sym!(nvml, nvmlComputeInstanceDestroy);
    // SAFETY: a live compute instance handle, not used again after a successful destroy.
    check("nvmlComputeInstanceDestroy", unsafe { f(ci.0) })
}

/// `nvmlGpuInstanceDestroy`: the handle is dead after it succeeds.
pub(super) fn destroy_gpu_instance(nvml: &Nvml, gi: GiHandle) -> Result<(), CallError> {
    let f = sym!(nvml, nvmlGpuInstanceDestroy);
    // SAFETY: a live GPU instance handle, not used again after a successful destroy.
    check("nvmlGpuInstanceDestroy", unsafe { f(gi.0) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_end_at_their_nul_and_the_struct_version_is_nvmls() {
        let mut raw = [0 as std::ffi::c_char; 12];
        for (i, byte) in b"MIG 1g.10gb".iter().enumerate() {
            raw[i] = std::ffi::c_char::from_ne_bytes([*byte]);
        }
        assert_eq!(c_name(&raw), "MIG 1g.10gb");
        // nvml.h: NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2) =
        // sizeof(nvmlGpuInstanceProfileInfo_v2_t) | 2 << 24; the struct is 11 32-bit fields,
        // a 64-bit one (aligned, after one pad word) and 96 chars.
        assert_eq!(gi_profile_info_v2(), (4 * 12 + 8 + 96) | 0x0200_0000);
    }
}
