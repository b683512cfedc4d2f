//! Prepared claims, persisted in the agent's sled store (a tree beside the controller's
//! holdings), so a restarted agent enforces them again and answers the kubelet's repeated
//! `NodePrepareResources` exactly as before.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::claim::PlannedDevice;
use crate::enforcement::quota::QuotaSpec;

/// The sled tree of prepared claims.
pub const TREE: &str = "dra_claims";

/// Errors of the claim store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A write or flush failed.
    #[error("agent store: {0}")]
    Io(#[from] sled::Error),
    /// A record doesn't decode.
    #[error("agent store: prepared claim {uid} is corrupt: {source}")]
    Corrupt {
        /// Its claim UID.
        uid: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

/// A claim prepared on this node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prepared {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// The reserving pod's UID.
    pub pod_uid: String,
    /// The reserving pod's name.
    pub pod_name: String,
    /// The pod's workload class (records from before classes: empty, i.e. the pod's name).
    #[serde(default)]
    pub class: String,
    /// The quota enforced; `None` when it binds nothing.
    pub quota: Option<QuotaSpec>,
    /// The kubelet's answer.
    pub devices: Vec<PlannedDevice>,
    /// The CDI device ids returned.
    pub cdi_device_ids: Vec<String>,
    /// The MIG instances made for the claim's partition devices (docs/mig.md, "Partitions
    /// prepared"), destroyed when it is unprepared; records from before partitions: none.
    #[serde(default)]
    pub made: Vec<MadeInstance>,
}

/// A MIG instance made at prepare for a partition device of a claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MadeInstance {
    /// The partition device it was made for (`gpu-1-2g-35gb-at-0`).
    pub device: String,
    /// The parent GPU's UUID.
    pub gpu: String,
    /// The GPU instance profile (`2g.35gb`).
    pub profile: String,
    /// The first memory slice of its placement.
    pub start: u32,
    /// The instance's UUID.
    pub uuid: String,
    /// The instance's device index when made.
    pub index: u32,
}

impl MadeInstance {
    /// Whether the instance is among `devices`: its UUID, on its GPU, of its profile (after a
    /// reboot the driver may give a new instance the UUID an old one had).
    #[must_use]
    pub fn is_among(&self, devices: &[crate::devices::GpuDevice]) -> bool {
        devices.iter().any(|d| {
            d.uuid == self.uuid
                && d.mig
                    .as_ref()
                    .is_some_and(|m| m.parent_uuid == self.gpu && m.profile == self.profile)
        })
    }
}

/// The key prefix of an instance whose claim is unprepared but which is not destroyed yet
/// (a process still on its GPU); claim UIDs are UUIDs, so no claim's key starts with it.
const DOOMED: &str = "destroy/";

/// Prepared claims by UID, and the instances of unprepared claims still to destroy, in memory
/// and (when given a tree) on disk.
#[derive(Debug, Default)]
pub struct ClaimStore {
    claims: BTreeMap<String, Prepared>,
    doomed: BTreeMap<String, MadeInstance>,
    tree: Option<sled::Tree>,
}

impl ClaimStore {
    /// Loads what `tree` holds; `None` keeps claims in memory only.
    ///
    /// # Errors
    /// A record is corrupt or unreadable.
    pub fn load(tree: Option<sled::Tree>) -> Result<Self, StoreError> {
        let mut claims = BTreeMap::new();
        let mut doomed = BTreeMap::new();
        if let Some(tree) = &tree {
            for item in tree {
                let (k, v) = item?;
                let uid = String::from_utf8_lossy(&k).into_owned();
                let corrupt = |source| StoreError::Corrupt {
                    uid: uid.clone(),
                    source,
                };
                if let Some(instance) = uid.strip_prefix(DOOMED) {
                    let made: MadeInstance = serde_json::from_slice(&v).map_err(corrupt)?;
                    doomed.insert(instance.to_owned(), made);
                } else {
                    let record: Prepared = serde_json::from_slice(&v).map_err(corrupt)?;
                    claims.insert(uid, record);
                }
            }
        }
        Ok(Self {
            claims,
            doomed,
            tree,
        })
    }

    /// The claim prepared under `uid`.
    #[must_use]
    pub fn get(&self, uid: &str) -> Option<&Prepared> {
        self.claims.get(uid)
    }

    /// Every prepared claim.
    pub fn all(&self) -> impl Iterator<Item = &Prepared> {
        self.claims.values()
    }

    /// Keeps `record`, durably before returning.
    ///
    /// # Errors
    /// The write failed; nothing is kept then.
    pub fn put(&mut self, record: Prepared) -> Result<(), StoreError> {
        if let Some(tree) = &self.tree {
            let bytes = serde_json::to_vec(&record).map_err(|source| StoreError::Corrupt {
                uid: record.uid.clone(),
                source,
            })?;
            tree.insert(record.uid.as_bytes(), bytes)?;
            tree.flush()?;
        }
        self.claims.insert(record.uid.clone(), record);
        Ok(())
    }

    /// The instances of unprepared claims still to destroy.
    pub fn doomed(&self) -> impl Iterator<Item = &MadeInstance> {
        self.doomed.values()
    }

    /// Keeps `made` to destroy later, durably before returning.
    ///
    /// # Errors
    /// The write failed; it is kept in memory all the same (destroyed while the agent runs).
    pub fn doom(&mut self, made: &MadeInstance) -> Result<(), StoreError> {
        let key = format!("{DOOMED}{}", made.uuid);
        self.doomed.insert(made.uuid.clone(), made.clone());
        if let Some(tree) = &self.tree {
            let bytes = serde_json::to_vec(made).map_err(|source| StoreError::Corrupt {
                uid: key.clone(),
                source,
            })?;
            tree.insert(key.as_bytes(), bytes)?;
            tree.flush()?;
        }
        Ok(())
    }

    /// Forgets the instance `uuid` to destroy (destroyed, or gone).
    ///
    /// # Errors
    /// The write failed.
    pub fn spare(&mut self, uuid: &str) -> Result<(), StoreError> {
        if let Some(tree) = &self.tree {
            tree.remove(format!("{DOOMED}{uuid}").as_bytes())?;
            tree.flush()?;
        }
        self.doomed.remove(uuid);
        Ok(())
    }

    /// Forgets `uid`; returns what was kept.
    ///
    /// # Errors
    /// The write failed.
    pub fn remove(&mut self, uid: &str) -> Result<Option<Prepared>, StoreError> {
        if let Some(tree) = &self.tree {
            tree.remove(uid.as_bytes())?;
            tree.flush()?;
        }
        Ok(self.claims.remove(uid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn made(uuid: &str) -> MadeInstance {
        MadeInstance {
            device: "gpu-1-2g-35gb-at-0".into(),
            gpu: "GPU-1".into(),
            profile: "2g.35gb".into(),
            start: 0,
            uuid: uuid.into(),
            index: 4,
        }
    }

    #[test]
    fn made_instances_and_those_to_destroy_outlive_a_restart() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = || Some(db.open_tree(TREE).unwrap());
        let uid = "0a000000-0000-4000-8000-00000000000a";
        // A record written before partitions: no `made`, read as none.
        let old = serde_json::json!({
            "namespace": "ml", "name": "old", "uid": uid, "pod_uid": "p", "pod_name": "train-0",
            "quota": null, "devices": [], "cdi_device_ids": [],
        });
        db.open_tree(TREE)
            .unwrap()
            .insert(uid, serde_json::to_vec(&old).unwrap())
            .unwrap();
        let mut store = ClaimStore::load(tree()).unwrap();
        let mut record = store.get(uid).unwrap().clone();
        assert!(record.made.is_empty());

        record.made = vec![made("MIG-a")];
        store.put(record.clone()).unwrap();
        store.doom(&made("MIG-b")).unwrap();
        let again = ClaimStore::load(tree()).unwrap();
        assert_eq!(again.get(uid), Some(&record));
        assert_eq!(again.doomed().collect::<Vec<_>>(), [&made("MIG-b")]);
        // A key to destroy is not a claim.
        assert_eq!(again.all().count(), 1);

        store.spare("MIG-b").unwrap();
        assert_eq!(ClaimStore::load(tree()).unwrap().doomed().count(), 0);
    }
}
