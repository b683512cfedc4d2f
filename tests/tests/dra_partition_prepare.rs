//! A claim allocated a MIG partition (the node's `<node>/mig` pool, docs/mig.md "Partitions
//! prepared"): the DRA plugin, in process on mock GPUs whose fake MIG layer refuses what
//! NVIDIA's placement rules refuse, behind the fake kubelet (its Unix socket) and the fake API
//! server. The device is picked from the pool the plugin published by kube-scheduler's counter
//! arithmetic (the transcription in `k8s_capacity_counters/counters.rs`), not by the plugin's
//! own code; what was made is read from the mock's layout and device list.

// Test helpers fail loudly on anything unexpected.
#![expect(
    clippy::unwrap_used,
    reason = "a test's helpers unwrap: a failure there is the test failing"
)]

#[path = "k8s_capacity_counters/counters.rs"]
#[expect(dead_code, reason = "the oracle's rollback is not used here")]
mod counters;
#[path = "agent_dra/fake_api.rs"]
#[expect(dead_code, reason = "shared with agent_dra.rs; only part is used here")]
mod fake_api;
#[path = "agent_dra/fake_kubelet.rs"]
#[expect(dead_code, reason = "shared with agent_dra.rs; only part is used here")]
mod fake_kubelet;
#[path = "dra_plugin/harness.rs"]
#[expect(
    dead_code,
    reason = "shared with dra_offered_devices.rs; only part is used here"
)]
mod harness;

use std::{collections::BTreeSet, sync::Arc};

use counters::{Allocator, Pool, gather};
use fake_api::FakeApi;
use fake_kubelet::{prepare_v1, unprepare_v1};
use gpuwarden_agent::{
    control::link::ProcessView,
    devices::{GpuBackend, GpuDevice, mock::MockBackend},
    dra::DraConfig,
    enforcement::{QuotaCommand, quota::QuotaSpec},
};
use gpuwarden_test_support::wait::wait_for;
use harness::{
    DRIVER, POD, POOL, Running, Scene, mock_backend, node_slice_name, partition_claim,
    partition_claim_of, wait_ticks,
};
use serde_json::Value;

/// Claim UIDs.
const A: &str = "0a000000-0000-4000-8000-00000000000a";
const B: &str = "0b000000-0000-4000-8000-00000000000b";
const C: &str = "0c000000-0000-4000-8000-00000000000c";
const D: &str = "0d000000-0000-4000-8000-00000000000d";

/// GPU-1's instances as the mock's MIG layer holds them: (profile, start, size).
fn layout(backend: &MockBackend) -> BTreeSet<(String, u32, u32)> {
    backend
        .mig_layouts()
        .into_iter()
        .find(|(uuid, ..)| uuid == "GPU-1")
        .map(|(_, _, l)| {
            l.instances
                .iter()
                .map(|(p, at)| (p.name.to_owned(), at.start, at.size))
                .collect()
        })
        .unwrap()
}

/// The partition pool's slices on the fake API server, and its generation.
fn pool(api: &FakeApi) -> (Vec<Value>, i64) {
    let slices: Vec<Value> = api
        .slices()
        .into_values()
        .filter(|s| s["spec"]["pool"]["name"] == POOL)
        .collect();
    let generation = slices
        .iter()
        .filter_map(|s| s["spec"]["pool"]["generation"].as_i64())
        .max()
        .unwrap_or(0);
    (slices, generation)
}

/// A partition device's GPU UUID, first memory slice and slice count, from its attributes.
fn placement(device: &Value) -> (String, u64, u64) {
    let a = &device["attributes"];
    (
        a["parentUUID"]["string"].as_str().unwrap().to_owned(),
        a["memorySliceStart"]["int"].as_u64().unwrap(),
        a["memorySlices"]["int"].as_u64().unwrap(),
    )
}

fn overlaps(a: &(String, u64, u64), b: &(String, u64, u64)) -> bool {
    a.0 == b.0 && a.1 < b.1 + b.2 && b.1 < a.1 + a.2
}

/// The pool once written whole at a generation after `after` (slices are written one by one):
/// its generation, devices and counter sets.
fn republished(api: &FakeApi, after: i64) -> (i64, Vec<counters::Device>, counters::CounterSets) {
    let mut out = None;
    wait_for("the pool republished", || {
        let (slices, generation) = pool(api);
        if generation <= after {
            return false;
        }
        if let Pool::Ready {
            devices,
            counter_sets,
        } = gather(&slices, true)
        {
            out = Some((generation, devices, counter_sets));
            return true;
        }
        false
    });
    out.unwrap()
}

/// A `2g.35gb` partition that kube-scheduler's arithmetic (transcribed) allocates from the pool
/// the plugin published.
fn scheduler_picks_a_2g(api: &FakeApi) -> counters::Device {
    wait_for("the partition pool", || pool(api).0.len() >= 2);
    let gathered = gather(&pool(api).0, true);
    let Pool::Ready { devices, .. } = &gathered else {
        panic!("pool not ready: {gathered:?}")
    };
    let mut scheduler = Allocator::new(&gathered, &[], true);
    devices
        .iter()
        .find(|d| {
            d.value["attributes"]["migProfile"]["string"] == "2g.35gb"
                && scheduler.allocate(&d.name)
        })
        .unwrap()
        .clone()
}

/// Prepare and unprepare of claims allocated partitions: the instance made at the device's
/// placement, named in the CDI spec, the pool republished without the placements it overlaps;
/// a retried prepare makes nothing twice; a placement the fake driver refuses makes nothing and
/// says why; unprepare destroys the instance (later, when a process still holds it); across a
/// restart of the plugin the claim store still knows which instance a claim made.
#[test]
#[expect(clippy::too_many_lines, reason = "one scenario, step by step")]
fn a_claim_allocated_a_partition_gets_its_instance_made_and_destroyed() {
    let Scene {
        rt,
        api,
        root: _root,
        backend,
        db,
        config,
        endpoint,
    } = Scene::new("dra-partition-prepare");
    let mut running = Running::start(&rt, &config, &backend, &db);
    let operators = layout(&backend);
    let devices_before = backend.devices();

    // The pool as published; the scheduler's arithmetic picks a 2g on GPU-1.
    wait_for("the partition pool", || pool(&api).0.len() >= 2);
    let (slices, first_generation) = pool(&api);
    let gathered = gather(&slices, true);
    let Pool::Ready { devices, .. } = &gathered else {
        panic!("pool not ready: {gathered:?}")
    };
    let mut scheduler = Allocator::new(&gathered, &[], true);
    let chosen = devices
        .iter()
        .find(|d| {
            d.value["attributes"]["migProfile"]["string"] == "2g.35gb"
                && scheduler.allocate(&d.name)
        })
        .unwrap()
        .clone();
    let at = placement(&chosen.value);
    // One the scheduler would not allocate beside it (it overlaps), for a stale allocation.
    let mut after = Allocator::new(&gathered, &[&chosen.name], true);
    let overlapping = devices
        .iter()
        .find(|d| d.name != chosen.name && overlaps(&placement(&d.value), &at))
        .unwrap()
        .clone();
    assert!(!after.allocate(&overlapping.name));

    // Prepared (asked eight times at once, as a kubelet retrying might): one instance, at
    // that placement.
    api.put_claim(partition_claim("mig-a", A, &chosen.name));
    let asked: Vec<_> = (0..8)
        .map(|_| {
            let endpoint = endpoint.clone();
            rt.spawn(async move { prepare_v1(&endpoint, &[("ml", A, "mig-a")]).await })
        })
        .collect();
    let answers: Vec<_> = asked.into_iter().map(|a| rt.block_on(a).unwrap()).collect();
    let answer = answers[0].clone();
    for other in &answers {
        assert_eq!(other.claims[A], answer.claims[A]);
    }
    let ok = &answer.claims[A];
    assert_eq!(ok.error, "");
    assert_eq!(ok.devices.len(), 1);
    assert_eq!(
        (
            ok.devices[0].pool_name.as_str(),
            ok.devices[0].device_name.as_str()
        ),
        (POOL, chosen.name.as_str())
    );
    let mut want = operators.clone();
    want.insert(("2g.35gb".to_owned(), u32::try_from(at.1).unwrap(), 2));
    assert_eq!(layout(&backend), want);
    let made: Vec<GpuDevice> = backend
        .devices()
        .into_iter()
        .filter(|d| !devices_before.contains(d))
        .collect();
    assert_eq!(made.len(), 1, "{made:#?}");
    let instance = &made[0];
    let mig = instance.mig.clone().unwrap();
    assert_eq!(
        (mig.parent_uuid.as_str(), mig.profile.as_str()),
        ("GPU-1", "2g.35gb")
    );

    // The CDI spec names its parent's node and its capability nodes (from the minors file).
    let spec: Value = serde_json::from_slice(
        &std::fs::read(config.cdi_dir.join(format!("{DRIVER}-{A}.json"))).unwrap(),
    )
    .unwrap();
    let nodes: Vec<&str> = spec["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["hostPath"].as_str().or(n["path"].as_str()).unwrap())
        .collect();
    let gi = mig.gpu_instance;
    for cap in [
        format!("/dev/nvidia-caps/nvidia-cap{}", 100 + gi * 10),
        format!(
            "/dev/nvidia-caps/nvidia-cap{}",
            101 + gi * 10 + mig.compute_instance
        ),
    ] {
        assert!(nodes.contains(&cap.as_str()), "{cap} not in {nodes:?}");
    }
    assert!(nodes.contains(&instance.device_node.as_str()), "{nodes:?}");

    // Enforcement gets one quota: the instance whole (all its shares, all its memory, its
    // capability minors), bound to the reserving pod.
    let QuotaCommand::Apply(quota) = running.quotas.try_recv().unwrap() else {
        panic!("not a quota")
    };
    assert!(
        running.quotas.try_recv().is_err(),
        "one quota, not one per prepare"
    );
    assert_eq!(quota.session_id, format!("k8s-{A}"));
    assert_eq!(quota.target.to_string(), format!("pod {POD}"));
    assert_eq!(quota.devices.len(), 1);
    let q = &quota.devices[0];
    assert_eq!(
        (q.index, q.shares_ppm, q.memory_bytes),
        (instance.index, 1_000_000, instance.memory_bytes)
    );
    assert!(q.mig.is_some(), "{q:?}");

    // Republished: no device left that overlaps the instance, its slices' counters at 0.
    let (generation, now, counter_sets) = republished(&api, first_generation);
    assert!(!now.is_empty());
    for d in &now {
        assert!(
            !overlaps(&placement(&d.value), &at),
            "{} still offered",
            d.name
        );
    }
    let set = &counter_sets["gpu-1"];
    for s in at.1..at.1 + at.2 {
        assert_eq!(set[&format!("memory-slice-{s}")], 0, "slice {s}");
    }

    // Retried (the kubelet does): the same answer, nothing made twice.
    let again = rt.block_on(prepare_v1(&endpoint, &[("ml", A, "mig-a")]));
    assert_eq!(again.claims[A], answer.claims[A]);
    assert_eq!(backend.devices().len(), devices_before.len() + 1);

    // A stale allocation of a free placement and an overlapping one: the fake driver refuses
    // the second; the first, made, is destroyed again: nothing is left made.
    let mut beside = Allocator::new(&gathered, &[&chosen.name], true);
    let free = devices
        .iter()
        .find(|d| {
            d.value["attributes"]["migProfile"]["string"] == "1g.18gb" && beside.allocate(&d.name)
        })
        .unwrap();
    assert!(!overlaps(&placement(&free.value), &at));
    api.put_claim(partition_claim_of(
        "mig-b",
        B,
        &[&free.name, &overlapping.name],
    ));
    let refused = rt.block_on(prepare_v1(&endpoint, &[("ml", B, "mig-b")]));
    let err = &refused.claims[B].error;
    assert!(
        err.contains(&overlapping.name) && err.contains("refused"),
        "{err}"
    );
    assert_eq!(layout(&backend), want);
    assert!(!config.cdi_dir.join(format!("{DRIVER}-{B}.json")).exists());

    // Unprepared: destroyed, the pool back to what it offered at first.
    let done = rt.block_on(unprepare_v1(&endpoint, &[("ml", A, "mig-a")]));
    assert_eq!(done.claims[A].error, "");
    assert!(matches!(
        running.quotas.try_recv().unwrap(),
        QuotaCommand::Release(s) if s == format!("k8s-{A}")
    ));
    assert_eq!(layout(&backend), operators);
    assert_eq!(backend.devices(), devices_before);
    republished(&api, generation);
    let names = |slices: &[Value]| -> BTreeSet<String> {
        slices
            .iter()
            .filter_map(|s| s["spec"]["devices"].as_array())
            .flatten()
            .map(|d| d["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let first_names: BTreeSet<String> = devices.iter().map(|d| d.name.clone()).collect();
    wait_for("every placement offered again", || {
        names(&pool(&api).0) == first_names
    });

    // A process on the instance at unprepare: the driver refuses; destroyed once it is gone.
    api.put_claim(partition_claim("mig-c", C, &chosen.name));
    let c = rt.block_on(prepare_v1(&endpoint, &[("ml", C, "mig-c")]));
    assert_eq!(c.claims[C].error, "");
    let held = backend
        .devices()
        .into_iter()
        .find(|d| !devices_before.contains(d))
        .unwrap();
    backend.set_instance_processes(&held.uuid, 1).unwrap();
    let done = rt.block_on(unprepare_v1(&endpoint, &[("ml", C, "mig-c")]));
    assert_eq!(
        done.claims[C].error, "",
        "unprepare succeeds; the destroy waits"
    );
    // Kept through ticks that each tried again to destroy it.
    wait_ticks(&api, 3);
    assert!(
        backend.devices().contains(&held),
        "destroyed under a process"
    );
    backend.set_instance_processes(&held.uuid, 0).unwrap();
    wait_for("the instance destroyed once idle", || {
        backend.devices() == devices_before
    });

    // Across a restart: the store says which instance the claim made; unprepare destroys it.
    api.put_claim(partition_claim("mig-d", D, &chosen.name));
    let d = rt.block_on(prepare_v1(&endpoint, &[("ml", D, "mig-d")]));
    assert_eq!(d.claims[D].error, "");
    running.stop(&rt);
    let running = Running::start(&rt, &config, &backend, &db);
    wait_for("the plugin socket", || endpoint.exists());
    let again = rt.block_on(prepare_v1(&endpoint, &[("ml", D, "mig-d")]));
    assert_eq!(
        again.claims[D], d.claims[D],
        "the same answer after the restart"
    );
    assert_eq!(backend.devices().len(), devices_before.len() + 1);
    // The instance is the claim's whole: not offered in the node's pool as a shared device.
    let made_d = backend
        .devices()
        .into_iter()
        .find(|g| !devices_before.contains(g))
        .unwrap();
    // Ticks of the restarted plugin, each publishing the devices it reads then.
    wait_ticks(&api, 2);
    let node_slice = &api.slices()[&node_slice_name()];
    let uuids: Vec<&str> = node_slice["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["attributes"]["uuid"]["string"].as_str())
        .collect();
    assert!(uuids.contains(&"MIG-ops"), "{uuids:?}");
    assert!(!uuids.contains(&made_d.uuid.as_str()), "{uuids:?}");
    let done = rt.block_on(unprepare_v1(&endpoint, &[("ml", D, "mig-d")]));
    assert_eq!(done.claims[D].error, "");
    assert_eq!(backend.devices(), devices_before);
    assert_eq!(layout(&backend), operators);
    running.stop(&rt);
}

/// The capability minors the test's `mig-minors` file lists for an instance of GPU-1.
fn cap_minors(device: &GpuDevice) -> Vec<u32> {
    let mig = device.mig.as_ref().unwrap();
    vec![
        100 + mig.gpu_instance * 10,
        101 + mig.gpu_instance * 10 + mig.compute_instance,
    ]
}

/// The device node paths a claim's CDI spec gives its containers.
fn cdi_nodes(config: &DraConfig, uid: &str) -> Vec<String> {
    let spec: Value = serde_json::from_slice(
        &std::fs::read(config.cdi_dir.join(format!("{DRIVER}-{uid}.json"))).unwrap(),
    )
    .unwrap();
    spec["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            n["hostPath"]
                .as_str()
                .or(n["path"].as_str())
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// The devices (UUID, index) the controller link would report claim `uid`'s session holding;
/// `None` when it reports no such session.
fn reported(running: &Running, uid: &str) -> Option<Vec<(String, u32)>> {
    running
        .observed
        .registration()
        .into_iter()
        .find(|o| o.session_id == format!("k8s-{uid}"))
        .map(|o| o.devices.into_iter().map(|d| (d.uuid, d.index)).collect())
}

/// The one 2g.35gb instance of GPU-1 in `backend`'s device list.
fn the_2g(backend: &MockBackend) -> GpuDevice {
    let found: Vec<GpuDevice> = backend
        .devices()
        .into_iter()
        .filter(|d| {
            d.mig
                .as_ref()
                .is_some_and(|m| m.parent_uuid == "GPU-1" && m.profile == "2g.35gb")
        })
        .collect();
    assert_eq!(found.len(), 1, "{found:#?}");
    found[0].clone()
}

/// A node rebooted (a fresh mock backend from the same file: the driver keeps no MIG instance
/// across a reboot) under a claim prepared on a partition: the agent makes the instance again
/// at the claim's placement, and the quota it enforces names the new instance's index and
/// capability nodes, not the index from before, which another instance has taken. When the
/// placement is taken at start, nothing is enforced for the claim and the kubelet's prepare
/// answers why, then makes it once the placement is free. Judged by the mock's own layout and
/// device list and the minors file, not by the plugin's record.
#[test]
#[expect(clippy::too_many_lines, reason = "one scenario, step by step")]
fn a_claims_instance_gone_after_a_reboot_is_made_again() {
    let Scene {
        rt,
        api,
        root,
        backend,
        db,
        config,
        endpoint,
    } = Scene::new("dra-partition-reboot");
    let mut running = Running::start(&rt, &config, &backend, &db);
    let operators = layout(&backend);

    // A 2g the scheduler's arithmetic picks from the published pool, prepared.
    let chosen = scheduler_picks_a_2g(&api);
    let at = placement(&chosen.value);
    let start = u32::try_from(at.1).unwrap();
    api.put_claim(partition_claim("mig-a", A, &chosen.name));
    let first = rt.block_on(prepare_v1(&endpoint, &[("ml", A, "mig-a")]));
    assert_eq!(first.claims[A].error, "");
    let before = the_2g(&backend);
    let QuotaCommand::Apply(quota) = running.quotas.try_recv().unwrap() else {
        panic!("not a quota")
    };
    assert_eq!(quota.devices[0].index, before.index);
    running.stop(&rt);

    // Rebooted: no instance but the operator's, who makes a 1g beside the claim's placement
    // before the agent starts. It takes the index (and GPU instance) the claim's instance had.
    let rebooted = mock_backend(root.path());
    assert_eq!(layout(&rebooted), operators);
    assert!(!rebooted.devices().iter().any(|d| d.uuid == before.uuid));
    let beside = (0..8)
        .find(|s| {
            !(start..start + 2).contains(s)
                && rebooted.create_instance("GPU-1", "1g.18gb", *s).is_ok()
        })
        .unwrap();
    let operators_1g = rebooted
        .devices()
        .into_iter()
        .find(|d| {
            d.mig
                .as_ref()
                .is_some_and(|m| m.profile == "1g.18gb" && m.parent_uuid == "GPU-1")
        })
        .unwrap();
    assert_eq!(
        operators_1g.index, before.index,
        "the old index is another instance's now"
    );
    let mut running = Running::start(&rt, &config, &rebooted, &db);

    // Made again at the claim's placement; the quota enforced at start names it.
    let mut want = operators.clone();
    want.insert(("1g.18gb".to_owned(), beside, 1));
    want.insert(("2g.35gb".to_owned(), start, 2));
    assert_eq!(layout(&rebooted), want);
    let again = the_2g(&rebooted);
    assert_ne!(again.uuid, before.uuid);
    let held: Vec<&QuotaSpec> = running
        .held
        .iter()
        .filter(|q| q.session_id == format!("k8s-{A}"))
        .collect();
    assert_eq!(held.len(), 1, "{:?}", running.held);
    assert_eq!(held[0].devices.len(), 1);
    let part = &held[0].devices[0];
    assert_eq!(
        (part.index, part.shares_ppm, part.memory_bytes),
        (again.index, 1_000_000, again.memory_bytes)
    );
    let access = part.mig.as_ref().unwrap();
    assert_eq!(access.node_minor, again.mig.as_ref().unwrap().parent_index);
    assert_eq!(access.cap_minors, cap_minors(&again));
    assert_ne!(access.cap_minors, cap_minors(&operators_1g));
    // The controller hears of the new instance, not the old UUID or index.
    assert_eq!(
        reported(&running, A),
        Some(vec![(again.uuid.clone(), again.index)])
    );

    // The kubelet prepares again: the same answer, nothing made twice, the CDI spec naming
    // the new instance's capability nodes and not the operator's 1g's.
    let count = rebooted.devices().len();
    let answer = rt.block_on(prepare_v1(&endpoint, &[("ml", A, "mig-a")]));
    assert_eq!(answer.claims[A], first.claims[A]);
    assert_eq!(rebooted.devices().len(), count);
    let nodes = cdi_nodes(&config, A);
    for minor in cap_minors(&again) {
        assert!(
            nodes.contains(&format!("/dev/nvidia-caps/nvidia-cap{minor}")),
            "{nodes:?}"
        );
    }
    for minor in cap_minors(&operators_1g) {
        assert!(
            !nodes.contains(&format!("/dev/nvidia-caps/nvidia-cap{minor}")),
            "{nodes:?}"
        );
    }
    assert!(running.quotas.try_recv().is_err(), "nothing to change");
    running.stop(&rt);

    // Rebooted again, the operator's 1g now at the claim's placement: nothing enforced for
    // the claim at start, its prepare answered with the driver's refusal.
    let taken = mock_backend(root.path());
    taken.create_instance("GPU-1", "1g.18gb", start).unwrap();
    let squatter = taken
        .devices()
        .into_iter()
        .find(|d| {
            d.mig
                .as_ref()
                .is_some_and(|m| m.profile == "1g.18gb" && m.parent_uuid == "GPU-1")
        })
        .unwrap();
    let mut running = Running::start(&rt, &config, &taken, &db);
    assert!(
        !running
            .held
            .iter()
            .any(|q| q.session_id == format!("k8s-{A}")),
        "{:?}",
        running.held
    );
    assert_eq!(reported(&running, A), None, "a claim holding nothing");
    let refused = rt.block_on(prepare_v1(&endpoint, &[("ml", A, "mig-a")]));
    let err = &refused.claims[A].error;
    assert!(
        err.contains(&chosen.name) && err.contains("refused"),
        "{err}"
    );

    // The operator takes its 1g away: the next prepare makes the instance and enforces it.
    taken.destroy_instance(&squatter.uuid).unwrap();
    let answer = rt.block_on(prepare_v1(&endpoint, &[("ml", A, "mig-a")]));
    assert_eq!(answer.claims[A], first.claims[A]);
    let mut want = operators.clone();
    want.insert(("2g.35gb".to_owned(), start, 2));
    assert_eq!(layout(&taken), want);
    let remade = the_2g(&taken);
    let QuotaCommand::Apply(quota) = running.quotas.try_recv().unwrap() else {
        panic!("not a quota")
    };
    assert_eq!(quota.session_id, format!("k8s-{A}"));
    assert_eq!(
        quota.devices.iter().map(|d| d.index).collect::<Vec<_>>(),
        [remade.index]
    );
    assert_eq!(
        quota.devices[0].mig.as_ref().unwrap().cap_minors,
        cap_minors(&remade)
    );
    assert_eq!(
        reported(&running, A),
        Some(vec![(remade.uuid.clone(), remade.index)])
    );

    // Unprepared: the instance made again is destroyed.
    let done = rt.block_on(unprepare_v1(&endpoint, &[("ml", A, "mig-a")]));
    assert_eq!(done.claims[A].error, "");
    assert_eq!(layout(&taken), operators);
    running.stop(&rt);
}

/// The agent's view of its processes as a test sets it, counting how often the plugin asked.
#[derive(Default)]
struct Seen {
    busy: std::sync::Mutex<Option<BTreeSet<u32>>>,
    asked: std::sync::atomic::AtomicUsize,
}

impl Seen {
    fn set(&self, busy: Option<&[u32]>) {
        *self.busy.lock().unwrap() = busy.map(|b| b.iter().copied().collect());
    }

    fn asked(&self) -> usize {
        self.asked.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl ProcessView for Seen {
    fn busy(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<BTreeSet<u32>>> + Send + '_>>
    {
        self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let now = self.busy.lock().unwrap().clone();
        Box::pin(async move { now })
    }
}

/// The plugin asks the agent's own view of its processes before it makes or destroys a
/// partition's instance, the mock's driver counting no process: a process the view sees on the
/// GPU refuses the prepare, a view that can't be read too, and memory it sees on the instance
/// holds its destruction after unprepare until it is gone. Judged by the mock's layout.
#[test]
fn the_agents_own_view_of_its_processes_holds_partition_changes() {
    let Scene {
        rt,
        api,
        root: _root,
        backend,
        db,
        config,
        endpoint,
    } = Scene::new("dra-partition-view");
    let running = Running::start(&rt, &config, &backend, &db);
    let view = Arc::new(Seen::default());
    running
        .driver
        .on_processes(Arc::clone(&view) as Arc<dyn ProcessView>);
    let operators = layout(&backend);
    let ops = backend
        .devices()
        .into_iter()
        .find(|d| d.uuid == "MIG-ops")
        .unwrap();
    assert!(backend.busy_devices().is_empty(), "the driver counts none");

    let chosen = scheduler_picks_a_2g(&api);
    api.put_claim(partition_claim("mig-a", A, &chosen.name));

    // A process on the operator's instance as the agent sees it: GPU-1 is busy.
    view.set(Some(&[ops.index]));
    let busy = rt.block_on(prepare_v1(&endpoint, &[("ml", A, "mig-a")]));
    let err = &busy.claims[A].error;
    assert!(err.contains("has a process"), "{err}");
    assert_eq!(layout(&backend), operators);
    // The view can't be read: nothing made either.
    view.set(None);
    let blind = rt.block_on(prepare_v1(&endpoint, &[("ml", A, "mig-a")]));
    assert!(
        blind.claims[A].error.contains("can't be read"),
        "{:?}",
        blind.claims[A]
    );
    assert_eq!(layout(&backend), operators);

    // Nothing seen: made.
    view.set(Some(&[]));
    let ok = rt.block_on(prepare_v1(&endpoint, &[("ml", A, "mig-a")]));
    assert_eq!(ok.claims[A].error, "");
    let made = the_2g(&backend);

    // Memory on it as the agent sees it at unprepare: kept through several ticks.
    view.set(Some(&[made.index]));
    let done = rt.block_on(unprepare_v1(&endpoint, &[("ml", A, "mig-a")]));
    assert_eq!(
        done.claims[A].error, "",
        "unprepare succeeds; the destroy waits"
    );
    // Kept through ticks that each asked the view again before trying to destroy it.
    let asked = view.asked();
    wait_ticks(&api, 3);
    assert!(
        backend.devices().contains(&made),
        "destroyed under the agent's process"
    );
    assert!(
        view.asked() >= asked + 3,
        "the view asked {} times over three ticks",
        view.asked() - asked
    );
    view.set(Some(&[]));
    wait_for("the instance destroyed once the view is clear", || {
        layout(&backend) == operators
    });
    assert!(!backend.devices().contains(&made));
    running.stop(&rt);
}
