//! The agent in the test's process ([`TestAgent`], on a runtime of its own, stopped when
//! dropped), the settings tests give it ([`config`]), and reading its snapshot.
#![expect(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "test helpers: a failed set-up step should fail the test where it happened"
)]

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use gpuwarden_agent::{
    config::{AgentConfig, Overrides},
    daemon,
};
use gpuwarden_agent_api::{
    self as api,
    snapshot::{Container, DeviceUsage, Snapshot},
};
use tempfile::TempDir;

use crate::{scratch, wait::wait_for};

/// An agent running in this process, stopped when dropped.
pub struct TestAgent {
    /// Its local API socket.
    pub socket: PathBuf,
    /// Its state directory.
    pub state_dir: PathBuf,
    /// Where its programs are pinned; removed (detaching them) when the agent is dropped.
    pub pin_dir: PathBuf,
    keep_pins: bool,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
    runtime: tokio::runtime::Runtime,
    /// The state directory when the agent made it ([`Self::start`]): removed once it stopped.
    scratch: Option<TempDir>,
}

/// Waits until no one holds the agent lock in `state_dir` (up to [`PATIENCE`](crate::wait::PATIENCE)),
/// so an agent started again in this process finds it free. The agent that held it let go when
/// it stopped, but tests share one process: a child another test forked holds a copy of every
/// fd this process had, the lock's among them, until it execs (on a loaded machine, a while;
/// one that joins a frozen cgroup before its `exec`, as long as the cgroup stays frozen). Seen
/// once in a full run: `agent_suspend`'s restart found the lock held by its own pid.
fn wait_lock_free(state_dir: &Path) {
    use std::os::fd::AsRawFd as _;
    let Ok(file) = std::fs::File::open(state_dir.join("agent.lock")) else {
        return; // never started here
    };
    wait_for("the last agent's lock to be let go of everywhere", || {
        // SAFETY: plain syscalls on an fd this function owns.
        unsafe {
            if libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) != 0 {
                return false;
            }
            libc::flock(file.as_raw_fd(), libc::LOCK_UN);
        }
        true
    });
}

impl TestAgent {
    /// Starts an agent watching `globs`, with its state in a scratch directory of its own, and
    /// waits until it answers.
    #[must_use]
    pub fn start(globs: &[String]) -> Self {
        let state = scratch("agent");
        let mut agent = Self::start_with(config(globs, state.path()));
        agent.scratch = Some(state);
        agent
    }

    /// Starts an agent with `config`; its state directory is the caller's.
    pub fn start_with(config: AgentConfig) -> Self {
        wait_lock_free(&config.state_dir);
        let state_dir = config.state_dir.clone();
        let socket = config.socket.clone();
        let pin_dir = config.bpf_pin_dir.clone().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn({
            move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                runtime
                    .block_on(daemon::run_until(config, async {
                        let _ = stopped.await;
                    }))
                    .map_err(|e| format!("{e}: {:?}", std::error::Error::source(&e)))
            }
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut agent = Self {
            socket,
            state_dir,
            pin_dir,
            keep_pins: false,
            stop: Some(stop),
            thread: Some(thread),
            runtime,
            scratch: None,
        };
        let deadline = Instant::now() + Duration::from_mins(1);
        loop {
            if agent.try_snapshot().is_ok() {
                return agent;
            }
            if agent
                .thread
                .as_ref()
                .is_some_and(std::thread::JoinHandle::is_finished)
            {
                let result = agent.thread.take().unwrap().join().unwrap();
                panic!("the agent stopped before answering: {result:?}");
            }
            assert!(
                Instant::now() < deadline,
                "the agent did not answer within 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Its snapshot, or why it did not answer.
    ///
    /// # Errors
    /// The agent did not answer on its socket.
    pub fn try_snapshot(&self) -> Result<Snapshot, api::ClientError> {
        self.runtime.block_on(api::client::snapshot(&self.socket))
    }

    /// Its snapshot.
    pub fn snapshot(&self) -> Snapshot {
        self.try_snapshot().unwrap()
    }

    /// The entry of the cgroup at `path`.
    pub fn container(&self, path: &str) -> Option<Container> {
        self.snapshot()
            .containers
            .into_iter()
            .find(|c| c.cgroup_path == path)
    }

    /// Stops the agent and returns how its run ended.
    ///
    /// # Errors
    /// Its run failed (the error and its source, as text), or its thread panicked.
    pub fn stop(mut self) -> Result<(), String> {
        self.shutdown()
    }

    /// Stops the agent but leaves its pinned programs enforcing, as a crash would.
    ///
    /// # Errors
    /// As [`Self::stop`].
    pub fn stop_keeping_pins(mut self) -> Result<(), String> {
        self.keep_pins = true;
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), String> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| "agent thread panicked".to_owned())?,
            None => Ok(()),
        }
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        let _ = self.shutdown();
        if !self.keep_pins {
            let _ = std::fs::remove_dir_all(&self.pin_dir);
        }
    }
}

/// The pin directory of an agent whose state lives in `state_dir` (unique per test agent, the
/// same for an agent restarted on the same state).
#[must_use]
pub fn pin_dir(state_dir: &Path) -> PathBuf {
    PathBuf::from("/sys/fs/bpf").join(state_dir.file_name().unwrap())
}

/// The agent's settings for a test.
#[must_use]
pub fn config(globs: &[String], state_dir: &Path) -> AgentConfig {
    let mut config = AgentConfig::load(
        None,
        Overrides {
            gpu_devices: Some(globs.to_vec()),
            socket: Some(state_dir.join("agent.sock")),
            state_dir: Some(state_dir.to_owned()),
            node_name: Some("test-node".to_owned()),
            ..Overrides::default()
        },
    )
    .unwrap();
    // Housekeeping runs all through the tests, so removing anything live would break their
    // exact counts.
    config.gc_interval = Duration::from_millis(100);
    config.bpf_pin_dir = Some(pin_dir(state_dir));
    config
}

/// The device entry `name` of a container, if any.
#[must_use]
pub fn device<'a>(c: &'a Container, name: &str) -> Option<&'a DeviceUsage> {
    c.devices.iter().find(|d| d.device == name)
}

/// ioctls of class `class` on device `name`.
#[must_use]
pub fn ioctls(c: &Container, name: &str, class: &str) -> u64 {
    device(c, name)
        .and_then(|d| d.ioctls.get(class).copied())
        .unwrap_or(0)
}

/// GPU memory on device `name`.
#[must_use]
pub fn memory(c: &Container, name: &str) -> u64 {
    device(c, name).map_or(0, |d| d.memory_bytes)
}

/// GPU memory charged to the container's quota, over its devices.
#[must_use]
pub fn used(c: &Container) -> u64 {
    c.quota
        .as_ref()
        .map_or(0, |q| q.devices.iter().map(|d| d.used_bytes).sum())
}

/// Waits until `agent`'s snapshot shows `session` in binding `state`; that snapshot.
pub fn wait_binding(agent: &TestAgent, session: &str, state: &str) -> Snapshot {
    let mut last = None;
    wait_for(&format!("session {session} to be {state}"), || {
        let s = agent.snapshot();
        let ok = s
            .bindings
            .iter()
            .any(|b| b.session_id == session && b.state == state);
        last = Some(s);
        ok
    });
    last.unwrap()
}
