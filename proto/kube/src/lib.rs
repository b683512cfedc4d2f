//! HTTPS to Kubernetes: the API server (the agent's DRA plugin, the controller's webhook) and the
//! kubelet (the agent's pod names), one client for all three.
//!
//! One request per connection (a few requests a minute, at most a few per pod start): no pool;
//! a watch ([`KubeClient::watch`]) holds its own connection for as long as the server streams.
//! HTTP/1.1 with hyper, TLS with rustls and ring, verified against a CA file (or, for
//! kubelets with self-signed certificates and only when asked, not verified). The bearer token
//! is read from its file at every request, so rotated service-account tokens are picked up.
//! Answers are read up to a bound and within a time limit.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::{
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};
use tokio::io::{AsyncRead, AsyncWrite};

/// Where a pod's service account files are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Where and how to reach one Kubernetes endpoint.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Who answers, for messages: "the kubelet", "the API server".
    pub peer: &'static str,
    /// `https://host:port[/path]` (`http://` where the caller allows it: tests on loopback).
    pub url: String,
    /// The CA that signs the peer's serving certificate (PEM).
    pub ca_file: Option<PathBuf>,
    /// Accept any serving certificate (the handshake's signatures are still checked).
    pub insecure_skip_tls_verify: bool,
    /// A file holding the bearer token, read at every request.
    pub token_file: Option<PathBuf>,
    /// What to tell the operator when an `https` URL comes without a CA.
    pub ca_hint: &'static str,
    /// One request's time limit, connect to last byte.
    pub timeout: Duration,
    /// Largest answer read.
    pub max_body: usize,
}

impl Endpoint {
    /// The API server a pod reaches: `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`
    /// with the mounted service account's CA and token; `None` outside a pod.
    #[must_use]
    pub fn in_cluster_api_server() -> Option<Self> {
        Self::in_cluster_api_server_from(|k| std::env::var(k).ok())
    }

    /// [`Self::in_cluster_api_server`] with the environment read through `env`.
    #[must_use]
    pub fn in_cluster_api_server_from(env: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let host = env("KUBERNETES_SERVICE_HOST")?;
        let port = env("KUBERNETES_SERVICE_PORT").unwrap_or_else(|| "443".to_owned());
        // An IPv6 service address needs brackets in a URL.
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let dir = Path::new(SERVICE_ACCOUNT_DIR);
        Some(Self::api_server(
            format!("https://{host}:{port}"),
            Some(dir.join("ca.crt")),
            Some(dir.join("token")),
        ))
    }

    /// The API server at `url`, with the usual bounds (10 s, 4 MiB answers).
    #[must_use]
    pub fn api_server(url: String, ca_file: Option<PathBuf>, token_file: Option<PathBuf>) -> Self {
        Self {
            peer: "the API server",
            url,
            ca_file,
            insecure_skip_tls_verify: false,
            token_file,
            ca_hint: "give the API server's CA file",
            timeout: Duration::from_secs(10),
            max_body: 4 << 20,
        }
    }
}

/// Why a request could not be made or answered.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The URL can't be used.
    #[error("invalid URL for {peer} `{url}`: {reason}")]
    Url {
        /// Who.
        peer: &'static str,
        /// The URL given.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The CA file can't be read or holds no certificate.
    #[error("cannot use the CA file {path} for {peer}: {reason}")]
    CaFile {
        /// Who.
        peer: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// An `https` URL without a CA (and without insecure-skip-verify).
    #[error("no CA to verify {peer} with: {hint}")]
    NoCa {
        /// Who.
        peer: &'static str,
        /// What to set.
        hint: &'static str,
    },
    /// The TLS library refused the settings.
    #[error("TLS set-up for {peer}: {source}")]
    TlsConfig {
        /// Who.
        peer: &'static str,
        /// Why.
        #[source]
        source: rustls::Error,
    },
    /// The token file can't be read.
    #[error("cannot read the token file {path}: {source}")]
    Token {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No TCP connection.
    #[error("cannot connect to {peer} at {addr}: {source}")]
    Connect {
        /// Who.
        peer: &'static str,
        /// `host:port`.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake failed (an untrusted certificate, usually).
    #[error("TLS handshake with {peer} failed: {source}")]
    Tls {
        /// Who.
        peer: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error("HTTP exchange with {peer} failed: {source}")]
    Http {
        /// Who.
        peer: &'static str,
        /// Why.
        #[source]
        source: hyper::Error,
    },
    /// The body could not be built or read (or was larger than allowed).
    #[error("the body of a request to {peer}: {reason}")]
    Body {
        /// Who.
        peer: &'static str,
        /// What failed.
        reason: String,
    },
    /// No answer in time.
    #[error("{peer} did not answer within {after:?}")]
    Timeout {
        /// Who.
        peer: &'static str,
        /// The limit.
        after: Duration,
    },
}

impl KubeError {
    /// A low-cardinality label for counting: `config`, `token`, `unreachable`, `tls`,
    /// `http_error`, `timeout`.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Url { .. } | Self::CaFile { .. } | Self::NoCa { .. } | Self::TlsConfig { .. } => {
                "config"
            }
            Self::Token { .. } => "token",
            Self::Connect { .. } => "unreachable",
            Self::Tls { .. } => "tls",
            Self::Http { .. } | Self::Body { .. } => "http_error",
            Self::Timeout { .. } => "timeout",
        }
    }
}

/// An answer, whatever its status.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The body.
    pub body: Bytes,
}

impl Answer {
    /// Whether the status is 2xx.
    #[must_use]
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// What an error answer says: its `Status` object's `message`, or the body's first 200
    /// characters.
    #[must_use]
    pub fn message(&self) -> String {
        serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
            .unwrap_or_else(|| {
                String::from_utf8_lossy(&self.body)
                    .chars()
                    .take(200)
                    .collect()
            })
    }
}

/// A client for one [`Endpoint`].
pub struct KubeClient {
    peer: &'static str,
    uri: http::Uri,
    host: String,
    port: u16,
    tls: Option<tokio_rustls::TlsConnector>,
    token_file: Option<PathBuf>,
    timeout: Duration,
    max_body: usize,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient")
            .field("peer", &self.peer)
            .field("uri", &self.uri)
            .field("tls", &self.tls.is_some())
            .field("token_file", &self.token_file)
            .finish_non_exhaustive()
    }
}

impl KubeClient {
    /// A client for `endpoint`.
    ///
    /// # Errors
    /// The URL, the CA file or the TLS settings can't be used.
    pub fn new(endpoint: &Endpoint) -> Result<Self, KubeError> {
        let peer = endpoint.peer;
        let bad = |reason: &str| KubeError::Url {
            peer,
            url: endpoint.url.clone(),
            reason: reason.to_owned(),
        };
        let uri: http::Uri = endpoint.url.parse().map_err(|e| bad(&format!("{e}")))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(bad("the scheme must be https (or http)")),
        };
        let host = uri
            .host()
            .ok_or_else(|| bad("no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = https.then(|| tls_connector(endpoint)).transpose()?;
        Ok(Self {
            peer,
            uri,
            host,
            port,
            tls,
            token_file: endpoint.token_file.clone(),
            timeout: endpoint.timeout,
            max_body: endpoint.max_body,
        })
    }

    /// Whether requests go over TLS.
    #[must_use]
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The path (and query) of the endpoint's URL: what to ask when the URL names the resource.
    #[must_use]
    pub fn url_path(&self) -> &str {
        self.uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str)
    }

    /// Sends `method path` with an optional JSON body; the answer whatever its status.
    ///
    /// # Errors
    /// No answer: the token file, connection, TLS, HTTP, the body's bound, the time limit.
    pub async fn request(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Answer, KubeError> {
        tokio::time::timeout(self.timeout, self.send(method, path, body))
            .await
            .map_err(|_| KubeError::Timeout {
                peer: self.peer,
                after: self.timeout,
            })?
    }

    /// Watches `path` (a `?watch=true` URL): each event the server streams (one JSON object a
    /// line) is sent to `events`, until the server ends the watch or `events` is closed. The
    /// connection and the answer's head come within the time limit; the stream has none. A
    /// status other than 200 is returned with its body, as [`Self::request`] would.
    ///
    /// # Errors
    /// No answer, a broken stream, a line past the body bound or not JSON.
    pub async fn watch(
        &self,
        path: &str,
        events: &tokio::sync::mpsc::Sender<serde_json::Value>,
    ) -> Result<Answer, KubeError> {
        let peer = self.peer;
        let (response, driver) =
            tokio::time::timeout(self.timeout, self.open(http::Method::GET, path, None))
                .await
                .map_err(|_| KubeError::Timeout {
                    peer,
                    after: self.timeout,
                })??;
        let result = self.stream_lines(response, events).await;
        driver.abort();
        result
    }

    /// The lines of a watch `response`, as JSON, into `events`.
    async fn stream_lines(
        &self,
        response: http::Response<hyper::body::Incoming>,
        events: &tokio::sync::mpsc::Sender<serde_json::Value>,
    ) -> Result<Answer, KubeError> {
        let peer = self.peer;
        let body_err = |reason: String| KubeError::Body { peer, reason };
        let status = response.status().as_u16();
        let mut body = response.into_body();
        if status != 200 {
            let body = Limited::new(body, self.max_body)
                .collect()
                .await
                .map_err(|e| body_err(e.to_string()))?
                .to_bytes();
            return Ok(Answer { status, body });
        }
        let mut line: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|source| KubeError::Http { peer, source })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            for chunk in data.split_inclusive(|b| *b == b'\n') {
                line.extend_from_slice(chunk);
                if line.len() > self.max_body {
                    return Err(body_err(format!(
                        "a watch event past {} bytes",
                        self.max_body
                    )));
                }
                if line.last() != Some(&b'\n') {
                    continue;
                }
                let text = std::mem::take(&mut line);
                if text.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let event = serde_json::from_slice(&text)
                    .map_err(|e| body_err(format!("a watch event: {e}")))?;
                if events.send(event).await.is_err() {
                    return Ok(Answer {
                        status,
                        body: Bytes::new(),
                    });
                }
            }
        }
        Ok(Answer {
            status,
            body: Bytes::new(),
        })
    }

    async fn send(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Answer, KubeError> {
        let peer = self.peer;
        let (response, driver) = self.open(method, path, body).await?;
        let status = response.status().as_u16();
        let read = Limited::new(response.into_body(), self.max_body)
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes)
            .map_err(|e| KubeError::Body {
                peer,
                reason: e.to_string(),
            });
        // The connection is driven by its own task; it ends with the exchange (one request).
        driver.abort();
        Ok(Answer {
            status,
            body: read?,
        })
    }

    /// Connects, sends `method path` and returns the answer's head with its body still to read,
    /// and the task driving the connection (to abort once the body is read).
    async fn open(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<
        (
            http::Response<hyper::body::Incoming>,
            tokio::task::JoinHandle<()>,
        ),
        KubeError,
    > {
        let peer = self.peer;
        let body_err = |reason: String| KubeError::Body { peer, reason };
        let authority = self
            .uri
            .authority()
            .map_or_else(|| self.host.clone(), |a| a.as_str().to_owned());
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, authority)
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::USER_AGENT, "gpuwarden");
        if let Some(file) = &self.token_file {
            let token = std::fs::read_to_string(file).map_err(|source| KubeError::Token {
                path: file.clone(),
                source,
            })?;
            request = request.header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", token.trim()),
            );
        }
        let bytes = match body {
            Some(json) => {
                request = request.header(http::header::CONTENT_TYPE, "application/json");
                Bytes::from(serde_json::to_vec(json).map_err(|e| body_err(e.to_string()))?)
            }
            None => Bytes::new(),
        };
        let request = request
            .body(Full::new(bytes))
            .map_err(|e| body_err(e.to_string()))?;
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|source| KubeError::Connect {
                peer,
                addr: format!("{}:{}", self.host, self.port),
                source,
            })?;
        match &self.tls {
            Some(tls) => {
                let name = ServerName::try_from(self.host.clone()).map_err(|e| KubeError::Url {
                    peer,
                    url: self.uri.to_string(),
                    reason: e.to_string(),
                })?;
                let stream = tls
                    .connect(name, tcp)
                    .await
                    .map_err(|source| KubeError::Tls { peer, source })?;
                self.exchange(stream, request).await
            }
            None => self.exchange(tcp, request).await,
        }
    }

    /// Sends `request` over `io`: the answer's head, and the task driving the connection.
    async fn exchange<S>(
        &self,
        io: S,
        request: http::Request<Full<Bytes>>,
    ) -> Result<
        (
            http::Response<hyper::body::Incoming>,
            tokio::task::JoinHandle<()>,
        ),
        KubeError,
    >
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let peer = self.peer;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|source| KubeError::Http { peer, source })?;
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        match sender.send_request(request).await {
            Ok(response) => Ok((response, driver)),
            Err(source) => {
                driver.abort();
                Err(KubeError::Http { peer, source })
            }
        }
    }
}

/// TLS verified with the CA file's roots, or not verified when asked.
fn tls_connector(endpoint: &Endpoint) -> Result<tokio_rustls::TlsConnector, KubeError> {
    let peer = endpoint.peer;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|source| KubeError::TlsConfig { peer, source })?;
    let tls = if endpoint.insecure_skip_tls_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
            .with_no_client_auth()
    } else {
        let path = endpoint.ca_file.as_ref().ok_or(KubeError::NoCa {
            peer,
            hint: endpoint.ca_hint,
        })?;
        let ca_err = |reason: String| KubeError::CaFile {
            peer,
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
    use super::*;

    fn endpoint(url: &str) -> Endpoint {
        Endpoint::api_server(url.to_owned(), None, None)
    }

    #[test]
    fn urls_without_a_scheme_host_or_ca_are_refused_naming_the_peer() {
        let c = KubeClient::new(&endpoint("http://[::1]:8080/pods")).expect("plain http");
        assert_eq!((c.host.as_str(), c.port, c.is_tls()), ("::1", 8080, false));
        assert_eq!(c.url_path(), "/pods");
        for bad in ["ftp://x/", "/just/a/path", "http://"] {
            let e = KubeClient::new(&endpoint(bad)).expect_err(bad);
            assert!(matches!(e, KubeError::Url { .. }), "{bad}: {e}");
            assert!(e.to_string().contains("the API server"), "{e}");
        }
        let e = KubeClient::new(&endpoint("https://10.0.0.5:6443")).expect_err("no CA");
        assert!(matches!(e, KubeError::NoCa { .. }), "{e}");
        let insecure = Endpoint {
            insecure_skip_tls_verify: true,
            ..endpoint("https://10.0.0.5:10250/pods")
        };
        assert!(KubeClient::new(&insecure).expect("insecure").is_tls());
        let dir = tempfile::tempdir().expect("a dir");
        let empty = dir.path().join("ca.crt");
        std::fs::write(&empty, "not a certificate").expect("written");
        let e = KubeClient::new(&Endpoint {
            ca_file: Some(empty),
            ..endpoint("https://10.0.0.5:6443")
        })
        .expect_err("no certificate");
        assert!(matches!(e, KubeError::CaFile { .. }), "{e}");
    }

    #[tokio::test]
    async fn a_closed_port_is_a_connect_error_and_a_status_message_is_read() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binds");
        let addr = listener.local_addr().expect("bound");
        drop(listener);
        let client = KubeClient::new(&endpoint(&format!("http://{addr}"))).expect("a client");
        let e = client
            .request(http::Method::GET, "/", None)
            .await
            .expect_err("nothing listens");
        assert!(matches!(e, KubeError::Connect { .. }), "{e}");
        let answer = Answer {
            status: 403,
            body: Bytes::from_static(br#"{"kind":"Status","message":"forbidden: no"}"#),
        };
        assert!(!answer.is_success());
        assert_eq!(answer.message(), "forbidden: no");
    }
}
