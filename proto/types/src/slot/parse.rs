//! Parsing what users type (`cpu=1`, `mem=2g`, `mem=1.5Gi`, `mem=2 KiB`, `cuda.shares=0.2`);
//! printing it back is `format`'s.

use std::collections::BTreeMap;

use super::{
    BytesError, InvalidSlotName, ResourceSlot, SlotKind, SlotName, SlotTypeRegistry, SlotValue,
    ValueError, format::default_kind, names, parse_bytes,
};

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
    #[error("invalid resource {token:?}: {reason}")]
    Name {
        /// The token.
        token: String,
        /// Why the name is bad.
        reason: InvalidSlotName,
    },
    /// A bad value.
    #[error("invalid value {value:?} for slot {slot:?}: {reason}")]
    Value {
        /// The slot.
        slot: String,
        /// The value as typed.
        value: String,
        /// Why.
        reason: BadValue,
    },
    /// The same slot twice.
    #[error("slot {slot:?} given twice: {first:?} and {second:?}")]
    Duplicate {
        /// The slot.
        slot: String,
        /// The first token naming it.
        first: String,
        /// The second.
        second: String,
    },
    /// Not a slot type the cluster has (only when parsing against a registry).
    #[error("unknown slot type {slot:?} (known: {known})")]
    Unknown {
        /// The slot.
        slot: String,
        /// The known slot names, comma-separated.
        known: String,
    },
}

/// Why a value doesn't parse for its slot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadValue {
    /// Not a plain decimal number.
    #[error("not a decimal number")]
    NotANumber,
    /// Finer than a micro-unit.
    #[error("more than {digits} fractional digits", digits = super::SCALE_DIGITS)]
    TooPrecise,
    /// Too large.
    #[error("too large")]
    TooLarge,
    /// A byte value with a suffix that is no unit.
    #[error(
        "unknown unit suffix {suffix:?} (use k, m, g, t, p or e, optionally followed by i, b or ib)"
    )]
    UnknownSuffix {
        /// The suffix as typed.
        suffix: String,
    },
    /// A fraction of a byte: refused, naming the exact value and the nearest whole one.
    #[error("not a whole number of bytes ({exact} bytes; the nearest whole number is {nearest})")]
    FractionalBytes {
        /// The exact value in bytes, as a decimal.
        exact: String,
        /// The nearest whole number of bytes.
        nearest: u128,
    },
    /// A unique slot asked as something other than 1.
    #[error("a unique slot can only be requested as 1")]
    UniqueNotOne,
    /// A fraction of a whole device.
    #[error("cuda.device takes whole devices; use cuda.shares for fractions")]
    FractionalDevices,
}

impl From<BytesError> for BadValue {
    fn from(e: BytesError) -> Self {
        match e {
            BytesError::NotANumber => Self::NotANumber,
            BytesError::UnknownSuffix { suffix } => Self::UnknownSuffix { suffix },
            BytesError::Fractional { exact, nearest } => Self::FractionalBytes { exact, nearest },
            BytesError::TooLarge => Self::TooLarge,
        }
    }
}

impl From<ValueError> for BadValue {
    fn from(e: ValueError) -> Self {
        match e {
            ValueError::NotANumber { .. } => Self::NotANumber,
            ValueError::TooPrecise { .. } => Self::TooPrecise,
            ValueError::TooLarge { .. } => Self::TooLarge,
        }
    }
}

/// Parses a value of `kind` for slot `slot`.
///
/// Counts are plain decimals (`1`, `0.25`); bytes are sizes as Backend.AI takes them, with an
/// optional binary unit (`512m`, `1.5Gi`, `2GB`, `1 KiB`, `2 KiBytes`, `12_345 bytes`; see
/// [`parse_bytes`]) and must come out whole: a fraction of a byte is refused, naming the nearest
/// whole number, not rounded; a unique slot takes only `1`; `cuda.device` takes only whole
/// numbers.
///
/// # Errors
/// The value doesn't parse for its kind; the error names the slot, the value and why.
pub fn parse_value(slot: &str, value: &str, kind: SlotKind) -> Result<SlotValue, ParseError> {
    let err = |reason: BadValue| ParseError::Value {
        slot: slot.to_owned(),
        value: value.to_owned(),
        reason,
    };
    let v = match kind {
        SlotKind::Count | SlotKind::Unique => {
            let v: SlotValue = value.parse().map_err(|e: ValueError| err(e.into()))?;
            if kind == SlotKind::Unique && v != SlotValue::ONE {
                return Err(err(BadValue::UniqueNotOne));
            }
            v
        }
        SlotKind::Bytes => parse_bytes(value).map_err(|e| err(e.into()))?,
    };
    if slot == names::CUDA_DEVICE && !v.is_integer() {
        return Err(err(BadValue::FractionalDevices));
    }
    Ok(v)
}

impl ResourceSlot {
    /// Parses `name=value` tokens, one per `-r` (`["cpu=1", "mem=2g", "cuda.shares=0.5"]`).
    ///
    /// Without a registry, names take their [`default_kind`] and any valid name is accepted;
    /// with one, a name must be registered and takes the registered kind.
    ///
    /// # Errors
    /// The first bad token, named: not `name=value`, a bad name, a bad value for the kind, a
    /// slot given twice, or (with a registry) a slot type the cluster doesn't have.
    pub fn parse_requests<S: AsRef<str>>(
        tokens: &[S],
        registry: Option<&SlotTypeRegistry>,
    ) -> Result<Self, ParseError> {
        let mut values = BTreeMap::new();
        let mut first_token: BTreeMap<SlotName, &str> = BTreeMap::new();
        for token in tokens {
            let token = token.as_ref().trim();
            let (name, value) = token.split_once('=').ok_or_else(|| ParseError::Shape {
                token: token.to_owned(),
            })?;
            let (name, value) = (name.trim(), value.trim());
            let slot = SlotName::new(name).map_err(|reason| ParseError::Name {
                token: token.to_owned(),
                reason,
            })?;
            if let Some(first) = first_token.get(name) {
                return Err(ParseError::Duplicate {
                    slot: name.to_owned(),
                    first: (*first).to_owned(),
                    second: token.to_owned(),
                });
            }
            let kind = match registry {
                None => default_kind(name),
                Some(registry) => registry.kind(name).ok_or_else(|| ParseError::Unknown {
                    slot: name.to_owned(),
                    known: registry.names(),
                })?,
            };
            values.insert(slot.clone(), parse_value(name, value, kind)?);
            first_token.insert(slot, token);
        }
        Ok(values.into())
    }

    /// [`Self::parse_requests`] without a registry: well-known kinds, any valid name.
    ///
    /// # Errors
    /// The first bad token, named.
    pub fn parse_any<S: AsRef<str>>(tokens: &[S]) -> Result<Self, ParseError> {
        Self::parse_requests(tokens, None)
    }
}
