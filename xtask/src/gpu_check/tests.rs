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

/// On a machine without a GPU (this one), the command fails at once, saying why, before it
/// builds or starts anything.
#[test]
fn the_command_refuses_where_there_is_no_gpu() {
    if Path::new("/proc/driver/nvidia/version").exists() {
        eprintln!("a GPU driver is loaded here; the refusal can't be seen");
        return;
    }
    let args = Args {
        seconds: 1.0,
        python: None,
        prebuilt: None,
        pack: None,
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
fn parses_nvml_per_process_memory() {
    let csv = "4242, 612\n4243, 1124\n4242, 2\nnot a line\n";
    let m = parse_compute_apps(csv);
    assert_eq!(
        m.get(&4242),
        Some(&(614 * MIB)),
        "a process on two GPUs adds up"
    );
    assert_eq!(m.get(&4243), Some(&(1124 * MIB)));
    assert_eq!(m.len(), 2);
    assert!(parse_compute_apps("").is_empty());
}

#[test]
fn a_throttle_row_shows_the_error_in_points() {
    let row = share_row("one tenant at 0.3".into(), 0.3, 0.245);
    assert_eq!(row.gpuwarden, "24.5 % (-5.5 points)");
    assert_eq!(row.reference, "30 % ± 5");
    assert_eq!(row.verdict, Verdict::Fail);
    let row = share_row("two tenants 0.1 + 0.9: the 0.9".into(), 0.9, 0.912);
    assert_eq!(row.gpuwarden, "91.2 % (+1.2 points)");
    assert_eq!(row.verdict, Verdict::Pass);
}

#[test]
fn the_share_verdict_allows_five_points_either_way() {
    assert_eq!(share_verdict(0.3, 0.3), Verdict::Pass);
    assert_eq!(share_verdict(0.3, 0.349), Verdict::Pass);
    assert_eq!(share_verdict(0.3, 0.251), Verdict::Pass);
    assert_eq!(
        share_verdict(0.3, 0.245),
        Verdict::Fail,
        "the H100's first run"
    );
    assert_eq!(share_verdict(0.9, 0.96), Verdict::Fail);
}

#[test]
fn memory_rows_hold_the_agent_to_nvml_exactly() {
    assert_eq!(
        memory_row("x", 612 * MIB, Some(612 * MIB)).verdict,
        Verdict::Pass
    );
    assert_eq!(
        memory_row("x", 610 * MIB, Some(612 * MIB)).verdict,
        Verdict::Fail
    );
    let none = memory_row("x", 612 * MIB, None);
    assert_eq!(none.verdict, Verdict::Info);
    assert_eq!(none.gpuwarden, "612.0 MiB");
}

#[test]
fn renders_one_aligned_table_with_a_summary() {
    let rows = vec![
        Row::new(
            "memory",
            "PyTorch: context",
            "612.0 MiB",
            "NVML 612.0 MiB",
            Verdict::Pass,
        ),
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
