//! Resource slots: exact quantities by name (`cpu=1`, `mem=2g`, `cuda.shares=0.2`).
//!
//! The domain lives in `gpuwarden_types::slot` (values, names, kinds, the parser, the merged
//! registry of slot types, limits), shared with the agent and the CLI; the controller uses it
//! under this name.

pub use gpuwarden_types::slot::{
    ArithmeticError, BadValue, BytesError, InvalidSlotName, Limit, ParseError, RegistryError,
    ResourceSlot, SCALE, SCALE_DIGITS, SlotKind, SlotLimits, SlotName, SlotTypeRegistry, SlotValue,
    ValueError, default_kind, format_bytes, format_value, names, parse_bytes, parse_value,
};
