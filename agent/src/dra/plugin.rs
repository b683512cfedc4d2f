//! The driver's work: `NodePrepareResources` and `NodeUnprepareResources` for one claim each,
//! whichever API version the kubelet speaks.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::mpsc;

use super::{
    DRIVER_NAME, DraConfig,
    apiserver::{self, ApiServer},
    cdi,
    claim::{self, ResourceClaim},
    store::{ClaimStore, Prepared},
};
use crate::{control::QuotaCommand, devices::GpuDevice, enforcement::quota::QuotaSpec};

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    /// Namespace.
    pub namespace: String,
    /// UID.
    pub uid: String,
    /// Name.
    pub name: String,
}

/// The DRA driver of this node.
pub struct Driver {
    config: DraConfig,
    node: String,
    offered: Vec<GpuDevice>,
    all: Vec<GpuDevice>,
    api: ApiServer,
    store: Mutex<ClaimStore>,
    quotas: mpsc::UnboundedSender<QuotaCommand>,
}

impl Driver {
    /// A driver for `node`, offering `offered` of the node's GPUs `all`, passing quotas to
    /// enforcement on `quotas`.
    #[must_use]
    pub fn new(
        config: DraConfig,
        node: String,
        offered: Vec<GpuDevice>,
        all: Vec<GpuDevice>,
        api: ApiServer,
        store: ClaimStore,
        quotas: mpsc::UnboundedSender<QuotaCommand>,
    ) -> Arc<Self> {
        Arc::new(Self {
            config,
            node,
            offered,
            all,
            api,
            store: Mutex::new(store),
            quotas,
        })
    }

    fn store(&self) -> MutexGuard<'_, ClaimStore> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Prepares `claim`: reads it from the API server, turns its allocation into a quota bound
    /// to the reserving pod, writes its CDI spec and keeps the record. A claim prepared before
    /// (also by an earlier run of the agent) gets the same answer without asking the API server.
    ///
    /// # Errors
    /// The per-claim error text for the kubelet.
    pub async fn prepare(&self, claim: &ClaimRef) -> Result<Prepared, String> {
        let known = self.store().get(&claim.uid).cloned();
        if let Some(record) = known {
            // The spec may have been removed by hand or lost with a tmpfs: write it again.
            self.write_cdi(&record)?;
            return Ok(record);
        }
        let path = format!(
            "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{}",
            claim.namespace, claim.name
        );
        let answer = self
            .api
            .request(http::Method::GET, &path, None)
            .await
            .map_err(|e| {
                format!(
                    "reading ResourceClaim {}/{}: {e}",
                    claim.namespace, claim.name
                )
            })?;
        if answer.status == 404 {
            return Err(format!(
                "ResourceClaim {}/{} not found",
                claim.namespace, claim.name
            ));
        }
        let object: ResourceClaim = apiserver::json(&answer, "GET", &path).map_err(|e| {
            format!(
                "reading ResourceClaim {}/{}: {e}",
                claim.namespace, claim.name
            )
        })?;
        let plan = claim::plan(
            &object,
            &claim.uid,
            &self.node,
            &self.offered,
            &self.all,
            self.config.policy,
        )
        .map_err(|e| e.to_string())?;
        let quota = QuotaSpec::from_allocate(&plan.allocate, &self.offered)
            .map_err(|e| format!("ResourceClaim {}/{}: {e}", claim.namespace, claim.name))?;
        let record = Prepared {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
            pod_uid: plan.pod_uid,
            pod_name: plan.pod_name,
            quota,
            devices: plan.devices,
            cdi_device_ids: vec![cdi::device_id(&claim.uid)],
        };
        self.write_cdi(&record)?;
        // Enforced only once it is on disk, so a restarted agent holds what the kubelet was told.
        self.store()
            .put(record.clone())
            .map_err(|e| format!("keeping the claim: {e}"))?;
        if let Some(spec) = &record.quota {
            let _ = self.quotas.send(QuotaCommand::Apply(spec.clone()));
        }
        tracing::info!(
            claim = %format!("{}/{}", record.namespace, record.name),
            uid = %record.uid,
            pod = %record.pod_uid,
            devices = %record.devices.iter().map(|d| d.device.as_str()).collect::<Vec<_>>().join(","),
            "{DRIVER_NAME}: claim prepared"
        );
        Ok(record)
    }

    /// Unprepares `claim`: lifts its quota, removes its CDI spec and its record. An unknown claim
    /// is already unprepared.
    ///
    /// # Errors
    /// The per-claim error text for the kubelet.
    pub fn unprepare(&self, claim: &ClaimRef) -> Result<(), String> {
        cdi::remove(&self.config.cdi_dir, &claim.uid)
            .map_err(|e| format!("removing the CDI spec: {e}"))?;
        let removed = self
            .store()
            .remove(&claim.uid)
            .map_err(|e| format!("forgetting the claim: {e}"))?;
        if let Some(record) = removed {
            let _ = self
                .quotas
                .send(QuotaCommand::Release(claim::session_id(&record.uid)));
            tracing::info!(
                claim = %format!("{}/{}", record.namespace, record.name),
                uid = %record.uid,
                "{DRIVER_NAME}: claim unprepared"
            );
        }
        Ok(())
    }

    fn write_cdi(&self, record: &Prepared) -> Result<(), String> {
        let indexes: Vec<u32> = record
            .quota
            .as_ref()
            .map(|q| q.devices.iter().map(|d| d.index).collect())
            .unwrap_or_default();
        let gpus: Vec<&GpuDevice> = self
            .offered
            .iter()
            .filter(|g| indexes.contains(&g.index))
            .collect();
        cdi::write(
            &self.config.cdi_dir,
            &record.uid,
            &cdi::spec(&record.uid, &gpus),
        )
        .map(|_| ())
        .map_err(|e| format!("writing the CDI spec: {e}"))
    }
}
