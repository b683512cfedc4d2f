use std::cmp::Ordering;

use proptest::prelude::*;

use super::*;

fn v(s: &str) -> SlotValue {
    s.parse().unwrap()
}

fn parse(tokens: &[&str]) -> Result<ResourceSlot, ParseError> {
    ResourceSlot::parse_any(tokens)
}

fn name(s: &str) -> SlotName {
    SlotName::new(s).unwrap()
}

fn registry(types: &[(&str, SlotKind)]) -> SlotTypeRegistry {
    let mut r = SlotTypeRegistry::new();
    let declared: Vec<_> = types.iter().map(|(n, k)| (name(n), *k)).collect();
    r.merge("test", &declared).unwrap();
    r
}

#[test]
fn fractions_are_exact() {
    assert_eq!(v("0.2").checked_add(v("0.4")), Some(v("0.6")));
    assert_eq!(v("0.1").checked_add(v("0.2")).unwrap().to_string(), "0.3");
    assert_eq!(v("1.000000").to_string(), "1");
    assert_eq!(
        v("0.10000000000000000000000000000000000000000").to_string(),
        "0.1"
    );
    assert_eq!(v(".5").to_string(), "0.5");
    assert_eq!(v("007.250").to_string(), "7.25");
    assert_eq!(v("0.000001").to_string(), "0.000001");
    assert_eq!(v("1").checked_sub(v("1.000001")), None);
    assert_eq!(v("2.5").floor_to(v("0.3")), v("2.4"));
    assert_eq!(SlotValue::from_int(3).to_u64(), Some(3));
    assert_eq!(v("0.5").to_u64(), None);
}

#[test]
fn values_that_are_not_numbers_are_refused() {
    for text in [
        "", ".", "1.", "+1", "-1", "1e3", "0x10", "1,5", " 1", "1.2.3", "inf",
    ] {
        assert!(
            matches!(
                text.parse::<SlotValue>(),
                Err(ValueError::NotANumber { .. })
            ),
            "{text:?}"
        );
    }
    assert!(matches!(
        "0.0000001".parse::<SlotValue>(),
        Err(ValueError::TooPrecise { .. })
    ));
    assert!(matches!(
        "1000000000000000000000000000000000".parse::<SlotValue>(),
        Err(ValueError::TooLarge { .. })
    ));
}

#[test]
fn parses_what_users_type() {
    let r = parse(&["cpu=1", "mem=2g", "cuda.shares=0.2", "cuda.mem=8g"]).unwrap();
    assert_eq!(r.get("cpu"), SlotValue::from_int(1));
    assert_eq!(r.get("mem"), SlotValue::from_int(2 << 30));
    assert_eq!(r.get("cuda.shares"), v("0.2"));
    assert_eq!(r.get("cuda.mem"), SlotValue::from_int(8 << 30));
    assert_eq!(r.get("absent"), SlotValue::ZERO);
    let mem = |t: &str| parse(&[t]).unwrap().get("mem");
    assert_eq!(mem("mem=512m"), SlotValue::from_int(512 << 20));
    assert_eq!(mem("mem=1.5Gi"), SlotValue::from_int(3 << 29));
    assert_eq!(mem("mem=1.5GiB"), SlotValue::from_int(3 << 29));
    assert_eq!(mem("mem=2GB"), SlotValue::from_int(2 << 30));
    assert_eq!(mem("mem=4096"), SlotValue::from_int(4096));
    assert_eq!(mem("mem=4096b"), SlotValue::from_int(4096));
    assert_eq!(mem("mem=0.5k"), SlotValue::from_int(512));
    assert_eq!(mem("mem = 1k "), SlotValue::from_int(1024));
    // Exabytes are exact: 16 EiB is 2^64 bytes, past u64.
    assert_eq!(mem("mem=16e").trunc(), 1u128 << 64);
    assert_eq!(mem("mem=1.5e").to_u64(), Some(3 << 59));
    assert_eq!(
        parse(&["cuda.device=1"]).unwrap().get("cuda.device"),
        SlotValue::ONE
    );
    assert!(parse(&[]).unwrap().is_zero());
    assert!(parse(&["cpu=0"]).unwrap().is_zero(), "zeros are not stored");
}

#[test]
fn byte_sizes_as_backend_ai_takes_them_parse_in_a_request() {
    let r = parse(&["mem=1 KiB", "cuda.mem=2 KiBytes"]).unwrap();
    assert_eq!(r.to_string(), "cuda.mem=2k,mem=1k");
    let mem = |t: &str| parse(&[t]).unwrap().get("mem").trunc();
    assert_eq!(mem("mem=12_345 bytes"), 12_345);
    assert_eq!(mem("mem = 11_021_204"), 11_021_204);
    let err = parse(&["mem=1.1k"]).unwrap_err().to_string();
    assert_eq!(
        err,
        "invalid value \"1.1k\" for slot \"mem\": not a whole number of bytes \
         (1126.4 bytes; the nearest whole number is 1126)"
    );
    // Counts stay plain decimals.
    assert!(parse(&["cpu=1_000"]).is_err());
}

#[test]
fn errors_name_the_bad_token() {
    assert_eq!(
        parse(&["mem=2x"]).unwrap_err().to_string(),
        "invalid value \"2x\" for slot \"mem\": unknown unit suffix \"x\" \
         (use k, m, g, t, p or e, optionally followed by i, b or ib)"
    );
    let cases: &[(&[&str], &str)] = &[
        (&["cpu"], "invalid resource \"cpu\": expected name=value"),
        (&["=1"], "invalid resource \"=1\": invalid slot name \"\""),
        (&["CPU=1"], "invalid resource \"CPU=1\""),
        (
            &["cpu=abc"],
            "invalid value \"abc\" for slot \"cpu\": not a decimal",
        ),
        (&["cpu="], "invalid value \"\" for slot \"cpu\""),
        (&["cpu=-1"], "\"-1\""),
        (&["cpu=1e3"], "\"1e3\""),
        (&["cpu=0.0000001"], "more than 6 fractional digits"),
        (
            &["mem=0.3k"],
            "\"0.3k\" for slot \"mem\": not a whole number of bytes",
        ),
        (&["mem=1.5kk"], "unknown unit suffix \"kk\""),
        (&["mem=g"], "\"g\" for slot \"mem\": not a decimal number"),
        (&["cuda.mem=1zb"], "unknown unit suffix \"zb\""),
        (
            &["cpu=1", "mem=1g", "cpu=2"],
            "slot \"cpu\" given twice: \"cpu=1\" and \"cpu=2\"",
        ),
        (
            &["cuda.device=0.5"],
            "\"0.5\" for slot \"cuda.device\": cuda.device takes whole",
        ),
    ];
    for (tokens, needle) in cases {
        let err = parse(tokens).expect_err(&format!("{tokens:?} parsed"));
        assert!(err.to_string().contains(needle), "{tokens:?}: {err}");
    }
}

#[test]
fn a_registry_decides_names_and_kinds() {
    let r = registry(&[
        ("cpu", SlotKind::Count),
        ("cuda.shares", SlotKind::Count),
        ("mock.mem", SlotKind::Bytes),
        ("mock.lock", SlotKind::Unique),
    ]);
    let err = ResourceSlot::parse_requests(&["tpu=1"], Some(&r)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown slot type \"tpu\" (known: cpu, cuda.shares, mock.lock, mock.mem)"
    );
    // Without a registry an unknown name is a count; with one, its registered kind.
    assert!(parse(&["mock.mem=1g"]).is_err());
    let ok = ResourceSlot::parse_requests(&["mock.mem=1g", "mock.lock=1"], Some(&r)).unwrap();
    assert_eq!(ok.get("mock.mem"), SlotValue::from_int(1 << 30));
    let err = ResourceSlot::parse_requests(&["mock.lock=2"], Some(&r)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid value \"2\" for slot \"mock.lock\": a unique slot can only be requested as 1"
    );
}

#[test]
fn unique_slots_are_requested_as_one() {
    assert_eq!(
        parse_value("x.lock", "1", SlotKind::Unique),
        Ok(SlotValue::ONE)
    );
    assert_eq!(
        parse_value("x.lock", "1.0", SlotKind::Unique),
        Ok(SlotValue::ONE)
    );
    for bad in ["2", "0.5", "0"] {
        let err = parse_value("x.lock", bad, SlotKind::Unique).unwrap_err();
        assert!(err.to_string().contains("only be requested as 1"), "{err}");
    }
}

#[test]
fn absent_keys_are_zero_and_the_order_is_partial() {
    let a = parse(&["cpu=1"]).unwrap();
    let b = parse(&["cuda.shares=0.5"]).unwrap();
    assert!(!a.fits_in(&b) && !b.fits_in(&a));
    assert_eq!(a.partial_cmp(&b), None);
    assert!(a.partial_cmp(&b).is_none() && a != b);
    let ab = (&a + &b).unwrap();
    assert!(a <= ab && b <= ab && a < ab);
    assert_eq!((&ab - &b).unwrap(), a);
    assert_eq!(
        (&a - &b).unwrap_err(),
        ArithmeticError::Underflow {
            slot: name("cuda.shares"),
            have: SlotValue::ZERO,
            take: v("0.5"),
        }
    );
    assert_eq!(
        (&a - &b).unwrap_err().to_string(),
        "slot cuda.shares: 0 - 0.5 is negative"
    );
    assert_eq!(a.saturating_sub(&ab), ResourceSlot::new());
    // Subtracting to zero removes the key: equal to a slot that never had it.
    assert_eq!((&a - &a).unwrap(), ResourceSlot::new());
    let huge = ResourceSlot::new().with("cpu", SlotValue::MAX);
    assert!(matches!(&huge + &a, Err(ArithmeticError::Overflow { .. })));
    assert_eq!(huge.checked_add(&a), None);
}

#[test]
fn zeros_are_dropped_when_deserializing() {
    let r: ResourceSlot = serde_json::from_str(r#"{"cpu":"0","mem":"1024"}"#).unwrap();
    assert_eq!(r, parse(&["mem=1k"]).unwrap());
    assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"mem":"1024"}"#);
    assert!(serde_json::from_str::<ResourceSlot>(r#"{"CPU":"1"}"#).is_err());
    assert!(serde_json::from_str::<ResourceSlot>(r#"{"cpu":"0.1234567"}"#).is_err());
}

#[test]
fn registry_merges_and_refuses_conflicting_kinds() {
    let mut r = SlotTypeRegistry::new();
    let shares = name("cuda.shares");
    let accel = name("mock.accel");
    assert_eq!(
        r.merge("a1", &[(shares.clone(), SlotKind::Count)]).unwrap(),
        vec![shares.clone()]
    );
    assert_eq!(
        r.merge(
            "a2",
            &[
                (shares.clone(), SlotKind::Count),
                (accel.clone(), SlotKind::Count)
            ]
        )
        .unwrap(),
        vec![accel.clone()]
    );
    let before = r.clone();
    let err = r
        .merge(
            "a3",
            &[
                (name("new.slot"), SlotKind::Count),
                (shares.clone(), SlotKind::Bytes),
            ],
        )
        .unwrap_err();
    assert_eq!(
        err,
        RegistryError::ConflictingKind {
            slot: shares.clone(),
            known: SlotKind::Count,
            declared: SlotKind::Bytes,
            agent: "a3".into(),
        }
    );
    assert_eq!(
        err.to_string(),
        "agent \"a3\" declares slot cuda.shares as bytes, but the cluster knows it as count"
    );
    assert_eq!(r, before, "all or nothing: new.slot was not added");
    // One agent contradicting itself is refused too.
    let err = r
        .merge(
            "a4",
            &[(name("x"), SlotKind::Count), (name("x"), SlotKind::Unique)],
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("declares slot x as unique"),
        "{err}"
    );
    assert_eq!(r.kind("cuda.shares"), Some(SlotKind::Count));
    assert_eq!(r.len(), 2);
    let json = serde_json::to_string(&r).unwrap();
    assert_eq!(json, r#"{"cuda.shares":"count","mock.accel":"count"}"#);
    assert_eq!(serde_json::from_str::<SlotTypeRegistry>(&json).unwrap(), r);
}

#[test]
fn prints_bytes_in_exact_units() {
    let r = parse(&["mem=1.5g", "cuda.mem=8g", "cpu=2", "cuda.shares=0.25"]).unwrap();
    assert_eq!(r.to_string(), "cpu=2,cuda.mem=8g,cuda.shares=0.25,mem=1.5g");
    assert_eq!(parse(&["mem=4097"]).unwrap().to_string(), "mem=4097");
    assert_eq!(parse(&["mem=1025k"]).unwrap().to_string(), "mem=1025k");
    // The shortest exact spelling, ties to the unit: 1152 is shorter than 1.125k.
    assert_eq!(format_bytes(SlotValue::from_int(1152)), "1152");
    assert_eq!(format_bytes(SlotValue::from_int(1536)), "1.5k");
    assert_eq!(format_bytes(SlotValue::from_int(0)), "0");
    assert_eq!(format_bytes(SlotValue::from_micros(1_500_000)), "1.5");
}

fn count() -> impl Strategy<Value = SlotValue> {
    prop_oneof![
        4 => (0u128..1_000_000_000_000).prop_map(SlotValue::from_micros),
        1 => (0u128..=u128::MAX >> 3).prop_map(SlotValue::from_micros),
    ]
}

/// Whole bytes, often a round number of some unit (`1.5g`, `3k`, `16e`).
fn bytes() -> impl Strategy<Value = SlotValue> {
    prop_oneof![
        any::<u64>().prop_map(SlotValue::from_int),
        (
            0u128..5000,
            0u32..7,
            prop::sample::select(vec![1u128, 2, 4, 8, 5, 1000])
        )
            .prop_map(|(n, unit, div)| {
                let bytes = n << (10 * unit);
                let bytes = if bytes % div == 0 { bytes / div } else { bytes };
                SlotValue::from_micros(bytes * SCALE)
            }),
    ]
}

const NAMES: [&str; 6] = [
    "cpu",
    "mem",
    "cuda.shares",
    "cuda.mem",
    "cuda.device",
    "x.y",
];

fn slot() -> impl Strategy<Value = ResourceSlot> {
    proptest::collection::btree_map(
        prop::sample::select(NAMES.to_vec()),
        (count(), bytes()),
        0..5,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|(k, (c, b))| {
                let value = match k {
                    "mem" | "cuda.mem" => b,
                    "cuda.device" => SlotValue::from_int(u64::try_from(c.trunc() % 64).unwrap()),
                    _ => c,
                };
                (name(k), value)
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn addition_is_commutative_and_associative_with_zero_identity(
        a in slot(), b in slot(), c in slot()
    ) {
        prop_assert_eq!(&a + &b, &b + &a);
        prop_assert_eq!(
            (&(&a + &b).unwrap() + &c).unwrap(),
            (&a + &(&b + &c).unwrap()).unwrap()
        );
        prop_assert_eq!((&a + &ResourceSlot::new()).unwrap(), a.clone());
        prop_assert_eq!((&a - &ResourceSlot::new()).unwrap(), a.clone());
        prop_assert_eq!((&a - &a).unwrap(), ResourceSlot::new());
    }

    #[test]
    fn subtraction_undoes_addition(a in slot(), b in slot()) {
        let sum = (&a + &b).unwrap();
        prop_assert_eq!((&sum - &b).unwrap(), a.clone());
        prop_assert_eq!((&sum - &a).unwrap(), b.clone());
        prop_assert!(a <= sum && b <= sum);
    }

    #[test]
    fn the_partial_order_is_consistent(a in slot(), b in slot(), c in slot()) {
        // fits_in, <=, partial_cmp and subtraction agree.
        prop_assert_eq!(a.fits_in(&b), a <= b);
        prop_assert_eq!(a.fits_in(&b), (&b - &a).is_ok());
        prop_assert_eq!(b.fits_in(&a), a >= b);
        prop_assert_eq!(a.partial_cmp(&b).map(Ordering::reverse), b.partial_cmp(&a));
        prop_assert_eq!(a.partial_cmp(&b) == Some(Ordering::Equal), a == b);
        prop_assert_eq!(a.partial_cmp(&b).is_none(), !a.fits_in(&b) && !b.fits_in(&a));
        // Reflexive, antisymmetric, transitive.
        prop_assert!(a <= a);
        if a <= b && b <= a {
            prop_assert_eq!(&a, &b);
        }
        if a <= b && b <= c {
            prop_assert!(a <= c);
        }
        // Adding keeps the order.
        let ac = (&a + &c).unwrap();
        let bc = (&b + &c).unwrap();
        prop_assert_eq!(a <= b, ac <= bc);
        // A saturating difference never exceeds what there was.
        prop_assert!(a.saturating_sub(&b) <= a);
    }

    #[test]
    fn parse_print_parse_round_trips(a in slot()) {
        let printed = a.to_string();
        let tokens: Vec<&str> = if printed.is_empty() { vec![] } else { printed.split(',').collect() };
        let back = ResourceSlot::parse_any(&tokens).unwrap();
        prop_assert_eq!(&back, &a);
        prop_assert_eq!(back.to_string(), printed);
        let json = serde_json::to_string(&a).unwrap();
        prop_assert_eq!(serde_json::from_str::<ResourceSlot>(&json).unwrap(), a);
    }

    #[test]
    fn value_print_parse_round_trips(x in count(), b in bytes()) {
        prop_assert_eq!(x.to_string().parse::<SlotValue>().unwrap(), x);
        prop_assert_eq!(parse_value("mem", &format_bytes(b), SlotKind::Bytes).unwrap(), b);
        prop_assert!(format_bytes(b).len() <= b.trunc().to_string().len());
    }
}

#[test]
fn kinds_keep_their_lowercase_names() {
    for kind in [SlotKind::Count, SlotKind::Bytes, SlotKind::Unique] {
        let json = serde_json::to_string(&kind).expect("serializes");
        assert_eq!(json, format!("\"{kind}\""));
        assert_eq!(
            serde_json::from_str::<SlotKind>(&json).expect("reads back"),
            kind
        );
    }
}

#[test]
fn gpu_slots_share_the_prefix() {
    for (name, _) in names::GPU_SLOTS {
        assert!(name.starts_with(names::CUDA_PREFIX), "{name}");
    }
}

#[test]
fn a_mig_slot_is_recognised_without_building_its_name() {
    for profile in ["1g.18gb", "1g.10gb+me", "7g.141gb"] {
        let slot = names::mig_slot(profile);
        assert!(names::is_mig_slot(&slot, profile), "{slot} {profile}");
    }
    assert!(!names::is_mig_slot("cuda.mig.1g.18gb", "1g.18g"));
    assert!(!names::is_mig_slot("cuda.mig.1g.10gb+me", "1g.10gb+me"));
    assert!(!names::is_mig_slot("cuda.shares", "shares"));
}
