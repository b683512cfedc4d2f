//! `gpuwarden-agent run`: loads the sensor, restores what the node held, starts the tasks of
//! each stage of the data path and serves the local socket until shutdown.
//!
//! - `start`: the sensor, telemetry and enforcement as they come up (held quotas re-applied);
//! - `tasks`: the long-running tasks: event dispatch, map upkeep, usage reports.

mod start;
mod tasks;

use std::{path::PathBuf, sync::Arc, time::Duration};

use gpuwarden_proto::v1 as pb;
use tokio::{sync::mpsc, task::JoinSet};

use crate::{
    attribution::{AttributionError, Attributor, kubelet::PodNames},
    config::AgentConfig,
    control::{
        LinkChannels, LinkConfig, Observed, UsageCounters,
        holdings::{Holdings, HoldingsError, SharedHoldings},
        link::{self, LinkError},
        usage_report::Reporter,
    },
    devices::{self, GpuBackend},
    dra,
    enforcement::throttle,
    enforcement::{EnforcerHandle, QuotaCommand},
    export::{Sources, TelemetryHandle, metrics, server},
    lock::{InstanceLock, LockError},
    sensor::{Sensor, SensorError},
};

/// Enforcement events buffered for the controller while it is away; older ones are dropped
/// (and counted) beyond this.
const UPWARD_BUFFER: usize = 1024;

/// Usage reports buffered for the controller while it is away; newer ones are dropped (and
/// counted) beyond this. Old samples still describe real intervals, so they are worth sending.
const USAGE_BUFFER: usize = 256;

/// Errors that stop the agent.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Another agent runs on this node.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// No cgroup v2 hierarchy.
    #[error(transparent)]
    Attribution(#[from] AttributionError),
    /// The programs didn't load or attach.
    #[error(transparent)]
    Sensor(#[from] SensorError),
    /// The socket can't be served.
    #[error("cannot listen on {path}: {source}")]
    Socket {
        /// The socket.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The ring buffer can't be polled.
    #[error("cannot poll the event ring buffer: {0}")]
    Events(#[source] std::io::Error),
    /// The agent's store can't be used.
    #[error(transparent)]
    Holdings(#[from] HoldingsError),
    /// The GPU backend can't be set up.
    #[error(transparent)]
    Devices(#[from] devices::DeviceError),
    /// The compute-share throttle can't start.
    #[error(transparent)]
    Throttle(#[from] throttle::ThrottleError),
    /// The controller link can't work (an invalid URL, a TLS file): retrying would not help.
    #[error(transparent)]
    Controller(#[from] LinkError),
    /// The DRA kubelet plugin can't start.
    #[error(transparent)]
    Dra(#[from] dra::DraError),
}

/// Runs the agent until SIGINT or SIGTERM.
///
/// # Errors
/// See [`RunError`].
pub async fn run(config: AgentConfig) -> Result<(), RunError> {
    run_until(config, gpuwarden_runtime::shutdown()).await
}

/// Runs the agent until `shutdown` completes (tests embed the agent this way).
///
/// # Errors
/// See [`RunError`].
#[expect(
    clippy::too_many_lines,
    reason = "The wiring of every stage, in the order they start"
)]
pub async fn run_until(
    config: AgentConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), RunError> {
    let _lock = InstanceLock::acquire(&config.state_dir)?;
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
    // Memory a client allocates on a MIG instance it subscribed to is counted as the instance.
    if let Err(e) = sensor.set_mig_instances(&backend.devices(), backend.caps_major()) {
        tracing::warn!("MIG instances not told apart (their memory counts as their GPU's): {e}");
    }
    // What the agent reports names a MIG instance's index after the instance.
    let names = sensor.device_names().clone();
    let hooks = sensor
        .hooks()
        .iter()
        .map(|h| format!("{}:{}", h.kind, h.target))
        .collect();
    let events = sensor.take_events();

    // Quotas and what the node holds live in the store; they are enforced again at once.
    let holdings = Holdings::open(&config.state_dir.join("store"))?;
    // What sled just made under the umask is the agent's alone too.
    crate::lock::make_private(&config.state_dir).map_err(LockError::from)?;
    // The GPU's own busy time (NVML's device samples) for exclusive slots, or each cgroup's
    // (apportioned by process activity) for buckets; the CPU-time stand-ins with mock devices.
    let signal = match config.throttle_mode {
        throttle::ThrottleMode::Slots => throttle::Signal::Device(throttle::device_signal_for(
            backend.as_ref(),
            attributor.root(),
        )),
        throttle::ThrottleMode::Buckets => {
            throttle::Signal::PerCgroup(throttle::usage_for(backend.as_ref(), attributor.root()))
        }
    };
    // The usage reports measure with a source of their own (sources keep per-reader state).
    let usage_reports = config
        .usage_report_interval
        .filter(|_| config.controller.is_some())
        .map(|interval| (interval, start::reporter(backend.as_ref(), &attributor)));
    let throttle = throttle::spawn(config.throttle, signal, &config.instance())?;
    let (upward_tx, upward_rx) = mpsc::channel(UPWARD_BUFFER);
    let (quota_tx, quota_rx) = mpsc::unbounded_channel();
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
                backend.as_ref(),
                tree,
                quota_tx.clone(),
            )?)
        })
        .transpose()?;
    // A GPU is offered to Kubernetes or to the controller, never to both: the controller link
    // sees only the GPUs not offered to Kubernetes.
    let controller_backend: Arc<dyn GpuBackend> = match &config.dra {
        Some(d) => Arc::new(dra::Subset::new(Arc::clone(&backend), |g| !d.offers(g))),
        None => Arc::clone(&backend),
    };
    // Pod names are an extra: without a kubelet the pods keep their UIDs only (and users' pod
    // targets can't be checked, so they are refused).
    let pods = config
        .kubelet
        .clone()
        .map_or_else(PodNames::disabled, PodNames::spawn);
    let (enforcer, enforcer_task) = start::enforcement(
        &mut sensor,
        pods.clone(),
        &attributor,
        &holdings,
        dra.as_ref().map(|p| p.held.clone()).unwrap_or_default(),
        controller_backend.as_ref(),
        upward_tx,
        &config,
        throttle.clone(),
        quota_rx,
    );

    // Shared from here on: the link holds and lets go, the socket reads whose `run` each is.
    let holdings = Arc::new(std::sync::Mutex::new(holdings));
    let (telemetry, telemetry_task) = start::telemetry(sensor, attributor, &config);
    let usage_counters = Arc::default();
    let published = metrics::Published::default();
    let metrics = start::metrics(&config, backend.as_ref(), &published);
    let sources = Arc::new(Sources {
        telemetry: telemetry.clone(),
        enforcer: enforcer.clone(),
        backend: Arc::clone(&backend),
        pods: pods.clone(),
        node: config.node_name.clone(),
        indexes: backend.devices().iter().map(|d| d.index).collect(),
        names: names.clone(),
        usage_counters: Arc::clone(&usage_counters),
        holdings: Arc::clone(&holdings),
    });

    let mut tasks = JoinSet::new();
    if let Some(ring) = events {
        let ring = crate::sensor::events::register(ring).map_err(RunError::Events)?;
        tasks.spawn(tasks::dispatch_events(
            ring,
            telemetry.clone(),
            enforcer.clone(),
            names,
        ));
    }
    tasks.spawn(tasks::upkeep(
        telemetry.clone(),
        config.clone(),
        Arc::clone(&backend),
        enforcer.clone(),
        metrics.is_some().then(|| Arc::clone(&published)),
        Arc::clone(&sources),
    ));
    spawn_link(
        &mut tasks,
        &config,
        LinkWiring {
            hooks,
            holdings,
            backend: controller_backend,
            telemetry: telemetry.clone(),
            enforcer: enforcer.clone(),
            usage_reports,
            usage_counters,
            quotas: quota_tx,
            events: upward_rx,
            observed: dra.as_ref().map(|p| Arc::clone(&p.observed)),
            pods,
        },
    );

    let (dra_stop, dra_stopped) = tokio::sync::oneshot::channel::<()>();
    let dra_task = dra.map(|plugin| {
        tokio::spawn(plugin.run(config.rescan_interval, async {
            let _ = dra_stopped.await;
        }))
    });
    serve(&config, &sources, shutdown).await?;
    // The plugin removes its sockets as it stops, so the kubelet unregisters it.
    let _ = dra_stop.send(());
    if let Some(task) = dra_task {
        let _ = task.await;
    }
    // Stopping telemetry drops the sensor, which detaches the programs that are not pinned;
    // pinned ones keep enforcing (`gpuwarden-agent unpin` removes them).
    tasks.shutdown().await;
    drop(sources);
    telemetry.stop();
    let _ = telemetry_task.await;
    drop(enforcer);
    enforcer_task.abort();
    let _ = enforcer_task.await;
    throttle.shutdown().await;
    let _ = std::fs::remove_file(&config.socket);
    Ok(())
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
}

/// Starts the controller link and the usage reports, where a controller is configured.
fn spawn_link(tasks: &mut JoinSet<()>, config: &AgentConfig, w: LinkWiring) {
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
    if let Some((interval, reporter)) = w.usage_reports {
        tasks.spawn(tasks::report_usage(
            w.telemetry,
            w.enforcer,
            reporter,
            interval,
            usage_tx,
            Arc::clone(&w.usage_counters),
        ));
    }
    tasks.spawn(link::run(
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
        }),
        std::future::pending(),
    ));
}

/// Serves the local socket until `shutdown`.
async fn serve(
    config: &AgentConfig,
    sources: &Arc<Sources>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), RunError> {
    let listener =
        server::bind(&config.socket, config.socket_group).map_err(|source| RunError::Socket {
            path: config.socket.clone(),
            source,
        })?;
    tracing::info!(socket = %config.socket.display(), node = %config.node_name, "agent ready");
    tokio::select! {
        () = server::serve(listener, Arc::clone(sources), &config.socket) => {}
        () = shutdown => tracing::info!("shutting down"),
    }
    Ok(())
}
