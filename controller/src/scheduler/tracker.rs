//! Concurrency limits that count session ids, not an integer (docs/architecture.md,
//! "Concurrency limits count session ids"): asking again for the same session never counts it
//! twice.

use std::collections::{BTreeMap, BTreeSet};

/// Sessions per owner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConcurrencyTracker {
    by_owner: BTreeMap<String, BTreeSet<String>>,
}

impl ConcurrencyTracker {
    /// Whether `session` of `owner` may run under a limit of `max`: true if it is already
    /// counted, or if there is room for it.
    #[must_use]
    pub fn admits(&self, owner: &str, session: &str, max: Option<usize>) -> bool {
        let held = self.by_owner.get(owner);
        if held.is_some_and(|s| s.contains(session)) {
            return true;
        }
        max.is_none_or(|max| held.map_or(0, BTreeSet::len) < max)
    }

    /// Counts `session` for `owner` (idempotent).
    pub fn add(&mut self, owner: &str, session: &str) {
        self.by_owner
            .entry(owner.to_owned())
            .or_default()
            .insert(session.to_owned());
    }

    /// Stops counting `session` (idempotent).
    pub fn remove(&mut self, owner: &str, session: &str) {
        if let Some(set) = self.by_owner.get_mut(owner) {
            set.remove(session);
            if set.is_empty() {
                self.by_owner.remove(owner);
            }
        }
    }

    /// Sessions counted for `owner`.
    #[cfg(test)]
    pub fn count(&self, owner: &str) -> usize {
        self.by_owner.get(owner).map_or(0, BTreeSet::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retried_predicates_never_double_count() {
        let mut t = ConcurrencyTracker::default();
        assert!(t.admits("alice", "s1", Some(1)));
        t.add("alice", "s1");
        t.add("alice", "s1");
        assert_eq!(t.count("alice"), 1);
        // The same session asked again is admitted; another one is not.
        assert!(t.admits("alice", "s1", Some(1)));
        assert!(!t.admits("alice", "s2", Some(1)));
        assert!(t.admits("bob", "s3", Some(1)));
        t.remove("alice", "s1");
        t.remove("alice", "s1");
        assert!(t.admits("alice", "s2", Some(1)));
        assert!(t.admits("alice", "s9", None));
    }
}
