//! The suspend section (issue 38, docs/suspend.md): a PyTorch workload holding 4 GiB of
//! seeded data in a session of its own is suspended through the agent's local command, held to
//! NVML (its GPU memory released) and to the kernel (its cgroup frozen); meanwhile another
//! process, in a session of its own, fills as much memory as the workload freed and exits; the
//! workload is resumed, and its data checked against the checksum it printed before; the agent's count after the resume is held
//! to NVML's to the byte. The driver's own answer for the process, asked without the agent,
//! comes first. Where the driver refuses, the agent falls back to the kill path and the rows say
//! so with the driver's code.
//!
//! Then the driver's side of a move to other GPUs, on one GPU: the helper's `driver-version`,
//! and the workload checkpointed by the helper and restored with its GPU paired to itself
//! (`--gpu-pair U=U`), held to NVML, its checksum and the agent's count.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use serde_json::Value;

use super::{
    GIB, STEP, agent_bytes, cgroup2_root, ensure_agent, gpu_total, held, held_to_nvml, row,
    session_gib, settle, sub, verdict,
};
use crate::gpu_check::{
    MIB, Record, Row, Verdict, container_bytes, kib_diff, process_state,
    rig::{Nvml, Rig},
    runner::{Section, tail},
};

/// The checkpoint helper's answer for the workload, asked before the agent acts.
pub const DRIVER_STATE: &str = "driver's checkpoint state, without the agent (get-state)";
/// The agent's `suspended` event for the session.
pub const SUSPENDED: &str = "suspend: agent suspended the session";
/// NVML's bytes for the suspended process.
pub const NVML_SUSPENDED: &str = "suspend: NVML while suspended";
/// The suspended process's cgroup frozen.
pub const FROZEN: &str = "suspend: process frozen";
/// Another process takes the freed memory while the workload is suspended, then exits.
pub const OTHER: &str = "suspend: another process allocates meanwhile";
/// How long each direction took, and the rate.
pub const RATE: &str = "resume: time and rate";
/// The workload's checksum after the resume against before.
pub const INTACT: &str = "resume: data intact";
/// The agent's count after the resume against NVML's.
pub const ACCOUNTING: &str = "resume: agent's accounting";
/// The helper's `driver-version`: whether the driver's restore takes GPU pairs.
pub const PAIR_VERSION: &str = "GPU pair: the driver's CUDA version (driver-version)";
/// The workload checkpointed by the helper and restored with its GPU paired to itself.
pub const PAIR_RESTORED: &str = "GPU pair: restored onto its own GPU (--gpu-pair), NVML";
/// The workload's checksum after the paired restore against the one it printed first.
pub const PAIR_INTACT: &str = "GPU pair: data intact";
/// The agent's count after the paired restore against NVML's.
pub const PAIR_ACCOUNTING: &str = "GPU pair: agent's accounting";

/// What the workload fills and checks (one tensor).
const TENSOR_MIB: u64 = 4096;
/// How long a suspension or a resumption may take to show in the agent's events (each
/// direction: 4 GiB takes a few seconds; the agent bounds each driver call by 120 s).
const SWITCH: Duration = Duration::from_mins(1);
/// NVML's bytes for a suspended process are held below this: a CUDA context alone is about
/// 612 MiB on an H200, so less means the 4 GiB tensor left the GPU; a checkpoint should leave 0.
const SUSPENDED_MAX: u64 = GIB;
/// How long the other process may take to start PyTorch and fill its memory: bounded well below
/// the section's deadline, so the resume still has its time when it hangs.
const OTHER_STEP: Duration = Duration::from_secs(45);
/// How long the other process may take to exit once its input ends (then it is killed).
const OTHER_EXIT: Duration = Duration::from_secs(15);
/// How long NVML is read, after the other process's exit, for it to leave NVML's list.
const OTHER_GONE: Duration = Duration::from_secs(10);
/// The first `cuDriverGetVersion` whose `CUcheckpointRestoreArgs` carries GPU pairs: CUDA 13.0
/// (driver 580), as NVIDIA's CUDA 13.0 release notes and cuda.h date `CUcheckpointGpuPair`.
const PAIRS_SINCE: i64 = 13_000;
/// The lock's bound in the driver for the pair check, as the agent's default step bound.
const LOCK_TIMEOUT_MS: &str = "60000";

/// A suspension or resumption as the agent's events tell it.
#[derive(Debug)]
struct Switch {
    /// From the request to the snapshot that showed the event.
    took: Duration,
    /// What the agent says it took (the event's reason: "… in N ms …").
    agent_ms: Option<u64>,
    /// The event.
    event: Value,
    /// The session's events seen, in order (their actions).
    actions: Vec<String>,
}

/// The suspend section: the driver's answer, then suspend, NVML and the freezer, another
/// process taking the freed memory and giving it back, then resume, the data and the agent's
/// count.
///
/// # Errors
/// A step the rest depends on failed (the rows not made say so).
pub fn section(rig: &Rig, s: &Section, o: &super::Opts) -> anyhow::Result<()> {
    ensure_agent(rig)?;
    let total = gpu_total(rig)?;
    // Memory only, with room to spare: no compute share, so the throttle never holds it.
    let gib = session_gib(total).max(TENSOR_MIB * MIB / GIB + 2);
    let mem = vec![format!("cuda.mem={gib}g")];
    s.doing("the suspend workload filling its 4 GiB");
    let mut w = rig.suspend_workload(s, "suspend", &mem, &[&TENSOR_MIB.to_string()])?;
    let filled = w.expect("its filled tensor", STEP)?;
    if filled.name != "filled" {
        bail!("the workload printed {} where filled was due", filled.name);
    }
    let pid = filled.pid;
    let checksum = filled.fields["checksum"]
        .as_str()
        .context("the filled record has no checksum")?
        .to_owned();
    settle(o);
    sub(s, DRIVER_STATE, || driver_state(rig, s, &filled));

    s.doing("reading the session and its bytes before the suspension");
    let snapshot = rig.snapshot()?;
    let session = session_of(&snapshot, pid)
        .with_context(|| format!("the agent shows no session holding pid {pid}"))?;
    let agent_before = container_bytes(&snapshot, pid).map(|b| b.0);
    let nvml_before = rig.nvml().and_then(|n| n.process_bytes(pid));
    let before = format!(
        "before: agent {}, NVML {}",
        kib(agent_before.ok_or("no container")),
        kib(nvml_before.as_ref().copied().map_err(|e| format!("{e:#}")))
    );

    s.doing(format!("suspending session {session}"));
    let start = Instant::now();
    rig.agent_request("suspend", &session)?;
    let suspended = match await_event(rig, &session, "suspended", &["suspend_refused"], start) {
        Ok(sw) => sw,
        Err(e) => {
            s.row(
                row(
                    s,
                    SUSPENDED,
                    "not suspended",
                    "a `suspended` event",
                    Verdict::Fail,
                )
                .note(format!("{e:#}; {before}")),
            );
            return Err(e.context("not suspended"));
        }
    };
    s.row(suspended_row(s, &suspended, &before));
    settle(o);
    sub(s, NVML_SUSPENDED, || {
        nvml_suspended(rig, s, pid, nvml_before.as_ref().ok().copied())
    });
    sub(s, FROZEN, || frozen(s, pid, o));
    sub(s, OTHER, || {
        other_allocates(rig, s, o, &mem, pid, &nvml_before)
    });

    s.doing(format!("resuming session {session}"));
    let start = Instant::now();
    rig.agent_request("resume-suspended", &session)?;
    let resumed =
        await_event(rig, &session, "resumed", &["resume_failed"], start).context("not resumed")?;
    s.row(rate_row(
        s,
        &suspended,
        &resumed,
        nvml_before.as_ref().ok().copied(),
        held(&filled),
    ));

    s.doing("waiting for the workload's checksum after the resume");
    w.go();
    let checked = w.expect("its checksum after the resume", STEP)?;
    if checked.name != "checked" {
        bail!(
            "the workload printed {} where checked was due",
            checked.name
        );
    }
    sub(s, INTACT, || {
        intact(s, INTACT, &checksum, &filled, &checked)
    });
    settle(o);
    sub(s, ACCOUNTING, || {
        let r = held_to_nvml(rig, s, ACCOUNTING, &checked)?;
        let note = format!("{}; {before}", r.note);
        Ok(r.note(note))
    });
    let paired = paired(rig, s, o, &mut w, &checksum, &filled);
    // A workload left locked or checkpointed by a failed pair check cannot exit by itself.
    w.finish(Duration::from_secs(if paired.is_ok() { 30 } else { 5 }));
    paired
}

/// The driver's side of a move to other GPUs, on one GPU: the helper's `driver-version`, then
/// the workload (running again after the agent's resume) locked and checkpointed by the helper
/// and restored with its GPU paired to itself (`--gpu-pair U=U`, CUDA 13.0's restore
/// arguments), and unlocked. Held to NVML (its memory left and came back), to its checksum and
/// to the agent's count. Nothing here changes a GPU setting.
fn paired(
    rig: &Rig,
    s: &Section,
    o: &super::Opts,
    w: &mut crate::gpu_check::rig::Workload,
    checksum: &str,
    filled: &Record,
) -> anyhow::Result<()> {
    s.doing("asking the driver its version through the helper");
    let version = driver_version(rig);
    s.row(version_row(rig, s, &version));
    let (cuda, _) = version.map_err(|e| e.context("GPU pairs not tried"))?;
    if cuda < PAIRS_SINCE {
        bail!("GPU pairs not tried: the driver's CUDA version {cuda} is below {PAIRS_SINCE}");
    }

    let tensor = held(filled);
    match restore_paired(rig, s, o, filled.pid, tensor) {
        Ok(restored) => s.row(restored),
        Err(e) => {
            s.row(
                row(
                    s,
                    PAIR_RESTORED,
                    "not restored with the GPU pair",
                    "the driver takes the pair",
                    Verdict::Fail,
                )
                .note(format!("{e:#}")),
            );
            return Err(e.context("not restored with the GPU pair"));
        }
    }

    s.doing("waiting for the workload's checksum after the paired restore");
    w.go();
    let checked = w.expect("its checksum after the paired restore", STEP)?;
    if checked.name != "checked" {
        bail!(
            "the workload printed {} where checked was due",
            checked.name
        );
    }
    sub(s, PAIR_INTACT, || {
        intact(s, PAIR_INTACT, checksum, filled, &checked)
    });
    settle(o);
    sub(s, PAIR_ACCOUNTING, || {
        held_to_nvml(rig, s, PAIR_ACCOUNTING, &checked)
    });
    Ok(())
}

/// `gpuwarden-agent checkpoint --action driver-version` (no process): the version and the
/// helper's line.
fn driver_version(rig: &Rig) -> anyhow::Result<(i64, String)> {
    let (status, line) = rig.checkpoint_call(0, "driver-version", &[])?;
    let answer: Value = serde_json::from_str(&line).with_context(|| {
        format!(
            "the helper printed no JSON ({status}): {line:?}; {}",
            tail(&rig.out.join("checkpoint-helper.log"), 3)
        )
    })?;
    match answer["driver_version"].as_i64() {
        Some(v) if answer["result"] == "ok" && status.success() => Ok((v, line)),
        _ => bail!("the helper gave no driver version ({status}): {line}"),
    }
}

/// The version's row: a version from [`PAIRS_SINCE`] on passes; NVML's driver in the notes.
fn version_row(rig: &Rig, s: &Section, version: &anyhow::Result<(i64, String)>) -> Row {
    let nvml_driver = rig
        .nvml()
        .ok()
        .and_then(|n| n.driver)
        .unwrap_or_else(|| "?".to_owned());
    let reference = format!("≥ {PAIRS_SINCE} (CUDA 13.0: restore takes GPU pairs)");
    match version {
        Ok((v, line)) => row(
            s,
            PAIR_VERSION,
            format!("CUDA {v}"),
            reference,
            verdict(*v >= PAIRS_SINCE),
        )
        .note(format!("{line}; NVML's driver {nvml_driver}")),
        Err(e) => row(s, PAIR_VERSION, "no version", reference, Verdict::Fail)
            .note(format!("{e:#}; NVML's driver {nvml_driver}")),
    }
}

/// One helper call on `pid` that must answer `ok`; what it said (and how long it took) goes
/// into `said`.
fn helper_ok(
    rig: &Rig,
    pid: u32,
    action: &str,
    extra: &[&str],
    said: &mut Vec<String>,
) -> anyhow::Result<()> {
    let start = Instant::now();
    let (status, line) = rig.checkpoint_call(pid, action, extra)?;
    said.push(format!(
        "{action}: {line} ({:.2} s)",
        start.elapsed().as_secs_f64()
    ));
    let answer: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
    if answer["result"] != "ok" || !status.success() {
        bail!("{action} answered {line} ({status})");
    }
    Ok(())
}

/// Lock, checkpoint, restore with the GPU the process is on paired to itself, unlock; NVML
/// read while checkpointed and after. A refused pair restore is answered with a plain restore
/// and unlock (so the workload can end), and the error says both.
fn restore_paired(
    rig: &Rig,
    s: &Section,
    o: &super::Opts,
    pid: u32,
    tensor: u64,
) -> anyhow::Result<Row> {
    let nvml = rig.nvml()?;
    let before = nvml.process_bytes(pid)?;
    let uuid = nvml
        .gpus
        .iter()
        .find(|g| g.processes.contains_key(&pid))
        .and_then(|g| g.uuid.clone())
        .with_context(|| format!("NVML gives no UUID for the GPU of process {pid}"))?;
    let pair = format!("{uuid}={uuid}");
    let mut said = Vec::new();
    s.doing("locking and checkpointing the workload through the helper");
    helper_ok(
        rig,
        pid,
        "lock",
        &["--timeout-ms", LOCK_TIMEOUT_MS],
        &mut said,
    )?;
    if let Err(e) = helper_ok(rig, pid, "checkpoint", &[], &mut said) {
        let _ = helper_ok(rig, pid, "unlock", &[], &mut said);
        bail!("{e:#}; {}", said.join("; "));
    }
    settle(o);
    let checkpointed = rig.nvml().and_then(|n| suspended_bytes(&n, pid));
    s.doing(format!("restoring the workload with --gpu-pair {pair}"));
    if let Err(e) = helper_ok(rig, pid, "restore", &["--gpu-pair", &pair], &mut said) {
        // Bring it back where it was, without pairs, so it can end.
        let back = helper_ok(rig, pid, "restore", &[], &mut said)
            .and_then(|()| helper_ok(rig, pid, "unlock", &[], &mut said));
        bail!(
            "the driver refused the restore with --gpu-pair {pair}: {e:#}; then a plain restore \
             and unlock {}; {}",
            back.map_or_else(
                |e| format!("failed: {e:#}"),
                |()| "brought it back".to_owned()
            ),
            said.join("; ")
        );
    }
    helper_ok(rig, pid, "unlock", &[], &mut said)
        .with_context(|| format!("restored with the pair, then: {}", said.join("; ")))?;
    settle(o);
    let after = rig.nvml()?.process_bytes(pid)?;
    let (away, away_said) = checkpointed.as_ref().map_or_else(
        |e| (None, format!("? ({e:#})")),
        |(b, t)| (Some(*b), t.clone()),
    );
    Ok(row(
        s,
        PAIR_RESTORED,
        format!(
            "NVML {} KiB after; while checkpointed: {away_said}",
            after / 1024
        ),
        format!(
            "≥ {} KiB after (the tensor), < {} KiB while checkpointed",
            tensor / 1024,
            SUSPENDED_MAX / 1024
        ),
        verdict(after >= tensor && away.is_some_and(|b| b < SUSPENDED_MAX)),
    )
    .note(format!(
        "--gpu-pair {pair}; NVML before {} KiB; {}",
        before / 1024,
        said.join("; ")
    )))
}

/// The suspension's row: how long it took, the events, the figures before.
fn suspended_row(s: &Section, suspended: &Switch, before: &str) -> Row {
    row(
        s,
        SUSPENDED,
        format!(
            "suspended in {:.1} s (the agent: {})",
            suspended.took.as_secs_f64(),
            suspended
                .agent_ms
                .map_or_else(|| "?".to_owned(), |ms| format!("{ms} ms"))
        ),
        "a `suspended` event",
        Verdict::Pass,
    )
    .note(format!(
        "events {}; {before}; the event's used_bytes {} KiB; {}",
        suspended.actions.join(", "),
        suspended.event["used_bytes"].as_u64().unwrap_or(0) / 1024,
        suspended.event["reason"].as_str().unwrap_or_default()
    ))
}

/// KiB of a figure, or why it is missing.
fn kib(bytes: Result<u64, impl std::fmt::Display>) -> String {
    bytes.map_or_else(|e| format!("? ({e})"), |b| format!("{} KiB", b / 1024))
}

/// `gpuwarden-agent checkpoint --pid PID --action get-state`, as the agent would run it but
/// without the agent: whether the helper loads the driver library and the driver answers for
/// this process at all, before anything depends on it.
fn driver_state(rig: &Rig, s: &Section, filled: &Record) -> anyhow::Result<Row> {
    let (status, line) = rig.checkpoint_call(filled.pid, "get-state", &[])?;
    let libcuda = filled.fields["libcuda"].as_str().unwrap_or("?");
    let answer: Value = serde_json::from_str(&line).with_context(|| {
        format!(
            "the helper printed no JSON ({status}): {line:?}; {}",
            tail(&rig.out.join("checkpoint-helper.log"), 3)
        )
    })?;
    let ok = answer["result"] == "ok";
    Ok(row(
        s,
        DRIVER_STATE,
        if ok {
            format!("state {}", answer["state"].as_str().unwrap_or("?"))
        } else {
            line.clone()
        },
        "an answer from the driver (`running` expected)",
        if ok { Verdict::Info } else { Verdict::Fail },
    )
    .note(format!("{line} ({status}); the workload maps {libcuda}")))
}

/// The session of the container holding `pid`, in a snapshot.
#[must_use]
pub fn session_of(snapshot: &Value, pid: u32) -> Option<String> {
    snapshot["containers"].as_array()?.iter().find(|c| {
        c["pids"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p.as_u64() == Some(u64::from(pid))))
    })?["session_id"]
        .as_str()
        .map(str::to_owned)
}

/// The events of `session` in a snapshot (from each container mapped under it, once each).
#[must_use]
pub fn session_events(snapshot: &Value, session: &str) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for c in snapshot["containers"].as_array().into_iter().flatten() {
        if c["session_id"].as_str() != Some(session) {
            continue;
        }
        for e in c["events"].as_array().into_iter().flatten() {
            if !out.contains(e) {
                out.push(e.clone());
            }
        }
    }
    out
}

/// The milliseconds an event's reason says an action took ("… frozen in 1234 ms; …").
#[must_use]
pub fn took_ms(reason: &str) -> Option<u64> {
    reason.split(" in ").skip(1).find_map(|rest| {
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let after = &rest[digits.len()..];
        (!digits.is_empty() && after.starts_with(" ms"))
            .then(|| digits.parse().ok())
            .flatten()
    })
}

/// Text without the terminal's colour sequences (`ESC [ … letter`), as a log may hold them.
#[must_use]
pub fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The last line of an agent's log recording one of `actions` for `session`, colours removed:
/// the events of a session the agent has just ended the kill way leave its snapshot with it.
#[must_use]
pub fn logged_event(log: &str, session: &str, actions: &[&str]) -> Option<String> {
    log.lines()
        .rev()
        .map(plain)
        .find(|l| l.contains(session) && actions.iter().any(|a| l.contains(a)))
        .map(|l| l.trim().to_owned())
}

/// Waits for the agent's `want` event for `session` (a snapshot every 100 ms), from `start`;
/// one of `failures` (in the snapshot, or in the agent's log once the session has left the
/// snapshot) ends the wait with its reason, the driver's code in it.
fn await_event(
    rig: &Rig,
    session: &str,
    want: &str,
    failures: &[&str],
    start: Instant,
) -> anyhow::Result<Switch> {
    let mut actions: Vec<String> = Vec::new();
    let mut last_error = String::new();
    let seen = |actions: &[String]| {
        if actions.is_empty() {
            "none".to_owned()
        } else {
            actions.join(", ")
        }
    };
    loop {
        match rig.snapshot() {
            Ok(snapshot) => {
                let events = session_events(&snapshot, session);
                if !events.is_empty() {
                    actions = events
                        .iter()
                        .map(|e| e["action"].as_str().unwrap_or("?").to_owned())
                        .collect();
                }
                if let Some(e) = events.iter().find(|e| e["action"] == want) {
                    return Ok(Switch {
                        took: start.elapsed(),
                        agent_ms: took_ms(e["reason"].as_str().unwrap_or_default()),
                        event: e.clone(),
                        actions,
                    });
                }
                let failure = events
                    .iter()
                    .find(|e| failures.iter().any(|f| e["action"].as_str() == Some(*f)));
                if let Some(e) = failure {
                    bail!(
                        "{}: {} (events {})",
                        e["action"].as_str().unwrap_or("?"),
                        e["reason"].as_str().unwrap_or("no reason given"),
                        seen(&actions)
                    );
                }
            }
            Err(e) => last_error = format!("; the last snapshot: {e:#}"),
        }
        let log = rig
            .agent_log()
            .and_then(|p| std::fs::read_to_string(p).ok());
        if let Some(line) = log.and_then(|l| logged_event(&l, session, failures)) {
            bail!("the agent's log: {line} (events seen {})", seen(&actions));
        }
        if start.elapsed() > SWITCH {
            bail!(
                "no {want} event within {} s (events seen {}){last_error}",
                SWITCH.as_secs(),
                seen(&actions)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// NVML's bytes for the suspended process: none listed, or less than a context.
fn nvml_suspended(rig: &Rig, s: &Section, pid: u32, before: Option<u64>) -> anyhow::Result<Row> {
    let nvml = rig.nvml()?;
    let (bytes, said) = suspended_bytes(&nvml, pid)?;
    let agent = agent_bytes(rig, pid).map(|b| b.0);
    Ok(row(
        s,
        NVML_SUSPENDED,
        said,
        format!(
            "< {} KiB (less than a CUDA context; before: {})",
            SUSPENDED_MAX / 1024,
            before.map_or_else(|| "?".to_owned(), |b| format!("{} KiB", b / 1024))
        ),
        verdict(bytes < SUSPENDED_MAX),
    )
    .note(format!(
        "the agent's count meanwhile: {}",
        kib(agent.map_err(|e| format!("{e:#}")))
    )))
}

/// NVML's bytes for `pid` and how to say them: a process NVML no longer lists holds nothing.
///
/// # Errors
/// NVML lists it without a figure.
pub fn suspended_bytes(nvml: &Nvml, pid: u32) -> anyhow::Result<(u64, String)> {
    if !nvml.gpus.iter().any(|g| g.processes.contains_key(&pid)) {
        return Ok((0, format!("NVML lists no process {pid} (0 KiB)")));
    }
    let bytes = nvml.process_bytes(pid)?;
    Ok((bytes, format!("NVML {} KiB", bytes / 1024)))
}

/// The cgroup v2 directory of `pid`.
fn cgroup_dir(pid: u32) -> anyhow::Result<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .with_context(|| format!("process {pid} is gone"))?;
    let path = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .with_context(|| format!("process {pid} is in no cgroup v2"))?;
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    let root = cgroup2_root(&mounts).context("no cgroup v2 hierarchy mounted")?;
    Ok(root.join(path.trim_start_matches('/')))
}

/// `frozen` of a `cgroup.events` file's text.
#[must_use]
pub fn events_frozen(text: &str) -> Option<bool> {
    text.lines()
        .find_map(|l| l.strip_prefix("frozen "))
        .map(|v| v.trim() == "1")
}

/// The CPU time (user + system clock ticks, all threads) of `pid`.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split_whitespace().collect();
    // After the name: state is field 3, utime 14 and stime 15.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// The suspended process: its cgroup says frozen (or it is stopped), and it uses no CPU.
fn frozen(s: &Section, pid: u32, o: &super::Opts) -> anyhow::Result<Row> {
    let dir = cgroup_dir(pid)?;
    // The root cgroup has no `cgroup.events` (a stand-in workload may run there).
    let events = std::fs::read_to_string(dir.join("cgroup.events"));
    let frozen = events.as_deref().ok().and_then(events_frozen);
    let state = process_state(pid).context("the process is gone")?;
    let window = if o.dry {
        Duration::from_millis(200)
    } else {
        Duration::from_secs(1)
    };
    let ticks = cpu_ticks(pid);
    std::thread::sleep(window);
    let ran = ticks
        .zip(cpu_ticks(pid))
        .map_or_else(|| "?".to_owned(), |(a, b)| format!("+{}", b - a));
    Ok(row(
        s,
        FROZEN,
        format!(
            "cgroup.events frozen {}, state {}",
            frozen.map_or("?", |f| if f { "1" } else { "0" }),
            state
        ),
        "frozen 1 (or stopped, T)",
        verdict(frozen == Some(true) || state == 'T'),
    )
    .note(format!(
        "CPU ticks over {} ms: {ran}; {}/cgroup.events{}",
        window.as_millis(),
        dir.display(),
        events
            .err()
            .map_or_else(String::new, |e| format!(" unreadable: {e}"))
    )))
}

/// While the workload is suspended, another process in a session of its own (`workload.py fill
/// MIB`) fills as much as the workload's NVML bytes before the suspension, rounded up to whole
/// MiB, and reads it back; its NVML bytes are held to that amount and the agent's count for its
/// container to NVML's exactly. Then its input ends, it exits, and NVML is read until it lists
/// the process no more.
fn other_allocates(
    rig: &Rig,
    s: &Section,
    o: &super::Opts,
    mem: &[String],
    suspended: u32,
    freed: &anyhow::Result<u64>,
) -> anyhow::Result<Row> {
    let freed = *freed.as_ref().map_err(|e| {
        anyhow::anyhow!(
            "NVML gave no bytes for the workload before the suspension, so how much it freed is \
             unknown: {e:#}"
        )
    })?;
    let mib = freed.div_ceil(MIB);
    s.doing(format!(
        "another process filling {mib} MiB while the workload is suspended"
    ));
    let mut w = rig.workload(s, "other", mem, None, None, &["fill", &mib.to_string()])?;
    let filled = w.expect("its filled tensor", OTHER_STEP)?;
    if filled.name != "fill" {
        bail!(
            "the other process printed {} where fill was due",
            filled.name
        );
    }
    settle(o);
    let nvml = rig.nvml();
    let agent = agent_bytes(rig, filled.pid).map(|b| b.0);
    let meanwhile = nvml
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e:#}"))
        .and_then(|n| suspended_bytes(n, suspended))
        .map_or_else(|e| format!("? ({e:#})"), |(_, said)| said);
    let held_nvml = nvml.and_then(|n| n.process_bytes(filled.pid));

    s.doing("the other process exiting, and NVML letting it go");
    let start = Instant::now();
    let status = w.finish(OTHER_EXIT);
    let exited = start.elapsed();
    let gone = nvml_gone(rig, filled.pid, start);

    let nvml = held_nvml.context("its NVML bytes while it held")?;
    let agent = agent.context("the agent's count for its container while it held")?;
    let tensor = held(&filled);
    let verified = filled.fields["verified"].as_bool() == Some(true);
    let exit = status.map_or_else(
        || {
            format!(
                "killed: still running {} s after its input ended",
                OTHER_EXIT.as_secs()
            )
        },
        |st| {
            format!(
                "exited ({st}) {} ms after its input ended",
                exited.as_millis()
            )
        },
    );
    let gone = gone.map_or_else(
        || {
            format!(
                "NVML still listed it {} s after its exit",
                OTHER_GONE.as_secs()
            )
        },
        |t| {
            format!(
                "NVML listed it no more {} ms after its input ended",
                t.as_millis()
            )
        },
    );
    let free = filled
        .number("cuda_free")
        .map_or_else(|| "?".to_owned(), |b| format!("{:.0} MiB", b / 1_048_576.0));
    Ok(row(
        s,
        OTHER,
        format!("NVML {} KiB, the agent {} KiB", nvml / 1024, agent / 1024),
        format!(
            "≥ {} KiB (what the suspended workload freed), the agent = NVML",
            freed / 1024
        ),
        verdict(reused(freed, tensor, nvml, agent) && verified),
    )
    .note(format!(
        "{} MiB written and read back ({}); {}; the suspended workload meanwhile: {meanwhile}; \
         CUDA's free memory as it held: {free}; {exit}; {gone}",
        tensor / MIB,
        if verified { "the same" } else { "NOT the same" },
        kib_diff(agent, nvml)
    )))
}

/// Whether the other process took at least what the suspended workload freed (its tensor and
/// NVML's bytes for it) and the agent counted NVML's bytes exactly.
#[must_use]
pub fn reused(freed: u64, tensor: u64, nvml: u64, agent: u64) -> bool {
    tensor >= freed && nvml >= freed && agent == nvml
}

/// How long after `start` NVML lists `pid` no more (read every 100 ms, for [`OTHER_GONE`] at
/// most); `None` when it still does.
fn nvml_gone(rig: &Rig, pid: u32, start: Instant) -> Option<Duration> {
    let until = Instant::now() + OTHER_GONE;
    loop {
        if let Ok(n) = rig.nvml()
            && !n.gpus.iter().any(|g| g.processes.contains_key(&pid))
        {
            return Some(start.elapsed());
        }
        if Instant::now() > until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Seconds and GiB/s each way, from the agent's own figure where its event gave one.
fn rate_row(
    s: &Section,
    suspended: &Switch,
    resumed: &Switch,
    nvml_before: Option<u64>,
    tensor: u64,
) -> Row {
    let (bytes, what) = nvml_before.map_or((tensor, "the tensor's bytes"), |b| {
        (b, "NVML's bytes for the process before")
    });
    #[expect(clippy::cast_precision_loss, reason = "bytes to GiB")]
    let gib = bytes as f64 / GIB as f64;
    #[expect(clippy::cast_precision_loss, reason = "milliseconds")]
    let secs = |sw: &Switch| {
        sw.agent_ms
            .map_or_else(|| sw.took.as_secs_f64(), |ms| ms as f64 / 1e3)
    };
    let way = |sw: &Switch| {
        let t = secs(sw);
        if t > 0.0 {
            format!("{t:.2} s ({:.2} GiB/s)", gib / t)
        } else {
            format!("{t:.2} s")
        }
    };
    let ms = |sw: &Switch| {
        sw.agent_ms
            .map_or_else(|| "?".to_owned(), |ms| format!("{ms} ms"))
    };
    row(
        s,
        RATE,
        format!("suspend {}, resume {}", way(suspended), way(resumed)),
        format!("{gib:.2} GiB ({what})"),
        Verdict::Info,
    )
    .note(format!(
        "the agent's own: lock + checkpoint + freeze {}, thaw + restore + unlock {}; from the \
         command to the event in a snapshot {:.2} s and {:.2} s; resumed: {}",
        ms(suspended),
        ms(resumed),
        suspended.took.as_secs_f64(),
        resumed.took.as_secs_f64(),
        resumed.event["reason"].as_str().unwrap_or_default()
    ))
}

/// The checksum after the resume against the one before.
fn intact(
    s: &Section,
    check: &str,
    before: &str,
    filled: &Record,
    checked: &Record,
) -> anyhow::Result<Row> {
    let after = checked.fields["checksum"]
        .as_str()
        .context("the checked record has no checksum")?;
    let reserved = |r: &Record| kib(r.fields["torch_reserved"].as_u64().ok_or("no figure"));
    Ok(row(
        s,
        check,
        format!("checksum {after}"),
        format!("before: {before}"),
        verdict(after == before),
    )
    .note(format!(
        "{} MiB of seeded int64 data; the workload stood still {:.1} s at most ({} heartbeats); \
         PyTorch reserved {} before, {} after; checksum took {:.2} s",
        held(checked) / MIB,
        checked.number("longest_gap_s").unwrap_or(f64::NAN),
        checked.number("heartbeats").unwrap_or(f64::NAN),
        reserved(filled),
        reserved(checked),
        checked.number("checksum_s").unwrap_or(f64::NAN)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_time_an_event_says_it_took() {
        assert_eq!(
            took_ms(
                "suspended (suspended through the agent's socket): 1 processes checkpointed to \
                 host memory and the cgroup frozen in 2345 ms; their GPU memory is released"
            ),
            Some(2345)
        );
        assert_eq!(
            took_ms(
                "resumed after 3 s suspended (x in y): 1 processes restored and unlocked in 812 ms"
            ),
            Some(812)
        );
        assert_eq!(took_ms("killed in 30000ms"), None);
        assert_eq!(took_ms("nothing"), None);
    }

    #[test]
    fn finds_a_sessions_events_and_a_refusal_in_the_log() {
        let snapshot = serde_json::json!({"containers": [
            {"pids": [7], "session_id": "s1", "events": [{"action": "suspend"}]},
            {"pids": [8], "session_id": "s1", "events": [{"action": "suspend"},
                                                         {"action": "suspended"}]},
            {"pids": [9], "session_id": "s2", "events": [{"action": "bound"}]},
            {"pids": [10]}
        ]});
        assert_eq!(session_of(&snapshot, 8).as_deref(), Some("s1"));
        assert_eq!(session_of(&snapshot, 10), None);
        assert_eq!(session_of(&snapshot, 11), None);
        let events = session_events(&snapshot, "s1");
        let actions: Vec<&str> = events
            .iter()
            .map(|e| e["action"].as_str().unwrap())
            .collect();
        assert_eq!(actions, ["suspend", "suspended"]);

        let log = "INFO x: suspending session=\"s1\" action=\"suspend\"\n\
                   \u{1b}[32m INFO\u{1b}[0m events: not suspended (process 7: \
                   CUDA_ERROR_NOT_SUPPORTED (801)) \u{1b}[3msession\u{1b}[0m\u{1b}[2m=\u{1b}[0m\"s1\" \
                   action=\"suspend_refused\"\n";
        let line = logged_event(log, "s1", &["suspend_refused"]).unwrap();
        assert!(line.starts_with("INFO events: not suspended"), "{line}");
        assert!(
            line.contains("(801)") && line.contains("session=\"s1\""),
            "{line}"
        );
        assert_eq!(logged_event(log, "s2", &["suspend_refused"]), None);
    }

    #[test]
    fn the_other_process_must_take_what_was_freed_and_be_counted_exactly() {
        // 4.6 GiB freed (not a whole MiB), filled rounded up, beside a 500 MiB context.
        let freed: u64 = 4_820_992 * 1024 + 512;
        let tensor = freed.div_ceil(MIB) * MIB;
        let nvml = tensor + 500 * MIB;
        assert!(reused(freed, tensor, nvml, nvml));
        assert!(!reused(freed, tensor, nvml, nvml - 4096), "the agent short");
        assert!(!reused(freed, tensor, nvml, nvml + 4096), "the agent over");
        assert!(!reused(freed, tensor - MIB, nvml, nvml), "a smaller tensor");
        assert!(
            !reused(freed, tensor, freed - 1, freed - 1),
            "NVML below what was freed"
        );
    }

    #[test]
    fn a_process_nvml_no_longer_lists_holds_nothing() {
        let nvml = Nvml {
            driver: None,
            gpus: vec![crate::gpu_check::rig::NvmlGpu {
                processes: [(7, Some(4096)), (8, None)].into(),
                ..Default::default()
            }],
        };
        assert_eq!(suspended_bytes(&nvml, 9).unwrap().0, 0);
        assert_eq!(suspended_bytes(&nvml, 7).unwrap().0, 4096);
        assert!(
            suspended_bytes(&nvml, 8).is_err(),
            "listed without a figure"
        );
        assert_eq!(events_frozen("populated 1\nfrozen 1\n"), Some(true));
        assert_eq!(events_frozen("populated 1\nfrozen 0\n"), Some(false));
        assert_eq!(events_frozen("populated 1\n"), None);
    }
}
