//! The union of every slot type any agent ever declared (ARCHITECTURE decision 2).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{SlotKind, SlotName};

/// An agent declared a known slot with another kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// The kinds disagree; the registry keeps the first.
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

/// Slot types by name, merged from every agent; never shrinks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotTypeRegistry {
    types: BTreeMap<SlotName, SlotKind>,
}

impl SlotTypeRegistry {
    /// An empty registry.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Merges an agent's declared slot types, all or nothing; returns the names that were new.
    ///
    /// # Errors
    /// A declared slot is known with another kind (not last-writer-wins).
    pub fn merge(
        &mut self,
        agent: &str,
        declared: &[(SlotName, SlotKind)],
    ) -> Result<Vec<SlotName>, RegistryError> {
        for (slot, kind) in declared {
            if let Some(known) = self.types.get(slot)
                && known != kind
            {
                return Err(RegistryError::ConflictingKind {
                    slot: slot.clone(),
                    known: *known,
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

    /// The kind of `name`, if known.
    #[must_use]
    pub fn kind(&self, name: &str) -> Option<SlotKind> {
        SlotName::new(name)
            .ok()
            .and_then(|n| self.types.get(&n).copied())
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
