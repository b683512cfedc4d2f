//! The helper's side: `libcuda.so.1` loaded with `dlopen` in this short-lived process, the
//! checkpoint functions resolved from it, one call made and its result printed as one JSON line
//! ([`super::Answer`]). The agent daemon never runs this code in its own process.

use std::{ffi::c_int, path::Path};

use libloading::{Library, Symbol};

use super::{
    Action, Answer, CheckpointError, CuResult, GPU_PAIRS_SINCE, GpuPair, ProcessState, uuid_bytes,
};

/// The library the driver's user-space half ships as.
pub const LIBCUDA: &str = "libcuda.so.1";

/// The 64-byte argument block every checkpoint call takes (cuda.h: `CUcheckpointLockArgs`
/// is `{ unsigned timeoutMs; unsigned reserved0; cuuint64_t reserved1[7]; }`, the others are
/// reserved words that must be zero; a restore with no GPU pairs passes it zeroed: the process
/// returns to the GPUs it left).
#[repr(C)]
#[derive(Default)]
struct Args {
    timeout_ms: u32,
    reserved0: u32,
    reserved1: [u64; 7],
}

/// `CUcheckpointGpuPair { CUuuid oldUuid; CUuuid newUuid; }` (CUDA 13.0).
#[repr(C)]
struct RawPair {
    old: [u8; 16],
    new: [u8; 16],
}

/// CUDA 13.0's `CUcheckpointRestoreArgs { CUcheckpointGpuPair *gpuPairs; unsigned
/// gpuPairsCount; char reserved[44]; cuuint64_t reserved1; }`: 64 bytes, as before it.
#[repr(C)]
struct RestoreArgs {
    gpu_pairs: *mut RawPair,
    gpu_pairs_count: u32,
    reserved: [u8; 44],
    reserved1: u64,
}

const _: () = assert!(size_of::<RestoreArgs>() == 64 && size_of::<Args>() == 64);

type InitFn = unsafe extern "C" fn(u32) -> c_int;
type ActFn = unsafe extern "C" fn(c_int, *mut Args) -> c_int;
type RestoreFn = unsafe extern "C" fn(c_int, *mut RestoreArgs) -> c_int;
type StateFn = unsafe extern "C" fn(c_int, *mut c_int) -> c_int;
type VersionFn = unsafe extern "C" fn(*mut c_int) -> c_int;

/// The loaded driver.
pub struct Driver {
    library: Library,
    name: String,
}

impl Driver {
    /// Loads `library` (a path, or a name the dynamic loader searches for) and initializes the
    /// driver (`cuInit(0)`: restore needs it where persistence mode is off).
    ///
    /// # Errors
    /// The library cannot be loaded, lacks `cuInit`, or `cuInit` fails.
    pub fn load(library: &str) -> Result<Self, CheckpointError> {
        // SAFETY: loading libcuda runs its initializers; that is why this happens only in the
        // helper process, never in the daemon.
        let lib = unsafe { Library::new(library) }.map_err(|e| CheckpointError::Load {
            library: library.to_owned(),
            reason: e.to_string(),
        })?;
        let driver = Self {
            library: lib,
            name: library.to_owned(),
        };
        let init: Symbol<'_, InitFn> = driver.symbol("cuInit")?;
        // SAFETY: `cuInit(unsigned int Flags)` per cuda.h; 0 is the only valid flag value.
        let code = unsafe { init(0) };
        if code != 0 {
            return Err(CheckpointError::Driver {
                function: "cuInit",
                pid: 0,
                code: CuResult(code),
            });
        }
        Ok(driver)
    }

    fn symbol<T>(&self, function: &'static str) -> Result<Symbol<'_, T>, CheckpointError> {
        // SAFETY: each `T` used here is the function's signature in cuda.h.
        unsafe { self.library.get::<T>(function.as_bytes()) }.map_err(|_| {
            CheckpointError::Missing {
                library: self.name.clone(),
                function,
            }
        })
    }

    /// The process's checkpoint state.
    ///
    /// # Errors
    /// The driver refuses (no such CUDA process) or lacks the call.
    pub fn state(&self, pid: u32) -> Result<ProcessState, CheckpointError> {
        let get: Symbol<'_, StateFn> = self.symbol(Action::GetState.function())?;
        let mut raw: c_int = -1;
        // SAFETY: `cuCheckpointProcessGetState(int pid, CUprocessState *state)`; `raw` outlives
        // the call.
        let code = unsafe { get(as_pid(pid), &raw mut raw) };
        if code != 0 {
            return Err(refused(Action::GetState, pid, code));
        }
        Ok(ProcessState::from_raw(raw))
    }

    /// The driver's CUDA version (`cuDriverGetVersion`: 13000 for 13.0).
    ///
    /// # Errors
    /// The driver refuses or lacks the call.
    pub fn version(&self) -> Result<i32, CheckpointError> {
        let get: Symbol<'_, VersionFn> = self.symbol(Action::DriverVersion.function())?;
        let mut version: c_int = 0;
        // SAFETY: `cuDriverGetVersion(int *driverVersion)`; `version` outlives the call.
        let code = unsafe { get(&raw mut version) };
        if code != 0 {
            return Err(refused(Action::DriverVersion, 0, code));
        }
        Ok(version)
    }

    /// Restores `pid` onto other GPUs: each of `pairs` names a GPU it left and the one it
    /// takes instead (they must cover every GPU it was checkpointed on). Asked of a driver
    /// before [`GPU_PAIRS_SINCE`], whose restore has no pairs, it refuses before any call.
    ///
    /// # Errors
    /// The driver is too old, a UUID is malformed, or the driver refuses.
    pub fn restore_onto(&self, pid: u32, pairs: &[GpuPair]) -> Result<(), CheckpointError> {
        let driver_version = self.version()?;
        if driver_version < GPU_PAIRS_SINCE {
            return Err(CheckpointError::NoGpuPairs { driver_version });
        }
        let mut wire = pairs
            .iter()
            .map(|p| {
                Ok(RawPair {
                    old: uuid_bytes(&p.old)?,
                    new: uuid_bytes(&p.new)?,
                })
            })
            .collect::<Result<Vec<_>, CheckpointError>>()?;
        let restore: Symbol<'_, RestoreFn> = self.symbol(Action::Restore.function())?;
        let mut args = RestoreArgs {
            gpu_pairs: wire.as_mut_ptr(),
            gpu_pairs_count: u32::try_from(wire.len()).unwrap_or(u32::MAX),
            reserved: [0; 44],
            reserved1: 0,
        };
        // SAFETY: `cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)` with
        // 13.0's layout (checked above that the driver has it); `wire` outlives the call.
        let code = unsafe { restore(as_pid(pid), &raw mut args) };
        if code != 0 {
            return Err(refused(Action::Restore, pid, code));
        }
        Ok(())
    }

    /// Makes `action` on `pid`; `timeout_ms` bounds a lock in the driver (0: none).
    ///
    /// # Errors
    /// The driver refuses or lacks the call.
    pub fn act(&self, pid: u32, action: Action, timeout_ms: u32) -> Result<(), CheckpointError> {
        match action {
            Action::GetState => return self.state(pid).map(|_| ()),
            Action::DriverVersion => return self.version().map(|_| ()),
            _ => {}
        }
        let call: Symbol<'_, ActFn> = self.symbol(action.function())?;
        let mut args = Args {
            timeout_ms: if action == Action::Lock {
                timeout_ms
            } else {
                0
            },
            ..Args::default()
        };
        // SAFETY: each of the four takes `(int pid, CU…Args *args)` with a 64-byte args block,
        // which `args` is, zeroed but for the lock's timeout.
        let code = unsafe { call(as_pid(pid), &raw mut args) };
        if code != 0 {
            return Err(refused(action, pid, code));
        }
        Ok(())
    }
}

fn as_pid(pid: u32) -> c_int {
    // A pid above i32::MAX does not exist; -1 makes the driver refuse it.
    c_int::try_from(pid).unwrap_or(-1)
}

fn refused(action: Action, pid: u32, code: c_int) -> CheckpointError {
    CheckpointError::Driver {
        function: action.function(),
        pid,
        code: CuResult(code),
    }
}

/// Runs one helper call: loads `library`, makes `action` on `pid` (a restore onto the GPUs of
/// `pairs` where there are any), and answers with the state after it (where the driver tells
/// it), or the driver's version for [`Action::DriverVersion`].
#[must_use]
pub fn answer(
    library: &Path,
    pid: u32,
    action: Action,
    timeout_ms: u32,
    pairs: &[GpuPair],
) -> Answer {
    let driver = match Driver::load(&library.to_string_lossy()) {
        Ok(d) => d,
        Err(e) => return to_answer(e),
    };
    if action == Action::DriverVersion {
        return match driver.version() {
            Ok(v) => Answer::Ok {
                state: None,
                driver_version: Some(v),
            },
            Err(e) => to_answer(e),
        };
    }
    let done = if action == Action::Restore && !pairs.is_empty() {
        driver.restore_onto(pid, pairs)
    } else {
        driver.act(pid, action, timeout_ms)
    };
    if let Err(e) = done {
        return to_answer(e);
    }
    Answer::Ok {
        state: driver.state(pid).ok(),
        driver_version: None,
    }
}

fn to_answer(error: CheckpointError) -> Answer {
    match error {
        CheckpointError::Driver { function, code, .. } => Answer::Refused {
            function: function.to_owned(),
            code: code.0,
        },
        CheckpointError::NoGpuPairs { driver_version } => Answer::NoGpuPairs { driver_version },
        other => Answer::Error {
            reason: other.to_string(),
        },
    }
}
