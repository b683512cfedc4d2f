use proptest::{prelude::*, strategy::Strategy as Gen};

use super::{Strategy, *};
use std::collections::BTreeSet;

use crate::slots::{ResourceSlot, SlotValue};

fn v(s: &str) -> SlotValue {
    s.parse().unwrap()
}

fn spec(index: u32, numa: i32) -> DeviceSpec {
    DeviceSpec {
        uuid: format!("GPU-{index}"),
        index,
        memory_bytes: 16 << 30,
        sm_count: 132,
        numa_node: numa,
        parent_uuid: String::new(),
    }
}

fn node(n: u32) -> NodeAllocator {
    NodeAllocator::new(
        (0..n).map(|i| spec(i, 0)).collect(),
        AllocatorConfig::default(),
    )
}

fn shares(s: &str) -> GpuRequest {
    GpuRequest::shares(v(s))
}

fn map(a: &NodeAllocator) -> Vec<String> {
    a.alloc_map().iter().map(|d| d.shares.to_string()).collect()
}

fn part_shares(alloc: &Allocation) -> Vec<String> {
    alloc.parts.iter().map(|p| p.shares.to_string()).collect()
}

fn indices(alloc: &Allocation) -> Vec<u32> {
    alloc.parts.iter().map(|p| p.index).collect()
}

/// Holds `shares` on each device in turn (through `restore`, which doesn't check quanta).
fn preload(a: &mut NodeAllocator, held: &[&str]) {
    for (i, s) in held.iter().enumerate() {
        let d = &a.devices()[i];
        let part = DevicePart {
            index: d.spec.index,
            uuid: d.spec.uuid.clone(),
            shares: v(s),
            memory_bytes: 0,
            exclusive: false,
        };
        a.restore(&format!("pre-{i}"), Allocation { parts: vec![part] });
    }
}

/// GPU 0 whole; instances 2 and 3 of profile 1g.18gb and 4 of 3g.71gb (GPU 1 in MIG mode).
fn mig_node() -> NodeAllocator {
    let profiles: std::collections::BTreeMap<u32, String> = [
        (2, "cuda.mig.1g.18gb"),
        (3, "cuda.mig.1g.18gb"),
        (4, "cuda.mig.3g.71gb"),
    ]
    .into_iter()
    .map(|(i, p)| (i, p.to_owned()))
    .collect();
    NodeAllocator::new(
        [0, 2, 3, 4].into_iter().map(|i| spec(i, 0)).collect(),
        AllocatorConfig::default(),
    )
    .with_profiles(&profiles)
}

#[test]
fn a_profile_request_holds_idle_instances_of_that_profile_whole() {
    let mut a = mig_node();
    let one = GpuRequest::profile("cuda.mig.1g.18gb", 1);
    assert!(a.can_fit(&one));
    let first = a.allocate("m1", &one, Strategy::Binpack).unwrap();
    assert_eq!(first.parts.len(), 1);
    assert!(first.parts[0].exclusive);
    assert!([2, 3].contains(&first.parts[0].index), "{first:?}");
    let second = a.allocate("m2", &one, Strategy::Spread).unwrap();
    assert_eq!(
        indices(&first)
            .into_iter()
            .chain(indices(&second))
            .collect::<BTreeSet<_>>(),
        BTreeSet::from([2, 3])
    );
    // No idle 1g instance is left, though a whole GPU and a 3g instance are.
    assert!(!a.can_fit(&one));
    assert!(matches!(
        a.allocate("m3", &one, Strategy::Binpack),
        Err(AllocError::NotEnoughInstances { idle: 0, .. })
    ));
    let big = GpuRequest::profile("cuda.mig.3g.71gb", 1);
    assert_eq!(
        indices(&a.allocate("m4", &big, Strategy::Binpack).unwrap()),
        [4]
    );
    // Fractions and whole devices still land where there is room: GPU 0 only now.
    assert_eq!(
        indices(&a.allocate("s", &shares("0.5"), Strategy::Binpack).unwrap()),
        [0]
    );
    assert!(!a.can_fit(&GpuRequest::devices(1)));
    a.release("m1");
    assert!(a.can_fit(&one));
    // Two instances of it can't be had now: one is idle.
    assert!(!a.can_fit(&GpuRequest::profile("cuda.mig.1g.18gb", 2)));
}

#[test]
fn a_profile_is_read_from_its_slot_and_combines_with_no_other_gpu_slot() {
    let slots = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .fold(ResourceSlot::new(), |r, (k, val)| r.with(k, v(val)))
    };
    let r = GpuRequest::from_slots(&slots(&[("cuda.mig.1g.18gb", "2"), ("cpu", "1")])).unwrap();
    assert_eq!(
        (r.devices, r.profile.as_deref()),
        (2, Some("cuda.mig.1g.18gb"))
    );
    for other in [
        ("cuda.shares", "0.5"),
        ("cuda.device", "1"),
        ("cuda.mig.3g.71gb", "1"),
    ] {
        let err = GpuRequest::from_slots(&slots(&[("cuda.mig.1g.18gb", "1"), other]));
        assert!(
            matches!(err, Err(GpuRequestError::ProfileAndOther { .. })),
            "{other:?}: {err:?}"
        );
    }
    assert!(matches!(
        GpuRequest::from_slots(&slots(&[("cuda.mig.1g.18gb", "0.5")])),
        Err(GpuRequestError::NotWhole { .. })
    ));
}

#[test]
fn backend_ai_documented_case() {
    let mut a = node(2);
    let first = a.allocate("s1", &shares("0.2"), Strategy::Binpack).unwrap();
    assert_eq!(part_shares(&first), ["0.2"]);
    let second = a.allocate("s2", &shares("1.2"), Strategy::Binpack).unwrap();
    assert_eq!(part_shares(&second), ["0.6", "0.6"]);
    assert_eq!(map(&a), ["0.8", "0.6"]);
    // The same with spreading: the first session lands on an empty device either way.
    let mut b = node(2);
    b.allocate("s1", &shares("0.2"), Strategy::Spread).unwrap();
    b.allocate("s2", &shares("1.2"), Strategy::Spread).unwrap();
    assert_eq!(map(&b), ["0.8", "0.6"]);
}

#[test]
fn splits_add_up_to_exactly_what_was_asked() {
    let mut a = node(2);
    let alloc = a.allocate("s", &shares("1.75"), Strategy::Binpack).unwrap();
    assert_eq!(part_shares(&alloc), ["0.88", "0.87"]);
    assert_eq!(alloc.shares(), v("1.75"));
    assert_eq!(
        split(v("2.5"), 3, v("0.01")).unwrap(),
        [v("0.84"), v("0.83"), v("0.83")]
    );
    assert_eq!(split(v("1.2"), 2, v("0.01")).unwrap(), [v("0.6"), v("0.6")]);
    assert_eq!(
        split(v("0.01"), 2, v("0.01")),
        Err(AllocError::PartRoundsToZero {
            requested: v("0.01"),
            devices: 2,
            quantum: v("0.01")
        })
    );
    assert!(matches!(
        split(v("0.015"), 1, v("0.01")),
        Err(AllocError::Request(
            GpuRequestError::NotMultipleOfQuantum { .. }
        ))
    ));
}

#[test]
fn splits_use_the_fewest_devices() {
    let mut a = node(4);
    preload(&mut a, &["0.5", "0.5", "0.5"]); // free: 0.5 0.5 0.5 1.0
    // 1.2 over two would need two devices with 0.6 free; three hold 0.4 each.
    let alloc = a.allocate("s", &shares("1.2"), Strategy::Binpack).unwrap();
    assert_eq!(part_shares(&alloc), ["0.4", "0.4", "0.4"]);
    assert_eq!(
        indices(&alloc),
        [0, 1, 2],
        "the fullest devices that hold the parts"
    );
    // Two devices suffice when one has room for the larger part.
    let mut b = node(3);
    preload(&mut b, &["0.5", "0.4"]); // free: 0.5 0.6 1.0
    let alloc = b.allocate("s", &shares("1.2"), Strategy::Binpack).unwrap();
    assert_eq!(indices(&alloc), [1, 2]);
}

#[test]
fn refuses_with_reasons() {
    let mut a = node(2);
    let err = a
        .allocate("s", &shares("0.005"), Strategy::Binpack)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "cuda.shares=0.005 rounds to zero on each of 1 device(s) in quanta of 0.01"
    );
    let err = a
        .allocate("s", &shares("0.015"), Strategy::Binpack)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "cuda.shares=0.015 is not a multiple of the quantum 0.01"
    );
    let err = a
        .allocate("s", &shares("2.5"), Strategy::Binpack)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "cuda.shares=2.5 with cuda.mem=0 fits on no set of the node's 2 devices \
         (2 shares free, at most 1 on one)"
    );
    assert!(!a.can_fit(&shares("0.005")));
    assert!(!a.can_fit(&shares("0.015")));
    assert!(
        map(&a).iter().all(|s| s == "0"),
        "a refused request reserved nothing"
    );
    assert!(a.sessions().next().is_none());
}

#[test]
fn parts_that_round_below_the_quantum_are_refused() {
    let mut a = node(4);
    // Each device has 0.005 free: 0.02 would need four devices at 0.005, below the quantum.
    preload(&mut a, &["0.995", "0.995", "0.995", "0.995"]);
    let err = a
        .allocate("s", &shares("0.02"), Strategy::Binpack)
        .unwrap_err();
    assert_eq!(
        err,
        AllocError::PartRoundsToZero {
            requested: v("0.02"),
            devices: 4,
            quantum: v("0.01")
        }
    );
    assert!(!a.can_fit(&shares("0.02")));
}

#[test]
fn devices_and_shares_together_are_an_error() {
    let both = ResourceSlot::parse_any(&["cuda.device=1", "cuda.shares=0.5"]).unwrap();
    assert_eq!(
        GpuRequest::from_slots(&both),
        Err(GpuRequestError::DeviceAndShares)
    );
    let mut a = node(2);
    let request = GpuRequest {
        shares: v("0.5"),
        devices: 1,
        memory_bytes: 0,
        profile: None,
    };
    assert_eq!(
        a.allocate("s", &request, Strategy::Binpack),
        Err(AllocError::Request(GpuRequestError::DeviceAndShares))
    );
    assert!(!a.can_fit(&request));
    let half = ResourceSlot::new().with("cuda.device", v("1.5"));
    assert_eq!(
        GpuRequest::from_slots(&half),
        Err(GpuRequestError::NotWhole {
            slot: "cuda.device",
            value: v("1.5")
        })
    );
    let gpu = ResourceSlot::parse_any(&["cuda.shares=0.5", "cuda.mem=8g", "cpu=2"]).unwrap();
    assert_eq!(
        GpuRequest::from_slots(&gpu),
        Ok(shares("0.5").with_memory(8 << 30))
    );
}

#[test]
fn binpack_fills_and_spread_spreads() {
    let mut packed = node(3);
    packed
        .allocate("a", &shares("0.5"), Strategy::Binpack)
        .unwrap();
    packed
        .allocate("b", &shares("0.3"), Strategy::Binpack)
        .unwrap();
    assert_eq!(map(&packed), ["0.8", "0", "0"]);
    let mut spread = node(3);
    spread
        .allocate("a", &shares("0.5"), Strategy::Spread)
        .unwrap();
    spread
        .allocate("b", &shares("0.3"), Strategy::Spread)
        .unwrap();
    assert_eq!(map(&spread), ["0.5", "0.3", "0"]);
    // Splits too: packing takes the fullest devices that hold a part, spreading the emptiest.
    let mut a = node(4);
    preload(&mut a, &["0", "0", "0.3", "0.4"]); // free: 1 1 0.7 0.6
    let mut b = a.clone();
    let packed = a.allocate("s", &shares("1.2"), Strategy::Binpack).unwrap();
    assert_eq!(indices(&packed), [2, 3]);
    let spread = b.allocate("s", &shares("1.2"), Strategy::Spread).unwrap();
    assert_eq!(indices(&spread), [0, 1]);
}

#[test]
fn whole_devices_are_exclusive() {
    let mut a = node(2);
    let whole = GpuRequest::devices(1);
    let alloc = a.allocate("w", &whole, Strategy::Binpack).unwrap();
    assert!(alloc.parts[0].exclusive);
    assert_eq!(alloc.parts[0].shares, SlotValue::ONE);
    assert_eq!(alloc.parts[0].memory_bytes, 16 << 30);
    assert_eq!(a.devices()[0].exclusive_owner.as_deref(), Some("w"));
    // Nothing else lands on it, not even a small share.
    a.allocate("f", &shares("0.9"), Strategy::Binpack).unwrap();
    assert_eq!(indices(a.allocation("f").unwrap()), [1]);
    assert!(!a.can_fit(&shares("0.2")));
    assert!(a.allocate("g", &shares("0.2"), Strategy::Binpack).is_err());
    // A device with any share taken is not idle: no whole device is left.
    let err = a.allocate("w2", &whole, Strategy::Binpack).unwrap_err();
    assert_eq!(
        err.to_string(),
        "cuda.device=1: 0 of the node's 2 devices are idle"
    );
    a.release("w");
    assert_eq!(a.devices()[0].exclusive_owner, None);
    assert!(a.allocate("w2", &whole, Strategy::Binpack).is_ok());
}

#[test]
fn whole_devices_check_memory() {
    let mut a = node(2);
    let err = a
        .allocate(
            "w",
            &GpuRequest::devices(1).with_memory(20 << 30),
            Strategy::Binpack,
        )
        .unwrap_err();
    assert!(
        matches!(err, AllocError::WholeDevicesLackMemory { .. }),
        "{err}"
    );
    let alloc = a
        .allocate(
            "w",
            &GpuRequest::devices(2).with_memory(20 << 30),
            Strategy::Binpack,
        )
        .unwrap();
    assert_eq!(indices(&alloc), [0, 1]);
}

#[test]
fn memory_is_checked_and_split_with_the_shares() {
    let mut a = node(2);
    let req = shares("1.5").with_memory(24 << 30);
    let alloc = a.allocate("m", &req, Strategy::Binpack).unwrap();
    let mem: Vec<u64> = alloc.parts.iter().map(|p| p.memory_bytes).collect();
    assert_eq!(mem, [12 << 30, 12 << 30]);
    assert_eq!(alloc.memory_bytes(), 24 << 30);
    // 4 GiB are left on each device: the shares fit, the memory doesn't, even split.
    let split_memory = shares("0.1").with_memory(6 << 30);
    assert_eq!(
        indices(
            &a.clone()
                .allocate("n", &split_memory, Strategy::Binpack)
                .unwrap()
        ),
        [0, 1]
    );
    let too_much = shares("0.1").with_memory(9 << 30);
    assert!(!a.can_fit(&too_much));
    assert!(a.allocate("n", &too_much, Strategy::Binpack).is_err());
    // Uneven parts: the memory follows the shares, the remainder on the larger part.
    let mut b = node(2);
    let alloc = b
        .allocate("u", &shares("1.75").with_memory(1000), Strategy::Binpack)
        .unwrap();
    let mem: Vec<u64> = alloc.parts.iter().map(|p| p.memory_bytes).collect();
    assert_eq!(mem, [503, 497]); // 1000 × 0.88 / 1.75 = 502.9, 1000 × 0.87 / 1.75 = 497.1
    // Memory alone reserves memory on one device and no shares.
    let alloc = b
        .allocate(
            "mem-only",
            &GpuRequest::default().with_memory(1 << 30),
            Strategy::Binpack,
        )
        .unwrap();
    assert_eq!(alloc.shares(), SlotValue::ZERO);
    assert_eq!(alloc.memory_bytes(), 1 << 30);
}

#[test]
fn memory_steers_a_split() {
    // Device 0 has the most free shares but little memory; the split goes around it.
    let mut a = node(3);
    a.restore(
        "hog",
        Allocation {
            parts: vec![DevicePart {
                index: 0,
                uuid: "GPU-0".into(),
                shares: SlotValue::ZERO,
                memory_bytes: 15 << 30,
                exclusive: false,
            }],
        },
    );
    preload(&mut a, &["0", "0.5", "0.5"]);
    let req = shares("1").with_memory(8 << 30);
    assert!(a.can_fit(&req));
    for strategy in [Strategy::Binpack, Strategy::Spread] {
        let alloc = a.clone().allocate("s", &req, strategy).unwrap();
        assert_eq!(indices(&alloc), [1, 2], "{strategy:?}");
    }
}

#[test]
fn splits_prefer_one_numa_node() {
    let specs = vec![spec(0, 0), spec(1, 1), spec(2, 1), spec(3, 0)];
    let mut a = NodeAllocator::new(specs, AllocatorConfig::default());
    a.allocate("x", &shares("0.5"), Strategy::Binpack).unwrap(); // on device 0 (numa 0)
    let alloc = a.allocate("y", &shares("1.6"), Strategy::Binpack).unwrap();
    assert_eq!(indices(&alloc), [1, 2], "both on numa 1");
    // Whole devices too: both from one node while one has enough idle devices.
    let mut b = NodeAllocator::new(
        vec![spec(0, 0), spec(1, 1), spec(2, 0), spec(3, 1)],
        AllocatorConfig::default(),
    );
    let alloc = b
        .allocate("w", &GpuRequest::devices(2), Strategy::Binpack)
        .unwrap();
    assert_eq!(indices(&alloc), [0, 2]);
    let alloc = b
        .allocate("w2", &GpuRequest::devices(2), Strategy::Binpack)
        .unwrap();
    assert_eq!(indices(&alloc), [1, 3]);
    // Across nodes when no node has enough.
    let mut c = NodeAllocator::new(vec![spec(0, 0), spec(1, 1)], AllocatorConfig::default());
    let alloc = c
        .allocate("w", &GpuRequest::devices(2), Strategy::Binpack)
        .unwrap();
    assert_eq!(indices(&alloc), [0, 1]);
}

#[test]
fn unit_mem_and_unit_proc_set_capacity() {
    let config = AllocatorConfig {
        unit_mem: Some(5 << 30),
        unit_proc: Some(40),
        ..AllocatorConfig::default()
    };
    // 16 GiB / 5 GiB = 3.2; 132 / 40 = 3.3 → 3.2.
    assert_eq!(share_capacity(&spec(0, 0), &config), v("3.2"));
    // Rounded down to the quantum: 16 GiB / 3 GiB = 5.333… → 5.33.
    let config3 = AllocatorConfig {
        unit_mem: Some(3 << 30),
        unit_proc: None,
        ..AllocatorConfig::default()
    };
    assert_eq!(share_capacity(&spec(0, 0), &config3), v("5.33"));
    let proc_only = AllocatorConfig {
        unit_proc: Some(64),
        quantum: v("0.5"),
        ..AllocatorConfig::default()
    };
    assert_eq!(share_capacity(&spec(0, 0), &proc_only), v("2")); // 132 / 64 = 2.06 → 2
    assert_eq!(
        share_capacity(&spec(0, 0), &AllocatorConfig::default()),
        v("1")
    );
    let mut a = NodeAllocator::new(vec![spec(0, 0), spec(1, 0)], config);
    assert_eq!(a.capacity().get("cuda.shares"), v("6.4"));
    assert_eq!(a.capacity().get("cuda.device"), v("2"));
    assert_eq!(a.capacity().get("cuda.mem"), SlotValue::from_int(32 << 30));
    let alloc = a.allocate("s", &shares("3"), Strategy::Binpack).unwrap();
    assert_eq!(part_shares(&alloc), ["3"]);
    let alloc = a.allocate("t", &shares("3"), Strategy::Binpack).unwrap();
    assert_eq!(part_shares(&alloc), ["3"]);
    assert!(!a.can_fit(&shares("0.5")));
    assert!(a.can_fit(&shares("0.4")), "0.2 + 0.2 on two devices");
}

#[test]
fn release_is_idempotent_and_restores_capacity() {
    let mut a = node(2);
    a.allocate("s", &shares("1.2"), Strategy::Binpack).unwrap();
    assert!(a.release("s").is_some());
    assert!(a.release("s").is_none());
    assert!(a.release("never").is_none());
    assert_eq!(map(&a), ["0", "0"]);
    assert!(a.devices().iter().all(DeviceState::is_idle));
    assert!(a.can_fit(&shares("2")));
    assert!(!a.can_fit(&shares("2.01")));
    assert!(a.allocate("s", &shares("0.1"), Strategy::Binpack).is_ok());
    assert_eq!(
        a.allocate("s", &shares("0.1"), Strategy::Binpack),
        Err(AllocError::AlreadyAllocated {
            session: "s".into()
        })
    );
}

#[test]
fn serde_keeps_the_state_and_rebuilds_the_indexes() {
    let mut a = NodeAllocator::new(
        vec![spec(0, 0), spec(1, 1), spec(2, 1)],
        AllocatorConfig::default(),
    );
    a.allocate("s", &shares("0.7"), Strategy::Binpack).unwrap();
    a.allocate("w", &GpuRequest::devices(1), Strategy::Binpack)
        .unwrap();
    let json = serde_json::to_string(&a).unwrap();
    let back: NodeAllocator = serde_json::from_str(&json).unwrap();
    assert_eq!(back, a);
    assert_eq!(back.free(), a.free());
    for s in ["0.3", "0.4", "1", "1.3", "1.31"] {
        assert_eq!(back.can_fit(&shares(s)), a.can_fit(&shares(s)), "{s}");
    }
}

fn request() -> impl Gen<Value = GpuRequest> {
    let memory = prop_oneof![3 => Just(0u64), 1 => 0u64..(20 << 30)];
    prop_oneof![
        6 => (1u128..300, memory.clone()).prop_map(|(hundredths, memory)| GpuRequest {
            shares: SlotValue::from_micros(hundredths * 10_000),
            devices: 0,
            memory_bytes: memory,
            profile: None,
        }),
        1 => (1u32..4, memory.clone()).prop_map(|(n, memory)| GpuRequest::devices(n).with_memory(memory)),
        1 => (1u64..(8 << 30)).prop_map(|memory| GpuRequest::default().with_memory(memory)),
    ]
}

#[derive(Debug, Clone)]
enum Op {
    Allocate(GpuRequest, bool),
    Release(usize),
}

fn ops() -> impl Gen<Value = Vec<Op>> {
    proptest::collection::vec(
        prop_oneof![
            3 => (request(), any::<bool>()).prop_map(|(r, spread)| Op::Allocate(r, spread)),
            1 => (0usize..16).prop_map(Op::Release),
        ],
        1..24,
    )
}

fn devices() -> impl Gen<Value = Vec<DeviceSpec>> {
    proptest::collection::vec((0i32..2, prop::sample::select(vec![8u64, 16, 80])), 1..9).prop_map(
        |specs| {
            specs
                .into_iter()
                .enumerate()
                .map(|(i, (numa, gib))| DeviceSpec {
                    memory_bytes: gib << 30,
                    ..spec(u32::try_from(i).unwrap(), numa)
                })
                .collect()
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn splits_are_near_even_and_exact(hundredths in 1u128..100_000, k in 1usize..12) {
        let q = v("0.01");
        let total = SlotValue::from_micros(hundredths * 10_000);
        match split(total, k, q) {
            Ok(parts) => {
                prop_assert_eq!(parts.len(), k);
                let sum = parts.iter().fold(SlotValue::ZERO, |a, p| a.checked_add(*p).unwrap());
                prop_assert_eq!(sum, total);
                prop_assert!(parts.iter().all(|p| p.is_multiple_of(q) && *p >= q));
                prop_assert!(parts.windows(2).all(|w| w[0] >= w[1]));
                prop_assert!(parts[0].checked_sub(parts[k - 1]).unwrap() <= q);
            }
            Err(e) => {
                prop_assert!(hundredths < k as u128);
                prop_assert!(
                    matches!(e, AllocError::PartRoundsToZero { .. }),
                    "{}", e
                );
            }
        }
    }

    #[test]
    fn allocations_are_exact_atomic_and_agree_with_can_fit(specs in devices(), ops in ops()) {
        let mut a = NodeAllocator::new(specs, AllocatorConfig::default());
        let mut live: Vec<String> = Vec::new();
        for (n, op) in ops.into_iter().enumerate() {
            match op {
                Op::Allocate(req, spread) => {
                    let strategy = if spread { Strategy::Spread } else { Strategy::Binpack };
                    let fits = a.can_fit(&req);
                    let other = a.clone().allocate("probe", &req, strategy.other());
                    let before = a.clone();
                    let id = format!("s{n}");
                    match a.allocate(&id, &req, strategy) {
                        Ok(alloc) => {
                            prop_assert!(fits, "can_fit said no to {:?}", req);
                            prop_assert!(other.is_ok(), "the other strategy refused {:?}", req);
                            if req.devices > 0 {
                                prop_assert_eq!(alloc.parts.len(), req.devices as usize);
                                prop_assert!(alloc.parts.iter().all(|p| p.exclusive));
                                prop_assert!(alloc.memory_bytes() >= req.memory_bytes);
                            } else {
                                prop_assert_eq!(alloc.shares(), req.shares);
                                prop_assert_eq!(alloc.memory_bytes(), req.memory_bytes);
                                let q = a.config().effective_quantum();
                                prop_assert!(alloc.parts.iter().all(|p| p.shares.is_multiple_of(q)));
                            }
                            live.push(id);
                        }
                        Err(e) => {
                            prop_assert!(!fits, "can_fit said yes to {:?}: {}", req, e);
                            prop_assert!(other.is_err());
                            prop_assert_eq!(&a, &before, "a refusal changed nothing");
                        }
                    }
                }
                Op::Release(i) => {
                    if !live.is_empty() {
                        let id = live.remove(i % live.len());
                        prop_assert!(a.release(&id).is_some());
                        prop_assert!(a.release(&id).is_none());
                    }
                }
            }
            // Every device holds what its sessions' parts say, within its capacity.
            for d in a.devices() {
                prop_assert!(d.allocated <= d.capacity);
                prop_assert!(d.allocated_memory <= d.spec.memory_bytes);
                let held: Vec<&DevicePart> = a
                    .sessions()
                    .flat_map(|s| a.allocation(s).unwrap().parts.iter())
                    .filter(|p| p.index == d.spec.index)
                    .collect();
                let sum = held.iter().fold(SlotValue::ZERO, |acc, p| acc.checked_add(p.shares).unwrap());
                prop_assert_eq!(sum, d.allocated);
                if d.is_exclusive() {
                    prop_assert_eq!(held.len(), 1);
                }
            }
        }
        for id in live {
            a.release(&id);
        }
        prop_assert!(a.devices().iter().all(|d| d.is_idle() && d.allocated.is_zero()));
    }
}
