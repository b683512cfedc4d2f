//! `cargo xtask gpu-check --dry-run` end to end: the real sequencing, deadlines, cleanup and
//! table, with `dry.py` standing in for the binaries, the GPU and NVML. Faults are injected
//! through `GPUCHECK_DRY_FAULTS`: a workload that hangs, one that exits before its first record,
//! one that exits when asked for its checksum after a resume, another process that exits before
//! its record while a workload is suspended, a driver that refuses to suspend, a driver that
//! refuses a restore with GPU pairs.
//!
//! xtask runs in a process group of its own, so a `kill(0, …)` it sent would kill itself and
//! show as a signal in its exit status. Every process it started carries a marker in its
//! environment; none may be left once it has exited.

use std::{
    os::unix::process::{CommandExt as _, ExitStatusExt as _},
    path::Path,
    process::{Command, Output},
    time::{Duration, Instant},
};

/// The setup section's rows (run before every section).
const SETUP: usize = 8;
/// The suspend section's rows.
const SUSPEND: usize = 12;
/// The rows a run plans: setup, 9 memory, 4 limit, 1 hooks, 3 cost, suspend, 16 throttle.
const PLANNED: usize = SETUP + 9 + 4 + 1 + 3 + SUSPEND + 16;
/// The suspend section's row for another process taking the freed memory meanwhile.
const OTHER: &str = "suspend: another process allocates meanwhile";
/// The suspend section's rows for a restore with the GPU paired to itself.
const PAIR_VERSION: &str = "GPU pair: the driver's CUDA version (driver-version)";
const PAIR_RESTORED: &str = "GPU pair: restored onto its own GPU (--gpu-pair), NVML";
const PAIR_INTACT: &str = "GPU pair: data intact";
const PAIR_ACCOUNTING: &str = "GPU pair: agent's accounting";

fn dry_run(marker: &str, results: &Path, faults: &str, extra: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.args(["gpu-check", "--dry-run", "--seconds", "0.3", "--results"])
        .arg(results)
        .args(extra)
        .env("GPUCHECK_DRY_FAULTS", faults)
        .env("GPUCHECK_TEST_MARKER", marker)
        .process_group(0);
    cmd.output().expect("xtask runs")
}

/// The table's rows: (section, check, verdict, notes).
fn table(out: &Output) -> Vec<(String, String, String, String)> {
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| section "))
        .map(|l| {
            let c: Vec<String> = l
                .split(" | ")
                .map(|c| c.trim_matches(['|', ' ']).to_owned())
                .collect();
            (c[0].clone(), c[1].clone(), c[4].clone(), c[5].clone())
        })
        .collect()
}

fn row<'a>(
    rows: &'a [(String, String, String, String)],
    check: &str,
) -> &'a (String, String, String, String) {
    rows.iter()
        .find(|r| r.1 == check)
        .unwrap_or_else(|| panic!("no row {check:?} in {rows:#?}"))
}

/// Processes whose environment holds `marker`.
fn leftovers(marker: &str) -> Vec<String> {
    let needle = format!("GPUCHECK_TEST_MARKER={marker}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found: Vec<String> = std::fs::read_dir("/proc")
            .expect("/proc lists")
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.parse::<u32>().is_ok())
            })
            .filter(|e| {
                std::fs::read(e.path().join("environ"))
                    .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == needle.as_bytes()))
            })
            .map(|e| {
                let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                String::from_utf8_lossy(&cmd).replace('\0', " ")
            })
            .collect();
        if found.is_empty() || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// No process of the run is left (the processes are looked for once, for up to 20 s).
fn assert_nothing_left(marker: &str) {
    let left = leftovers(marker);
    assert!(left.is_empty(), "left running: {left:?}");
}

/// The setup and suspend sections run with the stand-ins' `faults`: the run fails, every row
/// of those two sections is printed, and none of the others; its rows and its marker.
fn suspend_section_failing(
    name: &str,
    faults: &str,
) -> (Vec<(String, String, String, String)>, String) {
    let results = tempfile::tempdir().expect("a scratch directory");
    let marker = marker(name);
    let out = dry_run(&marker, results.path(), faults, &["--sections", "suspend"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "failed checks: {stderr}");
    let rows = table(&out);
    assert_eq!(
        rows.len(),
        SETUP + SUSPEND,
        "setup and suspend only: {rows:#?}"
    );
    (rows, marker)
}

fn marker(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

#[test]
#[ignore = "needs root (the late workload's cgroup)"]
fn a_hang_and_an_early_exit_each_cost_their_rows_only_and_nothing_is_left_running() {
    let results = tempfile::tempdir().unwrap();
    let marker = marker("faults");
    let out = dry_run(
        &marker,
        results.path(),
        "hang:steps.tensors,exit:grow-report.grow,exit:suspend.checked,exit:fill.fill",
        &["--section-deadline", "25"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), None, "xtask was killed: {stderr}");
    assert_eq!(out.status.code(), Some(1), "failed checks: {stderr}");
    let rows = table(&out);
    assert_eq!(
        rows.len(),
        PLANNED + 1,
        "every planned row and one hook trial: {rows:#?}"
    );

    // The hang: the row before it passed; the hung one and the rest of its section say so.
    assert_eq!(row(&rows, "PyTorch: context").2, "pass");
    let hung = row(&rows, "PyTorch: tensors");
    assert_eq!(hung.2, "FAIL");
    assert!(
        hung.3
            .contains("deadline of 25 s hit while waiting for the steps workload's tensors"),
        "{hung:?}"
    );
    assert!(
        row(&rows, "agent started after the workload: bytes since")
            .3
            .contains("deadline")
    );

    // The early exit: its row says so, without a kill of pid 0; its neighbours passed.
    let early = row(&rows, "report past 2 GiB");
    assert_eq!(early.2, "FAIL");
    assert!(
        early
            .3
            .contains("ended before an allocation past the limit"),
        "{early:?}"
    );
    assert_eq!(row(&rows, "kill at 2 GiB").2, "pass");
    assert_eq!(row(&rows, "stop at 2 GiB").2, "pass");
    assert!(!stderr.contains("pid 0"), "{stderr}");

    // The run went on after both.
    assert_eq!(row(&rows, "one tenant at 0.5").2, "pass");
    assert_eq!(
        row(&rows, "agent counters rose during the runs with it").2,
        "pass"
    );
    assert_eq!(row(&rows, "probe-hooks ran").2, "pass");

    // The other process exits before its record while the workload is suspended: its row says
    // so, and the resume still comes. The suspend workload exits when asked for its checksum
    // after the resume: the rows up to the resume passed, the two after it say why they have no
    // figure.
    for check in [
        "suspend: agent suspended the session",
        "suspend: NVML while suspended",
        "suspend: process frozen",
    ] {
        assert_eq!(row(&rows, check).2, "pass", "{check}: {rows:#?}");
    }
    let other = row(&rows, OTHER);
    assert_eq!(other.2, "FAIL", "{other:?}");
    assert!(
        other.3.contains("other ended before its filled tensor"),
        "{other:?}"
    );
    assert_eq!(row(&rows, "resume: time and rate").2, "info");
    for check in [
        "resume: data intact",
        "resume: agent's accounting",
        PAIR_VERSION,
        PAIR_RESTORED,
        PAIR_INTACT,
        PAIR_ACCOUNTING,
    ] {
        let r = row(&rows, check);
        assert_eq!(r.2, "FAIL", "{r:?}");
        assert!(
            r.3.contains("ended before its checksum after the resume"),
            "{r:?}"
        );
    }

    // Each row was appended to the results file as it was made, and logs were kept.
    let folder = std::fs::read_dir(results.path())
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let written = std::fs::read_to_string(folder.join("results.txt")).unwrap();
    assert!(
        written.contains("FAIL | memory | PyTorch: tensors |"),
        "{written}"
    );
    assert!(folder.join("controller.log").is_file());
    assert!(folder.join("memory-steps.log").is_file());
    assert_nothing_left(&marker);
}

#[test]
#[ignore = "needs root (the late workload's cgroup)"]
fn without_faults_every_row_is_made_and_passes() {
    let results = tempfile::tempdir().unwrap();
    let marker = marker("clean");
    let out = dry_run(&marker, results.path(), "", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let rows = table(&out);
    assert_eq!(rows.len(), PLANNED + 1, "{rows:#?}");
    assert!(rows.iter().all(|r| r.2 != "FAIL"), "{rows:#?}");
    // The other process filled what the suspended workload freed (its 500 MiB context and
    // 4096 MiB tensor), counted exactly, and NVML let it go after its exit.
    let other = row(&rows, OTHER);
    assert_eq!(other.2, "pass", "{other:?}");
    assert!(
        other
            .3
            .contains("4596 MiB written and read back (the same)"),
        "{other:?}"
    );
    assert!(other.3.contains("difference +0 KiB"), "{other:?}");
    assert!(other.3.contains("NVML lists no process"), "{other:?}");
    assert!(other.3.contains("NVML listed it no more"), "{other:?}");
    // The helper checkpointed the workload and restored it with its GPU paired to itself: its
    // bytes left NVML and came back, its data and the agent's count with them.
    for check in [PAIR_VERSION, PAIR_RESTORED, PAIR_INTACT, PAIR_ACCOUNTING] {
        assert_eq!(row(&rows, check).2, "pass", "{check}: {rows:#?}");
    }
    let paired = row(&rows, PAIR_RESTORED);
    assert!(
        paired
            .3
            .contains("--gpu-pair GPU-d7d7d7d7-0000-4000-8000-000000000038=GPU-d7d7d7d7"),
        "{paired:?}"
    );
    assert!(paired.1.contains("--gpu-pair"), "{paired:?}");
    assert_nothing_left(&marker);
}

/// The driver refuses the checkpoint: the agent ends the workload the kill way, its events leave
/// the snapshot with it, and every suspend row says so with the driver's code, found in the
/// agent's log where the snapshot no longer has it.
#[test]
#[ignore = "needs root (the late workload's cgroup)"]
fn a_refused_suspension_fails_its_rows_with_the_drivers_code() {
    let (rows, marker) = suspend_section_failing("refused", "refuse:suspend");
    assert_eq!(
        row(
            &rows,
            "driver's checkpoint state, without the agent (get-state)"
        )
        .2,
        "info"
    );
    for check in [
        "suspend: agent suspended the session",
        "suspend: NVML while suspended",
        "suspend: process frozen",
        OTHER,
        "resume: time and rate",
        "resume: data intact",
        "resume: agent's accounting",
        PAIR_VERSION,
        PAIR_RESTORED,
        PAIR_INTACT,
        PAIR_ACCOUNTING,
    ] {
        let r = row(&rows, check);
        assert_eq!(r.2, "FAIL", "{r:?}");
        assert!(
            r.3.contains("suspend_refused") && r.3.contains("CUDA_ERROR_NOT_SUPPORTED (801)"),
            "{r:?}"
        );
    }
    assert_nothing_left(&marker);
}

/// The driver refuses the restore with the GPU paired to itself: that row fails with the
/// driver's function and code, the workload is brought back by a plain restore so it can end,
/// and the two rows after it say they were not reached for that reason; the agent's own
/// suspension and resumption before it still pass.
#[test]
#[ignore = "needs root (the late workload's cgroup)"]
fn a_driver_refusing_the_gpu_pair_fails_its_row_saying_so() {
    let (rows, marker) = suspend_section_failing("pairs", "refuse:pairs");
    for check in [
        "suspend: agent suspended the session",
        "resume: data intact",
        "resume: agent's accounting",
        PAIR_VERSION,
    ] {
        assert_eq!(row(&rows, check).2, "pass", "{check}: {rows:#?}");
    }
    let refused = row(&rows, PAIR_RESTORED);
    assert_eq!(refused.2, "FAIL", "{refused:?}");
    assert!(
        refused
            .3
            .contains("the driver refused the restore with --gpu-pair")
            && refused.3.contains("cuCheckpointProcessRestore")
            && refused.3.contains("\"code\":1"),
        "{refused:?}"
    );
    assert!(
        refused
            .3
            .contains("plain restore and unlock brought it back"),
        "{refused:?}"
    );
    for check in [PAIR_INTACT, PAIR_ACCOUNTING] {
        let r = row(&rows, check);
        assert_eq!(r.2, "FAIL", "{r:?}");
        assert!(r.3.contains("not restored with the GPU pair"), "{r:?}");
    }
    assert_nothing_left(&marker);
}

#[test]
#[ignore = "needs root (the late workload's cgroup)"]
fn the_whole_run_deadline_prints_every_row_and_kills_every_child() {
    let results = tempfile::tempdir().unwrap();
    let marker = marker("deadline");
    let out = dry_run(
        &marker,
        results.path(),
        "hang:steps.tensors",
        &["--deadline", "8"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let rows = table(&out);
    assert_eq!(rows.len(), PLANNED, "{rows:#?}");
    let unreached = row(&rows, "probe-hooks ran");
    assert_eq!(unreached.2, "FAIL");
    assert!(
        unreached.3.contains("whole run's deadline of 8 s"),
        "{unreached:?}"
    );
    assert_nothing_left(&marker);
}

/// Where `cargo test` put the workspace's binaries (this test runs from `target/debug/deps`).
fn built_binaries() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/debug")
        .to_owned();
    for b in [
        "gpuwarden",
        "gpuwarden-agent",
        "gpuwarden-controller",
        "fake-nvidia",
        "gpu-client",
    ] {
        assert!(
            dir.join(b).is_file(),
            "{} is missing: `cargo test` of the workspace builds it, or `cargo build -p \
             gpuwarden-agent -p gpuwarden-controller -p gpuwarden-cli -p gpuwarden-tests --bins`",
            dir.join(b).display()
        );
    }
    dir
}

/// With the real controller, agent and CLI, and the tests' fake driver under the stand-in
/// workloads, the agent's own eBPF accounting and enforcement answer the memory and limit
/// rows: the rehearsal closest to the GPU run this machine allows.
#[test]
#[ignore = "needs root (eBPF, FUSE, cgroups)"]
fn the_real_agent_on_the_fake_driver_passes_the_memory_limit_and_cost_rows() {
    let bin = built_binaries();
    let results = tempfile::tempdir().unwrap();
    let marker = marker("real");
    let out = dry_run(
        &marker,
        results.path(),
        "",
        &[
            "--binaries",
            bin.to_str().unwrap(),
            "--sections",
            "memory,limit,hooks,cost",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "mock GPUs are not NVML's: {stderr}"
    );
    let rows = table(&out);
    // Mock devices are caught: the agent's GPUs do not come from NVML.
    assert_eq!(row(&rows, "agent's GPUs come from NVML").2, "FAIL");
    for check in [
        "agent answers",
        "hook tier and memory tier",
        "PyTorch: context",
        "PyTorch: tensors",
        "PyTorch: empty_cache",
        "cudaMallocManaged 1 GiB, touched on the GPU",
        "PyTorch: managed_freed",
        "a second process on the same GPU",
        "agent started after the workload: bytes since",
        "late workload in a cgroup of its own",
        "kill at 2 GiB",
        "stop at 2 GiB",
        "report past 2 GiB",
        "probe-hooks ran",
        "agent counters rose during the runs with it",
    ] {
        assert_eq!(row(&rows, check).2, "pass", "{check}: {rows:#?}\n{stderr}");
    }
    assert!(rows.iter().all(|r| r.0 != "throttle"), "not picked");
    assert_nothing_left(&marker);
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains("gpu-check"),
        "the fake driver stayed mounted: {mounts}"
    );
}
