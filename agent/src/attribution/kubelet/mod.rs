//! Pod names from the kubelet: the node's pod list (`GET https://<node>:10250/pods`), kept as a
//! map of pod UID → name and namespace.
//!
//! Attribution reads a pod's UID from its cgroup path; its name and namespace are only in the
//! Kubernetes API. The kubelet of the node already serves the list of the pods it runs, so the
//! agent asks it rather than the API server (one request per node, no watch, no API-server load).
//! A [`PodNames`] handle answers look-ups from the map and never waits: a task refreshes it every
//! [`KubeletConfig::refresh`], and sooner (at most once per [`KubeletConfig::miss_interval`]) when
//! a look-up asks for a UID it doesn't have.
//!
//! Failures (kubelet unreachable, 401/403, a body that isn't a pod list) never stop the agent:
//! the names stay absent, each request's result is counted by a low-cardinality label, and the
//! log says so once per change of state.
//!
//! # Example
//!
//! ```
//! use gpuwarden_agent::attribution::kubelet::parse_pod_list;
//!
//! let pods = parse_pod_list(br#"{"kind":"PodList","items":[{"metadata":
//!     {"name":"train-0","namespace":"ml","uid":"0b3c2f0e-5a8c-4d4e-9f6e-1f2a3b4c5d6e"}}]}"#)
//!     .unwrap();
//! assert_eq!(pods["0b3c2f0e-5a8c-4d4e-9f6e-1f2a3b4c5d6e"].name, "train-0");
//! ```
//!
//! - `pods`: reading the pod list;
//! - `refresh`: the task that keeps the map fresh;
//! - `client`: the HTTP/1 (and TLS) client that asks the kubelet.

mod client;
mod pods;
mod refresh;

use gpuwarden_runtime::sync::Lock as _;
use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

pub use gpuwarden_agent_api::KubeletStatus;
pub use pods::{PodName, parse_pod_list};

use gpuwarden_kube::KubeError;
use refresh::{Cache, Inner};

/// The service account token a pod gets mounted.
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// The cluster CA a pod gets mounted (signs kubelet serving certificates where the cluster
/// bootstraps them, `serverTLSBootstrap`).
pub const SERVICE_ACCOUNT_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// The kubelet's authenticated port.
pub const KUBELET_PORT: u16 = 10250;

/// Errors asking the kubelet for its pods.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// No answer: the settings, the connection, TLS, HTTP, the token file, the time limit.
    #[error(transparent)]
    Request(#[from] KubeError),
    /// 401: the token was not accepted.
    #[error("the kubelet refused the credentials (401 Unauthorized)")]
    Unauthorized,
    /// 403: the service account may not read the pod list.
    #[error("the kubelet refused the request (403 Forbidden): grant `get` on nodes/pods")]
    Forbidden,
    /// Another unexpected status.
    #[error("the kubelet answered HTTP {status}")]
    Status {
        /// The status code.
        status: u16,
    },
    /// The body is not a pod list.
    #[error("the kubelet's answer is not a pod list: {0}")]
    Malformed(#[source] serde_json::Error),
}

impl KubeletError {
    /// A low-cardinality label for counting (`gpuwarden.result`).
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Request(e) => e.label(),
            Self::Status { .. } => "http_error",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::Malformed(_) => "malformed",
        }
    }
}

/// How to reach the kubelet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletConfig {
    /// The pod list's URL, `http://` or `https://` (e.g. `https://10.0.0.5:10250/pods`).
    pub url: String,
    /// Bearer token file, re-read at every request (projected tokens rotate); `None` sends none.
    pub token_file: Option<PathBuf>,
    /// PEM file of the CA(s) that sign the kubelet's serving certificate.
    pub ca_file: Option<PathBuf>,
    /// Accept any certificate (kubelets often serve a self-signed one). Logged at start.
    pub insecure_skip_tls_verify: bool,
    /// Time between refreshes.
    pub refresh: Duration,
    /// Least time between refreshes asked for by look-ups of unknown pods.
    pub miss_interval: Duration,
}

impl KubeletConfig {
    /// The configuration from the config file's values and the environment:
    /// `url` (file) or `GPUWARDEN_KUBELET_URL`; else, in a pod (`NODE_IP` set from the downward
    /// API's `status.hostIP`), `https://$NODE_IP:10250/pods`; else off. An empty URL turns it off.
    /// The token defaults to the service account's where that file exists, the CA likewise.
    #[must_use]
    pub fn resolve(
        url: Option<String>,
        token_file: Option<PathBuf>,
        ca_file: Option<PathBuf>,
        insecure_skip_tls_verify: bool,
    ) -> Option<Self> {
        let env = |k: &str| std::env::var(k).ok();
        let url = url.or_else(|| env("GPUWARDEN_KUBELET_URL")).or_else(|| {
            env("NODE_IP")
                .filter(|ip| !ip.is_empty())
                .map(|ip| default_url(&ip))
        })?;
        if url.is_empty() {
            return None;
        }
        let present = |p: &str| Path::new(p).exists().then(|| PathBuf::from(p));
        Some(Self {
            url,
            token_file: token_file.or_else(|| present(SERVICE_ACCOUNT_TOKEN)),
            ca_file: ca_file.or_else(|| present(SERVICE_ACCOUNT_CA)),
            insecure_skip_tls_verify,
            refresh: Duration::from_secs(30),
            miss_interval: Duration::from_secs(5),
        })
    }

    /// The same URL, other settings for tests: no token, no TLS, quick refreshes.
    #[must_use]
    pub fn plain(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            token_file: None,
            ca_file: None,
            insecure_skip_tls_verify: false,
            refresh: Duration::from_secs(30),
            miss_interval: Duration::from_millis(500),
        }
    }
}

/// `https://<ip>:10250/pods`, with an IPv6 address in brackets.
#[must_use]
pub fn default_url(node_ip: &str) -> String {
    if node_ip.contains(':') {
        format!("https://[{node_ip}]:{KUBELET_PORT}/pods")
    } else {
        format!("https://{node_ip}:{KUBELET_PORT}/pods")
    }
}

/// Pod UID → name and namespace, refreshed from the kubelet by a background task. Cheap to clone;
/// look-ups never wait for the network.
#[derive(Clone)]
pub struct PodNames {
    inner: Option<Arc<Inner>>,
}

impl PodNames {
    /// No kubelet: every look-up answers `None`.
    #[must_use]
    pub fn disabled() -> Self {
        Self { inner: None }
    }

    /// Starts the refresh task on the current tokio runtime. A configuration that can't work (a
    /// bad URL, an unreadable CA) is logged and counted, and the names stay absent.
    #[must_use]
    pub fn spawn(config: KubeletConfig) -> Self {
        let inner = Arc::new(Inner {
            cache: Mutex::new(Cache {
                status: KubeletStatus {
                    url: config.url.clone(),
                    state: "pending".to_owned(),
                    ..KubeletStatus::default()
                },
                ..Cache::default()
            }),
            wake: tokio::sync::Notify::new(),
        });
        tokio::spawn(refresh::refresh_loop(config, Arc::clone(&inner)));
        Self { inner: Some(inner) }
    }

    /// The name and namespace of the pod with `uid`, if the last list had it. A miss asks the
    /// task to refresh soon.
    #[must_use]
    pub fn lookup(&self, uid: &str) -> Option<PodName> {
        let inner = self.inner.as_ref()?;
        let mut cache = inner.cache.locked();
        if let Some(pod) = cache.pods.get(uid) {
            return Some(pod.clone());
        }
        if !cache.unknown.contains(uid) && cache.missed.insert(uid.to_owned()) {
            inner.wake.notify_one();
        }
        None
    }

    /// What the task has done; `None` when disabled.
    #[must_use]
    pub fn status(&self) -> Option<KubeletStatus> {
        let inner = self.inner.as_ref()?;
        let cache = inner.cache.locked();
        Some(cache.status.clone())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    const UID: &str = "0b3c2f0e-5a8c-4d4e-9f6e-1f2a3b4c5d6e";

    #[tokio::test]
    async fn an_unreachable_kubelet_leaves_names_absent_and_is_counted() {
        // A port nobody listens on: bind, note it, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let names = PodNames::spawn(KubeletConfig::plain(&format!(
            "http://127.0.0.1:{port}/pods"
        )));
        assert_eq!(names.lookup(UID), None);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let status = names.status().unwrap();
            if status.requests.get("unreachable").copied().unwrap_or(0) >= 1 {
                assert_eq!(status.state, "unreachable");
                assert!(status.error.is_some());
                break;
            }
            assert!(Instant::now() < deadline, "{status:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(names.lookup(UID), None);
    }
}
