//! The OTLP/gRPC metrics pipeline the agent and the controller share: the wire to an
//! OpenTelemetry collector.
//!
//! The SDK reads the standard variables (`OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_SERVICE_NAME`, `OTEL_METRIC_EXPORT_INTERVAL`). Exports run
//! on the SDK's own thread with a timeout, so a collector that is away or slow never holds the
//! caller up; exports it did not take are counted in `gpuwarden.telemetry.exports.failed`.

use std::{
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

/// The exporter can't be built (e.g. a malformed endpoint).
#[derive(Debug, thiserror::Error)]
#[error("OTLP exporter for {endpoint}: {source}")]
pub struct PipelineError {
    /// The endpoint.
    pub endpoint: String,
    /// Why.
    #[source]
    pub source: opentelemetry_otlp::ExporterBuildError,
}

/// A running pipeline; dropping it stops the exports (after a last one).
pub struct Pipeline {
    provider: SdkMeterProvider,
    meter: Meter,
}

impl Pipeline {
    /// Starts exporting to `endpoint` as `service` (unless `OTEL_SERVICE_NAME` says otherwise),
    /// with `attributes` on the resource, every `interval` (or `OTEL_METRIC_EXPORT_INTERVAL`).
    /// Must run inside a tokio runtime (the gRPC channel lives there).
    ///
    /// # Errors
    /// The exporter can't be built.
    pub fn start(
        endpoint: &str,
        service: &'static str,
        attributes: Vec<KeyValue>,
        interval: Option<Duration>,
    ) -> Result<Self, PipelineError> {
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint.to_owned())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|source| PipelineError {
                endpoint: endpoint.to_owned(),
                source,
            })?;
        let failed = Arc::new(AtomicU64::new(0));
        let mut reader = PeriodicReader::builder(Counting {
            inner: exporter,
            failed: Arc::clone(&failed),
        });
        if let Some(interval) = interval {
            reader = reader.with_interval(interval);
        }
        let resource = Resource::builder()
            .with_service_name(
                std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| service.to_owned()),
            )
            .with_attributes(attributes)
            .build();
        let provider = SdkMeterProvider::builder()
            .with_reader(reader.build())
            .with_resource(resource)
            .build();
        let meter = provider.meter(service);
        meter
            .u64_observable_counter("gpuwarden.telemetry.exports.failed")
            .with_unit("{export}")
            .with_description("Metric exports the collector did not take (dropped)")
            .with_callback(move |o| o.observe(failed.load(Ordering::Relaxed), &[]))
            .build();
        Ok(Self { provider, meter })
    }

    /// The meter to register instruments on.
    #[must_use]
    pub fn meter(&self) -> &Meter {
        &self.meter
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
