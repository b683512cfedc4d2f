//! Driving a `gpu-client` process from a test.

use std::{
    io::{self, BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitStatus, Stdio},
    sync::mpsc::{self, Receiver, RecvTimeoutError},
    time::Duration,
};

use super::reply_value;

/// How long [`ScriptedClient::send`] waits for a reply unless told otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A scripted client that failed.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// The binary didn't start.
    #[error("cannot start {}: {source}", bin.display())]
    Spawn {
        /// The binary.
        bin: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The cgroup path can't be passed to the kernel.
    #[error("bad cgroup path {}", path.display())]
    CgroupPath {
        /// The path.
        path: PathBuf,
    },
    /// It started but didn't say `ready` (it prints why on stderr).
    #[error("gpu-client did not start: {line:?}")]
    NotReady {
        /// What it printed instead (empty when it exited).
        line: String,
    },
    /// Writing a command failed: the process is gone.
    #[error("cannot send {command:?}: {source}")]
    Send {
        /// The command.
        command: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The process closed its output before replying.
    #[error("gpu-client exited instead of answering {command:?}")]
    Exited {
        /// The command.
        command: String,
    },
    /// No reply in time.
    #[error("no reply to {command:?} within {after:?}")]
    Timeout {
        /// The command.
        command: String,
        /// How long it waited.
        after: Duration,
    },
    /// The reply wasn't `ok`.
    #[error("{command:?} answered {reply:?}")]
    Refused {
        /// The command.
        command: String,
        /// The reply.
        reply: String,
    },
    /// The reply was `ok` but lacked the value asked for.
    #[error("{command:?} answered {reply:?}, without {key}=")]
    NoValue {
        /// The command.
        command: String,
        /// The reply.
        reply: String,
        /// The key.
        key: String,
    },
    /// Waiting for the process failed.
    #[error("cannot wait for gpu-client: {source}")]
    Wait {
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// A `gpu-client` process, optionally started inside a cgroup, driven line by line. Killed when
/// dropped.
#[derive(Debug)]
pub struct ScriptedClient {
    pid: u32,
    child: Child,
    stdin: ChildStdin,
    replies: Receiver<String>,
    timeout: Duration,
}

impl ScriptedClient {
    /// Starts `bin` (the `gpu-client` binary: `env!("CARGO_BIN_EXE_gpu-client")` in this
    /// package's integration tests) on GPU 0 of the driver in `dir`, and waits for `ready`.
    ///
    /// With `cgroup` (a cgroup v2 directory), the process moves itself into it between `fork` and
    /// `exec`, so it is there before it opens anything.
    ///
    /// # Errors
    /// It didn't start or didn't get ready.
    pub fn spawn(bin: &Path, dir: &Path, cgroup: Option<&Path>) -> Result<Self, ScriptError> {
        Self::spawn_on_gpu(bin, dir, 0, cgroup)
    }

    /// [`spawn`](Self::spawn) opening `nvidia<gpu>`.
    ///
    /// # Errors
    /// It didn't start or didn't get ready.
    pub fn spawn_on_gpu(
        bin: &Path,
        dir: &Path,
        gpu: u32,
        cgroup: Option<&Path>,
    ) -> Result<Self, ScriptError> {
        let mut cmd = Command::new(bin);
        cmd.arg("--dir").arg(dir).arg("--gpu").arg(gpu.to_string());
        if let Some(cgroup) = cgroup {
            gpuwarden_runtime::cgroup::spawn_inside(&mut cmd, cgroup).map_err(|_| {
                ScriptError::CgroupPath {
                    path: cgroup.to_owned(),
                }
            })?;
        }
        let client = Self::start(cmd)?;
        // Started directly, it sees itself as the pid it has.
        if client.pid == client.child.id() {
            Ok(client)
        } else {
            Err(ScriptError::NotReady {
                line: format!("ready pid={}", client.pid),
            })
        }
    }

    /// Runs `cmd`, which starts a `gpu-client` with its stdin and stdout passed through (the
    /// client itself, or a container runtime in the foreground), and waits for its `ready`
    /// line; [`Self::pid`] is then the pid the client sees itself as (1 as a container's init).
    ///
    /// # Errors
    /// It didn't start or didn't get ready.
    pub fn start(mut cmd: Command) -> Result<Self, ScriptError> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().map_err(|source| ScriptError::Spawn {
            bin: PathBuf::from(cmd.get_program()),
            source,
        })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ScriptError::NotReady {
                line: String::new(),
            });
        };
        let (tx, replies) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut client = Self {
            pid: 0,
            child,
            stdin,
            replies,
            timeout: DEFAULT_TIMEOUT,
        };
        let ready = client.receive("(start)")?;
        match ready.strip_prefix("ready pid=").map(str::parse::<u32>) {
            Some(Ok(pid)) => {
                client.pid = pid;
                Ok(client)
            }
            _ => Err(ScriptError::NotReady { line: ready }),
        }
    }

    /// The process id, as the process sees itself.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// How long to wait for each reply from now on.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Sends one command line and returns the reply line (without the newline).
    ///
    /// # Errors
    /// The process is gone or didn't answer in time.
    pub fn send(&mut self, command: &str) -> Result<String, ScriptError> {
        self.send_only(command)?;
        self.receive(command)
    }

    /// Sends a command that must succeed (its reply starts `ok`, or `child: ok`); returns the
    /// reply.
    ///
    /// # Errors
    /// It didn't succeed.
    pub fn ok(&mut self, command: &str) -> Result<String, ScriptError> {
        let reply = self.send(command)?;
        let body = reply.strip_prefix("child: ").unwrap_or(&reply);
        if body == "ok" || body.starts_with("ok ") {
            Ok(reply)
        } else {
            Err(ScriptError::Refused {
                command: command.to_owned(),
                reply,
            })
        }
    }

    /// Sends a command that must succeed and returns the number after `key=` in its reply.
    ///
    /// # Errors
    /// It didn't succeed or the reply has no such value.
    pub fn value(&mut self, command: &str, key: &str) -> Result<u64, ScriptError> {
        let reply = self.ok(command)?;
        reply_value(&reply, key).ok_or_else(|| ScriptError::NoValue {
            command: command.to_owned(),
            reply,
            key: key.to_owned(),
        })
    }

    /// Sends a command without waiting for its reply (the process may be stopped or killed);
    /// [`Self::reply`] reads it.
    ///
    /// # Errors
    /// The process is gone.
    pub fn send_only(&mut self, command: &str) -> Result<(), ScriptError> {
        writeln!(self.stdin, "{command}")
            .and_then(|()| self.stdin.flush())
            .map_err(|source| ScriptError::Send {
                command: command.to_owned(),
                source,
            })
    }

    /// The next reply line.
    ///
    /// # Errors
    /// The process is gone or didn't answer in time.
    pub fn reply(&mut self) -> Result<String, ScriptError> {
        self.receive("(a command sent before)")
    }

    /// How the process ended, if it has.
    ///
    /// # Errors
    /// Asking failed.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>, ScriptError> {
        self.child
            .try_wait()
            .map_err(|source| ScriptError::Wait { source })
    }

    /// Waits for the process to end (killed by enforcement, say).
    ///
    /// # Errors
    /// Waiting failed.
    pub fn wait(mut self) -> Result<ExitStatus, ScriptError> {
        self.child
            .wait()
            .map_err(|source| ScriptError::Wait { source })
    }

    /// Sends `exit` (the process ends without freeing anything) and waits for it.
    ///
    /// # Errors
    /// Waiting failed.
    pub fn exit(mut self) -> Result<ExitStatus, ScriptError> {
        let _ = writeln!(self.stdin, "exit").and_then(|()| self.stdin.flush());
        self.child
            .wait()
            .map_err(|source| ScriptError::Wait { source })
    }

    /// Kills the process (SIGKILL) and waits for it.
    ///
    /// # Errors
    /// Waiting failed.
    pub fn kill(mut self) -> Result<ExitStatus, ScriptError> {
        let _ = self.child.kill();
        self.child
            .wait()
            .map_err(|source| ScriptError::Wait { source })
    }

    fn receive(&mut self, command: &str) -> Result<String, ScriptError> {
        match self.replies.recv_timeout(self.timeout) {
            Ok(line) => Ok(line),
            Err(RecvTimeoutError::Disconnected) => Err(ScriptError::Exited {
                command: command.to_owned(),
            }),
            Err(RecvTimeoutError::Timeout) => Err(ScriptError::Timeout {
                command: command.to_owned(),
                after: self.timeout,
            }),
        }
    }
}

impl Drop for ScriptedClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
