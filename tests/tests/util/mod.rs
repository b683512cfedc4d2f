//! Helpers shared by this crate's end-to-end tests: an embedded agent, the fake driver and
//! scripted GPU clients. What every test crate shares (the root policy, scratch directories that
//! clean up, test cgroups, the mock GPU list) is in `gpuwarden-test-support`.
#![allow(
    dead_code,
    reason = "each test binary includes this module and uses a different part of it"
)]
#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "test helpers: a failed set-up step should fail the test where it happened"
)]

use std::{
    fmt::Write as _,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
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
use gpuwarden_test_support::{TWO_MOCK_GPUS, TestCgroup, scratch};
use gpuwarden_tests::fake_driver::{FakeConfig, FakeDriver};
use tempfile::TempDir;

pub mod cluster;
pub mod kubelet;
pub mod otlp;
pub mod rig;
pub mod suspend;

/// Makes [`container_id`]s unique within this run.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// A 64-hex container id unique to this run.
pub fn container_id(seed: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!(
        "{seed}{}{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
    .bytes()
    {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    let mut id = String::with_capacity(64);
    for i in 0..4 {
        let word = h.rotate_left(i * 16) ^ (u64::from(i) * 0x9e37_79b9);
        write!(id, "{word:016x}").unwrap();
    }
    id
}

/// A pod UID unique to this run.
pub fn pod_uid(seed: &str) -> String {
    let id = container_id(seed);
    format!(
        "{}-{}-{}-{}-{}",
        &id[0..8],
        &id[8..12],
        &id[12..16],
        &id[16..20],
        &id[20..32]
    )
}

/// The fake driver mounted in a scratch directory, removed after the driver unmounts.
pub struct Driver {
    pub fake: FakeDriver,
    /// The mount point, `dev` in the scratch directory.
    pub dir: PathBuf,
    /// Dropped after `fake` (fields drop in order).
    scratch: TempDir,
}

impl Driver {
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

/// An agent running in this process, stopped when dropped.
pub struct TestAgent {
    pub socket: PathBuf,
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

impl TestAgent {
    /// Starts an agent watching `globs`, with its state in a scratch directory of its own, and
    /// waits until it answers.
    pub fn start(globs: &[String]) -> Self {
        let state = scratch("agent");
        let mut agent = Self::start_with(config(globs, state.path()));
        agent.scratch = Some(state);
        agent
    }

    /// Starts an agent with `config`; its state directory is the caller's.
    pub fn start_with(config: AgentConfig) -> Self {
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

    pub fn try_snapshot(&self) -> Result<Snapshot, api::ClientError> {
        self.runtime.block_on(api::client::snapshot(&self.socket))
    }

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
    pub fn stop(mut self) -> Result<(), String> {
        self.shutdown()
    }

    /// Stops the agent but leaves its pinned programs enforcing, as a crash would.
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
pub fn pin_dir(state_dir: &Path) -> PathBuf {
    PathBuf::from("/sys/fs/bpf").join(state_dir.file_name().unwrap())
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

/// The agent's settings for a test.
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
pub fn device<'a>(c: &'a Container, name: &str) -> Option<&'a DeviceUsage> {
    c.devices.iter().find(|d| d.device == name)
}

/// ioctls of class `class` on device `name`.
pub fn ioctls(c: &Container, name: &str, class: &str) -> u64 {
    device(c, name)
        .and_then(|d| d.ioctls.get(class).copied())
        .unwrap_or(0)
}

/// GPU memory on device `name`.
pub fn memory(c: &Container, name: &str) -> u64 {
    device(c, name).map_or(0, |d| d.memory_bytes)
}

/// GPU memory charged to the container's quota, over its devices.
pub fn used(c: &Container) -> u64 {
    c.quota
        .as_ref()
        .map_or(0, |q| q.devices.iter().map(|d| d.used_bytes).sum())
}

/// A `gpu-client` process, optionally inside a cgroup, driven line by line.
pub struct Client {
    pub pid: u32,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Client {
    pub fn spawn(dev: &Path, cgroup: Option<&TestCgroup>) -> Self {
        Self::spawn_in(dev, cgroup, None)
    }

    /// [`spawn`](Self::spawn) with `cwd` as the working directory (so `dev` may be relative).
    pub fn spawn_in(dev: &Path, cgroup: Option<&TestCgroup>, cwd: Option<&Path>) -> Self {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-client"));
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
    pub fn start(mut cmd: Command) -> Self {
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let pid = line
            .trim()
            .strip_prefix("ready pid=")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("gpu-client did not start: {line:?}"));
        Self {
            pid,
            child,
            stdin,
            stdout,
        }
    }

    /// Sends one command and returns its reply.
    pub fn send(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_owned()
    }

    /// Sends a command that must succeed; returns the reply.
    pub fn ok(&mut self, command: &str) -> String {
        let reply = self.send(command);
        assert!(reply.contains("ok"), "{command:?} answered {reply:?}");
        reply
    }

    /// A value from the reply of a command that must succeed.
    pub fn value(&mut self, command: &str, key: &str) -> u64 {
        let reply = self.ok(command);
        gpuwarden_tests::gpu_client::reply_value(&reply, key)
            .unwrap_or_else(|| panic!("{command:?} answered {reply:?}, no {key}"))
    }

    /// Waits for the process to end (e.g. killed by enforcement) and returns how it ended.
    pub fn wait(mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }

    /// [`Self::wait`], failing the test if the process has not ended within `limit`.
    pub fn wait_within(mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "pid {} still runs after {limit:?}",
                self.child.id()
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
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Reads the next reply line.
    pub fn reply(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim().to_owned()
    }

    /// Ends the process without freeing anything and waits for it.
    pub fn exit(mut self) {
        let _ = writeln!(self.stdin, "exit");
        let _ = self.stdin.flush();
        self.child.wait().unwrap();
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Makes a character device node `path` with numbers `major:minor` (a GPU node the cgroup
/// device program judges, without a driver behind it).
pub fn mknod(path: &Path, major: u32, minor: u32) {
    use std::os::unix::fs::FileTypeExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a plain syscall with a valid path.
    let rc = unsafe {
        libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(major, minor),
        )
    };
    assert_eq!(
        rc,
        0,
        "mknod {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    assert!(
        std::fs::metadata(path)
            .unwrap()
            .file_type()
            .is_char_device()
    );
}

/// Runs `script` in a shell that first moves itself into `cg`: whether it succeeded, and its
/// standard error.
fn sh_in(cg: &TestCgroup, script: &str) -> (bool, String) {
    let script = format!("echo $$ > {} && {script}", cg.procs().display());
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Opens `path` from a process inside `cg`; returns the errno (0 on success): `EPERM` from the
/// device program, `ENXIO` from a node with no driver behind it.
pub fn open_in(cg: &TestCgroup, path: &Path) -> i32 {
    match sh_in(cg, &format!("exec 3< {} && echo opened", path.display())) {
        (true, _) => 0,
        (false, e) if e.contains("Operation not permitted") => libc::EPERM,
        (false, e) if e.contains("No such device or address") => libc::ENXIO,
        (false, e) => panic!("open of {} ended otherwise: {e}", path.display()),
    }
}

/// `mknod path c major minor` from inside `cg`: 0, or the errno it failed with.
pub fn mknod_in(cg: &TestCgroup, path: &Path, major: u32, minor: u32) -> i32 {
    match sh_in(
        cg,
        &format!("exec mknod {} c {major} {minor}", path.display()),
    ) {
        (true, _) => 0,
        (false, e) if e.contains("Operation not permitted") => libc::EPERM,
        (false, e) => panic!("mknod {} ended otherwise: {e}", path.display()),
    }
}

/// Waits until `check` holds ([`gpuwarden_test_support::wait::until`], for up to
/// [`PATIENCE`](gpuwarden_test_support::wait::PATIENCE)); fails naming `what`.
pub fn wait_for(what: &str, check: impl FnMut() -> bool) {
    gpuwarden_test_support::wait::until(what, gpuwarden_test_support::wait::PATIENCE, check);
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
