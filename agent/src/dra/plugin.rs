//! The driver's work: `NodePrepareResources` and `NodeUnprepareResources` for one claim each,
//! whichever API version the kubelet speaks.

use gpuwarden_runtime::sync::Lock as _;
use std::sync::{Arc, Mutex, MutexGuard};

use gpuwarden_types::{
    dns::{is_dns_label, is_dns_subdomain},
    target::is_uuid,
};
use tokio::sync::mpsc;

use super::{
    DRIVER_NAME, DraConfig,
    apiserver::{self, ApiServer},
    cdi,
    claim::{self, ResourceClaim},
    store::{ClaimStore, Prepared},
};
use crate::{
    control::Observed,
    devices::GpuDevice,
    enforcement::{QuotaCommand, quota::QuotaSpec},
};

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

impl ClaimRef {
    /// Checks what becomes a file name (the CDI spec), a store key, a session id and an API path
    /// before any of them is made: the UID a UUID, the namespace a DNS label, the name a DNS
    /// subdomain.
    ///
    /// # Errors
    /// The per-claim error text for the kubelet, naming the bad part.
    pub fn check(&self) -> Result<(), String> {
        if !is_uuid(&self.uid) {
            return Err(format!("claim UID {:?} is not a UUID", cut(&self.uid)));
        }
        if !is_dns_label(&self.namespace) {
            return Err(format!(
                "claim namespace {:?} is not a DNS label",
                cut(&self.namespace)
            ));
        }
        if !is_dns_subdomain(&self.name) {
            return Err(format!(
                "claim name {:?} is not a DNS subdomain",
                cut(&self.name)
            ));
        }
        Ok(())
    }
}

/// At most 80 characters of `s`, for an error message.
fn cut(s: &str) -> String {
    s.chars().take(80).collect()
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
    observed: Arc<Observed>,
}

impl Driver {
    /// A driver for `node`, offering `offered` of the node's GPUs `all`, passing quotas to
    /// enforcement on `quotas` and the claims it holds to the controller link through
    /// `observed` (those in `store` at once).
    #[must_use]
    #[expect(clippy::too_many_arguments, reason = "One of each part it is wired to")]
    pub fn new(
        config: DraConfig,
        node: String,
        offered: Vec<GpuDevice>,
        all: Vec<GpuDevice>,
        api: ApiServer,
        store: ClaimStore,
        quotas: mpsc::UnboundedSender<QuotaCommand>,
        observed: Arc<Observed>,
    ) -> Arc<Self> {
        for record in store.all() {
            observed.hold(observed_session(record, &offered));
        }
        Arc::new(Self {
            config,
            node,
            offered,
            all,
            api,
            store: Mutex::new(store),
            quotas,
            observed,
        })
    }

    fn store(&self) -> MutexGuard<'_, ClaimStore> {
        self.store.locked()
    }

    /// Prepares `claim`: reads it from the API server, turns its allocation into a quota bound
    /// to the reserving pod, writes its CDI spec and keeps the record. A claim prepared before
    /// (also by an earlier run of the agent) gets the same answer without asking the API server.
    ///
    /// # Errors
    /// The per-claim error text for the kubelet.
    pub async fn prepare(&self, claim: &ClaimRef) -> Result<Prepared, String> {
        claim.check()?;
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
        if plan.held_whole() {
            tracing::error!(
                claim = %format!("{}/{}", claim.namespace, claim.name),
                "{DRIVER_NAME}: kube-scheduler allocated this claim a whole GPU (no shareID): the \
                 DRAConsumableCapacity feature gate is off in kube-scheduler; every claim gets a \
                 whole GPU until it is on there, in kube-apiserver and in the kubelet"
            );
        }
        // Administrative access: the device nodes and no quota (an empty one would bind the
        // pod to no GPU at all).
        let quota = if plan.allocate.devices.is_empty() {
            None
        } else {
            QuotaSpec::from_allocate(&plan.allocate, &self.offered)
                .map_err(|e| format!("ResourceClaim {}/{}: {e}", claim.namespace, claim.name))?
        };
        let class = self
            .pod_class(&claim.namespace, &plan.pod_name, &plan.pod_uid)
            .await;
        let record = Prepared {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
            pod_uid: plan.pod_uid,
            pod_name: plan.pod_name,
            class,
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
        self.observed.hold(observed_session(&record, &self.offered));
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
        claim.check()?;
        cdi::remove(&self.config.cdi_dir, &claim.uid)
            .map_err(|e| format!("removing the CDI spec: {e}"))?;
        let removed = self
            .store()
            .remove(&claim.uid)
            .map_err(|e| format!("forgetting the claim: {e}"))?;
        if let Some(record) = removed {
            let session = claim::session_id(&record.uid);
            let _ = self.quotas.send(QuotaCommand::Release(session.clone()));
            self.observed.end(&session);
            tracing::info!(
                claim = %format!("{}/{}", record.namespace, record.name),
                uid = %record.uid,
                "{DRIVER_NAME}: claim unprepared"
            );
        }
        Ok(())
    }

    /// The workload class of the reserving pod, by the rule the controller's extender scores
    /// it with (`gpuwarden_types::workload`), so what it uses teaches the profile its next
    /// replicas are scored by. The pod is read from the API server; where that fails the class
    /// is the pod's name (the rule's last resort), and the claim is prepared all the same.
    async fn pod_class(&self, namespace: &str, pod: &str, uid: &str) -> String {
        let path = format!("/api/v1/namespaces/{namespace}/pods/{pod}");
        let answer = match self.api.request(http::Method::GET, &path, None).await {
            Ok(answer) if answer.status == 200 => answer,
            Ok(answer) => {
                tracing::warn!(pod = %format!("{namespace}/{pod}"), status = answer.status, "{DRIVER_NAME}: reading the pod for its workload class; filed under its name");
                return pod.to_owned();
            }
            Err(e) => {
                tracing::warn!(pod = %format!("{namespace}/{pod}"), "{DRIVER_NAME}: reading the pod for its workload class: {e}; filed under its name");
                return pod.to_owned();
            }
        };
        match apiserver::json::<serde_json::Value>(&answer, "GET", &path) {
            // Another pod of the same name (the one reserving the claim is gone): not its class.
            Ok(object) if object.pointer("/metadata/uid").and_then(|u| u.as_str()) == Some(uid) => {
                gpuwarden_types::workload::workload_class(&object)
            }
            Ok(_) => pod.to_owned(),
            Err(e) => {
                tracing::warn!(pod = %format!("{namespace}/{pod}"), "{DRIVER_NAME}: reading the pod for its workload class: {e}; filed under its name");
                pod.to_owned()
            }
        }
    }

    fn write_cdi(&self, record: &Prepared) -> Result<(), String> {
        // The devices the claim was allocated (administrative access has them without a
        // quota); a record from before it kept them only in its quota.
        let indexes: Vec<u32> = record
            .quota
            .as_ref()
            .map(|q| q.devices.iter().map(|d| d.index).collect())
            .unwrap_or_default();
        let gpus: Vec<&GpuDevice> = self
            .offered
            .iter()
            .filter(|g| {
                indexes.contains(&g.index)
                    || record
                        .devices
                        .iter()
                        .any(|d| d.device == super::device_name(g))
            })
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

/// A prepared claim as the controller hears of it: a session it observes (`k8s-<claim uid>`),
/// holding the claim's shares and memory on the GPUs `offered` to Kubernetes.
#[must_use]
pub fn observed_session(
    record: &Prepared,
    offered: &[GpuDevice],
) -> gpuwarden_proto::v1::ObservedSession {
    use gpuwarden_proto::{convert, v1 as pb};
    let quota = record.quota.as_ref();
    pb::ObservedSession {
        session_id: claim::session_id(&record.uid),
        devices: quota
            .map(|q| {
                q.devices
                    .iter()
                    .map(|d| pb::DeviceShare {
                        uuid: offered
                            .iter()
                            .find(|g| g.index == d.index)
                            .map(|g| g.uuid.clone())
                            .unwrap_or_default(),
                        index: d.index,
                        shares: claim::decimal(u64::from(d.shares_ppm)),
                        memory_bytes: d.memory_bytes,
                        exclusive: false,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        target: quota.and_then(|q| convert::target_to_pb(&q.target)),
        policy: quota.map(|q| {
            convert::policy_to_pb(gpuwarden_types::policy::QuotaPolicy {
                memory: q.memory_policy,
                compute: q.compute_policy,
            })
        }),
        claim: Some(pb::KubernetesClaim {
            namespace: record.namespace.clone(),
            claim_name: record.name.clone(),
            claim_uid: record.uid.clone(),
            pod_name: record.pod_name.clone(),
            pod_uid: record.pod_uid.clone(),
        }),
        class: record.class.clone(),
        ended: false,
    }
}

#[cfg(test)]
mod tests {
    use super::ClaimRef;

    #[test]
    fn claim_names_that_could_escape_a_path_are_refused() {
        let ok = ClaimRef {
            namespace: "ml".into(),
            uid: "4a1b2c3d-0000-4000-8000-000000000001".into(),
            name: "train-0.gpu".into(),
        };
        assert_eq!(ok.check(), Ok(()));
        for (bad, words) in [
            (
                ClaimRef {
                    uid: "../../etc/cdi/evil".into(),
                    ..ok.clone()
                },
                "not a UUID",
            ),
            (
                ClaimRef {
                    namespace: "../kube-system".into(),
                    ..ok.clone()
                },
                "not a DNS label",
            ),
            (
                ClaimRef {
                    name: "a/b".into(),
                    ..ok.clone()
                },
                "not a DNS subdomain",
            ),
            (
                ClaimRef {
                    name: String::new(),
                    ..ok.clone()
                },
                "not a DNS subdomain",
            ),
        ] {
            let err = bad.check().expect_err(words);
            assert!(err.contains(words), "{err}");
        }
    }
}
