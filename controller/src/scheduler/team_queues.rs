//! Team queues changed at run time by an admin (docs/teams.md): set (create or replace) and
//! remove a queue's guarantee, limit and members, checked first; and what each queue holds and
//! borrows now, for `gpuwarden queue ls|show`.
//!
//! A change marks [`super::Changes::quotas`], so the controller stores the whole quota
//! configuration with it; once stored, it wins over the config file's at every start.

use super::{
    Scheduler,
    quotas::{QueueQuota, QuotaConfig},
};
use crate::{
    auth::clients::check_name,
    slots::{ResourceSlot, SlotKind, SlotTypeRegistry, default_kind, names},
};

/// A queue as an admin sets it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueSpec {
    /// Its name (a DNS label).
    pub name: String,
    /// Its guarantee and limit.
    pub quota: QueueQuota,
    /// Owners whose sessions count against it.
    pub members: Vec<String>,
}

/// A queue as it stands: its quota, members, and what its sessions hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueView {
    /// Its name.
    pub name: String,
    /// Its guarantee and limit.
    pub quota: QueueQuota,
    /// Owners listed as its members, sorted.
    pub members: Vec<String>,
    /// What its sessions hold, in the slots it governs.
    pub held: ResourceSlot,
    /// What it holds past its guarantee, per governed slot.
    pub borrowed: ResourceSlot,
}

/// Why a queue can't be set or removed. Each names the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// A name that is no DNS label.
    #[error(
        "name {name:?}: a queue's name is a DNS label (1 to 63 lowercase letters, digits or '-', \
         not starting or ending with '-')"
    )]
    BadName {
        /// The name given.
        name: String,
    },
    /// A slot neither built in nor declared by any agent.
    #[error("{field}: unknown slot {slot:?} (known: {known})")]
    UnknownSlot {
        /// `guaranteed` or `limit`.
        field: &'static str,
        /// The slot.
        slot: String,
        /// The slots known.
        known: String,
    },
    /// A fraction of a byte.
    #[error("{field}[{slot}]: {value} is not a whole number of bytes")]
    FractionalBytes {
        /// `guaranteed` or `limit`.
        field: &'static str,
        /// The slot.
        slot: String,
        /// The value.
        value: String,
    },
    /// A guarantee above the limit in a slot.
    #[error("guaranteed[{slot}]: {guaranteed} is above the limit of {limit}")]
    AboveLimit {
        /// The slot.
        slot: String,
        /// The guarantee.
        guaranteed: String,
        /// The limit.
        limit: String,
    },
    /// A member that is no owner name.
    #[error("members: {member:?} is not an owner name: {reason}")]
    BadMember {
        /// The member.
        member: String,
        /// Why.
        reason: &'static str,
    },
    /// A member listed twice.
    #[error("members: {member:?} is listed twice")]
    DuplicateMember {
        /// The member.
        member: String,
    },
    /// A member of another queue already.
    #[error(
        "members: {member:?} is already a member of queue {other:?} (an owner counts against one \
         queue); take it out of {other:?} first"
    )]
    MemberElsewhere {
        /// The member.
        member: String,
        /// Its queue.
        other: String,
    },
    /// A member of a queue that is not defined (a config file's `members`).
    #[error("members: {member:?} is put in queue {queue:?}, which is not defined under queues")]
    MemberOfNoQueue {
        /// The member.
        member: String,
        /// The queue it names.
        queue: String,
    },
    /// No such queue.
    #[error("no queue {0:?}")]
    NotFound(String),
}

impl QueueError {
    /// Whether the queue asked for doesn't exist (`NOT_FOUND`; the rest are bad input).
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound(_))
    }
}

/// Slots a quota may name: those agents declared, and the built-in ones.
fn slot_kind(registry: &SlotTypeRegistry, slot: &str) -> Option<SlotKind> {
    let builtin = [
        names::CPU,
        names::MEM,
        names::CUDA_SHARES,
        names::CUDA_DEVICE,
        names::CUDA_MEM,
    ];
    registry
        .kind(slot)
        .or_else(|| builtin.contains(&slot).then(|| default_kind(slot)))
}

fn known(registry: &SlotTypeRegistry) -> String {
    let mut all: Vec<String> = [
        names::CPU,
        names::MEM,
        names::CUDA_SHARES,
        names::CUDA_DEVICE,
        names::CUDA_MEM,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain(registry.iter().map(|(n, _)| n.to_string()))
    .collect();
    all.sort();
    all.dedup();
    all.join(", ")
}

fn check_slots(
    registry: &SlotTypeRegistry,
    field: &'static str,
    slots: &ResourceSlot,
) -> Result<(), QueueError> {
    for (slot, value) in slots.iter() {
        let kind = slot_kind(registry, slot.as_str()).ok_or_else(|| QueueError::UnknownSlot {
            field,
            slot: slot.to_string(),
            known: known(registry),
        })?;
        if kind == SlotKind::Bytes && !value.is_integer() {
            return Err(QueueError::FractionalBytes {
                field,
                slot: slot.to_string(),
                value: value.to_string(),
            });
        }
    }
    Ok(())
}

/// A queue's name is a DNS label and its guarantee is within its limit in every slot.
fn check_quota(name: &str, quota: &QueueQuota) -> Result<(), QueueError> {
    if !gpuwarden_types::dns::is_dns_label(name) {
        return Err(QueueError::BadName {
            name: name.to_owned(),
        });
    }
    let Some(limit) = &quota.limit else {
        return Ok(());
    };
    for (slot, guaranteed) in quota.guaranteed.iter() {
        let cap = limit.get(slot.as_str());
        if !cap.is_zero() && guaranteed > cap {
            return Err(QueueError::AboveLimit {
                slot: slot.to_string(),
                guaranteed: crate::slots::format_value(slot.as_str(), guaranteed),
                limit: crate::slots::format_value(slot.as_str(), cap),
            });
        }
    }
    Ok(())
}

impl QuotaConfig {
    /// Checks `spec` against the slots `registry` knows and the other queues' members.
    ///
    /// # Errors
    /// The first thing wrong with it, named.
    pub fn check_queue(
        &self,
        spec: &QueueSpec,
        registry: &SlotTypeRegistry,
    ) -> Result<(), QueueError> {
        check_slots(registry, "guaranteed", &spec.quota.guaranteed)?;
        if let Some(limit) = &spec.quota.limit {
            check_slots(registry, "limit", limit)?;
        }
        check_quota(&spec.name, &spec.quota)?;
        let mut seen = std::collections::BTreeSet::new();
        for member in &spec.members {
            check_name(member).map_err(|reason| QueueError::BadMember {
                member: member.clone(),
                reason,
            })?;
            if !seen.insert(member.as_str()) {
                return Err(QueueError::DuplicateMember {
                    member: member.clone(),
                });
            }
            if let Some(other) = self.members.get(member)
                && *other != spec.name
            {
                return Err(QueueError::MemberElsewhere {
                    member: member.clone(),
                    other: other.clone(),
                });
            }
        }
        Ok(())
    }

    /// Checks the queues a config file gives, before the controller starts with them: names,
    /// guarantees within limits, members that are owner names in queues that exist. Slots are
    /// not checked against the registry: agents declare theirs after the start.
    ///
    /// # Errors
    /// The first thing wrong, naming the queue or member.
    pub fn validate(&self) -> Result<(), QueueError> {
        for (name, quota) in &self.queues {
            check_quota(name, quota)?;
        }
        for (member, queue) in &self.members {
            check_name(member).map_err(|reason| QueueError::BadMember {
                member: member.clone(),
                reason,
            })?;
            if !self.queues.contains_key(queue) {
                return Err(QueueError::MemberOfNoQueue {
                    member: member.clone(),
                    queue: queue.clone(),
                });
            }
        }
        Ok(())
    }

    /// Sets `spec` (creating or replacing the queue and its members), once checked.
    ///
    /// # Errors
    /// See [`Self::check_queue`].
    pub fn set_queue(
        &mut self,
        spec: QueueSpec,
        registry: &SlotTypeRegistry,
    ) -> Result<(), QueueError> {
        self.check_queue(&spec, registry)?;
        self.members.retain(|_, queue| *queue != spec.name);
        for member in spec.members {
            self.members.insert(member, spec.name.clone());
        }
        self.queues.insert(spec.name, spec.quota);
        Ok(())
    }

    /// Removes queue `name` and its members; the quota it had.
    ///
    /// # Errors
    /// [`QueueError::NotFound`].
    pub fn remove_queue(&mut self, name: &str) -> Result<QueueQuota, QueueError> {
        let quota = self
            .queues
            .remove(name)
            .ok_or_else(|| QueueError::NotFound(name.to_owned()))?;
        self.members.retain(|_, queue| queue != name);
        Ok(quota)
    }

    /// The members listed for `queue`, sorted.
    #[must_use]
    pub fn members_of(&self, queue: &str) -> Vec<String> {
        self.members
            .iter()
            .filter(|(_, q)| *q == queue)
            .map(|(m, _)| m.clone())
            .collect()
    }
}

impl Scheduler {
    /// Every queue, by name, with what it holds and borrows now.
    #[must_use]
    pub fn queues(&self) -> Vec<QueueView> {
        let held = self.queue_holdings();
        let quotas = &self.config.quotas;
        quotas
            .queues
            .iter()
            .map(|(name, quota)| {
                let all = held.get(&Some(name.clone())).cloned().unwrap_or_default();
                view(quotas, name, quota, &all)
            })
            .collect()
    }

    /// Queue `name` as it stands, if there is one.
    #[must_use]
    pub fn queue_view(&self, name: &str) -> Option<QueueView> {
        let quota = self.config.quotas.queues.get(name)?;
        let all = self
            .queue_holdings()
            .remove(&Some(name.to_owned()))
            .unwrap_or_default();
        Some(view(&self.config.quotas, name, quota, &all))
    }

    /// Creates or replaces a queue; the next pass holds sessions to it.
    ///
    /// # Errors
    /// See [`QuotaConfig::check_queue`].
    pub fn set_queue(&mut self, spec: QueueSpec) -> Result<QueueView, QueueError> {
        let name = spec.name.clone();
        self.config.quotas.set_queue(spec, &self.registry)?;
        self.changes.quotas = true;
        self.queue_view(&name)
            .ok_or_else(|| QueueError::NotFound(name.clone()))
    }

    /// Removes a queue: its members' sessions have no quota from the next pass on. The queue as
    /// it was.
    ///
    /// # Errors
    /// [`QueueError::NotFound`].
    pub fn delete_queue(&mut self, name: &str) -> Result<QueueView, QueueError> {
        let before = self
            .queue_view(name)
            .ok_or_else(|| QueueError::NotFound(name.to_owned()))?;
        self.config.quotas.remove_queue(name)?;
        self.changes.quotas = true;
        Ok(before)
    }
}

/// A queue's view: what it holds in the slots it governs, and how much of that is borrowed.
fn view(quotas: &QuotaConfig, name: &str, quota: &QueueQuota, all: &ResourceSlot) -> QueueView {
    let mut held = ResourceSlot::new();
    let mut borrowed = ResourceSlot::new();
    for (slot, value) in all.iter() {
        if !quota.governs(slot.as_str()) {
            continue;
        }
        held.set(slot.clone(), value);
        borrowed.set(
            slot.clone(),
            value.saturating_sub(quota.guaranteed.get(slot.as_str())),
        );
    }
    QueueView {
        name: name.to_owned(),
        quota: quota.clone(),
        members: quotas.members_of(name),
        held,
        borrowed,
    }
}

#[cfg(test)]
mod tests;
