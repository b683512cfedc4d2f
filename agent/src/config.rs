//! The agent's settings: one set of keys ([`Settings`]) read from a TOML file and from
//! command-line flags, the flags laid over the file and the defaults filled in last.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;

use gpuwarden_agent_api::DEFAULT_SOCKET;
use gpuwarden_runtime::tls::ClientTls;

use crate::sensor::gpu_nodes::{GpuNodeError, GpuNodeGlobs};

/// Default state directory (lock file; later the store).
pub const DEFAULT_STATE_DIR: &str = "/run/gpuwarden";

/// Default milliseconds between usage reports to the controller.
pub const DEFAULT_USAGE_REPORT_INTERVAL_MS: u64 = 5_000;

/// The shortest usage report interval taken (shorter ones are raised to it).
const MIN_USAGE_REPORT_INTERVAL_MS: u64 = 100;

/// Errors reading the settings.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file can't be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file isn't valid.
    #[error("invalid config file {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with line and column.
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A GPU device glob is invalid.
    #[error(transparent)]
    Glob(#[from] GpuNodeError),
    /// The `[dra]` section can't be used.
    #[error(transparent)]
    Dra(#[from] crate::dra::config::DraConfigError),
    /// The Prometheus endpoint would serve beyond loopback without `--prometheus-insecure`.
    #[error(transparent)]
    PrometheusExposed(#[from] gpuwarden_runtime::prometheus::ExposedError),
    /// The socket's group does not exist.
    #[error("socket_group {group:?}: {reason}")]
    SocketGroup {
        /// The group named.
        group: String,
        /// Why it can't be used.
        reason: String,
    },
}

/// Declares a layer of settings (every key optional) and [`Settings::over`], which lays one
/// layer over another, so each key is spelled once: its type, its docs, its flag.
macro_rules! layered {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$field_meta:meta])* pub $field:ident : Option<$ty:ty>, )*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $( $(#[$field_meta])* pub $field: Option<$ty>, )*
        }

        impl $name {
            /// These settings laid over `lower`: each key set here wins, the others are
            /// `lower`'s.
            #[must_use]
            pub fn over(self, lower: Self) -> Self {
                Self { $( $field: self.$field.or(lower.$field), )* }
            }
        }
    };
}

layered! {
    /// One layer of the agent's settings, every key optional: the config file (TOML, the keys
    /// by these names) and the command line (`run`'s flags: the keys without `#[arg(skip)]`)
    /// are each one, flags laid over the file, and [`AgentConfig::load`] fills in the defaults.
    #[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize, clap::Args)]
    #[serde(deny_unknown_fields)]
    pub struct Settings {
        /// GPU device-node globs, comma-separated
        /// [default: /dev/nvidia[0-9]*,/dev/nvidiactl,/dev/nvidia-uvm*].
        #[arg(long, value_delimiter = ',')]
        pub gpu_devices: Option<Vec<String>>,
        /// Local socket path [default: /run/gpuwarden/agent.sock].
        #[arg(long)]
        pub socket: Option<PathBuf>,
        /// Group (name or number) whose members may use the socket besides root (mode 0660);
        /// unset: root only (mode 0600).
        #[arg(skip)]
        pub socket_group: Option<String>,
        /// State directory (holds the one-agent-per-node lock) [default: /run/gpuwarden].
        #[arg(long)]
        pub state_dir: Option<PathBuf>,
        /// Node name [default: the host name].
        #[arg(long, env = "NODE_NAME")]
        pub node_name: Option<String>,
        /// Allocations at least this large are logged as events.
        #[arg(skip)]
        pub alloc_event_min_bytes: Option<u64>,
        /// Seconds between rescans of the GPU device globs.
        #[arg(skip)]
        pub rescan_interval_secs: Option<u64>,
        /// Controller to register with, e.g. <http://127.0.0.1:50051>; with several controllers
        /// sharing an etcd store, a comma-separated list (the agent follows the leader).
        #[arg(long, env = "GPUWARDEN_CONTROLLER")]
        pub controller: Option<String>,
        /// CA that signs the controller's certificate (PEM), for an https:// controller.
        #[arg(long, value_name = "FILE")]
        pub controller_ca: Option<PathBuf>,
        /// This node's client certificate for the controller (PEM; names the node:
        /// `spiffe://gpuwarden/node/<node>`).
        #[arg(long, value_name = "FILE")]
        pub tls_cert: Option<PathBuf>,
        /// Private key of --tls-cert (PEM).
        #[arg(long, value_name = "FILE")]
        pub tls_key: Option<PathBuf>,
        /// Mock GPU device list (TOML) instead of NVML, for machines without NVIDIA GPUs.
        #[arg(long)]
        pub mock_devices: Option<PathBuf>,
        /// UUIDs of the GPUs whose MIG layout gpuwarden may change (make instances on demand,
        /// destroy them once empty), comma-separated; none by default (docs/mig.md).
        #[arg(long, value_delimiter = ',')]
        pub mig_reconfigurable: Option<Vec<String>>,
        /// Where programs, links and maps are pinned so enforcement outlives the agent
        /// (bpffs; `""` in the file pins nothing) [default: /sys/fs/bpf/gpuwarden].
        #[arg(long)]
        pub bpf_pin_dir: Option<PathBuf>,
        /// Milliseconds per compute-share throttle period (`buckets` mode).
        #[arg(skip)]
        pub throttle_period_ms: Option<u64>,
        /// How compute shares are held: `slots` (exclusive slots on the GPU's own busy time,
        /// the default) or `buckets` (token buckets on per-process samples).
        #[arg(skip)]
        pub throttle_mode: Option<crate::enforcement::throttle::ThrottleMode>,
        /// Milliseconds per slot where the signal has no rhythm of its own (`slots` mode).
        #[arg(skip)]
        pub throttle_slot_ms: Option<u64>,
        /// Milliseconds a slot's holder is frozen before another's slot starts (`slots` mode).
        #[arg(skip)]
        pub throttle_guard_ms: Option<u64>,
        /// What a slot costs its holder (`slots` mode): `held` (its whole length, the default)
        /// or `busy` (the GPU's busy time measured in it).
        #[arg(skip)]
        pub throttle_charge: Option<crate::enforcement::throttle::Charge>,
        /// Seconds a quota waits for its workload's cgroup before it expires.
        #[arg(skip)]
        pub binding_timeout_secs: Option<u64>,
        /// The checkpoint helper a suspension runs (issue 38) [default: this binary]; an empty
        /// path turns suspension off (a preemption in mode `suspend` then kills).
        #[arg(skip)]
        pub checkpoint_helper: Option<PathBuf>,
        /// The driver library the checkpoint helper loads [default: libcuda.so.1].
        #[arg(skip)]
        pub checkpoint_library: Option<PathBuf>,
        /// Milliseconds each checkpoint call of one process may take (lock, checkpoint,
        /// restore, unlock) [default: 120000].
        #[arg(skip)]
        pub checkpoint_step_timeout_ms: Option<u64>,
        /// MiB of host memory a suspension must leave available (`MemAvailable`), else the
        /// workload is killed instead [default: 1024].
        #[arg(skip)]
        pub checkpoint_host_reserve_mib: Option<u64>,
        /// OTLP/gRPC endpoint for metrics (else `OTEL_EXPORTER_OTLP_ENDPOINT`; neither: off).
        #[arg(skip)]
        pub otlp_endpoint: Option<String>,
        /// Serve the metrics in Prometheus' text format at `GET /metrics` on this address
        /// (plain HTTP; off by default).
        #[arg(long, env = "GPUWARDEN_PROMETHEUS_LISTEN", value_name = "ADDR")]
        pub prometheus_listen: Option<std::net::SocketAddr>,
        /// Serve --prometheus-listen on a non-loopback address (a pod IP): refused without
        /// this, since the endpoint has no authentication and names every container and pod.
        #[arg(
            long,
            env = "GPUWARDEN_PROMETHEUS_INSECURE",
            num_args = 0..=1,
            default_missing_value = "true",
            value_name = "BOOL"
        )]
        pub prometheus_insecure: Option<bool>,
        /// Milliseconds between usage reports to the controller; 0 sends none [default: 5000].
        #[arg(long, env = "GPUWARDEN_USAGE_REPORT_INTERVAL_MS", value_name = "MS")]
        pub usage_report_interval_ms: Option<u64>,
        /// The kubelet's pod list, for pod names (else `GPUWARDEN_KUBELET_URL`, else
        /// `https://$NODE_IP:10250/pods` when `NODE_IP` is set; `""`: off).
        #[arg(skip)]
        pub kubelet_url: Option<String>,
        /// Bearer token for the kubelet (default: the service account's, where mounted).
        #[arg(skip)]
        pub kubelet_token_file: Option<PathBuf>,
        /// CA bundle that signs the kubelet's serving certificate (default: the service
        /// account's `ca.crt`, where mounted).
        #[arg(skip)]
        pub kubelet_ca_file: Option<PathBuf>,
        /// Don't verify the kubelet's certificate (self-signed serving certificates).
        #[arg(skip)]
        pub kubelet_insecure_skip_tls_verify: Option<bool>,
        /// The DRA kubelet plugin (`[dra]`; off unless `enabled = true`).
        #[arg(skip)]
        pub dra: Option<crate::dra::DraFileConfig>,
    }
}

/// The config file's contents.
pub type FileConfig = Settings;

/// Flags given on the command line, which win over the file.
pub type Overrides = Settings;

impl Settings {
    /// Reads the config file at `path`.
    ///
    /// # Errors
    /// The file can't be read or parsed (the message has the line).
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source: Box::new(source),
        })
    }
}

/// The settings the agent runs with.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// GPU device-node globs.
    pub gpu_globs: GpuNodeGlobs,
    /// Socket path.
    pub socket: PathBuf,
    /// The group id that may use the socket besides root; `None`: root only.
    pub socket_group: Option<u32>,
    /// State directory.
    pub state_dir: PathBuf,
    /// Node name.
    pub node_name: String,
    /// Allocations at least this large are logged as events.
    pub alloc_event_min_bytes: u64,
    /// Interval between rescans of the GPU device globs.
    pub rescan_interval: Duration,
    /// Interval between removals of stale map entries.
    pub gc_interval: Duration,
    /// Controller URL; `None` runs the node on its own.
    pub controller: Option<String>,
    /// TLS files for an `https://` controller, read at each connection (so rotated files are
    /// picked up on reconnect).
    pub controller_tls: ClientTls,
    /// Mock GPU device list.
    pub mock_devices: Option<PathBuf>,
    /// The GPUs (UUIDs) whose MIG layout gpuwarden may change; empty: none.
    pub mig_reconfigurable: Vec<String>,
    /// Where programs, links and maps are pinned; `None` pins nothing (enforcement ends with
    /// the agent).
    pub bpf_pin_dir: Option<PathBuf>,
    /// How the compute-share throttle runs (mode, period, slots).
    pub throttle: crate::enforcement::throttle::ThrottleConfig,
    /// How compute shares are held.
    pub throttle_mode: crate::enforcement::throttle::ThrottleMode,
    /// How long a quota waits for its workload's cgroup before it expires.
    pub binding_timeout: Duration,
    /// How workloads are suspended (issue 38); `None`: not at all.
    pub suspend: Option<crate::enforcement::SuspendConfig>,
    /// OTLP/gRPC endpoint for metrics; `None`: off.
    pub otlp_endpoint: Option<String>,
    /// Metric export interval; `None` leaves it to `OTEL_METRIC_EXPORT_INTERVAL`.
    pub metric_interval: Option<Duration>,
    /// Where to serve Prometheus' text format; `None`: off.
    pub prometheus_listen: Option<std::net::SocketAddr>,
    /// Interval between usage reports to the controller; `None`: none sent.
    pub usage_report_interval: Option<Duration>,
    /// Where pod names come from; `None`: no names (UIDs only).
    pub kubelet: Option<crate::attribution::kubelet::KubeletConfig>,
    /// The DRA kubelet plugin; `None`: off.
    pub dra: Option<crate::dra::DraConfig>,
}

impl AgentConfig {
    /// Merges the file (if any) and the flags.
    ///
    /// # Errors
    /// The file is unreadable, a glob is invalid, the socket's group does not exist, or the
    /// Prometheus endpoint would serve beyond loopback unallowed.
    pub fn load(file: Option<&Path>, overrides: Overrides) -> Result<Self, ConfigError> {
        let file = file.map(Settings::read).transpose()?.unwrap_or_default();
        Self::resolve(overrides.over(file))
    }

    /// The settings `s` with the defaults filled in.
    ///
    /// # Errors
    /// A glob is invalid, the socket's group does not exist, `[dra]` can't be used, or the
    /// Prometheus endpoint would serve beyond loopback without `prometheus_insecure`.
    fn resolve(s: Settings) -> Result<Self, ConfigError> {
        if let Some(addr) = s.prometheus_listen {
            gpuwarden_runtime::prometheus::check_exposure(
                addr,
                s.prometheus_insecure.unwrap_or(false),
            )?;
        }
        Ok(Self {
            gpu_globs: GpuNodeGlobs::new(&s.gpu_devices.unwrap_or_default())?,
            socket: s.socket.unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET)),
            socket_group: s
                .socket_group
                .map(|group| {
                    crate::export::access::group_id(&group)
                        .map_err(|reason| ConfigError::SocketGroup { group, reason })
                })
                .transpose()?,
            state_dir: s
                .state_dir
                .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR)),
            node_name: s.node_name.unwrap_or_else(hostname),
            alloc_event_min_bytes: s.alloc_event_min_bytes.unwrap_or(1 << 20),
            rescan_interval: Duration::from_secs(s.rescan_interval_secs.unwrap_or(2).max(1)),
            gc_interval: Duration::from_secs(10),
            controller: s.controller,
            controller_tls: ClientTls {
                ca: s.controller_ca,
                cert: s.tls_cert,
                key: s.tls_key,
            },
            mock_devices: s.mock_devices,
            mig_reconfigurable: s
                .mig_reconfigurable
                .unwrap_or_default()
                .into_iter()
                .map(|u| u.trim().to_owned())
                .filter(|u| !u.is_empty())
                .collect(),
            bpf_pin_dir: Some(
                s.bpf_pin_dir
                    .unwrap_or_else(|| PathBuf::from(crate::sensor::pins::DEFAULT_PIN_DIR)),
            )
            .filter(|p| !p.as_os_str().is_empty()),
            throttle: crate::enforcement::throttle::ThrottleConfig {
                slots: crate::enforcement::throttle::SlotConfig {
                    slot: Duration::from_millis(s.throttle_slot_ms.unwrap_or(120).clamp(20, 2_000)),
                    guard: Duration::from_millis(s.throttle_guard_ms.unwrap_or(3).clamp(0, 50)),
                    charge: s.throttle_charge.unwrap_or_default(),
                },
                ..crate::enforcement::throttle::ThrottleConfig::with_period(Duration::from_millis(
                    s.throttle_period_ms.unwrap_or(100).clamp(10, 10_000),
                ))
            },
            throttle_mode: s.throttle_mode.unwrap_or_default(),
            binding_timeout: Duration::from_secs(s.binding_timeout_secs.unwrap_or(300).max(1)),
            suspend: s
                .checkpoint_helper
                .or_else(|| std::env::current_exe().ok())
                .filter(|p| !p.as_os_str().is_empty())
                .map(|program| crate::enforcement::SuspendConfig {
                    helper: crate::checkpoint::helper::Helper {
                        program,
                        library: s.checkpoint_library,
                    },
                    step_timeout: Duration::from_millis(
                        s.checkpoint_step_timeout_ms.unwrap_or(120_000).max(1),
                    ),
                    host_reserve: s.checkpoint_host_reserve_mib.map_or(
                        crate::enforcement::SuspendConfig::DEFAULT_HOST_RESERVE,
                        |mib| mib.saturating_mul(1 << 20),
                    ),
                }),
            otlp_endpoint: crate::export::metrics::MetricsConfig::endpoint(s.otlp_endpoint),
            metric_interval: None,
            prometheus_listen: s.prometheus_listen,
            usage_report_interval: usage_report_interval(s.usage_report_interval_ms),
            kubelet: crate::attribution::kubelet::KubeletConfig::resolve(
                s.kubelet_url,
                s.kubelet_token_file,
                s.kubelet_ca_file,
                s.kubelet_insecure_skip_tls_verify.unwrap_or(false),
            ),
            dra: crate::dra::DraConfig::resolve(s.dra, |k| std::env::var(k).ok())?,
        })
    }

    /// What names this agent across restarts, as its pinned kernel state does: its pin folder
    /// (`gpuwarden` when it pins nothing). The throttle marks what it freezes with it.
    #[must_use]
    pub fn instance(&self) -> String {
        self.bpf_pin_dir
            .as_deref()
            .map_or_else(|| "gpuwarden".to_owned(), |p| p.display().to_string())
    }
}

/// The usage report interval for a setting in milliseconds: the default when unset, none for 0,
/// at least [`MIN_USAGE_REPORT_INTERVAL_MS`] otherwise.
fn usage_report_interval(ms: Option<u64>) -> Option<Duration> {
    match ms.unwrap_or(DEFAULT_USAGE_REPORT_INTERVAL_MS) {
        0 => None,
        ms => Some(Duration::from_millis(ms.max(MIN_USAGE_REPORT_INTERVAL_MS))),
    }
}

/// The host name, or `unknown`.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

#[cfg(test)]
mod tests;
