//! The controller, the agent, the workloads and NVML, as gpu-check drives them.
//!
//! A [`Kit`] names the programs: the release binaries and the scripts beside them, or, for a
//! dry run, `dry.py` standing in for all of them. Every program runs through a
//! [`Guard`], logs into the results folder, and every wait has a limit.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::BTreeMap,
    ffi::OsString,
    fmt::Write as _,
    io::{BufRead, BufReader, Read as _, Write as _},
    path::{Path, PathBuf},
    process::{ChildStdin, Command, ExitStatus},
    sync::{Mutex, atomic::AtomicUsize, atomic::Ordering, mpsc},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

use super::{Record, parse_record, procs::Guard, runner::Section, runner::tail};

/// The controller's address for the check (beside `cargo xtask run`'s).
const LISTEN: &str = "127.0.0.1:50061";

/// The GPU the real agent sees in a dry run with real binaries (`device_node` appended when the
/// fake driver serves it).
const MOCK_DEVICES: &str = r#"[[devices]]
uuid = "GPU-00000000-0000-0000-0000-00000000d0d0"
model_name = "gpu-check dry run"
numa_node = 0
sm_count = 132
memory_size = "80G"
is_mig_device = false
"#;

/// The tests' fake NVIDIA driver and synthetic client, when the binaries folder has them.
const FAKE_DRIVER: &str = "fake-nvidia";
const GPU_CLIENT: &str = "gpu-client";

/// The programs a run uses.
#[derive(Debug, Clone)]
pub struct Kit {
    /// Folder of `gpuwarden`, `gpuwarden-agent`, `gpuwarden-controller`.
    pub bin: PathBuf,
    /// Folder of `workload.py`, `nvml.py`, `dry.py`.
    pub scripts: PathBuf,
    /// The Python that runs the scripts.
    pub python: PathBuf,
    /// Stand-ins (`dry.py`) for the workloads and NVML.
    pub dry: bool,
    /// With `dry`: the real binaries from `bin` (the agent on a mock 80 GiB GPU) rather than
    /// stand-ins, so their command lines and the sessions are rehearsed too.
    pub real_binaries: bool,
}

impl Kit {
    /// Whether a dry run with real binaries also has the fake driver and the synthetic client
    /// (`target/debug` after building the tests), so the stand-in workloads allocate for real.
    #[must_use]
    pub fn fake_driver(&self) -> bool {
        self.dry
            && self.real_binaries
            && self.bin.join(FAKE_DRIVER).is_file()
            && self.bin.join(GPU_CLIENT).is_file()
    }

    /// `gpuwarden-controller`, `gpuwarden-agent` or `gpuwarden`.
    fn tool(&self, name: &str, state: &Path) -> Command {
        if self.dry && !self.real_binaries {
            let mut c = Command::new(&self.python);
            c.arg(self.scripts.join("dry.py"))
                .arg(name)
                .env("GPUCHECK_DRY_STATE", state);
            c
        } else {
            Command::new(self.bin.join(name))
        }
    }

    /// The workload's program and leading arguments.
    fn workload_argv(&self) -> Vec<OsString> {
        if self.dry {
            vec![
                self.python.clone().into(),
                self.scripts.join("dry.py").into(),
                "workload".into(),
            ]
        } else {
            vec![
                self.python.clone().into(),
                self.scripts.join("workload.py").into(),
            ]
        }
    }

    /// The suspend section's workload (`suspend.py`; `dry.py workload suspend` in a dry run).
    fn suspend_argv(&self) -> Vec<OsString> {
        if self.dry {
            let mut argv = self.workload_argv();
            argv.push("suspend".into());
            argv
        } else {
            vec![
                self.python.clone().into(),
                self.scripts.join("suspend.py").into(),
            ]
        }
    }

    fn nvml(&self, state: &Path) -> Command {
        let mut c = Command::new(&self.python);
        if self.dry {
            c.arg(self.scripts.join("dry.py"))
                .arg("nvml")
                .env("GPUCHECK_DRY_STATE", state);
        } else {
            c.arg(self.scripts.join("nvml.py"));
        }
        c
    }
}

/// Runs `cmd` to its end within `limit`; its stdout.
///
/// # Errors
/// It can't start, takes longer than `limit` (it is killed), or exits non-zero.
pub fn capture(cmd: Command, label: &str, log: &Path, limit: Duration) -> anyhow::Result<Vec<u8>> {
    let (status, out) = run_to_end(cmd, label, log, limit)?;
    if !status.success() {
        bail!("{label} failed ({status}); {}", tail(log, 3));
    }
    Ok(out)
}

/// Runs `cmd` to its end within `limit`; its exit status and stdout, whatever the status.
///
/// # Errors
/// It can't start, or takes longer than `limit` (it is killed).
pub fn run_to_end(
    cmd: Command,
    label: &str,
    log: &Path,
    limit: Duration,
) -> anyhow::Result<(ExitStatus, Vec<u8>)> {
    let mut g = Guard::spawn(cmd, label, log, true, false)?;
    let mut out = g.take_stdout().context("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out.read_to_end(&mut buf);
        buf
    });
    let Some(status) = g.wait_for(limit) else {
        g.kill();
        bail!("{label} took longer than {} s", limit.as_secs());
    };
    Ok((status, reader.join().unwrap_or_default()))
}

/// One GPU as NVML sees it; a figure NVML can't give is `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NvmlGpu {
    /// Its name.
    pub name: Option<String>,
    /// Its UUID as NVML prints it (`GPU-…`).
    pub uuid: Option<String>,
    /// Total memory in bytes.
    pub total: Option<u64>,
    /// SM clock, MHz.
    pub sm_clock_mhz: Option<u64>,
    /// Power draw, mW.
    pub power_mw: Option<u64>,
    /// `nvmlClocksEventReasons` bits.
    pub throttle_reasons: Option<u64>,
    /// Per process: its bytes, `None` when NVML has no figure.
    pub processes: BTreeMap<u32, Option<u64>>,
    /// MIG mode (current, pending: 1 enabled, 0 disabled); `None` where NVML has no MIG.
    pub mig_mode: Option<(u64, u64)>,
    /// The MIG instances, read only.
    pub mig_instances: Vec<MigInstance>,
}

/// One MIG instance as `nvml.py` read it on its MIG device handle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigInstance {
    /// NVML's name (`NVIDIA H200 MIG 1g.18gb`).
    pub name: Option<String>,
    /// `MIG-…`.
    pub uuid: Option<String>,
    /// The instance's memory and what of it is used, bytes (`nvmlDeviceGetMemoryInfo` on the
    /// MIG handle).
    pub memory_total: Option<u64>,
    /// As above.
    pub memory_used: Option<u64>,
    /// Each call the agent reads a GPU through, asked on the MIG handle: `ok`, or NVML's error.
    pub signals: BTreeMap<String, String>,
}

impl MigInstance {
    fn parse(v: &Value) -> Self {
        let text = |key: &str| v[key].as_str().map(str::to_owned);
        Self {
            name: text("name"),
            uuid: text("uuid"),
            memory_total: v["memory_total"].as_u64(),
            memory_used: v["memory_used"].as_u64(),
            signals: v["signals"]
                .as_object()
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, a)| Some((k.clone(), a.as_str()?.to_owned())))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

/// NVML's document (`nvml.py`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Nvml {
    /// The driver version.
    pub driver: Option<String>,
    /// The GPUs.
    pub gpus: Vec<NvmlGpu>,
}

impl Nvml {
    /// Reads `nvml.py`'s output.
    ///
    /// # Errors
    /// It says NVML failed (why), or isn't the document.
    pub fn parse(bytes: &[u8]) -> anyhow::Result<Self> {
        let v: Value = serde_json::from_slice(bytes).context("NVML helper printed no JSON")?;
        if v["ok"] != Value::Bool(true) {
            bail!("NVML: {}", v["error"].as_str().unwrap_or("no reason given"));
        }
        let gpus = v["gpus"]
            .as_array()
            .context("NVML: no gpus")?
            .iter()
            .map(|g| NvmlGpu {
                name: g["name"].as_str().map(str::to_owned),
                uuid: g["uuid"].as_str().map(str::to_owned),
                total: g["total"].as_u64(),
                sm_clock_mhz: g["sm_clock_mhz"].as_u64(),
                power_mw: g["power_mw"].as_u64(),
                throttle_reasons: g["throttle_reasons"].as_u64(),
                processes: g["processes"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_u64())))
                            .collect()
                    })
                    .unwrap_or_default(),
                mig_mode: g["mig"]["current"]
                    .as_u64()
                    .zip(g["mig"]["pending"].as_u64()),
                mig_instances: g["mig"]["instances"]
                    .as_array()
                    .map(|v| v.iter().map(MigInstance::parse).collect())
                    .unwrap_or_default(),
            })
            .collect();
        Ok(Self {
            driver: v["driver"].as_str().map(str::to_owned),
            gpus,
        })
    }

    /// NVML's bytes for `pid` over every GPU.
    ///
    /// # Errors
    /// NVML lists no such process, or gives no figure for it.
    pub fn process_bytes(&self, pid: u32) -> anyhow::Result<u64> {
        let figures: Vec<Option<u64>> = self
            .gpus
            .iter()
            .filter_map(|g| g.processes.get(&pid).copied())
            .collect();
        if figures.is_empty() {
            bail!("NVML lists no process {pid}");
        }
        figures
            .iter()
            .try_fold(0u64, |sum, f| f.map(|b| sum + b))
            .with_context(|| format!("NVML has no memory figure for pid {pid}"))
    }

    /// SM clock, power and throttle reasons of the first GPU, for a row's notes.
    #[must_use]
    pub fn conditions(&self) -> String {
        let Some(g) = self.gpus.first() else {
            return "NVML: no GPU".into();
        };
        let or = |v: Option<u64>| v.map_or_else(|| "?".to_owned(), |v| v.to_string());
        format!(
            "SM {} MHz, {} W, throttle reasons {}",
            or(g.sm_clock_mhz),
            g.power_mw
                .map_or_else(|| "?".to_owned(), |p| (p / 1000).to_string()),
            g.throttle_reasons
                .map_or_else(|| "?".to_owned(), |r| format!("{r:#x}"))
        )
    }
}

/// The controller and the agent, and how to start the rest.
pub struct Rig {
    /// The programs.
    pub kit: Kit,
    /// Where logs go.
    pub out: PathBuf,
    state: tempfile::TempDir,
    url: String,
    controller: Mutex<Option<Guard>>,
    agent: Mutex<Option<Guard>>,
    runs: AtomicUsize,
    /// The fake driver (a dry run with it), and where it is mounted.
    fake: Mutex<Option<Guard>>,
}

impl Rig {
    /// Starts the controller (the agent is started by the first section).
    ///
    /// # Errors
    /// The controller can't be started.
    pub fn start(kit: Kit, out: PathBuf) -> anyhow::Result<Self> {
        let state = tempfile::Builder::new().prefix("gpu-check").tempdir()?;
        let mut cmd = kit.tool("gpuwarden-controller", &state.path().join("dry"));
        cmd.args(["run", "--listen", LISTEN, "--state-dir"])
            .arg(state.path().join("controller"));
        let controller =
            Guard::spawn(cmd, "controller", &out.join("controller.log"), false, false)?;
        let rig = Self {
            kit,
            out,
            url: format!("http://{LISTEN}"),
            state,
            controller: Mutex::new(Some(controller)),
            agent: Mutex::new(None),
            runs: AtomicUsize::new(0),
            fake: Mutex::new(None),
        };
        if rig.kit.fake_driver() {
            rig.mount_fake_driver()?;
        }
        Ok(rig)
    }

    /// Where the fake driver is mounted.
    fn fake_dir(&self) -> PathBuf {
        self.state.path().join("fake-nvidia")
    }

    /// Mounts the fake driver (one 80 GiB GPU) and waits until it says it is ready.
    fn mount_fake_driver(&self) -> anyhow::Result<()> {
        std::fs::create_dir_all(self.fake_dir())?;
        let mut cmd = Command::new(self.kit.bin.join(FAKE_DRIVER));
        cmd.arg("--mount")
            .arg(self.fake_dir())
            .args(["--gpus", "1", "--memory", "80g"]);
        let log = self.out.join("fake-nvidia.log");
        let mut g = Guard::spawn(cmd, "fake driver", &log, true, false)?;
        let out = g.take_stdout().context("no stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
        if !line.starts_with("ready") {
            bail!("the fake driver did not mount: {}", tail(&log, 3));
        }
        *self.fake.locked() = Some(g);
        Ok(())
    }

    fn dry_state(&self) -> PathBuf {
        self.state.path().join("dry")
    }

    fn socket(&self) -> PathBuf {
        self.state.path().join("agent.sock")
    }

    /// The controller's and the current agent's logs.
    #[must_use]
    pub fn logs(&self) -> Vec<PathBuf> {
        let n = self.runs.load(Ordering::SeqCst);
        let mut logs = vec![self.out.join("controller.log")];
        if n > 0 {
            logs.push(self.out.join(format!("agent-{n}.log")));
        }
        logs
    }

    /// Whether an agent runs.
    #[must_use]
    pub fn agent_running(&self) -> bool {
        self.agent
            .locked()
            .as_mut()
            .is_some_and(|a| a.try_wait().is_none())
    }

    /// Starts the agent (without pins: stopping it loses its maps) and waits until it answers.
    ///
    /// # Errors
    /// It exits or does not answer within 60 s.
    pub fn start_agent(&self) -> anyhow::Result<()> {
        self.stop_agent();
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        let log = self.out.join(format!("agent-{n}.log"));
        let mut cmd = self.kit.tool("gpuwarden-agent", &self.dry_state());
        cmd.args([
            "run",
            "--node-name",
            "gpu-check",
            "--no-pin",
            "--controller",
            &self.url,
        ])
        .arg("--state-dir")
        .arg(self.state.path().join("agent"))
        .arg("--socket")
        .arg(self.socket());
        if self.kit.dry && self.kit.real_binaries {
            let mock = self.state.path().join("mock-devices.toml");
            let mut devices = MOCK_DEVICES.to_owned();
            if self.kit.fake_driver() {
                let dir = self.fake_dir();
                let _ = writeln!(
                    devices,
                    "device_node = \"{}\"",
                    dir.join("nvidia0").display()
                );
                let d = dir.display();
                cmd.arg("--gpu-devices")
                    .arg(format!("{d}/nvidia[0-9]*,{d}/nvidiactl,{d}/nvidia-uvm*"));
            }
            std::fs::write(&mock, devices)?;
            cmd.arg("--mock-devices").arg(mock);
        }
        let agent = Guard::spawn(cmd, "agent", &log, false, false)?;
        *self.agent.locked() = Some(agent);
        let deadline = Instant::now() + Duration::from_mins(1);
        loop {
            if self.snapshot().is_ok() {
                return Ok(());
            }
            if !self.agent_running() {
                bail!("the agent exited at start: {}", tail(&log, 5));
            }
            if Instant::now() > deadline {
                bail!("the agent did not answer within 60 s: {}", tail(&log, 5));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops the agent (SIGTERM, then SIGKILL after 15 s).
    pub fn stop_agent(&self) {
        let taken = self.agent.locked().take();
        if let Some(mut a) = taken {
            if a.try_wait().is_none() {
                let _ = a.signal(libc::SIGTERM);
                a.wait_for(Duration::from_secs(15));
            }
            drop(a);
        }
    }

    /// Stops the agent, the controller and the fake driver (SIGTERM: it unmounts).
    pub fn stop(&self) {
        self.stop_agent();
        self.controller.locked().take();
        let fake = self.fake.locked().take();
        if let Some(mut f) = fake {
            if f.try_wait().is_none() {
                let _ = f.signal(libc::SIGTERM);
                f.wait_for(Duration::from_secs(10));
            }
            drop(f);
            // Killed rather than stopped, it leaves its mount behind.
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.fake_dir())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }

    /// The agent's snapshot.
    ///
    /// # Errors
    /// No agent answers within 15 s.
    pub fn snapshot(&self) -> anyhow::Result<Value> {
        let mut cmd = self.kit.tool("gpuwarden-agent", &self.dry_state());
        cmd.args(["snapshot", "--json", "--socket"])
            .arg(self.socket());
        let out = capture(
            cmd,
            "snapshot",
            &self.out.join("snapshot.log"),
            Duration::from_secs(15),
        )?;
        serde_json::from_slice(&out).context("the snapshot is not JSON")
    }

    /// `gpuwarden-agent probe-hooks --json`.
    ///
    /// # Errors
    /// It fails or prints no JSON.
    pub fn probe_hooks(&self) -> anyhow::Result<Value> {
        let mut cmd = self.kit.tool("gpuwarden-agent", &self.dry_state());
        cmd.args(["probe-hooks", "--json"]);
        let out = capture(
            cmd,
            "probe-hooks",
            &self.out.join("probe-hooks.log"),
            Duration::from_mins(1),
        )?;
        serde_json::from_slice(&out).context("probe-hooks printed no JSON")
    }

    /// `gpuwarden-agent mig-table`: each GPU's MIG profile table from NVML against the agent's
    /// placement rules (read only).
    ///
    /// # Errors
    /// It fails or prints no JSON.
    pub fn mig_table(&self) -> anyhow::Result<Value> {
        let mut cmd = self.kit.tool("gpuwarden-agent", &self.dry_state());
        cmd.arg("mig-table");
        let out = capture(
            cmd,
            "mig-table",
            &self.out.join("mig-table.log"),
            Duration::from_mins(1),
        )?;
        serde_json::from_slice(&out).context("mig-table printed no JSON")
    }

    /// `gpuwarden-agent VERB --session SESSION` on the agent's socket (`suspend`,
    /// `resume-suspended`): what it printed. The agent answers at once and acts after; the
    /// outcome shows in the session's events.
    ///
    /// # Errors
    /// The agent refused the request, or no agent answers within 30 s.
    pub fn agent_request(&self, verb: &str, session: &str) -> anyhow::Result<String> {
        let mut cmd = self.kit.tool("gpuwarden-agent", &self.dry_state());
        cmd.args([verb, "--session", session, "--socket"])
            .arg(self.socket());
        let out = capture(
            cmd,
            verb,
            &self.out.join("agent-requests.log"),
            Duration::from_secs(30),
        )?;
        Ok(String::from_utf8_lossy(&out).trim().to_owned())
    }

    /// One call of the agent's checkpoint helper, as the agent makes it but without the agent
    /// (`gpuwarden-agent checkpoint --pid PID --action ACTION EXTRA…`, e.g. `--gpu-pair OLD=NEW`):
    /// its exit status and the line it printed, whatever the status (3: the driver refused, 1:
    /// the call could not be made).
    ///
    /// # Errors
    /// It can't be started or takes longer than 60 s.
    pub fn checkpoint_call(
        &self,
        pid: u32,
        action: &str,
        extra: &[&str],
    ) -> anyhow::Result<(ExitStatus, String)> {
        let mut cmd = self.kit.tool("gpuwarden-agent", &self.dry_state());
        cmd.args(["checkpoint", "--pid", &pid.to_string(), "--action", action])
            .args(extra);
        let (status, out) = run_to_end(
            cmd,
            "checkpoint helper",
            &self.out.join("checkpoint-helper.log"),
            Duration::from_mins(1),
        )?;
        Ok((status, String::from_utf8_lossy(&out).trim().to_owned()))
    }

    /// The current agent's log.
    #[must_use]
    pub fn agent_log(&self) -> Option<PathBuf> {
        let n = self.runs.load(Ordering::SeqCst);
        (n > 0).then(|| self.out.join(format!("agent-{n}.log")))
    }

    /// NVML now.
    ///
    /// # Errors
    /// NVML can't be read (why).
    pub fn nvml(&self) -> anyhow::Result<Nvml> {
        let out = capture(
            self.kit.nvml(&self.dry_state()),
            "nvml",
            &self.out.join("nvml.log"),
            Duration::from_secs(30),
        )?;
        Nvml::parse(&out)
    }

    /// Starts recording NVML's raw streams (`nvml.py record`) into `path` for `seconds` at most;
    /// the recording ends when the guard is dropped.
    ///
    /// # Errors
    /// The recorder can't be started.
    pub fn record_nvml(
        &self,
        section: &Section,
        seconds: f64,
        path: &Path,
    ) -> anyhow::Result<Guard> {
        let mut cmd = self.kit.nvml(&self.dry_state());
        cmd.arg("record").arg(format!("{seconds}")).arg(path);
        let log = self.out.join(format!("{}-nvml-record.log", section.name()));
        section.log(log.clone());
        Guard::spawn(cmd, "nvml recorder", &log, false, false)
    }

    /// What a recording of NVML's streams shows (`nvml.py summary`), as its JSON document.
    ///
    /// # Errors
    /// The summary can't be made or read.
    pub fn nvml_summary(&self, path: &Path) -> anyhow::Result<Value> {
        let mut cmd = self.kit.nvml(&self.dry_state());
        cmd.arg("summary").arg(path);
        let out = capture(
            cmd,
            "nvml summary",
            &self.out.join("nvml.log"),
            Duration::from_mins(1),
        )?;
        serde_json::from_slice(&out).context("nvml.py summary printed no JSON")
    }

    /// Starts the workload with `args`: in a session with `resources` (and `policy`) through
    /// `gpuwarden run`, or, with no resources, in the cgroup `cgroup` when given.
    ///
    /// # Errors
    /// It can't be started.
    pub fn workload(
        &self,
        section: &Section,
        label: &str,
        resources: &[String],
        policy: Option<&str>,
        cgroup: Option<&Path>,
        args: &[&str],
    ) -> anyhow::Result<Workload> {
        let program = self.kit.workload_argv();
        self.start_workload(&program, section, label, resources, policy, cgroup, args)
    }

    /// Starts the suspend section's workload (`suspend.py`) with `args`, in a session with
    /// `resources` through `gpuwarden run`.
    ///
    /// # Errors
    /// It can't be started.
    pub fn suspend_workload(
        &self,
        section: &Section,
        label: &str,
        resources: &[String],
        args: &[&str],
    ) -> anyhow::Result<Workload> {
        let program = self.kit.suspend_argv();
        self.start_workload(&program, section, label, resources, None, None, args)
    }

    #[expect(clippy::too_many_arguments, reason = "the two callers above name them")]
    fn start_workload(
        &self,
        program: &[OsString],
        section: &Section,
        label: &str,
        resources: &[String],
        policy: Option<&str>,
        cgroup: Option<&Path>,
        args: &[&str],
    ) -> anyhow::Result<Workload> {
        let mut cmd = if resources.is_empty() {
            if let Some(cg) = cgroup {
                // The shell joins the cgroup, then becomes the workload: nothing runs outside it.
                let mut c = Command::new("/bin/sh");
                c.arg("-c")
                    .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
                    .arg(cg)
                    .args(program);
                c
            } else {
                let mut c = Command::new(&program[0]);
                c.args(&program[1..]);
                c
            }
        } else {
            let mut c = self.kit.tool("gpuwarden", &self.dry_state());
            c.args(["--controller", &self.url, "run", "--start-timeout", "60"])
                .arg("--agent-socket")
                .arg(self.socket());
            for r in resources {
                c.args(["-r", r]);
            }
            if let Some(p) = policy {
                c.args(["--memory-policy", p]);
            }
            c.arg("--").args(program);
            c
        };
        cmd.args(args).env("GPUCHECK_DRY_STATE", self.dry_state());
        if self.kit.fake_driver() {
            cmd.env("GPUCHECK_DRY_FAKE_DIR", self.fake_dir())
                .env("GPUCHECK_DRY_GPU_CLIENT", self.kit.bin.join(GPU_CLIENT));
        }
        let log = self.out.join(format!("{}-{label}.log", section.name()));
        section.log(log.clone());
        Workload::spawn(cmd, label, &log)
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What [`Workload::poll`] saw.
#[derive(Debug)]
pub enum Polled {
    /// A record.
    Record(Record),
    /// Its output ended.
    Ended,
    /// Nothing within the limit.
    Quiet,
}

/// A running workload, read record by record, every wait bounded.
pub struct Workload {
    guard: Guard,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    label: String,
    log: PathBuf,
}

impl Workload {
    fn spawn(cmd: Command, label: &str, log: &Path) -> anyhow::Result<Self> {
        let mut guard = Guard::spawn(cmd, label, log, true, true)?;
        let stdin = guard.take_stdin();
        let stdout = guard.take_stdout().context("no stdout")?;
        let (tx, lines) = mpsc::channel();
        let log_path = log.to_owned();
        std::thread::spawn(move || {
            let mut logf = std::fs::File::options()
                .append(true)
                .create(true)
                .open(&log_path)
                .ok();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(f) = logf.as_mut() {
                    let _ = writeln!(f, "{line}");
                }
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            guard,
            stdin,
            lines,
            label: label.to_owned(),
            log: log.to_owned(),
        })
    }

    /// The next record within `limit`, the end of its output, or nothing yet.
    ///
    /// # Errors
    /// The workload reported an error.
    pub fn poll(&mut self, limit: Duration) -> anyhow::Result<Polled> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(r) = parse_record(&line) {
                        if r.event == "error" {
                            bail!("the workload failed: {}", r.name);
                        }
                        return Ok(Polled::Record(r));
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(Polled::Ended),
                Err(mpsc::RecvTimeoutError::Timeout) => return Ok(Polled::Quiet),
            }
        }
    }

    /// The next record within `limit`; `None` when the workload's output ended.
    ///
    /// # Errors
    /// No record within `limit`, or the workload reported an error.
    pub fn next(&mut self, limit: Duration) -> anyhow::Result<Option<Record>> {
        match self.poll(limit)? {
            Polled::Record(r) => Ok(Some(r)),
            Polled::Ended => Ok(None),
            Polled::Quiet => bail!(
                "{} printed no record within {} s",
                self.label,
                limit.as_secs()
            ),
        }
    }

    /// The next record, which must come within `limit`.
    ///
    /// # Errors
    /// It ended first (with its exit status and log tail), or see [`next`](Self::next).
    pub fn expect(&mut self, what: &str, limit: Duration) -> anyhow::Result<Record> {
        if let Some(r) = self.next(limit)? {
            return Ok(r);
        }
        let status = self.guard.wait_for(Duration::from_secs(5));
        bail!(
            "{} ended before {what} ({}); {}",
            self.label,
            status.map_or_else(|| "still running".to_owned(), |s| s.to_string()),
            tail(&self.log, 3)
        )
    }

    /// Lets an interactive workload go on to its next step.
    pub fn go(&mut self) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = writeln!(stdin).and_then(|()| stdin.flush());
        }
    }

    /// Ends its input and waits up to `limit` for it to exit; kills it otherwise.
    pub fn finish(&mut self, limit: Duration) -> Option<ExitStatus> {
        drop(self.stdin.take());
        let status = self.guard.wait_for(limit);
        if status.is_none() {
            self.guard.kill();
        }
        status
    }
}
