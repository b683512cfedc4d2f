//! The driver's work: `NodePrepareResources` and `NodeUnprepareResources` for one claim each,
//! whichever API version the kubelet speaks.

use crate::devices::changes::DeviceChanges;
use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, MutexGuard},
};

use gpuwarden_types::{
    dns::{is_dns_label, is_dns_subdomain},
    target::is_uuid,
};
use tokio::sync::mpsc;

use super::{
    DRIVER_NAME, DraConfig,
    apiserver::{self, ApiServer},
    cdi,
    claim::{self, PlannedDevice, ResourceClaim},
    partition,
    store::{ClaimStore, MadeInstance, Prepared},
};
use crate::{
    control::{
        Observed,
        link::{ProcessView, device_to_pb},
    },
    devices::{
        GpuBackend, GpuDevice,
        ondemand::{MigChangeError, Reconfigurer},
        placement::GiProfile,
    },
    enforcement::{
        QuotaCommand,
        quota::{MigAccess, QuotaSpec},
    },
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

/// What a [`Driver`] is wired to besides the GPUs.
pub struct DriverParts {
    /// The `[dra]` settings.
    pub config: DraConfig,
    /// The node's name.
    pub node: String,
    /// The API server.
    pub api: ApiServer,
    /// The prepared claims.
    pub store: ClaimStore,
    /// Quotas to enforcement.
    pub quotas: mpsc::UnboundedSender<QuotaCommand>,
    /// The claims held, for the controller link.
    pub observed: Arc<Observed>,
}

/// The node's GPUs as a [`Driver`] sees them.
pub struct DriverGpus {
    /// The backend, for the GPUs as they are now (MIG instances made and destroyed).
    pub backend: Arc<dyn GpuBackend>,
    /// The GPUs published as partitions (UUIDs, as the backend spells them), whose MIG
    /// instances are made for claims.
    pub partitioned: Vec<String>,
}

/// The answer to a prepare that would change a MIG layout while the agent's view of its
/// processes can't be read.
const NO_VIEW: &str =
    "the agent's view of its GPU processes can't be read; no MIG instance is made";

/// The DRA driver of this node.
pub struct Driver {
    config: DraConfig,
    node: String,
    /// The devices offered to Kubernetes as last read ([`Driver::offered_now`]).
    offered: Mutex<Vec<GpuDevice>>,
    /// The devices that left the offered set while the agent ran, by name (their UUID then):
    /// a claim allocated one before is told it is gone. One per device name at most.
    gone: Mutex<BTreeMap<String, String>>,
    api: ApiServer,
    store: Mutex<ClaimStore>,
    quotas: mpsc::UnboundedSender<QuotaCommand>,
    observed: Arc<Observed>,
    /// The node's GPUs as they are now (MIG instances made and destroyed).
    backend: Arc<dyn GpuBackend>,
    /// Makes and destroys the instances of partition devices, on the GPUs published as
    /// partitions only (reconfigurable and offered to Kubernetes).
    reconfigurer: Reconfigurer,
    /// One claim's instances made (or its record found) at a time: a prepare the kubelet
    /// retries while the first still runs makes nothing twice.
    making: tokio::sync::Mutex<()>,
    /// Woken when a MIG layout changed: the partition pool is published again.
    layout_changed: tokio::sync::Notify,
    /// Told when an instance was made or destroyed: the programs' instance table follows.
    devices_changed: Mutex<Option<DeviceChanges>>,
    /// The agent's own view of its GPU processes, asked with the driver's count before a
    /// layout change (none: the driver's count alone).
    processes: Mutex<Option<Arc<dyn ProcessView>>>,
}

impl Driver {
    /// A driver wired to `parts`, on the node's GPUs `gpus`; the claims in the store are
    /// reported held through `parts.observed` at once (their instances made again where a
    /// reboot took them).
    #[must_use]
    pub fn new(parts: DriverParts, gpus: DriverGpus) -> Arc<Self> {
        let DriverParts {
            config,
            node,
            api,
            store,
            quotas,
            observed,
        } = parts;
        let DriverGpus {
            backend,
            partitioned,
        } = gpus;
        let this = Self {
            config,
            node,
            offered: Mutex::new(Vec::new()),
            gone: Mutex::new(BTreeMap::new()),
            api,
            store: Mutex::new(store),
            quotas,
            observed,
            backend,
            reconfigurer: Reconfigurer::new(partitioned),
            making: tokio::sync::Mutex::new(()),
            layout_changed: tokio::sync::Notify::new(),
            devices_changed: Mutex::new(None),
            processes: Mutex::new(None),
        };
        this.remake_gone_at_start();
        // Read after the instances a reboot took are made again: those are their claims'.
        let devices = this.backend.devices();
        let offered = this.offered_among(devices.clone());
        // A claim whose instance is gone holds nothing: the controller hears of it once a
        // prepare has made the instance again.
        for record in this.store().all() {
            if record.made.iter().all(|m| m.is_among(&devices)) {
                this.observed.hold(observed_session(record, &offered));
            }
        }
        Arc::new(this)
    }

    /// The devices offered to Kubernetes as the backend lists them now: those `[dra] gpus`
    /// selects, less the MIG instances made for claims' partitions (each is its claim's whole,
    /// not a shared device of the node's pool). The operator may make or destroy an instance
    /// while the agent runs: a change is kept for the next prepare and told to the controller
    /// link (its next registration); the publisher republishes the slice from it.
    pub fn offered_now(&self) -> Vec<GpuDevice> {
        self.offered_among(self.backend.devices())
    }

    /// As [`Self::offered_now`], of `devices`: the backend's list, read by the caller.
    fn offered_among(&self, devices: Vec<GpuDevice>) -> Vec<GpuDevice> {
        let offered: Vec<GpuDevice> = {
            let store = self.store();
            let made: Vec<&MadeInstance> = store
                .all()
                .flat_map(|p| &p.made)
                .chain(store.doomed())
                .collect();
            devices
                .into_iter()
                .filter(|g| {
                    self.config.offers(g)
                        // Made here and not kept in the store yet (a prepare under way).
                        && !self.reconfigurer.made(&g.uuid)
                        && !made.iter().any(|m| m.is_among(std::slice::from_ref(g)))
                })
                .collect()
        };
        let mut last = self.offered.locked();
        if *last != offered {
            let names = |gpus: &[GpuDevice]| -> Vec<String> {
                gpus.iter()
                    .map(|g| format!("{}={}", super::device_name(g), g.uuid))
                    .collect()
            };
            let (was, now) = (names(&last), names(&offered));
            if was != now && !was.is_empty() {
                tracing::info!(
                    was = %was.join(","),
                    now = %now.join(","),
                    "{DRIVER_NAME}: the devices offered to Kubernetes changed"
                );
            }
            self.observed
                .set_kubernetes_devices(offered.iter().map(device_to_pb).collect());
            let mut gone = self.gone.locked();
            for g in last.iter() {
                if !offered.iter().any(|o| o.uuid == g.uuid) {
                    gone.insert(super::device_name(g), g.uuid.clone());
                }
            }
            for g in &offered {
                gone.remove(&super::device_name(g));
            }
            drop(gone);
            last.clone_from(&offered);
        }
        offered
    }

    /// The quotas of the claims prepared before this run, to enforce again: those of claims
    /// whose MIG instances are there (made again where a reboot took them) only. A quota
    /// naming an instance that is gone and could not be made again names a device index that
    /// may be another device's now: it waits for the kubelet's next prepare.
    #[must_use]
    pub fn held_quotas(&self) -> Vec<QuotaSpec> {
        let devices = self.backend.devices();
        self.store()
            .all()
            .filter(|r| r.made.iter().all(|m| m.is_among(&devices)))
            .filter_map(|r| r.quota.clone())
            .collect()
    }

    /// Makes again, at start, the instances of prepared claims that are gone (a node rebooted:
    /// the driver keeps no MIG instance across a reboot); one that can't be made is logged,
    /// and the kubelet's next prepare tries again and answers why.
    fn remake_gone_at_start(&self) {
        let records: Vec<Prepared> = self.store().all().cloned().collect();
        for record in records {
            // No view of the processes yet (telemetry starts later): the driver's count.
            if let Err(e) = self.remake_gone(&record, &BTreeSet::new()) {
                tracing::error!(
                    claim = %format!("{}/{}", record.namespace, record.name),
                    "{DRIVER_NAME}: {e}; its quota is not enforced until it is"
                );
            }
        }
    }

    /// Makes again the instances of `record` the backend no longer lists, each at its
    /// profile and start through the same checks as at prepare, and keeps the record with
    /// their UUIDs and device indexes now, its quota naming the new indexes and capability
    /// nodes. `None` when none was gone; all or nothing, as at prepare.
    ///
    /// # Errors
    /// The per-claim error text for the kubelet: an instance refused, or the record not kept
    /// (the instances made again are destroyed then).
    fn remake_gone(
        &self,
        record: &Prepared,
        seen: &BTreeSet<u32>,
    ) -> Result<Option<Prepared>, String> {
        let devices = self.backend.devices();
        let gone: Vec<&MadeInstance> = record
            .made
            .iter()
            .filter(|m| !m.is_among(&devices))
            .collect();
        if gone.is_empty() {
            return Ok(None);
        }
        let mut remade: Vec<(MadeInstance, GpuDevice)> = Vec::new();
        for m in gone {
            let made =
                self.reconfigurer
                    .create(self.backend.as_ref(), seen, &m.gpu, &m.profile, m.start);
            match made {
                Ok(device) => remade.push((m.clone(), device)),
                Err(e) => {
                    self.undo_remade(&remade, seen);
                    return Err(format!(
                        "device {}: its MIG instance {} is gone and was not made again: {e}",
                        m.device, m.uuid
                    ));
                }
            }
        }
        let mut fresh = record.clone();
        for (old, device) in &remade {
            if let Some(quota) = fresh.quota.as_mut() {
                // The part held the old instance: the same shares and memory on the new one.
                if let Some(part) = quota
                    .devices
                    .iter_mut()
                    .find(|d| d.index == old.index && d.mig.is_some())
                {
                    part.index = device.index;
                    part.mig = device.mig.as_ref().map(|mig| MigAccess {
                        node_minor: mig.parent_index,
                        cap_minors: [mig.gi_cap_minor, mig.ci_cap_minor]
                            .into_iter()
                            .flatten()
                            .collect(),
                    });
                }
            }
            if let Some(m) = fresh.made.iter_mut().find(|m| m.uuid == old.uuid) {
                m.uuid.clone_from(&device.uuid);
                m.index = device.index;
            }
        }
        if let Some(quota) = fresh.quota.as_mut() {
            quota.devices.sort_by_key(|d| d.index);
        }
        if let Err(e) = self.store().put(fresh.clone()) {
            self.undo_remade(&remade, seen);
            return Err(format!("keeping the claim's MIG instances made again: {e}"));
        }
        self.layout_did_change();
        tracing::info!(
            claim = %format!("{}/{}", fresh.namespace, fresh.name),
            instances = %remade.iter().map(|(m, d)| format!("{}={}", m.device, d.uuid)).collect::<Vec<_>>().join(","),
            "{DRIVER_NAME}: MIG instances gone since prepare made again"
        );
        Ok(Some(fresh))
    }

    /// Destroys the instances `remade` for a record that was not kept.
    fn undo_remade(&self, remade: &[(MadeInstance, GpuDevice)], seen: &BTreeSet<u32>) {
        if remade.is_empty() {
            return;
        }
        let undo: Vec<MadeInstance> = remade
            .iter()
            .map(|(m, d)| MadeInstance {
                uuid: d.uuid.clone(),
                index: d.index,
                ..m.clone()
            })
            .collect();
        self.destroy_or_doom(&undo, seen);
        self.layout_did_change();
    }

    /// The answer to a prepare of a claim prepared before: its record, its instances made
    /// again where they are gone (its quota then enforced anew), its CDI spec written again.
    /// The caller holds `making`: one claim's instances (and CDI spec) at a time.
    async fn answer_known(&self, record: Prepared) -> Result<Prepared, String> {
        let devices = self.backend.devices();
        let seen = if record.made.iter().all(|m| m.is_among(&devices)) {
            BTreeSet::new()
        } else {
            self.seen().await.ok_or(NO_VIEW)?
        };
        let record = match self.remake_gone(&record, &seen)? {
            Some(fresh) => {
                if let Some(spec) = &fresh.quota {
                    let _ = self.quotas.send(QuotaCommand::Apply(spec.clone()));
                }
                self.observed
                    .hold(observed_session(&fresh, &self.offered_now()));
                fresh
            }
            None => record,
        };
        // The spec may have been removed by hand or lost with a tmpfs: write it again.
        self.write_cdi(&record)?;
        Ok(record)
    }

    /// The agent's own view of its GPU processes (the telemetry task), asked before an
    /// instance is made or destroyed beside the driver's count.
    pub fn on_processes(&self, view: Arc<dyn ProcessView>) {
        *self.processes.locked() = Some(view);
    }

    /// The devices a process is on as the agent sees it; `None` when its view can't be read
    /// (then nothing is changed).
    async fn seen(&self) -> Option<BTreeSet<u32>> {
        let view = self.processes.locked().clone();
        match view {
            Some(v) => v.busy().await,
            None => Some(BTreeSet::new()),
        }
    }

    /// Where to say that an instance was made or destroyed (the daemon's device-list task).
    pub fn on_devices_changed(&self, tx: DeviceChanges) {
        // Instances made again at start (after a reboot) came before anyone listened.
        tx.notify();
        *self.devices_changed.locked() = Some(tx);
    }

    /// Completes when a MIG layout of a partitioned GPU changed since the last call (an
    /// instance made or destroyed for a claim).
    pub async fn layout_changed(&self) {
        self.layout_changed.notified().await;
    }

    /// The GPUs published as partitions, with their layouts now.
    #[must_use]
    pub fn partitioned(&self) -> Vec<(partition::PartitionedGpu, String)> {
        self.backend
            .mig_layouts()
            .into_iter()
            .filter(|(uuid, ..)| self.reconfigurer.allows(uuid))
            .map(|(uuid, index, layout)| {
                let model = layout.model.name.to_owned();
                (
                    partition::PartitionedGpu {
                        uuid,
                        index,
                        layout,
                    },
                    model,
                )
            })
            .collect()
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
        let known = self.store().get(&claim.uid).is_some();
        if known {
            let _making = self.making.lock().await;
            let record = self.store().get(&claim.uid).cloned();
            if let Some(record) = record {
                return self.answer_known(record).await;
            }
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
        let (offered, plan) = self.plan(&object, claim)?;
        if plan.held_whole() {
            tracing::error!(
                claim = %format!("{}/{}", claim.namespace, claim.name),
                "{DRIVER_NAME}: kube-scheduler allocated this claim a whole GPU (no shareID): the \
                 DRAConsumableCapacity feature gate is off in kube-scheduler; every claim gets a \
                 whole GPU until it is on there, in kube-apiserver and in the kubelet"
            );
        }
        let class = self
            .pod_class(&claim.namespace, &plan.pod_name, &plan.pod_uid)
            .await;
        // One claim at a time from here: a prepare retried meanwhile finds the record.
        let _making = self.making.lock().await;
        let known = self.store().get(&claim.uid).cloned();
        if let Some(record) = known {
            return self.answer_known(record).await;
        }
        let seen = if plan.partitions.is_empty() {
            BTreeSet::new()
        } else {
            self.seen().await.ok_or(NO_VIEW)?
        };
        let made = self.make_partitions(&plan.partitions, &seen)?;
        let kept = self.keep(claim, plan, class, &made, &offered);
        if !made.is_empty() {
            if kept.is_err() {
                // Nothing half made: the instances go with the failed prepare.
                let made: Vec<MadeInstance> = made.into_iter().map(|(m, _)| m).collect();
                self.destroy_or_doom(&made, &seen);
            }
            self.layout_did_change();
        }
        let record = kept?;
        if let Some(spec) = &record.quota {
            let _ = self.quotas.send(QuotaCommand::Apply(spec.clone()));
        }
        self.observed.hold(observed_session(&record, &offered));
        if !record.made.is_empty() {
            tracing::info!(
                claim = %format!("{}/{}", record.namespace, record.name),
                instances = %record.made.iter().map(|m| format!("{}={}", m.device, m.uuid)).collect::<Vec<_>>().join(","),
                "{DRIVER_NAME}: MIG instances made for the claim's partitions"
            );
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

    /// The claim's plan on the devices offered now (returned with it): a device the
    /// operator's MIG change took since it was published is refused by name (and the UUID it
    /// had), not prepared on a device that is gone.
    fn plan(
        &self,
        object: &ResourceClaim,
        claim: &ClaimRef,
    ) -> Result<(Vec<GpuDevice>, claim::Plan), String> {
        // One reading of the backend's list for both: what is offered is among what is there.
        let devices = self.backend.devices();
        let offered = self.offered_among(devices.clone());
        let plan = claim::plan(
            object,
            &claim.uid,
            &self.node,
            &offered,
            &devices,
            self.config.policy,
        )
        .map_err(|e| match &e {
            claim::ClaimError::NoSuchDevice(device) => match self.gone.locked().get(device) {
                Some(uuid) => format!(
                    "device {device}: gone from this node since it was published ({uuid} is \
                     no longer listed: its MIG instance destroyed?)"
                ),
                None => e.to_string(),
            },
            _ => e.to_string(),
        })?;
        Ok((offered, plan))
    }

    /// The quota of `plan` with the instances `made` for its partitions, each held whole; its
    /// CDI spec written and its record kept (on disk before it is enforced, so a restarted
    /// agent holds what the kubelet was told).
    fn keep(
        &self,
        claim: &ClaimRef,
        mut plan: claim::Plan,
        class: String,
        made: &[(MadeInstance, GpuDevice)],
        offered: &[GpuDevice],
    ) -> Result<Prepared, String> {
        plan.allocate
            .devices
            .extend(made.iter().map(|(_, d)| gpuwarden_proto::v1::DeviceShare {
                uuid: d.uuid.clone(),
                index: d.index,
                shares: "1".to_owned(),
                memory_bytes: d.memory_bytes,
                exclusive: false,
            }));
        let gpus: Vec<GpuDevice> = offered
            .iter()
            .chain(made.iter().map(|(_, d)| d))
            .cloned()
            .collect();
        // Administrative access: the device nodes and no quota (an empty one would bind the
        // pod to no GPU at all).
        let quota = if plan.allocate.devices.is_empty() {
            None
        } else {
            QuotaSpec::from_allocate(&plan.allocate, &gpus)
                .map_err(|e| format!("ResourceClaim {}/{}: {e}", claim.namespace, claim.name))?
        };
        let mut devices = plan.devices;
        devices.extend(plan.partitions);
        let record = Prepared {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
            pod_uid: plan.pod_uid,
            pod_name: plan.pod_name,
            class,
            quota,
            devices,
            cdi_device_ids: vec![cdi::device_id(&claim.uid)],
            made: made.iter().map(|(m, _)| m.clone()).collect(),
        };
        self.write_cdi(&record)?;
        if let Err(e) = self.store().put(record.clone()) {
            let _ = cdi::remove(&self.config.cdi_dir, &claim.uid);
            return Err(format!("keeping the claim: {e}"));
        }
        Ok(record)
    }

    /// The GPU, profile and start of the partition device `device`, on a GPU published as
    /// partitions.
    fn find_partition(&self, device: &str) -> Option<(String, &'static GiProfile, u32)> {
        self.backend
            .mig_layouts()
            .into_iter()
            .filter(|(uuid, ..)| self.reconfigurer.allows(uuid))
            .find_map(|(uuid, index, layout)| {
                layout.model.profiles.iter().find_map(|p| {
                    p.placements()
                        .find(|&at| partition::device_name(index, p, at) == device)
                        .map(|at| (uuid.clone(), p, at.start))
                })
            })
    }

    /// Makes the MIG instance of each partition device of a claim, through the same checks as
    /// the controller's instances (the GPU listed in `mig_reconfigurable`, no process on it,
    /// the driver's word on the placement). All or nothing: on a refusal those made already
    /// are destroyed, and the reason is the kubelet's answer.
    fn make_partitions(
        &self,
        planned: &[PlannedDevice],
        seen: &BTreeSet<u32>,
    ) -> Result<Vec<(MadeInstance, GpuDevice)>, String> {
        let mut made: Vec<(MadeInstance, GpuDevice)> = Vec::new();
        for p in planned {
            let one = self
                .find_partition(&p.device)
                .ok_or_else(|| {
                    format!(
                        "device {}: this node has no such MIG partition (a GPU in MIG mode, \
                         listed in mig_reconfigurable and offered to Kubernetes)",
                        p.device
                    )
                })
                .and_then(|(gpu, profile, start)| {
                    // The agent's view of its processes and the driver's count.
                    self.reconfigurer
                        .create(self.backend.as_ref(), seen, &gpu, profile.name, start)
                        .map(|device| {
                            let m = MadeInstance {
                                device: p.device.clone(),
                                gpu,
                                profile: profile.name.to_owned(),
                                start,
                                uuid: device.uuid.clone(),
                                index: device.index,
                            };
                            (m, device)
                        })
                        .map_err(|e| {
                            format!("device {}: the MIG instance was not made: {e}", p.device)
                        })
                });
            match one {
                Ok(m) => made.push(m),
                Err(e) => {
                    if !made.is_empty() {
                        let undo: Vec<MadeInstance> = made.into_iter().map(|(m, _)| m).collect();
                        self.destroy_or_doom(&undo, seen);
                        self.layout_did_change();
                    }
                    return Err(e);
                }
            }
        }
        Ok(made)
    }

    /// Destroys the instance `made` (one gone already counts as destroyed), unless a process
    /// is on its GPU as the driver counts it or the agent sees it (`seen`).
    fn destroy(&self, made: &MadeInstance, seen: &BTreeSet<u32>) -> Result<(), MigChangeError> {
        let devices = self.backend.devices();
        if !devices.iter().any(|d| d.uuid == made.uuid) {
            return Ok(());
        }
        if self.reconfigurer.made(&made.uuid) {
            return self
                .reconfigurer
                .release(self.backend.as_ref(), seen, &made.uuid)
                .map(|_| ());
        }
        // Made by an earlier run of the agent (the claim store says so), which the
        // reconfigurer of this run does not know: the same checks, here.
        if !self.reconfigurer.allows(&made.gpu) {
            return Err(MigChangeError::NotAllowed {
                gpu: made.gpu.clone(),
            });
        }
        let parent = self
            .backend
            .mig_layouts()
            .into_iter()
            .find(|(uuid, ..)| *uuid == made.gpu)
            .map(|(_, index, _)| index);
        // The driver's count as every MIG change reads it (a GPU whose processes can't be
        // listed is busy), and the agent's own.
        let busy: BTreeSet<u32> = self
            .backend
            .busy_devices()
            .into_iter()
            .chain(seen.iter().copied())
            .collect();
        let on_gpu = parent
            .into_iter()
            .chain(
                devices
                    .iter()
                    .filter(|d| d.mig.as_ref().is_some_and(|m| m.parent_uuid == made.gpu))
                    .map(|d| d.index),
            )
            .find(|i| busy.contains(i));
        if let Some(index) = on_gpu {
            return Err(MigChangeError::Busy {
                gpu: made.gpu.clone(),
                index,
            });
        }
        self.backend.destroy_instance(&made.uuid)?;
        tracing::info!(gpu = %made.gpu, instance = %made.uuid, "MIG instance destroyed");
        Ok(())
    }

    /// Destroys each of `made`, each kept in the store as to destroy first, so that neither the
    /// driver's refusal (a process still on its GPU) nor an agent stopped meanwhile leaves one
    /// behind: what is left is tried again at each tick ([`Driver::destroy_doomed`]).
    fn destroy_or_doom(&self, made: &[MadeInstance], seen: &BTreeSet<u32>) {
        for m in made {
            if let Err(e) = self.store().doom(m) {
                tracing::error!(instance = %m.uuid, "{DRIVER_NAME}: MIG instance to destroy kept in memory only: {e}");
            }
        }
        let mut changed = false;
        for m in made {
            changed |= self.settle(m, true, seen);
        }
        if changed {
            self.layout_did_change();
        }
    }

    /// Tries to destroy the instance `m` kept as to destroy; forgets it once destroyed (or
    /// gone, or not the agent's to destroy any more). Whether it was destroyed now. `say`:
    /// warn when the driver refuses (once, not at every tick).
    fn settle(&self, m: &MadeInstance, say: bool, seen: &BTreeSet<u32>) -> bool {
        let destroyed = match self.destroy(m, seen) {
            Ok(()) => true,
            Err(e @ (MigChangeError::Busy { .. } | MigChangeError::Refused { .. })) => {
                if say {
                    tracing::warn!(instance = %m.uuid, device = %m.device, "{DRIVER_NAME}: MIG instance not destroyed yet, tried again later: {e}");
                }
                return false;
            }
            Err(e) => {
                tracing::error!(instance = %m.uuid, device = %m.device, "{DRIVER_NAME}: MIG instance not destroyed, given up: {e}");
                false
            }
        };
        if let Err(e) = self.store().spare(&m.uuid) {
            tracing::warn!(instance = %m.uuid, "{DRIVER_NAME}: forgetting a destroyed instance: {e}");
        }
        destroyed
    }

    /// Tries again to destroy the instances of unprepared claims the driver refused before;
    /// whether any was destroyed (the layout changed). Nothing is tried while the agent's
    /// view of its processes can't be read.
    pub async fn destroy_doomed(&self) -> bool {
        let doomed: Vec<MadeInstance> = self.store().doomed().cloned().collect();
        if doomed.is_empty() {
            return false;
        }
        let Some(seen) = self.seen().await else {
            return false;
        };
        let mut changed = false;
        for m in &doomed {
            changed |= self.settle(m, false, &seen);
        }
        if changed {
            self.layout_did_change();
        }
        changed
    }

    /// Says a layout changed: to the partition publisher and the device-list task.
    fn layout_did_change(&self) {
        self.layout_changed.notify_one();
        if let Some(tx) = self.devices_changed.locked().as_ref() {
            tx.notify();
        }
    }

    /// Unprepares `claim`: lifts its quota, removes its CDI spec and its record, and destroys
    /// the MIG instances made for it (later, when a process still holds its GPU). An unknown
    /// claim is already unprepared.
    ///
    /// # Errors
    /// The per-claim error text for the kubelet.
    pub async fn unprepare(&self, claim: &ClaimRef) -> Result<(), String> {
        claim.check()?;
        cdi::remove(&self.config.cdi_dir, &claim.uid)
            .map_err(|e| format!("removing the CDI spec: {e}"))?;
        // Its instances kept as to destroy before the claim is forgotten: an agent stopped in
        // between still destroys them.
        let made = self
            .store()
            .get(&claim.uid)
            .map(|r| r.made.clone())
            .unwrap_or_default();
        for m in &made {
            self.store()
                .doom(m)
                .map_err(|e| format!("keeping the claim's MIG instance to destroy: {e}"))?;
        }
        let removed = self
            .store()
            .remove(&claim.uid)
            .map_err(|e| format!("forgetting the claim: {e}"))?;
        if let Some(record) = removed {
            let session = claim::session_id(&record.uid);
            let _ = self.quotas.send(QuotaCommand::Release(session.clone()));
            self.observed.end(&session);
            // The view unreadable: left to destroy at a later tick.
            let seen = if record.made.is_empty() {
                None
            } else {
                self.seen().await
            };
            let mut changed = false;
            if let Some(seen) = &seen {
                for m in &record.made {
                    changed |= self.settle(m, true, seen);
                }
            }
            if changed {
                self.layout_did_change();
            }
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
        // The instances made for its partitions, by UUID (as the backend numbers them now), and
        // the devices offered, from one reading of the backend's list.
        let devices = self.backend.devices();
        let made: Vec<GpuDevice> = devices
            .iter()
            .filter(|g| record.made.iter().any(|m| m.uuid == g.uuid))
            .cloned()
            .collect();
        let offered = self.offered_among(devices);
        let gpus: Vec<&GpuDevice> = offered
            .iter()
            .filter(|g| {
                // An index of the claim's own instances is theirs, whatever was offered there
                // at start (an instance gone since may have left it to one made for the claim).
                (indexes.contains(&g.index) && !record.made.iter().any(|m| m.index == g.index))
                    || record
                        .devices
                        .iter()
                        .any(|d| d.device == super::device_name(g))
            })
            .chain(&made)
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
                        // The claim's own instances first: an offered device listed at start
                        // may be gone since and its index given to one made for the claim.
                        uuid: record
                            .made
                            .iter()
                            .find(|m| m.index == d.index)
                            .map(|m| m.uuid.clone())
                            .or_else(|| {
                                offered
                                    .iter()
                                    .find(|g| g.index == d.index)
                                    .map(|g| g.uuid.clone())
                            })
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
