use super::*;

#[test]
fn classifies_nvidia_node_names() {
    let cases = [
        ("/dev/nvidia0", Some((0, node_kind::RM))),
        ("/dev/nvidia7", Some((7, node_kind::RM))),
        ("/dev/nvidia247", Some((247, node_kind::RM))),
        ("/dev/nvidia248", None),
        ("/dev/nvidiactl", Some((DEVICE_CTL, node_kind::RM))),
        ("/dev/nvidia-modeset", Some((DEVICE_MODESET, node_kind::RM))),
        ("/dev/nvidia-uvm", Some((DEVICE_UVM, node_kind::UVM))),
        (
            "/dev/nvidia-uvm-tools",
            Some((DEVICE_UVM_TOOLS, node_kind::UVM)),
        ),
        ("/tmp/fake/nvidia1", Some((1, node_kind::RM))),
        ("/dev/nvidia", None),
        ("/dev/nvidia0a", None),
        ("/dev/nvidia-caps", None),
        ("/dev/null", None),
    ];
    for (path, expected) in cases {
        let got = classify(Path::new(path)).map(|n| (n.device, n.kind));
        assert_eq!(got, expected, "{path}");
    }
}

#[test]
fn names_round_trip_through_classify() {
    for device in [
        0,
        3,
        247,
        DEVICE_CTL,
        DEVICE_MODESET,
        DEVICE_UVM,
        DEVICE_UVM_TOOLS,
    ] {
        let path = PathBuf::from("/dev").join(node_name(device));
        assert_eq!(classify(&path).map(|n| n.device), Some(device), "{device}");
    }
    assert_eq!(node_name(DEVICE_UNKNOWN), "unknown");
}

#[test]
fn rejects_relative_and_malformed_globs() {
    assert!(matches!(
        GpuNodeGlobs::new(&["dev/nvidia0"]),
        Err(GpuNodeError::Relative { .. })
    ));
    let err = GpuNodeGlobs::new(&["/dev/nvidia[0-9"]).unwrap_err();
    assert!(err.to_string().contains("/dev/nvidia[0-9"), "{err}");
    assert_eq!(
        GpuNodeGlobs::new::<&str>(&[]).unwrap().as_slice(),
        DEFAULT_GLOBS
    );
}

#[test]
fn expands_existing_paths_and_skips_foreign_names() {
    let scratch = gpuwarden_test_support::scratch("gpu-nodes");
    let dir = scratch.path();
    for name in [
        "nvidia0",
        "nvidia1",
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-caps",
    ] {
        std::fs::write(dir.join(name), b"").unwrap();
    }
    let globs = GpuNodeGlobs::new(&[format!("{}/nvidia*", dir.display())]).unwrap();
    let expansion = globs.expand();
    let devices: Vec<u32> = expansion.nodes.values().map(|n| n.device).collect();
    assert!(devices.contains(&0) && devices.contains(&1), "{devices:?}");
    assert!(devices.contains(&DEVICE_CTL) && devices.contains(&DEVICE_UVM));
    assert_eq!(expansion.skipped.len(), 1, "{:?}", expansion.skipped);
}

#[test]
fn mig_instances_are_named_after_their_parent_and_gpu_instance() {
    let device = |index, gpu_instance: Option<u32>| crate::devices::GpuDevice {
        uuid: format!("GPU-{index}"),
        model: "M".into(),
        memory_bytes: 1,
        numa_node: 0,
        sm_count: 0,
        is_mig: gpu_instance.is_some(),
        index,
        device_node: "/dev/nvidia1".into(),
        mig: gpu_instance.map(|gi| crate::devices::mig::MigInstance {
            parent_index: 1,
            parent_uuid: "GPU-1".into(),
            gpu_instance: gi,
            compute_instance: 0,
            profile: "1g.18gb".into(),
            gi_cap_minor: None,
            ci_cap_minor: None,
        }),
    };
    let devices = [device(1, None), device(15, Some(9)), device(16, Some(10))];
    let names = DeviceNames::new(&devices);
    assert_eq!(names.name(1), "nvidia1");
    assert_eq!(names.name(15), "nvidia1/gi9");
    assert_eq!(names.name(16), "nvidia1/gi10");
    // Ids the list lacks, and every id without a list, are named by their node.
    assert_eq!(names.name(2), "nvidia2");
    assert_eq!(names.name(DEVICE_UVM), "nvidia-uvm");
    assert_eq!(DeviceNames::default().name(15), "nvidia15");
    let one_by_one: Vec<_> = devices.iter().map(gpu_name).collect();
    assert_eq!(one_by_one, ["nvidia1", "nvidia1/gi9", "nvidia1/gi10"]);
}
