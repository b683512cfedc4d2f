use super::*;
use crate::devices::placement::{H100_80GB, H200_141GB};

fn gpu(index: u32, layout: Layout) -> PartitionedGpu {
    PartitionedGpu {
        uuid: format!("GPU-{index}"),
        index,
        layout,
    }
}

fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[test]
fn an_empty_gpu_offers_every_placement_of_every_profile() {
    for model in [&H100_80GB, &H200_141GB] {
        let g = gpu(3, Layout::empty(model));
        let devices = g.devices("NVIDIA H200");
        // Counted from the profiles' starts, not from the code that makes the devices.
        let starts: usize = model.profiles.iter().map(|p| p.starts.len()).sum();
        assert_eq!(devices.len(), starts);
        for d in &devices {
            let name = d["name"].as_str().unwrap();
            assert!(dns_label(name), "{name}");
            let profile = model
                .profile(d["attributes"]["migProfile"]["string"].as_str().unwrap())
                .unwrap();
            let start = u32::try_from(d["attributes"]["memorySliceStart"]["int"].as_u64().unwrap())
                .unwrap();
            let consumes = &d["consumesCounters"][0];
            assert_eq!(consumes["counterSet"], "gpu-3");
            // The slices it takes are those of its placement, and no other.
            for i in 0..MEMORY_SLICES {
                let takes = consumes["counters"].get(memory_slice(i)).is_some();
                assert_eq!(
                    takes,
                    i >= start && i < start + profile.size,
                    "{name} slice {i}"
                );
            }
            assert!(d["consumesCounters"].as_array().unwrap().len() <= 2);
            assert!(consumes["counters"].as_object().unwrap().len() <= MAX_COUNTERS_PER_SET);
            let attrs = d["attributes"].as_object().unwrap().len();
            let caps = d["capacity"].as_object().unwrap().len();
            assert!(attrs + caps <= 32);
        }
        let set = g.counter_set();
        assert!(dns_label(set["name"].as_str().unwrap()));
        let counters = set["counters"].as_object().unwrap();
        assert!(counters.len() <= MAX_COUNTERS_PER_SET);
        assert!(counters.keys().all(|k| dns_label(k)));
        assert_eq!(counters[COMPUTE_SLICES]["value"], "7");
        // `+me` is the one profile with fewer instances than starts.
        assert_eq!(counters[&instances_counter(20)]["value"], "1");
        assert_eq!(
            counters
                .keys()
                .filter(|k| k.starts_with("profile-"))
                .count(),
            1
        );
    }
}

#[test]
fn a_held_placement_is_no_device_and_its_slices_no_counter() {
    let m = &H200_141GB;
    let three = m.profile("3g.71gb").unwrap();
    let me = m.profile("1g.18gb+me").unwrap();
    let mut layout = Layout::empty(m);
    layout
        .instances
        .push((three, three.placement_at(4).unwrap()));
    layout.instances.push((me, me.placement_at(0).unwrap()));
    let g = gpu(0, layout);
    let set = g.counter_set();
    let c = &set["counters"];
    for i in 0..MEMORY_SLICES {
        let held = i == 0 || i >= 4;
        assert_eq!(
            c[memory_slice(i)]["value"],
            if held { "0" } else { "1" },
            "{i}"
        );
    }
    assert_eq!(c[COMPUTE_SLICES]["value"], "3");
    assert_eq!(c[instances_counter(20)]["value"], "0");
    let names: Vec<String> = g
        .devices("H200")
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(names.contains(&"gpu-0-2g-35gb-at-2".to_owned()));
    assert!(names.contains(&"gpu-0-1g-18gb-at-1".to_owned()));
    assert!(
        !names
            .iter()
            .any(|n| n.contains("-at-4") || n.contains("-at-0"))
    );
    assert!(!names.iter().any(|n| n.contains("me")));
}

#[test]
fn slices_keep_the_apis_limits_and_counters_apart_from_devices() {
    let gpus: Vec<(PartitionedGpu, String)> = (0..9)
        .map(|i| (gpu(i, Layout::empty(&H200_141GB)), "NVIDIA H200".to_owned()))
        .collect();
    let parts = slices("node-a", &gpus);
    let per_gpu: usize = H200_141GB.profiles.iter().map(|p| p.starts.len()).sum();
    let mut sets = 0;
    let mut devices = 0;
    for p in &parts {
        match &p.content {
            Content::Counters(c) => {
                assert!(!c.is_empty() && c.len() <= MAX_COUNTER_SETS_PER_SLICE);
                sets += c.len();
            }
            Content::Devices(d) => {
                assert!(!d.is_empty() && d.len() <= MAX_DEVICES_PER_SLICE);
                devices += d.len();
            }
        }
        let o = object("node-a", p, 4, parts.len(), None, None);
        assert!(o["spec"].get("devices").is_none() || o["spec"].get("sharedCounters").is_none());
        assert_eq!(o["spec"]["pool"]["name"], "node-a/mig");
        assert_eq!(o["spec"]["pool"]["resourceSliceCount"], parts.len());
    }
    assert_eq!(sets, 9);
    assert_eq!(devices, 9 * per_gpu);
    assert!(slices("node-a", &[]).is_empty());
}

#[test]
fn the_version_gate() {
    assert_eq!(
        kube_version(&json!({"gitVersion": "v1.35.2"})),
        Some((1, 35))
    );
    assert_eq!(
        kube_version(&json!({"gitVersion": "v1.36.0-eks-1234"})),
        Some((1, 36))
    );
    assert_eq!(
        kube_version(&json!({"major": "1", "minor": "34+"})),
        Some((1, 34))
    );
    assert_eq!(kube_version(&json!({})), None);
    assert!(!version_supported((1, 34)));
    assert!(version_supported((1, 35)));
    assert!(version_supported((2, 0)));
}
