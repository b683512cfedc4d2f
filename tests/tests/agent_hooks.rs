//! `gpuwarden-agent probe-hooks` on the real kernel: each driver hook is tried and reported,
//! loaded or refused with the kernel's reason; nothing is left attached.

use gpuwarden_test_support::require_root;

#[test]
#[ignore = "needs root"]
fn each_driver_hook_is_tried_and_reported() {
    require_root();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-under-test"))
        .args(["probe-hooks", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trials: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let trials = trials.as_array().unwrap();
    let hooks: Vec<&str> = trials.iter().map(|t| t["hook"].as_str().unwrap()).collect();
    assert_eq!(hooks, ["driver_kprobe", "driver_fentry", "vmlinux_fentry"]);
    for t in trials {
        assert!(t["loaded"].is_boolean());
        assert!(!t["detail"].as_str().unwrap().is_empty(), "{t}");
    }
    // Without the driver's BTF no fentry can aim at it.
    if !std::path::Path::new("/sys/kernel/btf/nvidia").exists() {
        assert_eq!(trials[1]["loaded"], false);
    }
}
