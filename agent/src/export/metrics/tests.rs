use super::*;

#[test]
fn gpu_names_give_their_index() {
    assert_eq!(gpu_index("nvidia3"), Some(3));
    assert_eq!(gpu_index("nvidiactl"), None);
    assert_eq!(gpu_index("nvidia-uvm"), None);
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
