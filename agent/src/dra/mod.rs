//! The agent as a Kubernetes DRA driver (`gpu.gpuwarden.io`; docs/architecture.md, "Kubernetes
//! asks through DRA; the agent enforces", and docs/kubernetes.md, "The agent as DRA driver").
//!
//! kube-scheduler allocates fractions of this node's GPUs to ResourceClaims; the kubelet then
//! asks this plugin to prepare each claim for its pod. The plugin turns the claim's allocation
//! into the same quota a controller `Allocate` makes — the allowed device node, a memory limit
//! and a compute share — bound to the reserving pod's UID, and hands it to enforcement. A GPU is
//! offered either to Kubernetes or to the controller, never to both (`[dra] gpus`). Each claim
//! prepared is reported to the controller as a session it observes but did not place
//! ([`crate::control::observed`]), with the pod's workload class.
//!
//! - `config`: the `[dra]` section;
//! - `server`: the registration and `DRAPlugin` v1/v1beta1 gRPC services on Unix sockets;
//! - `plugin`: prepare and unprepare (a partition device: its MIG instance made, then destroyed);
//! - `claim`: a ResourceClaim read, and the quota it asks for;
//! - `slice`: the node's ResourceSlice, kept in step with its GPUs;
//! - `partition`: the partition pool of the GPUs whose MIG layout may change (counter sets and
//!   the placeable profiles consuming them);
//! - `cdi`: the CDI specs that give containers the device nodes;
//! - `store`: prepared claims in the agent's sled store;
//! - `apiserver`: the few API-server calls, over hyper and rustls;

pub mod apiserver;
pub mod cdi;
pub mod claim;
pub mod config;
pub mod partition;
pub mod plugin;
pub mod server;
pub mod slice;
pub mod store;
mod subset;

pub use subset::Subset;

use std::{sync::Arc, time::Duration};

use tokio::sync::mpsc;

pub use config::{DraConfig, DraFileConfig};

use crate::{
    control::Observed,
    devices::{GpuBackend, GpuDevice},
    enforcement::{QuotaCommand, quota::QuotaSpec},
};

/// The driver's name: the ResourceSlices' `driver`, the claims' results' `driver`, the plugin's
/// registration name.
pub const DRIVER_NAME: &str = "gpu.gpuwarden.io";

/// A GPU's device name in the node's pool (a DNS label): `gpu-<index>`.
#[must_use]
pub fn device_name(gpu: &GpuDevice) -> String {
    format!("gpu-{}", gpu.index)
}

/// Errors starting the plugin.
#[derive(Debug, thiserror::Error)]
pub enum DraError {
    /// The API server settings can't be used.
    #[error("DRA plugin: {0}")]
    Api(#[from] apiserver::ApiError),
    /// A socket can't be served.
    #[error("DRA plugin: cannot listen on {path}: {source}")]
    Socket {
        /// The socket.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The claim store can't be read.
    #[error("DRA plugin: {0}")]
    Store(#[from] store::StoreError),
}

/// The plugin as the daemon starts it: the claims it held before a restart (their quotas go
/// into enforcement with the controller's), and what runs it.
pub struct Plugin {
    /// The driver.
    pub driver: Arc<plugin::Driver>,
    /// Quotas of the claims prepared before the restart.
    pub held: Vec<QuotaSpec>,
    /// The GPUs offered to Kubernetes and the claims prepared on them, for the controller link
    /// to report as sessions the controller observes.
    pub observed: Arc<Observed>,
    config: DraConfig,
    node: String,
    driver_version: Option<String>,
    listener: tokio::net::UnixListener,
    registration_listener: tokio::net::UnixListener,
    /// What the kubelet said of the registration.
    pub registration: server::RegistrationSeen,
}

impl Plugin {
    /// Sets the plugin up: the API client, the claims kept in `tree`, the two sockets bound;
    /// the GPUs of `reconfigurable` (UUIDs, the agent's `mig_reconfigurable`) that are offered
    /// to Kubernetes and whose layout the backend reads are published as partitions too, and
    /// a claim allocated one has its MIG instance made at prepare.
    ///
    /// # Errors
    /// See [`DraError`].
    pub fn open(
        config: DraConfig,
        node: String,
        backend: Arc<dyn GpuBackend>,
        tree: Option<sled::Tree>,
        quotas: mpsc::UnboundedSender<QuotaCommand>,
        reconfigurable: &[String],
    ) -> Result<Self, DraError> {
        let api = apiserver::ApiServer::new(&config.api)?;
        let store = store::ClaimStore::load(tree)?;
        let partitioned: Vec<String> = backend
            .mig_layouts()
            .into_iter()
            .filter(|(uuid, index, _)| {
                reconfigurable.iter().any(|r| r.eq_ignore_ascii_case(uuid))
                    && config.offers_gpu(uuid, *index)
            })
            .map(|(uuid, ..)| uuid)
            .collect();
        let bind = |path: std::path::PathBuf| {
            server::bind(&path).map_err(|source| DraError::Socket { path, source })
        };
        // The plugin socket first: the kubelet dials it as soon as it sees the registration.
        let listener = bind(config.plugin_socket())?;
        let registration_listener = bind(config.registration_socket())?;
        // Filled by the driver once it has read the devices offered.
        let observed = Arc::new(Observed::new(Vec::new()));
        let driver_version = backend.driver_version();
        let driver = plugin::Driver::new(
            plugin::DriverParts {
                config: config.clone(),
                node: node.clone(),
                api,
                store,
                quotas,
                observed: Arc::clone(&observed),
            },
            plugin::DriverGpus {
                backend,
                partitioned,
            },
        );
        // Read after the driver made again the instances a reboot took.
        let held = driver.held_quotas();
        Ok(Self {
            driver,
            held,
            observed,
            config,
            node,
            driver_version,
            listener,
            registration_listener,
            registration: server::RegistrationSeen::default(),
        })
    }

    /// Serves the kubelet and keeps the ResourceSlice published, until `shutdown`.
    pub async fn run(
        self,
        every: Duration,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) {
        tracing::info!(
            offered = %self.driver.offered_now().iter().map(device_name).collect::<Vec<_>>().join(","),
            registration = %self.config.registration_socket().display(),
            endpoint = %self.config.plugin_socket().display(),
            "{DRIVER_NAME}: DRA plugin ready"
        );
        let publisher = publish_slices(
            self.config.clone(),
            self.node.clone(),
            Arc::clone(&self.driver),
            self.driver_version.clone(),
            every,
            Arc::clone(&self.registration),
        );
        tokio::select! {
            () = server::serve(
                self.driver,
                self.listener,
                self.config.plugin_socket(),
                self.registration_listener,
                self.config.registration_socket(),
                self.registration,
                shutdown,
            ) => {}
            () = publisher => {}
        }
    }
}

/// Watches the node's slice, each event into `changes` (so a slice deleted by the kubelet, or
/// anyone, is made again at once); a watch the API server ends or refuses is opened again after
/// `every`. Never returns.
async fn watch_slice(
    config: &DraConfig,
    node: &str,
    every: Duration,
    changes: mpsc::Sender<serde_json::Value>,
) {
    // The publisher reports a bad API setting; the watch then never starts.
    let Ok(api) = apiserver::ApiServer::new(&config.api) else {
        return std::future::pending().await;
    };
    let path = slice::watch_path(node);
    let mut warned = false;
    loop {
        match api.watch(&path, &changes).await {
            Ok(answer) if answer.is_success() => {}
            Ok(answer) if !warned => {
                warned = true;
                tracing::warn!(
                    "{DRIVER_NAME}: cannot watch the ResourceSlice (HTTP {}: {}); it is checked \
                     at every tick only",
                    answer.status,
                    answer.message()
                );
            }
            Err(e) if !warned => {
                warned = true;
                tracing::warn!(
                    "{DRIVER_NAME}: watching the ResourceSlice: {e}; it is checked at every tick \
                     until the watch is back"
                );
            }
            Ok(_) | Err(_) => {}
        }
        tokio::time::sleep(every).await;
    }
}

/// Keeps the node's ResourceSlice and partition pool published, the devices offered read from
/// the backend each time (the operator's MIG changes followed): checked at every tick, at once
/// when a claim's MIG instance was made or destroyed (the partition pool follows the layout;
/// instances left to destroy are tried again at each tick), when the kubelet
/// (re)registers the plugin or the slice changes (a watch), and made again when it is gone (the kubelet deletes its
/// node's slices when it starts, and a driver's ~30 s after the driver's plugin connection
/// dropped), replaced when it differs, owned by the Node once the Node could be read. Says loudly
/// when the API server dropped `allowMultipleAllocations` (the `DRAConsumableCapacity` gate is
/// off). Failures are retried at the next tick.
async fn publish_slices(
    config: DraConfig,
    node: String,
    driver: Arc<plugin::Driver>,
    driver_version: Option<String>,
    every: Duration,
    registration: server::RegistrationSeen,
) {
    let api = match apiserver::ApiServer::new(&config.api) {
        Ok(api) => api,
        Err(e) => {
            tracing::error!("{DRIVER_NAME}: no ResourceSlice: {e}");
            return;
        }
    };
    let mut owner: Option<serde_json::Value> = None;
    let mut owner_warned = false;
    let mut generation = 0;
    let mut published_once = false;
    let mut gate_off = false;
    // Set once the API server is seen dropping taints: unusable GPUs are left out instead.
    let mut drop_unhealthy = false;
    let mut partitions = Partitions::new(&node, &driver.partitioned());
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (watch_events, mut slice_events) = mpsc::channel(16);
    let watcher = watch_slice(&config, &node, every, watch_events);
    tokio::pin!(watcher);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = registration.changed() => {
                tracing::debug!("{DRIVER_NAME}: the kubelet registered the plugin; checking the slice");
            }
            Some(event) = slice_events.recv() => {
                tracing::debug!(event = %event["type"], "{DRIVER_NAME}: the slice changed; checking it");
            }
            () = &mut watcher => {}
            () = driver.layout_changed() => {
                tracing::debug!("{DRIVER_NAME}: a MIG layout changed; publishing the partition pool");
            }
        }
        driver.destroy_doomed().await;
        partitions.wanted = partition::slices(&node, &driver.partitioned());
        if owner.is_none() {
            match slice::node_owner(&api, &node).await {
                Ok(o) => owner = Some(o),
                Err(e) if !owner_warned => {
                    owner_warned = true;
                    tracing::warn!(
                        "{DRIVER_NAME}: cannot read Node {node} ({e}); the ResourceSlice is \
                         published without an owner, so it outlives a deleted Node (grant the \
                         agent `nodes get`)"
                    );
                }
                Err(_) => {}
            }
        }
        // Read again each time: the operator may have made or destroyed a MIG instance on an
        // offered GPU. The slice is replaced (its generation one up) only when it differs.
        let offered = driver.offered_now();
        let devices = slice::devices(&offered, driver_version.as_deref(), drop_unhealthy);
        match slice::publish(&api, &node, &devices, owner.as_ref(), generation).await {
            Ok(done) => {
                generation = done.generation;
                match done.action {
                    slice::Action::Created if published_once => tracing::warn!(
                        devices = devices.len(),
                        generation,
                        "{DRIVER_NAME}: the ResourceSlice was gone (deleted by the kubelet at its \
                         start, or by hand); made again"
                    ),
                    slice::Action::Created | slice::Action::Replaced => tracing::info!(
                        devices = devices.len(),
                        generation,
                        "{DRIVER_NAME}: ResourceSlice published"
                    ),
                    slice::Action::Kept | slice::Action::Deleted => {}
                }
                published_once = true;
                let now_off = done.gate_off.unwrap_or(gate_off);
                if now_off && !gate_off {
                    tracing::error!(
                        "{DRIVER_NAME}: the API server dropped allowMultipleAllocations from the \
                         ResourceSlice: the DRAConsumableCapacity feature gate is off in \
                         kube-apiserver. Every claim will get a WHOLE GPU until it is on in \
                         kube-apiserver, kube-scheduler and the kubelet (alpha in 1.34 and 1.35, \
                         on by default from 1.36; docs/kubernetes.md)"
                    );
                } else if !now_off && gate_off {
                    tracing::info!(
                        "{DRIVER_NAME}: the ResourceSlice keeps allowMultipleAllocations again"
                    );
                }
                gate_off = now_off;
                if done.taints_dropped && !drop_unhealthy {
                    drop_unhealthy = true;
                    tracing::warn!(
                        "{DRIVER_NAME}: the API server dropped the device taints (DRADeviceTaints \
                         is off in kube-apiserver; on by default from 1.36): an unusable GPU \
                         leaves the ResourceSlice instead of being tainted"
                    );
                }
            }
            Err(e) => tracing::warn!("{DRIVER_NAME}: publishing the ResourceSlice: {e}; retrying"),
        }
        partitions.tick(&api, &node, owner.as_ref()).await;
    }
}

/// The partition pool's publishing state (docs/mig.md, "DRA").
struct Partitions {
    wanted: Vec<partition::PartitionSlice>,
    generation: i64,
    /// Checked: the API server's version allows them.
    version_ok: bool,
    /// Given up until the agent restarts: why.
    off: Option<partition::Unsupported>,
    /// With no partition wanted: an earlier run's pool has been deleted.
    cleaned: bool,
}

impl Partitions {
    fn new(node: &str, gpus: &[(partition::PartitionedGpu, String)]) -> Self {
        Self {
            wanted: partition::slices(node, gpus),
            generation: 0,
            version_ok: false,
            off: None,
            cleaned: false,
        }
    }

    /// Publishes the pool when there is one and the cluster takes it; says once why not.
    async fn tick(
        &mut self,
        api: &apiserver::ApiServer,
        node: &str,
        owner: Option<&serde_json::Value>,
    ) {
        if self.off.is_some() {
            return;
        }
        if self.wanted.is_empty() {
            // A pool left by an earlier run (a GPU since taken off `mig_reconfigurable`) is
            // deleted once.
            if !self.cleaned {
                match partition::publish(api, node, &[], owner, 0).await {
                    Ok(_) => self.cleaned = true,
                    Err(e) => tracing::debug!("{DRIVER_NAME}: clearing a partition pool: {e}"),
                }
            }
            return;
        }
        if !self.version_ok {
            match partition::supported(api).await {
                Ok(Ok(())) => self.version_ok = true,
                Ok(Err(why)) => {
                    tracing::error!(
                        "{DRIVER_NAME}: no MIG partitions published: the API server is {} \
                         (partitionable devices with counters in slices of their own need \
                         Kubernetes 1.35 or later); the existing instances are offered as they are",
                        match &why {
                            partition::Unsupported::Version(Some((major, minor))) => {
                                format!("{major}.{minor}")
                            }
                            _ => "of a version not read".to_owned(),
                        }
                    );
                    self.off = Some(why);
                    return;
                }
                Err(e) => {
                    tracing::warn!(
                        "{DRIVER_NAME}: reading the API server's version: {e}; retrying"
                    );
                    return;
                }
            }
        }
        match partition::publish(api, node, &self.wanted, owner, self.generation).await {
            Ok(partition::Outcome::Published {
                generation,
                changed,
            }) => {
                self.generation = generation;
                if changed {
                    tracing::info!(
                        slices = self.wanted.len(),
                        generation,
                        "{DRIVER_NAME}: MIG partition pool published"
                    );
                }
            }
            Ok(partition::Outcome::Unsupported(why)) => {
                tracing::error!(
                    "{DRIVER_NAME}: the API server dropped sharedCounters from the partition \
                     pool: the DRAPartitionableDevices feature gate is off in kube-apiserver \
                     (alpha in 1.35, on by default from 1.36); no MIG partitions are published \
                     until it is on there and in kube-scheduler and the agent restarts"
                );
                self.off = Some(why);
            }
            Err(e) => {
                tracing::warn!("{DRIVER_NAME}: publishing the MIG partition pool: {e}; retrying");
            }
        }
    }
}
