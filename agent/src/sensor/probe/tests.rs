use super::*;

/// A `/sys` holding `dirs`, removed on drop.
fn fake_sys(name: &str, dirs: &[&str]) -> tempfile::TempDir {
    let root = gpuwarden_test_support::scratch(&format!("probe-{name}"));
    for d in dirs {
        std::fs::create_dir_all(root.path().join(d)).unwrap();
    }
    root
}

#[test]
fn chooses_tracepoints_and_explains_the_driver_tiers() {
    let sys = fake_sys("tp", &["kernel/tracing/events/syscalls/sys_enter_ioctl"]);
    let probe = probe(sys.path());
    assert_eq!(probe.chosen, Some(Tier::SyscallTracepoint));
    let fentry = &probe.candidates[0];
    assert_eq!(fentry.tier, Tier::DriverFentry);
    assert!(!fentry.available);
    assert!(fentry.reason.contains("not present"), "{}", fentry.reason);
    assert!(probe.candidates[1].reason.contains("kprobe_events"));
}

#[test]
fn reports_driver_btf_when_present() {
    let sys = fake_sys(
        "btf",
        &[
            "kernel/btf/nvidia",
            "kernel/debug/tracing/events/syscalls/sys_enter_ioctl",
        ],
    );
    let probe = probe(sys.path());
    assert!(probe.candidates[0].available);
    assert!(
        probe.candidates[0]
            .reason
            .contains("no driver-hook programs")
    );
    assert_eq!(probe.chosen, Some(Tier::SyscallTracepoint));
}

#[test]
fn no_tier_without_syscall_tracepoints() {
    let sys = fake_sys("none", &["kernel"]);
    assert_eq!(probe(sys.path()).chosen, None);
}
