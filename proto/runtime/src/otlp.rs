//! The metrics pipeline the agent and the controller share: their OpenTelemetry instruments,
//! pushed over OTLP/gRPC to a collector and/or served to Prometheus ([`crate::prometheus`]).
//!
//! The SDK reads the standard variables (`OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SERVICE_NAME`, `OTEL_METRIC_EXPORT_INTERVAL`). Exports run
//! on the SDK's own thread with a timeout, so a collector that is away or slow never holds the
//! caller up; exports it did not take are counted in `gpuwarden.telemetry.exports.failed`.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use opentelemetry::{
    KeyValue,
    metrics::{Meter, MeterProvider as _},
};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::{
    Resource,
    error::OTelSdkResult,
    metrics::{
        PeriodicReader, SdkMeterProvider, Temporality, data::ResourceMetrics,
        exporter::PushMetricExporter,
    },
};

/// Metric exports the collector did not take: both daemons' pipelines have it while OTLP is on,
/// and both list it among their instruments.
pub const EXPORTS_FAILED: crate::instrument::Instrument = crate::instrument::Instrument {
    name: "gpuwarden.telemetry.exports.failed",
    unit: "{export}",
    attributes: "",
    meaning: "metric exports the collector did not take (dropped)",
};

/// Longest one export may take before it is given up (and counted as failed).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The endpoint from `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`.
#[must_use]
pub fn endpoint_from_env() -> Option<String> {
    std::env::var("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        .ok()
        .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok())
        .filter(|e| !e.is_empty())
}

/// The pipeline can't be started.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The OTLP exporter can't be built (e.g. a malformed endpoint).
    #[error("OTLP exporter for {endpoint}: {source}")]
    Otlp {
        /// The endpoint.
        endpoint: String,
        /// Why.
        #[source]
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// The Prometheus exporter can't be registered.
    #[error("Prometheus exporter: {0}")]
    Prometheus(#[source] opentelemetry_sdk::error::OTelSdkError),
    /// The Prometheus listener can't be opened.
    #[error(transparent)]
    Listen(#[from] crate::prometheus::ListenError),
}

/// Where the instruments go: an OTLP collector, a Prometheus scrape endpoint, both or neither.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exporters {
    /// OTLP/gRPC endpoint to push to; `None`: no pushes.
    pub otlp: Option<String>,
    /// Push interval; `None` leaves it to `OTEL_METRIC_EXPORT_INTERVAL` (default 60 s).
    pub interval: Option<Duration>,
    /// Address to serve Prometheus' text format on (`GET /metrics`); `None`: no endpoint.
    pub prometheus: Option<SocketAddr>,
}

impl Exporters {
    /// Whether any exporter is on.
    #[must_use]
    pub fn any(&self) -> bool {
        self.otlp.is_some() || self.prometheus.is_some()
    }
}

/// A running pipeline; dropping it stops the exports (after a last push) and the endpoint.
pub struct Pipeline {
    provider: SdkMeterProvider,
    meter: Meter,
    prometheus: Option<crate::prometheus::Endpoint>,
}

impl Pipeline {
    /// Starts the exporters `exporters` names as `service` (unless `OTEL_SERVICE_NAME` says
    /// otherwise), with `attributes` on the resource; `None` when it names none. The same
    /// instruments feed both: OTLP pushes them, Prometheus reads them at each scrape. Resource
    /// attributes named in `labels` also become labels of every Prometheus series (the rest
    /// are in `target_info`). Must run inside a tokio runtime (the gRPC channel and the
    /// listener live there).
    ///
    /// # Errors
    /// The OTLP exporter can't be built, or the Prometheus address can't be bound.
    pub fn start(
        exporters: &Exporters,
        service: &'static str,
        attributes: Vec<KeyValue>,
        labels: &[&'static str],
    ) -> Result<Option<Self>, PipelineError> {
        if !exporters.any() {
            return Ok(None);
        }
        let resource = Resource::builder()
            .with_service_name(
                std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| service.to_owned()),
            )
            .with_attributes(attributes)
            .build();
        let mut provider = SdkMeterProvider::builder().with_resource(resource);
        let failed = Arc::new(AtomicU64::new(0));
        if let Some(endpoint) = &exporters.otlp {
            let exporter = opentelemetry_otlp::MetricExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint.clone())
                .with_timeout(EXPORT_TIMEOUT)
                .build()
                .map_err(|source| PipelineError::Otlp {
                    endpoint: endpoint.clone(),
                    source,
                })?;
            let mut reader = PeriodicReader::builder(Counting {
                inner: exporter,
                failed: Arc::clone(&failed),
            });
            if let Some(interval) = exporters.interval {
                reader = reader.with_interval(interval);
            }
            provider = provider.with_reader(reader.build());
        }
        let mut endpoint = None;
        if let Some(addr) = exporters.prometheus {
            let registry = prometheus::Registry::new();
            let reader = opentelemetry_prometheus::exporter()
                .with_registry(registry.clone())
                // One scope per binary: the `otel_scope_name` label would only repeat it.
                .scope_info_enabled(false)
                .with_resource_selector(
                    labels
                        .iter()
                        .map(|k| opentelemetry::Key::from_static_str(k))
                        .collect::<std::collections::HashSet<_>>(),
                )
                .build()
                .map_err(PipelineError::Prometheus)?;
            provider = provider.with_reader(reader);
            endpoint = Some(crate::prometheus::Endpoint::serve(addr, registry)?);
        }
        let provider = provider.build();
        let meter = provider.meter(service);
        if exporters.otlp.is_some() {
            crate::instrument::Registry::new(&meter)
                .u64_counter(&EXPORTS_FAILED)
                .with_callback(move |o| o.observe(failed.load(Ordering::Relaxed), &[]))
                .build();
        }
        Ok(Some(Self {
            provider,
            meter,
            prometheus: endpoint,
        }))
    }

    /// The meter to register instruments on.
    #[must_use]
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// Where the Prometheus endpoint listens, if it is on.
    #[must_use]
    pub fn prometheus_addr(&self) -> Option<SocketAddr> {
        self.prometheus
            .as_ref()
            .map(crate::prometheus::Endpoint::addr)
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

/// Counts the exports that fail (the collector away or slow): their data is dropped, the next
/// export carries the cumulative totals again.
struct Counting<E> {
    inner: E,
    failed: Arc<AtomicU64>,
}

impl<E: PushMetricExporter> PushMetricExporter for Counting<E> {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let result = self.inner.export(metrics).await;
        if result.is_err() {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}
