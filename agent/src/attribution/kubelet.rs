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

use std::{
    collections::{HashMap, HashSet},
    io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::{
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite};

/// The service account token a pod gets mounted.
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// The cluster CA a pod gets mounted (signs kubelet serving certificates where the cluster
/// bootstraps them, `serverTLSBootstrap`).
pub const SERVICE_ACCOUNT_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// The kubelet's authenticated port.
pub const KUBELET_PORT: u16 = 10250;

/// Largest pod list read (a node's 110 pods are a few MB at most).
const MAX_BODY: usize = 64 << 20;

/// One request's time limit, connect to last byte.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors asking the kubelet for its pods.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The URL can't be used.
    #[error("invalid kubelet URL `{url}`: {reason}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The CA file can't be read or holds no certificate.
    #[error("cannot use the kubelet CA file {path}: {reason}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// An `https` URL with neither a CA file nor insecure-skip-verify.
    #[error(
        "no CA to verify the kubelet with: set kubelet_ca_file, or kubelet_insecure_skip_tls_verify"
    )]
    NoCa,
    /// The TLS set-up was refused by the TLS library.
    #[error("TLS set-up: {0}")]
    TlsConfig(#[source] rustls::Error),
    /// The token file can't be read.
    #[error("cannot read the token file {path}: {source}")]
    Token {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// No TCP connection.
    #[error("cannot connect to the kubelet at {addr}: {source}")]
    Connect {
        /// `host:port`.
        addr: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The TLS handshake failed (an untrusted certificate, usually).
    #[error("TLS handshake with the kubelet failed: {0}")]
    Tls(#[source] io::Error),
    /// The HTTP exchange failed.
    #[error("HTTP exchange with the kubelet failed: {0}")]
    Http(#[source] hyper::Error),
    /// The body could not be read (or was larger than allowed).
    #[error("reading the kubelet's answer failed: {0}")]
    Body(String),
    /// The request took too long.
    #[error("the kubelet did not answer within {0:?}")]
    Timeout(Duration),
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
            Self::Url { .. } | Self::CaFile { .. } | Self::NoCa | Self::TlsConfig(_) => "config",
            Self::Token { .. } => "token",
            Self::Connect { .. } => "unreachable",
            Self::Tls(_) => "tls",
            Self::Http(_) | Self::Body(_) | Self::Status { .. } => "http_error",
            Self::Timeout(_) => "timeout",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::Malformed(_) => "malformed",
        }
    }
}

/// A pod's name and namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodName {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
}

#[derive(Deserialize)]
struct PodList {
    items: Vec<Pod>,
}

#[derive(Deserialize)]
struct Pod {
    metadata: Metadata,
}

#[derive(Deserialize)]
struct Metadata {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
}

/// Reads a `PodList` JSON document into UID → name and namespace. Pods without a UID, name or
/// namespace are skipped (the kubelet always sets them; a partial entry says nothing usable).
///
/// # Errors
/// The document is not JSON, or has no `items` list of objects with `metadata`.
pub fn parse_pod_list(body: &[u8]) -> Result<HashMap<String, PodName>, KubeletError> {
    let list: PodList = serde_json::from_slice(body).map_err(KubeletError::Malformed)?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|pod| {
            let Metadata {
                name,
                namespace,
                uid,
            } = pod.metadata;
            // The cgroup path gives the UID in lowercase.
            Some((
                uid?.to_ascii_lowercase(),
                PodName {
                    name: name?,
                    namespace: namespace?,
                },
            ))
        })
        .collect())
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

pub use gpuwarden_agent_api::snapshot::KubeletStatus;

#[derive(Default)]
struct Cache {
    pods: HashMap<String, PodName>,
    /// UIDs looked up and not found since the last request.
    missed: HashSet<String>,
    /// UIDs the last request did not list either: not asked for again until the next
    /// scheduled refresh.
    unknown: HashSet<String>,
    status: KubeletStatus,
}

struct Inner {
    cache: Mutex<Cache>,
    wake: tokio::sync::Notify,
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
        tokio::spawn(refresh_loop(config, Arc::clone(&inner)));
        Self { inner: Some(inner) }
    }

    /// The name and namespace of the pod with `uid`, if the last list had it. A miss asks the
    /// task to refresh soon.
    #[must_use]
    pub fn lookup(&self, uid: &str) -> Option<PodName> {
        let inner = self.inner.as_ref()?;
        let mut cache = inner.cache.lock().unwrap_or_else(PoisonError::into_inner);
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
        let cache = inner.cache.lock().unwrap_or_else(PoisonError::into_inner);
        Some(cache.status.clone())
    }

    /// Fills the pod name and namespace of every container of `snapshot` whose pod is known,
    /// and its `kubelet` status.
    pub fn annotate(&self, snapshot: &mut gpuwarden_agent_api::snapshot::Snapshot) {
        if self.inner.is_none() {
            return;
        }
        for c in &mut snapshot.containers {
            if let Some(pod) = c.pod_uid.as_deref().and_then(|uid| self.lookup(uid)) {
                c.pod_name = Some(pod.name);
                c.pod_namespace = Some(pod.namespace);
            }
        }
        snapshot.kubelet = self.status();
    }
}

async fn refresh_loop(config: KubeletConfig, inner: Arc<Inner>) {
    let client = match Client::new(&config) {
        Ok(client) => client,
        Err(e) => {
            tracing::warn!(url = %config.url, "pod names off: {e}");
            record(&inner, &config.url, Err(&e));
            return;
        }
    };
    if config.insecure_skip_tls_verify && client.tls.is_some() {
        tracing::warn!(url = %config.url, "the kubelet's certificate is NOT verified (kubelet_insecure_skip_tls_verify)");
    }
    let mut next_scheduled = Instant::now();
    loop {
        let scheduled = Instant::now() >= next_scheduled;
        if scheduled {
            next_scheduled = Instant::now() + config.refresh;
        }
        let result = client.pods().await;
        let requested = {
            let mut cache = inner.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if scheduled {
                cache.unknown.clear();
            }
            std::mem::take(&mut cache.missed)
        };
        // On an error the last good list stays: a kubelet restarting for a moment loses no names.
        if let Ok(pods) = &result {
            let mut cache = inner.cache.lock().unwrap_or_else(PoisonError::into_inner);
            cache.pods.clone_from(pods);
            let unknown: Vec<String> = requested
                .into_iter()
                .filter(|uid| !pods.contains_key(uid))
                .collect();
            cache.unknown.extend(unknown);
        }
        record(&inner, &config.url, result.as_ref().map(HashMap::len));
        let miss_allowed = Instant::now() + config.miss_interval;
        tokio::select! {
            () = tokio::time::sleep_until(next_scheduled.into()) => {}
            () = inner.wake.notified() => {
                // A look-up missed: refresh, but not more often than miss_interval.
                tokio::time::sleep_until(miss_allowed.min(next_scheduled).into()).await;
            }
        }
    }
}

/// Counts a request's result and logs a change of state.
fn record(inner: &Inner, url: &str, result: Result<usize, &KubeletError>) {
    let mut cache = inner.cache.lock().unwrap_or_else(PoisonError::into_inner);
    let status = &mut cache.status;
    let label = match result {
        Ok(_) => "ok",
        Err(e) => e.label(),
    };
    *status.requests.entry(label.to_owned()).or_default() += 1;
    if status.state != label {
        match result {
            Ok(n) => tracing::info!(%url, pods = n, "pod names from the kubelet"),
            Err(e) => {
                tracing::warn!(%url, result = label, "pod names unavailable (names stay absent): {e}");
            }
        }
    }
    label.clone_into(&mut status.state);
    match result {
        Ok(n) => {
            status.pods = n as u64;
            status.error = None;
        }
        Err(e) => status.error = Some(e.to_string()),
    }
}

/// One-request-at-a-time HTTP/1 client for the pod list.
struct Client {
    uri: http::Uri,
    host: String,
    port: u16,
    tls: Option<tokio_rustls::TlsConnector>,
    token_file: Option<PathBuf>,
}

impl Client {
    fn new(config: &KubeletConfig) -> Result<Self, KubeletError> {
        let bad = |reason: &str| KubeletError::Url {
            url: config.url.clone(),
            reason: reason.to_owned(),
        };
        let uri: http::Uri = config.url.parse().map_err(|e| bad(&format!("{e}")))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(bad("the scheme must be http or https")),
        };
        let host = uri
            .host()
            .ok_or_else(|| bad("no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = https.then(|| tls_connector(config)).transpose()?;
        Ok(Self {
            uri,
            host,
            port,
            tls,
            token_file: config.token_file.clone(),
        })
    }

    async fn pods(&self) -> Result<HashMap<String, PodName>, KubeletError> {
        let body = tokio::time::timeout(REQUEST_TIMEOUT, self.get())
            .await
            .map_err(|_| KubeletError::Timeout(REQUEST_TIMEOUT))??;
        parse_pod_list(&body)
    }

    async fn get(&self) -> Result<Bytes, KubeletError> {
        let mut request = http::Request::get(
            self.uri
                .path_and_query()
                .map_or("/", http::uri::PathAndQuery::as_str),
        )
        .header(http::header::HOST, self.authority())
        .header(http::header::ACCEPT, "application/json");
        if let Some(path) = &self.token_file {
            let token = std::fs::read_to_string(path).map_err(|source| KubeletError::Token {
                path: path.clone(),
                source,
            })?;
            request = request.header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", token.trim()),
            );
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|e| KubeletError::Body(e.to_string()))?;
        let addr = format!("{}:{}", self.host, self.port);
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|source| KubeletError::Connect { addr, source })?;
        match &self.tls {
            Some(tls) => {
                let name =
                    ServerName::try_from(self.host.clone()).map_err(|e| KubeletError::Url {
                        url: self.uri.to_string(),
                        reason: e.to_string(),
                    })?;
                let stream = tls.connect(name, tcp).await.map_err(KubeletError::Tls)?;
                exchange(stream, request).await
            }
            None => exchange(tcp, request).await,
        }
    }

    fn authority(&self) -> String {
        match self.uri.authority() {
            Some(a) => a.as_str().to_owned(),
            None => self.host.clone(),
        }
    }
}

/// Sends `request` over `io` and reads the whole answer, mapping statuses to errors.
async fn exchange<S>(io: S, request: http::Request<Empty<Bytes>>) -> Result<Bytes, KubeletError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(KubeletError::Http)?;
    // The connection is driven by its own task; it ends with the exchange (one request).
    let driver = tokio::spawn(connection);
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(KubeletError::Http)?;
        match response.status().as_u16() {
            200 => {}
            401 => return Err(KubeletError::Unauthorized),
            403 => return Err(KubeletError::Forbidden),
            status => return Err(KubeletError::Status { status }),
        }
        Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes)
            .map_err(|e| KubeletError::Body(e.to_string()))
    }
    .await;
    driver.abort();
    result
}

/// TLS with the CA file's roots, or with no verification when asked.
fn tls_connector(config: &KubeletConfig) -> Result<tokio_rustls::TlsConnector, KubeletError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(KubeletError::TlsConfig)?;
    let tls = if config.insecure_skip_tls_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
            .with_no_client_auth()
    } else {
        let path = config.ca_file.as_ref().ok_or(KubeletError::NoCa)?;
        let ca_err = |reason: String| KubeletError::CaFile {
            path: path.clone(),
            reason,
        };
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(path).map_err(|e| ca_err(e.to_string()))? {
            let cert = cert.map_err(|e| ca_err(e.to_string()))?;
            roots.add(cert).map_err(|e| ca_err(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(ca_err("no certificate in it".to_owned()));
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    Ok(tokio_rustls::TlsConnector::from(Arc::new(tls)))
}

/// Accepts any server certificate (still checking the handshake's signatures): for kubelets
/// with self-signed serving certificates, when the operator asks for it.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const UID: &str = "0b3c2f0e-5a8c-4d4e-9f6e-1f2a3b4c5d6e";

    #[test]
    fn reads_a_pod_list() {
        let body = format!(
            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{}},"items":[
                {{"metadata":{{"name":"train-0","namespace":"ml","uid":"{}"}},"spec":{{}},"status":{{}}}},
                {{"metadata":{{"name":"no-uid","namespace":"ml"}}}}
            ]}}"#,
            UID.to_uppercase()
        );
        let pods = parse_pod_list(body.as_bytes()).unwrap();
        assert_eq!(pods.len(), 1);
        assert_eq!(
            pods[UID],
            PodName {
                name: "train-0".to_owned(),
                namespace: "ml".to_owned()
            }
        );
        assert!(parse_pod_list(br#"{"items":[]}"#).unwrap().is_empty());
    }

    #[test]
    fn malformed_lists_are_typed_errors() {
        for body in [
            &b"not json"[..],
            br#"{"kind":"Status","status":"Failure"}"#,
            br#"{"items":{"metadata":{}}}"#,
            br#"{"items":[{"spec":{}}]}"#,
            br#"{"items":[{"metadata":{"uid":7}}]}"#,
        ] {
            let err = parse_pod_list(body).unwrap_err();
            assert!(matches!(err, KubeletError::Malformed(_)), "{err}");
            assert_eq!(err.label(), "malformed");
        }
    }

    #[test]
    fn urls_are_checked_and_the_default_brackets_ipv6() {
        assert_eq!(default_url("10.0.0.5"), "https://10.0.0.5:10250/pods");
        assert_eq!(default_url("fd00::5"), "https://[fd00::5]:10250/pods");
        let c = Client::new(&KubeletConfig::plain("http://[::1]:8080/pods")).unwrap();
        assert_eq!((c.host.as_str(), c.port), ("::1", 8080));
        for bad in ["ftp://x/pods", "/pods", "http://"] {
            let err = Client::new(&KubeletConfig::plain(bad)).err().unwrap();
            assert_eq!(err.label(), "config", "{bad}: {err}");
        }
        // https needs a CA or an explicit opt-out.
        let err = Client::new(&KubeletConfig::plain("https://10.0.0.5:10250/pods"))
            .err()
            .unwrap();
        assert!(matches!(err, KubeletError::NoCa), "{err}");
        let mut insecure = KubeletConfig::plain("https://10.0.0.5:10250/pods");
        insecure.insecure_skip_tls_verify = true;
        assert!(Client::new(&insecure).unwrap().tls.is_some());
    }

    #[test]
    fn a_ca_file_without_certificates_is_refused() {
        let scratch = gpuwarden_test_support::scratch("ca");
        let path = scratch.path().join("ca.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let mut config = KubeletConfig::plain("https://10.0.0.5:10250/pods");
        config.ca_file = Some(path.clone());
        let err = Client::new(&config).err().unwrap();
        assert!(matches!(err, KubeletError::CaFile { .. }), "{err}");
    }

    /// A one-shot HTTP server on loopback answering `status` and `body`; returns the URL and
    /// the request it received.
    fn serve_once(status: &str, body: &str) -> (String, std::thread::JoinHandle<String>) {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/pods", listener.local_addr().unwrap());
        let response = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let thread = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                    break;
                }
                request.push_str(&line);
            }
            (&stream).write_all(response.as_bytes()).unwrap();
            request
        });
        (url, thread)
    }

    #[tokio::test]
    async fn fetches_with_the_token_and_maps_statuses() {
        let scratch = gpuwarden_test_support::scratch("token");
        let token = scratch.path().join("token");
        std::fs::write(&token, "s3cret\n").unwrap();
        let list =
            format!(r#"{{"items":[{{"metadata":{{"name":"a","namespace":"b","uid":"{UID}"}}}}]}}"#);
        let (url, server) = serve_once("200 OK", &list);
        let mut config = KubeletConfig::plain(&url);
        config.token_file = Some(token.clone());
        let pods = Client::new(&config).unwrap().pods().await.unwrap();
        assert_eq!(pods[UID].namespace, "b");
        let request = server.join().unwrap();
        assert!(request.starts_with("GET /pods HTTP/1.1"), "{request}");
        assert!(
            request.contains("authorization: Bearer s3cret\r\n"),
            "{request}"
        );

        for (status, label) in [
            ("401 Unauthorized", "unauthorized"),
            ("403 Forbidden", "forbidden"),
            ("500 Internal Server Error", "http_error"),
        ] {
            let (url, server) = serve_once(status, "{}");
            let err = Client::new(&KubeletConfig::plain(&url))
                .unwrap()
                .pods()
                .await
                .unwrap_err();
            assert_eq!(err.label(), label, "{status}: {err}");
            server.join().unwrap();
        }
        let (url, server) = serve_once("200 OK", "[1,2");
        let err = Client::new(&KubeletConfig::plain(&url))
            .unwrap()
            .pods()
            .await
            .unwrap_err();
        assert_eq!(err.label(), "malformed");
        server.join().unwrap();
    }

    #[tokio::test]
    async fn a_server_that_does_not_speak_tls_is_a_tls_error() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        });
        let mut config = KubeletConfig::plain(&format!("https://{addr}/pods"));
        config.insecure_skip_tls_verify = true;
        let err = Client::new(&config).unwrap().pods().await.unwrap_err();
        assert_eq!(err.label(), "tls", "{err}");
        server.join().unwrap();
    }

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
