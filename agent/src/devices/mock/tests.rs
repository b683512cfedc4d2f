use super::*;

#[test]
fn reads_backend_ai_style_files_with_aliases() {
    let text = r#"
        [[devices]]
        mother_uuid = "GPU-a"
        model_name = "Mock A100"
        numa_node = 1
        subproc_count = 108
        memory_size = "40G"
        is_mig_device = true

        [[devices]]
        uuid = "GPU-b"
        sm_count = 132
        memory_size = 1073741824
        device_node = "/tmp/fake/nvidia1"
    "#;
    let b = MockBackend::from_toml(text, Path::new("m.toml")).unwrap();
    let d = b.devices();
    assert_eq!(d.len(), 2);
    assert_eq!(
        (d[0].uuid.as_str(), d[0].sm_count, d[0].memory_bytes),
        ("GPU-a", 108, 40 << 30)
    );
    assert!(d[0].is_mig);
    assert_eq!(d[0].device_node, "/dev/nvidia0");
    assert_eq!(
        (d[1].model.as_str(), d[1].memory_bytes),
        ("Mock GPU", 1 << 30)
    );
    assert_eq!(d[1].device_node, "/tmp/fake/nvidia1");
    assert_eq!(b.slot_types().len(), 3);
}

#[test]
fn errors_say_what_and_where() {
    let err = MockBackend::from_toml(
        "[[devices]]\nuuid = \"x\"\nmemory_size = \"12Q\"\n",
        Path::new("m.toml"),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("m.toml") && err.contains("12Q"), "{err}");
    let err =
        MockBackend::from_toml("[[devices]]\nuuid = \"x\"\n", Path::new("m.toml")).unwrap_err();
    assert!(
        std::error::Error::source(&err)
            .unwrap()
            .to_string()
            .contains("memory_size"),
        "{err}"
    );
    assert_eq!(parse_size("1.5G"), Some(3 << 29));
    assert_eq!(parse_size("512Mi"), Some(512 << 20));
    assert_eq!(parse_size("0.3"), None);
}

#[test]
fn health_comes_from_the_file_and_is_read_again() {
    let dir = gpuwarden_test_support::scratch("mock-health");
    let path = dir.path().join("mock.toml");
    let healthy = "[[devices]]\nuuid = \"GPU-h\"\nmemory_size = \"1G\"\n";
    std::fs::write(&path, healthy).unwrap();
    let b = MockBackend::from_file(&path).unwrap();
    let h = b.health();
    assert_eq!(h.len(), 1);
    assert_eq!(h[0].state, HealthState::Ok);
    assert_eq!((h[0].power_watts, h[0].ecc_uncorrected), (None, None));
    assert!(h[0].xids.is_empty());
    let pid = std::process::id();
    std::fs::write(
        &path,
        format!(
            "{healthy}health = \"degraded\"\npower_watts = 312.5\nenergy_joules = 9000.0\nmemory_utilization = 0.25\necc_corrected = 4\necc_uncorrected = 1\nxid = [{{ code = 79, pid = {pid} }}, {{ code = 13 }}]\n"
        ),
    )
    .unwrap();
    let h = b.health();
    assert_eq!(h[0].state, HealthState::Degraded);
    assert_eq!(h[0].power_watts, Some(312.5));
    assert_eq!(h[0].energy_joules, Some(9000.0));
    assert_eq!(h[0].memory_utilization, Some(0.25));
    assert_eq!(
        (h[0].ecc_corrected, h[0].ecc_uncorrected),
        (Some(4), Some(1))
    );
    let mine = health::cgroup_of(Path::new("/proc"), pid);
    assert!(mine.is_some());
    assert_eq!(
        h[0].xids,
        [
            Xid {
                code: 79,
                cgroup: mine
            },
            Xid {
                code: 13,
                cgroup: None
            }
        ]
    );
    // A file that no longer parses keeps the last figures.
    std::fs::write(&path, "not toml [").unwrap();
    assert_eq!(b.health()[0].state, HealthState::Degraded);
}
