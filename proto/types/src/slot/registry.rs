//! The union of every slot type any agent ever declared (docs/architecture.md, "Slot types are
//! merged").

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{SlotKind, SlotName};

/// An agent's slot types that can't join the registry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The agent declares a slot with another kind than the cluster knows (or declares it twice
    /// with different kinds); the registry keeps the kind it had.
    #[error(
        "agent {agent:?} declares slot {slot} as {declared}, but the cluster knows it as {known}"
    )]
    ConflictingKind {
        /// The slot.
        slot: SlotName,
        /// The kind already registered.
        known: SlotKind,
        /// The kind the agent declared.
        declared: SlotKind,
        /// The agent.
        agent: String,
    },
}

/// Slot types by name, merged from every agent; it never shrinks, and a slot's kind never
/// changes once known (not last-writer-wins).
///
/// It serializes as a map of name to kind (`{"cuda.shares": "count"}`), for the store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SlotTypeRegistry {
    types: BTreeMap<SlotName, SlotKind>,
}

impl SlotTypeRegistry {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Merges `agent`'s declared slot types, all or nothing; returns the names that were new.
    ///
    /// # Errors
    /// A declared slot is known with another kind, or declared twice with different kinds;
    /// nothing is merged then.
    pub fn merge(
        &mut self,
        agent: &str,
        declared: &[(SlotName, SlotKind)],
    ) -> Result<Vec<SlotName>, RegistryError> {
        for (i, (slot, kind)) in declared.iter().enumerate() {
            let known = self.types.get(slot).copied().or_else(|| {
                declared[..i]
                    .iter()
                    .find(|(earlier, _)| earlier == slot)
                    .map(|(_, k)| *k)
            });
            if let Some(known) = known
                && known != *kind
            {
                return Err(RegistryError::ConflictingKind {
                    slot: slot.clone(),
                    known,
                    declared: *kind,
                    agent: agent.to_owned(),
                });
            }
        }
        let mut added = Vec::new();
        for (slot, kind) in declared {
            if self.types.insert(slot.clone(), *kind).is_none() {
                added.push(slot.clone());
            }
        }
        Ok(added)
    }

    /// The kind of `name`, if known. Doesn't allocate.
    #[must_use]
    pub fn kind(&self, name: &str) -> Option<SlotKind> {
        self.types.get(name).copied()
    }

    /// Whether `name` is known.
    #[must_use]
    pub fn contains(&self, name: &str) -> bool {
        self.types.contains_key(name)
    }

    /// How many slot types are known.
    #[must_use]
    pub fn len(&self) -> usize {
        self.types.len()
    }

    /// Whether no slot type is known yet.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }

    /// Every slot type, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&SlotName, SlotKind)> {
        self.types.iter().map(|(k, v)| (k, *v))
    }

    /// The known names, comma-separated (for error messages).
    #[must_use]
    pub fn names(&self) -> String {
        self.types
            .keys()
            .map(SlotName::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    }
}
