//! A small HTTP/1 client for the few API-server calls the DRA plugin makes: GET a
//! ResourceClaim, and GET/POST/PUT/DELETE the node's ResourceSlice. One connection per request
//! (a handful of requests per pod start), TLS with ring, the bearer token read at each request
//! so rotated service-account tokens are picked up.
//!
//! Why not the `kube` crate: these five calls need no watch, no informer and no generated types
//! beyond the fields read and written here, and the agent already speaks HTTP/1 with hyper and
//! rustls to the kubelet (`attribution::kubelet`); `kube` + `k8s-openapi` would add minutes of
//! build to every agent build on small CI machines.

use std::{path::PathBuf, sync::Arc, time::Duration};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio::io::{AsyncRead, AsyncWrite};

use super::config::ApiServerConfig;

/// Largest answer read (a ResourceClaim or ResourceSlice is a few KB).
const MAX_BODY: usize = 4 << 20;

/// One request's time limit, connect to last byte.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors talking to the API server.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The URL can't be used.
    #[error("invalid API server URL `{url}`: {reason}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The CA file can't be read or holds no certificate.
    #[error("cannot use the API server CA file {path}: {reason}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// An `https` URL without a CA file.
    #[error("no CA to verify the API server with: set [dra] api_ca_file")]
    NoCa,
    /// The TLS library refused the settings.
    #[error("TLS set-up: {0}")]
    TlsConfig(#[source] rustls::Error),
    /// The token file can't be read.
    #[error("cannot read the API token {path}: {source}")]
    Token {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No connection.
    #[error("cannot connect to the API server at {addr}: {source}")]
    Connect {
        /// `host:port`.
        addr: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake failed.
    #[error("TLS to the API server: {0}")]
    Tls(#[source] std::io::Error),
    /// HTTP failed.
    #[error("HTTP to the API server: {0}")]
    Http(#[source] hyper::Error),
    /// The request took too long.
    #[error("the API server did not answer within {0:?}")]
    Timeout(Duration),
    /// The body could not be read or built.
    #[error("API server body: {0}")]
    Body(String),
    /// A status other than the ones expected.
    #[error("{method} {path}: HTTP {status}: {message}")]
    Status {
        /// The method.
        method: String,
        /// The path.
        path: String,
        /// The status code.
        status: u16,
        /// The `Status` object's message, or the body's start.
        message: String,
    },
}

/// An answer: status and body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// The body.
    pub body: Bytes,
}

impl Answer {
    /// The body as JSON, when the status is 2xx; the `Status` message otherwise.
    ///
    /// # Errors
    /// [`ApiError::Status`] for a non-2xx status, [`ApiError::Body`] for a body that isn't the
    /// JSON expected.
    pub fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
    ) -> Result<T, ApiError> {
        if !(200..300).contains(&self.status) {
            return Err(self.error(method, path));
        }
        serde_json::from_slice(&self.body).map_err(|e| ApiError::Body(format!("{path}: {e}")))
    }

    /// The error a non-2xx answer stands for, with the API's own message.
    #[must_use]
    pub fn error(&self, method: &str, path: &str) -> ApiError {
        let message = serde_json::from_slice::<serde_json::Value>(&self.body)
            .ok()
            .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_owned))
            .unwrap_or_else(|| {
                String::from_utf8_lossy(&self.body)
                    .chars()
                    .take(200)
                    .collect()
            });
        ApiError::Status {
            method: method.to_owned(),
            path: path.to_owned(),
            status: self.status,
            message,
        }
    }
}

/// The API server client.
pub struct ApiServer {
    uri: http::Uri,
    host: String,
    port: u16,
    tls: Option<tokio_rustls::TlsConnector>,
    token_file: Option<PathBuf>,
}

impl ApiServer {
    /// A client for `config`.
    ///
    /// # Errors
    /// A bad URL or CA file.
    pub fn new(config: &ApiServerConfig) -> Result<Self, ApiError> {
        let bad = |reason: &str| ApiError::Url {
            url: config.url.clone(),
            reason: reason.to_owned(),
        };
        let uri: http::Uri = config.url.parse().map_err(|e| bad(&format!("{e}")))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(bad("the scheme must be https (or http, for tests)")),
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

    /// Sends `method path` with an optional JSON body, and returns the answer whatever its
    /// status.
    ///
    /// # Errors
    /// No answer: connection, TLS, HTTP, token file, time-out.
    pub async fn request(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Answer, ApiError> {
        tokio::time::timeout(REQUEST_TIMEOUT, self.send(method, path, body))
            .await
            .map_err(|_| ApiError::Timeout(REQUEST_TIMEOUT))?
    }

    async fn send(
        &self,
        method: http::Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<Answer, ApiError> {
        let authority = self
            .uri
            .authority()
            .map_or_else(|| self.host.clone(), |a| a.as_str().to_owned());
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, authority)
            .header(http::header::ACCEPT, "application/json");
        if let Some(path) = &self.token_file {
            let token = std::fs::read_to_string(path).map_err(|source| ApiError::Token {
                path: path.clone(),
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
                Bytes::from(serde_json::to_vec(json).map_err(|e| ApiError::Body(e.to_string()))?)
            }
            None => Bytes::new(),
        };
        let request = request
            .body(Full::new(bytes))
            .map_err(|e| ApiError::Body(e.to_string()))?;
        let addr = format!("{}:{}", self.host, self.port);
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|source| ApiError::Connect { addr, source })?;
        match &self.tls {
            Some(tls) => {
                let name = ServerName::try_from(self.host.clone()).map_err(|e| ApiError::Url {
                    url: self.uri.to_string(),
                    reason: e.to_string(),
                })?;
                let stream = tls.connect(name, tcp).await.map_err(ApiError::Tls)?;
                exchange(stream, request).await
            }
            None => exchange(tcp, request).await,
        }
    }
}

/// Sends `request` over `io` and reads the whole answer.
async fn exchange<S>(io: S, request: http::Request<Full<Bytes>>) -> Result<Answer, ApiError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(ApiError::Http)?;
    // The connection is driven by its own task; it ends with the exchange (one request).
    let driver = tokio::spawn(connection);
    let result = async {
        let response = sender.send_request(request).await.map_err(ApiError::Http)?;
        let status = response.status().as_u16();
        let body = Limited::new(response.into_body(), MAX_BODY)
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes)
            .map_err(|e| ApiError::Body(e.to_string()))?;
        Ok(Answer { status, body })
    }
    .await;
    driver.abort();
    result
}

/// TLS verified with the CA file's roots.
fn tls_connector(config: &ApiServerConfig) -> Result<tokio_rustls::TlsConnector, ApiError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(ApiError::TlsConfig)?;
    let path = config.ca_file.as_ref().ok_or(ApiError::NoCa)?;
    let ca_err = |reason: String| ApiError::CaFile {
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
    let tls = builder.with_root_certificates(roots).with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(tls)))
}
