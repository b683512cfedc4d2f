//! Printing slot values back in a form that parses to the same value (`2g`, `1.5g`, `0.2`), by
//! the kind of slot a well-known name is. [`ResourceSlot`](super::ResourceSlot)'s `Display` and
//! the parser both use it, so it sits below both.

use super::{SCALE, SlotKind, SlotValue, names};

/// The kind of a well-known slot (`mem` and `cuda.mem` are bytes); every other name is a count
/// unless a [`SlotTypeRegistry`] says otherwise.
#[must_use]
pub fn default_kind(name: &str) -> SlotKind {
    match name {
        names::MEM | names::CUDA_MEM => SlotKind::Bytes,
        _ => SlotKind::Count,
    }
}

/// Bytes in their shortest exact spelling, ties to the larger unit: `2g`, `1.5g`, `4k`, but
/// `4097` and `1152` (not `1.125k`). Parses back to the same value as bytes. A fractional value
/// (which never parses as bytes) prints as a plain decimal.
#[must_use]
pub fn format_bytes(value: SlotValue) -> String {
    if !value.is_integer() {
        return value.to_string();
    }
    let bytes = value.trunc();
    let mut best = bytes.to_string();
    for (suffix, shift) in [
        ("k", 10),
        ("m", 20),
        ("g", 30),
        ("t", 40),
        ("p", 50),
        ("e", 60),
    ] {
        let unit = 1u128 << shift;
        // bytes ≤ u128::MAX / SCALE, so × SCALE can't overflow.
        let micros = bytes * SCALE;
        if bytes < unit || !micros.is_multiple_of(unit) {
            continue;
        }
        let spelled = format!("{}{suffix}", SlotValue::from_micros(micros / unit));
        if spelled.len() <= best.len() {
            best = spelled;
        }
    }
    best
}

/// `value` as [`ResourceSlot`]'s `Display` prints it for `slot`: well-known byte slots with
/// [`format_bytes`], the rest as plain decimals.
#[must_use]
pub fn format_value(slot: &str, value: SlotValue) -> String {
    if default_kind(slot) == SlotKind::Bytes {
        format_bytes(value)
    } else {
        value.to_string()
    }
}
