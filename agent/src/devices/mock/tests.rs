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

#[test]
fn a_gpu_in_mig_mode_is_offered_as_its_instances() {
    let dir = gpuwarden_test_support::scratch("mock-mig");
    std::fs::write(
        dir.path().join("mig-minors"),
        "config 1\nmonitor 2\ngpu1/gi9/access 84\ngpu1/gi9/ci0/access 85\n\
         gpu1/gi10/access 93\ngpu1/gi10/ci0/access 94\n",
    )
    .unwrap();
    let path = dir.path().join("mock.toml");
    std::fs::write(
        &path,
        r#"
        mig_minors = "mig-minors"

        [[devices]]
        uuid = "GPU-whole"
        model_name = "Mock H200"
        memory_size = "141G"
        sm_count = 132

        [[devices]]
        uuid = "GPU-parent"
        model_name = "Mock H200"
        memory_size = "141G"
        sm_count = 132
        health = "degraded"
        [[devices.instances]]
        uuid = "MIG-a"
        profile = "1g.18gb"
        gpu_instance = 9
        memory_size = "16G"
        sm_count = 16
        [[devices.instances]]
        uuid = "MIG-b"
        profile = "3g.71gb"
        gpu_instance = 10
        compute_instance = 0
        memory_size = "70G"
        sm_count = 60
        "#,
    )
    .unwrap();
    let b = MockBackend::from_file(&path).unwrap();
    let d = b.devices();
    let summary: Vec<(&str, u32, u32, bool)> = d
        .iter()
        .map(|d| (d.uuid.as_str(), d.index, d.node_minor(), d.is_mig))
        .collect();
    // The parent (index 1) is not offered; its instances take 2 and 3 and open nvidia1.
    assert_eq!(
        summary,
        [
            ("GPU-whole", 0, 0, false),
            ("MIG-a", 2, 1, true),
            ("MIG-b", 3, 1, true)
        ]
    );
    let a = d[1].mig.as_ref().unwrap();
    assert_eq!(
        (a.parent_uuid.as_str(), a.gpu_instance, a.compute_instance),
        ("GPU-parent", 9, 0)
    );
    assert_eq!((a.gi_cap_minor, a.ci_cap_minor), (Some(84), Some(85)));
    assert_eq!(d[2].mig.as_ref().unwrap().ci_cap_minor, Some(94));
    assert_eq!((d[1].memory_bytes, d[1].sm_count), (16 << 30, 16));
    assert_eq!(d[1].model, "Mock H200 MIG 1g.18gb");
    assert_eq!(d[2].device_node, "/dev/nvidia1");
    // Instances share their parent's health.
    let h: Vec<(u32, HealthState)> = b.health().iter().map(|h| (h.index, h.state)).collect();
    assert_eq!(
        h,
        [
            (0, HealthState::Ok),
            (2, HealthState::Degraded),
            (3, HealthState::Degraded)
        ]
    );
}

#[test]
fn malformed_instances_say_which() {
    let base = "[[devices]]\nuuid = \"GPU-p\"\nmemory_size = \"80G\"\n[[devices.instances]]\nuuid = \"MIG-x\"\ngpu_instance = 1\n";
    let err = MockBackend::from_toml(
        &format!("{base}profile = \"big\"\nmemory_size = \"10G\"\n"),
        Path::new("m.toml"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("MIG instance 0") && err.contains("\"big\""),
        "{err}"
    );
    let err = MockBackend::from_toml(
        &format!("{base}profile = \"1g.10gb\"\nmemory_size = \"81G\"\n"),
        Path::new("m.toml"),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("exceed"), "{err}");
    // No minors file: the instance is still a device, its capability minors unknown.
    let b = MockBackend::from_toml(
        &format!("{base}profile = \"1g.10gb\"\nmemory_size = \"10G\"\n"),
        Path::new("m.toml"),
    )
    .unwrap();
    let m = b.devices()[0].mig.clone().unwrap();
    assert_eq!((m.gi_cap_minor, m.ci_cap_minor), (None, None));
}

#[test]
fn the_shipped_files_parse() {
    let old = MockBackend::from_toml(
        include_str!("../../../../deploy/mock-devices.toml"),
        Path::new("mock-devices.toml"),
    )
    .unwrap();
    assert_eq!(old.devices().len(), 2);
    assert!(old.devices().iter().all(|d| d.mig.is_none()));
    let mig = MockBackend::from_toml(
        include_str!("../../../../deploy/mock-devices-mig.toml"),
        Path::new("mock-devices-mig.toml"),
    )
    .unwrap();
    let devices = mig.devices();
    let profiles: Vec<Option<&str>> = devices
        .iter()
        .map(|d| d.mig.as_ref().map(|m| m.profile.as_str()))
        .collect();
    assert_eq!(
        profiles,
        [
            None,
            Some("1g.18gb"),
            Some("1g.18gb"),
            Some("2g.35gb"),
            Some("3g.71gb")
        ]
    );
}

#[test]
fn an_instance_made_later_finds_its_capability_minors_in_the_file() {
    let dir = gpuwarden_test_support::scratch("mock-mig-made");
    // The file lists GPU instances 1-3 of GPU 0 (as the driver lists every one a GPU could
    // hold), each with compute instance 0: minors 100 + 10·gi and 101 + 10·gi.
    let minors: String = std::iter::once("config 1\nmonitor 2\n".to_owned())
        .chain((1..=3).map(|gi| {
            format!(
                "gpu0/gi{gi}/access {}\ngpu0/gi{gi}/ci0/access {}\n",
                100 + 10 * gi,
                101 + 10 * gi
            )
        }))
        .collect();
    std::fs::write(dir.path().join("mig-minors"), minors).unwrap();
    let path = dir.path().join("mock.toml");
    std::fs::write(
        &path,
        r#"
        mig_minors = "mig-minors"

        [[devices]]
        uuid = "GPU-parent"
        model_name = "Mock H200"
        memory_size = "141G"
        mig_enabled = true
        "#,
    )
    .unwrap();
    let b = MockBackend::from_file(&path).unwrap();
    let made = b.create_instance("GPU-parent", "1g.18gb", 6).unwrap();
    let m = made.mig.as_ref().unwrap();
    assert!((1..=3).contains(&m.gpu_instance), "{m:?}");
    assert_eq!(m.compute_instance, 0);
    assert_eq!(
        (m.gi_cap_minor, m.ci_cap_minor),
        (
            Some(100 + 10 * m.gpu_instance),
            Some(101 + 10 * m.gpu_instance)
        )
    );
    // The device list holds it so (what the quotas' device access reads).
    let listed = b
        .devices()
        .into_iter()
        .find(|d| d.uuid == made.uuid)
        .unwrap();
    assert_eq!(listed.mig, made.mig);
}
