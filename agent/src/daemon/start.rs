//! The sensor and enforcement as they come up.

use gpuwarden_proto::v1 as pb;
use tokio::sync::mpsc;

use crate::{
    attribution::{Attributor, kubelet::PodNames},
    config::AgentConfig,
    control::{holdings::Holdings, usage_report::Reporter},
    devices::GpuBackend,
    enforcement::{
        Enforcer, EnforcerHandle, QuotaCommand,
        cgroup_tree::CgroupTree,
        confinement::{Rules, own_cgroup},
        kernel::{Kernel, ProcessSignals},
        quota::QuotaSpec,
        task,
        throttle::{self, ThrottleHandle},
    },
    export::{Telemetry, TelemetryHandle, metrics},
    sensor::{Sensor, events},
};

/// Logs what the sensor chose and why, and starts forwarding the kernel side's log.
pub(super) fn log_sensor(sensor: &mut Sensor, config: &AgentConfig) {
    let (tier, why) = sensor.memory_tier();
    tracing::info!(
        tier = tier.as_str(),
        adopted = sensor.adopted(),
        pins = ?config.bpf_pin_dir,
        "memory enforcement: {why}"
    );
    if let Some(tier) = sensor.probe().chosen {
        tracing::info!(
            tier = tier.as_str(),
            hooks = sensor.hooks().len(),
            "hooks attached"
        );
    } else {
        tracing::warn!("no hook tier available");
    }
    for c in &sensor.probe().candidates {
        tracing::info!(
            tier = c.tier.as_str(),
            available = c.available,
            "probe: {}",
            c.reason
        );
    }
    if let Some(logger) = sensor.logger() {
        events::spawn_kernel_log(logger);
    }
}

/// The enforcement stage's inputs, as the daemon's spawn holds them: [`Enforcement::spawn`]
/// starts the enforcer on them.
pub(super) struct Enforcement<'a> {
    /// The sensor, whose quota maps and device-access program enforcement takes.
    pub(super) sensor: &'a mut Sensor,
    /// The pod names confinement rules check pod targets against.
    pub(super) pods: PodNames,
    /// The cgroup root and its reader.
    pub(super) attributor: &'a Attributor,
    /// The allocations the store holds from before a restart.
    pub(super) holdings: &'a Holdings,
    /// The quotas the DRA plugin holds from before a restart.
    pub(super) dra_held: Vec<QuotaSpec>,
    /// The GPUs the held allocations are read against.
    pub(super) backend: &'a dyn GpuBackend,
    /// Where enforcement events go up to the controller.
    pub(super) upward: mpsc::Sender<pb::EnforcementEvent>,
    /// The agent's configuration.
    pub(super) config: &'a AgentConfig,
    /// The compute-share throttle.
    pub(super) throttle: ThrottleHandle,
    /// The quota commands the enforcer acts on.
    pub(super) quotas: mpsc::UnboundedReceiver<QuotaCommand>,
}

impl Enforcement<'_> {
    /// The enforcer, with the quotas the store holds applied again and what an earlier agent
    /// left for sessions no longer held swept away, running as a task.
    pub(super) fn spawn(self) -> (EnforcerHandle, tokio::task::JoinHandle<()>) {
        let root = self.attributor.root();
        let mut enforcer = Enforcer::new(
            kernel(self.sensor, root),
            CgroupTree::host(root.to_owned()),
            self.upward,
            self.config.binding_timeout,
            Some(self.throttle),
        )
        .with_rules(Rules::new(own_cgroup(), Box::new(self.pods)))
        .with_suspend(self.config.suspend.clone());
        let held = held_quotas(self.holdings, self.dra_held, self.backend);
        let held_count = held.len();
        let thawed = throttle::thaw_marked(root, &self.config.instance());
        if thawed > 0 {
            tracing::warn!(
                thawed,
                "thawed cgroups a stopped agent's throttle left frozen"
            );
        }
        enforcer.thaw_targets(&held);
        for spec in held {
            enforcer.apply(spec);
        }
        enforcer.sweep_stale();
        let sessions = self.holdings.sessions().len();
        if sessions > 0 || held_count > sessions {
            tracing::info!(
                sessions = held_count,
                "holding allocations from before the restart"
            );
        }
        task::spawn(enforcer, self.quotas, self.sensor.memory_tier().0)
    }
}

/// The kernel side enforcement acts through: the sensor's quota maps and device program, the
/// process signals, and the driver's own limits where the dmem controller offers them.
fn kernel(sensor: &mut Sensor, root: &std::path::Path) -> Kernel {
    let Some((maps, devices)) = sensor.take_enforcement() else {
        unreachable!("the sensor's enforcement maps are taken once, here");
    };
    let driver_limits = crate::enforcement::dmem::DmemTree::open(root)
        .map(|tree| Box::new(tree) as Box<dyn crate::enforcement::kernel::DriverLimits>);
    tracing::info!(
        available = driver_limits.is_some(),
        "memory tier driver_dmem (the driver's own limit through the dmem cgroup controller)"
    );
    Kernel {
        maps,
        devices: Box::new(devices),
        signals: Box::new(ProcessSignals),
        driver_limits,
    }
}

/// The quotas held from before a restart: the DRA plugin's, then those of the allocations the
/// store holds that still fit the GPUs `backend` lists.
fn held_quotas(
    holdings: &Holdings,
    dra_held: Vec<QuotaSpec>,
    backend: &dyn GpuBackend,
) -> Vec<QuotaSpec> {
    let mut held = dra_held;
    for session in holdings.sessions() {
        let Some(allocate) = holdings.get(&session) else {
            continue;
        };
        match QuotaSpec::from_allocate(allocate, &backend.devices()) {
            Ok(Some(spec)) => held.push(spec),
            Ok(None) => {}
            Err(e) => tracing::warn!(session, "held quota no longer enforceable: {e}"),
        }
    }
    held
}

/// The metrics pipeline (OTLP and/or the Prometheus endpoint), reading the snapshots published in `published`; `None` when off.
/// Metrics are an extra: a bad endpoint is reported, never fatal.
pub(super) fn metrics(
    config: &AgentConfig,
    backend: &dyn GpuBackend,
    published: &metrics::Published,
) -> Option<gpuwarden_runtime::otlp::Pipeline> {
    let metrics_config = metrics::MetricsConfig {
        endpoint: config.otlp_endpoint.clone(),
        interval: config.metric_interval,
        prometheus: config.prometheus_listen,
        node: config.node_name.clone(),
        driver_version: backend.driver_version(),
    };
    match metrics::start(&metrics_config, backend.devices(), published) {
        Ok(metrics) => metrics,
        Err(e) => {
            tracing::warn!("metrics off: {e}");
            None
        }
    }
}

/// The compute-share throttle's thread, measuring with the GPU's own busy time (NVML's device
/// samples) for exclusive slots, or each cgroup's (apportioned by process activity) for
/// buckets; the CPU-time stand-ins with mock devices.
pub(super) fn throttle(
    config: &AgentConfig,
    backend: &dyn GpuBackend,
    attributor: &Attributor,
) -> Result<ThrottleHandle, throttle::ThrottleError> {
    let signal = match config.throttle_mode {
        throttle::ThrottleMode::Slots => {
            throttle::Signal::Device(throttle::device_signal_for(backend, attributor.root()))
        }
        throttle::ThrottleMode::Buckets => {
            throttle::Signal::PerCgroup(throttle::usage_for(backend, attributor.root()))
        }
    };
    throttle::spawn(config.throttle, signal, &config.instance())
}

/// The usage reporter, measuring with a usage source of its own (sources keep per-reader state):
/// NVML's device utilization apportioned by process activity on real GPUs, the CPU-time
/// stand-in with mock devices.
pub(super) fn reporter(backend: &dyn GpuBackend, attributor: &Attributor) -> Reporter {
    Reporter::new(throttle::usage_for(backend, attributor.root()))
}

/// The sensor's readers as a task, with the GPU device nodes scanned once.
pub(super) fn telemetry(
    sensor: Sensor,
    attributor: Attributor,
    config: &AgentConfig,
) -> (TelemetryHandle, tokio::task::JoinHandle<()>) {
    crate::export::telemetry::spawn(Telemetry::new(sensor, attributor, config.gpu_globs.clone()))
}
