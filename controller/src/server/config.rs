//! `gpuwarden-controller run`'s configuration: its flags ([`RunArgs`]), its TOML file
//! ([`FileConfig`]), and the two layered once into what the app runs with ([`RunConfig`]):
//! a flag wins over the file's key of the same name, the file over the default.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use gpuwarden_runtime::{otlp::Exporters, tls::ClientTls};
use serde::Deserialize;

use crate::{
    auth::{grants::GrantFile, tokens::TokenFile},
    hub::Timing,
    limits::Limits,
    scheduler::SchedulerConfig,
    store::StoreSpec,
};

use super::{
    ServeError,
    kube::KubeArgs,
    security::{Security, Transport},
};

/// The controller's config file; every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Scheduler settings.
    #[serde(default)]
    pub scheduler: Option<SchedulerConfig>,
    /// Seconds of silence after which a node is Lost.
    pub heartbeat_timeout_secs: Option<u64>,
    /// OTLP/gRPC endpoint for metrics (else `OTEL_EXPORTER_OTLP_ENDPOINT`; neither: off).
    pub otlp_endpoint: Option<String>,
    /// Address to serve Prometheus' text format on (`GET /metrics`); unset: off.
    pub prometheus_listen: Option<SocketAddr>,
    /// Serve the Prometheus endpoint beyond loopback (as `--prometheus-insecure`).
    pub prometheus_insecure: Option<bool>,
    /// The serving certificate (PEM); with the key and client CA, the port speaks TLS.
    pub tls_cert: Option<PathBuf>,
    /// The serving certificate's private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// The CA that signs agents' client certificates (PEM).
    pub tls_client_ca: Option<PathBuf>,
    /// Hashed bearer tokens of scheduler clients, each with its owner and role (TOML).
    pub token_file: Option<PathBuf>,
    /// What users may bind sessions to: cgroup prefixes and Kubernetes namespaces per owner
    /// (TOML; see `auth::grants`).
    pub grant_file: Option<PathBuf>,
    /// Where the state lives (`sled:PATH` or `etcd://…`); else sled in the state directory.
    #[serde(default, deserialize_with = "spec_from_str")]
    pub store: Option<StoreSpec>,
    /// For an etcd store over TLS: the CA that signs etcd's certificates (PEM).
    pub etcd_ca: Option<PathBuf>,
    /// This controller's client certificate for etcd (PEM).
    pub etcd_cert: Option<PathBuf>,
    /// The private key of `etcd_cert` (PEM).
    pub etcd_key: Option<PathBuf>,
    /// Serve plain text beyond loopback (as `--insecure`).
    pub insecure: Option<bool>,
    /// Bounds on what clients and agents may send (`[limits]`; see [`Limits`]).
    #[serde(default)]
    pub limits: Limits,
}

fn spec_from_str<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<StoreSpec>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|s| s.parse().map_err(serde::de::Error::custom))
        .transpose()
}

impl FileConfig {
    /// Reads `path`.
    ///
    /// # Errors
    /// The file can't be read or parsed.
    pub fn read(path: &std::path::Path) -> Result<Self, ServeError> {
        let invalid = |reason: String| ServeError::Config {
            path: path.to_owned(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))?;
        let config: Self = toml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        config
            .limits
            .validate()
            .map_err(|e| invalid(format!("[limits]: {e}")))?;
        if let Some(scheduler) = &config.scheduler {
            scheduler
                .scoring
                .validate()
                .map_err(|e| invalid(format!("[scheduler.scoring]: {e}")))?;
            scheduler
                .quotas
                .validate()
                .map_err(|e| invalid(format!("[scheduler.quotas]: {e}")))?;
        }
        Ok(config)
    }

    /// The file's TLS to etcd, as the flags spell it.
    fn etcd_tls(&self) -> EtcdTlsArgs {
        EtcdTlsArgs {
            etcd_ca: self.etcd_ca.clone(),
            etcd_cert: self.etcd_cert.clone(),
            etcd_key: self.etcd_key.clone(),
        }
    }
}

/// TLS to etcd, for an etcd store.
#[derive(clap::Args, Debug, Default, Clone)]
#[expect(
    clippy::struct_field_names,
    reason = "the fields name the flags: --etcd-ca, --etcd-cert, --etcd-key"
)]
pub(super) struct EtcdTlsArgs {
    /// CA that signs etcd's serving certificates (PEM): talk to etcd over TLS.
    #[arg(long, value_name = "FILE")]
    etcd_ca: Option<PathBuf>,
    /// Client certificate for etcd's --client-cert-auth (PEM).
    #[arg(long, value_name = "FILE")]
    etcd_cert: Option<PathBuf>,
    /// Private key of --etcd-cert (PEM).
    #[arg(long, value_name = "FILE")]
    etcd_key: Option<PathBuf>,
}

impl EtcdTlsArgs {
    /// Each file from these flags, else from `under`.
    fn over(self, under: Self) -> Self {
        Self {
            etcd_ca: self.etcd_ca.or(under.etcd_ca),
            etcd_cert: self.etcd_cert.or(under.etcd_cert),
            etcd_key: self.etcd_key.or(under.etcd_key),
        }
    }

    /// `spec` with these files when it is an etcd store.
    pub(super) fn apply(self, mut spec: StoreSpec) -> StoreSpec {
        if let StoreSpec::Etcd { tls, .. } = &mut spec {
            *tls = ClientTls {
                ca: self.etcd_ca,
                cert: self.etcd_cert,
                key: self.etcd_key,
            };
        }
        spec
    }
}

/// `gpuwarden-controller run`.
#[derive(clap::Args)]
pub(super) struct RunArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:50051")]
    listen: SocketAddr,
    /// Directory of the embedded store (sled in its `store/` folder), unless --store says
    /// otherwise.
    #[arg(long, default_value = "/var/lib/gpuwarden/controller")]
    state_dir: PathBuf,
    /// Where the state lives: sled:PATH, or etcd://HOST:PORT,HOST:PORT…/PREFIX (one endpoint
    /// or more; the prefix optional) for a store shared by several controllers (overrides the
    /// config file's `store`).
    #[arg(long, value_name = "SPEC")]
    store: Option<StoreSpec>,
    /// With an etcd store: the address agents and clients reach this controller at, which
    /// standbys tell them (default: the listen address, or this host's name with its port).
    #[arg(long, value_name = "HOST:PORT")]
    advertise: Option<String>,
    /// With an etcd store: seconds a leader may go without renewing its lease before a
    /// standby takes over (at least 2: etcd raises shorter ones).
    #[arg(long, default_value_t = DEFAULT_LEASE_TTL_SECS, value_parser = clap::value_parser!(u64).range(2..))]
    lease_ttl_secs: u64,
    #[command(flatten)]
    etcd_tls: EtcdTlsArgs,
    /// TOML config file.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Placement mode for sessions that don't ask for one: binpack, spread or
    /// interference-aware (overrides the config file's `[scheduler] strategy`).
    #[arg(long, value_name = "MODE")]
    placement: Option<crate::placement::Placement>,
    /// Serving certificate (PEM). With --tls-key and --tls-client-ca the port speaks TLS
    /// and agents must present a node certificate; without, plain text.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// Private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// CA that signs agents' (and clients') certificates (PEM).
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// Hashed bearer tokens of scheduler clients (TOML; see `tokens add`), re-read when it
    /// changes. With it or with TLS, clients must authenticate; with neither, every client
    /// is an admin.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// What users may bind sessions to, per owner: cgroup prefixes and Kubernetes namespaces
    /// (TOML), re-read when it changes. Without it a user binds only its own `gpuwarden run`
    /// cgroups; admins bind anything.
    #[arg(long, value_name = "FILE")]
    grant_file: Option<PathBuf>,
    /// Serve plain text on a non-loopback address (the gRPC port without TLS, the extender's
    /// plain-HTTP port): refused without this. Anyone who reaches the port then acts as any
    /// node; warned at every start and exported as `gpuwarden.controller.insecure` = 1.
    #[arg(long)]
    insecure: bool,
    /// Serve the metrics in Prometheus' text format at `GET /metrics` on this address (plain
    /// HTTP; overrides the config file's `prometheus_listen`; off by default).
    #[arg(long, env = "GPUWARDEN_PROMETHEUS_LISTEN", value_name = "ADDR")]
    prometheus_listen: Option<SocketAddr>,
    /// Serve --prometheus-listen on a non-loopback address (it has no authentication: anyone
    /// who reaches it reads every session's names and usage); refused without this or
    /// --insecure. Only the metrics: the gRPC port keeps its TLS.
    #[arg(
        long,
        env = "GPUWARDEN_PROMETHEUS_INSECURE",
        num_args = 0..=1,
        default_missing_value = "true",
        value_name = "BOOL"
    )]
    prometheus_insecure: Option<bool>,
    /// Boxed: the flags of the Kubernetes side would make every `Command` as large.
    #[command(flatten)]
    kube: Box<KubeArgs>,
}

/// What `run` runs with: the flags over the file over the defaults, every file it names loaded
/// and every refusal made, before anything is opened. Built into an [`super::App`]; tests and
/// benchmarks make one with [`RunConfig::new`] and change only the fields they need.
pub struct RunConfig {
    /// The gRPC port's address.
    pub listen: SocketAddr,
    /// The store, with its TLS to etcd.
    pub store: StoreSpec,
    /// With an etcd store: the address standbys tell agents and clients (`None`: the listen
    /// address, or this host's name with its port where that is a wildcard).
    pub advertise: Option<String>,
    /// With an etcd store: the leadership lease.
    pub lease_ttl: Duration,
    /// How the port speaks and clients authenticate.
    pub security: Security,
    /// The bounds on what clients and agents send.
    pub limits: Limits,
    /// Scheduler settings, with the placement mode of `--placement`.
    pub scheduler: SchedulerConfig,
    /// The agent protocol's timing.
    pub timing: Timing,
    /// Where metrics go.
    pub exporters: Exporters,
    /// The webhook and the extender.
    pub kube: KubeArgs,
}

/// `--lease-ttl-secs` when not given.
const DEFAULT_LEASE_TTL_SECS: u64 = 2;

impl RunConfig {
    /// A controller serving plain text on `listen` (port 0: any free one) with its state in
    /// `store`, every other setting as `run` has it with no other flag and no file (metrics
    /// off, a lease of 2 s on etcd, no webhook or extender).
    #[must_use]
    pub fn new(listen: SocketAddr, store: StoreSpec) -> Self {
        Self {
            listen,
            store,
            advertise: None,
            lease_ttl: Duration::from_secs(DEFAULT_LEASE_TTL_SECS),
            security: Transport::PlainText.into(),
            limits: Limits::default(),
            scheduler: SchedulerConfig::default(),
            timing: Timing::default(),
            exporters: Exporters::default(),
            kube: KubeArgs::default(),
        }
    }
}

impl RunArgs {
    /// Layers these flags over the config file they name (if any) and loads the files both
    /// name; refuses plain text where other machines reach it without `--insecure`.
    ///
    /// # Errors
    /// A file can't be read or used, the TLS files are incomplete, or plain text would be
    /// exposed.
    pub(super) fn resolve(self) -> Result<RunConfig, ServeError> {
        let file = match self.config.as_deref() {
            Some(path) => FileConfig::read(path)?,
            None => FileConfig::default(),
        };
        let transport = Transport::from_files(
            self.tls_cert.or(file.tls_cert.clone()),
            self.tls_key.or(file.tls_key.clone()),
            self.tls_client_ca.or(file.tls_client_ca.clone()),
        )?;
        let tokens = self
            .token_file
            .or(file.token_file.clone())
            .map(|path| TokenFile::load(&path))
            .transpose()?
            .map(Arc::new);
        let grants = self
            .grant_file
            .or(file.grant_file.clone())
            .map(|path| GrantFile::load(&path))
            .transpose()?
            .unwrap_or_default();
        let insecure = self.insecure || file.insecure.unwrap_or(false);
        let transport = match transport {
            Transport::PlainText if insecure => Transport::Insecure,
            other => other,
        };
        // Refused before anything is opened, with the flags named.
        transport.check_exposure(self.listen)?;
        match self.kube.extender_listen {
            Some(addr) if !insecure && !addr.ip().is_loopback() => {
                return Err(ServeError::PlainTextExposed {
                    addr,
                    what: "--extender-listen: anyone who reaches it learns every node's GPU occupancy",
                });
            }
            _ => {}
        }
        let prometheus = self.prometheus_listen.or(file.prometheus_listen);
        if let Some(addr) = prometheus {
            // `--insecure` already allows plain text beyond loopback; the narrower flag allows
            // only the metrics, for a controller whose gRPC port speaks TLS.
            let allowed =
                insecure || self.prometheus_insecure.or(file.prometheus_insecure) == Some(true);
            gpuwarden_runtime::prometheus::check_exposure(addr, allowed)?;
        }
        let mut timing = Timing::default();
        if let Some(secs) = file.heartbeat_timeout_secs {
            timing.heartbeat_timeout = Duration::from_secs(secs);
        }
        let store = self
            .store
            .or(file.store.clone())
            .unwrap_or_else(|| StoreSpec::sled_in(&self.state_dir));
        let store = self.etcd_tls.over(file.etcd_tls()).apply(store);
        let mut scheduler = file.scheduler.unwrap_or_default();
        if let Some(mode) = self.placement {
            scheduler.strategy = mode;
        }
        Ok(RunConfig {
            listen: self.listen,
            store,
            advertise: self.advertise,
            lease_ttl: Duration::from_secs(self.lease_ttl_secs),
            security: Security {
                transport,
                tokens,
                grants: Arc::new(grants),
            },
            limits: file.limits,
            scheduler,
            timing,
            exporters: Exporters {
                otlp: file
                    .otlp_endpoint
                    .filter(|e| !e.is_empty())
                    .or_else(crate::metrics::endpoint_from_env),
                interval: None,
                prometheus,
            },
            kube: *self.kube,
        })
    }
}

/// The address to advertise for `listen`: itself, unless it is a wildcard, then this host's name
/// with its port.
pub(super) fn advertised(listen: SocketAddr) -> String {
    if !listen.ip().is_unspecified() {
        return listen.to_string();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "localhost".to_owned(), |h| h.trim().to_owned());
    format!("{host}:{}", listen.port())
}
