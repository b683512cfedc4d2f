use super::*;

#[expect(
    clippy::needless_pass_by_value,
    reason = "literals read best passed as they are built"
)]
fn pod(containers: Value) -> Value {
    json!({ "metadata": { "name": "p" }, "spec": { "containers": containers } })
}

#[test]
fn asks_are_sized_in_whole_units_and_named_for_them() {
    let ask = |s: Option<&str>, m: Option<u64>| GpuAsk {
        shares: s.map(|s| s.parse().expect("a value")),
        memory_bytes: m,
    };
    let gpu = Some(80 << 30);
    let sized = |s, m| ask(s, m).sized(gpu).expect("sized");
    assert_eq!(
        sized(Some("0.5"), Some(8 << 30)),
        ClaimAsk {
            milli: 500,
            memory_mib: 8192
        }
    );
    assert_eq!(
        sized(Some("0.5"), Some(8 << 30)).template_name(),
        "gpuwarden-500m-8gi"
    );
    assert_eq!(
        sized(Some("0.5"), Some(8 << 30)).capacity_requests(),
        json!({"milli": "500", "memory": "8Gi"})
    );
    // One of the two: the other in proportion to the GPU, rounded down.
    assert_eq!(
        sized(Some("0.25"), None).template_name(),
        "gpuwarden-250m-20gi"
    );
    assert_eq!(
        sized(None, Some(512 << 20)),
        ClaimAsk {
            milli: 6,
            memory_mib: 512
        }
    );
    // A memory ask below a thousandth of the GPU still asks one thousandth.
    assert_eq!(sized(None, Some(1 << 20)).milli, 1);
    // Bytes that are no whole MiB are rounded up, as the scheduler's 1Mi step would.
    assert_eq!(
        sized(Some("1"), Some(1000)).template_name(),
        "gpuwarden-1000m-1mi"
    );
    assert_eq!(
        sized(Some("0.5"), None).annotations(),
        vec![
            (SHARES_RESOURCE, "0.5".to_owned()),
            (MEMORY_RESOURCE, (40u64 << 30).to_string())
        ]
    );
    // Nothing to size by.
    assert_eq!(
        ask(Some("0.5"), None).sized(None),
        Err(AskError::NothingToSizeBy {
            named: "compute",
            missing: "memory"
        })
    );
    assert!(ask(Some("0.5"), Some(1 << 30)).sized(None).is_ok());
    assert!(matches!(
        ask(Some("0.0005"), Some(1 << 30)).sized(gpu),
        Err(AskError::FinerThanMilli { .. })
    ));
}

#[test]
fn limits_read_in_any_quantity_form() {
    let p = pod(json!([
        { "name": "a", "resources": { "limits": { SHARES_RESOURCE: "500m", MEMORY_RESOURCE: "8Gi" } } },
        { "name": "b", "resources": { "limits": { SHARES_RESOURCE: 0.5, MEMORY_RESOURCE: "8589934592" },
                                      "requests": { SHARES_RESOURCE: "0.5" } } },
        { "name": "c" },
    ]));
    let read = read_limits(&p, None).expect("reads").expect("asks");
    assert_eq!(read.ask.shares, Some("0.5".parse().expect("a value")));
    assert_eq!(read.ask.memory_bytes, Some(8 << 30));
    let names: Vec<&str> = read.carriers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(read.carriers[1].found.len(), 3);
}

#[test]
fn classes_come_from_the_label_then_the_owner() {
    let labelled = json!({"metadata": {"name": "x", "labels": {CLASS_LABEL: "train"}}});
    assert_eq!(workload_class(&labelled), "train");
    let deployed = json!({"metadata": {"name": "web-7d4b9-abcde",
        "labels": {"pod-template-hash": "7d4b9"},
        "ownerReferences": [{"kind": "ReplicaSet", "name": "web-7d4b9", "controller": true}]}});
    assert_eq!(workload_class(&deployed), "web");
    let stateful = json!({"metadata": {"name": "db-0",
        "ownerReferences": [{"kind": "StatefulSet", "name": "db", "controller": true}]}});
    assert_eq!(workload_class(&stateful), "db");
    assert_eq!(
        workload_class(&json!({"metadata": {"name": "solo"}})),
        "solo"
    );
}

#[test]
fn pointers_escape_slashes_and_tildes() {
    assert_eq!(
        json_pointer(&["spec", "limits", "gpuwarden.io/gpu-shares", "a~b"]),
        "/spec/limits/gpuwarden.io~1gpu-shares/a~0b"
    );
}
