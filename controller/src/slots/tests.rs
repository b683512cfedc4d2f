use proptest::prelude::*;

use super::*;

fn v(s: &str) -> SlotValue {
    s.parse().unwrap()
}

fn parse(tokens: &[&str]) -> Result<ResourceSlot, ParseError> {
    ResourceSlot::parse_any(tokens)
}

#[test]
fn fractions_are_exact() {
    assert_eq!(v("0.2").checked_add(v("0.4")), Some(v("0.6")));
    assert_eq!(v("0.1").checked_add(v("0.2")).unwrap().to_string(), "0.3");
    assert_eq!(v("1.000000").to_string(), "1");
    assert_eq!(v(".5").to_string(), "0.5");
    assert_eq!(v("1").checked_sub(v("1.000001")), None);
}

#[test]
fn parses_what_users_type() {
    let r = parse(&["cpu=1", "mem=2g", "cuda.shares=0.2", "cuda.mem=8g"]).unwrap();
    assert_eq!(r.get("cpu"), SlotValue::from_int(1));
    assert_eq!(r.get("mem"), SlotValue::from_int(2 << 30));
    assert_eq!(r.get("cuda.shares"), v("0.2"));
    assert_eq!(r.get("cuda.mem"), SlotValue::from_int(8 << 30));
    assert_eq!(
        parse(&["mem=512m"]).unwrap().get("mem"),
        SlotValue::from_int(512 << 20)
    );
    assert_eq!(
        parse(&["mem=1.5Gi"]).unwrap().get("mem"),
        SlotValue::from_int(3 << 29)
    );
    assert_eq!(
        parse(&["mem=4096"]).unwrap().get("mem"),
        SlotValue::from_int(4096)
    );
    assert_eq!(
        parse(&["cuda.device=1"]).unwrap().get("cuda.device"),
        SlotValue::ONE
    );
    assert!(parse(&[]).unwrap().is_zero());
}

#[test]
fn errors_name_the_bad_token() {
    let cases: &[(&[&str], &str)] = &[
        (&["mem=2x"], "\"x\""),
        (&["mem=2x"], "\"mem\""),
        (&["cpu"], "\"cpu\""),
        (&["cpu=abc"], "\"abc\""),
        (&["cpu=0.0000001"], "fractional digits"),
        (&["mem=0.5"], "whole number of bytes"),
        (&["CPU=1"], "\"CPU=1\""),
        (&["cpu=1", "cpu=2"], "given twice"),
        (&["cuda.device=0.5"], "whole devices"),
        (&["cpu=-1"], "\"-1\""),
        (&["cpu=1e3"], "\"1e3\""),
    ];
    for (tokens, needle) in cases {
        let err = parse(tokens).expect_err(&format!("{tokens:?} parsed"));
        assert!(err.to_string().contains(needle), "{tokens:?}: {err}");
    }
}

#[test]
fn unknown_slots_are_refused_against_a_registry() {
    let mut registry = SlotTypeRegistry::new();
    registry
        .merge(
            "a1",
            &[(SlotName::new("cuda.shares").unwrap(), SlotKind::Count)],
        )
        .unwrap();
    let err = ResourceSlot::parse_requests(&["tpu=1"], &|n| registry.kind(n), &|| registry.names())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown slot type \"tpu\" (known: cuda.shares)"
    );
}

#[test]
fn unique_slots_are_requested_as_one() {
    assert_eq!(
        parse_value("x.lock", "1", SlotKind::Unique),
        Ok(SlotValue::ONE)
    );
    let err = parse_value("x.lock", "2", SlotKind::Unique).unwrap_err();
    assert!(err.to_string().contains("only be requested as 1"), "{err}");
}

#[test]
fn absent_keys_are_zero_and_the_order_is_partial() {
    let a = parse(&["cpu=1"]).unwrap();
    let b = parse(&["cuda.shares=0.5"]).unwrap();
    assert!(!a.fits_in(&b) && !b.fits_in(&a));
    assert_eq!(a.partial_cmp(&b), None);
    let ab = a.checked_add(&b).unwrap();
    assert!(a <= ab && b <= ab);
    assert_eq!(ab.checked_sub(&b).unwrap(), a);
    let err = a.checked_sub(&b).unwrap_err();
    assert_eq!(err.slot.as_str(), "cuda.shares");
    // Subtracting to zero removes the key: equal to a slot that never had it.
    assert_eq!(a.checked_sub(&a).unwrap(), ResourceSlot::new());
}

#[test]
fn registry_merges_and_refuses_conflicting_kinds() {
    let mut r = SlotTypeRegistry::new();
    let shares = SlotName::new("cuda.shares").unwrap();
    let accel = SlotName::new("mock.accel").unwrap();
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
    let err = r
        .merge(
            "a3",
            &[
                (accel.clone(), SlotKind::Count),
                (shares.clone(), SlotKind::Bytes),
            ],
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "agent \"a3\" declares slot cuda.shares as bytes, but the cluster knows it as count"
    );
    assert_eq!(r.kind("cuda.shares"), Some(SlotKind::Count));
    let json = serde_json::to_string(&r).unwrap();
    assert_eq!(serde_json::from_str::<SlotTypeRegistry>(&json).unwrap(), r);
}

#[test]
fn prints_bytes_in_exact_units() {
    let r = parse(&["mem=1.5g", "cuda.mem=8g", "cpu=2"]).unwrap();
    assert_eq!(r.to_string(), "cpu=2,cuda.mem=8g,mem=1.5g");
    assert_eq!(parse(&["mem=4097"]).unwrap().to_string(), "mem=4097");
}

fn value() -> impl Strategy<Value = SlotValue> {
    (0u128..1_000_000_000_000).prop_map(SlotValue::from_micros)
}

fn slot() -> impl Strategy<Value = ResourceSlot> {
    proptest::collection::btree_map(
        prop_oneof![
            Just("cpu"),
            Just("mem"),
            Just("cuda.shares"),
            Just("cuda.mem"),
            Just("x.y")
        ],
        value(),
        0..5,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|(k, v)| {
                // Bytes are whole.
                let v = if default_kind(k) == SlotKind::Bytes {
                    SlotValue::from_micros(v.micros() / SCALE * SCALE)
                } else {
                    v
                };
                (SlotName::new(k).unwrap(), v)
            })
            .collect()
    })
}

proptest! {
    #[test]
    fn addition_is_commutative_and_associative(a in slot(), b in slot(), c in slot()) {
        prop_assert_eq!(a.checked_add(&b), b.checked_add(&a));
        prop_assert_eq!(
            a.checked_add(&b).unwrap().checked_add(&c),
            a.checked_add(&b.checked_add(&c).unwrap())
        );
        prop_assert_eq!(a.checked_add(&ResourceSlot::new()).unwrap(), a.clone());
    }

    #[test]
    fn subtraction_undoes_addition(a in slot(), b in slot()) {
        let sum = a.checked_add(&b).unwrap();
        prop_assert_eq!(sum.checked_sub(&b).unwrap(), a.clone());
        prop_assert!(a <= sum && b <= sum);
    }

    #[test]
    fn order_agrees_with_subtraction(a in slot(), b in slot()) {
        prop_assert_eq!(a.fits_in(&b), b.checked_sub(&a).is_ok());
        let both = a.partial_cmp(&b) == Some(std::cmp::Ordering::Equal);
        prop_assert_eq!(both, a == b);
    }

    #[test]
    fn parse_print_parse_round_trips(a in slot()) {
        let printed = a.to_string();
        let tokens: Vec<&str> = if printed.is_empty() { vec![] } else { printed.split(',').collect() };
        prop_assert_eq!(ResourceSlot::parse_any(&tokens).unwrap(), a);
    }

    #[test]
    fn value_print_parse_round_trips(x in value()) {
        prop_assert_eq!(x.to_string().parse::<SlotValue>().unwrap(), x);
    }
}
