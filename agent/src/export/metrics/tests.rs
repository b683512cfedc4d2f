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
    for (name, unit, attributes, meaning) in INSTRUMENTS {
        let attributes = if attributes.is_empty() {
            "—"
        } else {
            attributes
        };
        let row = format!("| `{name}` | {unit} | {attributes} | {meaning} |");
        assert!(docs.contains(&row), "docs/metrics.md lacks the row\n{row}");
    }
    let section = docs
        .split("## Agent metrics")
        .nth(1)
        .and_then(|rest| rest.split("## ").next())
        .unwrap_or_default();
    let rows = section.lines().filter(|l| l.starts_with("| `")).count();
    assert_eq!(
        rows,
        INSTRUMENTS.len(),
        "docs/metrics.md lists metrics the agent lacks"
    );
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
