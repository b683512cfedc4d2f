//! The Prometheus scrape endpoint: the same OpenTelemetry instruments the OTLP pipeline pushes,
//! served in Prometheus' text format at `GET /metrics` on a plain HTTP listener.
//!
//! The conversion is `opentelemetry-prometheus` (the exporter that matches the SDK in the tree):
//! dots become underscores, the unit becomes a suffix (`By` → `_bytes`, `s` → `_seconds`, `1` →
//! `_ratio` on gauges), counters end in `_total`, and the resource's attributes are in
//! `target_info`. Each scrape reads the instruments afresh (their callbacks run then, off the
//! async threads); nothing is cached between scrapes. Off by default: a binary serves it only
//! when given an address (`--prometheus-listen` / `prometheus_listen`).
//!
//! The endpoint has no authentication, so [`check_exposure`] refuses an address beyond loopback
//! unless the operator says so ([`ALLOW_REMOTE_FLAG`]): what it serves names every container,
//! pod and session on the machine, and their usage.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
};
use hyper_util::rt::TokioIo;
use prometheus::{Encoder as _, TextEncoder};
use tokio::{net::TcpListener, task::JoinHandle};

/// How long a client may take to send its request line and headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections served at once; one past it is closed at accept. A scraper needs one: the cap
/// only keeps an unauthenticated peer from holding the process's fds and tasks.
const MAX_CONNECTIONS: usize = 32;

/// The listener can't be opened.
#[derive(Debug, thiserror::Error)]
#[error("Prometheus endpoint on {addr}: {source}")]
pub struct ListenError {
    /// The address asked for.
    pub addr: SocketAddr,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

/// The flag (and, with `-` as `_` and without the dashes, the config key) that lets the endpoint
/// serve beyond loopback.
pub const ALLOW_REMOTE_FLAG: &str = "--prometheus-insecure";

/// The endpoint would serve beyond loopback, and nobody allowed it.
#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to serve Prometheus metrics on {addr}: the endpoint has no authentication, and \
     anyone who reaches {addr} reads every workload's names and GPU usage; listen on a loopback \
     address (127.0.0.1), or pass {ALLOW_REMOTE_FLAG} (config key `prometheus_insecure = true`) \
     to serve it beyond loopback, behind a firewall or NetworkPolicy"
)]
pub struct ExposedError {
    /// The address asked for.
    pub addr: SocketAddr,
}

/// Refuses `addr` beyond loopback unless `allow_remote` (the operator passed
/// [`ALLOW_REMOTE_FLAG`] or an equivalent); a wildcard address counts as beyond loopback.
///
/// # Errors
/// [`ExposedError`] naming the address and the flag.
pub fn check_exposure(addr: SocketAddr, allow_remote: bool) -> Result<(), ExposedError> {
    if allow_remote || addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(ExposedError { addr })
    }
}

/// A running endpoint; dropping it stops serving.
pub struct Endpoint {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Endpoint {
    /// Binds `addr` and serves what `registry` gathers. Must run inside a tokio runtime.
    ///
    /// # Errors
    /// The address can't be bound.
    pub fn serve(addr: SocketAddr, registry: prometheus::Registry) -> Result<Self, ListenError> {
        let listener = std::net::TcpListener::bind(addr)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .and_then(TcpListener::from_std)
            .map_err(|source| ListenError { addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| ListenError { addr, source })?;
        let registry = Arc::new(Scrapes {
            registry,
            one_at_a_time: tokio::sync::Mutex::new(()),
        });
        let task = tokio::spawn(accept(listener, registry));
        Ok(Self { addr: bound, task })
    }

    /// The address it listens on (the port chosen, where `:0` was asked for).
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the endpoint serves, and the turn each scrape waits for: gathering runs every
/// instrument's callback on a blocking thread, so many scrapes at once would only queue there.
struct Scrapes {
    registry: prometheus::Registry,
    one_at_a_time: tokio::sync::Mutex<()>,
}

async fn accept(listener: TcpListener, registry: Arc<Scrapes>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of fds and the like: wait a little rather than spin.
                tracing::debug!("prometheus endpoint: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!(%peer, "prometheus endpoint: {MAX_CONNECTIONS} connections open; closed");
            drop(tcp);
            continue;
        };
        let registry = Arc::clone(&registry);
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |request| {
                let registry = Arc::clone(&registry);
                async move { Ok::<_, Infallible>(answer(&request, registry).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(tcp), service)
                .await
            {
                tracing::debug!(%peer, "prometheus endpoint connection: {e}");
            }
        });
    }
}

async fn answer(request: &Request<Incoming>, scrapes: Arc<Scrapes>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    if request.uri().path() != "/metrics" {
        return text(StatusCode::NOT_FOUND, "metrics are at /metrics\n".into());
    }
    // Gathering runs every instrument's callback, some of which take locks: off the async
    // threads.
    let _turn = scrapes.one_at_a_time.lock().await;
    let gather = Arc::clone(&scrapes);
    let encoded = tokio::task::spawn_blocking(move || encode(&gather.registry)).await;
    match encoded {
        Ok(Ok(body)) => {
            let mut response = Response::new(Full::new(Bytes::from(body)));
            if let Ok(v) = http::HeaderValue::from_str(TextEncoder::new().format_type()) {
                response.headers_mut().insert(http::header::CONTENT_TYPE, v);
            }
            response
        }
        Ok(Err(e)) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    }
}

/// The text exposition of everything `registry` holds now.
///
/// # Errors
/// A metric family the encoder refuses (a malformed name).
pub fn encode(registry: &prometheus::Registry) -> Result<Vec<u8>, prometheus::Error> {
    let mut body = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut body)?;
    Ok(body)
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {

    use opentelemetry::KeyValue;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::{ALLOW_REMOTE_FLAG, SocketAddr, check_exposure};
    use crate::otlp::{Exporters, Pipeline};

    /// `GET path` over plain HTTP/1.1, the whole answer (status line, headers, body).
    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn instruments_are_served_with_prometheus_names() {
        let exporters = Exporters {
            prometheus: Some("127.0.0.1:0".parse().unwrap()),
            ..Exporters::default()
        };
        let pipeline = Pipeline::start(
            &exporters,
            "test",
            vec![
                KeyValue::new("k8s.node.name", "n1"),
                KeyValue::new("host.name", "h1"),
            ],
            &["k8s.node.name"],
        )
        .unwrap()
        .unwrap();
        let meter = pipeline.meter();
        meter
            .u64_observable_counter("gpuwarden.things.done")
            .with_unit("{thing}")
            .with_callback(|o| o.observe(7, &[KeyValue::new("container.id", "abc")]))
            .build();
        meter
            .u64_observable_gauge("hw.gpu.memory.limit")
            .with_unit("By")
            .with_callback(|o| o.observe(1024, &[KeyValue::new("hw.id", "GPU-1")]))
            .build();
        meter
            .f64_observable_gauge("hw.gpu.utilization")
            .with_unit("1")
            .with_callback(|o| o.observe(0.25, &[]))
            .build();
        let addr = pipeline.prometheus_addr().unwrap();
        let answer = get(addr, "/metrics").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.contains("text/plain; version=0.0.4"), "{answer}");
        for line in [
            "# TYPE gpuwarden_things_done_total counter",
            "gpuwarden_things_done_total{container_id=\"abc\",k8s_node_name=\"n1\"} 7",
            "# TYPE hw_gpu_memory_limit_bytes gauge",
            "hw_gpu_memory_limit_bytes{hw_id=\"GPU-1\",k8s_node_name=\"n1\"} 1024",
            "hw_gpu_utilization_ratio{k8s_node_name=\"n1\"} 0.25",
        ] {
            assert!(
                answer.lines().any(|l| l == line),
                "no line {line:?} in\n{answer}"
            );
        }
        // The resource's other attributes are in target_info, not on every series.
        assert!(answer.contains("host_name=\"h1\""), "{answer}");
        assert!(!answer.contains("otel_scope_name"), "{answer}");
        assert!(get(addr, "/other").await.starts_with("HTTP/1.1 404"));
        // Dropping the pipeline closes the endpoint.
        drop(pipeline);
        tokio::task::yield_now().await;
        let refused = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                if tokio::net::TcpStream::connect(addr).await.is_err() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(refused.is_ok(), "the endpoint still accepts after the drop");
    }

    /// Connections past the cap are closed at once; the ones held don't stop a scrape once
    /// they go.
    #[tokio::test]
    async fn connections_past_the_cap_are_closed() {
        let exporters = Exporters {
            prometheus: Some("127.0.0.1:0".parse().unwrap()),
            ..Exporters::default()
        };
        let pipeline = Pipeline::start(&exporters, "test", vec![], &[])
            .unwrap()
            .unwrap();
        let addr = pipeline.prometheus_addr().unwrap();
        let mut held = Vec::new();
        for _ in 0..super::MAX_CONNECTIONS {
            held.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        // The server takes them in order: the next one is closed unanswered.
        let closed = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            let mut extra = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut buf = [0u8; 1];
            matches!(extra.read(&mut buf).await, Ok(0) | Err(_))
        })
        .await;
        assert_eq!(
            closed.ok(),
            Some(true),
            "a connection past the cap was kept open"
        );
        drop(held);
        let served = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            loop {
                // Until the server has seen the held ones go, a new one may still be closed.
                let mut answer = String::new();
                if let Ok(mut tcp) = tokio::net::TcpStream::connect(addr).await
                    && tcp
                        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                        .await
                        .is_ok()
                {
                    let _ = tcp.read_to_string(&mut answer).await;
                }
                if answer.starts_with("HTTP/1.1 200") {
                    return answer;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(
            served.is_ok(),
            "no scrape served once the held connections went"
        );
    }

    #[test]
    fn only_loopback_is_served_unless_allowed() {
        for addr in ["127.0.0.1:9464", "127.0.0.53:1", "[::1]:9464"] {
            let addr: SocketAddr = addr.parse().expect("an address");
            check_exposure(addr, false).expect("loopback is served");
        }
        for addr in ["0.0.0.0:9464", "10.1.2.3:9464", "[::]:9464"] {
            let addr: SocketAddr = addr.parse().expect("an address");
            let err = check_exposure(addr, false).expect_err("refused beyond loopback");
            let message = err.to_string();
            assert!(message.contains(&addr.to_string()), "{message}");
            assert!(message.contains(ALLOW_REMOTE_FLAG), "{message}");
            check_exposure(addr, true).expect("served when allowed");
        }
    }

    #[test]
    fn no_exporter_means_no_pipeline() {
        let pipeline = Pipeline::start(&Exporters::default(), "test", vec![], &[]).unwrap();
        assert!(pipeline.is_none());
    }

    #[tokio::test]
    async fn a_taken_address_is_an_error() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let exporters = Exporters {
            prometheus: Some(taken.local_addr().unwrap()),
            ..Exporters::default()
        };
        let err = Pipeline::start(&exporters, "test", vec![], &[])
            .err()
            .unwrap();
        assert!(err.to_string().contains("Prometheus endpoint"), "{err}");
    }
}
