use super::*;

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
    }
}

fn node(n: u32) -> NodeAllocator {
    NodeAllocator::new(
        (0..n).map(|i| spec(i, 0)).collect(),
        AllocatorConfig::default(),
    )
}

fn shares(s: &str) -> GpuRequest {
    GpuRequest {
        shares: v(s),
        ..GpuRequest::default()
    }
}

fn map(a: &NodeAllocator) -> Vec<String> {
    a.devices()
        .iter()
        .map(|d| d.allocated.to_string())
        .collect()
}

#[test]
fn backend_ai_documented_case() {
    let mut a = node(2);
    let first = a.allocate("s1", &shares("0.2"), Strategy::Binpack).unwrap();
    assert_eq!(first.parts.len(), 1);
    let second = a.allocate("s2", &shares("1.2"), Strategy::Binpack).unwrap();
    let parts: Vec<String> = second.parts.iter().map(|p| p.shares.to_string()).collect();
    assert_eq!(parts, ["0.6", "0.6"]);
    assert_eq!(map(&a), ["0.8", "0.6"]);
}

#[test]
fn splits_add_up_to_exactly_what_was_asked() {
    let mut a = node(2);
    let alloc = a.allocate("s", &shares("1.75"), Strategy::Binpack).unwrap();
    let parts: Vec<String> = alloc.parts.iter().map(|p| p.shares.to_string()).collect();
    assert_eq!(parts, ["0.88", "0.87"]);
    assert_eq!(
        split(v("2.5"), 3, v("0.01")).unwrap(),
        vec![v("0.84"), v("0.83"), v("0.83")]
    );
    assert_eq!(
        split(v("0.01"), 2, v("0.01")),
        Err(AllocError::PartRoundsToZero {
            requested: v("0.01"),
            devices: 2,
            quantum: v("0.01")
        })
    );
}

#[test]
fn refuses_with_reasons() {
    let mut a = node(2);
    let err = a
        .allocate("s", &shares("0.005"), Strategy::Binpack)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "cuda.shares=0.005 is not a multiple of the quantum 0.01"
    );
    let err = a
        .allocate("s", &shares("2.5"), Strategy::Binpack)
        .unwrap_err();
    assert!(matches!(err, AllocError::Insufficient(_)), "{err}");
    let both = ResourceSlot::parse_any(&["cuda.device=1", "cuda.shares=0.5"]).unwrap();
    assert_eq!(
        GpuRequest::from_slots(&both),
        Err(AllocError::DeviceAndShares)
    );
    assert!(
        map(&a).iter().all(|s| s == "0"),
        "a refused request reserved nothing"
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
}

#[test]
fn whole_devices_are_exclusive() {
    let mut a = node(2);
    let whole = GpuRequest {
        devices: 1,
        ..GpuRequest::default()
    };
    let alloc = a.allocate("w", &whole, Strategy::Binpack).unwrap();
    assert!(alloc.parts[0].exclusive);
    assert_eq!(alloc.parts[0].shares, SlotValue::ONE);
    // Nothing else lands on it, not even a small share.
    a.allocate("f", &shares("0.9"), Strategy::Binpack).unwrap();
    assert_eq!(a.allocation("f").unwrap().parts[0].index, 1);
    assert!(a.allocate("g", &shares("0.2"), Strategy::Binpack).is_err());
    assert!(a.allocate("w2", &whole, Strategy::Binpack).is_err());
    a.release("w");
    assert!(a.allocate("w2", &whole, Strategy::Binpack).is_ok());
}

#[test]
fn memory_is_checked_and_split_with_the_shares() {
    let mut a = node(2);
    let req = GpuRequest {
        shares: v("1.5"),
        devices: 0,
        memory_bytes: 24 << 30,
    };
    let alloc = a.allocate("m", &req, Strategy::Binpack).unwrap();
    let mem: Vec<u64> = alloc.parts.iter().map(|p| p.memory_bytes).collect();
    assert_eq!(mem.iter().sum::<u64>(), 24 << 30);
    assert_eq!(mem, [12 << 30, 12 << 30]);
    let too_much = GpuRequest {
        shares: v("0.1"),
        devices: 0,
        memory_bytes: 9 << 30,
    };
    assert!(a.allocate("n", &too_much, Strategy::Binpack).is_err());
}

#[test]
fn splits_prefer_one_numa_node() {
    let specs = vec![spec(0, 0), spec(1, 1), spec(2, 1), spec(3, 0)];
    let mut a = NodeAllocator::new(specs, AllocatorConfig::default());
    a.allocate("x", &shares("0.5"), Strategy::Binpack).unwrap(); // on device 0 (numa 0)
    let alloc = a.allocate("y", &shares("1.6"), Strategy::Binpack).unwrap();
    let numa: BTreeSet<i32> = alloc
        .parts
        .iter()
        .map(|p| a.devices()[p.index as usize].spec.numa_node)
        .collect();
    assert_eq!(numa.len(), 1, "{alloc:?}");
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
    let a = NodeAllocator::new(vec![spec(0, 0), spec(1, 0)], config);
    assert_eq!(a.capacity().get("cuda.shares"), v("6.4"));
}

#[test]
fn release_is_idempotent_and_restores_capacity() {
    let mut a = node(2);
    a.allocate("s", &shares("1.2"), Strategy::Binpack).unwrap();
    assert!(a.release("s").is_some());
    assert!(a.release("s").is_none());
    assert_eq!(map(&a), ["0", "0"]);
    assert!(a.can_fit(&shares("2")));
    assert!(!a.can_fit(&shares("2.01")));
    assert!(a.allocate("s", &shares("0.1"), Strategy::Binpack).is_ok());
    assert!(matches!(
        a.allocate("s", &shares("0.1"), Strategy::Binpack),
        Err(AllocError::AlreadyAllocated(_))
    ));
}
