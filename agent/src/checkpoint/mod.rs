//! Suspending a workload's GPU state to host memory and back, through the CUDA driver's
//! checkpoint calls (`cuCheckpointProcessLock` / `Checkpoint` / `Restore` / `Unlock`, driver
//! 550+; docs/suspend.md).
//!
//! Those calls live in `libcuda.so.1` and act on another process by pid. The agent never loads
//! libcuda into its own address space: every call runs in a short-lived helper process,
//! `gpuwarden-agent checkpoint --pid N --action …` ([`driver`], the helper's side), which the
//! agent starts and bounds with a timeout ([`helper`], the agent's side). A driver refusal comes
//! back typed, with its `CUresult` code, so the caller can say why it fell back.

pub mod driver;
pub mod helper;
pub mod parent;

use serde::{Deserialize, Serialize};

/// One checkpoint call on a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    /// `cuCheckpointProcessLock`: block the process's CUDA calls (RUNNING → LOCKED).
    Lock,
    /// `cuCheckpointProcessCheckpoint`: copy its GPU memory to host memory and release it on
    /// the GPU (LOCKED → CHECKPOINTED).
    Checkpoint,
    /// `cuCheckpointProcessRestore`: take the GPUs back and copy the memory back
    /// (CHECKPOINTED → LOCKED).
    Restore,
    /// `cuCheckpointProcessUnlock`: let its CUDA calls run (LOCKED → RUNNING).
    Unlock,
    /// `cuCheckpointProcessGetState`: where it stands.
    GetState,
    /// `cuDriverGetVersion`: the driver's CUDA version (`13000` for 13.0); no process.
    DriverVersion,
}

impl Action {
    /// The driver function it calls.
    #[must_use]
    pub const fn function(self) -> &'static str {
        match self {
            Self::Lock => "cuCheckpointProcessLock",
            Self::Checkpoint => "cuCheckpointProcessCheckpoint",
            Self::Restore => "cuCheckpointProcessRestore",
            Self::Unlock => "cuCheckpointProcessUnlock",
            Self::GetState => "cuCheckpointProcessGetState",
            Self::DriverVersion => "cuDriverGetVersion",
        }
    }

    /// Its name on the helper's command line.
    #[must_use]
    pub const fn word(self) -> &'static str {
        match self {
            Self::Lock => "lock",
            Self::Checkpoint => "checkpoint",
            Self::Restore => "restore",
            Self::Unlock => "unlock",
            Self::GetState => "get-state",
            Self::DriverVersion => "driver-version",
        }
    }
}

/// The first driver version (`cuDriverGetVersion`, CUDA 13.0, driver 580) whose restore takes
/// GPU pairs: older drivers restore a process only onto the GPUs it left
/// (`CUcheckpointGpuPair` arrived with CUDA 13.0, as the CUDA bindings gate it).
pub const GPU_PAIRS_SINCE: i32 = 13_000;

/// One GPU of a checkpointed process and the GPU it is restored onto
/// (`CUcheckpointGpuPair { CUuuid oldUuid; CUuuid newUuid; }`), by their UUIDs as NVML and
/// `nvidia-smi` print them (`GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPair {
    /// The GPU the process left.
    pub old: String,
    /// The GPU it goes to.
    pub new: String,
}

impl GpuPair {
    /// The pair as the helper's command line takes it: `OLD=NEW`.
    #[must_use]
    pub fn word(&self) -> String {
        format!("{}={}", self.old, self.new)
    }
}

impl std::str::FromStr for GpuPair {
    type Err = CheckpointError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (old, new) = text.split_once('=').ok_or_else(|| CheckpointError::Uuid {
            uuid: text.to_owned(),
        })?;
        uuid_bytes(old)?;
        uuid_bytes(new)?;
        Ok(Self {
            old: old.to_owned(),
            new: new.to_owned(),
        })
    }
}

/// The 16 bytes of a GPU's UUID (`CUuuid`) from its printed form,
/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (the `GPU-` prefix optional).
///
/// # Errors
/// Not 32 hex digits in the 8-4-4-4-12 groups.
pub fn uuid_bytes(uuid: &str) -> Result<[u8; 16], CheckpointError> {
    let bad = || CheckpointError::Uuid {
        uuid: uuid.to_owned(),
    };
    let hex = uuid.strip_prefix("GPU-").unwrap_or(uuid);
    let groups: Vec<&str> = hex.split('-').collect();
    if groups.iter().map(|g| g.len()).collect::<Vec<_>>() != [8, 4, 4, 4, 12] {
        return Err(bad());
    }
    let digits: Vec<u8> = groups.concat().into_bytes();
    let mut out = [0u8; 16];
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        let text = std::str::from_utf8(pair).map_err(|_| bad())?;
        *byte = u8::from_str_radix(text, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

/// A process's checkpoint state (`CUprocessState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    /// `CU_PROCESS_STATE_RUNNING`.
    Running,
    /// `CU_PROCESS_STATE_LOCKED`.
    Locked,
    /// `CU_PROCESS_STATE_CHECKPOINTED`.
    Checkpointed,
    /// `CU_PROCESS_STATE_FAILED`: a checkpoint or restore failed part-way.
    Failed,
    /// A value this agent does not know (newer drivers add `CHECKPOINTING`, `RESTORING`):
    /// busy or unknown.
    Other(i32),
}

impl ProcessState {
    /// The state for the driver's value.
    #[must_use]
    pub const fn from_raw(raw: i32) -> Self {
        match raw {
            0 => Self::Running,
            1 => Self::Locked,
            2 => Self::Checkpointed,
            3 => Self::Failed,
            other => Self::Other(other),
        }
    }
}

/// A `CUresult` the driver answered, with the name cuda.h gives the codes the checkpoint calls
/// are documented to return.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CuResult(pub i32);

impl CuResult {
    /// `CUDA_ERROR_NOT_SUPPORTED`: what the driver answers for what it cannot checkpoint.
    pub const NOT_SUPPORTED: Self = Self(801);

    /// cuda.h's name for the code, where it is one of the documented ones.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self.0 {
            0 => "CUDA_SUCCESS",
            1 => "CUDA_ERROR_INVALID_VALUE",
            2 => "CUDA_ERROR_OUT_OF_MEMORY",
            3 => "CUDA_ERROR_NOT_INITIALIZED",
            100 => "CUDA_ERROR_NO_DEVICE",
            401 => "CUDA_ERROR_ILLEGAL_STATE",
            801 => "CUDA_ERROR_NOT_SUPPORTED",
            _ => "CUresult",
        }
    }
}

impl std::fmt::Display for CuResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// Why a checkpoint call did not happen.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// `libcuda.so.1` could not be loaded (no NVIDIA driver on this node).
    #[error("cannot load {library}: {reason}")]
    Load {
        /// The library asked for.
        library: String,
        /// The loader's words.
        reason: String,
    },
    /// The driver lacks a checkpoint function (a driver before 550, or before 570 for the
    /// separate lock).
    #[error("{library} has no {function} (the driver is older than the checkpoint API)")]
    Missing {
        /// The library.
        library: String,
        /// The function.
        function: &'static str,
    },
    /// The driver answered an error.
    #[error("{function} on process {pid}: {code}")]
    Driver {
        /// The call.
        function: &'static str,
        /// The process.
        pid: u32,
        /// What the driver answered.
        code: CuResult,
    },
    /// The helper could not be started or read.
    #[error("checkpoint helper {program}: {reason}")]
    Helper {
        /// The helper's program.
        program: String,
        /// What went wrong.
        reason: String,
    },
    /// Asked to restore onto other GPUs, the driver is older than the GPU pairs
    /// ([`GPU_PAIRS_SINCE`]): the process can only return to the GPUs it left.
    #[error(
        "the driver (CUDA version {driver_version}) cannot restore onto other GPUs: that needs \
         {GPU_PAIRS_SINCE} (CUDA 13.0, driver 580) or later"
    )]
    NoGpuPairs {
        /// What `cuDriverGetVersion` answered.
        driver_version: i32,
    },
    /// A GPU UUID that is not one (`GPU-` and 32 hex digits in 8-4-4-4-12 groups).
    #[error("{uuid:?} is not a GPU UUID")]
    Uuid {
        /// The text.
        uuid: String,
    },
    /// The helper did not answer in time (it was killed).
    #[error("{action} on process {pid} did not finish within {} ms", timeout.as_millis())]
    Timeout {
        /// The call.
        action: &'static str,
        /// The process.
        pid: u32,
        /// The limit.
        timeout: std::time::Duration,
    },
}

impl CheckpointError {
    /// The driver's code, when the driver refused.
    #[must_use]
    pub const fn code(&self) -> Option<CuResult> {
        match self {
            Self::Driver { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// What the helper prints on stdout: one JSON line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum Answer {
    /// The call succeeded; the process's state after it, where the helper asked.
    Ok {
        /// The process's state, from `cuCheckpointProcessGetState`.
        state: Option<ProcessState>,
        /// The driver's version, for `driver-version`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        driver_version: Option<i32>,
    },
    /// The driver refused.
    Refused {
        /// The driver function.
        function: String,
        /// Its `CUresult`.
        code: i32,
    },
    /// Asked to restore onto other GPUs, the driver is too old for it.
    NoGpuPairs {
        /// What `cuDriverGetVersion` answered.
        driver_version: i32,
    },
    /// The call could not be made (library, symbol).
    Error {
        /// Why.
        reason: String,
    },
}
