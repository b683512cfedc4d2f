//! The slice the agent publishes and the claims the webhook writes, run through kube-scheduler's
//! consumable-capacity arithmetic (the oracle in `k8s_capacity/allocator.rs`, transcribed from
//! `k8s.io/dynamic-resource-allocation` v0.35.6), and the allocation that comes out prepared by
//! the agent's claim reader: what the scheduler charges is what the agent enforces.
//!
//! The old slice shape (`shares` of `1` in steps of `1u`, as published up to 02c9181) is kept as
//! a fixture: the oracle charges its `0.5` as `1`, so a GPU took one claim whatever it asked.

#[path = "k8s_capacity/allocator.rs"]
mod allocator;
#[path = "agent_dra/schema.rs"]
mod schema;

use allocator::{Allocated, Pool};
use gpuwarden_agent::{
    devices::GpuDevice,
    dra::{claim, slice},
};
use gpuwarden_controller::kubernetes::pod::{ClaimAsk, GpuAsk};
use gpuwarden_types::{policy::QuotaPolicy, slot::SlotValue};
use schema::Schema;
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
const POD: &str = "6b1e3f0c-2d4a-4c5b-9e8f-0a1b2c3d4e5f";
const CLAIM: &str = "0f9e8d7c-6b5a-4948-8372-615243342516";

fn gpu(memory_bytes: u64) -> GpuDevice {
    GpuDevice {
        mig: None,
        uuid: "GPU-0".into(),
        model: "Mock H100".into(),
        memory_bytes,
        numa_node: 0,
        sm_count: 0,
        is_mig: false,
        index: 0,
        device_node: "/dev/nvidia0".into(),
    }
}

/// What a pod asks (`gpu-milli`, `gpu-memory`), as the webhook sizes it for GPUs of
/// `device_memory` bytes.
fn webhook(milli: Option<u64>, memory: Option<u64>, device_memory: u64) -> ClaimAsk {
    GpuAsk {
        shares: milli.map(|m| SlotValue::from_micros(u128::from(m) * 1000)),
        memory_bytes: memory,
    }
    .sized(Some(device_memory))
    .expect("sized")
}

/// The capacity requests of the claim the webhook's template makes.
fn requests(ask: &ClaimAsk) -> Value {
    ask.template("ml")
        .pointer("/spec/spec/devices/requests/0/exactly/capacity/requests")
        .expect("requests")
        .clone()
}

/// The quota (share in ppm, memory bytes) the agent enforces for `allocated` on `gpu`.
fn enforced(allocated: &Allocated, gpu: &GpuDevice) -> (String, u64) {
    let c: claim::ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "c", "namespace": "ml", "uid": CLAIM},
        "status": {
            "allocation": {"devices": {"results": [{
                "request": "gpu", "driver": "gpu.gpuwarden.io", "pool": "node-a",
                "device": allocated.device, "consumedCapacity": allocated.consumed_capacity(),
                "shareID": "4a1b2c3d-0000-4000-8000-000000000001",
            }]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": POD}],
        },
    }))
    .expect("a claim");
    let gpus = std::slice::from_ref(gpu);
    let plan = claim::plan(&c, CLAIM, "node-a", gpus, gpus, QuotaPolicy::default()).expect("plans");
    let d = &plan.allocate.devices[0];
    (d.shares.clone(), d.memory_bytes)
}

#[test]
fn two_halves_share_one_gpu_and_the_agent_enforces_what_was_charged() {
    let g = gpu(80 * GIB);
    let mut pool = Pool::new(&[slice::device(&g, None)], true);
    let half = webhook(Some(500), Some(8 * GIB), 80 * GIB);
    assert_eq!(requests(&half), json!({"milli": "500", "memory": "8Gi"}));
    let first = pool
        .allocate(Some(&requests(&half)))
        .expect("the first half fits");
    let second = pool
        .allocate(Some(&requests(&half)))
        .expect("the second half fits");
    assert_eq!(
        first.consumed_capacity(),
        json!({"milli": "500", "memory": "8Gi"})
    );
    assert_eq!(second.device, "gpu-0");
    assert!(
        pool.allocate(Some(&json!({"milli": "1", "memory": "1Mi"})))
            .is_none(),
        "no compute left"
    );
    assert_eq!(enforced(&first, &g), ("0.5".to_owned(), 8 * GIB));
}

#[test]
fn a_compute_only_ask_leaves_room_for_others() {
    let g = gpu(80 * GIB);
    let mut pool = Pool::new(&[slice::device(&g, None)], true);
    // `gpu-milli: 250` alone: the webhook names a quarter of the (smallest) GPU's memory too.
    let quarter = webhook(Some(250), None, 80 * GIB);
    assert_eq!(
        requests(&quarter),
        json!({"milli": "250", "memory": "20Gi"})
    );
    let a = pool.allocate(Some(&requests(&quarter))).expect("fits");
    assert_eq!(enforced(&a, &g), ("0.25".to_owned(), 20 * GIB));
    // Memory only: compute in proportion.
    let mem = webhook(None, Some(40 * GIB), 80 * GIB);
    assert_eq!(requests(&mem), json!({"milli": "500", "memory": "40Gi"}));
    pool.allocate(Some(&requests(&mem)))
        .expect("fits beside it");
    pool.allocate(Some(&requests(&quarter)))
        .expect("and another quarter");
    assert!(
        pool.allocate(Some(&requests(&quarter))).is_none(),
        "the GPU is full"
    );

    // A hand-written claim naming only `milli` is charged the memory default, the whole GPU's:
    // why the webhook always names both (docs/kubernetes.md).
    let mut pool = Pool::new(&[slice::device(&g, None)], true);
    let alone = pool.allocate(Some(&json!({"milli": "250"}))).expect("fits");
    assert_eq!(alone.consumed_capacity()["memory"], "80Gi");
    assert!(pool.allocate(Some(&json!({"milli": "250"}))).is_none());
}

#[test]
fn three_tenths_and_seven_tenths_fill_a_gpu_exactly() {
    // 16 GB (not a whole number of MiB): the slice publishes the whole MiB, 15258.
    let g = gpu(16_000_000_000);
    let device = slice::device(&g, None);
    assert_eq!(device["capacity"]["memory"]["value"], "15258Mi");
    let mut pool = Pool::new(&[device], true);
    let three = webhook(Some(300), None, g.memory_bytes);
    let seven = webhook(Some(700), None, g.memory_bytes);
    let a = pool.allocate(Some(&requests(&three))).expect("0.3 fits");
    let b = pool
        .allocate(Some(&requests(&seven)))
        .expect("0.7 fits beside it");
    assert_eq!(a.consumed_capacity()["milli"], "300");
    assert_eq!(b.consumed_capacity()["milli"], "700");
    let (shares_a, mem_a) = enforced(&a, &g);
    let (shares_b, mem_b) = enforced(&b, &g);
    assert_eq!((shares_a.as_str(), shares_b.as_str()), ("0.3", "0.7"));
    assert!(mem_a + mem_b <= g.memory_bytes, "{mem_a} + {mem_b}");
    assert_eq!((mem_a / MIB, mem_b / MIB), (4577, 10680));
    assert!(
        pool.allocate(Some(&json!({"milli": "1", "memory": "1Mi"})))
            .is_none()
    );
    // Memory asked in bytes that are no whole MiB is rounded up by the webhook, as the
    // scheduler's 1Mi step would, so what is charged is what is enforced.
    let odd = webhook(Some(100), Some(1_000_000_000), g.memory_bytes);
    assert_eq!(requests(&odd)["memory"], "954Mi");
}

/// A device as the agent published it up to 02c9181 (`agent/src/dra/slice.rs`).
fn old_device(memory_bytes: u64) -> Value {
    json!({
        "name": "gpu-0",
        "allowMultipleAllocations": true,
        "capacity": {
            "shares": {"value": "1", "requestPolicy": {"default": "1",
                "validRange": {"min": "1u", "max": "1", "step": "1u"}}},
            "memory": {"value": memory_bytes.to_string(), "requestPolicy": {
                "default": memory_bytes.to_string(),
                "validRange": {"min": "1Mi", "step": "1Mi"}}},
        },
    })
}

#[test]
fn the_old_slice_charged_a_whole_gpu_for_half() {
    let mut pool = Pool::new(&[old_device(80 * GIB)], true);
    // The claim the webhook wrote up to 02c9181.
    let old_claim = json!({"shares": "0.5", "memory": "8Gi"});
    let first = pool.allocate(Some(&old_claim)).expect("fits");
    // `roundUpRange` on `Value()`: ⌈0.5⌉ = 1, so 1u + 1u × ⌈(1 − 1)/1⌉ = 1.
    assert_eq!(first.consumed_capacity()["shares"], "1");
    assert!(
        pool.allocate(Some(&old_claim)).is_none(),
        "the second half found no room"
    );
    // A shares-only claim was charged the memory default, the whole GPU's.
    let mut pool = Pool::new(&[old_device(80 * GIB)], true);
    let alone = pool
        .allocate(Some(&json!({"shares": "0.25"})))
        .expect("fits");
    assert_eq!(alone.consumed_capacity()["memory"], (80 * GIB).to_string());
}

#[test]
fn with_the_gate_off_a_claim_holds_the_gpu_whole() {
    let g = gpu(80 * GIB);
    let mut pool = Pool::new(&[slice::device(&g, None)], false);
    let half = webhook(Some(500), Some(8 * GIB), 80 * GIB);
    let first = pool.allocate(Some(&requests(&half))).expect("fits");
    assert!(
        first.consumed.is_empty(),
        "no consumedCapacity without the gate"
    );
    assert_eq!(enforced(&first, &g), ("1".to_owned(), 80 * GIB));
    assert!(pool.allocate(Some(&requests(&half))).is_none());
}

#[test]
fn the_claim_agent_dra_prepares_is_what_the_scheduler_charges() {
    // tests/agent_dra.rs serves a claim asking {milli: 500, memory: 256Mi} of a mock 16 GiB GPU,
    // allocated with consumedCapacity {milli: 500, memory: 256Mi}: what the oracle charges.
    let g = gpu(16 * GIB);
    let mut pool = Pool::new(&[slice::device(&g, None)], true);
    let a = pool
        .allocate(Some(&json!({"milli": "500", "memory": "256Mi"})))
        .expect("fits");
    assert_eq!(
        a.consumed_capacity(),
        json!({"milli": "500", "memory": "256Mi"})
    );
    // Below the minimum: the minimum; between steps: up to the next whole MiB.
    let b = pool
        .allocate(Some(&json!({"milli": "1", "memory": "1000000"})))
        .expect("fits");
    assert_eq!(b.consumed_capacity()["memory"], "1Mi");
    let c = pool
        .allocate(Some(&json!({"milli": "1", "memory": "1500000"})))
        .expect("fits");
    assert_eq!(c.consumed_capacity()["memory"], "2Mi");
}

#[test]
fn the_slice_and_the_webhooks_templates_are_valid_for_the_api() {
    let schema = Schema::load();
    let g = gpu(80 * GIB);
    let slice = slice::object("node-a", 1, &[slice::device(&g, None)], None, None);
    let errors = schema.check("io.k8s.api.resource.v1.ResourceSlice", &slice);
    assert!(errors.is_empty(), "{errors:#?}");
    for ask in [
        webhook(Some(500), Some(8 * GIB), 80 * GIB),
        webhook(Some(250), None, 80 * GIB),
        webhook(None, Some(GIB), 80 * GIB),
    ] {
        // The fixture has the claim's spec (the template's `spec.spec`), not the template.
        let spec = ask.template("ml")["spec"]["spec"].clone();
        let errors = schema.check("io.k8s.api.resource.v1.ResourceClaimSpec", &spec);
        assert!(errors.is_empty(), "{errors:#?}\n{spec:#}");
    }
    // The check can fail: a request's capacity in the wrong place.
    let mut wrong =
        webhook(Some(500), Some(8 * GIB), 80 * GIB).template("ml")["spec"]["spec"].clone();
    wrong["devices"]["requests"][0]["capacity"] = json!({"milli": "500"});
    assert_eq!(
        schema
            .check("io.k8s.api.resource.v1.ResourceClaimSpec", &wrong)
            .len(),
        1
    );
}
