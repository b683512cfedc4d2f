use super::*;

#[test]
fn numbers_are_decimal_or_hex() {
    assert_eq!(number("42"), Ok(42));
    assert_eq!(number("0x2a"), Ok(42));
    assert_eq!(number("0XC1D00001"), Ok(0xc1d0_0001));
    assert!(matches!(number("0x"), Err(NumberError::NotANumber { .. })));
    assert!(matches!(number("-1"), Err(NumberError::NotANumber { .. })));
    assert_eq!(number32("0xffffffff"), Ok(u32::MAX));
    assert!(matches!(
        number32("0x100000000"),
        Err(NumberError::TooLarge { .. })
    ));
}

#[test]
fn sizes_take_binary_suffixes() {
    assert_eq!(size("4096"), Ok(4096));
    assert_eq!(size("64k"), Ok(64 << 10));
    assert_eq!(size("3m"), Ok(3 << 20));
    assert_eq!(size("3M"), Ok(3 << 20));
    assert_eq!(size("1g"), Ok(1 << 30));
    assert_eq!(size("0x10m"), Ok(16 << 20));
    assert_eq!(
        size("3x"),
        Err(NumberError::NotANumber {
            word: "3x".to_owned()
        })
    );
    assert_eq!(
        size("m"),
        Err(NumberError::NotANumber {
            word: "m".to_owned()
        })
    );
    assert!(matches!(
        size("0xffffffffffffffffg"),
        Err(NumberError::TooLarge { .. })
    ));
}
