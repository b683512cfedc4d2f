//! The sections of gpu-check and the sub-checks each plans: what is run and how each row is
//! judged. A sub-check that fails makes its own FAIL row and the section goes on; what a
//! section could not reach is filled in by the runner.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

use super::{
    MIB, Record, Row, SHARES, Verdict, container_bytes, hook_rows, kib_diff, memory_row,
    process_state, procs, report_events,
    rig::{NvmlGpu, Polled, Rig},
    runner::Section,
    share_row, share_verdict,
};

pub mod suspend;

use suspend::{
    ACCOUNTING, DRIVER_STATE, FROZEN, INTACT, NVML_SUSPENDED, OTHER, PAIR_ACCOUNTING, PAIR_INTACT,
    PAIR_RESTORED, PAIR_VERSION, RATE, SUSPENDED,
};

const GIB: u64 = 1 << 30;
/// How long one workload step may take to print its record.
const STEP: Duration = Duration::from_mins(1);
/// The memory limit the limit section checks, and the size of each allocation past it.
const LIMIT: u64 = 2 * GIB;
const GROW: u64 = 512 * MIB;

/// What the sections need besides the rig.
#[derive(Debug, Clone)]
pub struct Opts {
    /// Seconds each throttled matmul run lasts.
    pub seconds: f64,
    /// Training steps and malloc pairs per cost run.
    pub cost: (u32, u32),
    /// A dry run (stand-ins).
    pub dry: bool,
}

/// The sub-checks of every section, in order: the rows the table will have whatever happens.
#[must_use]
pub fn plan() -> Vec<(String, Vec<String>)> {
    let s = |v: &[&str]| v.iter().map(|&c| c.to_owned()).collect::<Vec<_>>();
    let mut throttle = vec!["matmul alone before (the 100 % rate)".to_owned()];
    for share in SHARES {
        let other = 1.0 - share;
        throttle.push(format!("one tenant at {share}"));
        throttle.push(format!(
            "two tenants {share} + {other:.1}: the first ({share})"
        ));
        throttle.push(format!(
            "two tenants {share} + {other:.1}: the second ({other:.1})"
        ));
    }
    throttle.push("matmul alone after (baseline drift)".to_owned());
    throttle.push("the agent's GPU time against the judge".to_owned());
    throttle.push("compute-share signal: NVML's streams and the agent's view".to_owned());
    vec![
        (
            "setup".into(),
            s(&[
                "NVML sees the GPU",
                "agent answers",
                "agent's GPUs come from NVML",
                "hook tier and memory tier",
                "driver memory tier (dmem) available",
                "MIG mode (read only)",
                MIG_INSTANCES,
                MIG_PLACEMENTS,
            ]),
        ),
        (
            "memory".into(),
            s(&[
                "PyTorch: context",
                "PyTorch: tensors",
                "PyTorch: empty_cache",
                "cudaMallocManaged 1 GiB, touched on the GPU",
                "PyTorch: managed_freed",
                "a second process on the same GPU",
                "agent started after the workload: bytes since",
                "late workload in a cgroup of its own",
                "a process holding 1 GiB exits: released",
            ]),
        ),
        (
            "limit".into(),
            s(&[
                "kill at 2 GiB",
                "stop at 2 GiB",
                "stop at 2 GiB: NVML while held",
                "report past 2 GiB",
            ]),
        ),
        ("hooks".into(), s(&["probe-hooks ran"])),
        (
            "cost".into(),
            s(&[
                "training step of a small MLP",
                "cudaMalloc + cudaFree of 2 MiB",
                "agent counters rose during the runs with it",
            ]),
        ),
        (
            "suspend".into(),
            s(&[
                DRIVER_STATE,
                SUSPENDED,
                NVML_SUSPENDED,
                FROZEN,
                OTHER,
                RATE,
                INTACT,
                ACCOUNTING,
                PAIR_VERSION,
                PAIR_RESTORED,
                PAIR_INTACT,
                PAIR_ACCOUNTING,
            ]),
        ),
        ("throttle".into(), throttle),
    ]
}

/// A row of `section`.
fn row(
    s: &Section,
    check: &str,
    gpuwarden: impl Into<String>,
    reference: impl Into<String>,
    verdict: Verdict,
) -> Row {
    Row::new(s.name(), check, gpuwarden, reference, verdict)
}

/// A FAIL row saying why a sub-check could not be judged.
fn failed(s: &Section, check: &str, e: &anyhow::Error) -> Row {
    row(s, check, "—", "", Verdict::Fail).note(format!("{e:#}"))
}

/// Emits `f`'s row, or a FAIL row with its error.
fn sub(s: &Section, check: &str, f: impl FnOnce() -> anyhow::Result<Row>) {
    s.doing(check);
    s.row(f().unwrap_or_else(|e| failed(s, check, &e)));
}

/// Lets NVML and the agent catch up with the last step.
fn settle(o: &Opts) {
    std::thread::sleep(if o.dry {
        Duration::from_millis(100)
    } else {
        Duration::from_millis(1500)
    });
}

/// The memory each memory-section session asks for: 30 % of the GPU in whole GiB (at least
/// 1), so the two sessions that run at once fit on it with room to spare.
#[must_use]
pub fn session_gib(total: u64) -> u64 {
    (total * 3 / 10 / GIB).max(1)
}

/// The mount point of the cgroup v2 hierarchy, from `/proc/self/mounts`' text.
#[must_use]
pub fn cgroup2_root(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        let (_, at, fs) = (f.next()?, f.next()?, f.next()?);
        (fs == "cgroup2").then(|| PathBuf::from(at))
    })
}

/// Whether the driver's own per-cgroup memory tier can exist here: the kernel's `dmem`
/// controller in the v2 hierarchy and NVIDIA regions in `dmem.capacity`. `Err` says why not.
///
/// # Errors
/// Why the tier is not available.
pub fn dmem_available(root: &Path) -> anyhow::Result<Vec<String>> {
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers"))
        .with_context(|| format!("{}/cgroup.controllers unreadable", root.display()))?;
    if !controllers.split_whitespace().any(|c| c == "dmem") {
        bail!(
            "the kernel offers no dmem controller (cgroup.controllers: {})",
            controllers.trim()
        );
    }
    let capacity = std::fs::read_to_string(root.join("dmem.capacity"))
        .with_context(|| format!("{}/dmem.capacity unreadable", root.display()))?;
    let regions: Vec<String> = capacity
        .lines()
        .filter(|l| l.starts_with("nvidia/"))
        .map(str::to_owned)
        .collect();
    if regions.is_empty() {
        bail!("dmem lists no nvidia/… region (a driver before r615, or the misc backend)");
    }
    Ok(regions)
}

/// Starts the agent unless one runs.
fn ensure_agent(rig: &Rig) -> anyhow::Result<()> {
    if rig.agent_running() {
        Ok(())
    } else {
        rig.start_agent()
    }
}

/// NVML's GPU, the agent, where its GPUs come from, its tiers, and whether the driver's own
/// memory tier exists here.
pub fn setup(rig: &Rig, s: &Section) {
    let nvml = rig.nvml();
    sub(s, "NVML sees the GPU", || {
        let n = nvml.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))?;
        let g = n.gpus.first().context("NVML lists no GPU")?;
        let total = g.total.context("NVML gives no total memory")?;
        Ok(row(
            s,
            "NVML sees the GPU",
            format!(
                "{} GPU(s); {}: {} KiB",
                n.gpus.len(),
                g.name.as_deref().unwrap_or("?"),
                total / 1024
            ),
            format!("driver {}", n.driver.as_deref().unwrap_or("?")),
            Verdict::Pass,
        )
        .note(n.conditions()))
    });
    sub(s, "agent answers", || {
        ensure_agent(rig)?;
        Ok(row(
            s,
            "agent answers",
            "snapshot answered",
            "",
            Verdict::Pass,
        ))
    });
    let snapshot = rig.snapshot();
    sub(s, "agent's GPUs come from NVML", || {
        let snap = snapshot.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))?;
        let gpus = snap["gpus"]
            .as_array()
            .context("the snapshot lists no gpus")?;
        let sources: Vec<&str> = gpus
            .iter()
            .map(|g| g["source"].as_str().unwrap_or("?"))
            .collect();
        let nvml_count = nvml.as_ref().map(|n| n.gpus.len()).ok();
        let ok = !sources.is_empty()
            && sources.iter().all(|&x| x == "nvml")
            && nvml_count == Some(sources.len());
        Ok(row(
            s,
            "agent's GPUs come from NVML",
            format!("{} GPU(s), sources {}", sources.len(), sources.join(",")),
            format!(
                "NVML: {} GPU(s)",
                nvml_count.map_or_else(|| "?".into(), |c| c.to_string())
            ),
            verdict(ok),
        ))
    });
    sub(s, "hook tier and memory tier", || {
        let snap = snapshot.as_ref().map_err(|e| anyhow::anyhow!("{e:#}"))?;
        let tier = snap["tier"]
            .as_str()
            .context("the snapshot names no tier")?;
        let memory = snap["memory_tier"]
            .as_str()
            .context("the snapshot names no memory_tier")?;
        Ok(row(
            s,
            "hook tier and memory tier",
            format!("tier {tier}, memory_tier {memory}"),
            "named",
            Verdict::Pass,
        )
        .note(snap["memory_tier_reason"].as_str().unwrap_or_default()))
    });
    let root = std::fs::read_to_string("/proc/self/mounts")
        .ok()
        .as_deref()
        .and_then(cgroup2_root);
    let check = "driver memory tier (dmem) available";
    let (said, note) = match root.as_deref().map(dmem_available) {
        None => ("no".to_owned(), "no cgroup v2 hierarchy mounted".to_owned()),
        Some(Ok(regions)) => (format!("yes: {}", regions.join("; ")), String::new()),
        Some(Err(e)) => ("no".to_owned(), format!("{e:#}")),
    };
    // Availability only: another tier is what enforces where this one is missing.
    s.row(
        row(
            s,
            check,
            said,
            "kernel dmem + driver r615 nvidia/… regions",
            Verdict::Info,
        )
        .note(note),
    );
    mig_row(rig, s);
    mig_instances_row(rig, s);
    mig_placements_row(rig, s);
}

const MIG_PLACEMENTS: &str = "MIG placements: driver vs rules (read only)";

/// The first GPU's MIG profiles and possible placements as the agent's NVML code reads them
/// (`gpuwarden-agent mig-table`), against the rules it would make instances by. Read only:
/// issue 37 §3 (making and destroying instances) never runs in gpu-check.
fn mig_placements_row(rig: &Rig, s: &Section) {
    sub(s, MIG_PLACEMENTS, || {
        let doc = rig.mig_table()?;
        let (said, verdict, note) = mig_placements_verdict(&doc, rig.kit.dry);
        Ok(row(
            s,
            MIG_PLACEMENTS,
            said,
            "NVML's table = the agent's placement rules",
            verdict,
        )
        .note(note))
    });
}

/// What the row says of `gpuwarden-agent mig-table`'s document: its figure, verdict and note
/// (`dry`: no GPU here, so no NVML is a skip, not a failure).
#[must_use]
pub fn mig_placements_verdict(doc: &Value, dry: bool) -> (String, Verdict, String) {
    if doc["ok"] != Value::Bool(true) {
        let why = doc["error"]
            .as_str()
            .unwrap_or("no reason given")
            .to_owned();
        return if dry {
            ("skipped: no GPU".to_owned(), Verdict::Info, why)
        } else {
            ("—".to_owned(), Verdict::Fail, why)
        };
    }
    let Some(g) = doc["gpus"].as_array().and_then(|g| g.first()) else {
        return ("no GPU listed".to_owned(), Verdict::Fail, String::new());
    };
    let strings = |key: &str| -> Vec<String> {
        g[key]
            .as_array()
            .map(|v| {
                v.iter()
                    .filter_map(|x| x.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (profiles, disagreements) = (strings("profiles"), strings("disagreements"));
    let name = g["name"].as_str().unwrap_or("the GPU");
    let mig = g["mig_enabled"].as_bool() == Some(true);
    // With MIG enabled the table must read; with it disabled the driver lists nothing.
    let unread = if mig { Verdict::Fail } else { Verdict::Info };
    if let Some(e) = g["error"].as_str() {
        ("not read".to_owned(), unread, e.to_owned())
    } else if profiles.is_empty() {
        let said = if mig {
            "MIG enabled, no profile listed"
        } else {
            "MIG disabled: the driver lists no profiles, nothing compared"
        };
        (said.to_owned(), unread, String::new())
    } else if g["model"].is_null() {
        (
            format!("{} profiles; no rules for {name}", profiles.len()),
            Verdict::Info,
            profiles.join("; "),
        )
    } else if disagreements.is_empty() {
        (
            format!("{} profiles, placements as the rules", profiles.len()),
            Verdict::Pass,
            profiles.join("; "),
        )
    } else {
        (
            format!("{} disagreements", disagreements.len()),
            Verdict::Fail,
            disagreements.join("; "),
        )
    }
}

/// The GPU's MIG mode and instances, read only (gpu-check never changes them).
fn mig_row(rig: &Rig, s: &Section) {
    let check = "MIG mode (read only)";
    sub(s, check, || {
        let nvml = rig.nvml()?;
        let g = nvml.gpus.first().context("NVML lists no GPU")?;
        let said = match g.mig_mode {
            None => "no MIG on this GPU or driver".to_owned(),
            Some((0, pending)) => format!("disabled (pending {pending})"),
            Some((_, pending)) => format!(
                "enabled (pending {pending}), {} instances",
                g.mig_instances.len()
            ),
        };
        Ok(row(
            s,
            check,
            said,
            "read only: never changed here",
            Verdict::Info,
        )
        .note(
            g.mig_instances
                .iter()
                .map(|i| {
                    format!(
                        "{} {}",
                        i.name.as_deref().unwrap_or("?"),
                        i.uuid.as_deref().unwrap_or("?")
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
        ))
    });
}

/// The row of each MIG instance's memory as NVML counts it and the agent's signals on it.
pub const MIG_INSTANCES: &str = "MIG instances: NVML memory and the agent's signals (read only)";

/// Each MIG instance's memory on its MIG handle and which of the calls the agent reads a GPU
/// through answer there (issue 37): read only.
fn mig_instances_row(rig: &Rig, s: &Section) {
    sub(s, MIG_INSTANCES, || {
        let nvml = rig.nvml()?;
        let g = nvml.gpus.first().context("NVML lists no GPU")?;
        let (said, verdict, note) = mig_instances_verdict(g);
        Ok(row(
            s,
            MIG_INSTANCES,
            said,
            "NVML on each MIG device handle",
            verdict,
        )
        .note(note))
    });
}

/// The verdict on `g`'s instances: each must give its memory on its own handle (the agent's
/// NVML cross-check of an instance reads it), FAIL where one does not; the other signals are
/// listed, not judged (nvml.h says utilization and samples are not given on MIG handles).
/// With MIG off there is nothing to read: info.
#[must_use]
pub fn mig_instances_verdict(g: &NvmlGpu) -> (String, Verdict, String) {
    if g.mig_mode.is_none_or(|(current, _)| current == 0) {
        return (
            "no instances (MIG disabled)".to_owned(),
            Verdict::Info,
            String::new(),
        );
    }
    if g.mig_instances.is_empty() {
        return (
            "MIG enabled, no instance made".to_owned(),
            Verdict::Info,
            String::new(),
        );
    }
    let mib = |b: Option<u64>| b.map_or_else(|| "?".to_owned(), |b| (b >> 20).to_string());
    let mut unread = Vec::new();
    let mut notes = Vec::new();
    for i in &g.mig_instances {
        let name = i.name.as_deref().or(i.uuid.as_deref()).unwrap_or("?");
        if i.signals.get("memory_info").map(String::as_str) != Some("ok") {
            unread.push(name.to_owned());
        }
        let (ok, refused): (Vec<_>, Vec<_>) = i.signals.iter().partition(|(_, a)| *a == "ok");
        notes.push(format!(
            "{name}: {} of {} MiB used; answers: {}; refuses: {}",
            mib(i.memory_used),
            mib(i.memory_total),
            ok.iter()
                .map(|(k, _)| k.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            refused
                .iter()
                .map(|(k, a)| format!("{k} ({a})"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let n = g.mig_instances.len();
    if unread.is_empty() {
        (
            format!("{n} instances, each gives its memory"),
            Verdict::Pass,
            notes.join("; "),
        )
    } else {
        (
            format!("memory not given on {}", unread.join(", ")),
            Verdict::Fail,
            notes.join("; "),
        )
    }
}

fn verdict(ok: bool) -> Verdict {
    if ok { Verdict::Pass } else { Verdict::Fail }
}

/// The agent's video and managed bytes for `pid`.
fn agent_bytes(rig: &Rig, pid: u32) -> anyhow::Result<(u64, u64)> {
    container_bytes(&rig.snapshot()?, pid)
        .with_context(|| format!("the agent shows no container holding pid {pid}"))
}

/// The agent's bytes for `r`'s process against NVML's.
fn held_to_nvml(rig: &Rig, s: &Section, check: &str, r: &Record) -> anyhow::Result<Row> {
    let (video, _) = agent_bytes(rig, r.pid)?;
    let nvml = rig.nvml()?.process_bytes(r.pid)?;
    Ok(memory_row(s.name(), check, video, nvml))
}

/// The first GPU's total memory as NVML gives it: what the sections size their sessions by.
///
/// # Errors
/// NVML can't be read or gives no total.
pub(crate) fn gpu_total(rig: &Rig) -> anyhow::Result<u64> {
    rig.nvml()?
        .gpus
        .first()
        .and_then(|g| g.total)
        .context("NVML gives no total memory to size the sessions by")
}

/// The allocation steps, a second process, and an agent started after its workload, each held
/// to NVML's per-process figure.
pub fn memory(rig: &Rig, s: &Section, o: &Opts) -> anyhow::Result<()> {
    ensure_agent(rig)?;
    let total = gpu_total(rig)?;
    let mem = vec![format!("cuda.mem={}g", session_gib(total))];
    s.doing("the steps workload's start");
    let mut w = rig.workload(s, "steps", &mem, None, None, &["steps"])?;
    let steps = [
        ("context", "PyTorch: context"),
        ("tensors", "PyTorch: tensors"),
        ("empty_cache", "PyTorch: empty_cache"),
        ("managed", "cudaMallocManaged 1 GiB, touched on the GPU"),
        ("managed_freed", "PyTorch: managed_freed"),
    ];
    for (name, check) in steps {
        s.doing(format!("waiting for the steps workload's {name}"));
        let r = w.expect(name, STEP)?;
        settle(o);
        if r.name != name {
            bail!("the workload printed {} where {name} was due", r.name);
        }
        sub(s, check, || {
            if name == "managed" {
                let (video, managed) = agent_bytes(rig, r.pid)?;
                let want = held(&r);
                return Ok(row(
                    s,
                    check,
                    format!(
                        "managed {} KiB (bound), video {} KiB",
                        managed / 1024,
                        video / 1024
                    ),
                    format!("≥ {} KiB", want / 1024),
                    verdict(managed >= want && want > 0),
                ));
            }
            held_to_nvml(rig, s, check, &r)
        });
        if name == "tensors" {
            // The second process joins while the first holds its tensors.
            let check = "a second process on the same GPU";
            sub(s, check, || {
                let mut second = rig.workload(s, "second", &mem, None, None, &["hold", "512"])?;
                let r2 = second.expect("its tensor", STEP)?;
                settle(o);
                let row = held_to_nvml(rig, s, check, &r2);
                second.finish(Duration::from_secs(30));
                row
            });
        }
        w.go();
    }
    w.finish(Duration::from_secs(30));
    late_agent(rig, s, o)?;
    let check = "a process holding 1 GiB exits: released";
    sub(s, check, || release(rig, s, check));
    Ok(())
}

/// The slowest release held to: the agent's sweep runs every second, so a file the process's own
/// mapping held at its exit is let go within about one.
const RELEASE_WITHIN: Duration = Duration::from_secs(2);

/// A process holding 1 GiB exits: how long until its container reads 0, and how many allocations
/// the agent kept as orphans meanwhile (libcuda maps its files, so an exit on 6.16+ kernels may
/// wait for the sweep).
fn release(rig: &Rig, s: &Section, check: &str) -> anyhow::Result<Row> {
    let cgroup = LateCgroup::named("release")?;
    let mut w = rig.workload(s, "release", &[], None, Some(&cgroup.0), &["hold", "1024"])?;
    let hold = w.expect("the hold", STEP)?;
    let snapshot = rig.snapshot()?;
    let path = container_path(&snapshot, hold.pid)
        .context("the agent shows no container for the holder")?;
    let before_exit = container_video(&snapshot, &path);
    let start = Instant::now();
    w.go();
    let (mut orphans, mut released) = (0, None);
    while start.elapsed() < RELEASE_WITHIN * 3 {
        let snapshot = rig.snapshot()?;
        orphans = orphans.max(
            snapshot["stats"]["orphaned_allocations"]
                .as_u64()
                .unwrap_or(0),
        );
        if container_video(&snapshot, &path) == 0 {
            released = Some(start.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    w.finish(Duration::from_secs(30));
    drop(cgroup);
    Ok(row(
        s,
        check,
        released.map_or_else(
            || format!("still counted after {:?}", RELEASE_WITHIN * 3),
            |t| format!("0 after {} ms; orphans up to {orphans}", t.as_millis()),
        ),
        format!("0 within {} ms", RELEASE_WITHIN.as_millis()),
        verdict(released.is_some_and(|t| t <= RELEASE_WITHIN)),
    )
    .note(format!(
        "held {} KiB before the exit; {path}",
        before_exit / 1024
    )))
}

/// The cgroup path of the container a pid is in.
fn container_path(snapshot: &Value, pid: u32) -> Option<String> {
    snapshot["containers"].as_array()?.iter().find(|c| {
        c["pids"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p.as_u64() == Some(u64::from(pid))))
    })?["cgroup_path"]
        .as_str()
        .map(str::to_owned)
}

/// The video bytes the container at `path` holds (0 when it is not listed).
fn container_video(snapshot: &Value, path: &str) -> u64 {
    snapshot["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["cgroup_path"].as_str() == Some(path)))
        .and_then(|c| c["devices"].as_array())
        .map_or(0, |ds| {
            ds.iter()
                .filter(|d| {
                    d["device"]
                        .as_str()
                        .and_then(|n| n.strip_prefix("nvidia"))
                        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
                })
                .filter_map(|d| d["memory_bytes"].as_u64())
                .sum()
        })
}

/// An agent started after the workload made its context counts what comes after; the
/// workload runs in a cgroup of its own, away from gpu-check's NVML clients.
fn late_agent(rig: &Rig, s: &Section, o: &Opts) -> anyhow::Result<()> {
    let cgroup = LateCgroup::make()?;
    rig.stop_agent();
    s.doing("the late workload's context");
    let mut late = rig.workload(s, "late", &[], None, Some(&cgroup.0), &["steps"])?;
    let context = late.expect("the context", STEP)?;
    let own = "late workload in a cgroup of its own";
    sub(s, own, || {
        let text = std::fs::read_to_string(format!("/proc/{}/cgroup", context.pid))?;
        let name = cgroup.0.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        let line = text
            .lines()
            .find(|l| l.starts_with("0::"))
            .unwrap_or("none");
        Ok(row(
            s,
            own,
            line,
            format!("…/{name}"),
            verdict(line.ends_with(name)),
        ))
    });
    let before = rig.nvml().and_then(|n| n.process_bytes(context.pid));
    s.doing("starting the agent after the workload");
    rig.start_agent()?;
    late.go();
    let tensors = late.expect("the tensors", STEP)?;
    settle(o);
    let check = "agent started after the workload: bytes since";
    sub(s, check, || {
        let before = before.context("NVML before the agent")?;
        let (video, _) = agent_bytes(rig, tensors.pid)?;
        let after = rig.nvml()?.process_bytes(tensors.pid)?;
        let delta = after.saturating_sub(before);
        Ok(row(
            s,
            check,
            format!("{} KiB", video / 1024),
            format!("NVML delta {} KiB", delta / 1024),
            verdict(video == delta),
        )
        .note(kib_diff(video, delta)))
    });
    for _ in 0..3 {
        late.go();
        if late.next(STEP)?.is_none() {
            break;
        }
    }
    late.finish(Duration::from_secs(30));
    drop(late);
    drop(cgroup);
    Ok(())
}

/// A cgroup v2 directory of gpu-check's, removed when dropped.
struct LateCgroup(PathBuf);

impl LateCgroup {
    fn make() -> anyhow::Result<Self> {
        Self::named("late")
    }

    fn named(tag: &str) -> anyhow::Result<Self> {
        let mounts = std::fs::read_to_string("/proc/self/mounts")?;
        let root = cgroup2_root(&mounts).context("no cgroup v2 hierarchy mounted")?;
        let dir = root.join(format!("gpu-check-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for LateCgroup {
    fn drop(&mut self) {
        for _ in 0..20 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The bytes a record says are held.
fn held(r: &Record) -> u64 {
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a byte count"
    )]
    let bytes = r.number("bytes").unwrap_or(0.0) as u64;
    bytes
}

/// The memory limit's three policies, on a workload that grows by 512 MiB past 2 GiB.
pub fn limits(rig: &Rig, s: &Section, o: &Opts) -> anyhow::Result<()> {
    ensure_agent(rig)?;
    let tier = rig
        .snapshot()
        .ok()
        .and_then(|v| v["memory_tier"].as_str().map(str::to_owned))
        .unwrap_or_default();
    sub(s, "kill at 2 GiB", || limit_kill(rig, s, &tier));
    sub(s, "stop at 2 GiB", || limit_stop(rig, s, o));
    sub(s, "report past 2 GiB", || limit_report(rig, s, o));
    Ok(())
}

/// Whether the kill came at the allocation that crossed the limit, judged from both sides:
/// NVML's total before the last allocation is within the limit, and one more allocation would
/// have crossed it.
#[must_use]
pub fn kill_bounded(last_nvml: u64, limit: u64, allocation: u64) -> bool {
    last_nvml <= limit && limit < last_nvml + allocation
}

fn limit_session() -> Vec<String> {
    vec![format!("cuda.mem={}g", LIMIT / GIB)]
}

/// kill: the allocation that would cross the limit kills the process (or, under a refusing
/// tier, fails with out-of-memory).
fn limit_kill(rig: &Rig, s: &Section, tier: &str) -> anyhow::Result<Row> {
    let check = "kill at 2 GiB";
    let mut w = rig.workload(
        s,
        "kill",
        &limit_session(),
        Some("kill"),
        None,
        &["grow", "512"],
    )?;
    let (mut last, mut oom) = (None, None);
    while let Some(r) = w.next(STEP)? {
        if r.name == "oom" {
            oom = Some(r);
            break;
        }
        last = Some(rig.nvml()?.process_bytes(r.pid)?);
        w.go();
    }
    let status = w.finish(Duration::from_secs(30));
    let last = last.context("the workload printed no allocation before the limit")?;
    let killed = status.is_some_and(|st| {
        use std::os::unix::process::ExitStatusExt as _;
        st.code() == Some(137) || st.signal() == Some(libc::SIGKILL)
    });
    let refusing = tier != "tracepoint_signal";
    let (outcome_ok, want) = if refusing {
        (oom.is_some(), "an out-of-memory error")
    } else {
        (killed, "killed (137)")
    };
    let bounded = kill_bounded(last, LIMIT, GROW);
    Ok(row(
        s,
        check,
        format!(
            "{}, NVML {} KiB before the last allocation",
            if oom.is_some() {
                "out-of-memory error".to_owned()
            } else {
                status.map_or_else(|| "did not exit".to_owned(), |st| st.to_string())
            },
            last / 1024
        ),
        format!(
            "{want}; NVML ≤ {} KiB < NVML + {} KiB",
            LIMIT / 1024,
            GROW / 1024
        ),
        verdict(outcome_ok && bounded),
    )
    .note(format!("memory_tier {tier}")))
}

/// stop: the process is stopped at the crossing.
fn limit_stop(rig: &Rig, s: &Section, o: &Opts) -> anyhow::Result<Row> {
    let check = "stop at 2 GiB";
    let mut w = rig.workload(
        s,
        "stop",
        &limit_session(),
        Some("stop"),
        None,
        &["grow", "512"],
    )?;
    let mut pid = None;
    let mut stopped = false;
    let mut quiet = 0;
    while !stopped && quiet < if o.dry { 100 } else { 300 } {
        match w.poll(Duration::from_millis(200))? {
            Polled::Record(r) => {
                pid = Some(r.pid);
                quiet = 0;
                w.go();
            }
            Polled::Ended => break,
            Polled::Quiet => quiet += 1,
        }
        stopped = pid.is_some_and(|p| process_state(p) == Some('T'));
    }
    s.row(held_row(rig, s, pid.filter(|_| stopped)));
    if let Some(p) = pid.filter(|_| stopped) {
        // Only a pid the workload printed, checked to be ours by `signal`.
        let _ = procs::signal(i64::from(p), libc::SIGKILL, "the stopped workload");
    }
    w.finish(Duration::from_secs(30));
    Ok(row(
        s,
        check,
        if stopped {
            "stopped (T)"
        } else {
            "not stopped"
        },
        "stopped",
        verdict(stopped),
    ))
}

/// While a `stop`ped process is held: did the allocation that crossed reach the driver? (The
/// signal is sent at the ioctl's entry and takes effect on its return to user space.)
fn held_row(rig: &Rig, s: &Section, stopped: Option<u32>) -> Row {
    let check = "stop at 2 GiB: NVML while held";
    let Some(pid) = stopped else {
        return failed(s, check, &anyhow::anyhow!("the workload was not stopped"));
    };
    match rig.nvml().and_then(|n| n.process_bytes(pid)) {
        Ok(bytes) => row(
            s,
            check,
            format!("NVML {} KiB", bytes / 1024),
            format!("the limit {} KiB", LIMIT / 1024),
            Verdict::Info,
        )
        .note(if bytes > LIMIT {
            "above the limit: the crossing allocation reached the driver before the stop"
        } else {
            "within the limit: the crossing allocation did not reach the driver"
        }),
        Err(e) => failed(s, check, &e),
    }
}

/// report: the process goes on past the limit; the agent reports the crossing.
fn limit_report(rig: &Rig, s: &Section, o: &Opts) -> anyhow::Result<Row> {
    let check = "report past 2 GiB";
    let mut w = rig.workload(
        s,
        "report",
        &limit_session(),
        Some("report"),
        None,
        &["grow", "512"],
    )?;
    let past = loop {
        let r = w.expect("an allocation past the limit", STEP)?;
        if held(&r) >= LIMIT + 2 * GROW {
            break r;
        }
        w.go();
    };
    settle(o);
    let reports = report_events(&rig.snapshot()?, past.pid);
    w.finish(Duration::from_secs(5));
    Ok(row(
        s,
        check,
        format!("ran to {} KiB, {reports} report events", held(&past) / 1024),
        "runs on, ≥ 1 report event",
        verdict(reports > 0),
    ))
}

/// One matmul run's result, the agent's account of it and the GPU's conditions halfway through.
///
/// The judge is the GPU's time, not the work: `busy` times each kernel between its own CUDA
/// events over the run's wall time. Alone, nothing else runs, so that is the tenant's GPU time
/// whatever the clock (a GPU held partly idle clocks up: 1,980 against 1,470 MHz at the H200's
/// power cap, so a tenant at 0.3 does 34 % of the work it does at full duty). In pairs under
/// exclusive slots the two never run at once, so kernel time is still the tenant's own (under
/// buckets a kernel also waits behind the other context, and kernel time overcounts), and the
/// GPU stays busy, so the rate is fair too: pairs are held to both.
///
/// A span whose process was frozen between queueing its start event and its end event also
/// holds the GPU's idling until the thaw (the first H200 run of the slots: 31 % for a tenant at
/// 0.1 that did 11.7 % of the work, with 2,000 kernels per second between freezes of a second):
/// the workload counts such a span, several times the median, as the median kernel, and
/// reports the raw sum (`raw_busy`) and how many it so counted (`gaps`) beside it, in the notes.
/// `batch_busy` (whole batches of ten) also counts the GPU idling inside a batch; it stays in the
/// notes too.
struct Matmul {
    rate: f64,
    busy: f64,
    batch_busy: f64,
    /// The kernel spans' plain sum per wall second, freezes included (absent in a rehearsal).
    raw_busy: Option<f64>,
    /// How many spans held a freeze.
    gaps: Option<f64>,
    /// The agent's measured GPU time over the run, per wall second (from its snapshots).
    agent: Option<f64>,
    /// Time the throttle kept it frozen, per wall second.
    throttled: Option<f64>,
    /// The wall time the agent's account covers, seconds.
    window: f64,
    conditions: String,
}

impl Matmul {
    /// This run's rate as a share of `before`'s: the work it got.
    fn rate_share(&self, before: &Matmul) -> f64 {
        self.rate / before.rate
    }

    /// This run's kernel-timed GPU time as a share of `before`'s: the time it got.
    fn time_share(&self, before: &Matmul) -> f64 {
        self.busy / before.busy
    }

    /// What the notes of a share row say beside the judged figures.
    fn note(&self, before: &Matmul) -> String {
        let pct =
            |v: Option<f64>| v.map_or_else(|| "?".to_owned(), |v| format!("{:.1} %", v * 100.0));
        let raw = self
            .raw_busy
            .zip(before.raw_busy)
            .map_or_else(String::new, |(r, b)| {
                format!(
                    ", raw spans {:.1} % ({} held a freeze)",
                    r / b * 100.0,
                    self.gaps.unwrap_or_default()
                )
            });
        format!(
            "work (rate) {:.1} %, kernel time {:.1} %{raw}, batch-timed {:.1} %; agent's GPU \
             time {}, frozen {}; {}",
            self.rate_share(before) * 100.0,
            self.time_share(before) * 100.0,
            self.batch_busy / before.batch_busy * 100.0,
            pct(self.agent.map(|a| a / before.busy)),
            pct(self.throttled),
            self.conditions
        )
    }
}

/// A container's `gpu_time_ms` and `throttled_ms` in a snapshot, by one of its pids.
fn gpu_time(snapshot: &Value, pid: u32) -> Option<(f64, f64)> {
    let c = snapshot["containers"].as_array()?.iter().find(|c| {
        c["pids"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p.as_u64() == Some(u64::from(pid))))
    })?;
    let e = &c["enforcement"];
    Some((e["gpu_time_ms"].as_f64()?, e["throttled_ms"].as_f64()?))
}

/// Runs matmul workloads with these resources at once; their results.
fn matmuls(
    rig: &Rig,
    s: &Section,
    o: &Opts,
    sessions: &[Vec<String>],
) -> anyhow::Result<Vec<Matmul>> {
    let secs = format!("{}", o.seconds);
    let mut ws = Vec::new();
    for (i, r) in sessions.iter().enumerate() {
        ws.push(rig.workload(s, &format!("matmul-{i}"), r, None, None, &["matmul", &secs])?);
    }
    let mut pids = Vec::new();
    for w in &mut ws {
        pids.push(w.expect("started", STEP)?.pid);
    }
    // The agent's account, from just after the start to a second before the end. Each instant is
    // taken as its snapshot returns, so the call's own latency cancels out.
    let first = rig.snapshot().map(|v| (Instant::now(), v));
    let start = first.as_ref().map_or_else(|_| Instant::now(), |f| f.0);
    std::thread::sleep(Duration::from_secs_f64(o.seconds / 2.0));
    let conditions = rig
        .nvml()
        .map_or_else(|e| format!("{e:#}"), |n| n.conditions());
    // Halfway, in a short rehearsal: the workload must still run.
    let end = start + Duration::from_secs_f64((o.seconds - 1.0).max(o.seconds / 2.0));
    std::thread::sleep(end.saturating_duration_since(Instant::now()));
    let last = rig.snapshot().map(|v| (Instant::now(), v));
    let window = match (&first, &last) {
        (Ok((t0, _)), Ok((t1, _))) => t1.duration_since(*t0).as_secs_f64(),
        _ => 0.0,
    };
    let account = |pid: u32| -> Result<(f64, f64), String> {
        let (t0, s0) = first
            .as_ref()
            .map_err(|e| format!("first snapshot: {e:#}"))?;
        let (t1, s1) = last.as_ref().map_err(|e| format!("last snapshot: {e:#}"))?;
        let wall = t1.duration_since(*t0).as_secs_f64();
        let (a, b) = gpu_time(s0, pid)
            .zip(gpu_time(s1, pid))
            .ok_or_else(|| format!("no container with pid {pid} and a compute share"))?;
        Ok(((b.0 - a.0) / 1e3 / wall, (b.1 - a.1) / 1e3 / wall))
    };
    let limit = Duration::from_secs_f64(o.seconds) + STEP;
    let mut out = Vec::new();
    for (w, pid) in ws.iter_mut().zip(pids) {
        let r = w.expect("the rate", limit)?;
        w.finish(Duration::from_secs(30));
        let agent = account(pid);
        let conditions = match &agent {
            Ok(_) => conditions.clone(),
            Err(why) => format!("{conditions}; the agent's account: {why}"),
        };
        out.push(Matmul {
            rate: r.number("rate").context("no rate")?,
            busy: r.number("busy").context("no busy")?,
            batch_busy: r.number("batch_busy").context("no batch_busy")?,
            raw_busy: r.number("raw_busy"),
            gaps: r.number("gaps"),
            agent: agent.as_ref().ok().map(|a| a.0),
            throttled: agent.as_ref().ok().map(|a| a.1),
            window,
            conditions,
        });
    }
    Ok(out)
}

/// A tenant's row: alone, judged by its GPU time; in a pair, by its GPU time and its work.
fn tenant_row(check: String, share: f64, m: &Matmul, before: &Matmul, pair: bool) -> Row {
    let time = m.time_share(before);
    let mut r = share_row(check, share, time);
    if pair {
        let rate = m.rate_share(before);
        let both = share_verdict(share, time) == Verdict::Pass
            && share_verdict(share, rate) == Verdict::Pass;
        r = Row::new(
            "throttle",
            r.check.clone(),
            format!(
                "time {:.1} % ({:+.1}), work {:.1} % ({:+.1})",
                time * 100.0,
                (time - share) * 100.0,
                rate * 100.0,
                (rate - share) * 100.0
            ),
            r.reference.clone(),
            verdict(both),
        );
    }
    r.note(m.note(before))
}

/// The throttle at each share, one tenant and two sharing the GPU, held to the GPU time the
/// workload gets alone (measured before and after); NVML's raw streams recorded meanwhile into
/// `nvml-stream.jsonl` (a fixture for the throttle's GPU model) and summed up in the last row.
pub fn throttle(rig: &Rig, s: &Section, o: &Opts) -> anyhow::Result<()> {
    ensure_agent(rig)?;
    let stream = rig.out.join("nvml-stream.jsonl");
    let recorder = rig.record_nvml(s, o.seconds * 12.0 + 120.0, &stream);
    s.doing("the baseline before");
    let before = matmuls(rig, s, o, &[vec![]])?.remove(0);
    s.row(
        row(
            s,
            "matmul alone before (the 100 % rate)",
            format!(
                "{:.1}/s, GPU busy {:.1} %",
                before.rate,
                before.busy * 100.0
            ),
            "",
            verdict(before.busy > 0.0),
        )
        .note(before.conditions.clone()),
    );
    let mut accounts: Vec<Account> = Vec::new();
    for share in SHARES {
        let other = 1.0 - share;
        let check = format!("one tenant at {share}");
        sub(s, &check, || {
            let m = matmuls(rig, s, o, &[vec![format!("cuda.shares={share}")]])?.remove(0);
            accounts.push(Account::of(&check, &m, &before));
            Ok(tenant_row(check.clone(), share, &m, &before, false))
        });
        let first = format!("two tenants {share} + {other:.1}: the first ({share})");
        let second = format!("two tenants {share} + {other:.1}: the second ({other:.1})");
        s.doing(&first);
        match matmuls(
            rig,
            s,
            o,
            &[
                vec![format!("cuda.shares={share}")],
                vec![format!("cuda.shares={other:.1}")],
            ],
        ) {
            Ok(ms) => {
                for ((check, target), m) in [(&first, share), (&second, other)].into_iter().zip(ms)
                {
                    accounts.push(Account::of(check, &m, &before));
                    s.row(tenant_row(check.clone(), target, &m, &before, true));
                }
            }
            Err(e) => {
                s.row(failed(s, &first, &e));
                s.row(failed(s, &second, &e));
            }
        }
    }
    let check = "matmul alone after (baseline drift)";
    sub(s, check, || {
        let after = matmuls(rig, s, o, &[vec![]])?.remove(0);
        let drift = after.rate_share(&before) - 1.0;
        Ok(row(
            s,
            check,
            format!(
                "{:.1}/s ({:+.1} % against before), GPU busy {:.1} %",
                after.rate,
                drift * 100.0,
                after.busy * 100.0
            ),
            "within ± 5 % of before",
            verdict(drift.abs() <= 0.05),
        )
        .note(after.conditions))
    });
    agent_row(s, &accounts);
    drop(recorder);
    signal_row(rig, s, &stream);
    Ok(())
}

/// One tenant's GPU time by the judge and by the agent (both over the unthrottled run's).
struct Account {
    check: String,
    judge: f64,
    agent: Option<f64>,
    /// The seconds the agent's figure covers.
    window: f64,
}

impl Account {
    fn of(check: &str, m: &Matmul, before: &Matmul) -> Self {
        Self {
            check: check.to_owned(),
            judge: m.time_share(before),
            agent: m.agent.map(|a| a / before.busy),
            window: m.window,
        }
    }
}

/// The shortest window over which the agent's figure is held to 2 points: many sample periods
/// (200 ms on an H200), and much longer than the snapshot call.
const AGENT_WINDOW: f64 = 5.0;

/// The agent's GPU time for each tenant against the judge's.
fn agent_row(s: &Section, accounts: &[Account]) {
    let check = "the agent's GPU time against the judge";
    sub(s, check, || {
        let misses: Vec<f64> = accounts
            .iter()
            .filter_map(|a| a.agent.map(|agent| (agent - a.judge).abs()))
            .collect();
        let worst = misses.iter().copied().fold(0.0, f64::max);
        let all = misses.len() == accounts.len() && !accounts.is_empty();
        let shortest = accounts
            .iter()
            .map(|a| a.window)
            .fold(f64::INFINITY, f64::min);
        let verdict = if shortest < AGENT_WINDOW {
            // A rehearsal's sub-second rows: too short to hold a sampled figure to 2 points.
            Verdict::Info
        } else {
            verdict(all && worst <= 0.02)
        };
        Ok(row(
            s,
            check,
            format!(
                "worst {:.1} points over {} of {} tenants",
                worst * 100.0,
                misses.len(),
                accounts.len()
            ),
            format!("every tenant within 2 points (windows of {AGENT_WINDOW} s or more)"),
            verdict,
        )
        .note(
            accounts
                .iter()
                .map(|a| {
                    format!(
                        "{}: judge {:.1} %, agent {} over {:.1} s",
                        a.check,
                        a.judge * 100.0,
                        a.agent
                            .map_or_else(|| "?".to_owned(), |v| format!("{:.1} %", v * 100.0)),
                        a.window
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
        ))
    });
}

/// What the recording of NVML's streams shows, beside the agent's own view of its signal.
fn signal_row(rig: &Rig, s: &Section, stream: &Path) {
    let check = "compute-share signal: NVML's streams and the agent's view";
    sub(s, check, || {
        let summary = rig.nvml_summary(stream)?;
        let agent = rig.snapshot()?;
        let view = agent["throttle_signals"]
            .get(0)
            .cloned()
            .unwrap_or(Value::Null);
        let period = summary["period_us"].as_u64();
        Ok(row(
            s,
            check,
            format!(
                "period {} µs, jitter {} µs, process samples {} µs after the device's; agent: \
                 mode {}, period {} µs, late {}, unattributed {} ms, reads {} µs (slowest {} µs)",
                summary["period_us"],
                summary["jitter_us"],
                summary["process_offset_us"]["median"],
                agent["throttle_mode"],
                view["period_us"],
                view["late_samples"],
                view["unattributed_ms"],
                view["read_mean_us"],
                view["read_max_us"],
            ),
            "a sample period seen",
            verdict(period.is_some()),
        )
        .note(format!(
            "recording: {}; summary {summary}",
            stream.display()
        )))
    });
}

/// The median and the spread (min–max) of `v`.
#[must_use]
pub fn median_spread(v: &[f64]) -> Option<(f64, f64, f64)> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return None;
    }
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        f64::midpoint(v[n / 2 - 1], v[n / 2])
    };
    Some((median, v[0], v[n - 1]))
}

/// The agent's `gpu_ioctls` counter.
fn gpu_ioctls(snapshot: &Value) -> Option<u64> {
    snapshot["stats"]["gpu_ioctls"].as_u64()
}

/// Time per training step and per `cudaMalloc`/`cudaFree`, without and with the agent, three
/// rounds alternating, each warmed up; the agent's counters must rise in the runs with it.
pub fn cost(rig: &Rig, s: &Section, o: &Opts) -> anyhow::Result<()> {
    let (steps, pairs) = (o.cost.0.to_string(), o.cost.1.to_string());
    let one = |label: &str| -> anyhow::Result<(f64, f64)> {
        let mut w = rig.workload(s, label, &[], None, None, &["cost", &steps, &pairs])?;
        let r = w.expect("the cost", Duration::from_mins(3))?;
        w.finish(Duration::from_secs(30));
        Ok((
            r.number("step_s").context("no step_s")?,
            r.number("pair_s").context("no pair_s")?,
        ))
    };
    let (mut train, mut malloc, mut rose, mut seen) = (vec![], vec![], true, vec![]);
    for round in 1..=3 {
        s.doing(format!("round {round} without the agent"));
        rig.stop_agent();
        let off = one(&format!("cost-off-{round}"))?;
        s.doing(format!("round {round} with the agent"));
        rig.start_agent()?;
        let c0 = gpu_ioctls(&rig.snapshot()?);
        let on = one(&format!("cost-on-{round}"))?;
        let c1 = gpu_ioctls(&rig.snapshot()?);
        let delta = c0.zip(c1).map(|(a, b)| b.saturating_sub(a));
        rose &= delta.is_some_and(|d| d > 0);
        seen.push(delta.map_or_else(|| "?".to_owned(), |d| d.to_string()));
        train.push(on.0 / off.0);
        malloc.push(on.1 / off.1);
    }
    for (check, ratios) in [
        ("training step of a small MLP", &train),
        ("cudaMalloc + cudaFree of 2 MiB", &malloc),
    ] {
        let (m, lo, hi) = median_spread(ratios).context("no rounds")?;
        s.row(
            row(
                s,
                check,
                format!("median {m:.3}× with the agent"),
                format!("spread {lo:.3}–{hi:.3}× over 3 alternating rounds"),
                Verdict::Info,
            )
            .note(format!("{steps} steps, {pairs} pairs per run, warmed up")),
        );
    }
    s.row(row(
        s,
        "agent counters rose during the runs with it",
        format!("gpu_ioctls +{}", seen.join(", +")),
        "> 0 in every round",
        verdict(rose),
    ));
    Ok(())
}

/// Whether driver hooks load on this kernel (`gpuwarden-agent probe-hooks`).
pub fn hooks(rig: &Rig, s: &Section) {
    let check = "probe-hooks ran";
    sub(s, check, || {
        let trials = rig.probe_hooks()?;
        let rows = hook_rows(&trials);
        let n = rows.len();
        for r in rows {
            s.row(r);
        }
        Ok(row(
            s,
            check,
            format!("{n} hooks tried"),
            "≥ 1",
            verdict(n > 0),
        ))
    });
}
