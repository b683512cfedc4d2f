//! The devices the DRA plugin offers follow the node's MIG instances while it runs (docs/mig.md,
//! "Which GPUs"): the operator destroys an instance on an offered GPU, or makes one, through the
//! mock's fake MIG layer while the plugin runs; the node's ResourceSlice as the fake API server
//! holds it loses or gains that device, the kubelet's prepare of a claim naming a device that is
//! gone is refused by name, and one on the new instance is prepared on it. Nothing is
//! republished while nothing changes. Judged by the mock's device list and the API server's
//! objects, not by the plugin's own view.

// Test helpers fail loudly on anything unexpected.
#![expect(
    clippy::unwrap_used,
    reason = "a test's helpers unwrap: a failure there is the test failing"
)]

#[path = "agent_dra/fake_api.rs"]
#[expect(dead_code, reason = "shared with agent_dra.rs; only part is used here")]
mod fake_api;
#[path = "agent_dra/fake_kubelet.rs"]
#[expect(dead_code, reason = "shared with agent_dra.rs; only part is used here")]
mod fake_kubelet;
#[path = "dra_plugin/harness.rs"]
#[expect(
    dead_code,
    reason = "shared with dra_partition_prepare.rs; only part is used here"
)]
mod harness;

use fake_api::FakeApi;
use fake_kubelet::prepare_v1;
use gpuwarden_agent::{
    devices::{GpuBackend, GpuDevice, mock::MockBackend},
    enforcement::QuotaCommand,
};
use gpuwarden_test_support::wait::wait_for;
use harness::{DRIVER, NODE, POD, Running, Scene, partition_claim, shared_claim, wait_ticks};

/// Claim UIDs.
const A: &str = "0a000000-0000-4000-8000-0000000000a1";
const B: &str = "0b000000-0000-4000-8000-0000000000b1";
const C: &str = "0c000000-0000-4000-8000-0000000000c1";

/// The node's ResourceSlice as the fake API server holds it.
struct NodeSlice {
    /// (device name, UUID) of each device.
    devices: Vec<(String, String)>,
    /// The pool's generation.
    generation: i64,
    /// The object's resourceVersion.
    version: String,
}

fn node_slice(api: &FakeApi) -> Option<NodeSlice> {
    let slice = api
        .slices()
        .into_values()
        .find(|s| s["spec"]["pool"]["name"] == NODE)?;
    let devices = slice["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["name"].as_str().unwrap().to_owned(),
                d["attributes"]["uuid"]["string"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            )
        })
        .collect();
    Some(NodeSlice {
        devices,
        generation: slice["spec"]["pool"]["generation"].as_i64().unwrap(),
        version: slice["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    })
}

/// Nothing republished: the same devices, generation and object version as `first`.
fn same_as(now: &NodeSlice, first: &NodeSlice) {
    assert_eq!(now.devices, first.devices);
    assert_eq!(
        now.generation, first.generation,
        "the pool's generation moved"
    );
    assert_eq!(now.version, first.version, "the slice was written again");
}

fn uuids(devices: &[(String, String)]) -> Vec<&str> {
    devices.iter().map(|(_, u)| u.as_str()).collect()
}

/// The MIG instances of `gpu` in `backend`'s device list.
fn instances_of(backend: &MockBackend, gpu: &str) -> Vec<GpuDevice> {
    backend
        .devices()
        .into_iter()
        .filter(|d| d.mig.as_ref().is_some_and(|m| m.parent_uuid == gpu))
        .collect()
}

/// The operator destroys its `3g.71gb` on GPU-1 and makes a `1g.18gb` on GPU-2 while the plugin
/// runs: the published slice drops the one and gains the other (its generation up each time),
/// the controller link's registration follows, a stale claim on the destroyed device is refused
/// naming it, and a claim on the new instance is prepared on that instance.
#[test]
#[expect(clippy::too_many_lines, reason = "one scenario, step by step")]
fn the_offered_devices_follow_the_operators_mig_changes() {
    let Scene {
        rt,
        api,
        root: _root,
        backend,
        db,
        config,
        endpoint,
    } = Scene::new("dra-offered-devices");
    let mut running = Running::start(&rt, &config, &backend, &db);

    // What the mock lists first: GPU-0 and the operator's instance on GPU-1, all published.
    let ops = instances_of(&backend, "GPU-1");
    assert_eq!(ops.len(), 1, "{ops:#?}");
    let ops = ops[0].clone();
    let listed: Vec<String> = backend.devices().into_iter().map(|d| d.uuid).collect();
    wait_for("the node's slice", || {
        node_slice(&api).is_some_and(|s| s.devices.len() == listed.len())
    });
    let NodeSlice {
        devices,
        generation: first_generation,
        ..
    } = node_slice(&api).unwrap();
    let mut published: Vec<&str> = uuids(&devices);
    published.sort_unstable();
    let mut want: Vec<&str> = listed.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(published, want);
    assert_eq!(running.registered(), want);
    let ops_name = devices
        .iter()
        .find(|(_, u)| *u == ops.uuid)
        .map(|(n, _)| n.clone())
        .unwrap();

    // The operator destroys it: gone from the slice, the generation up.
    backend.destroy_instance(&ops.uuid).unwrap();
    assert!(instances_of(&backend, "GPU-1").is_empty());
    wait_for("the destroyed instance leaving the slice", || {
        node_slice(&api).is_some_and(|s| !uuids(&s.devices).contains(&ops.uuid.as_str()))
    });
    let NodeSlice {
        devices,
        generation: second_generation,
        ..
    } = node_slice(&api).unwrap();
    assert!(second_generation > first_generation);
    let mut published: Vec<String> = devices.iter().map(|(_, u)| u.clone()).collect();
    published.sort();
    let mut want: Vec<String> = backend.devices().into_iter().map(|d| d.uuid).collect();
    want.sort();
    assert_eq!(published, want);
    wait_for("the registration without it", || {
        running.registered() == want
    });

    // A claim kube-scheduler allocated on it before it went: refused, naming the device.
    api.put_claim(shared_claim("stale", A, NODE, &ops_name, POD, "kill"));
    let answer = rt.block_on(prepare_v1(&endpoint, &[("ml", A, "stale")]));
    let error = &answer.claims[A].error;
    assert!(
        error.contains(&ops_name) && error.contains(&ops.uuid) && error.contains("gone"),
        "{error:?}"
    );
    assert!(answer.claims[A].devices.is_empty());
    assert!(
        !config.cdi_dir.join(format!("{DRIVER}-{A}.json")).exists(),
        "no CDI spec for a refused claim"
    );
    assert!(running.quotas.try_recv().is_err(), "nothing enforced");

    // The operator makes a 1g on GPU-2 (not gpuwarden's to reconfigure): published.
    let new = backend.create_instance("GPU-2", "1g.18gb", 0).unwrap();
    wait_for("the new instance in the slice", || {
        node_slice(&api).is_some_and(|s| uuids(&s.devices).contains(&new.uuid.as_str()))
    });
    let NodeSlice {
        devices,
        generation: third_generation,
        ..
    } = node_slice(&api).unwrap();
    assert!(third_generation > second_generation);
    let new_name = devices
        .iter()
        .find(|(_, u)| *u == new.uuid)
        .map(|(n, _)| n.clone())
        .unwrap();
    wait_for("the registration with it", || {
        running.registered().contains(&new.uuid)
    });

    // A claim on it is prepared on that instance: its quota names the instance's index and
    // capability minors.
    api.put_claim(shared_claim("fresh", B, NODE, &new_name, POD, "kill"));
    let answer = rt.block_on(prepare_v1(&endpoint, &[("ml", B, "fresh")]));
    assert_eq!(answer.claims[B].error, "");
    assert_eq!(answer.claims[B].devices[0].device_name, new_name);
    let QuotaCommand::Apply(quota) = running.quotas.try_recv().unwrap() else {
        panic!("not a quota")
    };
    assert_eq!(quota.devices.len(), 1);
    assert_eq!(quota.devices[0].index, new.index);
    let mig = new.mig.clone().unwrap();
    let cap_minors: Vec<u32> = quota.devices[0].mig.clone().unwrap().cap_minors;
    assert_eq!(
        cap_minors,
        vec![
            200 + mig.gpu_instance * 10,
            201 + mig.gpu_instance * 10 + mig.compute_instance
        ]
    );
    running.stop(&rt);
    drop(db);
}

/// While nothing changes the slice is written once: its generation and resourceVersion stay
/// over many ticks; an instance made for a claim's partition is that claim's and does not
/// enter the shared pool (nothing republished for it either).
#[test]
fn nothing_is_republished_while_the_devices_stay() {
    let Scene {
        rt,
        api,
        root: _root,
        backend,
        db,
        config,
        endpoint,
    } = Scene::new("dra-offered-steady");
    let running = Running::start(&rt, &config, &backend, &db);
    let listed = backend.devices().len();
    wait_for("the node's slice", || {
        node_slice(&api).is_some_and(|s| s.devices.len() == listed)
    });
    let first = node_slice(&api).unwrap();
    // Ten ticks, each reading the slice.
    wait_ticks(&api, 10);
    same_as(&node_slice(&api).unwrap(), &first);

    // A claim allocated a 1g partition on GPU-1: its instance is made, and stays out of the
    // node's shared pool.
    let partition = api
        .slices()
        .into_values()
        .filter(|s| s["spec"]["pool"]["name"] == format!("{NODE}/mig"))
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .find(|d| d["attributes"]["migProfile"]["string"] == "1g.18gb")
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .unwrap();
    let before = instances_of(&backend, "GPU-1");
    api.put_claim(partition_claim("part", C, &partition));
    let answer = rt.block_on(prepare_v1(&endpoint, &[("ml", C, "part")]));
    assert_eq!(answer.claims[C].error, "");
    let after = instances_of(&backend, "GPU-1");
    assert_eq!(after.len(), before.len() + 1, "{after:#?}");
    // The instance made is in the device list each of these ticks reads.
    wait_ticks(&api, 3);
    same_as(&node_slice(&api).unwrap(), &first);
    let mut want: Vec<String> = first.devices.iter().map(|(_, u)| u.clone()).collect();
    want.sort();
    assert_eq!(running.registered(), want);
    running.stop(&rt);
    drop(db);
}
