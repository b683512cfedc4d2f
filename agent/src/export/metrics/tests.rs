use super::*;

use std::collections::BTreeMap;

use opentelemetry::metrics::{
    AsyncInstrumentBuilder, Callback, InstrumentProvider, ObservableCounter, ObservableGauge,
};

#[test]
fn gpu_names_give_their_index_and_an_instance_its_attributes() {
    let gpu = |index, mig: Option<crate::devices::mig::MigInstance>| GpuDevice {
        uuid: format!("GPU-{index}"),
        model: "M".into(),
        memory_bytes: 1,
        numa_node: 0,
        sm_count: 0,
        is_mig: mig.is_some(),
        index,
        device_node: "/dev/nvidia1".into(),
        mig,
    };
    let instance = gpu(
        15,
        Some(crate::devices::mig::MigInstance {
            parent_index: 1,
            parent_uuid: "GPU-parent".into(),
            gpu_instance: 9,
            compute_instance: 0,
            profile: "1g.18gb".into(),
            gi_cap_minor: None,
            ci_cap_minor: None,
        }),
    );
    let gpus = [Gpu::new(gpu(3, None), None), Gpu::new(instance, None)];
    assert_eq!(gpu_index(&gpus, "nvidia3"), Some(3));
    assert_eq!(gpu_index(&gpus, "nvidia1/gi9"), Some(15));
    assert_eq!(gpu_index(&gpus, "nvidia15"), None);
    assert_eq!(gpu_index(&gpus, "nvidiactl"), None);
    assert_eq!(gpu_index(&gpus, "nvidia-uvm"), None);
    // A node the device list lacks (no NVML, no mock list) still counts by its number.
    assert_eq!(gpu_index(&gpus, "nvidia40"), Some(40));
    let attrs = &gpus[1].attributes;
    let value = |key: &str| {
        attrs
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    };
    assert_eq!(
        value("gpuwarden.gpu.mig.profile").as_deref(),
        Some("1g.18gb")
    );
    assert_eq!(value("hw.parent").as_deref(), Some("GPU-parent"));
    assert_eq!(Gpu::new(gpu(3, None), None).attributes.len(), 5);
}

#[test]
fn the_docs_list_every_instrument() {
    let docs = include_str!("../../../../docs/metrics.md");
    let problems = gpuwarden_runtime::instrument::undocumented(
        docs,
        "## Agent metrics",
        "## ",
        instruments::ALL,
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// What `register` builds is the table, each once: a metric built but not declared (and so not
/// documented) fails here.
#[test]
fn every_instrument_is_registered_once_and_only_those() {
    let meter = opentelemetry::global::meter("test");
    let mut registry = Registry::new(&meter);
    register(&mut registry, Vec::new(), &Published::default());
    let mut registered = registry.registered().to_vec();
    // The pipeline builds this one.
    registered.push(gpuwarden_runtime::otlp::EXPORTS_FAILED.name);
    let problems = gpuwarden_runtime::instrument::unregistered(&registered, instruments::ALL);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn no_endpoint_means_off() {
    let config = MetricsConfig {
        endpoint: None,
        ..MetricsConfig::default()
    };
    let published: Published = Arc::default();
    assert!(start(&config, vec![], &published).unwrap().is_none());
}

/// Every observable instrument `register` builds on it, with its callbacks, so a test can
/// observe them on a snapshot of its own (no SDK, no exporter).
#[derive(Default)]
struct Recorder {
    u64s: Mutex<Vec<(String, Vec<Callback<u64>>)>>,
    f64s: Mutex<Vec<(String, Vec<Callback<f64>>)>>,
}

impl InstrumentProvider for Recorder {
    fn u64_observable_counter(
        &self,
        b: AsyncInstrumentBuilder<'_, ObservableCounter<u64>, u64>,
    ) -> ObservableCounter<u64> {
        self.u64s.locked().push((b.name.to_string(), b.callbacks));
        ObservableCounter::new()
    }

    fn f64_observable_counter(
        &self,
        b: AsyncInstrumentBuilder<'_, ObservableCounter<f64>, f64>,
    ) -> ObservableCounter<f64> {
        self.f64s.locked().push((b.name.to_string(), b.callbacks));
        ObservableCounter::new()
    }

    fn u64_observable_gauge(
        &self,
        b: AsyncInstrumentBuilder<'_, ObservableGauge<u64>, u64>,
    ) -> ObservableGauge<u64> {
        self.u64s.locked().push((b.name.to_string(), b.callbacks));
        ObservableGauge::new()
    }

    fn f64_observable_gauge(
        &self,
        b: AsyncInstrumentBuilder<'_, ObservableGauge<f64>, f64>,
    ) -> ObservableGauge<f64> {
        self.f64s.locked().push((b.name.to_string(), b.callbacks));
        ObservableGauge::new()
    }
}

/// What one instrument observed: each point's attributes (as text) and value.
type Points = Vec<(BTreeMap<String, String>, f64)>;

/// Collects what a callback observes.
#[derive(Default)]
struct Seen(Mutex<Points>);

impl Seen {
    fn push(&self, value: f64, attributes: &[KeyValue]) {
        let attrs = attributes
            .iter()
            .map(|kv| (kv.key.to_string(), kv.value.to_string()))
            .collect();
        self.0.locked().push((attrs, value));
    }
}

impl AsyncInstrument<u64> for Seen {
    fn observe(&self, value: u64, attributes: &[KeyValue]) {
        // The test's figures are small: exact as f64.
        self.push(value as f64, attributes);
    }
}

impl AsyncInstrument<f64> for Seen {
    fn observe(&self, value: f64, attributes: &[KeyValue]) {
        self.push(value, attributes);
    }
}

/// Every point each instrument `register` builds observes on `snapshot`, by instrument name.
fn observed(gpus: Vec<Gpu>, snapshot: Snapshot) -> BTreeMap<String, Points> {
    let recorder = Arc::new(Recorder::default());
    // The API's own hook for an SDK: the recorder stands in for one.
    let meter = opentelemetry::metrics::Meter::new(Arc::clone(&recorder) as _);
    let published: Published = Arc::new(Mutex::new(Some(snapshot)));
    register(&mut Registry::new(&meter), gpus, &published);
    let mut out = BTreeMap::new();
    for (name, callbacks) in recorder.u64s.locked().iter() {
        let seen = Seen::default();
        for c in callbacks {
            c(&seen);
        }
        out.insert(name.clone(), seen.0.into_inner().unwrap());
    }
    for (name, callbacks) in recorder.f64s.locked().iter() {
        let seen = Seen::default();
        for c in callbacks {
            c(&seen);
        }
        out.insert(name.clone(), seen.0.into_inner().unwrap());
    }
    out
}

/// The one point of `name` whose attributes include `with`.
fn point(all: &BTreeMap<String, Points>, name: &str, with: &[(&str, &str)]) -> f64 {
    let points: Vec<f64> = all[name]
        .iter()
        .filter(|(attrs, _)| {
            with.iter()
                .all(|(k, v)| attrs.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(points.len(), 1, "{name} {with:?}: {:?}", all[name]);
    points[0]
}

/// Asserts `got` is `want` (both exact here but for the last bits of a division).
fn near(got: f64, want: f64) {
    assert!((got - want).abs() < 1e-12, "{got} is not {want}");
}

/// The figures no end-to-end test reads back (enforcement counts, the slot ledger, the signal,
/// the kernel tables, the kubelet): each series carries the snapshot's figure, in the unit
/// docs/metrics.md gives it (seconds where the snapshot keeps ms or µs).
#[test]
fn the_figures_no_end_to_end_test_reads_come_from_the_snapshot() {
    let snapshot: Snapshot = serde_json::from_value(serde_json::json!({
        "node": "n",
        "tier": "tracepoint",
        "hooks": [],
        "probes": [],
        "memory_tier": null,
        "containers": [{
            "container_id": "c1",
            "runtime": "docker",
            "pod_uid": null,
            "qos": null,
            "cgroup_path": "/a",
            "cgroup_id": 7,
            "pids": [],
            "devices": [],
            "session_id": "s1",
            "enforcement": {
                "tier": "tracepoint",
                "actions": 3,
                "denied_opens": 2,
                "throttled_ms": 1500,
                "frozen": false,
                "gpu_time_ms": 250,
                "ledger_ms": -500
            },
            "tables": [
                {"table": "fds", "used": 1, "budget": 4, "refused": 9},
                {"table": "clients", "used": 1, "budget": 4, "refused": 0}
            ]
        }],
        "stats": {
            "ringbuf_drops": 11, "fd_table_full": 0, "handle_table_full": 0,
            "proc_table_full": 0, "decode_errors": 0, "gpu_ioctls": 0, "events_received": 0,
            "tracked_fds": 5, "tracked_processes": 6, "tracked_allocations": 8,
            "controller_connected": true
        },
        "kubelet": null,
        "throttle_signals": [{
            "device": "nvidia0", "period_us": 20000, "jitter_us": null, "samples": 1,
            "late_samples": 4, "gaps": 0, "unattributed_ms": 1250
        }]
    }))
    .unwrap();
    let all = observed(Vec::new(), snapshot);
    let c = [("container.id", "c1"), ("gpuwarden.session.id", "s1")];
    near(
        point(&all, "gpuwarden.container.enforcement.actions", &c),
        3.0,
    );
    near(
        point(&all, "gpuwarden.container.enforcement.denied_opens", &c),
        2.0,
    );
    near(point(&all, "gpuwarden.container.throttled", &c), 1.5);
    near(point(&all, "gpuwarden.container.gpu.time", &c), 0.25);
    near(point(&all, "gpuwarden.container.gpu.ledger", &c), -0.5);
    // Only a table that refused something has a series.
    let refused = "gpuwarden.container.table.refused";
    near(point(&all, refused, &[("gpuwarden.map", "fds")]), 9.0);
    assert_eq!(all[refused].len(), 1);
    let device = [("gpuwarden.device", "nvidia0")];
    near(point(&all, "gpuwarden.gpu.signal.period", &device), 0.02);
    assert!(
        all["gpuwarden.gpu.signal.jitter"].is_empty(),
        "unknown: left out"
    );
    near(
        point(&all, "gpuwarden.gpu.signal.late_samples", &device),
        4.0,
    );
    near(
        point(&all, "gpuwarden.gpu.signal.unattributed", &device),
        1.25,
    );
    near(point(&all, "gpuwarden.agent.ringbuf.drops", &[]), 11.0);
    near(
        point(&all, "gpuwarden.agent.controller.connected", &[]),
        1.0,
    );
    for (map, n) in [("fds", 5.0), ("processes", 6.0), ("allocations", 8.0)] {
        let entries = point(
            &all,
            "gpuwarden.agent.map.entries",
            &[("gpuwarden.map", map)],
        );
        near(entries, n);
    }
    let tiers = [
        ("gpuwarden.tier", "tracepoint"),
        ("gpuwarden.memory_tier", "none"),
    ];
    near(point(&all, "gpuwarden.agent.hook.tier", &tiers), 1.0);
    assert!(all["gpuwarden.agent.kubelet.requests"].is_empty());
}

#[test]
fn the_drivers_memory_count_and_what_the_kernel_side_did_not_see_are_per_gpu() {
    let whole = GpuDevice {
        uuid: "GPU-0".into(),
        model: "M".into(),
        memory_bytes: 1,
        numa_node: 0,
        sm_count: 0,
        is_mig: false,
        index: 0,
        device_node: "/dev/nvidia0".into(),
        mig: None,
    };
    // Instances 5 and 6 of GPU 1 (`nvidia1/gi9`, `nvidia1/gi10`).
    let gpus = vec![
        Gpu::new(whole, None),
        Gpu::new(crate::devices::mig::test_instance(5, 9, 0, "1g.18gb"), None),
        Gpu::new(
            crate::devices::mig::test_instance(6, 10, 0, "1g.18gb"),
            None,
        ),
    ];
    let snapshot: Snapshot = serde_json::from_value(serde_json::json!({
        "node": "n", "tier": null, "hooks": [], "probes": [], "containers": [],
        "stats": {
            "ringbuf_drops": 0, "fd_table_full": 0, "handle_table_full": 0,
            "proc_table_full": 0, "decode_errors": 0, "gpu_ioctls": 0, "events_received": 0,
            "tracked_fds": 0, "tracked_processes": 0, "tracked_allocations": 0
        },
        "gpus": [
            {"device": "nvidia0", "utilization": null, "source": "nvml",
             "memory_bytes": 1000, "driver_memory_bytes": 1600, "driver_reserved_bytes": 500},
            {"device": "nvidia1/gi9", "utilization": null, "source": "nvml",
             "memory_bytes": 900, "driver_memory_bytes": 700},
            {"device": "nvidia1/gi10", "utilization": null, "source": "nvml",
             "memory_bytes": 300}
        ]
    }))
    .unwrap();
    let all = observed(gpus, snapshot);
    let driver = "gpuwarden.gpu.memory.driver_usage";
    let unseen = "gpuwarden.gpu.memory.unseen";
    near(point(&all, driver, &[("hw.id", "GPU-0")]), 1600.0);
    near(point(&all, unseen, &[("hw.id", "GPU-0")]), 600.0);
    // The instance, with its attributes: the agent counts more than the driver does.
    let instance = [("hw.id", "MIG-5"), ("hw.parent", "GPU-p")];
    near(point(&all, driver, &instance), 700.0);
    near(point(&all, unseen, &instance), -200.0);
    // Not read by the driver: no series.
    assert_eq!(all[driver].len(), 2, "{:?}", all[driver]);
    assert_eq!(all[unseen].len(), 2, "{:?}", all[unseen]);
}
