//! The helper's side: `libcuda.so.1` loaded with `dlopen` in this short-lived process, the
//! checkpoint functions resolved from it, one call made and its result printed as one JSON line
//! ([`super::Answer`]). The agent daemon never runs this code in its own process.

use std::{ffi::c_int, path::Path};

use libloading::{Library, Symbol};

use super::{Action, Answer, CheckpointError, CuResult, ProcessState};

/// The library the driver's user-space half ships as.
pub const LIBCUDA: &str = "libcuda.so.1";

/// The 64-byte argument block every checkpoint call takes (cuda.h: `CUcheckpointLockArgs`
/// is `{ unsigned timeoutMs; unsigned reserved0; cuuint64_t reserved1[7]; }`, the others are
/// reserved words that must be zero; restore's first field is a GPU-pair pointer, null here:
/// the process returns to the GPUs it left).
#[repr(C)]
#[derive(Default)]
struct Args {
    timeout_ms: u32,
    reserved0: u32,
    reserved1: [u64; 7],
}

type InitFn = unsafe extern "C" fn(u32) -> c_int;
type ActFn = unsafe extern "C" fn(c_int, *mut Args) -> c_int;
type StateFn = unsafe extern "C" fn(c_int, *mut c_int) -> c_int;

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

    /// Makes `action` on `pid`; `timeout_ms` bounds a lock in the driver (0: none).
    ///
    /// # Errors
    /// The driver refuses or lacks the call.
    pub fn act(&self, pid: u32, action: Action, timeout_ms: u32) -> Result<(), CheckpointError> {
        if action == Action::GetState {
            return self.state(pid).map(|_| ());
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

/// Runs one helper call: loads `library`, makes `action` on `pid`, and answers with the state
/// after it (where the driver tells it).
#[must_use]
pub fn answer(library: &Path, pid: u32, action: Action, timeout_ms: u32) -> Answer {
    let driver = match Driver::load(&library.to_string_lossy()) {
        Ok(d) => d,
        Err(e) => return to_answer(e),
    };
    if let Err(e) = driver.act(pid, action, timeout_ms) {
        return to_answer(e);
    }
    Answer::Ok {
        state: driver.state(pid).ok(),
    }
}

fn to_answer(error: CheckpointError) -> Answer {
    match error {
        CheckpointError::Driver { function, code, .. } => Answer::Refused {
            function: function.to_owned(),
            code: code.0,
        },
        other => Answer::Error {
            reason: other.to_string(),
        },
    }
}
