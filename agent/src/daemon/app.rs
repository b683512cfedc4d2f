//! The agent in the lifecycle both daemons share (docs/architecture.md, "Lifecycle"): an
//! [`AgentConfig`] is built into an [`App`] — everything that can fail, done before any task
//! starts — the app is spawned into [`Running`] tasks, and shutting down stops and joins them in
//! reverse start order.

use crate::devices::changes::{self, DeviceChanges};
use std::{future::Future, sync::Arc, time::Duration};

use gpuwarden_proto::v1 as pb;
use gpuwarden_runtime::lifecycle::Tasks;
use tokio::{net::UnixListener, sync::mpsc};

use crate::{
    attribution::{Attributor, kubelet::PodNames},
    config::AgentConfig,
    control::{
        LinkChannels, LinkConfig, Observed, UsageCounters,
        holdings::{Holdings, SharedHoldings},
        link,
        usage_report::Reporter,
    },
    devices::{self, GpuBackend},
    dra,
    enforcement::{EnforcerHandle, QuotaCommand, throttle},
    export::{Sources, TelemetryHandle, metrics, server},
    lock::{InstanceLock, LockError},
    sensor::{Sensor, events::EventRing, gpu_nodes::DeviceNames},
};

use super::{RunError, start, tasks};

/// Enforcement events buffered for the controller while it is away; older ones are dropped
/// (and counted) beyond this.
const UPWARD_BUFFER: usize = 1024;

/// Usage reports buffered for the controller while it is away; newer ones are dropped (and
/// counted) beyond this. Old samples still describe real intervals, so they are worth sending.
const USAGE_BUFFER: usize = 256;

/// An agent built from its [`AgentConfig`]: this node's lock held, the programs loaded, the GPUs
/// found, the store opened, the throttle's thread started, the DRA plugin's and the local
/// socket bound. No task runs until [`App::spawn`].
#[must_use = "an app does nothing until spawned"]
pub struct App {
    lock: InstanceLock,
    config: AgentConfig,
    attributor: Attributor,
    sensor: Sensor,
    backend: Arc<dyn GpuBackend>,
    names: DeviceNames,
    hooks: Vec<String>,
    events: Option<EventRing>,
    holdings: Holdings,
    usage_reports: Option<(Duration, Reporter)>,
    throttle: throttle::ThrottleHandle,
    quotas: (
        mpsc::UnboundedSender<QuotaCommand>,
        mpsc::UnboundedReceiver<QuotaCommand>,
    ),
    dra: Option<dra::Plugin>,
    socket: UnixListener,
}

impl App {
    /// Takes this node's lock, checks the controller's URLs and TLS files, loads and attaches
    /// the programs, finds the GPUs, opens the store, starts the throttle, opens the DRA plugin
    /// and binds the local socket. Runs inside a tokio runtime (the event ring and the sockets
    /// are registered with it).
    ///
    /// # Errors
    /// Each step its own [`RunError`] variant, naming what failed: another agent holds the lock,
    /// a controller URL or TLS file can never work, no cgroup v2, the programs don't load, the
    /// GPUs or the store can't be used, the throttle's settings are invalid, the DRA plugin or
    /// the socket can't be bound.
    pub fn build(config: AgentConfig) -> Result<Self, RunError> {
        let lock = InstanceLock::acquire(&config.state_dir)?;
        // A controller URL or TLS file that can never work stops the agent now, naming it.
        if let Some(list) = &config.controller {
            for url in link::check_controllers(list)?.urls() {
                link::endpoint(url, &config.controller_tls)?;
            }
        }
        let attributor = Attributor::detect()?;
        let mut sensor = Sensor::load(config.alloc_event_min_bytes, config.bpf_pin_dir.as_deref())?;
        start::log_sensor(&mut sensor, &config);
        let backend: Arc<dyn GpuBackend> =
            Arc::from(devices::discover(config.mock_devices.as_deref())?);
        // Memory a client allocates on a MIG instance it subscribed to is counted as the
        // instance.
        if let Err(e) = sensor.set_mig_instances(&backend.devices(), backend.caps_major()) {
            tracing::warn!(
                "MIG instances not told apart (their memory counts as their GPU's): {e}"
            );
        }
        // What the agent reports names a MIG instance's index after the instance.
        let names = sensor.device_names().clone();
        let hooks = sensor
            .hooks()
            .iter()
            .map(|h| format!("{}:{}", h.kind, h.target))
            .collect();
        let events = sensor
            .take_events()
            .map(crate::sensor::events::register)
            .transpose()
            .map_err(RunError::Events)?;
        // Quotas and what the node holds live in the store; they are enforced again at spawn.
        let holdings = Holdings::open(&config.state_dir.join("store"))?;
        // What sled just made under the umask is the agent's alone too.
        crate::lock::make_private(&config.state_dir).map_err(LockError::from)?;
        // The usage reports measure with a source of their own (sources keep per-reader state).
        let usage_reports = config
            .usage_report_interval
            .filter(|_| config.controller.is_some())
            .map(|interval| (interval, start::reporter(backend.as_ref(), &attributor)));
        let throttle = start::throttle(&config, backend.as_ref(), &attributor)?;
        let quotas = mpsc::unbounded_channel();
        // The DRA plugin, where enabled: its sockets bound and the claims it prepared before a
        // restart read, so their quotas are enforced again with the controller's.
        let dra = config
            .dra
            .clone()
            .map(|dra_config| {
                let tree = holdings.open_tree(dra::store::TREE)?;
                Ok::<_, RunError>(dra::Plugin::open(
                    dra_config,
                    config.node_name.clone(),
                    Arc::clone(&backend),
                    tree,
                    quotas.0.clone(),
                    &config.mig_reconfigurable,
                )?)
            })
            .transpose()?;
        let socket = server::bind(&config.socket, config.socket_group).map_err(|source| {
            RunError::Socket {
                path: config.socket.clone(),
                source,
            }
        })?;
        Ok(Self {
            lock,
            config,
            attributor,
            sensor,
            backend,
            names,
            hooks,
            events,
            holdings,
            usage_reports,
            throttle,
            quotas,
            dra,
            socket,
        })
    }

    /// Starts every task on the current runtime, in this order: the throttle (its thread started
    /// at build), enforcement (with the quotas the store holds applied again), telemetry, the
    /// metrics, event dispatch, upkeep, the usage reports and the controller link, the DRA
    /// plugin, and last the local socket, so a client that reaches it finds every stage up.
    pub fn spawn(self) -> Running {
        let Self {
            lock,
            config,
            attributor,
            mut sensor,
            backend,
            names,
            hooks,
            events,
            holdings,
            usage_reports,
            throttle,
            quotas: (quota_tx, quota_rx),
            dra,
            socket,
        } = self;
        let mut tasks = Tasks::default();
        let stopping = throttle.clone();
        tasks.stop_by("throttle", move || async move {
            stopping.shutdown().await;
            Ok(())
        });
        let (upward_tx, upward_rx) = mpsc::channel(UPWARD_BUFFER);
        // A GPU is offered to Kubernetes or to the controller, never to both: the controller
        // link sees only the GPUs not offered to Kubernetes.
        let controller_backend: Arc<dyn GpuBackend> = match &config.dra {
            Some(d) => Arc::new(dra::Subset::not_offered(Arc::clone(&backend), d)),
            None => Arc::clone(&backend),
        };
        // Pod names are an extra: without a kubelet the pods keep their UIDs only (and users'
        // pod targets can't be checked, so they are refused).
        let pods = config
            .kubelet
            .clone()
            .map_or_else(PodNames::disabled, PodNames::spawn);
        let (enforcer, enforcer_task) = start::Enforcement {
            sensor: &mut sensor,
            pods: pods.clone(),
            attributor: &attributor,
            holdings: &holdings,
            dra_held: dra.as_ref().map(|p| p.held.clone()).unwrap_or_default(),
            backend: controller_backend.as_ref(),
            upward: upward_tx,
            config: &config,
            throttle,
            quotas: quota_rx,
        }
        .spawn();
        tasks.abort("enforcement", enforcer_task);
        // Shared from here on: the link holds and lets go, the socket reads whose `run` each is.
        let holdings = Arc::new(std::sync::Mutex::new(holdings));
        let (telemetry, telemetry_task) = start::telemetry(sensor, attributor, &config);
        let stopping = telemetry.clone();
        tasks.stop_with("telemetry", telemetry_task, move || stopping.stop());
        let usage_counters = Arc::default();
        let published = metrics::Published::default();
        let publishing = spawn_metrics(&mut tasks, &config, backend.as_ref(), &published);
        let sources = Arc::new(Sources {
            telemetry: telemetry.clone(),
            enforcer: enforcer.clone(),
            backend: Arc::clone(&backend),
            pods: pods.clone(),
            node: config.node_name.clone(),
            usage_counters: Arc::clone(&usage_counters),
            holdings: Arc::clone(&holdings),
        });
        let (devices_changed, names_rx) =
            spawn_device_list(&mut tasks, telemetry.clone(), Arc::clone(&backend), names);
        if let Some(ring) = events {
            let dispatch =
                tasks::dispatch_events(ring, telemetry.clone(), enforcer.clone(), names_rx);
            tasks.abort("event dispatch", tokio::spawn(dispatch));
        }
        let upkeep = tasks::upkeep(
            telemetry.clone(),
            config.clone(),
            Arc::clone(&backend),
            enforcer.clone(),
            publishing.then(|| Arc::clone(&published)),
            Arc::clone(&sources),
        );
        tasks.abort("upkeep", tokio::spawn(upkeep));
        spawn_link(
            &mut tasks,
            &config,
            LinkWiring {
                hooks,
                holdings,
                backend: controller_backend,
                telemetry: telemetry.clone(),
                enforcer,
                usage_reports,
                usage_counters,
                quotas: quota_tx,
                events: upward_rx,
                observed: dra.as_ref().map(|p| Arc::clone(&p.observed)),
                pods,
                devices_changed: devices_changed.clone(),
            },
        );
        if let Some(plugin) = dra {
            spawn_dra(&mut tasks, plugin, &config, devices_changed, telemetry);
        }
        spawn_socket(&mut tasks, socket, sources, &config);
        Running { tasks, lock }
    }
}

/// A spawned agent: its tasks, in start order, and this node's lock, let go of last.
#[must_use = "dropping it leaves the tasks running; shut it down"]
pub struct Running {
    tasks: Tasks<RunError>,
    lock: InstanceLock,
}

impl Running {
    /// Runs until `stop` completes, then shuts down.
    ///
    /// # Errors
    /// See [`Running::shutdown`].
    pub async fn run_until(self, stop: impl Future<Output = ()>) -> Result<(), RunError> {
        stop.await;
        tracing::info!("shutting down");
        self.shutdown().await
    }

    /// Stops every task and joins it, the last started first: the local socket (its file
    /// removed), the DRA plugin (its sockets removed, so the kubelet unregisters it), the link
    /// and the loops, the metrics, telemetry (which drops the sensor, detaching the programs
    /// that are not pinned; pinned ones keep enforcing until `gpuwarden-agent unpin`),
    /// enforcement, and the throttle (which thaws what it froze); then lets go of the lock.
    ///
    /// # Errors
    /// A task panicked.
    pub async fn shutdown(self) -> Result<(), RunError> {
        let Self { tasks, lock } = self;
        let stopped = tasks.shutdown().await;
        drop(lock);
        stopped
    }
}

/// Starts the task that writes the device list to the programs' MIG instance table again
/// whenever the link (or the DRA plugin, for a claim's partition) made or destroyed an instance (through telemetry, which owns the sensor);
/// returns where the link tells it, and the names the event log reads, as they now stand.
fn spawn_device_list(
    tasks: &mut Tasks<RunError>,
    telemetry: TelemetryHandle,
    backend: Arc<dyn GpuBackend>,
    names: DeviceNames,
) -> (DeviceChanges, tokio::sync::watch::Receiver<DeviceNames>) {
    let (devices_changed, changes) = changes::channel();
    let (names_tx, names_rx) = tokio::sync::watch::channel(names);
    let follow = tasks::follow_devices(changes, telemetry, backend, names_tx);
    tasks.abort("device list", tokio::spawn(follow));
    (devices_changed, names_rx)
}

/// Starts the metrics pipeline (OTLP and/or the Prometheus endpoint) reading `published`;
/// whether it runs (a bad endpoint is reported, never fatal).
fn spawn_metrics(
    tasks: &mut Tasks<RunError>,
    config: &AgentConfig,
    backend: &dyn GpuBackend,
    published: &metrics::Published,
) -> bool {
    let Some(metrics) = start::metrics(config, backend, published) else {
        return false;
    };
    tasks.stop_by("metrics", move || async move {
        drop(metrics);
        Ok(())
    });
    true
}

/// Serves the kubelet and keeps the `ResourceSlice` published until told to stop; the plugin
/// removes its sockets as it stops, so the kubelet unregisters it.
fn spawn_dra(
    tasks: &mut Tasks<RunError>,
    plugin: dra::Plugin,
    config: &AgentConfig,
    devices_changed: DeviceChanges,
    telemetry: TelemetryHandle,
) {
    let every = config.rescan_interval;
    // Instances made for claims' partitions change the device list too.
    plugin.driver.on_devices_changed(devices_changed);
    // Its MIG changes ask the agent's view of its processes beside the driver's count.
    plugin.driver.on_processes(Arc::new(telemetry));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(plugin.run(every, async {
        let _ = stopped.await;
    }));
    tasks.stop_with("DRA plugin", task, move || {
        let _ = stop.send(());
    });
}

/// Serves the local socket, bound at build; stopping it removes its file.
fn spawn_socket(
    tasks: &mut Tasks<RunError>,
    socket: UnixListener,
    sources: Arc<Sources>,
    config: &AgentConfig,
) {
    let path = config.socket.clone();
    let serving = tokio::spawn(async move { server::serve(socket, sources, &path).await });
    let path = config.socket.clone();
    tasks.stop_by("local socket", move || async move {
        serving.abort();
        let _ = serving.await;
        let _ = std::fs::remove_file(&path);
        Ok(())
    });
    tracing::info!(socket = %config.socket.display(), node = %config.node_name, "agent ready");
}

/// What the controller link is wired to.
struct LinkWiring {
    hooks: Vec<String>,
    holdings: SharedHoldings,
    backend: Arc<dyn GpuBackend>,
    telemetry: TelemetryHandle,
    enforcer: EnforcerHandle,
    usage_reports: Option<(Duration, Reporter)>,
    usage_counters: Arc<UsageCounters>,
    quotas: mpsc::UnboundedSender<QuotaCommand>,
    events: mpsc::Receiver<pb::EnforcementEvent>,
    observed: Option<Arc<Observed>>,
    pods: PodNames,
    devices_changed: DeviceChanges,
}

/// Starts the usage reports and the controller link, where a controller is configured.
fn spawn_link(tasks: &mut Tasks<RunError>, config: &AgentConfig, w: LinkWiring) {
    let Some(url) = &config.controller else {
        tracing::info!("no --controller: running this node on its own");
        return;
    };
    let link = LinkConfig {
        controller: url.clone(),
        tls: config.controller_tls.clone(),
        node_id: config.node_name.clone(),
        hostname: config.node_name.clone(),
        hooks: w.hooks,
        mig_reconfigurable: config.mig_reconfigurable.clone(),
    };
    let (usage_tx, usage_rx) = mpsc::channel(USAGE_BUFFER);
    let processes: Arc<dyn crate::control::link::ProcessView> = Arc::new(w.telemetry.clone());
    if let Some((interval, reporter)) = w.usage_reports {
        let report = tasks::report_usage(
            w.telemetry,
            w.enforcer,
            reporter,
            interval,
            usage_tx,
            Arc::clone(&w.usage_counters),
        );
        tasks.abort("usage reports", tokio::spawn(report));
    }
    let run = link::run(
        link,
        w.backend,
        w.holdings,
        Some(LinkChannels {
            quotas: w.quotas,
            events: w.events,
            usage: usage_rx,
            usage_counters: w.usage_counters,
            observed: w.observed,
            pods: Box::new(w.pods),
            devices_changed: w.devices_changed,
            processes: Some(processes),
        }),
        std::future::pending(),
    );
    tasks.abort("controller link", tokio::spawn(run));
}
