//! The `[dra]` section of the agent's config file, and the settings it resolves to.
//!
//! ```toml
//! [dra]
//! enabled = true
//! # GPUs offered to Kubernetes (indexes or UUIDs); the others stay the controller's.
//! gpus = "all"                      # or [0, 1] or ["GPU-…"]
//! plugins_registry_dir = "/var/lib/kubelet/plugins_registry"
//! plugins_dir = "/var/lib/kubelet/plugins"
//! cdi_dir = "/var/run/cdi"
//! memory_policy = "kill"            # a claim's opaque config may say otherwise
//! compute_policy = "hard"
//! # The API server: in-cluster (service account) unless given here.
//! api_server = "https://10.0.0.1:443"
//! api_token_file = "/var/run/secrets/kubernetes.io/serviceaccount/token"
//! api_ca_file = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
//! ```

use std::path::PathBuf;

use serde::Deserialize;

use gpuwarden_types::policy::{ComputePolicy, MemoryPolicy, PolicyError, QuotaPolicy};

use gpuwarden_kube::Endpoint;

use crate::devices::GpuDevice;

/// The kubelet's plugin-registration directory (its plugin watcher looks there).
pub const DEFAULT_PLUGINS_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// Where kubelet plugins keep their own sockets.
pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
/// Where container runtimes read CDI specs from (the other is `/etc/cdi`).
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";

/// Which GPUs the node offers to Kubernetes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum GpuSelection {
    /// `"all"`.
    Keyword(String),
    /// GPU indexes.
    Indexes(Vec<u32>),
    /// GPU UUIDs.
    Uuids(Vec<String>),
}

impl Default for GpuSelection {
    fn default() -> Self {
        Self::Keyword("all".to_owned())
    }
}

/// The `[dra]` section as written; every key optional.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DraFileConfig {
    /// Serve the kubelet as DRA driver `gpu.gpuwarden.io` (default false).
    pub enabled: Option<bool>,
    /// GPUs offered to Kubernetes (default: all); the others are offered to the controller.
    pub gpus: Option<GpuSelection>,
    /// The kubelet's plugin-registration directory.
    pub plugins_registry_dir: Option<PathBuf>,
    /// The kubelet's plugin directory (the DRA socket goes in `<this>/gpu.gpuwarden.io/`).
    pub plugins_dir: Option<PathBuf>,
    /// Where CDI specs are written.
    pub cdi_dir: Option<PathBuf>,
    /// Memory policy when a claim's config names none: `kill`, `stop` or `report`.
    pub memory_policy: Option<String>,
    /// Compute policy when a claim's config names none: `hard` or `work-conserving`.
    pub compute_policy: Option<String>,
    /// The API server's URL (default: in-cluster, from `KUBERNETES_SERVICE_HOST`/`_PORT`).
    /// `http://` is taken only when written here (tests on loopback).
    pub api_server: Option<String>,
    /// Bearer token file (default: the service account's, where mounted).
    pub api_token_file: Option<PathBuf>,
    /// CA bundle of the API server (default: the service account's `ca.crt`).
    pub api_ca_file: Option<PathBuf>,
}

/// Why the `[dra]` section can't be used.
#[derive(Debug, thiserror::Error)]
pub enum DraConfigError {
    /// A default policy nobody knows.
    #[error("[dra]: {0}")]
    Policy(#[from] PolicyError),
    /// `gpus` is a word other than `all`.
    #[error("[dra] gpus = {0:?}: expected \"all\", a list of indexes or a list of UUIDs")]
    Gpus(String),
    /// No API server configured and not running in a cluster.
    #[error(
        "[dra]: no api_server set and KUBERNETES_SERVICE_HOST not in the environment (not in a pod?)"
    )]
    NoApiServer,
}

/// How the agent reaches the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiServerConfig {
    /// `https://host:port`, or `http://…` when configured explicitly.
    pub url: String,
    /// Bearer token file, read at each request (projected tokens rotate).
    pub token_file: Option<PathBuf>,
    /// CA bundle for an `https` URL.
    pub ca_file: Option<PathBuf>,
}

/// The DRA plugin's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraConfig {
    /// GPUs offered to Kubernetes.
    pub gpus: GpuSelection,
    /// The kubelet's plugin-registration directory.
    pub plugins_registry_dir: PathBuf,
    /// The kubelet's plugin directory.
    pub plugins_dir: PathBuf,
    /// Where CDI specs are written.
    pub cdi_dir: PathBuf,
    /// Policies when a claim's config names none.
    pub policy: QuotaPolicy,
    /// The API server.
    pub api: ApiServerConfig,
}

impl DraConfig {
    /// The settings of `file`, `None` when DRA is not enabled; `env` reads the environment
    /// (`KUBERNETES_SERVICE_HOST`/`_PORT`).
    ///
    /// # Errors
    /// A bad policy or GPU selection, or no API server to use.
    pub fn resolve(
        file: Option<DraFileConfig>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, DraConfigError> {
        let Some(file) = file.filter(|f| f.enabled == Some(true)) else {
            return Ok(None);
        };
        let gpus = file.gpus.unwrap_or_default();
        if let GpuSelection::Keyword(word) = &gpus
            && word != "all"
        {
            return Err(DraConfigError::Gpus(word.clone()));
        }
        let policy = QuotaPolicy::parse(
            file.memory_policy.as_deref().unwrap_or(""),
            file.compute_policy.as_deref().unwrap_or(""),
        )?;
        let api = if let Some(url) = file.api_server {
            ApiServerConfig {
                url,
                token_file: file.api_token_file,
                ca_file: file.api_ca_file,
            }
        } else {
            // In a cluster the API server is always reached over TLS, with the mounted service
            // account's token and CA unless the file names others.
            let in_cluster =
                Endpoint::in_cluster_api_server_from(env).ok_or(DraConfigError::NoApiServer)?;
            let mounted = |p: Option<PathBuf>| p.filter(|p| p.exists());
            ApiServerConfig {
                url: in_cluster.url,
                token_file: file
                    .api_token_file
                    .or_else(|| mounted(in_cluster.token_file)),
                ca_file: file.api_ca_file.or_else(|| mounted(in_cluster.ca_file)),
            }
        };
        Ok(Some(Self {
            gpus,
            plugins_registry_dir: file
                .plugins_registry_dir
                .unwrap_or_else(|| PathBuf::from(DEFAULT_PLUGINS_REGISTRY_DIR)),
            plugins_dir: file
                .plugins_dir
                .unwrap_or_else(|| PathBuf::from(DEFAULT_PLUGINS_DIR)),
            cdi_dir: file
                .cdi_dir
                .unwrap_or_else(|| PathBuf::from(DEFAULT_CDI_DIR)),
            policy,
            api,
        }))
    }

    /// Whether `gpu` is offered to Kubernetes (otherwise it is the controller's). A MIG
    /// instance is, by its own index or UUID or by its parent GPU's: an instance made later
    /// (for a claim's partition) gets an index and UUID no list could name beforehand, and
    /// must not become the controller's.
    #[must_use]
    pub fn offers(&self, gpu: &GpuDevice) -> bool {
        self.offers_gpu(&gpu.uuid, gpu.index)
            || gpu
                .mig
                .as_ref()
                .is_some_and(|m| self.offers_gpu(&m.parent_uuid, m.parent_index))
    }

    /// Whether the GPU `uuid` at `index` is offered to Kubernetes (a GPU in MIG mode, which is
    /// no device itself, by its own index and UUID).
    #[must_use]
    pub fn offers_gpu(&self, uuid: &str, index: u32) -> bool {
        match &self.gpus {
            GpuSelection::Keyword(_) => true,
            GpuSelection::Indexes(indexes) => indexes.contains(&index),
            GpuSelection::Uuids(uuids) => uuids.iter().any(|u| u.eq_ignore_ascii_case(uuid)),
        }
    }

    /// The socket the kubelet's plugin watcher finds.
    #[must_use]
    pub fn registration_socket(&self) -> PathBuf {
        self.plugins_registry_dir
            .join(format!("{}-reg.sock", super::DRIVER_NAME))
    }

    /// The socket `DRAPlugin` is served on.
    #[must_use]
    pub fn plugin_socket(&self) -> PathBuf {
        self.plugins_dir.join(super::DRIVER_NAME).join("dra.sock")
    }
}

/// Memory and compute policies, the node's defaults overridden by what a claim's opaque config
/// names.
///
/// # Errors
/// A name nobody knows.
pub fn policy_with(
    defaults: QuotaPolicy,
    memory: Option<&str>,
    compute: Option<&str>,
) -> Result<QuotaPolicy, PolicyError> {
    Ok(QuotaPolicy {
        memory: memory.map_or(Ok(defaults.memory), str::parse::<MemoryPolicy>)?,
        compute: compute.map_or(Ok(defaults.compute), str::parse::<ComputePolicy>)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> Option<DraFileConfig> {
        toml::from_str::<crate::config::FileConfig>(text)
            .unwrap()
            .dra
    }

    #[test]
    fn the_section_is_off_unless_enabled_and_in_cluster_by_default() {
        let none = |_: &str| None;
        assert_eq!(DraConfig::resolve(file(""), none).unwrap(), None);
        assert_eq!(
            DraConfig::resolve(file("[dra]\ngpus = [1]"), none).unwrap(),
            None
        );
        let env = |k: &str| match k {
            "KUBERNETES_SERVICE_HOST" => Some("fd00::1".to_owned()),
            "KUBERNETES_SERVICE_PORT" => Some("443".to_owned()),
            _ => None,
        };
        let c = DraConfig::resolve(file("[dra]\nenabled = true"), env)
            .unwrap()
            .unwrap();
        assert_eq!(c.api.url, "https://[fd00::1]:443");
        assert_eq!(c.gpus, GpuSelection::Keyword("all".into()));
        assert_eq!(
            c.registration_socket(),
            PathBuf::from("/var/lib/kubelet/plugins_registry/gpu.gpuwarden.io-reg.sock")
        );
        assert_eq!(
            c.plugin_socket(),
            PathBuf::from("/var/lib/kubelet/plugins/gpu.gpuwarden.io/dra.sock")
        );
        assert_eq!(c.cdi_dir, PathBuf::from("/var/run/cdi"));
        let err = DraConfig::resolve(file("[dra]\nenabled = true"), none).unwrap_err();
        assert!(err.to_string().contains("KUBERNETES_SERVICE_HOST"), "{err}");
    }

    #[test]
    fn gpus_and_policies_are_checked() {
        let none = |_: &str| None;
        let c = DraConfig::resolve(
            file("[dra]\nenabled = true\napi_server = \"http://127.0.0.1:1\"\ngpus = [\"GPU-b\"]\nmemory_policy = \"stop\""),
            none,
        )
        .unwrap()
        .unwrap();
        let gpu = |index: u32, uuid: &str| GpuDevice {
            mig: None,
            uuid: uuid.into(),
            model: String::new(),
            memory_bytes: 0,
            numa_node: 0,
            sm_count: 0,
            is_mig: false,
            index,
            device_node: String::new(),
        };
        assert!(c.offers(&gpu(1, "gpu-B")));
        assert!(!c.offers(&gpu(0, "GPU-a")));
        // An instance of an offered GPU is offered, whatever its own index and UUID.
        let instance = |parent: &str| GpuDevice {
            mig: Some(crate::devices::mig::MigInstance {
                parent_index: 1,
                parent_uuid: parent.into(),
                gpu_instance: 1,
                compute_instance: 0,
                profile: "1g.18gb".into(),
                gi_cap_minor: None,
                ci_cap_minor: None,
            }),
            is_mig: true,
            ..gpu(7, "MIG-new")
        };
        assert!(c.offers(&instance("GPU-b")));
        assert!(!c.offers(&instance("GPU-a")));
        assert_eq!(c.policy.memory, MemoryPolicy::Stop);
        for bad in ["gpus = \"some\"", "memory_policy = \"freeze\""] {
            let text = format!("[dra]\nenabled = true\napi_server = \"http://x\"\n{bad}");
            assert!(DraConfig::resolve(file(&text), none).is_err(), "{bad}");
        }
    }
}
