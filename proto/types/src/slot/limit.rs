//! [`Limit`]: a value, or no limit at all (`unlimited`, `inf`), where a limit is meant; and
//! [`SlotLimits`], a limit per slot.

use std::{cmp::Ordering, collections::BTreeMap, fmt, str::FromStr};

use serde::{Deserialize, Serialize};

use super::{ParseError, ResourceSlot, SlotKind, SlotName, SlotValue, ValueError, parse_value};

/// A limit on a slot: at most a value, or none.
///
/// Requests and capacities are always values; quotas and policies may be unlimited, spelled
/// `unlimited`, `inf`, `infinite` or `infinity` in any case (Backend.AI's spellings, plus the
/// word). Unlimited is above every value. It serializes as its text (`"unlimited"`, `"0.5"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Limit {
    /// No limit.
    Unlimited,
    /// At most this.
    AtMost(SlotValue),
}

impl Limit {
    /// Whether `text` spells no limit.
    #[must_use]
    pub fn is_unlimited_word(text: &str) -> bool {
        ["unlimited", "inf", "infinite", "infinity"]
            .iter()
            .any(|w| text.eq_ignore_ascii_case(w))
    }

    /// Parses a limit of `kind` for slot `slot`: a word for no limit, or a value as
    /// [`parse_value`] takes it (`mem=8g` as well as `mem=unlimited`).
    ///
    /// # Errors
    /// Neither a word for no limit nor a value of `kind`; the error names the slot and value.
    pub fn parse(slot: &str, text: &str, kind: SlotKind) -> Result<Self, ParseError> {
        if Self::is_unlimited_word(text.trim()) {
            Ok(Self::Unlimited)
        } else {
            parse_value(slot, text.trim(), kind).map(Self::AtMost)
        }
    }

    /// The value, `None` when unlimited.
    #[must_use]
    pub const fn value(self) -> Option<SlotValue> {
        match self {
            Self::Unlimited => None,
            Self::AtMost(v) => Some(v),
        }
    }

    /// Whether it is no limit.
    #[must_use]
    pub const fn is_unlimited(self) -> bool {
        matches!(self, Self::Unlimited)
    }

    /// Whether `value` is within it.
    #[must_use]
    pub fn admits(self, value: SlotValue) -> bool {
        self.value().is_none_or(|max| value <= max)
    }
}

impl From<SlotValue> for Limit {
    fn from(v: SlotValue) -> Self {
        Self::AtMost(v)
    }
}

impl PartialOrd for Limit {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Limit {
    /// Values in their order, unlimited above them all.
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Self::Unlimited, Self::Unlimited) => Ordering::Equal,
            (Self::Unlimited, Self::AtMost(_)) => Ordering::Greater,
            (Self::AtMost(_), Self::Unlimited) => Ordering::Less,
            (Self::AtMost(a), Self::AtMost(b)) => a.cmp(b),
        }
    }
}

impl fmt::Display for Limit {
    /// `unlimited`, or the value as a plain decimal.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unlimited => f.write_str("unlimited"),
            Self::AtMost(v) => v.fmt(f),
        }
    }
}

impl FromStr for Limit {
    type Err = ValueError;

    /// A word for no limit, or a plain decimal (for a byte slot with units, [`Limit::parse`]).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if Self::is_unlimited_word(s) {
            Ok(Self::Unlimited)
        } else {
            s.parse().map(Self::AtMost)
        }
    }
}

impl From<Limit> for String {
    fn from(l: Limit) -> Self {
        l.to_string()
    }
}

impl TryFrom<String> for Limit {
    type Error = ValueError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// A limit per slot (an owner's cap on what its sessions hold together). A slot that is absent
/// is limited to zero, as in a [`ResourceSlot`]; `unlimited` lifts a slot's limit.
///
/// It serializes as a map of name to limit (`{"cuda.shares": "2", "cpu": "unlimited"}`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SlotLimits(BTreeMap<SlotName, Limit>);

impl SlotLimits {
    /// The limit of `name` (zero when absent).
    #[must_use]
    pub fn get(&self, name: &str) -> Limit {
        self.0
            .get(name)
            .copied()
            .unwrap_or(Limit::AtMost(SlotValue::ZERO))
    }

    /// Whether every slot of `slots` is within its limit.
    #[must_use]
    pub fn admits(&self, slots: &ResourceSlot) -> bool {
        slots
            .iter()
            .all(|(name, v)| self.get(name.as_str()).admits(v))
    }

    /// The limits, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&SlotName, Limit)> {
        self.0.iter().map(|(k, v)| (k, *v))
    }
}

impl FromIterator<(SlotName, Limit)> for SlotLimits {
    fn from_iter<I: IntoIterator<Item = (SlotName, Limit)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

impl From<&ResourceSlot> for SlotLimits {
    /// Each slot limited to its value.
    fn from(slots: &ResourceSlot) -> Self {
        slots
            .iter()
            .map(|(k, v)| (k.clone(), Limit::AtMost(v)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> SlotValue {
        s.parse().expect("a value")
    }

    #[test]
    fn unlimited_is_a_value_above_all_others() {
        for word in ["unlimited", "inf", "INF", "Infinity", "infinite"] {
            assert_eq!(word.parse::<Limit>(), Ok(Limit::Unlimited), "{word}");
            assert_eq!(
                Limit::parse("mem", word, SlotKind::Bytes),
                Ok(Limit::Unlimited)
            );
        }
        assert_eq!("0.5".parse::<Limit>(), Ok(Limit::AtMost(v("0.5"))));
        assert!(Limit::Unlimited > Limit::AtMost(SlotValue::MAX));
        assert!(Limit::AtMost(v("1")) < Limit::AtMost(v("2")));
        assert!(Limit::Unlimited.admits(SlotValue::MAX));
        assert!(Limit::AtMost(v("1")).admits(v("1")));
        assert!(!Limit::AtMost(v("1")).admits(v("1.000001")));
        assert_eq!(Limit::Unlimited.value(), None);
        assert!("-inf".parse::<Limit>().is_err());
        assert!("nan".parse::<Limit>().is_err());
    }

    #[test]
    fn byte_limits_take_units_and_errors_name_the_slot() {
        assert_eq!(
            Limit::parse("cuda.mem", "8 GiB", SlotKind::Bytes),
            Ok(Limit::AtMost(SlotValue::from_int(8 << 30)))
        );
        let err = Limit::parse("cuda.mem", "lots", SlotKind::Bytes).expect_err("not a limit");
        assert!(err.to_string().contains("slot \"cuda.mem\""), "{err}");
    }

    #[test]
    fn limits_serialize_as_text() {
        let json = serde_json::to_string(&[Limit::Unlimited, Limit::AtMost(v("0.25"))])
            .expect("serializes");
        assert_eq!(json, r#"["unlimited","0.25"]"#);
        let back: Vec<Limit> = serde_json::from_str(r#"["inf","3"]"#).expect("reads");
        assert_eq!(back, [Limit::Unlimited, Limit::AtMost(v("3"))]);
    }

    #[test]
    fn slot_limits_cap_each_slot_and_absent_ones_at_zero() {
        let limits: SlotLimits =
            serde_json::from_str(r#"{"cuda.shares":"2","cpu":"unlimited"}"#).expect("reads");
        let ask = |tokens: &[&str]| ResourceSlot::parse_any(tokens).expect("parses");
        assert!(limits.admits(&ask(&["cuda.shares=2", "cpu=1000"])));
        assert!(!limits.admits(&ask(&["cuda.shares=2.01"])));
        assert!(!limits.admits(&ask(&["mem=1"])), "absent: zero");
        assert!(limits.admits(&ResourceSlot::new()));
        assert_eq!(limits.get("mem"), Limit::AtMost(SlotValue::ZERO));
        assert_eq!(
            serde_json::to_string(&limits).expect("writes"),
            r#"{"cpu":"unlimited","cuda.shares":"2"}"#
        );
        let plain = ask(&["cpu=1", "mem=1k"]);
        assert!(SlotLimits::from(&plain).admits(&plain));
        assert!(serde_json::from_str::<SlotLimits>(r#"{"CPU":"1"}"#).is_err());
        assert!(serde_json::from_str::<SlotLimits>(r#"{"cpu":"lots"}"#).is_err());
    }
}
