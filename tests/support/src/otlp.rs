//! An OTLP/gRPC metrics receiver built on the official opentelemetry-proto definitions, and
//! helpers to read what it received.
#![expect(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "test helpers: a failed set-up step should fail the test where it happened"
)]

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use opentelemetry_proto::tonic::{
    collector::metrics::v1::{
        ExportMetricsServiceRequest, ExportMetricsServiceResponse,
        metrics_service_server::{MetricsService, MetricsServiceServer},
    },
    common::v1::{AnyValue, any_value},
    metrics::v1::{Metric, metric::Data, number_data_point},
};

/// What the receiver got: every request, in order.
type Received = Arc<Mutex<Vec<ExportMetricsServiceRequest>>>;

struct Receiver(Received);

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// An OTLP/gRPC metrics receiver on loopback, on its own runtime; stopped when dropped.
pub struct TestReceiver {
    /// Where it listens.
    pub addr: SocketAddr,
    received: Received,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestReceiver {
    /// Starts it on `addr` (`127.0.0.1:0` for any free port).
    #[must_use]
    pub fn start(addr: &str) -> Self {
        let received = Received::default();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = MetricsServiceServer::new(Receiver(Arc::clone(&received)));
        let addr = addr.to_owned();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind(&addr).await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::TcpListenerStream::new(listener),
                        async {
                            let _ = stopped.await;
                        },
                    )
                    .await
                    .unwrap();
            });
        });
        Self {
            addr: addr_rx.recv().unwrap(),
            received,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The latest export's metric `name`, if any export had it.
    #[must_use]
    pub fn latest(&self, name: &str) -> Option<Metric> {
        let received = self.received.lock().unwrap();
        received.iter().rev().find_map(|r| {
            r.resource_metrics
                .iter()
                .flat_map(|rm| &rm.scope_metrics)
                .flat_map(|sm| &sm.metrics)
                .find(|m| m.name == name)
                .cloned()
        })
    }

    /// Resource attributes of the latest export.
    #[must_use]
    pub fn resource(&self) -> Vec<(String, String)> {
        let received = self.received.lock().unwrap();
        received
            .last()
            .and_then(|r| r.resource_metrics.first())
            .and_then(|rm| rm.resource.as_ref())
            .map(|res| {
                res.attributes
                    .iter()
                    .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// How many export requests it got.
    #[must_use]
    pub fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }
}

impl Drop for TestReceiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An attribute value as text (empty when absent).
#[must_use]
pub fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// The data points of a gauge or sum: (attributes, value as f64).
#[must_use]
pub fn points(metric: &Metric) -> Vec<(Vec<(String, String)>, f64)> {
    let points = match &metric.data {
        Some(Data::Gauge(g)) => &g.data_points,
        Some(Data::Sum(s)) => &s.data_points,
        _ => return Vec::new(),
    };
    points
        .iter()
        .map(|p| {
            let attrs = p
                .attributes
                .iter()
                .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                .collect();
            let value = match p.value {
                Some(number_data_point::Value::AsInt(i)) => i as f64,
                Some(number_data_point::Value::AsDouble(d)) => d,
                None => f64::NAN,
            };
            (attrs, value)
        })
        .collect()
}

/// Whether `attrs` holds `key` = `value`.
#[must_use]
pub fn has(attrs: &[(String, String)], key: &str, value: &str) -> bool {
    attrs.iter().any(|(k, v)| k == key && v == value)
}
