//! Parsing what users type: `cpu=1`, `mem=2g`, `mem=1.5Gi`, `cuda.shares=0.2`.

use super::{ResourceSlot, SlotKind, SlotName, SlotValue, ValueError, names};

/// A request that doesn't parse; the message names the bad token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Not `name=value`.
    #[error("invalid resource {token:?}: expected name=value, e.g. cuda.shares=0.5")]
    Shape {
        /// The token.
        token: String,
    },
    /// A bad name.
    #[error("invalid resource {token:?}: {source}")]
    Name {
        /// The token.
        token: String,
        /// Why.
        #[source]
        source: super::InvalidSlotName,
    },
    /// A bad value.
    #[error("invalid value {value:?} for slot {slot:?}: {reason}")]
    Value {
        /// The slot.
        slot: String,
        /// The value as typed.
        value: String,
        /// Why.
        reason: String,
    },
    /// The same slot twice.
    #[error("slot {slot:?} given twice")]
    Duplicate {
        /// The slot.
        slot: String,
    },
    /// Not a slot type the cluster has.
    #[error("unknown slot type {slot:?} (known: {known})")]
    Unknown {
        /// The slot.
        slot: String,
        /// The known slot names.
        known: String,
    },
}

/// The kind of a well-known slot; other names are counts unless a registry says otherwise.
#[must_use]
pub fn default_kind(name: &str) -> SlotKind {
    match name {
        names::MEM | names::CUDA_MEM => SlotKind::Bytes,
        n if n.ends_with(".mem") => SlotKind::Bytes,
        _ => SlotKind::Count,
    }
}

/// Binary unit suffixes, longest first.
const UNITS: &[(&str, u32)] = &[
    ("ki", 10),
    ("mi", 20),
    ("gi", 30),
    ("ti", 40),
    ("pi", 50),
    ("k", 10),
    ("m", 20),
    ("g", 30),
    ("t", 40),
    ("p", 50),
    ("b", 0),
];

/// Parses a value of `kind` for slot `slot`.
///
/// # Errors
/// The value doesn't parse for its kind.
pub fn parse_value(slot: &str, value: &str, kind: SlotKind) -> Result<SlotValue, ParseError> {
    let err = |reason: String| ParseError::Value {
        slot: slot.to_owned(),
        value: value.to_owned(),
        reason,
    };
    let reason = |e: ValueError| e.to_string();
    match kind {
        SlotKind::Count | SlotKind::Unique => {
            let v: SlotValue = value.parse().map_err(|e| err(reason(e)))?;
            if kind == SlotKind::Unique && v != SlotValue::ONE {
                return Err(err("a unique slot can only be requested as 1".to_owned()));
            }
            if slot == names::CUDA_DEVICE && !v.is_integer() {
                return Err(err(
                    "whole devices only; use cuda.shares for fractions".to_owned()
                ));
            }
            Ok(v)
        }
        SlotKind::Bytes => {
            let lower = value.to_ascii_lowercase();
            let (number, shift) = UNITS
                .iter()
                .find_map(|(suffix, shift)| lower.strip_suffix(suffix).map(|n| (n, *shift)))
                .unwrap_or((lower.as_str(), 0));
            if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
                let suffix = lower.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
                return Err(err(format!(
                    "unknown unit suffix {suffix:?} (use k, m, g, t, p or Ki, Mi, Gi, Ti, Pi)"
                )));
            }
            let v = SlotValue::parse_scaled(number, 1u128 << shift).map_err(|e| err(reason(e)))?;
            if !v.is_integer() {
                return Err(err("not a whole number of bytes".to_owned()));
            }
            Ok(v)
        }
    }
}

/// Bytes in their largest binary unit that keeps them exact within three decimals: `2g`, `1.5g`,
/// `4096` stays `4k`; odd counts print as plain bytes.
#[must_use]
pub fn format_bytes(value: SlotValue) -> String {
    let bytes = value.trunc();
    for (suffix, shift) in [("p", 50), ("t", 40), ("g", 30), ("m", 20), ("k", 10)] {
        let unit = 1u128 << shift;
        if bytes >= unit && (bytes * 1000).is_multiple_of(unit) {
            let scaled = SlotValue::from_micros(bytes * super::SCALE / unit);
            return format!("{scaled}{suffix}");
        }
    }
    bytes.to_string()
}

impl ResourceSlot {
    /// Parses `name=value` tokens (one per `-r`), kinds from `kind_of` (`None`: unknown slot).
    ///
    /// # Errors
    /// The first bad token, named.
    pub fn parse_requests<S: AsRef<str>>(
        tokens: &[S],
        kind_of: &dyn Fn(&str) -> Option<SlotKind>,
        known: &dyn Fn() -> String,
    ) -> Result<Self, ParseError> {
        let mut out = Self::new();
        let mut seen = std::collections::BTreeSet::new();
        for token in tokens {
            let token = token.as_ref().trim();
            let (name, value) = token.split_once('=').ok_or_else(|| ParseError::Shape {
                token: token.to_owned(),
            })?;
            let (name, value) = (name.trim(), value.trim());
            let slot = SlotName::new(name).map_err(|source| ParseError::Name {
                token: token.to_owned(),
                source,
            })?;
            if !seen.insert(slot.clone()) {
                return Err(ParseError::Duplicate {
                    slot: name.to_owned(),
                });
            }
            let kind = kind_of(name).ok_or_else(|| ParseError::Unknown {
                slot: name.to_owned(),
                known: known(),
            })?;
            out.set(slot, parse_value(name, value, kind)?);
        }
        Ok(out)
    }

    /// Parses with the well-known kinds, accepting any name (no registry at hand).
    ///
    /// # Errors
    /// The first bad token, named.
    pub fn parse_any<S: AsRef<str>>(tokens: &[S]) -> Result<Self, ParseError> {
        Self::parse_requests(tokens, &|n| Some(default_kind(n)), &String::new)
    }
}
