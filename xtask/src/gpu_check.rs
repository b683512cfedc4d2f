//! `cargo xtask gpu-check`: everything that needs a real NVIDIA GPU, in one command and one
//! table — the agent's byte counts against NVML's per-process figures (PyTorch tensors, the
//! caching allocator's `empty_cache`, `cudaMallocManaged`, a second process, an agent started
//! after the workload), the memory limit's kill / stop / report, the compute-share throttle at
//! 0.1, 0.3, 0.5 and 0.9 for one tenant and two (a real matmul loop, target ± 5 points), the
//! cost the agent adds (a small model's training step and one `cudaMalloc`, with and without
//! the agent, as ratios from the same run), and whether driver hooks (fentry, kprobe) load.
//!
//! It builds the binaries, runs a controller and an agent (no pins, so stopping the agent loses
//! its maps as a lost pin directory would), and drives the workloads in `xtask/gpu-check/`
//! through `gpuwarden run`. Without a GPU it refuses, saying why, and exits non-zero.
//!
//! A GPU machine without Rust (the lent ones have PyTorch but no cargo, and no network) gets a
//! kit built here: `cargo xtask gpu-check --pack DIR` puts the stripped release binaries, this
//! task's own binary and the workload script in `DIR`; there, `DIR/xtask gpu-check --prebuilt
//! DIR` runs the same check without building or installing anything.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{BufRead, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

const MIB: u64 = 1 << 20;
/// The controller's address for the check (beside `cargo xtask run`'s).
const LISTEN: &str = "127.0.0.1:50061";
/// How far a throttled rate may be from its share, in points of the unthrottled rate.
const SHARE_TOLERANCE: f64 = 0.05;
/// The shares the throttle is checked at.
const SHARES: [f64; 4] = [0.1, 0.3, 0.5, 0.9];
/// PyTorch, installed into the check's own environment when no Python here has it.
const TORCH_REQUIREMENT: &str = "torch";

/// Why the check can't run here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoGpu(pub String);

impl std::fmt::Display for NoGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no NVIDIA GPU here ({}): gpu-check measures a real GPU and has nothing to measure \
             on this machine",
            self.0
        )
    }
}

impl std::error::Error for NoGpu {}

/// The NVIDIA driver's version, from under `root` (`/` normally): refuses when no driver is
/// loaded or no control node exists.
///
/// # Errors
/// What is missing.
pub fn preflight(root: &Path) -> Result<String, NoGpu> {
    let version = root.join("proc/driver/nvidia/version");
    let text = std::fs::read_to_string(&version).map_err(|e| {
        NoGpu(format!(
            "{}: {e}; is the nvidia driver loaded?",
            version.display()
        ))
    })?;
    if !root.join("dev/nvidiactl").exists() {
        return Err(NoGpu(format!(
            "{} is missing",
            root.join("dev/nvidiactl").display()
        )));
    }
    driver_version(&text).ok_or_else(|| NoGpu(format!("{} names no version", version.display())))
}

/// The version in `/proc/driver/nvidia/version`'s first line (`NVRM version: … 580.159 …`).
fn driver_version(text: &str) -> Option<String> {
    text.lines()
        .next()?
        .split_whitespace()
        .find(|w| {
            w.split('.').count() >= 2 && w.split('.').all(|p| p.chars().all(|c| c.is_ascii_digit()))
        })
        .map(str::to_owned)
}

/// One record a workload printed (`GPUCHECK {json}` lines; others are not records).
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// `step`, `result` or `error`.
    pub event: String,
    /// The step or result's name.
    pub name: String,
    /// The process that printed it.
    pub pid: u32,
    /// Every field, as printed.
    pub fields: Value,
}

impl Record {
    /// A numeric field.
    #[must_use]
    pub fn number(&self, key: &str) -> Option<f64> {
        self.fields.get(key).and_then(Value::as_f64)
    }
}

/// Parses one line of a workload's output.
#[must_use]
pub fn parse_record(line: &str) -> Option<Record> {
    let json = line.trim().strip_prefix("GPUCHECK ")?;
    let fields: Value = serde_json::from_str(json).ok()?;
    Some(Record {
        event: fields.get("event")?.as_str()?.to_owned(),
        name: fields
            .get("name")
            .or_else(|| fields.get("reason"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        pid: fields
            .get("pid")
            .and_then(Value::as_u64)
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(0),
        fields,
    })
}

/// NVML's per-process GPU memory, from `nvidia-smi --query-compute-apps=pid,used_memory
/// --format=csv,noheader,nounits` (MiB), in bytes by pid.
#[must_use]
pub fn parse_compute_apps(csv: &str) -> BTreeMap<u32, u64> {
    csv.lines()
        .filter_map(|l| {
            let (pid, mib) = l.split_once(',')?;
            Some((
                pid.trim().parse().ok()?,
                mib.trim().parse::<u64>().ok()? * MIB,
            ))
        })
        .fold(BTreeMap::new(), |mut m, (pid, bytes)| {
            *m.entry(pid).or_default() += bytes;
            m
        })
}

/// How a row came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// As expected.
    Pass,
    /// Not as expected.
    Fail,
    /// A measurement with nothing to hold it to.
    Info,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "FAIL",
            Self::Info => "info",
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The section (`memory`, `limit`, `throttle`, `cost`, `hooks`).
    pub section: &'static str,
    /// What was checked.
    pub check: String,
    /// What gpuwarden measured or did.
    pub gpuwarden: String,
    /// What it is held to (NVML, the target, the run without the agent).
    pub reference: String,
    /// How it came out.
    pub verdict: Verdict,
}

impl Row {
    fn new(
        section: &'static str,
        check: impl Into<String>,
        gpuwarden: impl Into<String>,
        reference: impl Into<String>,
        verdict: Verdict,
    ) -> Self {
        Self {
            section,
            check: check.into(),
            gpuwarden: gpuwarden.into(),
            reference: reference.into(),
            verdict,
        }
    }
}

/// The table, as one block of text with a header, aligned columns and a summary line.
#[must_use]
pub fn render(title: &str, rows: &[Row]) -> String {
    let header = ["section", "check", "gpuwarden", "reference", "verdict"];
    let cells: Vec<[&str; 5]> = rows
        .iter()
        .map(|r| {
            [
                r.section,
                r.check.as_str(),
                r.gpuwarden.as_str(),
                r.reference.as_str(),
                r.verdict.as_str(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[&str; 5]| {
        let mut out = String::from("|");
        for (c, w) in cells.iter().zip(widths) {
            let pad = w - c.chars().count();
            let _ = write!(out, " {c}{} |", " ".repeat(pad));
        }
        out.push('\n');
        out
    };
    let mut out = format!("{title}\n\n");
    out.push_str(&line(&header));
    out.push('|');
    for w in widths {
        let _ = write!(out, "{}|", "-".repeat(w + 2));
    }
    out.push('\n');
    for row in &cells {
        out.push_str(&line(row));
    }
    let failed = rows.iter().filter(|r| r.verdict == Verdict::Fail).count();
    let passed = rows.iter().filter(|r| r.verdict == Verdict::Pass).count();
    let _ = writeln!(
        out,
        "\n{passed} passed, {failed} failed, {} measured only",
        rows.len() - passed - failed
    );
    out
}

/// Whether a measured fraction of the unthrottled rate is within ± 5 points of `share`.
#[must_use]
pub fn share_verdict(share: f64, measured: f64) -> Verdict {
    if (measured - share).abs() <= SHARE_TOLERANCE {
        Verdict::Pass
    } else {
        Verdict::Fail
    }
}

/// A throttle row: the measured fraction of the unthrottled rate, its error in points, and the
/// target ± 5.
#[must_use]
pub fn share_row(check: String, share: f64, measured: f64) -> Row {
    Row::new(
        "throttle",
        check,
        format!(
            "{:.1} % ({:+.1} points)",
            measured * 100.0,
            (measured - share) * 100.0
        ),
        format!("{:.0} % ± {:.0}", share * 100.0, SHARE_TOLERANCE * 100.0),
        share_verdict(share, measured),
    )
}

/// Bytes as MiB with one decimal.
#[must_use]
pub fn mib(bytes: u64) -> String {
    #[expect(clippy::cast_precision_loss, reason = "a display value")]
    let m = bytes as f64 / MIB as f64;
    format!("{m:.1} MiB")
}

/// The agent's count against NVML's for one process: they should be equal.
#[must_use]
pub fn memory_row(check: &str, agent: u64, nvml: Option<u64>) -> Row {
    match nvml {
        Some(n) => Row::new(
            "memory",
            check,
            mib(agent),
            format!("NVML {}", mib(n)),
            if agent == n {
                Verdict::Pass
            } else {
                Verdict::Fail
            },
        ),
        None => Row::new(
            "memory",
            check,
            mib(agent),
            "NVML: no figure",
            Verdict::Info,
        ),
    }
}

/// `cargo xtask gpu-check`'s options.
#[derive(clap::Args)]
pub struct Args {
    /// Seconds each throttled matmul run lasts.
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// The Python with PyTorch to use (default: one that has it, or a venv made for it).
    #[arg(long, env = "GPUCHECK_PYTHON")]
    python: Option<PathBuf>,
    /// Take the binaries and the workload script from this folder (a kit made by `--pack`):
    /// nothing is installed or built.
    #[arg(long, value_name = "DIR", conflicts_with = "pack")]
    prebuilt: Option<PathBuf>,
    /// Build a kit for a GPU machine without Rust into this folder and stop: the release
    /// binaries (stripped), this task's binary and the workload script.
    #[arg(long, value_name = "DIR")]
    pack: Option<PathBuf>,
}

/// The binaries a kit holds, beside `xtask` itself.
const KIT_BINARIES: [&str; 3] = ["gpuwarden", "gpuwarden-agent", "gpuwarden-controller"];
/// The workload script's name in a kit.
const WORKLOAD: &str = "workload.py";

/// Builds the kit `--pack` asks for into `dir`.
fn pack(dir: &Path) -> anyhow::Result<()> {
    crate::setup::run()?;
    let bin = crate::build_release_binaries()?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let this = std::env::current_exe().context("finding this task's binary")?;
    let mut copies: Vec<(PathBuf, PathBuf)> = KIT_BINARIES
        .iter()
        .map(|b| (bin.join(b), dir.join(b)))
        .collect();
    copies.push((this, dir.join("xtask")));
    for (from, to) in &copies {
        std::fs::copy(from, to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        // Smaller to carry; a missing `strip` only leaves them larger.
        let _ = Command::new("strip").arg(to).status();
    }
    let script = crate::workspace().join("xtask/gpu-check").join(WORKLOAD);
    std::fs::copy(&script, dir.join(WORKLOAD))
        .with_context(|| format!("copying {}", script.display()))?;
    let bytes: u64 = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    println!(
        "gpu-check: kit in {} ({} MiB); on the GPU machine, as root: {}/xtask gpu-check --prebuilt {}",
        dir.display(),
        bytes.div_ceil(MIB),
        dir.display(),
        dir.display()
    );
    Ok(())
}

/// One part of the check: its rows.
type Section = fn(&mut Rig, &Args) -> anyhow::Result<Vec<Row>>;

/// Runs every check and prints the table; fails without a GPU, or when a check failed.
pub fn run(args: &Args) -> anyhow::Result<()> {
    if let Some(dir) = &args.pack {
        return pack(dir);
    }
    let driver = preflight(Path::new("/"))?;
    if !crate::is_root() {
        bail!("the agent loads eBPF programs: run gpu-check as root");
    }
    let (bin, script) = if let Some(dir) = &args.prebuilt {
        let dir = std::path::absolute(dir)?;
        for b in KIT_BINARIES.iter().chain(&[WORKLOAD]) {
            if !dir.join(b).is_file() {
                bail!(
                    "{} lacks {b}: make the kit with `cargo xtask gpu-check --pack DIR`",
                    dir.display()
                );
            }
        }
        let script = dir.join(WORKLOAD);
        (dir, script)
    } else {
        crate::setup::run()?;
        (
            crate::build_release_binaries()?,
            crate::workspace().join("xtask/gpu-check").join(WORKLOAD),
        )
    };
    let python = find_python(args.python.as_deref())?;
    let mut rig = Rig::start(&bin, python, script)?;
    let mut rows = Vec::new();
    let sections: [(&str, Section); 5] = [
        ("memory", memory),
        ("limit", limits),
        ("throttle", throttle),
        ("cost", cost),
        ("hooks", hooks),
    ];
    for (name, section) in sections {
        eprintln!("gpu-check: {name}…");
        match section(&mut rig, args) {
            Ok(more) => rows.extend(more),
            Err(e) => rows.push(Row::new(
                name,
                "section",
                format!("{e:#}"),
                "",
                Verdict::Fail,
            )),
        }
    }
    let title = format!(
        "gpuwarden gpu-check — driver {driver}, {}",
        gpu_name().unwrap_or_else(|| "GPU ?".into())
    );
    print!("{}", render(&title, &rows));
    if rows.iter().any(|r| r.verdict == Verdict::Fail) {
        bail!("some checks failed (the table says which)");
    }
    Ok(())
}

/// The first GPU's name, from `nvidia-smi`.
fn gpu_name() -> Option<String> {
    let out = Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader"])
        .output()
        .ok()?;
    String::from_utf8(out.stdout)
        .ok()?
        .lines()
        .next()
        .map(str::to_owned)
}

/// Whether `python` imports PyTorch with CUDA.
fn has_torch(python: &Path) -> bool {
    Command::new(python)
        .args([
            "-c",
            "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The check's own environment (`target/gpu-check-venv`).
fn venv() -> PathBuf {
    crate::target_dir().join("gpu-check-venv")
}

/// The first of `candidates` that `usable` accepts.
fn choose_python(candidates: &[PathBuf], usable: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    candidates.iter().find(|p| usable(p)).cloned()
}

/// A Python with PyTorch: `explicit`, the check's venv, the system's `python3`; else makes the
/// venv (seeing the system's packages) and installs PyTorch into it.
fn find_python(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        if has_torch(p) {
            return Ok(p.to_owned());
        }
        bail!("{} can't import torch with CUDA", p.display());
    }
    let env_python = venv().join("bin/python");
    let candidates = [env_python.clone(), PathBuf::from("python3")];
    if let Some(p) = choose_python(&candidates, has_torch) {
        return Ok(p);
    }
    eprintln!("gpu-check: installing PyTorch into {}", venv().display());
    crate::status(
        Command::new("python3")
            .args(["-m", "venv", "--system-site-packages"])
            .arg(venv()),
    )?;
    crate::status(Command::new(venv().join("bin/pip")).args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        TORCH_REQUIREMENT,
    ]))?;
    if !has_torch(&env_python) {
        bail!(
            "PyTorch installed into {} but CUDA is not available to it",
            venv().display()
        );
    }
    Ok(env_python)
}

/// The controller and the agent, and how to reach them.
struct Rig {
    bin: PathBuf,
    python: PathBuf,
    script: PathBuf,
    state: tempfile::TempDir,
    url: String,
    controller: Child,
    agent: Option<Child>,
}

impl Rig {
    fn start(bin: &Path, python: PathBuf, script: PathBuf) -> anyhow::Result<Self> {
        let state = tempfile::Builder::new().prefix("gpu-check").tempdir()?;
        let controller = Command::new(bin.join("gpuwarden-controller"))
            .args(["run", "--listen", LISTEN, "--state-dir"])
            .arg(state.path().join("controller"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the controller")?;
        let mut rig = Self {
            bin: bin.to_owned(),
            python,
            script,
            url: format!("http://{LISTEN}"),
            state,
            controller,
            agent: None,
        };
        rig.start_agent()?;
        Ok(rig)
    }

    fn socket(&self) -> PathBuf {
        self.state.path().join("agent.sock")
    }

    /// Starts the agent (without pins: stopping it loses its maps) and waits until it answers.
    fn start_agent(&mut self) -> anyhow::Result<()> {
        let agent = Command::new(self.bin.join("gpuwarden-agent"))
            .args([
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
            .arg(self.socket())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting the agent")?;
        self.agent = Some(agent);
        let deadline = Instant::now() + Duration::from_mins(1);
        while self.snapshot().is_err() {
            if Instant::now() > deadline {
                bail!("the agent did not answer within 60 s");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    fn stop_agent(&mut self) {
        if let Some(mut a) = self.agent.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(i32::try_from(a.id()).unwrap_or(0), libc::SIGTERM) };
            let _ = a.wait();
        }
    }

    fn snapshot(&self) -> anyhow::Result<Value> {
        let out = Command::new(self.bin.join("gpuwarden-agent"))
            .args(["snapshot", "--json", "--socket"])
            .arg(self.socket())
            .output()?;
        if !out.status.success() {
            bail!("snapshot failed");
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// The workload's command line, inside a session with `resources` when given.
    fn workload(&self, resources: &[&str], policy: Option<&str>, args: &[&str]) -> Command {
        let mut cmd = if resources.is_empty() {
            Command::new(&self.python)
        } else {
            let mut c = Command::new(self.bin.join("gpuwarden"));
            c.args(["--controller", &self.url, "run", "--agent-socket"])
                .arg(self.socket());
            for r in resources {
                c.args(["-r", r]);
            }
            if let Some(p) = policy {
                c.args(["--memory-policy", p]);
            }
            c.arg("--").arg(&self.python);
            c
        };
        cmd.arg(&self.script).args(args);
        cmd
    }

    fn spawn(
        &self,
        resources: &[&str],
        policy: Option<&str>,
        args: &[&str],
    ) -> anyhow::Result<Workload> {
        Workload::spawn(self.workload(resources, policy, args))
    }

    /// The memory the agent counts for the container holding `pid`: (video, managed).
    fn agent_bytes(&self, pid: u32) -> anyhow::Result<(u64, u64)> {
        let snapshot = self.snapshot()?;
        Ok(container_bytes(&snapshot, pid).unwrap_or((0, 0)))
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop_agent();
        let _ = self.controller.kill();
        let _ = self.controller.wait();
    }
}

/// The video and managed bytes of the container whose pids include `pid`, in a snapshot.
#[must_use]
pub fn container_bytes(snapshot: &Value, pid: u32) -> Option<(u64, u64)> {
    let c = snapshot["containers"].as_array()?.iter().find(|c| {
        c["pids"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p.as_u64() == Some(u64::from(pid))))
    })?;
    let video = c["devices"]
        .as_array()?
        .iter()
        .filter(|d| {
            let name = d["device"].as_str().unwrap_or_default();
            name == "unknown"
                || name
                    .strip_prefix("nvidia")
                    .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        })
        .filter_map(|d| d["memory_bytes"].as_u64())
        .sum();
    Some((video, c["managed_memory_bytes"].as_u64().unwrap_or(0)))
}

/// NVML's per-process memory now.
fn nvml() -> BTreeMap<u32, u64> {
    Command::new("nvidia-smi")
        .args([
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        ])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| parse_compute_apps(&s))
        .unwrap_or_default()
}

/// A running workload, read record by record.
struct Workload {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Workload {
    fn spawn(mut cmd: Command) -> anyhow::Result<Self> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {cmd:?}"))?;
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().context("no stdout")?);
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }

    /// The next record; `None` at the end of output.
    fn next(&mut self) -> anyhow::Result<Option<Record>> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.stdout.read_line(&mut line)? == 0 {
                return Ok(None);
            }
            if let Some(r) = parse_record(&line) {
                if r.event == "error" {
                    bail!("the workload failed: {}", r.name);
                }
                return Ok(Some(r));
            }
        }
    }

    /// The next record, which must be there.
    fn expect(&mut self, what: &str) -> anyhow::Result<Record> {
        self.next()?
            .with_context(|| format!("the workload ended before {what}"))
    }

    /// Lets an interactive workload go on to its next step.
    fn go(&mut self) -> anyhow::Result<()> {
        if let Some(stdin) = self.stdin.as_mut() {
            writeln!(stdin)?;
            stdin.flush()?;
        }
        Ok(())
    }

    fn finish(mut self) -> anyhow::Result<std::process::ExitStatus> {
        drop(self.stdin.take());
        Ok(self.child.wait()?)
    }
}

/// Lets NVML and the agent catch up with the last step.
fn settle() {
    std::thread::sleep(Duration::from_millis(1500));
}

/// The allocation steps, a second process, and an agent started after its workload, each held
/// to NVML's per-process figure.
fn memory(rig: &mut Rig, _args: &Args) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    let mut w = rig.spawn(&["cuda.mem=60g"], None, &["steps"])?;
    for _ in 0..5 {
        let r = w.expect("a step")?;
        settle();
        let (video, managed) = rig.agent_bytes(r.pid)?;
        let reference = nvml().get(&r.pid).copied();
        match r.name.as_str() {
            "managed" => rows.push(Row::new(
                "memory",
                "cudaMallocManaged 1 GiB, touched on the GPU",
                format!("video {}, managed {} (bound)", mib(video), mib(managed)),
                format!("NVML {}", reference.map_or("none".into(), mib)),
                verdict(managed >= held(&r)),
            )),
            name => rows.push(memory_row(&format!("PyTorch: {name}"), video, reference)),
        }
        // The second process joins while the first holds its tensors.
        if r.name == "tensors" {
            let mut second = rig.spawn(&["cuda.mem=60g"], None, &["hold", "512"])?;
            let s = second.expect("the second process's tensor")?;
            settle();
            let (video, _) = rig.agent_bytes(s.pid)?;
            rows.push(memory_row(
                "a second process on the same GPU",
                video,
                nvml().get(&s.pid).copied(),
            ));
            second.go()?;
            second.finish()?;
        }
        w.go()?;
    }
    w.finish()?;

    // An agent started after the workload made its context: it counts what comes after.
    rig.stop_agent();
    let mut late = rig.spawn(&[], None, &["steps"])?;
    let context = late.expect("the context")?;
    let before = nvml().get(&context.pid).copied().unwrap_or(0);
    rig.start_agent()?;
    late.go()?;
    let tensors = late.expect("the tensors")?;
    settle();
    let (video, _) = rig.agent_bytes(tensors.pid)?;
    let after = nvml().get(&tensors.pid).copied().unwrap_or(0);
    rows.push(Row::new(
        "memory",
        "agent started after the workload: bytes since",
        mib(video),
        format!("NVML delta {}", mib(after.saturating_sub(before))),
        if video == after.saturating_sub(before) {
            Verdict::Pass
        } else {
            Verdict::Fail
        },
    ));
    for _ in 0..3 {
        late.go()?;
        if late.next()?.is_none() {
            break;
        }
    }
    late.finish()?;
    Ok(rows)
}

/// The memory limit's three policies, on a workload that grows by 512 MiB tensors past 2 GiB.
fn limits(rig: &mut Rig, _args: &Args) -> anyhow::Result<Vec<Row>> {
    Ok(vec![limit_kill(rig)?, limit_stop(rig)?, limit_report(rig)?])
}

/// The bytes a `grow` record says are held.
fn held(r: &Record) -> u64 {
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a byte count"
    )]
    let bytes = r.number("bytes").unwrap_or(0.0) as u64;
    bytes
}

/// A verdict from a condition.
fn verdict(ok: bool) -> Verdict {
    if ok { Verdict::Pass } else { Verdict::Fail }
}

/// kill: the allocation that would cross the limit kills the process.
fn limit_kill(rig: &Rig) -> anyhow::Result<Row> {
    let mut w = rig.spawn(&["cuda.mem=2g"], Some("kill"), &["grow", "512"])?;
    let mut last = 0;
    while let Some(r) = w.next()? {
        last = held(&r);
    }
    let code = w.finish()?.code().unwrap_or(-1);
    Ok(Row::new(
        "limit",
        "kill at 2 GiB",
        format!("exit {code}, last held {}", mib(last)),
        "exit 137, last held ≤ 2048 MiB",
        verdict(code == 137 && last <= 2048 * MIB),
    ))
}

/// stop: the process is stopped at the crossing.
fn limit_stop(rig: &Rig) -> anyhow::Result<Row> {
    let mut w = rig.spawn(&["cuda.mem=2g"], Some("stop"), &["grow", "512"])?;
    let first = w.expect("the first tensor")?;
    let pid = first.pid;
    let deadline = Instant::now() + Duration::from_mins(1);
    let mut stopped = false;
    while Instant::now() < deadline && !stopped && w.child.try_wait()?.is_none() {
        std::thread::sleep(Duration::from_millis(200));
        stopped = process_state(pid) == Some('T');
    }
    // SAFETY: signalling the workload this check started.
    unsafe { libc::kill(i32::try_from(pid).unwrap_or(0), libc::SIGKILL) };
    w.finish()?;
    Ok(Row::new(
        "limit",
        "stop at 2 GiB",
        if stopped {
            "stopped (T)"
        } else {
            "not stopped"
        },
        "stopped",
        verdict(stopped),
    ))
}

/// report: the process goes on past the limit; the agent reports each crossing.
fn limit_report(rig: &Rig) -> anyhow::Result<Row> {
    let mut w = rig.spawn(&["cuda.mem=2g"], Some("report"), &["grow", "512"])?;
    let (mut pid, mut past) = (0, 0);
    while let Some(r) = w.next()? {
        if held(&r) >= 3 * 1024 * MIB {
            (pid, past) = (r.pid, held(&r));
            break;
        }
    }
    let reports = rig.snapshot().map_or(0, |s| report_events(&s, pid));
    // SAFETY: signalling the workload this check started.
    unsafe { libc::kill(i32::try_from(pid).unwrap_or(0), libc::SIGKILL) };
    w.finish()?;
    Ok(Row::new(
        "limit",
        "report past 2 GiB",
        format!("ran to {}, {reports} report events", mib(past)),
        "runs on, ≥ 1 report event",
        verdict(past > 0 && reports > 0),
    ))
}

/// The `report` events about `pid` in a snapshot.
#[must_use]
pub fn report_events(snapshot: &Value, pid: u32) -> usize {
    snapshot["containers"].as_array().map_or(0, |cs| {
        cs.iter()
            .flat_map(|c| c["events"].as_array().cloned().unwrap_or_default())
            .filter(|e| e["action"] == "report" && e["pid"].as_u64() == Some(u64::from(pid)))
            .count()
    })
}

/// The process state letter of `pid` (`T` when stopped).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// The matmul rate of one run, as printed.
fn matmul_rate(mut w: Workload) -> anyhow::Result<f64> {
    let r = w.expect("the matmul rate")?;
    w.finish()?;
    r.number("rate").context("no rate")
}

/// The throttle at each share, one tenant and two sharing the GPU, against the unthrottled rate.
fn throttle(rig: &mut Rig, args: &Args) -> anyhow::Result<Vec<Row>> {
    let seconds = format!("{}", args.seconds);
    let alone = matmul_rate(rig.spawn(&[], None, &["matmul", &seconds])?)?;
    let mut rows = vec![Row::new(
        "throttle",
        "matmul alone (the 100 % rate)",
        format!("{alone:.1}/s"),
        "",
        Verdict::Info,
    )];
    for share in SHARES {
        let r = format!("cuda.shares={share}");
        let one = matmul_rate(rig.spawn(&[&r], None, &["matmul", &seconds])?)? / alone;
        rows.push(share_row(format!("one tenant at {share}"), share, one));
        let other = 1.0 - share;
        let r2 = format!("cuda.shares={other:.1}");
        let a = rig.spawn(&[&r], None, &["matmul", &seconds])?;
        let b = rig.spawn(&[&r2], None, &["matmul", &seconds])?;
        let (ra, rb) = (matmul_rate(a)? / alone, matmul_rate(b)? / alone);
        for (s, m) in [(share, ra), (other, rb)] {
            rows.push(share_row(
                format!("two tenants {share} + {other:.1}: the {s:.1}"),
                s,
                m,
            ));
        }
    }
    Ok(rows)
}

/// The result `name`'s field `key` from one run.
fn result_of(rig: &Rig, args: &[&str], key: &str) -> anyhow::Result<f64> {
    let mut w = rig.spawn(&[], None, args)?;
    let r = w.expect(key)?;
    w.finish()?;
    r.number(key).with_context(|| format!("no {key}"))
}

/// Time per training step and per `cudaMalloc`/`cudaFree`, without and with the agent.
fn cost(rig: &mut Rig, _args: &Args) -> anyhow::Result<Vec<Row>> {
    rig.stop_agent();
    let train0 = result_of(rig, &["train", "300"], "step_s")?;
    let malloc0 = result_of(rig, &["malloc", "2000"], "pair_s")?;
    rig.start_agent()?;
    let train1 = result_of(rig, &["train", "300"], "step_s")?;
    let malloc1 = result_of(rig, &["malloc", "2000"], "pair_s")?;
    Ok(vec![
        Row::new(
            "cost",
            "training step of a small MLP",
            format!(
                "{:.3} ms with the agent ({:.3}×)",
                train1 * 1e3,
                train1 / train0
            ),
            format!("{:.3} ms without", train0 * 1e3),
            Verdict::Info,
        ),
        Row::new(
            "cost",
            "cudaMalloc + cudaFree of 2 MiB",
            format!(
                "{:.1} µs with the agent ({:.3}×)",
                malloc1 * 1e6,
                malloc1 / malloc0
            ),
            format!("{:.1} µs without", malloc0 * 1e6),
            Verdict::Info,
        ),
    ])
}

/// Whether driver hooks load on this kernel (`gpuwarden-agent probe-hooks`).
fn hooks(rig: &mut Rig, _args: &Args) -> anyhow::Result<Vec<Row>> {
    let out = Command::new(rig.bin.join("gpuwarden-agent"))
        .args(["probe-hooks", "--json"])
        .output()?;
    let trials: Value = serde_json::from_slice(&out.stdout)?;
    Ok(hook_rows(&trials))
}

/// One row per hook tried.
#[must_use]
pub fn hook_rows(trials: &Value) -> Vec<Row> {
    trials
        .as_array()
        .map(|ts| {
            ts.iter()
                .map(|t| {
                    let loaded = t["loaded"].as_bool().unwrap_or(false);
                    Row::new(
                        "hooks",
                        format!(
                            "{} on {}",
                            t["hook"].as_str().unwrap_or("?"),
                            t["target"].as_str().unwrap_or("?")
                        ),
                        if loaded { "loads" } else { "refused" },
                        t["detail"].as_str().unwrap_or_default(),
                        Verdict::Info,
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
