//! The agent's settings: a TOML file, overridden by command-line flags.

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
    /// The socket's group does not exist.
    #[error("socket_group {group:?}: {reason}")]
    SocketGroup {
        /// The group named.
        group: String,
        /// Why it can't be used.
        reason: String,
    },
}

/// The config file's contents; every key optional.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// GPU device-node globs.
    pub gpu_devices: Option<Vec<String>>,
    /// Socket path.
    pub socket: Option<PathBuf>,
    /// Group (name or number) whose members may use the socket besides root (mode 0660);
    /// unset: root only (mode 0600).
    pub socket_group: Option<String>,
    /// State directory.
    pub state_dir: Option<PathBuf>,
    /// Node name (default: the host name).
    pub node_name: Option<String>,
    /// Allocations at least this large are logged as events.
    pub alloc_event_min_bytes: Option<u64>,
    /// Seconds between rescans of the GPU device globs.
    pub rescan_interval_secs: Option<u64>,
    /// Controller URL, or several, comma-separated.
    pub controller: Option<String>,
    /// CA that signs the controller's certificate (PEM), for an `https://` controller.
    pub controller_ca: Option<PathBuf>,
    /// This node's client certificate (PEM), naming it (`spiffe://gpuwarden/node/<node>`).
    pub tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM).
    pub tls_key: Option<PathBuf>,
    /// Mock GPU device list (TOML), for machines without NVIDIA GPUs.
    pub mock_devices: Option<PathBuf>,
    /// Where programs, links and maps are pinned (bpffs); `""` pins nothing.
    pub bpf_pin_dir: Option<PathBuf>,
    /// Milliseconds per compute-share throttle period.
    pub throttle_period_ms: Option<u64>,
    /// Seconds a quota waits for its workload's cgroup before it expires.
    pub binding_timeout_secs: Option<u64>,
    /// OTLP/gRPC endpoint for metrics (else `OTEL_EXPORTER_OTLP_ENDPOINT`; neither: off).
    pub otlp_endpoint: Option<String>,
    /// Address to serve Prometheus' text format on (`GET /metrics`); unset: off.
    pub prometheus_listen: Option<std::net::SocketAddr>,
    /// Milliseconds between usage reports to the controller; 0 sends none.
    pub usage_report_interval_ms: Option<u64>,
    /// The kubelet's pod list, for pod names (else `GPUWARDEN_KUBELET_URL`, else
    /// `https://$NODE_IP:10250/pods` when `NODE_IP` is set; `""`: off).
    pub kubelet_url: Option<String>,
    /// Bearer token for the kubelet (default: the service account's, where mounted).
    pub kubelet_token_file: Option<PathBuf>,
    /// CA bundle that signs the kubelet's serving certificate (default: the service account's
    /// `ca.crt`, where mounted).
    pub kubelet_ca_file: Option<PathBuf>,
    /// Don't verify the kubelet's certificate (self-signed serving certificates).
    pub kubelet_insecure_skip_tls_verify: Option<bool>,
    /// The DRA kubelet plugin (`[dra]`; off unless `enabled = true`).
    pub dra: Option<crate::dra::DraFileConfig>,
}

impl FileConfig {
    /// Reads `path`.
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

/// Flags given on the command line, which win over the file.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--gpu-devices`.
    pub gpu_devices: Option<Vec<String>>,
    /// `--socket`.
    pub socket: Option<PathBuf>,
    /// `--state-dir`.
    pub state_dir: Option<PathBuf>,
    /// `--node-name`.
    pub node_name: Option<String>,
    /// `--controller`.
    pub controller: Option<String>,
    /// `--controller-ca`.
    pub controller_ca: Option<PathBuf>,
    /// `--tls-cert`.
    pub tls_cert: Option<PathBuf>,
    /// `--tls-key`.
    pub tls_key: Option<PathBuf>,
    /// `--mock-devices`.
    pub mock_devices: Option<PathBuf>,
    /// `--bpf-pin-dir`.
    pub bpf_pin_dir: Option<PathBuf>,
    /// `--usage-report-interval-ms`.
    pub usage_report_interval_ms: Option<u64>,
    /// `--prometheus-listen`.
    pub prometheus_listen: Option<std::net::SocketAddr>,
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
    /// Where programs, links and maps are pinned; `None` pins nothing (enforcement ends with
    /// the agent).
    pub bpf_pin_dir: Option<PathBuf>,
    /// Compute-share throttle period.
    pub throttle_period: Duration,
    /// How long a quota waits for its workload's cgroup before it expires.
    pub binding_timeout: Duration,
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
    /// The file is unreadable, a glob is invalid, or the socket's group does not exist.
    pub fn load(file: Option<&Path>, overrides: Overrides) -> Result<Self, ConfigError> {
        let file = file.map(FileConfig::read).transpose()?.unwrap_or_default();
        let globs = overrides
            .gpu_devices
            .or(file.gpu_devices)
            .unwrap_or_default();
        Ok(Self {
            gpu_globs: GpuNodeGlobs::new(&globs)?,
            socket: overrides
                .socket
                .or(file.socket)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET)),
            socket_group: file
                .socket_group
                .map(|group| {
                    crate::export::access::group_id(&group)
                        .map_err(|reason| ConfigError::SocketGroup { group, reason })
                })
                .transpose()?,
            state_dir: overrides
                .state_dir
                .or(file.state_dir)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR)),
            node_name: overrides
                .node_name
                .or(file.node_name)
                .unwrap_or_else(hostname),
            alloc_event_min_bytes: file.alloc_event_min_bytes.unwrap_or(1 << 20),
            rescan_interval: Duration::from_secs(file.rescan_interval_secs.unwrap_or(2).max(1)),
            gc_interval: Duration::from_secs(10),
            controller: overrides.controller.or(file.controller),
            controller_tls: ClientTls {
                ca: overrides.controller_ca.or(file.controller_ca),
                cert: overrides.tls_cert.or(file.tls_cert),
                key: overrides.tls_key.or(file.tls_key),
            },
            mock_devices: overrides.mock_devices.or(file.mock_devices),
            bpf_pin_dir: Some(
                overrides
                    .bpf_pin_dir
                    .or(file.bpf_pin_dir)
                    .unwrap_or_else(|| PathBuf::from(crate::sensor::pins::DEFAULT_PIN_DIR)),
            )
            .filter(|p| !p.as_os_str().is_empty()),
            throttle_period: Duration::from_millis(
                file.throttle_period_ms.unwrap_or(100).clamp(10, 10_000),
            ),
            binding_timeout: Duration::from_secs(file.binding_timeout_secs.unwrap_or(300).max(1)),
            otlp_endpoint: crate::export::metrics::MetricsConfig::endpoint(file.otlp_endpoint),
            metric_interval: None,
            prometheus_listen: overrides.prometheus_listen.or(file.prometheus_listen),
            usage_report_interval: usage_report_interval(
                overrides
                    .usage_report_interval_ms
                    .or(file.usage_report_interval_ms),
            ),
            kubelet: crate::attribution::kubelet::KubeletConfig::resolve(
                file.kubelet_url,
                file.kubelet_token_file,
                file.kubelet_ca_file,
                file.kubelet_insecure_skip_tls_verify.unwrap_or(false),
            ),
            dra: crate::dra::DraConfig::resolve(file.dra, |k| std::env::var(k).ok())?,
        })
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
