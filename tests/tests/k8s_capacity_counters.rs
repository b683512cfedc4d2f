//! The partition pool the agent publishes for a reconfigurable MIG GPU (`dra::partition`), run
//! through kube-scheduler's counter arithmetic (the oracle in `k8s_capacity_counters/counters.rs`,
//! transcribed from `k8s.io/dynamic-resource-allocation` v0.35.6) and held against NVIDIA's
//! placement rules (`devices::placement`): the sets of devices the scheduler would allocate
//! are exactly the layouts the hardware takes.

#[path = "k8s_capacity_counters/counters.rs"]
mod counters;
#[path = "agent_dra/schema.rs"]
mod schema;

use std::collections::BTreeSet;

use counters::{Allocator, Pool, gather};
use gpuwarden_agent::{
    devices::placement::{GiProfile, GpuModel, H100_80GB, H200_141GB, Layout, Placement},
    dra::partition::{self, PartitionedGpu},
};
use schema::Schema;
use serde_json::{Value, json};

const NODE: &str = "node-a";

/// A layout as a set of (profile id, start).
type Canon = BTreeSet<(u32, u32)>;

fn objects(gpus: &[(u32, Layout)]) -> Vec<Value> {
    let gpus: Vec<(PartitionedGpu, String)> = gpus
        .iter()
        .map(|(index, layout)| {
            (
                PartitionedGpu {
                    uuid: format!("GPU-{index}"),
                    index: *index,
                    layout: layout.clone(),
                },
                format!("NVIDIA {}", layout.model.name),
            )
        })
        .collect();
    let parts = partition::slices(NODE, &gpus);
    parts
        .iter()
        .map(|p| partition::object(NODE, p, 1, parts.len(), None, None))
        .collect()
}

/// Every (profile, placement) the model allows, in a fixed order.
fn candidates(model: &'static GpuModel) -> Vec<(&'static GiProfile, Placement)> {
    model
        .profiles
        .iter()
        .flat_map(|p| p.placements().map(move |pl| (p, pl)))
        .collect()
}

/// Every set of instances placement.rs lets be added to `base`, one by one (the empty set too).
fn valid_completions(base: &Layout) -> BTreeSet<Canon> {
    fn walk(
        layout: &mut Layout,
        all: &[(&'static GiProfile, Placement)],
        from: usize,
        added: &mut Canon,
        out: &mut BTreeSet<Canon>,
    ) {
        out.insert(added.clone());
        for (i, &(p, pl)) in all.iter().enumerate().skip(from) {
            if layout.refusal(p, pl).is_none() {
                layout.instances.push((p, pl));
                added.insert((p.id, pl.start));
                walk(layout, all, i + 1, added, out);
                added.remove(&(p.id, pl.start));
                layout.instances.pop();
            }
        }
    }
    let mut out = BTreeSet::new();
    let all = candidates(base.model);
    walk(&mut base.clone(), &all, 0, &mut Canon::new(), &mut out);
    out
}

/// Every set of the pool's devices the allocator accepts in one claim (the empty set too),
/// each as (profile id, start). Counters only grow as devices are added, so a refused device
/// refuses every larger set with it: a walk in index order finds them all.
fn accepted_sets(pool: &Pool, model: &'static GpuModel) -> BTreeSet<Canon> {
    fn walk(
        a: &mut Allocator<'_>,
        names: &[String],
        from: usize,
        key: &dyn Fn(&str) -> (u32, u32),
        chosen: &mut Canon,
        out: &mut BTreeSet<Canon>,
    ) {
        out.insert(chosen.clone());
        for (i, n) in names.iter().enumerate().skip(from) {
            if a.allocate(n) {
                chosen.insert(key(n));
                walk(a, names, i + 1, key, chosen, out);
                chosen.remove(&key(n));
                a.release(n);
            }
        }
    }
    let Pool::Ready { devices, .. } = pool else {
        panic!("pool not ready: {pool:?}");
    };
    let names: Vec<String> = devices.iter().map(|d| d.name.clone()).collect();
    let key = |name: &str| -> (u32, u32) {
        let d = devices
            .iter()
            .find(|d| d.name == name)
            .expect("a device as published");
        let profile = model
            .profile(
                d.value["attributes"]["migProfile"]["string"]
                    .as_str()
                    .expect("a device as published"),
            )
            .expect("a device as published");
        let start = d.value["attributes"]["memorySliceStart"]["int"]
            .as_u64()
            .expect("a device as published");
        (
            profile.id,
            u32::try_from(start).expect("a device as published"),
        )
    };
    let mut a = Allocator::new(pool, &[], true);
    let mut out = BTreeSet::new();
    walk(&mut a, &names, 0, &key, &mut Canon::new(), &mut out);
    out
}

/// The layouts of up to `n` instances placement.rs allows on an empty GPU of `model`.
fn small_layouts(model: &'static GpuModel, n: usize) -> Vec<Layout> {
    let all = candidates(model);
    valid_completions(&Layout::empty(model))
        .into_iter()
        .filter(|c| c.len() <= n)
        .map(|c| Layout {
            model,
            instances: c
                .iter()
                .map(|&(id, start)| {
                    *all.iter()
                        .find(|(p, pl)| p.id == id && pl.start == start)
                        .expect("a candidate")
                })
                .collect(),
        })
        .collect()
}

#[test]
fn the_scheduler_allocates_exactly_the_layouts_the_hardware_takes() {
    for model in [&H100_80GB, &H200_141GB] {
        let mut checked = 0;
        for base in small_layouts(model, 2) {
            let pool = gather(&objects(&[(0, base.clone())]), true);
            let accepted = accepted_sets(&pool, model);
            let valid = valid_completions(&base);
            let only_scheduler: Vec<_> = accepted.difference(&valid).take(3).collect();
            let only_hardware: Vec<_> = valid.difference(&accepted).take(3).collect();
            assert!(
                only_scheduler.is_empty() && only_hardware.is_empty(),
                "{} with {:?}: the scheduler alone takes {only_scheduler:?}, the hardware alone {only_hardware:?}",
                model.name,
                base.instances
            );
            checked += accepted.len();
        }
        // The empty GPU alone has a few hundred layouts; with every base of up to two
        // instances, many more sets were compared.
        eprintln!("{}: {checked} sets compared", model.name);
        assert!(checked > 1000, "{checked}");
    }
}

#[test]
fn devices_allocated_by_earlier_claims_count_as_the_same_claims_do() {
    let m = &H200_141GB;
    let pool = gather(&objects(&[(0, Layout::empty(m))]), true);
    let Pool::Ready { devices, .. } = &pool else {
        panic!()
    };
    for a in devices {
        for b in devices {
            let mut one = Allocator::new(&pool, &[], true);
            let together = one.allocate(&a.name) && one.allocate(&b.name);
            let mut later = Allocator::new(&pool, &[&a.name], true);
            assert_eq!(
                later.allocate(&b.name),
                together,
                "{} then {}",
                a.name,
                b.name
            );
        }
    }
}

#[test]
fn without_the_counters_the_scheduler_would_overlap_instances() {
    // The check can fail: the same devices with no `consumesCounters` (as the instances are
    // published, one device each) let 3g at 0 and 4g at 0 go together.
    let m = &H100_80GB;
    let mut slices = objects(&[(0, Layout::empty(m))]);
    for s in &mut slices {
        for d in s["spec"]["devices"].as_array_mut().into_iter().flatten() {
            d.as_object_mut().unwrap().remove("consumesCounters");
        }
    }
    let pool = gather(&slices, true);
    let mut a = Allocator::new(&pool, &[], true);
    assert!(a.allocate("gpu-0-3g-40gb-at-0"));
    assert!(a.allocate("gpu-0-4g-40gb-at-0"));
    // With them, refused.
    let pool = gather(&objects(&[(0, Layout::empty(m))]), true);
    let mut a = Allocator::new(&pool, &[], true);
    assert!(a.allocate("gpu-0-3g-40gb-at-0"));
    assert!(!a.allocate("gpu-0-4g-40gb-at-0"));
    assert!(a.allocate("gpu-0-3g-40gb-at-4"));
}

#[test]
fn with_the_gate_off_or_a_slice_missing_no_partition_is_allocated() {
    let m = &H200_141GB;
    let slices = objects(&[(0, Layout::empty(m)), (1, Layout::empty(m))]);
    // The scheduler with the gate off skips the counter slices, so the pool misses slices of
    // its generation: incomplete, nothing allocated from it. (In the node's own pool this
    // would stop every GPU of the node: why partitions have a pool of their own.)
    assert!(matches!(gather(&slices, false), Pool::Incomplete));
    // Even in a pool complete without them, a device consuming counters is refused.
    let mut alone: Vec<Value> = slices
        .iter()
        .filter(|s| s["spec"]["devices"].is_array())
        .cloned()
        .collect();
    let count = alone.len();
    for s in &mut alone {
        s["spec"]["pool"]["resourceSliceCount"] = json!(count);
    }
    let pool = gather(&alone, false);
    let Pool::Ready { devices, .. } = &pool else {
        panic!("{pool:?}")
    };
    let mut a = Allocator::new(&pool, &[], false);
    assert!(!devices.is_empty() && devices.iter().all(|d| !a.allocate(&d.name)));
    // With the gate on, devices whose counter sets are not in the pool make it invalid.
    assert!(
        matches!(gather(&alone, true), Pool::Invalid(why) if why == "counter set gpu-0 not found")
    );
    // A pool written halfway (a slice of the generation missing) is not allocated from.
    for k in 0..slices.len() {
        let mut part = slices.clone();
        part.remove(k);
        assert!(
            matches!(gather(&part, true), Pool::Incomplete),
            "without {k}"
        );
    }
    // Two GPUs' counter sets are apart: one GPU full leaves the other free.
    let pool = gather(&slices, true);
    let mut a = Allocator::new(&pool, &[], true);
    assert!(a.allocate("gpu-0-7g-141gb-at-0"));
    assert!(!a.allocate("gpu-0-1g-18gb-at-6"));
    assert!(a.allocate("gpu-1-7g-141gb-at-0"));
}

#[test]
fn the_partition_slices_are_valid_for_the_api() {
    let schema = Schema::load();
    let m = &H100_80GB;
    let three = m.profile("3g.40gb").unwrap();
    let mut held = Layout::empty(m);
    held.instances.push((three, three.placement_at(0).unwrap()));
    // Nine GPUs: two counter slices (8 sets at most each), devices over several slices.
    let mut gpus: Vec<(u32, Layout)> = (0..8).map(|i| (i, Layout::empty(&H200_141GB))).collect();
    gpus.push((8, held));
    let slices = objects(&gpus);
    assert!(slices.len() >= 4, "{}", slices.len());
    for s in &slices {
        let errors = schema.check("io.k8s.api.resource.v1.ResourceSlice", s);
        assert!(errors.is_empty(), "{errors:#?}");
    }
    assert!(matches!(gather(&slices, true), Pool::Ready { .. }));
    // The check can fail: a misspelt field.
    let mut wrong = slices.last().unwrap().clone();
    wrong["spec"]["devices"][0]["consumesCounter"] = json!([]);
    assert_eq!(
        schema
            .check("io.k8s.api.resource.v1.ResourceSlice", &wrong)
            .len(),
        1
    );
}
