use super::*;

const POD: &str = "6b1e3f0c-2d4a-4c5b-9e8f-0a1b2c3d4e5f";
const UID: &str = "0f9e8d7c-6b5a-4948-8372-615243342516";

fn gpus() -> Vec<GpuDevice> {
    (0..3)
        .map(|index| GpuDevice {
            mig: None,
            uuid: format!("GPU-{index}"),
            model: "Mock".into(),
            memory_bytes: 16 << 30,
            numa_node: 0,
            sm_count: 0,
            is_mig: false,
            index,
            device_node: format!("/dev/nvidia{index}"),
        })
        .collect()
}

/// A claim as the API server returns it (`resource.k8s.io/v1`), allocated on `pool`.
#[expect(
    clippy::needless_pass_by_value,
    reason = "Literals read best passed as they are built"
)]
fn claim(
    pool: &str,
    device: &str,
    consumed: serde_json::Value,
    config: serde_json::Value,
) -> ResourceClaim {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "half", "namespace": "ml", "uid": UID},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpuwarden.io"}}]}},
        "status": {
            "allocation": {"devices": {
                "results": [{"request": "gpu", "driver": DRIVER_NAME, "pool": pool, "device": device,
                             "consumedCapacity": consumed, "shareID": "4a1b2c3d-0000-4000-8000-000000000001"}],
                "config": config,
            }},
            "reservedFor": [{"resource": "pods", "name": "train-0", "uid": POD}],
        },
    }))
    .unwrap()
}

#[test]
fn a_claim_becomes_the_quota_a_controller_allocation_makes() {
    let all = gpus();
    let offered = &all[..2];
    let c = claim(
        "node-a",
        "gpu-1",
        serde_json::json!({"shares": "500m", "memory": "256Mi"}),
        serde_json::json!([
            {"source": "FromClass", "opaque": {"driver": DRIVER_NAME, "parameters": {"memoryPolicy": "report"}}},
            {"source": "FromClaim", "opaque": {"driver": DRIVER_NAME, "parameters":
                {"apiVersion": "gpu.gpuwarden.io/v1alpha1", "kind": "GpuConfig", "memoryPolicy": "stop"}}},
            {"source": "FromClaim", "opaque": {"driver": "other.example.com", "parameters": {"memoryPolicy": "x"}}},
        ]),
    );
    let p = plan(&c, UID, "node-a", offered, &all, QuotaPolicy::default()).unwrap();
    assert_eq!(p.pod_uid, POD);
    let spec = QuotaSpec::from_allocate(&p.allocate, offered)
        .unwrap()
        .unwrap();
    assert_eq!(spec.session_id, format!("k8s-{UID}"));
    assert_eq!(spec.target, Target::PodUid(POD.into()));
    assert_eq!(spec.devices.len(), 1);
    assert_eq!(
        (
            spec.devices[0].index,
            spec.devices[0].shares_ppm,
            spec.devices[0].memory_bytes
        ),
        (1, 500_000, 256 << 20)
    );
    // The claim's own config wins over the class's; other drivers' configs are not read.
    assert_eq!(spec.memory_policy.as_str(), "stop");
    // A claim's pod is bound as Kubernetes authorized it.
    assert!(spec.scope.admin);
    assert_eq!(spec.compute_policy.as_str(), "hard");
    assert_eq!(
        p.devices,
        vec![PlannedDevice {
            request: "gpu".into(),
            pool: "node-a".into(),
            device: "gpu-1".into(),
            share_id: Some("4a1b2c3d-0000-4000-8000-000000000001".into()),
        }]
    );
}

#[test]
fn shares_alone_limit_memory_to_that_fraction_and_nothing_consumed_is_the_whole_device() {
    let all = gpus();
    let c = claim(
        "n",
        "gpu-0",
        serde_json::json!({"shares": "250m"}),
        serde_json::json!([]),
    );
    let p = plan(&c, UID, "n", &all, &all, QuotaPolicy::default()).unwrap();
    let spec = QuotaSpec::from_allocate(&p.allocate, &all)
        .unwrap()
        .unwrap();
    assert_eq!(spec.devices[0].memory_bytes, 4 << 30);
    let c = claim("n", "gpu-0", serde_json::Value::Null, serde_json::json!([]));
    let p = plan(&c, UID, "n", &all, &all, QuotaPolicy::default()).unwrap();
    let spec = QuotaSpec::from_allocate(&p.allocate, &all)
        .unwrap()
        .unwrap();
    assert_eq!(
        (spec.devices[0].shares_ppm, spec.devices[0].memory_bytes),
        (PPM, 16 << 30)
    );
}

#[test]
fn milli_is_read_in_thousandths_and_an_older_shares_result_still_reads() {
    let all = gpus();
    let enforced = |consumed: serde_json::Value| {
        let c = claim("n", "gpu-0", consumed, serde_json::json!([]));
        plan(&c, UID, "n", &all, &all, QuotaPolicy::default()).map(|p| {
            let spec = QuotaSpec::from_allocate(&p.allocate, &all)
                .unwrap()
                .unwrap();
            (spec.devices[0].shares_ppm, spec.devices[0].memory_bytes)
        })
    };
    assert_eq!(
        enforced(serde_json::json!({"milli": "250", "memory": "4Gi"})),
        Ok((250_000, 4 << 30))
    );
    assert_eq!(
        enforced(serde_json::json!({"milli": "1000", "memory": "16Gi"})),
        Ok((PPM, 16 << 30))
    );
    // Allocated on the slice published before `milli`.
    assert_eq!(
        enforced(serde_json::json!({"shares": "500m", "memory": "1Gi"})),
        Ok((500_000, 1 << 30))
    );
    for (bad, why) in [
        (serde_json::json!({"milli": "1001"}), "more than the 1000"),
        (serde_json::json!({"milli": "2500m"}), "consumed milli"),
        (serde_json::json!({"milli": "-1"}), "consumed milli"),
    ] {
        let e = enforced(bad).unwrap_err().to_string();
        assert!(e.contains(why), "{e}");
    }
}

#[test]
#[expect(clippy::too_many_lines, reason = "one table of refusals")]
fn claims_this_node_cannot_serve_are_refused_with_the_reason() {
    let all = gpus();
    let offered = &all[..2];
    let none = serde_json::json!([]);
    let half = serde_json::json!({"shares": "500m"});
    let cases = [
        (
            claim("n", "gpu-0", half.clone(), none.clone()),
            "other-uid",
            "n",
            "has UID 0f9e8d7c-6b5a-4948-8372-615243342516, not other-uid",
        ),
        (
            claim("other", "gpu-0", half.clone(), none.clone()),
            UID,
            "n",
            "in pool n",
        ),
        (
            claim("n", "gpu-7", half.clone(), none.clone()),
            UID,
            "n",
            "gpu-7: this node has no such GPU",
        ),
        (
            claim("n", "gpu-2", half.clone(), none.clone()),
            UID,
            "n",
            "offered to the gpuwarden controller",
        ),
        (
            claim(
                "n",
                "gpu-0",
                serde_json::json!({"shares": "1n"}),
                none.clone(),
            ),
            UID,
            "n",
            "finer than 0.000001",
        ),
        (
            claim(
                "n",
                "gpu-0",
                half.clone(),
                serde_json::json!([{"source": "FromClaim",
                "opaque": {"driver": DRIVER_NAME, "parameters": {"memoryPolicy": "freeze"}}}]),
            ),
            UID,
            "n",
            "freeze",
        ),
        // A tenant can't weaken its limit to a report unless its class allows it, and a claim
        // can't allow itself.
        (
            claim(
                "n",
                "gpu-0",
                half.clone(),
                serde_json::json!([{"source": "FromClaim",
                "opaque": {"driver": DRIVER_NAME, "parameters":
                    {"memoryPolicy": "report", "allowedMemoryPolicies": ["report"]}}}]),
            ),
            UID,
            "n",
            "picks memory policy report, which its DeviceClass does not allow (allowed: kill, stop",
        ),
        (
            claim(
                "n",
                "gpu-0",
                half.clone(),
                serde_json::json!([
                    {"source": "FromClass", "opaque": {"driver": DRIVER_NAME, "parameters":
                        {"allowedMemoryPolicies": ["kill"]}}},
                    {"source": "FromClaim", "opaque": {"driver": DRIVER_NAME, "parameters":
                        {"memoryPolicy": "stop"}}}]),
            ),
            UID,
            "n",
            "(allowed: kill;",
        ),
    ];
    for (c, uid, pool, words) in cases {
        let err = plan(&c, uid, pool, offered, &all, QuotaPolicy::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains(words), "{err:?} lacks {words:?}");
    }
    let mut unallocated = claim("n", "gpu-0", half.clone(), none.clone());
    unallocated.status.as_mut().unwrap().allocation = None;
    let err = plan(
        &unallocated,
        UID,
        "n",
        offered,
        &all,
        QuotaPolicy::default(),
    )
    .unwrap_err();
    assert_eq!(err, ClaimError::NotAllocated("ml/half".into()));
    let mut unreserved = claim("n", "gpu-0", half, none);
    unreserved.status.as_mut().unwrap().reserved_for.clear();
    let err = plan(&unreserved, UID, "n", offered, &all, QuotaPolicy::default()).unwrap_err();
    assert_eq!(err, ClaimError::NoPod("ml/half".into()));
}

#[test]
fn shares_travel_as_exact_decimals() {
    assert_eq!(decimal(500_000), "0.5");
    assert_eq!(decimal(1_000_000), "1");
    assert_eq!(decimal(1), "0.000001");
    assert_eq!(decimal(250_000), "0.25");
}

#[test]
fn a_class_may_allow_report_and_then_a_claim_may_pick_it() {
    let all = gpus();
    let c = claim(
        "n",
        "gpu-0",
        serde_json::json!({"shares": "500m"}),
        serde_json::json!([
            {"source": "FromClass", "opaque": {"driver": DRIVER_NAME, "parameters":
                {"allowedMemoryPolicies": ["kill", "stop", "report"]}}},
            {"source": "FromClaim", "opaque": {"driver": DRIVER_NAME, "parameters":
                {"memoryPolicy": "report"}}},
        ]),
    );
    let p = plan(&c, UID, "n", &all, &all, QuotaPolicy::default()).unwrap();
    let spec = QuotaSpec::from_allocate(&p.allocate, &all)
        .unwrap()
        .unwrap();
    assert_eq!(spec.memory_policy.as_str(), "report");
}

#[test]
fn admin_access_gets_the_device_without_a_quota_and_is_not_mixed_with_ordinary_access() {
    let all = gpus();
    let result = |device: &str, admin: bool| {
        serde_json::json!({"request": "gpu", "driver": DRIVER_NAME, "pool": "n", "device": device,
                           "adminAccess": admin})
    };
    let with_results = |results: serde_json::Value| -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "admin", "namespace": "ml", "uid": UID},
            "status": {
                "allocation": {"devices": {"results": results}},
                "reservedFor": [{"resource": "pods", "name": "monitor-0", "uid": POD}],
            },
        }))
        .unwrap()
    };
    let p = plan(
        &with_results(serde_json::json!([
            result("gpu-0", true),
            result("gpu-1", true)
        ])),
        UID,
        "n",
        &all,
        &all,
        QuotaPolicy::default(),
    )
    .unwrap();
    assert!(p.allocate.devices.is_empty(), "nothing to enforce");
    let devices: Vec<&str> = p.devices.iter().map(|d| d.device.as_str()).collect();
    assert_eq!(
        devices,
        ["gpu-0", "gpu-1"],
        "the devices still go to the pod"
    );
    let e = plan(
        &with_results(serde_json::json!([
            result("gpu-0", true),
            result("gpu-1", false)
        ])),
        UID,
        "n",
        &all,
        &all,
        QuotaPolicy::default(),
    )
    .unwrap_err();
    assert_eq!(e, ClaimError::MixedAdminAccess("ml/admin".into()));
}

#[test]
fn a_result_without_share_id_is_a_gpu_held_whole() {
    let all = gpus();
    let shared = claim(
        "n",
        "gpu-0",
        serde_json::json!({"milli": "500", "memory": "8Gi"}),
        serde_json::json!([]),
    );
    let p = plan(&shared, UID, "n", &all, &all, QuotaPolicy::default()).unwrap();
    assert!(!p.held_whole());
    // As kube-scheduler allocates with DRAConsumableCapacity off: no consumedCapacity, no
    // shareID.
    let mut whole = claim("n", "gpu-0", serde_json::Value::Null, serde_json::json!([]));
    whole
        .status
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .results[0]
        .share_id = None;
    let p = plan(&whole, UID, "n", &all, &all, QuotaPolicy::default()).unwrap();
    assert!(p.held_whole());
}

#[test]
fn a_partition_device_is_planned_apart_from_the_nodes_devices() {
    // A device of the node's partition pool (`<node>/mig`) is an instance to make: it is not
    // looked up among the node's GPUs nor put in the quota (its index is known once made).
    let all = gpus();
    let none = serde_json::json!([]);
    let c = claim(
        "n/mig",
        "gpu-1-3g-71gb-at-4",
        serde_json::json!({}),
        none.clone(),
    );
    let p = plan(&c, UID, "n", &all, &all, QuotaPolicy::default()).unwrap();
    assert!(p.devices.is_empty() && p.allocate.devices.is_empty());
    assert_eq!(
        p.partitions,
        [PlannedDevice {
            request: "gpu".into(),
            pool: "n/mig".into(),
            device: "gpu-1-3g-71gb-at-4".into(),
            share_id: Some("4a1b2c3d-0000-4000-8000-000000000001".into()),
        }]
    );
    assert_eq!(p.pod_uid, POD);
    // Another node's partition pool is not this node's.
    let other = claim("m/mig", "gpu-1-3g-71gb-at-4", serde_json::json!({}), none);
    let err = plan(&other, UID, "n", &all, &all, QuotaPolicy::default()).unwrap_err();
    assert!(matches!(err, ClaimError::NotThisNode { .. }), "{err}");
    // Administrative access to a partition: refused, naming it.
    let mut admin = claim_json_admin();
    admin["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = true.into();
    let admin: ResourceClaim = serde_json::from_value(admin).unwrap();
    let err = plan(&admin, UID, "n", &all, &all, QuotaPolicy::default()).unwrap_err();
    assert_eq!(
        err,
        ClaimError::PartitionAdminAccess("gpu-1-3g-71gb-at-4".into())
    );
}

/// A partition claim as JSON, to edit.
fn claim_json_admin() -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "half", "namespace": "ml", "uid": UID},
        "status": {
            "allocation": {"devices": {
                "results": [{"request": "gpu", "driver": DRIVER_NAME, "pool": "n/mig",
                             "device": "gpu-1-3g-71gb-at-4"}],
            }},
            "reservedFor": [{"resource": "pods", "name": "train-0", "uid": POD}],
        },
    })
}
