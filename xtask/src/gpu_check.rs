//! `cargo xtask gpu-check`: everything that needs a real NVIDIA GPU, in one command and one
//! table — the agent's byte counts against NVML's per-process figures (PyTorch tensors, the
//! caching allocator's `empty_cache`, `cudaMallocManaged`, a second process, an agent started
//! after the workload), the memory limit's kill / stop / report, the compute-share throttle at
//! 0.1, 0.3, 0.5 and 0.9 for one tenant and two, the cost the agent adds, whether driver hooks
//! load, whether the driver's own per-cgroup memory tier exists on the machine, and a PyTorch
//! workload suspended to host memory and resumed with its data intact (issue 38). What each
//! row checks: `docs/gpu-check.md`.
//!
//! GPU machines are lent rarely and briefly, so the run is built not to waste one: each row is
//! printed and appended to `results.txt` as it is made; every section has a deadline and the
//! whole run one (9 minutes by default) after which what exists is printed and every child
//! killed; a sub-check that fails still gets its row, and so does one never reached, saying
//! why; a missing figure is a FAIL that says why; controller, agent and workload logs stay in
//! the results folder ([`runner`], [`procs`]). `--dry-run` rehearses all of it here, with
//! `dry.py` standing in for the binaries, the GPU and NVML ([`rig::Kit`]).
//!
//! Without a GPU the real run refuses, saying why, and exits non-zero. A GPU machine without
//! Rust gets a kit built here: `cargo xtask gpu-check --pack DIR` puts the stripped release
//! binaries, this task's own binary and the scripts in `DIR`; there, `DIR/xtask gpu-check
//! --prebuilt DIR` runs the same check without building or installing anything.

mod checks;
mod procs;
mod rig;
mod runner;

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, bail};
use serde_json::Value;

const MIB: u64 = 1 << 20;
/// How far a tenant's GPU time (or work) may be from its share, in points of the unthrottled run's.
const SHARE_TOLERANCE: f64 = 0.02;
/// The shares the throttle is checked at.
const SHARES: [f64; 4] = [0.1, 0.3, 0.5, 0.9];
/// PyTorch, installed into the check's own environment when no Python here has it (never
/// with `--prebuilt`: the GPU machines have no network).
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
    /// The section (`setup`, `memory`, `limit`, `throttle`, `cost`, `hooks`).
    pub section: String,
    /// What was checked.
    pub check: String,
    /// What gpuwarden measured or did.
    pub gpuwarden: String,
    /// What it is held to (NVML, the target, the run without the agent).
    pub reference: String,
    /// How it came out.
    pub verdict: Verdict,
    /// Conditions beside it (clocks, power, tiers) or why it failed.
    pub note: String,
}

impl Row {
    fn new(
        section: impl Into<String>,
        check: impl Into<String>,
        gpuwarden: impl Into<String>,
        reference: impl Into<String>,
        verdict: Verdict,
    ) -> Self {
        Self {
            section: section.into(),
            check: check.into(),
            gpuwarden: gpuwarden.into(),
            reference: reference.into(),
            verdict,
            note: String::new(),
        }
    }

    /// With `note` beside it.
    #[must_use]
    fn note(mut self, note: impl Into<String>) -> Self {
        self.note = note.into();
        self
    }
}

/// The table, as one block of text with a header, aligned columns and a summary line.
#[must_use]
pub fn render(title: &str, rows: &[Row]) -> String {
    let header = [
        "section",
        "check",
        "gpuwarden",
        "reference",
        "verdict",
        "notes",
    ];
    let cells: Vec<[&str; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.section.as_str(),
                r.check.as_str(),
                r.gpuwarden.as_str(),
                r.reference.as_str(),
                r.verdict.as_str(),
                r.note.as_str(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[&str; 6]| {
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

/// Whether a measured fraction of the unthrottled figure is within ± 2 points of `share`.
#[must_use]
pub fn share_verdict(share: f64, measured: f64) -> Verdict {
    if (measured - share).abs() <= SHARE_TOLERANCE {
        Verdict::Pass
    } else {
        Verdict::Fail
    }
}

/// A throttle row: the measured fraction of the unthrottled figure, its error in points, and the
/// target ± 2.
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

/// The difference `agent − nvml` in KiB, signed.
#[must_use]
pub fn kib_diff(agent: u64, nvml: u64) -> String {
    let d = i128::from(agent) - i128::from(nvml);
    let sign = if d < 0 { '-' } else { '+' };
    format!("difference {sign}{} KiB", d.unsigned_abs().div_ceil(1024))
}

/// The agent's count against NVML's bytes for one process: they should be equal.
#[must_use]
pub fn memory_row(section: &str, check: &str, agent: u64, nvml: u64) -> Row {
    Row::new(
        section,
        check,
        format!("{} KiB", agent / 1024),
        format!("NVML {} KiB", nvml / 1024),
        if agent == nvml {
            Verdict::Pass
        } else {
            Verdict::Fail
        },
    )
    .note(kib_diff(agent, nvml))
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
    /// Take the binaries and the scripts from this folder (a kit made by `--pack`): nothing is
    /// installed or built.
    #[arg(long, value_name = "DIR", conflicts_with = "pack")]
    prebuilt: Option<PathBuf>,
    /// Build a kit for a GPU machine without Rust into this folder and stop: the release
    /// binaries (stripped), this task's binary and the scripts.
    #[arg(long, value_name = "DIR")]
    pack: Option<PathBuf>,
    /// Rehearse the whole run here, without a GPU: `dry.py` stands in for the binaries, the GPU
    /// and NVML; the sequencing, deadlines, cleanup and table are the real ones.
    #[arg(long, conflicts_with = "pack")]
    dry_run: bool,
    /// With --dry-run: take the real gpuwarden binaries from this folder (`target/debug`, a
    /// kit) instead of stand-ins; the agent gets a mock 80 GiB GPU. Rows that need the GPU fail
    /// (the stand-in workloads allocate nothing), but every command line, session and restart
    /// is the real one.
    #[arg(long, value_name = "DIR", requires = "dry_run")]
    binaries: Option<PathBuf>,
    /// Seconds the whole run may take; past it, what exists is printed and every child killed.
    #[arg(long, default_value_t = 540)]
    deadline: u64,
    /// Run only these sections (comma-separated: memory, limit, hooks, cost, suspend,
    /// throttle); setup always runs. Default: all, in that order.
    #[arg(long, value_delimiter = ',')]
    sections: Vec<String>,
    /// Seconds every section may take (default: each section's own).
    #[arg(long, hide = true)]
    section_deadline: Option<u64>,
    /// Where the results folder goes (default: beside the kit, or `target/gpu-check`).
    #[arg(long, value_name = "DIR")]
    results: Option<PathBuf>,
}

/// The binaries a kit holds, beside `xtask` itself.
const KIT_BINARIES: [&str; 3] = ["gpuwarden", "gpuwarden-agent", "gpuwarden-controller"];
/// The scripts a kit holds (from `xtask/gpu-check/`).
const KIT_SCRIPTS: [&str; 4] = ["workload.py", "suspend.py", "nvml.py", "dry.py"];

/// The folder of the scripts in the source tree.
fn scripts() -> PathBuf {
    crate::workspace().join("xtask/gpu-check")
}

/// Builds the kit `--pack` asks for into `dir`.
fn pack(dir: &Path) -> anyhow::Result<()> {
    crate::setup::run()?;
    let bin = crate::build_release_binaries()?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Its own running image: still there when `cargo` rebuilt the file meanwhile.
    let this = PathBuf::from("/proc/self/exe");
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
    for script in KIT_SCRIPTS {
        let from = scripts().join(script);
        std::fs::copy(&from, dir.join(script))
            .with_context(|| format!("copying {}", from.display()))?;
    }
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

/// The kit a run uses, and the folder its results go under.
fn kit(args: &Args) -> anyhow::Result<(rig::Kit, PathBuf)> {
    if args.dry_run {
        let scripts = match &args.prebuilt {
            Some(dir) => std::path::absolute(dir)?,
            None => scripts(),
        };
        let python = args.python.clone().unwrap_or_else(|| "python3".into());
        let results = args
            .prebuilt
            .clone()
            .unwrap_or_else(|| crate::target_dir().join("gpu-check"));
        let bin = match &args.binaries {
            Some(dir) => std::path::absolute(dir)?,
            None => scripts.clone(),
        };
        return Ok((
            rig::Kit {
                bin,
                scripts,
                python,
                dry: true,
                real_binaries: args.binaries.is_some(),
            },
            results,
        ));
    }
    if let Some(dir) = &args.prebuilt {
        let dir = std::path::absolute(dir)?;
        for b in KIT_BINARIES.iter().chain(&KIT_SCRIPTS) {
            if !dir.join(b).is_file() {
                bail!(
                    "{} lacks {b}: make the kit with `cargo xtask gpu-check --pack DIR`",
                    dir.display()
                );
            }
        }
        let python = find_python(args.python.as_deref(), false)?;
        return Ok((
            rig::Kit {
                bin: dir.clone(),
                scripts: dir.clone(),
                python,
                dry: false,
                real_binaries: true,
            },
            dir,
        ));
    }
    crate::setup::run()?;
    let bin = crate::build_release_binaries()?;
    let python = find_python(args.python.as_deref(), true)?;
    Ok((
        rig::Kit {
            bin,
            scripts: scripts(),
            python,
            dry: false,
            real_binaries: true,
        },
        crate::target_dir().join("gpu-check"),
    ))
}

/// Section `name`'s deadline.
fn deadline(args: &Args, name: &str) -> Duration {
    // The throttle runs ten matmul runs of `seconds`, each with a start of its own.
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "seconds"
    )]
    let throttle = (args.seconds * 10.0) as u64 + 150;
    let own = match name {
        "setup" => 90,
        "memory" => 180,
        "limit" => 150,
        "hooks" => 60,
        "cost" => 240,
        // 4 GiB out and back takes seconds each way; the rest is PyTorch's start.
        "suspend" => 120,
        _ => throttle,
    };
    Duration::from_secs(args.section_deadline.unwrap_or(own))
}

/// Whether section `name` runs (`setup` always does).
fn selected(args: &Args, name: &str) -> bool {
    name == "setup" || args.sections.is_empty() || args.sections.iter().any(|s| s == name)
}

/// Runs every check and prints the table; fails without a GPU, or when a check failed.
pub fn run(args: &Args) -> anyhow::Result<()> {
    if let Some(dir) = &args.pack {
        return pack(dir);
    }
    let driver = if args.dry_run {
        "none (dry run: stand-ins for the binaries, the GPU and NVML)".to_owned()
    } else {
        let driver = preflight(Path::new("/"))?;
        if !crate::is_root() {
            bail!("the agent loads eBPF programs: run gpu-check as root");
        }
        driver
    };
    let (kit, results) = kit(args)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let out = args
        .results
        .clone()
        .unwrap_or(results)
        .join(format!("gpu-check-{stamp}-{}", std::process::id()));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    procs::become_subreaper();

    let plan = checks::plan();
    let flat = plan
        .iter()
        .filter(|(s, _)| selected(args, s))
        .flat_map(|(s, cs)| cs.iter().map(move |c| (s.clone(), c.clone())))
        .collect();
    let title = format!("gpuwarden gpu-check — driver {driver}");
    let sink = Arc::new(runner::Sink::new(title, flat, &out.join("results.txt"))?);
    eprintln!("gpu-check: results, rows and logs in {}", out.display());
    let watchdog = runner::watchdog(Arc::clone(&sink), Duration::from_secs(args.deadline));
    let opts = checks::Opts {
        seconds: args.seconds,
        cost: if args.dry_run {
            (10, 10)
        } else {
            (2000, 20000)
        },
        dry: args.dry_run,
    };
    match rig::Rig::start(kit, out.clone()) {
        Err(e) => sink.fill_missing(None, &format!("not reached: {e:#}")),
        Ok(rig) => run_sections(&sink, &Arc::new(rig), &opts, args),
    }
    watchdog.disarm();
    procs::kill_all();
    sink.finish();
    for p in procs::live() {
        eprintln!("gpu-check: still registered after cleanup: {p}");
    }
    for r in procs::refused() {
        eprintln!("gpu-check: {r}");
    }
    if sink.rows().iter().any(|r| r.verdict == Verdict::Fail) {
        bail!(
            "some checks failed (the table says which; logs in {})",
            out.display()
        );
    }
    Ok(())
}

/// The sections, in order, each under its deadline.
fn run_sections(sink: &Arc<runner::Sink>, rig: &Arc<rig::Rig>, opts: &checks::Opts, args: &Args) {
    type Body = fn(&rig::Rig, &runner::Section, &checks::Opts) -> anyhow::Result<()>;
    let sections: [(&str, Body); 7] = [
        ("setup", |r, s, _| {
            checks::setup(r, s);
            Ok(())
        }),
        ("memory", checks::memory),
        ("limit", checks::limits),
        ("hooks", |r, s, _| {
            checks::hooks(r, s);
            Ok(())
        }),
        ("cost", checks::cost),
        ("suspend", checks::suspend::section),
        // Last: the longest, so a run cut short by its deadline loses the least.
        ("throttle", checks::throttle),
    ];
    for (i, (name, body)) in sections.into_iter().enumerate() {
        if !selected(args, name) {
            continue;
        }
        let (r, o) = (Arc::clone(rig), opts.clone());
        let logs = rig.logs();
        let limit = deadline(args, name);
        runner::run_section(sink, i + 1, name, limit, &logs, move |s| body(&r, s, &o));
    }
    rig.stop();
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

/// A Python with PyTorch: `explicit`, the check's venv, the system's `python3`; else, when
/// `may_install`, makes the venv (seeing the system's packages) and installs PyTorch into it,
/// and otherwise stops saying what to do.
fn find_python(explicit: Option<&Path>, may_install: bool) -> anyhow::Result<PathBuf> {
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
    if !may_install {
        bail!(
            "no Python here imports torch with CUDA, and a kit installs nothing (the GPU \
             machines have no network): name one with --python or GPUCHECK_PYTHON"
        );
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
