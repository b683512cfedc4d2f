//! The HTTP side: the webhook's HTTPS listener (the admission review, and the extender's verbs
//! for schedulers that speak TLS) and an optional plain-HTTP listener for the extender alone.
//!
//! | path | verb |
//! |---|---|
//! | `POST /mutate` | the admission webhook (HTTPS listener only) |
//! | `POST /extender/filter` | the extender's `filter` |
//! | `POST /extender/prioritize` | the extender's `prioritize` |
//! | `GET /healthz` | `ok` |
//!
//! HTTP/1.1 (what the API server and kube-scheduler speak to webhooks and extenders). Whoever
//! reaches the port can send anything, so every resource a request takes is bounded before it
//! is taken:
//!
//! - at most [`MAX_CONNECTIONS`] connections per listener (one more is closed at once);
//! - headers within [`HEADER_TIMEOUT`], the body within [`BODY_TIMEOUT`] of the headers, the
//!   whole answer within [`REQUEST_TIMEOUT`]: a slow sender is answered 408 and dropped;
//! - bodies up to [`MAX_BODY`] (3 MiB, the API server's own request limit, so any
//!   `AdmissionReview` fits); a larger `Content-Length` is refused before a byte is read;
//! - at most [`BODY_BUDGET`] bytes of bodies buffered at once over all connections, reserved
//!   from the `Content-Length` (or [`MAX_BODY`] when chunked) before reading; past it, 503;
//! - JSON parsed by `serde_json`, whose nesting limit (128) bounds the parser's stack.
//!
//! With a client CA (`--webhook-client-ca`) the HTTPS listener requires a client certificate
//! that chains to it: the API server's webhook client certificate (its admission
//! configuration's kubeconfig) and kube-scheduler's extender `tlsConfig.certFile`.
//!
//! The serving certificate (a mounted Secret) is re-read when its files change, as the gRPC
//! port's is: a new connection after a rotation gets the new certificate, a rotation that fails
//! to load keeps the old one.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    convert::Infallible,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls::ServerConfig;
use serde_json::{Value, json};
use tokio::{
    net::TcpListener,
    sync::{OwnedSemaphorePermit, Semaphore},
};

use super::{
    admission,
    apiserver::ClaimTemplates,
    extender::{self, ExtenderArgs},
    pod::Bounds,
};
use crate::{
    auth::{followed::Stamp, tls::TlsSetupError},
    hub::Hub,
    limits::{self, Refusal},
};

/// Largest request body read: the API server's own limit on a request (3 MiB), so any
/// `AdmissionReview` fits; `ExtenderArgs` with node names (`nodeCacheCapable: true`, as shipped)
/// are far smaller.
pub const MAX_BODY: usize = 3 << 20;
/// Bytes of request bodies buffered at once over all connections of a listener.
pub const BODY_BUDGET: usize = 8 * MAX_BODY;
/// Connections a listener holds at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Longest a client may take to send a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a client may take to send a request's body, after its headers.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest one request may take, reading included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the handlers use: the controller's view of the cluster and the API server.
pub struct Hooks {
    /// The controller (nodes, sessions, profiles).
    pub controller: Arc<Hub>,
    /// Where claim templates are made.
    pub templates: Arc<dyn ClaimTemplates>,
    /// The server's bounds: connections and bodies refused at a cap are counted there.
    pub bounds: Arc<limits::Bounds>,
    /// Leave `gpuwarden.io/gpu-milli` on the pods the webhook mutates, for kube-scheduler's
    /// extender `managedResources` (`ignoredByScheduler: true`) to call the extender for them
    /// only ([`admission::Marker`]).
    pub marker: admission::Marker,
}

/// What one listener's connections share: the connection cap and the body budget.
struct Shared {
    hooks: Arc<Hooks>,
    connections: Arc<Semaphore>,
    bodies: Arc<Semaphore>,
}

impl Shared {
    fn new(hooks: Arc<Hooks>) -> Arc<Self> {
        Arc::new(Self {
            hooks,
            connections: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            bodies: Arc::new(Semaphore::new(BODY_BUDGET)),
        })
    }

    /// A permit for one more connection, or `None` (counted) at the cap.
    fn connection(&self, peer: SocketAddr) -> Option<OwnedSemaphorePermit> {
        let permit = Arc::clone(&self.connections).try_acquire_owned().ok();
        if permit.is_none() {
            self.hooks.bounds.count(Refusal::Cap);
            tracing::debug!(%peer, "webhook/extender: connection refused at the cap ({MAX_CONNECTIONS})");
        }
        permit
    }
}

/// Which paths a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routes {
    /// The webhook and the extender (HTTPS).
    All,
    /// The extender only (plain HTTP: no admission over an unauthenticated channel).
    Extender,
}

/// A serving certificate and key (PEM) that follow their files, and optionally the CA client
/// certificates must chain to.
pub struct ServingCert {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
    loaded: Mutex<([Option<Stamp>; 3], Arc<ServerConfig>)>,
}

impl ServingCert {
    /// Loads `cert` and `key` now; clients need no certificate.
    ///
    /// # Errors
    /// A file can't be read, or the key doesn't fit the certificate.
    pub fn load(cert: PathBuf, key: PathBuf) -> Result<Self, TlsSetupError> {
        Self::load_with_client_ca(cert, key, None)
    }

    /// Loads `cert` and `key` now; with `client_ca`, every client must present a certificate
    /// that chains to it.
    ///
    /// # Errors
    /// A file can't be read, or the key doesn't fit the certificate.
    pub fn load_with_client_ca(
        cert: PathBuf,
        key: PathBuf,
        client_ca: Option<PathBuf>,
    ) -> Result<Self, TlsSetupError> {
        let stamps = stamps(&cert, &key, client_ca.as_deref());
        let config = Arc::new(build(&cert, &key, client_ca.as_deref())?);
        Ok(Self {
            cert,
            key,
            client_ca,
            loaded: Mutex::new((stamps, config)),
        })
    }

    /// The configuration for a new connection: rebuilt first when a file changed, the last
    /// good one when that fails.
    pub fn current(&self) -> Arc<ServerConfig> {
        let now = stamps(&self.cert, &self.key, self.client_ca.as_deref());
        let mut loaded = self.loaded.locked();
        if now != loaded.0 {
            match build(&self.cert, &self.key, self.client_ca.as_deref()) {
                Ok(config) => {
                    tracing::info!(cert = %self.cert.display(), "webhook certificate changed: reloaded");
                    *loaded = (now, Arc::new(config));
                }
                Err(e) => tracing::warn!(
                    "webhook certificate changed but can't be used, keeping the previous one: {e}"
                ),
            }
        }
        Arc::clone(&loaded.1)
    }
}

fn stamps(cert: &Path, key: &Path, client_ca: Option<&Path>) -> [Option<Stamp>; 3] {
    [
        Stamp::of(cert),
        Stamp::of(key),
        client_ca.and_then(Stamp::of),
    ]
}

fn build(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<ServerConfig, TlsSetupError> {
    let chain = gpuwarden_runtime::tls::read_certs(cert, "webhook certificate")?;
    let private = gpuwarden_runtime::tls::read_key(key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certificate = |source| TlsSetupError::Certificate {
        cert: cert.to_owned(),
        key: key.to_owned(),
        source,
    };
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(certificate)?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let client_ca = |reason: String| TlsSetupError::ClientCa {
                path: path.to_owned(),
                reason,
            };
            let mut roots = rustls::RootCertStore::empty();
            for ca in gpuwarden_runtime::tls::read_certs(path, "webhook client CA certificate")? {
                roots.add(ca).map_err(|e| client_ca(e.to_string()))?;
            }
            // Required, not optional: without a certificate the handshake fails.
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| client_ca(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, private)
        .map_err(certificate)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The next connection on `listener`, `None` once `shutdown` completes. A failed accept (out of
/// file descriptors, say) is logged and tried again after a pause rather than spun on.
async fn next_connection(
    listener: &TcpListener,
    mut shutdown: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    what: &str,
) -> Option<(tokio::net::TcpStream, std::net::SocketAddr)> {
    loop {
        tokio::select! {
            () = &mut shutdown => return None,
            accepted = listener.accept() => match accepted {
                Ok(pair) => return Some(pair),
                Err(e) => {
                    tracing::warn!("{what}: accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
}

/// Serves the webhook and the extender over HTTPS on `listener` until `shutdown`.
pub async fn serve_webhook(
    listener: TcpListener,
    tls: Arc<ServingCert>,
    hooks: Arc<Hooks>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let addr = listener.local_addr().ok();
    tracing::info!(?addr, "webhook and extender listening (HTTPS)");
    let shared = Shared::new(hooks);
    loop {
        let Some((tcp, peer)) = next_connection(&listener, shutdown.as_mut(), "webhook").await
        else {
            return;
        };
        let Some(permit) = shared.connection(peer) else {
            continue;
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => connection(TokioIo::new(stream), shared, Routes::All, peer).await,
                Ok(Err(e)) => tracing::debug!(%peer, "webhook: TLS handshake failed: {e}"),
                Err(_) => tracing::debug!(%peer, "webhook: TLS handshake timed out"),
            }
        });
    }
}

/// Serves the extender alone over plain HTTP on `listener` until `shutdown`.
pub async fn serve_extender(
    listener: TcpListener,
    hooks: Arc<Hooks>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let addr = listener.local_addr().ok();
    tracing::info!(?addr, "scheduler extender listening (plain HTTP)");
    let shared = Shared::new(hooks);
    loop {
        let Some((tcp, peer)) = next_connection(&listener, shutdown.as_mut(), "extender").await
        else {
            return;
        };
        let Some(permit) = shared.connection(peer) else {
            continue;
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _permit = permit;
            connection(TokioIo::new(tcp), shared, Routes::Extender, peer).await;
        });
    }
}

async fn connection<S>(io: TokioIo<S>, shared: Arc<Shared>, routes: Routes, peer: SocketAddr)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request| {
        let shared = Arc::clone(&shared);
        async move {
            let answer =
                tokio::time::timeout(REQUEST_TIMEOUT, handle(request, &shared, routes)).await;
            Ok::<_, Infallible>(answer.unwrap_or_else(|_| {
                closing(text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "request timed out".to_owned(),
                ))
            }))
        }
    });
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .serve_connection(io, service)
        .await
    {
        tracing::debug!(%peer, "webhook/extender connection: {e}");
    }
}

/// Largest buffer hyper keeps for a request's head (headers).
const MAX_HEADER_BYTES: usize = 64 << 10;

/// `response`, with the connection closed after it (a request whose body was not read whole
/// leaves the connection in an unknown state, and a slow sender is dropped).
fn closing(mut response: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    response.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
    response
}

/// Reads a body of at most [`MAX_BODY`] bytes within [`BODY_TIMEOUT`], with room for it
/// reserved from the listener's budget first; the error answer otherwise.
async fn read_body(
    request: Request<Incoming>,
    shared: &Shared,
) -> Result<(Bytes, OwnedSemaphorePermit), Response<Full<Bytes>>> {
    let declared = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(closing(text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {MAX_BODY} bytes"),
        )));
    }
    // What the body can take: its declared length, or the most it may be.
    let reserve = declared.map_or(MAX_BODY, |n| usize::try_from(n).unwrap_or(MAX_BODY));
    let Ok(permit) = Arc::clone(&shared.bodies)
        .try_acquire_many_owned(u32::try_from(reserve.max(1)).unwrap_or(u32::MAX))
    else {
        shared.hooks.bounds.count(Refusal::Cap);
        return Err(closing(text(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many request bodies are being read at once; retry".to_owned(),
        )));
    };
    let read = Limited::new(request.into_body(), reserve).collect();
    match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Ok(Ok(collected)) => Ok((collected.to_bytes(), permit)),
        Ok(Err(e)) => Err(closing(text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body could not be read (at most {reserve} bytes): {e}"),
        ))),
        Err(_) => Err(closing(text(
            StatusCode::REQUEST_TIMEOUT,
            format!("the body did not arrive within {BODY_TIMEOUT:?}"),
        ))),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

fn json_answer(value: &Value) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(
        serde_json::to_vec(value).unwrap_or_default(),
    )));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

async fn handle(
    request: Request<Incoming>,
    shared: &Shared,
    routes: Routes,
) -> Response<Full<Bytes>> {
    let hooks = &*shared.hooks;
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    if method == Method::GET && path == "/healthz" {
        return text(StatusCode::OK, "ok".to_owned());
    }
    let known = matches!(
        (routes, path.as_str()),
        (Routes::All, "/mutate") | (_, "/extender/filter" | "/extender/prioritize")
    );
    if !known {
        return text(StatusCode::NOT_FOUND, format!("no such path {path}"));
    }
    if method != Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, format!("{path} takes POST"));
    }
    // The permit is held until the body and what was parsed from it are dropped.
    let (body, _budget) = match read_body(request, shared).await {
        Ok(read) => read,
        Err(answer) => return answer,
    };
    match path.as_str() {
        "/mutate" => {
            // The GPUs offered to Kubernetes bound what a pod may ask (all GPUs, for agents
            // that report none apart).
            let bounds = hooks.controller.read(|s| {
                let memory = s.kubernetes_device_memory();
                Bounds {
                    quantum: s.share_quantum(),
                    largest_device_memory: memory.map(|(_, most)| most),
                    smallest_device_memory: memory.map(|(least, _)| least),
                }
            });
            match admission::review(&body, &bounds, hooks.templates.as_ref(), hooks.marker).await {
                Ok((answer, outcome)) => {
                    tracing::debug!(?outcome, "admission review");
                    json_answer(&answer)
                }
                Err(e) => text(StatusCode::BAD_REQUEST, e.to_string()),
            }
        }
        verb => {
            let args: ExtenderArgs = match serde_json::from_slice(&body) {
                Ok(args) => args,
                Err(e) => {
                    return text(
                        StatusCode::BAD_REQUEST,
                        format!("the body is no ExtenderArgs: {e}"),
                    );
                }
            };
            if verb == "/extender/filter" {
                let result = hooks.controller.read(|s| extender::filter(&args, s));
                json_answer(
                    &serde_json::to_value(result)
                        .unwrap_or_else(|e| json!({"Error": e.to_string()})),
                )
            } else {
                let result = hooks.controller.read(|s| extender::prioritize(&args, s));
                json_answer(&serde_json::to_value(result).unwrap_or(Value::Array(vec![])))
            }
        }
    }
}
