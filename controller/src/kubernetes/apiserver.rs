//! The one thing the controller asks of the Kubernetes API server: that a ResourceClaimTemplate
//! exist in a namespace (`POST /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates`;
//! `201 Created`, or `409 AlreadyExists` when it is there already).
//!
//! [`ClaimTemplates`] is the seam: the webhook takes any implementation, tests a fake or a
//! loopback server. [`ApiServer`] is the real one: HTTP/1.1 over TLS (rustls, the cluster CA),
//! the service account's bearer token re-read on every call (projected tokens rotate), one
//! connection per call (a template is created once per namespace and size, so rarely).

use std::{
    future::Future,
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
    time::Duration,
};

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpStream;

/// Where a pod's service account files are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Longest an API call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer read.
const MAX_ANSWER: usize = 1 << 20;

/// What [`ClaimTemplates::ensure`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// It made the template.
    Created,
    /// The template was there already.
    Existed,
}

/// Why the API server could not be asked, or refused.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The settings can't be used (URL, CA, token file).
    #[error("API server settings: {0}")]
    Setup(String),
    /// Connecting, TLS or HTTP failed.
    #[error("API server {url}: {reason}")]
    Transport {
        /// The URL.
        url: String,
        /// What failed.
        reason: String,
    },
    /// New templates are being asked for faster than they are made (a flood of reviews).
    #[error("more than {per_sec} new claim templates a second are being asked for; retry")]
    Throttled {
        /// The sustained rate.
        per_sec: u32,
    },
    /// The API server answered with an error status.
    #[error("API server answered {status}: {message}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// Its `Status.message`, or the body.
        message: String,
    },
}

/// A boxed future, as the trait's methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Makes sure ResourceClaimTemplates exist.
pub trait ClaimTemplates: Send + Sync {
    /// Creates `template` (a whole `ResourceClaimTemplate` object) in `namespace` unless one of
    /// its name is there.
    fn ensure<'a>(
        &'a self,
        namespace: &'a str,
        template: &'a Value,
    ) -> BoxFuture<'a, Result<Ensured, ApiError>>;
}

/// The Kubernetes API server, reached over HTTPS with a bearer token.
#[derive(Clone)]
pub struct ApiServer {
    base: Uri,
    tls: Option<Arc<rustls::ClientConfig>>,
    token_file: Option<PathBuf>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("base", &self.base)
            .field("tls", &self.tls.is_some())
            .field("token_file", &self.token_file)
            .finish()
    }
}

impl ApiServer {
    /// The API server at `url` (`https://host:port`; `http://` only for tests on loopback),
    /// trusting `ca` (PEM) and sending the token in `token_file`, when given.
    ///
    /// # Errors
    /// The URL or the CA can't be used.
    pub fn new(
        url: &str,
        ca: Option<&Path>,
        token_file: Option<PathBuf>,
    ) -> Result<Self, ApiError> {
        let base: Uri = url
            .trim_end_matches('/')
            .parse()
            .map_err(|e| ApiError::Setup(format!("{url:?} is not a URL: {e}")))?;
        if base.host().is_none() {
            return Err(ApiError::Setup(format!("{url:?} names no host")));
        }
        let tls = match base.scheme_str() {
            Some("https") => {
                let mut roots = rustls::RootCertStore::empty();
                if let Some(ca) = ca {
                    let certs = gpuwarden_runtime::tls::read_certs(ca, "API server CA")
                        .map_err(|e| ApiError::Setup(e.to_string()))?;
                    for cert in certs {
                        roots
                            .add(cert)
                            .map_err(|e| ApiError::Setup(format!("{}: {e}", ca.display())))?;
                    }
                } else {
                    return Err(ApiError::Setup(
                        "an https API server needs a CA file".to_owned(),
                    ));
                }
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| ApiError::Setup(e.to_string()))?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                Some(Arc::new(config))
            }
            Some("http") => None,
            _ => return Err(ApiError::Setup(format!("{url:?}: expected https://"))),
        };
        Ok(Self {
            base,
            tls,
            token_file,
        })
    }

    /// The API server a pod reaches: `KUBERNETES_SERVICE_HOST`/`_PORT`, with the mounted
    /// service account's CA and token.
    ///
    /// # Errors
    /// Not in a pod (the variables are unset), or the CA can't be read.
    pub fn in_cluster() -> Result<Self, ApiError> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| {
            ApiError::Setup(
                "KUBERNETES_SERVICE_HOST is not set (not in a pod? give --kube-api)".to_owned(),
            )
        })?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".to_owned());
        // An IPv6 service address needs brackets in a URL.
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let dir = Path::new(SERVICE_ACCOUNT_DIR);
        Self::new(
            &format!("https://{host}:{port}"),
            Some(&dir.join("ca.crt")),
            Some(dir.join("token")),
        )
    }

    /// One request; the status and the JSON body.
    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Value), ApiError> {
        let url = format!("{}{path}", self.base);
        let transport = |reason: String| ApiError::Transport {
            url: url.clone(),
            reason,
        };
        let host = self
            .base
            .host()
            .unwrap_or_default()
            .trim_matches(['[', ']'])
            .to_owned();
        let port = self
            .base
            .port_u16()
            .unwrap_or(if self.tls.is_some() { 443 } else { 80 });
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(
                http::header::HOST,
                self.base.authority().map_or("", |a| a.as_str()),
            )
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::USER_AGENT, "gpuwarden-controller");
        if let Some(file) = &self.token_file {
            let token = std::fs::read_to_string(file)
                .map_err(|e| ApiError::Setup(format!("token file {}: {e}", file.display())))?;
            builder = builder.header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", token.trim()),
            );
        }
        let bytes = match body {
            Some(b) => {
                builder = builder.header(http::header::CONTENT_TYPE, "application/json");
                Bytes::from(serde_json::to_vec(b).map_err(|e| transport(e.to_string()))?)
            }
            None => Bytes::new(),
        };
        let request = builder
            .body(Full::new(bytes))
            .map_err(|e| transport(e.to_string()))?;
        let exchange = async {
            let tcp = TcpStream::connect((host.as_str(), port))
                .await
                .map_err(|e| transport(format!("connect: {e}")))?;
            match &self.tls {
                Some(config) => {
                    let name = rustls_pki_types::ServerName::try_from(host.clone())
                        .map_err(|e| transport(e.to_string()))?;
                    let stream = tokio_rustls::TlsConnector::from(Arc::clone(config))
                        .connect(name, tcp)
                        .await
                        .map_err(|e| transport(format!("TLS: {e}")))?;
                    exchange(stream, request).await.map_err(transport)
                }
                None => exchange(tcp, request).await.map_err(transport),
            }
        };
        let (status, body) = tokio::time::timeout(CALL_TIMEOUT, exchange)
            .await
            .map_err(|_| transport(format!("no answer within {CALL_TIMEOUT:?}")))??;
        let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if json.is_null() && !status.is_success() {
            let text = String::from_utf8_lossy(&body)
                .chars()
                .take(200)
                .collect::<String>();
            return Ok((status, Value::String(text)));
        }
        Ok((status, json))
    }
}

/// Sends `request` on `io` over HTTP/1.1 and reads the answer.
async fn exchange<S>(io: S, request: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("HTTP: {e}"))?;
    let driver = tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("HTTP: {e}"))?;
    let status = response.status();
    let body = Limited::new(response.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?
        .to_bytes();
    driver.abort();
    Ok((status, body))
}

/// The message of a `Status` answer, or the text.
fn message(body: &Value) -> String {
    body.get("message")
        .and_then(Value::as_str)
        .map_or_else(|| body.to_string(), str::to_owned)
}

impl ClaimTemplates for ApiServer {
    fn ensure<'a>(
        &'a self,
        namespace: &'a str,
        template: &'a Value,
    ) -> BoxFuture<'a, Result<Ensured, ApiError>> {
        Box::pin(async move {
            let path =
                format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates");
            let (status, body) = self.call("POST", &path, Some(template)).await?;
            match status {
                StatusCode::CREATED | StatusCode::OK => Ok(Ensured::Created),
                StatusCode::CONFLICT => Ok(Ensured::Existed),
                other => Err(ApiError::Status {
                    status: other.as_u16(),
                    message: message(&body),
                }),
            }
        })
    }
}
