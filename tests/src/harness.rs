//! The harness the end-to-end tests run on, over this crate's peers: the fake driver mounted in
//! a scratch directory ([`Driver`]), `gpu-client` processes driven line by line ([`Client`]),
//! the rig of a controller and an agent on the driver ([`rig`]), and the suspend tests' stand-in
//! `libcuda.so.1` and fake CUDA processes ([`suspend`]).
//!
//! The fixtures every test crate shares, and the agent and controller harnesses these build on,
//! are in `gpuwarden-test-support`; these stay here because they run this crate's binaries and
//! wrap its fake driver, which that crate can't link (this crate's `spinner` binary links it).
#![expect(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "test helpers: a failed set-up step should fail the test where it happened"
)]
#![expect(
    clippy::must_use_candidate,
    reason = "a test may ignore what a step answers (a reply, an exit status)"
)]

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use gpuwarden_agent::config::AgentConfig;
use gpuwarden_test_support::{TWO_MOCK_GPUS, TestCgroup, agent::config, scratch};
use tempfile::TempDir;

use crate::{
    fake_driver::{FakeConfig, FakeDriver},
    gpu_client::{ScriptError, ScriptedClient},
};

/// The rig of a controller and an agent on the fake driver.
pub mod rig;
/// The suspend tests' stand-in `libcuda.so.1` and fake CUDA processes.
pub mod suspend;

/// The fake driver mounted in a scratch directory, removed after the driver unmounts.
pub struct Driver {
    /// The driver.
    pub fake: FakeDriver,
    /// The mount point, `dev` in the scratch directory.
    pub dir: PathBuf,
    /// Dropped after `fake` (fields drop in order).
    scratch: TempDir,
}

impl Driver {
    /// Mounts the driver with its defaults (two 16 GiB GPUs) in a scratch directory tagged `tag`.
    pub fn mount(tag: &str) -> Self {
        Self::mount_with(tag, &FakeConfig::default())
    }

    /// [`Self::mount`] with `config` (MIG instances, other GPU sizes).
    pub fn mount_with(tag: &str, config: &FakeConfig) -> Self {
        let scratch = scratch(tag);
        let dir = scratch.path().join("dev");
        let fake = FakeDriver::mount(&dir, config).unwrap();
        Self { fake, dir, scratch }
    }

    /// The scratch directory the mount point is in (for files beside it).
    pub fn scratch(&self) -> &Path {
        self.scratch.path()
    }

    /// The glob the agent watches for this driver.
    pub fn glob(&self) -> String {
        format!("{}/nvidia*", self.dir.display())
    }
}

/// An agent config for `driver`'s device nodes as [`TWO_MOCK_GPUS`] (written beside the
/// driver's mount), registering with the controller at `controller`, with its state in
/// `state_dir`.
pub fn mock_gpu_config(driver: &Driver, controller: String, state_dir: &Path) -> AgentConfig {
    let mock = driver.scratch.path().join("mock.toml");
    std::fs::write(&mock, TWO_MOCK_GPUS).unwrap();
    let mut cfg = config(&[driver.glob()], state_dir);
    cfg.controller = Some(controller);
    cfg.mock_devices = Some(mock);
    cfg
}

/// A `gpu-client` process, optionally inside a cgroup, driven line by line: a
/// [`ScriptedClient`] whose every failure fails the test, waiting up to [`REPLY_PATIENCE`] for a
/// reply (a command may wait out a frozen cgroup). Killed when dropped.
pub struct Client {
    /// Its pid, as it sees itself.
    pub pid: u32,
    inner: ScriptedClient,
}

/// How long a [`Client`] waits for each reply before the test fails.
pub const REPLY_PATIENCE: Duration = Duration::from_mins(2);

/// What a [`Client`] step answered, or the test fails saying why.
fn must<T>(result: Result<T, ScriptError>) -> T {
    result.unwrap_or_else(|e| panic!("gpu-client: {e}"))
}

impl Client {
    /// Starts one on the driver at `dev`, inside `cgroup` if given.
    pub fn spawn(dev: &Path, cgroup: Option<&TestCgroup>) -> Self {
        Self::spawn_in(dev, cgroup, None)
    }

    /// [`spawn`](Self::spawn) with `cwd` as the working directory (so `dev` may be relative).
    pub fn spawn_in(dev: &Path, cgroup: Option<&TestCgroup>, cwd: Option<&Path>) -> Self {
        let mut cmd = Command::new(gpuwarden_test_support::bin("gpu-client"));
        cmd.arg("--dir").arg(dev);
        if let Some(cwd) = cwd {
            cmd.current_dir(cwd);
        }
        if let Some(cg) = cgroup {
            gpuwarden_runtime::cgroup::spawn_inside(&mut cmd, &cg.dir).unwrap();
        }
        Self::start(cmd)
    }

    /// Runs `cmd`, which starts a `gpu-client` with its stdin and stdout passed through (a
    /// container runtime in the foreground, say), and waits for the client's `ready` line.
    /// `pid` is the pid the client sees itself as (1 as a container's init).
    pub fn start(cmd: Command) -> Self {
        let mut inner = must(ScriptedClient::start(cmd));
        inner.set_timeout(REPLY_PATIENCE);
        Self {
            pid: inner.pid(),
            inner,
        }
    }

    /// Sends one command and returns its reply.
    pub fn send(&mut self, command: &str) -> String {
        must(self.inner.send(command)).trim().to_owned()
    }

    /// Sends a command that must succeed; returns the reply.
    pub fn ok(&mut self, command: &str) -> String {
        must(self.inner.ok(command)).trim().to_owned()
    }

    /// A value from the reply of a command that must succeed.
    pub fn value(&mut self, command: &str, key: &str) -> u64 {
        must(self.inner.value(command, key))
    }

    /// Waits for the process to end (e.g. killed by enforcement) and returns how it ended;
    /// fails the test after 2 minutes rather than hang CI (a kill that never came).
    pub fn wait(self) -> std::process::ExitStatus {
        self.wait_within(Duration::from_mins(2))
    }

    /// [`Self::wait`], failing the test if the process has not ended within `limit`.
    pub fn wait_within(mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = must(self.inner.try_wait()) {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "pid {} still runs after {limit:?}",
                self.pid
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process's state letter from `/proc/<pid>/stat` (`T` when stopped).
    pub fn state(&self) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
        stat.rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next())
            .unwrap_or('?')
    }

    /// Sends a command without waiting for the reply (the process may be stopped or killed).
    pub fn send_only(&mut self, command: &str) {
        must(self.inner.send_only(command));
    }

    /// Reads the next reply line.
    pub fn reply(&mut self) -> String {
        must(self.inner.reply()).trim().to_owned()
    }

    /// Ends the process without freeing anything and waits for it.
    pub fn exit(self) {
        must(self.inner.exit());
    }
}
