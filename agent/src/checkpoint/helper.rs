//! The agent's side: each checkpoint call as a run of the helper process
//! (`gpuwarden-agent checkpoint …`), killed if it outlives its timeout.

use std::{path::PathBuf, process::Stdio, time::Duration};

use super::{Action, Answer, CheckpointError, CuResult, GpuPair, ProcessState};

/// How the agent reaches the driver's checkpoint calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Helper {
    /// The helper's program: the agent's own binary (`checkpoint` is one of its subcommands).
    pub program: PathBuf,
    /// The library the helper loads (default: `libcuda.so.1`, wherever the loader finds it).
    pub library: Option<PathBuf>,
}

impl Helper {
    /// Makes `action` on `pid` in a helper process, within `timeout` (the driver also bounds a
    /// lock by it); the process's state after it, where the driver told.
    ///
    /// # Errors
    /// The driver refused ([`CheckpointError::Driver`], with its code), the helper failed, or
    /// the call outlived `timeout` (the helper is killed).
    pub async fn act(
        &self,
        pid: u32,
        action: Action,
        timeout: Duration,
    ) -> Result<Option<ProcessState>, CheckpointError> {
        self.run(pid, action, timeout, &[])
            .await
            .map(|(state, _)| state)
    }

    /// Restores `pid` onto other GPUs, each of `pairs` naming a GPU it left and the one it
    /// takes instead; the helper refuses ([`CheckpointError::NoGpuPairs`]) where the driver
    /// is older than the pairs.
    ///
    /// # Errors
    /// As [`Self::act`], and [`CheckpointError::NoGpuPairs`].
    pub async fn restore_onto(
        &self,
        pid: u32,
        pairs: &[GpuPair],
        timeout: Duration,
    ) -> Result<Option<ProcessState>, CheckpointError> {
        self.run(pid, Action::Restore, timeout, pairs)
            .await
            .map(|(state, _)| state)
    }

    /// The driver's CUDA version (`cuDriverGetVersion`), asked in a helper process.
    ///
    /// # Errors
    /// As [`Self::act`]; a helper that answers no version is a helper error.
    pub async fn driver_version(&self, timeout: Duration) -> Result<i32, CheckpointError> {
        match self.run(0, Action::DriverVersion, timeout, &[]).await? {
            (_, Some(version)) => Ok(version),
            (_, None) => Err(CheckpointError::Helper {
                program: self.program.display().to_string(),
                reason: "no driver version in the answer".to_owned(),
            }),
        }
    }

    /// The helper's command line for `action` on `pid`. It names the agent as the helper's
    /// parent, so a helper whose agent is killed outright ends too ([`super::parent`]).
    fn command(
        &self,
        pid: u32,
        action: Action,
        timeout: Duration,
        pairs: &[GpuPair],
    ) -> tokio::process::Command {
        let timeout_ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        let mut command = tokio::process::Command::new(&self.program);
        command
            .args(["checkpoint", "--pid", &pid.to_string(), "--action"])
            .arg(action.word())
            .args(["--timeout-ms", &timeout_ms.to_string()])
            .args(["--parent", &std::process::id().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if let Some(library) = &self.library {
            command.arg("--library").arg(library);
        }
        for pair in pairs {
            command.arg("--gpu-pair").arg(pair.word());
        }
        command
    }

    async fn run(
        &self,
        pid: u32,
        action: Action,
        timeout: Duration,
        pairs: &[GpuPair],
    ) -> Result<(Option<ProcessState>, Option<i32>), CheckpointError> {
        let mut command = self.command(pid, action, timeout, pairs);
        let helper_error = |reason: String| CheckpointError::Helper {
            program: self.program.display().to_string(),
            reason,
        };
        let child = command.spawn().map_err(|e| helper_error(e.to_string()))?;
        let output = match tokio::time::timeout(timeout, child.wait_with_output()).await {
            Ok(output) => output.map_err(|e| helper_error(e.to_string()))?,
            // Dropping the wait kills the helper (`kill_on_drop`).
            Err(_) => {
                return Err(CheckpointError::Timeout {
                    action: action.function(),
                    pid,
                    timeout,
                });
            }
        };
        let line = String::from_utf8_lossy(&output.stdout);
        let answer: Answer = serde_json::from_str(line.trim()).map_err(|e| {
            helper_error(format!(
                "unreadable answer {:?} ({e}; exit {})",
                line.trim(),
                output.status
            ))
        })?;
        match answer {
            Answer::Ok {
                state,
                driver_version,
            } => Ok((state, driver_version)),
            Answer::NoGpuPairs { driver_version } => {
                Err(CheckpointError::NoGpuPairs { driver_version })
            }
            Answer::Refused { code, .. } => Err(CheckpointError::Driver {
                function: action.function(),
                pid,
                code: CuResult(code),
            }),
            Answer::Error { reason } => Err(helper_error(reason)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The helper is told whose death ends it: the agent's own pid (`parent::end_with` checks
    /// it is the helper's parent).
    #[test]
    fn the_helper_is_told_the_agent_is_its_parent() {
        let helper = Helper {
            program: PathBuf::from("gpuwarden-agent"),
            library: None,
        };
        let command = helper.command(7, Action::Unlock, Duration::from_secs(1), &[]);
        let args: Vec<String> = command
            .as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let at = args.iter().position(|a| a == "--parent").expect("--parent");
        assert_eq!(args[at + 1], std::process::id().to_string());
    }
}
