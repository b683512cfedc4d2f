//! Conformance with Backend.AI: the cases of `test_binary_size` in its
//! `tests/common/test_types.py` (lablup/backend.ai), what a user may type for a byte size, with
//! gpuwarden's one deliberate difference: a fraction of a byte is refused, naming the nearest
//! whole number, where Backend.AI truncates it.

use super::*;

fn bytes(text: &str) -> u128 {
    parse_bytes(text)
        .unwrap_or_else(|e| panic!("{text:?}: {e}"))
        .trunc()
}

#[test]
fn the_forms_backend_ai_accepts_are_accepted() {
    for (text, want) in [
        ("1 byte", 1),
        ("19291991", 19_291_991),
        ("11_021_204", 11_021_204),
        ("12345 bytes", 12_345),
        ("12345 B", 12_345),
        ("12_345 bytes", 12_345),
        ("99 bytes", 99),
        ("1 KiB", 1024),
        ("2 KiBytes", 2048),
        // Short-hand forms.
        ("1g", 1 << 30),
        ("1m", 1_048_576),
        ("0.5m", 524_288),
        ("512k", 524_288),
    ] {
        assert_eq!(bytes(text), want, "{text:?}");
    }
}

#[test]
fn fractional_bytes_are_refused_naming_the_nearest_whole_number() {
    // Backend.AI refuses `1.1` too, and truncates `1.1k` to 1126 and `124.32 KiB` to 127303.
    for (text, exact, nearest) in [
        ("1.1", "1.1", 1),
        ("1.1k", "1126.4", 1126),
        ("124.32 KiB", "127303.68", 127_304),
        ("1.5 byte", "1.5", 2),
        ("0.3k", "307.2", 307),
    ] {
        let err = parse_bytes(text).expect_err(text);
        assert_eq!(
            err,
            BytesError::Fractional {
                exact: exact.to_owned(),
                nearest
            },
            "{text:?}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "not a whole number of bytes ({exact} bytes; the nearest whole number is {nearest})"
            )
        );
    }
}

#[test]
fn every_unit_spelling_is_the_same_binary_scale() {
    for unit in [
        "g", "G", "gi", "Gi", "gb", "GB", "gib", "GiB", "gbyte", "GBytes", "gibyte", "GiBytes",
    ] {
        assert_eq!(bytes(&format!("3{unit}")), 3 << 30, "{unit}");
        assert_eq!(bytes(&format!("3 {unit}")), 3 << 30, "{unit}");
    }
    assert_eq!(bytes("4096b"), 4096);
    assert_eq!(bytes("16e"), 1 << 64);
    assert_eq!(bytes(".5k"), 512);
    assert_eq!(bytes("1_024 KiB"), 1 << 20);
}

#[test]
fn what_is_no_size_is_refused_with_the_reason() {
    for text in [
        "", "k", "GiB", ".", "1.", "-1", "+1", "_1", "1_", "1__0", "1_.5", "1.2.3", "inf",
    ] {
        assert_eq!(parse_bytes(text), Err(BytesError::NotANumber), "{text:?}");
    }
    for (text, suffix) in [
        ("2x", "x"),
        ("1.5kk", "kk"),
        ("1zb", "zb"),
        ("1 ki b", "ki b"),
        ("1e3", "e3"),
        ("12 345", "345"),
    ] {
        assert_eq!(
            parse_bytes(text),
            Err(BytesError::UnknownSuffix {
                suffix: suffix.to_owned()
            }),
            "{text:?}"
        );
    }
    assert_eq!(
        parse_bytes("999999999999999999999e"),
        Err(BytesError::TooLarge)
    );
    assert_eq!(
        parse_bytes("999999999999999999999999999999999999999"),
        Err(BytesError::TooLarge)
    );
}
