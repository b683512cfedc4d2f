use super::*;

#[test]
fn gpu_names_give_their_index_and_an_instance_its_attributes() {
    let gpu = |index, mig: Option<crate::devices::mig::MigInstance>| GpuDevice {
        uuid: format!("GPU-{index}"),
        model: "M".into(),
        memory_bytes: 1,
        numa_node: 0,
        sm_count: 0,
        is_mig: mig.is_some(),
        index,
        device_node: "/dev/nvidia1".into(),
        mig,
    };
    let instance = gpu(
        15,
        Some(crate::devices::mig::MigInstance {
            parent_index: 1,
            parent_uuid: "GPU-parent".into(),
            gpu_instance: 9,
            compute_instance: 0,
            profile: "1g.18gb".into(),
            gi_cap_minor: None,
            ci_cap_minor: None,
        }),
    );
    let gpus = [Gpu::new(gpu(3, None), None), Gpu::new(instance, None)];
    assert_eq!(gpu_index(&gpus, "nvidia3"), Some(3));
    assert_eq!(gpu_index(&gpus, "nvidia1/gi9"), Some(15));
    assert_eq!(gpu_index(&gpus, "nvidia15"), None);
    assert_eq!(gpu_index(&gpus, "nvidiactl"), None);
    assert_eq!(gpu_index(&gpus, "nvidia-uvm"), None);
    // A node the device list lacks (no NVML, no mock list) still counts by its number.
    assert_eq!(gpu_index(&gpus, "nvidia40"), Some(40));
    let attrs = &gpus[1].attributes;
    let value = |key: &str| {
        attrs
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    };
    assert_eq!(
        value("gpuwarden.gpu.mig.profile").as_deref(),
        Some("1g.18gb")
    );
    assert_eq!(value("hw.parent").as_deref(), Some("GPU-parent"));
    assert_eq!(Gpu::new(gpu(3, None), None).attributes.len(), 5);
}

#[test]
fn the_docs_list_every_instrument() {
    let docs = include_str!("../../../../docs/metrics.md");
    let problems = gpuwarden_runtime::instrument::undocumented(
        docs,
        "## Agent metrics",
        "## ",
        instruments::ALL,
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// What `register` builds is the table, each once: a metric built but not declared (and so not
/// documented) fails here.
#[test]
fn every_instrument_is_registered_once_and_only_those() {
    let meter = opentelemetry::global::meter("test");
    let mut registry = Registry::new(&meter);
    register(&mut registry, Vec::new(), &Published::default());
    let mut registered = registry.registered().to_vec();
    // The pipeline builds this one.
    registered.push(gpuwarden_runtime::otlp::EXPORTS_FAILED.name);
    let problems = gpuwarden_runtime::instrument::unregistered(&registered, instruments::ALL);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn no_endpoint_means_off() {
    let config = MetricsConfig {
        endpoint: None,
        ..MetricsConfig::default()
    };
    let published: Published = Arc::default();
    assert!(start(&config, vec![], &published).unwrap().is_none());
}
