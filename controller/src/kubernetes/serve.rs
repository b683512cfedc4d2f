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
//! HTTP/1.1 (what the API server and kube-scheduler speak to webhooks and extenders), bodies up
//! to [`MAX_BODY`], [`REQUEST_TIMEOUT`] per request. The serving certificate (a mounted Secret)
//! is re-read when its files change, as the gRPC port's is: a new connection after a rotation
//! gets the new certificate, a rotation that fails to load keeps the old one.

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::PathBuf,
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
use tokio::net::TcpListener;

use super::{
    admission,
    apiserver::ClaimTemplates,
    extender::{self, ExtenderArgs},
    pod::Bounds,
};
use crate::{
    api::Controller,
    auth::tls::{Stamp, TlsSetupError},
};

/// Largest request body read (an AdmissionReview of a large pod; ExtenderArgs with full Node
/// objects for a few hundred nodes — prefer `nodeCacheCapable: true`).
pub const MAX_BODY: usize = 16 << 20;
/// Longest one request may take, reading included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the handlers use: the controller's view of the cluster and the API server.
pub struct Hooks {
    /// The controller (nodes, sessions, profiles).
    pub controller: Arc<Controller>,
    /// Where claim templates are made.
    pub templates: Arc<dyn ClaimTemplates>,
}

/// Which paths a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routes {
    /// The webhook and the extender (HTTPS).
    All,
    /// The extender only (plain HTTP: no admission over an unauthenticated channel).
    Extender,
}

/// A serving certificate and key (PEM) that follow their files.
pub struct ServingCert {
    cert: PathBuf,
    key: PathBuf,
    loaded: Mutex<([Option<Stamp>; 2], Arc<ServerConfig>)>,
}

impl ServingCert {
    /// Loads `cert` and `key` now.
    ///
    /// # Errors
    /// A file can't be read, or the key doesn't fit the certificate.
    pub fn load(cert: PathBuf, key: PathBuf) -> Result<Self, TlsSetupError> {
        let stamps = [Stamp::of(&cert), Stamp::of(&key)];
        let config = Arc::new(build(&cert, &key)?);
        Ok(Self {
            cert,
            key,
            loaded: Mutex::new((stamps, config)),
        })
    }

    /// The configuration for a new connection: rebuilt first when a file changed, the last
    /// good one when that fails.
    pub fn current(&self) -> Arc<ServerConfig> {
        let now = [Stamp::of(&self.cert), Stamp::of(&self.key)];
        let mut loaded = self
            .loaded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if now != loaded.0 {
            match build(&self.cert, &self.key) {
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

fn build(cert: &std::path::Path, key: &std::path::Path) -> Result<ServerConfig, TlsSetupError> {
    let chain = gpuwarden_runtime::tls::read_certs(cert, "webhook certificate")?;
    let private = gpuwarden_runtime::tls::read_key(key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certificate = |source| TlsSetupError::Certificate {
        cert: cert.to_owned(),
        key: key.to_owned(),
        source,
    };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(certificate)?
        .with_no_client_auth()
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
    loop {
        let Some((tcp, peer)) = next_connection(&listener, shutdown.as_mut(), "webhook").await
        else {
            return;
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
        let hooks = Arc::clone(&hooks);
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => connection(TokioIo::new(stream), hooks, Routes::All, peer).await,
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
    loop {
        let Some((tcp, peer)) = next_connection(&listener, shutdown.as_mut(), "extender").await
        else {
            return;
        };
        let hooks = Arc::clone(&hooks);
        tokio::spawn(connection(TokioIo::new(tcp), hooks, Routes::Extender, peer));
    }
}

async fn connection<S>(io: TokioIo<S>, hooks: Arc<Hooks>, routes: Routes, peer: SocketAddr)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request| {
        let hooks = Arc::clone(&hooks);
        async move {
            let answer =
                tokio::time::timeout(REQUEST_TIMEOUT, handle(request, &hooks, routes)).await;
            Ok::<_, Infallible>(answer.unwrap_or_else(|_| {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "request timed out".to_owned(),
                )
            }))
        }
    });
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(REQUEST_TIMEOUT)
        .serve_connection(io, service)
        .await
    {
        tracing::debug!(%peer, "webhook/extender connection: {e}");
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
    hooks: &Hooks,
    routes: Routes,
) -> Response<Full<Bytes>> {
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
    let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body could not be read (at most {MAX_BODY} bytes): {e}"),
            );
        }
    };
    match path.as_str() {
        "/mutate" => {
            let bounds = hooks.controller.read(|s| Bounds {
                quantum: s.share_quantum(),
                largest_device_memory: s.largest_device_memory(),
            });
            match admission::review(&body, &bounds, hooks.templates.as_ref()).await {
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
