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
