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
        }
    }
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
    },
    /// The driver refused.
    Refused {
        /// The driver function.
        function: String,
        /// Its `CUresult`.
        code: i32,
    },
    /// The call could not be made (library, symbol).
    Error {
        /// Why.
        reason: String,
    },
}
