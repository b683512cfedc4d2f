//! `gpuwarden-agent run`: the sensor, the event reader, housekeeping and the local socket.

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
};

use aya::maps::{MapData, RingBuf};
use gpuwarden_agent_api::snapshot::Snapshot;
use gpuwarden_agent_common::{
    event::{Event, decode_error, kind},
    maps::GpuNode,
};
use tokio::io::unix::AsyncFd;

use crate::{
    attribution::kubelet::PodNames,
    attribution::{AttributionError, Attributor},
    config::AgentConfig,
    control::holdings::{Holdings, HoldingsError},
    control::link::{self, LinkChannels, LinkConfig, QuotaCommand},
    control::usage::{self, Reporter, UsageCounters},
    devices::{self, GpuBackend},
    enforcement::Enforcer,
    enforcement::quota::QuotaSpec,
    enforcement::throttle,
    export::{snapshot as view, socket},
    lock::{InstanceLock, LockError},
    sensor::device_nodes::device_name,
    sensor::upkeep,
    sensor::{KernelLogger, Sensor, SensorError},
};

/// Enforcement events buffered for the controller while it is away; older ones are dropped
/// (and counted) beyond this.
const UPWARD_BUFFER: usize = 1024;

/// Usage reports buffered for the controller while it is away; newer ones are dropped (and
/// counted) beyond this. Old samples still describe real intervals, so they are worth sending.
const USAGE_BUFFER: usize = 256;

/// Where process information lives.
const PROC_ROOT: &str = "/proc";

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
}

/// What the tasks share. Data flows one way: the kernel fills the maps, tasks read them.
struct State {
    sensor: Sensor,
    attributor: Attributor,
    enforcer: Enforcer,
    nodes: BTreeMap<PathBuf, GpuNode>,
    events_received: u64,
    usage_counters: Arc<UsageCounters>,
}

impl State {
    /// The snapshot of the node now.
    fn snapshot(&mut self, node: &str) -> Snapshot {
        let mut snapshot = view::collect(
            &self.sensor,
            &self.enforcer,
            &mut self.attributor,
            node,
            self.events_received,
        );
        (
            snapshot.stats.usage_reports,
            snapshot.stats.usage_reports_dropped,
        ) = self.usage_counters.get();
        snapshot
    }
}

type Shared = Arc<Mutex<State>>;

/// What a snapshot adds to the maps' view: GPU utilization and pod names.
struct Extras {
    backend: Arc<dyn GpuBackend>,
    pods: PodNames,
    node: String,
    indexes: Vec<u32>,
}

/// A full snapshot: the maps read under the lock; NVML and the pod names outside it.
fn snapshot(state: &Shared, extras: &Extras) -> Snapshot {
    let measured = extras.backend.utilization();
    let mut snapshot = {
        let mut guard = lock(state);
        let mut snapshot = guard.snapshot(&extras.node);
        snapshot.gpus = view::gpu_utilization(&extras.indexes, measured.as_ref(), &guard.enforcer);
        snapshot
    };
    extras.pods.annotate(&mut snapshot);
    snapshot
}

/// The socket's answers, from the daemon's state.
struct NodeAnswers {
    state: Shared,
    extras: Arc<Extras>,
}

impl socket::Answers for NodeAnswers {
    fn snapshot(&self) -> Snapshot {
        snapshot(&self.state, &self.extras)
    }

    fn node(&self) -> String {
        self.extras.node.clone()
    }

    fn session_cgroup(&self, session_id: &str) -> Result<(PathBuf, bool), String> {
        lock(&self.state)
            .enforcer
            .session_cgroup(session_id)
            .map_err(|e| e.to_string())
    }

    fn signal(&self, pid: u32, resume: bool) -> Result<String, String> {
        lock(&self.state)
            .enforcer
            .signal(pid, resume)
            .map_err(|e| e.to_string())
    }
}

fn lock(state: &Shared) -> MutexGuard<'_, State> {
    // A panicked task leaves the maps as they were; keep serving them.
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
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
pub async fn run_until(
    config: AgentConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), RunError> {
    let _lock = InstanceLock::acquire(&config.state_dir)?;
    let attributor = Attributor::detect()?;
    let mut sensor = Sensor::load(config.alloc_event_min_bytes, config.bpf_pin_dir.as_deref())?;
    tracing::info!(
        tier = sensor.memory_tier.0.as_str(),
        adopted = sensor.adopted,
        pins = ?config.bpf_pin_dir,
        "memory enforcement: {}",
        sensor.memory_tier.1
    );
    match sensor.probe.chosen {
        Some(tier) => tracing::info!(
            tier = tier.as_str(),
            hooks = sensor.hooks.len(),
            "hooks attached"
        ),
        None => tracing::warn!("no hook tier available"),
    }
    for c in &sensor.probe.candidates {
        tracing::info!(
            tier = c.tier.as_str(),
            available = c.available,
            "probe: {}",
            c.reason
        );
    }
    if let Some(logger) = sensor.logger() {
        spawn_kernel_log(logger);
    }
    let events = sensor.events.take();
    let backend: Arc<dyn GpuBackend> =
        Arc::from(devices::discover(config.mock_devices.as_deref())?);
    let hooks: Vec<String> = sensor
        .hooks
        .iter()
        .map(|h| format!("{}:{}", h.kind, h.target))
        .collect();

    // Quotas and what the node holds live in the store; they are enforced again at once.
    let holdings = Holdings::open(&config.state_dir.join("store"))?;
    // NVML's per-process SM utilization on real GPUs; the CPU-time stand-in with mock devices.
    let usage = backend
        .usage_source(attributor.root())
        .unwrap_or_else(|| Box::new(throttle::CpuTimeUsage));
    // The usage reports measure with a source of their own (sources keep per-reader state).
    let usage_reports = config
        .usage_report_interval
        .filter(|_| config.controller.is_some())
        .map(|interval| {
            let source = backend
                .usage_source(attributor.root())
                .unwrap_or_else(|| Box::new(throttle::CpuTimeUsage));
            (interval, Reporter::new(source))
        });
    let throttle = throttle::spawn(
        throttle::ThrottleConfig::with_period(config.throttle_period),
        usage,
    )?;
    let (upward_tx, upward_rx) = tokio::sync::mpsc::channel(UPWARD_BUFFER);
    let mut enforcer = Enforcer::new(
        attributor.root().to_owned(),
        upward_tx,
        config.binding_timeout,
        Some(throttle.clone()),
    );
    for session in holdings.sessions() {
        let Some(allocate) = holdings.get(&session) else {
            continue;
        };
        match QuotaSpec::from_allocate(allocate, backend.devices()) {
            Ok(Some(spec)) => {
                // A dead agent may have left it frozen mid-period.
                if let Ok(Some(dir)) = enforcer.tree().find(&spec.target, &session) {
                    let _ = throttle::thaw(&dir);
                }
                enforcer.apply(&mut sensor, spec);
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(session, "held quota no longer enforceable: {e}"),
        }
    }
    enforcer.sweep_stale(&mut sensor);
    if !holdings.sessions().is_empty() {
        tracing::info!(
            sessions = holdings.sessions().len(),
            "holding allocations from before the restart"
        );
    }

    let mut state = State {
        sensor,
        attributor,
        enforcer,
        nodes: BTreeMap::new(),
        events_received: 0,
        usage_counters: Arc::default(),
    };
    rescan_nodes(&mut state, &config);
    let usage_counters = Arc::clone(&state.usage_counters);
    let state: Shared = Arc::new(Mutex::new(state));
    let (quota_tx, quota_rx) = tokio::sync::mpsc::unbounded_channel();
    let published = crate::export::metrics::Published::default();
    let metrics_config = crate::export::metrics::MetricsConfig {
        endpoint: config.otlp_endpoint.clone(),
        interval: config.metric_interval,
        node: config.node_name.clone(),
    };
    // Metrics are an extra: a bad endpoint is reported, never fatal.
    let _metrics = match crate::export::metrics::start(
        &metrics_config,
        backend.devices().to_vec(),
        Arc::clone(&published),
    ) {
        Ok(metrics) => metrics,
        Err(e) => {
            tracing::warn!("metrics off: {e}");
            None
        }
    };

    // Pod names are an extra too: without a kubelet the pods keep their UIDs only.
    let pods = match config.kubelet.clone() {
        Some(kubelet) => PodNames::spawn(kubelet),
        None => PodNames::disabled(),
    };
    let extras = Arc::new(Extras {
        backend: Arc::clone(&backend),
        pods,
        node: config.node_name.clone(),
        indexes: backend.devices().iter().map(|d| d.index).collect(),
    });

    let mut tasks = tokio::task::JoinSet::new();
    if let Some(ring) = events {
        // SAFETY: the ring buffer owns its fd and keeps it open until the AsyncFd drops it.
        let fd = unsafe { AsyncFd::register(ring) }.map_err(|e| RunError::Events(e.into()))?;
        tasks.spawn(read_events(fd, Arc::clone(&state)));
    }
    tasks.spawn(housekeeping(
        Arc::clone(&state),
        config.clone(),
        Arc::clone(&backend),
        _metrics.is_some().then(|| Arc::clone(&published)),
        Arc::clone(&extras),
    ));
    tasks.spawn(apply_quotas(Arc::clone(&state), quota_rx));
    match &config.controller {
        Some(url) => {
            let link = LinkConfig {
                controller: url.clone(),
                node_id: config.node_name.clone(),
                hostname: config.node_name.clone(),
                hooks,
            };
            let holdings = Arc::new(std::sync::Mutex::new(holdings));
            let (usage_tx, usage_rx) = tokio::sync::mpsc::channel(USAGE_BUFFER);
            if let Some((interval, reporter)) = usage_reports {
                tasks.spawn(report_usage(
                    Arc::clone(&state),
                    reporter,
                    interval,
                    usage_tx,
                    Arc::clone(&usage_counters),
                ));
            }
            tasks.spawn(link::run(
                link,
                backend,
                holdings,
                Some(LinkChannels {
                    quotas: quota_tx,
                    events: upward_rx,
                    usage: usage_rx,
                    usage_counters,
                }),
                std::future::pending(),
            ));
        }
        None => tracing::info!("no --controller: running this node on its own"),
    }

    let listener = socket::bind(&config.socket).map_err(|source| RunError::Socket {
        path: config.socket.clone(),
        source,
    })?;
    tracing::info!(socket = %config.socket.display(), node = %config.node_name, "agent ready");
    let mut clients = tokio::task::JoinSet::new();
    let answers = Arc::new(NodeAnswers {
        state: Arc::clone(&state),
        extras: Arc::clone(&extras),
    });
    let serve = socket::serve(listener, answers, &mut clients);
    tokio::select! {
        () = serve => {}
        () = shutdown => tracing::info!("shutting down"),
    }
    // Stopping the tasks drops the last references to the sensor, which detaches the programs
    // that are not pinned; pinned ones keep enforcing (`gpuwarden-agent unpin` removes them).
    clients.shutdown().await;
    tasks.shutdown().await;
    throttle.shutdown().await;
    let _ = std::fs::remove_file(&config.socket);
    Ok(())
}

/// Expands the globs, updates the path table, and seeds fds of newly watched paths.
fn rescan_nodes(state: &mut State, config: &AgentConfig) {
    let expansion = config.gpu_globs.expand();
    if expansion.nodes == state.nodes {
        return;
    }
    if expansion.nodes.is_empty() {
        tracing::warn!(
            globs = %config.gpu_globs.as_slice().join(","),
            "no GPU device nodes match; watching for them to appear (no NVIDIA driver on this machine?)"
        );
    }
    for (path, why) in &expansion.skipped {
        tracing::warn!(path = %path.display(), "not watched: {why}");
    }
    let (added, removed) = upkeep::sync_paths(&mut state.sensor.maps, &expansion.nodes);
    state.nodes = expansion.nodes;
    let seeded = upkeep::seed(
        &mut state.sensor.maps,
        &state.nodes,
        &state.attributor,
        Path::new(PROC_ROOT),
        None,
    );
    tracing::info!(
        watched = state.nodes.len(),
        added,
        removed,
        seeded_fds = seeded.fds,
        seeded_processes = seeded.processes,
        "GPU device nodes: {}",
        state
            .nodes
            .keys()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// Applies quota commands from the controller link as they come.
async fn apply_quotas(
    state: Shared,
    mut commands: tokio::sync::mpsc::UnboundedReceiver<QuotaCommand>,
) {
    while let Some(command) = commands.recv().await {
        let mut guard = lock(&state);
        let s = &mut *guard;
        match command {
            QuotaCommand::Apply(spec) => s.enforcer.apply(&mut s.sensor, spec),
            QuotaCommand::Release(session) => s.enforcer.release(&mut s.sensor, &session),
        }
    }
}

async fn housekeeping(
    state: Shared,
    config: AgentConfig,
    backend: Arc<dyn GpuBackend>,
    published: Option<crate::export::metrics::Published>,
    extras: Arc<Extras>,
) {
    // Metrics read the latest snapshot; publishing once a second keeps it fresh for any
    // export interval without the exporter ever taking the state's lock.
    let mut publish = tokio::time::interval(std::time::Duration::from_secs(1));
    let mut rescan = tokio::time::interval(config.rescan_interval);
    let mut gc = tokio::time::interval(config.gc_interval);
    let mut idle = upkeep::IdleCgroups::default();
    // Pending quotas bind soon after their cgroup appears.
    let mut bind = tokio::time::interval(std::time::Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = publish.tick(), if published.is_some() => {
                let snapshot = snapshot(&state, &extras);
                if let Some(p) = &published {
                    *p.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(snapshot);
                }
            }
            _ = bind.tick() => {
                let mut guard = lock(&state);
                let s = &mut *guard;
                s.enforcer.reconcile(&mut s.sensor);
            }
            _ = rescan.tick() => {
                rescan_nodes(&mut lock(&state), &config);
                // NVML's view of per-process memory, read outside the lock (it takes a while).
                let samples = backend.process_memory();
                if !samples.is_empty() {
                    let mut guard = lock(&state);
                    let s = &mut *guard;
                    s.enforcer.cross_check(&s.sensor, &samples);
                }
            }
            _ = gc.tick() => {
                let mut guard = lock(&state);
                let s = &mut *guard;
                let bound: HashSet<u64> =
                    s.enforcer.bindings().values().filter_map(|b| b.key).collect();
                let g = upkeep::collect_garbage(
                    &mut s.sensor.maps,
                    &mut s.attributor,
                    Path::new(PROC_ROOT),
                    &mut idle,
                    &bound,
                );
                if g != upkeep::Garbage::default() {
                    tracing::debug!(?g, "removed stale entries");
                }
            }
        }
    }
}

/// Sends what each session used over every `interval` to the controller link (see
/// [`usage_report`]). The maps are read under the lock, the usage source outside it; a full
/// buffer drops the report rather than wait.
async fn report_usage(
    state: Shared,
    mut reporter: Reporter,
    interval: std::time::Duration,
    upward: tokio::sync::mpsc::Sender<gpuwarden_proto::v1::SessionUsage>,
    counters: Arc<UsageCounters>,
) {
    let (poll, polls_per_report) = usage::poll_plan(interval);
    let mut ticker = tokio::time::interval(poll);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut polls = 0;
    loop {
        ticker.tick().await;
        polls += 1;
        if polls < polls_per_report {
            let cgroups = usage::bound_cgroups(&lock(&state).enforcer);
            reporter.poll(&cgroups);
            continue;
        }
        polls = 0;
        let readings = {
            let s = lock(&state);
            usage::read_sessions(&s.sensor, &s.enforcer)
        };
        for usage in reporter.report(
            readings,
            std::time::Instant::now(),
            gpuwarden_types::now_ms(),
        ) {
            if upward.try_send(usage).is_err() {
                counters.count_dropped();
            }
        }
    }
}

async fn read_events(mut fd: AsyncFd<RingBuf<MapData>>, state: Shared) {
    loop {
        let Ok(mut guard) = fd.readable_mut().await else {
            tracing::error!("event ring buffer stopped being readable");
            return;
        };
        let ring = guard.get_inner_mut();
        let mut batch = Vec::new();
        while let Some(item) = ring.next() {
            if item.len() >= size_of::<Event>() {
                // SAFETY: the kernel writes whole `Event`s; read_unaligned copes with alignment.
                batch.push(unsafe { item.as_ptr().cast::<Event>().read_unaligned() });
            }
        }
        guard.clear_ready();
        if batch.is_empty() {
            continue;
        }
        let mut s = lock(&state);
        s.events_received += batch.len() as u64;
        for event in &batch {
            handle_event(&mut s, event);
        }
    }
}

fn handle_event(state: &mut State, e: &Event) {
    let comm = String::from_utf8_lossy(e.comm.split(|b| *b == 0).next().unwrap_or_default());
    let device = device_name(e.device);
    match e.kind {
        kind::NEW_PROCESS => {
            tracing::info!(tgid = e.tgid, %comm, cgroup = e.cgroup, %device, "new GPU process")
        }
        kind::ALLOC => {
            tracing::debug!(tgid = e.tgid, %comm, %device, bytes = e.bytes, handle = e.handle, "GPU memory allocated")
        }
        kind::FREE => {
            tracing::debug!(tgid = e.tgid, %comm, %device, bytes = e.bytes, handle = e.handle, "GPU memory freed")
        }
        kind::CLIENT_FREE => {
            tracing::debug!(tgid = e.tgid, %comm, bytes = e.bytes, client = e.client, "GPU client freed")
        }
        kind::FORK => tracing::debug!(tgid = e.tgid, child = e.handle, "GPU process forked"),
        kind::PROCESS_EXIT => {
            tracing::debug!(tgid = e.tgid, %comm, bytes = e.bytes, "GPU process ended");
        }
        kind::EXEC => {
            tracing::debug!(tgid = e.tgid, %comm, bytes = e.bytes, "GPU process exec'd");
            // The process lives on: keep the GPU fds that survived the exec.
            let State {
                sensor,
                nodes,
                attributor,
                ..
            } = state;
            upkeep::reseed_after_exec(
                &mut sensor.maps,
                nodes,
                attributor,
                Path::new(PROC_ROOT),
                e.tgid,
            );
        }
        kind::QUOTA_EXCEEDED | kind::DEVICE_DENIED => {
            let tier = state.sensor.memory_tier.0;
            state.enforcer.on_kernel_event(e, tier);
        }
        kind::DECODE_ERROR => {
            let reason = match e.code {
                decode_error::READ_PARAMS => "params unreadable",
                decode_error::BAD_SIZE => "unexpected params size",
                decode_error::READ_ALLOC_PARAMS => "allocation params unreadable",
                decode_error::DEVICE_OUT_OF_RANGE => "GPU index out of range",
                decode_error::READ_RESULT => "result unreadable",
                _ => "unknown",
            };
            tracing::warn!(tgid = e.tgid, %comm, escape = format_args!("{:#x}", e.handle), reason, detail = format_args!("{:#x}", e.bytes), "ioctl not decoded");
        }
        other => tracing::warn!(kind = other, "unknown event kind"),
    }
}

fn spawn_kernel_log(logger: KernelLogger) {
    // SAFETY: the logger owns its ring buffer's fd and keeps it open until the AsyncFd drops it.
    match unsafe { AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) } {
        Ok(mut fd) => {
            tokio::spawn(async move {
                loop {
                    let Ok(mut guard) = fd.readable_mut().await else {
                        return;
                    };
                    guard.get_inner_mut().flush();
                    guard.clear_ready();
                }
            });
        }
        Err(e) => tracing::warn!(
            "kernel-side logging unavailable: {}",
            std::io::Error::from(e)
        ),
    }
}
