use super::*;

const VERSION: &str = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159  Release Build  (dvs-builder@U22-I3-AE18-09-3)  Wed Sep 10 06:49:19 UTC 2025\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n";

#[test]
fn refuses_without_a_driver_or_a_control_node_and_names_the_version_with_both() {
    let root = tempfile::tempdir().unwrap();
    let err = preflight(root.path()).unwrap_err();
    assert!(err.0.contains("proc/driver/nvidia/version"), "{err}");
    assert!(err.to_string().contains("no NVIDIA GPU here"), "{err}");
    std::fs::create_dir_all(root.path().join("proc/driver/nvidia")).unwrap();
    std::fs::write(root.path().join("proc/driver/nvidia/version"), VERSION).unwrap();
    let err = preflight(root.path()).unwrap_err();
    assert!(err.0.contains("nvidiactl"), "{err}");
    std::fs::create_dir_all(root.path().join("dev")).unwrap();
    std::fs::write(root.path().join("dev/nvidiactl"), b"").unwrap();
    assert_eq!(preflight(root.path()).unwrap(), "580.159");
    std::fs::write(root.path().join("proc/driver/nvidia/version"), "NVRM\n").unwrap();
    assert!(preflight(root.path()).is_err(), "no version in it");
}

/// On a machine without a GPU (this one, and CI), the command fails at once, saying why, before
/// it builds or starts anything. Where a driver is loaded (the lent GPU machine) the refusal
/// can't be seen, so the test checks the other side instead: this machine's driver passes the
/// preflight, with its version.
#[test]
fn the_command_refuses_where_there_is_no_gpu() {
    if Path::new("/proc/driver/nvidia/version").exists() {
        let driver = preflight(Path::new("/")).unwrap_or_else(|e| {
            panic!("a driver is loaded here, yet the preflight refuses it: {e}")
        });
        assert!(
            driver.split('.').all(|part| part.parse::<u32>().is_ok()),
            "the driver's version {driver:?}"
        );
        return;
    }
    let args = Args {
        seconds: 1.0,
        python: None,
        prebuilt: None,
        pack: None,
        dry_run: false,
        binaries: None,
        sections: vec![],
        deadline: 540,
        section_deadline: None,
        results: None,
    };
    let err = run(&args).unwrap_err();
    assert!(err.to_string().contains("no NVIDIA GPU here"), "{err:#}");
    // A kit, too, refuses before it looks at its folder.
    let kit = Args {
        prebuilt: Some(PathBuf::from("/nonexistent")),
        ..args
    };
    let err = run(&kit).unwrap_err();
    assert!(err.to_string().contains("no NVIDIA GPU here"), "{err:#}");
}

#[test]
fn parses_workload_records_and_ignores_other_output() {
    let r = parse_record(
        r#"GPUCHECK {"event": "step", "name": "tensors", "pid": 4242, "torch_reserved": 1073741824}"#,
    )
    .unwrap();
    assert_eq!(
        (r.event.as_str(), r.name.as_str(), r.pid),
        ("step", "tensors", 4242)
    );
    assert_eq!(r.number("torch_reserved"), Some(1_073_741_824.0));
    assert_eq!(r.number("absent"), None);
    let e =
        parse_record(r#"GPUCHECK {"event": "error", "reason": "libcudart not found", "pid": 1}"#)
            .unwrap();
    assert_eq!(e.name, "libcudart not found");
    assert!(parse_record("Epoch 1: loss 0.3").is_none());
    assert!(parse_record("GPUCHECK not json").is_none());
    assert!(parse_record(r#"GPUCHECK {"name": "no event"}"#).is_none());
}

#[test]
fn a_throttle_row_shows_the_error_in_points() {
    let row = share_row("one tenant at 0.3".into(), 0.3, 0.245);
    assert_eq!(row.gpuwarden, "24.5 % (-5.5 points)");
    assert_eq!(row.reference, "30 % ± 2");
    assert_eq!(row.verdict, Verdict::Fail);
    let row = share_row("two tenants 0.1 + 0.9: the 0.9".into(), 0.9, 0.912);
    assert_eq!(row.gpuwarden, "91.2 % (+1.2 points)");
    assert_eq!(row.verdict, Verdict::Pass);
}

#[test]
fn the_share_verdict_allows_two_points_either_way() {
    assert_eq!(share_verdict(0.3, 0.3), Verdict::Pass);
    assert_eq!(share_verdict(0.3, 0.319), Verdict::Pass);
    assert_eq!(share_verdict(0.3, 0.281), Verdict::Pass);
    assert_eq!(
        share_verdict(0.3, 0.245),
        Verdict::Fail,
        "the H100's first run"
    );
    assert_eq!(
        share_verdict(0.3, 0.34),
        Verdict::Fail,
        "the H200's alone rows"
    );
    assert_eq!(share_verdict(0.9, 0.925), Verdict::Fail);
}

#[test]
fn memory_rows_hold_the_agent_to_nvml_exactly_and_show_the_difference_in_kib() {
    let same = memory_row("memory", "x", 612 * MIB, 612 * MIB);
    assert_eq!(same.verdict, Verdict::Pass);
    assert_eq!(same.note, "difference +0 KiB");
    let off = memory_row("memory", "x", 612 * MIB - 4096, 612 * MIB);
    assert_eq!(off.verdict, Verdict::Fail, "4 KiB apart is not equal");
    assert_eq!(off.note, "difference -4 KiB");
    assert_eq!(off.gpuwarden, "626684 KiB");
    assert_eq!(off.reference, "NVML 626688 KiB");
}

#[test]
fn nvml_figures_that_are_missing_are_errors_that_say_why() {
    let doc = br#"{"ok": true, "driver": "580.159", "gpus": [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "total": 85520809984, "sm_clock_mhz": 1980,
         "power_mw": 312000, "throttle_reasons": 0,
         "processes": {"7": 1048576, "8": null}},
        {"index": 1, "total": null, "processes": {"7": 2048}}]}"#;
    let n = rig::Nvml::parse(doc).unwrap();
    assert_eq!(
        n.process_bytes(7).unwrap(),
        1_050_624,
        "a process on two GPUs adds up"
    );
    let e = n.process_bytes(8).unwrap_err().to_string();
    assert!(e.contains("no memory figure for pid 8"), "{e}");
    let e = n.process_bytes(9).unwrap_err().to_string();
    assert!(e.contains("lists no process 9"), "{e}");
    assert_eq!(n.gpus[1].total, None);
    assert_eq!(n.conditions(), "SM 1980 MHz, 312 W, throttle reasons 0x0");
    let e = rig::Nvml::parse(br#"{"ok": false, "error": "pynvml not importable"}"#).unwrap_err();
    assert!(e.to_string().contains("pynvml not importable"), "{e}");
    assert!(rig::Nvml::parse(b"Traceback").is_err());
}

#[test]
fn memory_sessions_are_sized_from_the_gpu_so_two_fit() {
    const GIB: u64 = 1 << 30;
    // An H100's NVML total (80 GiB nominal, a little less usable).
    let h100 = 85_520_809_984;
    assert_eq!(checks::session_gib(h100), 23);
    assert!(
        2 * checks::session_gib(h100) * GIB < h100,
        "the old 2 × 60g did not fit"
    );
    assert_eq!(checks::session_gib(16 * GIB), 4);
    assert_eq!(checks::session_gib(GIB), 1);
}

#[test]
fn the_kill_is_bounded_from_both_sides() {
    const MIB: u64 = 1 << 20;
    let (limit, alloc) = (2048 * MIB, 512 * MIB);
    assert!(checks::kill_bounded(2000 * MIB, limit, alloc));
    assert!(checks::kill_bounded(2048 * MIB, limit, alloc));
    assert!(
        !checks::kill_bounded(1500 * MIB, limit, alloc),
        "a kill one allocation early"
    );
    assert!(
        !checks::kill_bounded(2100 * MIB, limit, alloc),
        "a kill that came late"
    );
}

#[test]
fn median_and_spread() {
    assert_eq!(
        checks::median_spread(&[1.2, 1.0, 1.1]),
        Some((1.1, 1.0, 1.2))
    );
    assert_eq!(checks::median_spread(&[1.0, 2.0]), Some((1.5, 1.0, 2.0)));
    assert_eq!(checks::median_spread(&[]), None);
}

#[test]
fn finds_the_cgroup2_mount_and_says_whether_dmem_is_there() {
    let mounts =
        "cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n";
    assert_eq!(
        checks::cgroup2_root(mounts),
        Some(PathBuf::from("/sys/fs/cgroup/unified"))
    );
    assert_eq!(checks::cgroup2_root("proc /proc proc rw 0 0\n"), None);
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("cgroup.controllers"), "hugetlb\n").unwrap();
    let e = checks::dmem_available(root.path()).unwrap_err().to_string();
    assert!(e.contains("no dmem controller"), "{e}");
    std::fs::write(root.path().join("cgroup.controllers"), "cpu dmem memory\n").unwrap();
    std::fs::write(
        root.path().join("dmem.capacity"),
        "drm/0000:01:00.0/vram0 8589934592\n",
    )
    .unwrap();
    let e = checks::dmem_available(root.path()).unwrap_err().to_string();
    assert!(e.contains("no nvidia/"), "{e}");
    std::fs::write(
        root.path().join("dmem.capacity"),
        "nvidia/0000:01:00.0/vidmem 85520809984\n",
    )
    .unwrap();
    assert_eq!(
        checks::dmem_available(root.path()).unwrap(),
        vec!["nvidia/0000:01:00.0/vidmem 85520809984".to_owned()]
    );
}

/// The old code sent `kill(0, SIGKILL)` when a workload ended before printing its pid: the
/// whole process group. Now such a signal is refused and never sent.
#[test]
fn signals_go_only_to_positive_pids_of_our_own() {
    for pid in [0, -1, -4242, 1, i64::from(std::process::id())] {
        let e = procs::signal(pid, 0, "test").unwrap_err().to_string();
        assert!(e.contains("refused"), "{pid}: {e}");
    }
    assert!(procs::refused().iter().any(|r| r.contains("pid 0 ")));
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = i64::from(child.id());
    procs::signal(pid, libc::SIGKILL, "test").unwrap();
    assert!(!child.wait().unwrap().success());
}

#[test]
fn renders_one_aligned_table_with_a_summary() {
    let rows = vec![
        Row::new(
            "memory",
            "PyTorch: context",
            "626688 KiB",
            "NVML 626688 KiB",
            Verdict::Pass,
        )
        .note("difference +0 KiB"),
        Row::new(
            "throttle",
            "one tenant at 0.3",
            "24.5 %",
            "30 % ± 5",
            Verdict::Fail,
        ),
        Row::new(
            "hooks",
            "driver_kprobe on nvidia_unlocked_ioctl",
            "refused",
            "no kprobes",
            Verdict::Info,
        ),
    ];
    let table = render("gpuwarden gpu-check — driver 580.159", &rows);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines[0], "gpuwarden gpu-check — driver 580.159");
    let body: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with('|'))
        .collect();
    assert_eq!(body.len(), 2 + rows.len(), "header, rule, one line per row");
    let width = body[0].chars().count();
    assert!(body.iter().all(|l| l.chars().count() == width), "{table}");
    assert!(body[3].contains("| FAIL"), "{table}");
    assert!(
        table.ends_with("1 passed, 1 failed, 1 measured only\n"),
        "{table}"
    );
}

#[test]
fn reads_a_containers_video_and_managed_bytes_from_the_snapshot() {
    let snapshot = serde_json::json!({
        "containers": [
            {"pids": [1], "devices": [{"device": "nvidia0", "memory_bytes": 5}], "managed_memory_bytes": 0},
            {"pids": [7, 8], "devices": [
                {"device": "nvidia0", "memory_bytes": 100},
                {"device": "nvidia1", "memory_bytes": 20},
                {"device": "unknown", "memory_bytes": 3},
                {"device": "nvidiactl", "memory_bytes": 0},
                {"device": "nvidia-uvm", "memory_bytes": 0}
            ], "managed_memory_bytes": 1024}
        ]
    });
    assert_eq!(container_bytes(&snapshot, 8), Some((123, 1024)));
    assert_eq!(container_bytes(&snapshot, 1), Some((5, 0)));
    assert_eq!(container_bytes(&snapshot, 9), None);
}

#[test]
fn one_hook_row_per_trial() {
    let trials = serde_json::json!([
        {"hook": "driver_kprobe", "target": "nvidia_unlocked_ioctl", "loaded": false, "detail": "no kprobes"},
        {"hook": "vmlinux_fentry", "target": "do_sys_openat2", "loaded": true, "detail": "loaded and attached"}
    ]);
    let rows = hook_rows(&trials);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].gpuwarden, "refused");
    assert_eq!(rows[1].check, "vmlinux_fentry on do_sys_openat2");
    assert_eq!(rows[1].gpuwarden, "loads");
    assert!(hook_rows(&serde_json::json!({"not": "a list"})).is_empty());
}

#[test]
fn picks_the_first_python_with_pytorch() {
    let candidates = [PathBuf::from("/venv/bin/python"), PathBuf::from("python3")];
    assert_eq!(
        choose_python(&candidates, |p| p == Path::new("python3")),
        Some(PathBuf::from("python3"))
    );
    assert_eq!(
        choose_python(&candidates, |_| true),
        Some(candidates[0].clone())
    );
    assert_eq!(choose_python(&candidates, |_| false), None);
}

#[test]
fn counts_the_report_events_of_one_process() {
    let snapshot = serde_json::json!({
        "containers": [
            {"events": [
                {"action": "report", "pid": 7},
                {"action": "report", "pid": 7},
                {"action": "kill", "pid": 7},
                {"action": "report", "pid": 8}
            ]},
            {"events": []},
            {}
        ]
    });
    assert_eq!(report_events(&snapshot, 7), 2);
    assert_eq!(report_events(&snapshot, 9), 0);
}

/// The workload loads the libcudart its process already maps (PyTorch's cu13 wheel puts it
/// under `nvidia/cu13/lib`), never a bare soname that could bring in a second runtime.
#[test]
fn the_workload_takes_libcudart_from_its_own_maps() {
    let maps = "7f00-7f01 r-xp 00000000 08:01 42 /usr/lib/libc.so.6\n\
                7f10-7f20 r-xp 00000000 08:01 43 /venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13\n";
    let code = format!(
        "import sys; sys.path.insert(0, {:?}); import workload; \
         print(workload.mapped_cudart({maps:?})); print(workload.mapped_cudart('x'))",
        scripts().display().to_string()
    );
    let out = Command::new("python3")
        .args(["-c", &code])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13\nNone\n"
    );
}

/// `nvml.py` through a stand-in `pynvml` module: bytes as NVML gives them, a process on the GPU
/// twice added up, NVML's "not available" kept as no figure, and the document gpu-check reads.
#[test]
fn the_nvml_helper_reports_pynvmls_bytes_and_no_figure_as_none() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("pynvml.py"),
        r#"
from types import SimpleNamespace as S
NVML_CLOCK_SM = 1
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlSystemGetDriverVersion(): return b"580.159"
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetName(h): return "NVIDIA H100 80GB HBM3"
def nvmlDeviceGetUUID(h): return "GPU-1"
def nvmlDeviceGetMemoryInfo(h): return S(total=85520809984, used=1 << 30, free=0)
def nvmlDeviceGetClockInfo(h, c): return 1980 if c == NVML_CLOCK_SM else 0
def nvmlDeviceGetPowerUsage(h): raise RuntimeError("not supported")
def nvmlDeviceGetCurrentClocksEventReasons(h): return 4
def nvmlDeviceGetComputeRunningProcesses(h):
    return [S(pid=7, usedGpuMemory=1048576), S(pid=7, usedGpuMemory=4096),
            S(pid=8, usedGpuMemory=None), S(pid=9, usedGpuMemory=(1 << 64) - 1)]
"#,
    )
    .unwrap();
    let n = nvml_py_with(dir.path());
    assert_eq!(n.driver.as_deref(), Some("580.159"));
    assert_eq!(n.gpus[0].total, Some(85_520_809_984));
    assert_eq!(n.process_bytes(7).unwrap(), 1_052_672);
    assert!(n.process_bytes(8).is_err(), "None is no figure");
    assert!(
        n.process_bytes(9).is_err(),
        "NVML_VALUE_NOT_AVAILABLE is no figure"
    );
    assert_eq!(n.conditions(), "SM 1980 MHz, ? W, throttle reasons 0x4");
}

/// Without pynvml, `nvml.py` makes the same calls through ctypes on `libnvidia-ml.so.1`: here a
/// stand-in library compiled from C with NVML's signatures and `nvmlProcessInfo_t` layout.
#[test]
fn the_nvml_helper_falls_back_to_the_driver_library_without_pynvml() {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("nvml.c");
    std::fs::write(
        &c,
        r#"
#include <string.h>
typedef struct { unsigned long long total, free, used; } Mem;
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } Proc;
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlSystemGetDriverVersion(char *b, unsigned n) { strncpy(b, "580.159", n); return 0; }
int nvmlDeviceGetCount_v2(unsigned *c) { *c = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **h) { *h = (void *)0x10; return 0; }
int nvmlDeviceGetName(void *h, char *b, unsigned n) { strncpy(b, "NVIDIA H100", n); return 0; }
int nvmlDeviceGetUUID(void *h, char *b, unsigned n) { strncpy(b, "GPU-1", n); return 0; }
int nvmlDeviceGetMemoryInfo(void *h, Mem *m) { m->total = 85520809984ULL; m->free = 0; m->used = 1; return 0; }
int nvmlDeviceGetClockInfo(void *h, int c, unsigned *v) { *v = c == 1 ? 1980 : 0; return 0; }
int nvmlDeviceGetPowerUsage(void *h, unsigned *v) { *v = 312000; return 0; }
int nvmlDeviceGetCurrentClocksThrottleReasons(void *h, unsigned long long *v) { *v = 4; return 0; }
int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned *n, Proc *p) {
    if (*n < 2) return 7;
    p[0] = (Proc){7, 1048576, 0, 0};
    p[1] = (Proc){8, ~0ULL, 0, 0};
    *n = 2;
    return 0;
}
"#,
    )
    .unwrap();
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.path().join("libnvidia-ml.so.1"))
        .arg(&c)
        .status()
        .unwrap();
    assert!(built.success());
    // A pynvml that is not there, wherever the real one is installed.
    std::fs::write(
        dir.path().join("pynvml.py"),
        "raise ImportError('hidden')\n",
    )
    .unwrap();
    let out = Command::new("python3")
        .arg(scripts().join("nvml.py"))
        .env("PYTHONPATH", dir.path())
        .env("LD_LIBRARY_PATH", dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let n = rig::Nvml::parse(&out.stdout).unwrap();
    assert_eq!(n.driver.as_deref(), Some("580.159"));
    assert_eq!(n.gpus[0].name.as_deref(), Some("NVIDIA H100"));
    assert_eq!(n.gpus[0].total, Some(85_520_809_984));
    assert_eq!(n.process_bytes(7).unwrap(), 1_048_576);
    assert!(
        n.process_bytes(8).is_err(),
        "NVML_VALUE_NOT_AVAILABLE is no figure"
    );
    assert_eq!(n.conditions(), "SM 1980 MHz, 312 W, throttle reasons 0x4");
}

#[test]
fn the_plan_runs_the_longest_section_last_and_sections_can_be_picked() {
    let names: Vec<String> = checks::plan().into_iter().map(|(s, _)| s).collect();
    assert_eq!(
        names,
        [
            "setup", "memory", "limit", "hooks", "cost", "suspend", "throttle"
        ]
    );
    let mut args = Args {
        seconds: 10.0,
        python: None,
        prebuilt: None,
        pack: None,
        dry_run: true,
        binaries: None,
        sections: vec![],
        deadline: 540,
        section_deadline: None,
        results: None,
    };
    assert!(names.iter().all(|n| selected(&args, n)));
    args.sections = vec!["throttle".into()];
    assert!(selected(&args, "setup"), "setup always runs");
    assert!(selected(&args, "throttle"));
    assert!(!selected(&args, "memory"));
    assert_eq!(deadline(&args, "throttle"), Duration::from_secs(250));
    args.section_deadline = Some(5);
    assert_eq!(deadline(&args, "memory"), Duration::from_secs(5));
}

#[test]
fn the_mig_placements_row_skips_without_nvml_only_in_a_dry_run() {
    let no_nvml = serde_json::json!({"ok": false, "error": "NVML: libnvidia-ml.so.1: not found"});
    let (said, v, note) = checks::mig_placements_verdict(&no_nvml, true);
    assert_eq!((said.as_str(), v), ("skipped: no GPU", Verdict::Info));
    assert!(note.contains("libnvidia-ml"));
    assert_eq!(
        checks::mig_placements_verdict(&no_nvml, false).1,
        Verdict::Fail
    );
    let gpu = |mig: bool, model: Option<&str>, profiles: &[&str], disagreements: &[&str]| {
        serde_json::json!({"ok": true, "gpus": [{
            "uuid": "GPU-1", "name": "NVIDIA H200", "mig_enabled": mig, "model": model,
            "profiles": profiles, "disagreements": disagreements, "error": null}]})
    };
    // MIG disabled (the lent machines): the driver lists nothing, which is no failure.
    let (said, v, _) = checks::mig_placements_verdict(&gpu(false, Some("H200"), &[], &[]), false);
    assert_eq!(v, Verdict::Info, "{said}");
    assert_eq!(
        checks::mig_placements_verdict(&gpu(true, Some("H200"), &[], &[]), false).1,
        Verdict::Fail
    );
    let one = ["1g.18gb id 19 x7 {0}:1 {1}:1"];
    assert_eq!(
        checks::mig_placements_verdict(&gpu(true, Some("H200"), &one, &[]), false).1,
        Verdict::Pass
    );
    let (said, v, note) = checks::mig_placements_verdict(
        &gpu(true, Some("H200"), &one, &["profile 9 is 3g.72gb"]),
        false,
    );
    assert_eq!((said.as_str(), v), ("1 disagreements", Verdict::Fail));
    assert!(note.contains("3g.72gb"));
    assert_eq!(
        checks::mig_placements_verdict(&gpu(true, None, &one, &[]), false).1,
        Verdict::Info
    );
}

/// `nvml.py` on a GPU in MIG mode, through a stand-in `pynvml`: each instance's memory is read
/// on its own MIG handle, each signal the agent uses is asked there and its answer kept (NVML's
/// error by name), an empty slot is skipped; the row fails on an instance that gives no memory
/// (the agent's cross-check reads it), passes when each does, and says nothing more with MIG off.
#[test]
fn the_mig_instances_row_reads_each_instance_on_its_own_handle() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("pynvml.py"),
        r#"
from types import SimpleNamespace as S
class NVMLError_NotSupported(Exception): pass
NVML_CLOCK_SM = 1
NVML_GPU_UTILIZATION_SAMPLES = 1
def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlSystemGetDriverVersion(): return b"580.159"
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i): return "gpu"
def nvmlDeviceGetName(h): return {"gpu": "NVIDIA H200", "m0": "NVIDIA H200 MIG 1g.18gb", "m2": "NVIDIA H200 MIG 3g.71gb"}[h]
def nvmlDeviceGetUUID(h): return {"gpu": "GPU-1", "m0": "MIG-a", "m2": "MIG-b"}[h]
def nvmlDeviceGetMemoryInfo(h):
    if h == "m2": raise NVMLError_NotSupported("Not Supported")
    return S(total={"gpu": 150 << 30, "m0": 16 << 30}[h], used={"gpu": 1 << 30, "m0": 3 << 20}[h], free=0)
def nvmlDeviceGetComputeRunningProcesses(h): return []
def nvmlDeviceGetClockInfo(h, c): return 1980
def nvmlDeviceGetPowerUsage(h): return 100000
def nvmlDeviceGetUtilizationRates(h):
    if h != "gpu": raise NVMLError_NotSupported("Not Supported")
    return S(gpu=0, memory=0)
def nvmlDeviceGetSamples(h, kind, since):
    if h != "gpu": raise NVMLError_NotSupported("Not Supported")
    return (0, [])
def nvmlDeviceGetProcessUtilization(h, since):
    if h != "gpu": raise NVMLError_NotSupported("Not Supported")
    return []
def nvmlDeviceGetMigMode(h): return (1, 1)
def nvmlDeviceGetMaxMigDeviceCount(h): return 3
def nvmlDeviceGetMigDeviceHandleByIndex(h, i):
    if i == 1: raise RuntimeError("empty slot")
    return f"m{i}"
"#,
    )
    .unwrap();
    let n = nvml_py_with(dir.path());
    let g = &n.gpus[0];
    assert_eq!(g.mig_mode, Some((1, 1)));
    let uuids: Vec<_> = g.mig_instances.iter().map(|i| i.uuid.as_deref()).collect();
    assert_eq!(
        uuids,
        [Some("MIG-a"), Some("MIG-b")],
        "the empty slot skipped"
    );
    let first = &g.mig_instances[0];
    assert_eq!(
        (first.memory_total, first.memory_used),
        (Some(16 << 30), Some(3 << 20)),
        "the instance's own memory, not its GPU's"
    );
    assert_eq!(first.signals["memory_info"], "ok");
    assert_eq!(first.signals["running_processes"], "ok");
    assert_eq!(
        first.signals["utilization_rates"],
        "NVMLError_NotSupported: Not Supported"
    );
    assert!(first.signals["samples"].starts_with("NVMLError_NotSupported"));

    let (said, verdict, note) = checks::mig_instances_verdict(g);
    assert_eq!(verdict, Verdict::Fail, "{said}");
    assert!(said.contains("NVIDIA H200 MIG 3g.71gb"), "{said}");
    assert!(
        note.contains("NVIDIA H200 MIG 1g.18gb: 3 of 16384 MiB used"),
        "{note}"
    );
    assert!(
        note.contains("utilization_rates (NVMLError_NotSupported"),
        "{note}"
    );

    let mut readable = g.clone();
    readable.mig_instances[1]
        .signals
        .insert("memory_info".to_owned(), "ok".to_owned());
    let (said, verdict, _) = checks::mig_instances_verdict(&readable);
    assert_eq!(verdict, Verdict::Pass, "{said}");
    readable.mig_mode = Some((0, 0));
    assert_eq!(checks::mig_instances_verdict(&readable).1, Verdict::Info);
}

/// `nvml.py`'s document with the stand-in `pynvml` module in `dir`.
fn nvml_py_with(dir: &Path) -> rig::Nvml {
    let out = Command::new("python3")
        .arg(scripts().join("nvml.py"))
        .env("PYTHONPATH", dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    rig::Nvml::parse(&out.stdout).unwrap()
}
