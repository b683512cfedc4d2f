//! What a pod asks of gpuwarden: the `gpuwarden.io/gpu-milli` (or the older
//! `gpuwarden.io/gpu-shares`) and `gpuwarden.io/gpu-memory` limits of its containers (or, once
//! the webhook turned them into a claim, the annotations it left), checked; the
//! `ResourceClaimTemplate` that asks the same through DRA, naming both capacities in the whole
//! units the slice publishes; and the workload class its profile is filed under.
//!
//! Why whole numbers: the API server requires an extended resource (any `domain/name` outside
//! `kubernetes.io`) to be an integer, with its request equal to its limit
//! (`pkg/apis/core/validation/validation.go`, `ValidateResourceQuantityValue` and
//! `ValidateResourceRequirements`), and checks a workload's pod template (Deployment, Job,
//! `StatefulSet`) when the workload is created, before any pod webhook runs. `gpu-milli: 500` passes there;
//! `gpu-shares: "0.5"` passes only in a bare Pod, whose limits the webhook removes before
//! validation.
//!
//! Pods are read as the API server sends them (JSON, `k8s.io/api/core/v1` field names), through
//! `serde_json::Value`: only the few fields used here are looked at, so a pod with fields this
//! code doesn't know still reads.

use std::fmt;

use gpuwarden_types::quantity::{Quantity, QuantityError};
use serde_json::{Value, json};

use crate::{allocator::GpuRequest, slots::SlotValue};

/// The container limit that asks for thousandths of one GPU (`500`): a whole number, so any
/// workload's pod template passes the API server's validation.
pub const MILLI_RESOURCE: &str = "gpuwarden.io/gpu-milli";
/// The older container limit that asks for a fraction of one GPU (`"0.5"`, `500m`): read in a
/// bare Pod (the webhook removes it before validation), refused by the API server in a
/// workload's pod template unless it is whole.
pub const SHARES_RESOURCE: &str = "gpuwarden.io/gpu-shares";
/// The container limit that asks for GPU memory (`8Gi`; a whole number of bytes).
pub const MEMORY_RESOURCE: &str = "gpuwarden.io/gpu-memory";
/// Thousandths of compute in one GPU: the unit of [`MILLI_RESOURCE`] and of the slice's
/// `milli` capacity.
pub const MILLI_PER_GPU: u64 = 1000;
/// Bytes in a MiB: the unit of the slice's `memory` capacity.
pub const MIB: u64 = 1 << 20;
pub use gpuwarden_types::workload::{CLASS_LABEL, workload_class};
/// The name of the claim the webhook adds to a pod (`spec.resourceClaims[].name`).
pub const CLAIM_NAME: &str = "gpuwarden-gpu";
/// The DRA driver and DeviceClass name.
pub const DEVICE_CLASS: &str = "gpu.gpuwarden.io";
/// The device request's name in the template.
pub const REQUEST_NAME: &str = "gpu";
/// The label on templates the webhook creates.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "gpuwarden");

/// The two container lists whose limits are read, with their JSON field names.
pub const CONTAINER_LISTS: [&str; 2] = ["initContainers", "containers"];

/// What a pod asks for: a share of one GPU, GPU memory, or both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuAsk {
    /// Shares of one device (0 < shares ≤ 1).
    pub shares: Option<SlotValue>,
    /// Bytes of GPU memory.
    pub memory_bytes: Option<u64>,
}

/// A container that carries the limits: its list (`containers`, `initContainers`), index and
/// name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carrier {
    /// `containers` or `initContainers`.
    pub list: &'static str,
    /// Index in that list.
    pub index: usize,
    /// Its name.
    pub name: String,
    /// The resource names to remove, and from which map (`limits`, `requests`).
    pub found: Found,
}

/// Where a container's limits were found: (`limits` or `requests`, resource name).
pub type Found = Vec<(&'static str, &'static str)>;

/// A pod's ask and the containers carrying it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodAsk {
    /// What is asked (every carrier asks the same).
    pub ask: GpuAsk,
    /// The containers carrying the limits.
    pub carriers: Vec<Carrier>,
}

/// Why a pod's ask is refused; the message is what the user reads in the admission response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    /// A value that is no quantity.
    #[error("container {container:?}: {resource}: {reason}")]
    Malformed {
        /// The container.
        container: String,
        /// The resource name.
        resource: &'static str,
        /// Why.
        reason: String,
    },
    /// Zero or negative.
    #[error("container {container:?}: {resource} must be above 0, got {value}")]
    NotPositive {
        /// The container.
        container: String,
        /// The resource name.
        resource: &'static str,
        /// The value as read.
        value: String,
    },
    /// More than one device holds.
    #[error(
        "container {container:?}: {resource} = {value} is more than one GPU; a claim gets a share of one device (at most {MILLI_RESOURCE}: 1000), ask for whole GPUs through a ResourceClaim of your own"
    )]
    ShareAboveOne {
        /// The container.
        container: String,
        /// The resource name.
        resource: &'static str,
        /// The value as read.
        value: String,
    },
    /// Not a whole number of quanta.
    #[error(
        "container {container:?}: a share of {value} GPU is not a multiple of the share quantum {quantum}"
    )]
    NotQuantum {
        /// The container.
        container: String,
        /// The value.
        value: SlotValue,
        /// The quantum.
        quantum: SlotValue,
    },
    /// A fraction of a byte.
    #[error("container {container:?}: {MEMORY_RESOURCE} = {value} is not a whole number of bytes")]
    FractionalBytes {
        /// The container.
        container: String,
        /// The value.
        value: String,
    },
    /// More memory than any device has.
    #[error(
        "container {container:?}: {MEMORY_RESOURCE} = {requested} bytes is more than any GPU has (the largest: {largest} bytes)"
    )]
    MemoryAboveDevices {
        /// The container.
        container: String,
        /// Asked.
        requested: u64,
        /// The largest device's memory.
        largest: u64,
    },
    /// Two containers ask differently (they share one claim, so they must ask the same).
    #[error(
        "containers {first:?} ({first_ask}) and {second:?} ({second_ask}) ask for different GPU parts; the pod's containers share one claim, so give them the same {SHARES_RESOURCE} and {MEMORY_RESOURCE}"
    )]
    Mismatch {
        /// One container.
        first: String,
        /// What it asks.
        first_ask: String,
        /// Another.
        second: String,
        /// What it asks.
        second_ask: String,
    },
    /// The limit and the request of one container differ.
    #[error(
        "container {container:?}: {resource} has limit {limit} and request {request}; give the same value (or only the limit)"
    )]
    LimitRequestDiffer {
        /// The container.
        container: String,
        /// The resource name.
        resource: &'static str,
        /// The limit.
        limit: String,
        /// The request.
        request: String,
    },
    /// The pod already has a claim of the name the webhook uses.
    #[error("the pod already has a resource claim named {CLAIM_NAME:?}")]
    ClaimNameTaken,
    /// `gpu-milli` that is not a whole number of thousandths.
    #[error(
        "container {container:?}: {MILLI_RESOURCE} = {value} is not a whole number of thousandths of a GPU (e.g. 500 for half)"
    )]
    MilliNotWhole {
        /// The container.
        container: String,
        /// The value as read.
        value: String,
    },
    /// Both `gpu-milli` and `gpu-shares` in one container.
    #[error(
        "container {container:?}: give {MILLI_RESOURCE} or {SHARES_RESOURCE}, not both ({MILLI_RESOURCE} is the one every workload kind accepts)"
    )]
    BothShareNames {
        /// The container.
        container: String,
    },
    /// A share finer than the slice's thousandths.
    #[error(
        "container {container:?}: {SHARES_RESOURCE} = {value} is finer than a thousandth of a GPU; write {MILLI_RESOURCE} with a whole number instead"
    )]
    FinerThanMilli {
        /// The container.
        container: String,
        /// The value.
        value: SlotValue,
    },
    /// A fraction in a workload's pod template, which the API server refuses there.
    #[error(
        "container {container:?} of this {kind}'s pod template: {resource} = {value} is not a whole number, and Kubernetes requires extended resources in a workload's pod template to be whole numbers (gpuwarden's webhook rewrites a fraction only in a bare Pod); {instead}"
    )]
    FractionInWorkload {
        /// The workload's kind.
        kind: String,
        /// The container.
        container: String,
        /// The resource name.
        resource: &'static str,
        /// The value as read.
        value: String,
        /// What to write instead.
        instead: String,
    },
    /// One of compute or memory asked, and no GPU known to size the other by.
    #[error(
        "the pod asks for {named} only, and gpuwarden knows no GPU yet to size its {missing} by; give both {MILLI_RESOURCE} and {MEMORY_RESOURCE}"
    )]
    NothingToSizeBy {
        /// What was asked.
        named: &'static str,
        /// What is missing.
        missing: &'static str,
    },
}

impl fmt::Display for GpuAsk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.shares, self.memory_bytes) {
            (Some(s), Some(m)) => write!(f, "shares {s}, memory {m} bytes"),
            (Some(s), None) => write!(f, "shares {s}"),
            (None, Some(m)) => write!(f, "memory {m} bytes"),
            (None, None) => f.write_str("nothing"),
        }
    }
}

impl GpuAsk {
    /// The same ask as the controller's request type.
    #[must_use]
    pub fn to_request(&self) -> GpuRequest {
        GpuRequest::shares(self.shares.unwrap_or_default())
            .with_memory(self.memory_bytes.unwrap_or(0))
    }

    /// Whether it asks for nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.shares.is_none() && self.memory_bytes.is_none()
    }

    /// The ask in the slice's whole units, both capacities named, so that kube-scheduler charges
    /// exactly what the agent enforces: thousandths of compute (shares × 1000) and whole MiB of
    /// memory (rounded up, as the scheduler's `1Mi` step would). The one not asked is sized in
    /// proportion to `device_memory` (the smallest GPU offered to Kubernetes), rounded down, so
    /// that asks in proportion that add up to a GPU fit it: `gpu-milli: 500` alone on 80 GiB GPUs
    /// is 500 and 40960 MiB.
    ///
    /// # Errors
    /// [`AskError::NothingToSizeBy`] when one is missing and no GPU is known;
    /// [`AskError::FinerThanMilli`] for a share finer than a thousandth.
    pub fn sized(&self, device_memory: Option<u64>) -> Result<ClaimAsk, AskError> {
        let milli = self
            .shares
            .map(|s| {
                let per_milli = SlotValue::ONE.micros() / u128::from(MILLI_PER_GPU);
                if s.micros() % per_milli == 0 {
                    u64::try_from(s.micros() / per_milli).map_err(|_| ())
                } else {
                    Err(())
                }
                .map_err(|()| AskError::FinerThanMilli {
                    container: "(the pod)".into(),
                    value: s,
                })
            })
            .transpose()?;
        let memory_mib = self.memory_bytes.map(|b| b.div_ceil(MIB));
        let device_mib = device_memory.map(|b| b / MIB).filter(|m| *m > 0);
        let (milli, memory_mib) = match (milli, memory_mib, device_mib) {
            (Some(m), Some(b), _) => (m, b),
            (Some(m), None, Some(d)) => (m, (m * d / MILLI_PER_GPU).max(1)),
            (None, Some(b), Some(d)) => ((b * MILLI_PER_GPU / d).clamp(1, MILLI_PER_GPU), b),
            (Some(_), None, None) => {
                return Err(AskError::NothingToSizeBy {
                    named: "compute",
                    missing: "memory",
                });
            }
            (None, _, None) | (None, None, _) => {
                return Err(AskError::NothingToSizeBy {
                    named: "memory",
                    missing: "compute",
                });
            }
        };
        Ok(ClaimAsk { milli, memory_mib })
    }
}

/// An ask as the claim names it: both capacities, in the slice's whole units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimAsk {
    /// Thousandths of one GPU's compute (1–1000).
    pub milli: u64,
    /// Whole MiB of its memory.
    pub memory_mib: u64,
}

impl ClaimAsk {
    /// The name of the `ResourceClaimTemplate` asking for this, the same for every pod that asks
    /// the same: `gpuwarden-500m-8gi`, `gpuwarden-250m-10000mi`. A DNS subdomain.
    #[must_use]
    pub fn template_name(&self) -> String {
        format!(
            "gpuwarden-{}m-{}",
            self.milli,
            memory_label(self.memory_mib * MIB)
        )
    }

    /// The device request's capacity: `{milli: "500", memory: "8Gi"}` (quantity strings).
    #[must_use]
    pub fn capacity_requests(&self) -> Value {
        json!({
            "milli": self.milli.to_string(),
            "memory": memory_quantity(self.memory_mib * MIB),
        })
    }

    /// The `ResourceClaimTemplate` (`resource.k8s.io/v1`) for `namespace` asking for this: one
    /// device of class [`DEVICE_CLASS`] with these capacity requests (consumable capacity, a
    /// device shared by several claims).
    #[must_use]
    pub fn template(&self, namespace: &str) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": self.template_name(),
                "namespace": namespace,
                "labels": { MANAGED_BY.0: MANAGED_BY.1 },
            },
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{
                            "name": REQUEST_NAME,
                            "exactly": {
                                "deviceClassName": DEVICE_CLASS,
                                "capacity": { "requests": self.capacity_requests() },
                            },
                        }],
                    },
                },
            },
        })
    }

    /// The ask as the controller reads it: shares as an exact decimal, memory in bytes.
    #[must_use]
    pub fn to_ask(&self) -> GpuAsk {
        GpuAsk {
            shares: Some(SlotValue::from_micros(
                u128::from(self.milli) * (SlotValue::ONE.micros() / u128::from(MILLI_PER_GPU)),
            )),
            memory_bytes: Some(self.memory_mib * MIB),
        }
    }

    /// The annotations the webhook leaves on the pod, so that the scheduler extender knows the
    /// ask once the limits are gone (exact decimals: shares, bytes).
    #[must_use]
    pub fn annotations(&self) -> Vec<(&'static str, String)> {
        let ask = self.to_ask();
        let mut out = Vec::new();
        if let Some(s) = ask.shares {
            out.push((SHARES_RESOURCE, s.to_string()));
        }
        if let Some(m) = ask.memory_bytes {
            out.push((MEMORY_RESOURCE, m.to_string()));
        }
        out
    }
}

/// `8Gi`, `512Mi`, `1536Ki` or plain bytes: the exact quantity, in the largest binary unit
/// that divides it.
fn memory_quantity(bytes: u64) -> String {
    for (shift, unit) in [
        (60, "Ei"),
        (50, "Pi"),
        (40, "Ti"),
        (30, "Gi"),
        (20, "Mi"),
        (10, "Ki"),
    ] {
        if bytes != 0 && bytes.trailing_zeros() >= shift {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// [`memory_quantity`] in lower case, as names want it.
fn memory_label(bytes: u64) -> String {
    memory_quantity(bytes).to_ascii_lowercase()
}

/// What the checks need to know of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Shares must be whole multiples of this.
    pub quantum: SlotValue,
    /// The most memory one GPU offered to Kubernetes (else one known GPU) has (`None`: no GPU
    /// known yet, so memory isn't checked).
    pub largest_device_memory: Option<u64>,
    /// The least memory one GPU offered to Kubernetes has (else one known GPU): what an ask naming
    /// only compute or only memory is sized by ([`GpuAsk::sized`]).
    pub smallest_device_memory: Option<u64>,
}

/// A quantity as the API server sends it: a string (canonical form, `500m`), or a number in
/// hand-written objects.
fn quantity_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// One container's value of `resource`: from its limits, else its requests; the maps it was
/// found in.
fn container_value(
    container: &Value,
    name: &str,
    resource: &'static str,
) -> Result<Option<(String, Vec<&'static str>)>, AskError> {
    let read = |map: &str| {
        container
            .pointer(&format!("/resources/{map}"))
            .and_then(|m| m.get(resource))
    };
    let malformed = |reason: String| AskError::Malformed {
        container: name.to_owned(),
        resource,
        reason,
    };
    let mut found = Vec::new();
    let mut texts = Vec::new();
    for map in ["limits", "requests"] {
        if let Some(v) = read(map) {
            let text = quantity_text(v)
                .ok_or_else(|| malformed(format!("{v} is not a quantity string")))?;
            found.push(map);
            texts.push(text);
        }
    }
    match texts.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some((one.clone(), found))),
        [limit, request, ..] => {
            let parse = |t: &str| Quantity::parse(t).ok();
            if parse(limit).is_some() && parse(limit) != parse(request) {
                return Err(AskError::LimitRequestDiffer {
                    container: name.to_owned(),
                    resource,
                    limit: limit.clone(),
                    request: request.clone(),
                });
            }
            Ok(Some((limit.clone(), found)))
        }
    }
}

/// Parses a positive quantity of `resource`.
fn positive(container: &str, resource: &'static str, text: &str) -> Result<Quantity, AskError> {
    let q = Quantity::parse(text).map_err(|e: QuantityError| AskError::Malformed {
        container: container.to_owned(),
        resource,
        reason: e.to_string(),
    })?;
    if q.is_negative() || q.is_zero() {
        return Err(AskError::NotPositive {
            container: container.to_owned(),
            resource,
            value: text.to_owned(),
        });
    }
    Ok(q)
}

/// One container's ask, checked against `bounds`.
fn container_ask(
    container: &Value,
    name: &str,
    bounds: Option<&Bounds>,
) -> Result<Option<(GpuAsk, Found)>, AskError> {
    let mut ask = GpuAsk::default();
    let mut found = Vec::new();
    let milli = container_value(container, name, MILLI_RESOURCE)?;
    let shares = container_value(container, name, SHARES_RESOURCE)?;
    if milli.is_some() && shares.is_some() {
        return Err(AskError::BothShareNames {
            container: name.to_owned(),
        });
    }
    if let Some((text, maps)) = milli {
        let q = positive(name, MILLI_RESOURCE, &text)?;
        let m = q.whole().ok_or_else(|| AskError::MilliNotWhole {
            container: name.to_owned(),
            value: text.clone(),
        })?;
        if m > MILLI_PER_GPU {
            return Err(AskError::ShareAboveOne {
                container: name.to_owned(),
                resource: MILLI_RESOURCE,
                value: text,
            });
        }
        ask.shares = Some(SlotValue::from_micros(
            u128::from(m) * (SlotValue::ONE.micros() / u128::from(MILLI_PER_GPU)),
        ));
        found.extend(maps.into_iter().map(|m| (m, MILLI_RESOURCE)));
    }
    if let Some((text, maps)) = shares {
        let q = positive(name, SHARES_RESOURCE, &text)?;
        let shares = SlotValue::from_micros(q.micros());
        if shares > SlotValue::ONE {
            return Err(AskError::ShareAboveOne {
                container: name.to_owned(),
                resource: SHARES_RESOURCE,
                value: text,
            });
        }
        if !shares.is_multiple_of(SlotValue::from_micros(
            SlotValue::ONE.micros() / u128::from(MILLI_PER_GPU),
        )) {
            return Err(AskError::FinerThanMilli {
                container: name.to_owned(),
                value: shares,
            });
        }
        ask.shares = Some(shares);
        found.extend(maps.into_iter().map(|m| (m, SHARES_RESOURCE)));
    }
    if let Some(b) = bounds
        && let Some(shares) = ask.shares
        && !shares.is_multiple_of(b.quantum)
    {
        return Err(AskError::NotQuantum {
            container: name.to_owned(),
            value: shares,
            quantum: b.quantum,
        });
    }
    if let Some((text, maps)) = container_value(container, name, MEMORY_RESOURCE)? {
        let q = positive(name, MEMORY_RESOURCE, &text)?;
        let bytes = q.whole().ok_or_else(|| AskError::FractionalBytes {
            container: name.to_owned(),
            value: text.clone(),
        })?;
        if let Some(largest) = bounds.and_then(|b| b.largest_device_memory)
            && bytes > largest
        {
            return Err(AskError::MemoryAboveDevices {
                container: name.to_owned(),
                requested: bytes,
                largest,
            });
        }
        ask.memory_bytes = Some(bytes);
        found.extend(maps.into_iter().map(|m| (m, MEMORY_RESOURCE)));
    }
    Ok((!ask.is_empty()).then_some((ask, found)))
}

/// The pod's ask from its containers' limits, checked against `bounds` when given; `None` when
/// no container carries the limits.
///
/// # Errors
/// A malformed, non-positive or too large value, a share finer than the quantum, or two
/// containers asking differently.
pub fn read_limits(pod: &Value, bounds: Option<&Bounds>) -> Result<Option<PodAsk>, AskError> {
    let mut carriers: Vec<Carrier> = Vec::new();
    let mut first: Option<(String, GpuAsk)> = None;
    for list in CONTAINER_LISTS {
        let Some(containers) = pod
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
        else {
            continue;
        };
        for (index, container) in containers.iter().enumerate() {
            let name = container
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let Some((ask, found)) = container_ask(container, &name, bounds)? else {
                continue;
            };
            match &first {
                Some((first_name, first_ask)) if *first_ask != ask => {
                    return Err(AskError::Mismatch {
                        first: first_name.clone(),
                        first_ask: first_ask.to_string(),
                        second: name,
                        second_ask: ask.to_string(),
                    });
                }
                Some(_) => {}
                None => first = Some((name.clone(), ask)),
            }
            carriers.push(Carrier {
                list,
                index,
                name,
                found,
            });
        }
    }
    Ok(first.map(|(_, ask)| PodAsk { ask, carriers }))
}

/// The ask the webhook left in the pod's annotations, else what its limits ask (a pod admitted
/// without the webhook); `None` when it asks nothing of gpuwarden.
///
/// # Errors
/// The annotations or limits don't read.
pub fn read_ask(pod: &Value) -> Result<Option<GpuAsk>, AskError> {
    let annotation = |key: &str| {
        pod.pointer("/metadata/annotations")
            .and_then(|a| a.get(key))
            .and_then(Value::as_str)
    };
    let shares = annotation(SHARES_RESOURCE);
    let memory = annotation(MEMORY_RESOURCE);
    if shares.is_none() && memory.is_none() {
        return Ok(read_limits(pod, None)?.map(|p| p.ask));
    }
    let pod_name = "(annotations)";
    let mut ask = GpuAsk::default();
    if let Some(text) = shares {
        let q = positive(pod_name, SHARES_RESOURCE, text)?;
        ask.shares = Some(SlotValue::from_micros(q.micros()));
    }
    if let Some(text) = memory {
        let q = positive(pod_name, MEMORY_RESOURCE, text)?;
        ask.memory_bytes = Some(q.whole().ok_or_else(|| AskError::FractionalBytes {
            container: pod_name.to_owned(),
            value: text.to_owned(),
        })?);
    }
    Ok(Some(ask))
}

/// The workload kinds whose pod template the webhook checks: (API group, kind, pointer to the
/// template's pod spec).
pub const WORKLOADS: [(&str, &str, &str); 6] = [
    ("apps", "Deployment", "/spec/template/spec"),
    ("apps", "StatefulSet", "/spec/template/spec"),
    ("apps", "DaemonSet", "/spec/template/spec"),
    ("apps", "ReplicaSet", "/spec/template/spec"),
    ("batch", "Job", "/spec/template/spec"),
    ("batch", "CronJob", "/spec/jobTemplate/spec/template/spec"),
];

/// What the API server will refuse of gpuwarden's limits in a workload's pod template
/// `spec` (kind `kind`): a value that is no whole number (extended resources must be integers,
/// `pkg/apis/core/validation/validation.go`, `ValidateResourceQuantityValue`), refused here
/// first with what to write instead — the API server's own words (`must be an integer`) don't
/// say that `gpuwarden.io/gpu-shares: 0.5` is `gpuwarden.io/gpu-milli: 500`.
///
/// # Errors
/// [`AskError::FractionInWorkload`] for the first such value.
pub fn check_workload_template(kind: &str, spec: &Value) -> Result<(), AskError> {
    for list in CONTAINER_LISTS {
        for container in spec
            .get(list)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let name = container.get("name").and_then(Value::as_str).unwrap_or("");
            for resource in [SHARES_RESOURCE, MILLI_RESOURCE, MEMORY_RESOURCE] {
                for map in ["limits", "requests"] {
                    let Some(text) = container
                        .pointer(&format!("/resources/{map}"))
                        .and_then(|m| m.get(resource))
                        .and_then(quantity_text)
                    else {
                        continue;
                    };
                    let Ok(q) = Quantity::parse(&text) else {
                        continue;
                    };
                    if q.whole().is_some() || q.is_negative() {
                        continue;
                    }
                    let per_milli = SlotValue::ONE.micros() / u128::from(MILLI_PER_GPU);
                    let instead = match resource {
                        SHARES_RESOURCE if q.micros() % per_milli == 0 => {
                            format!("write {MILLI_RESOURCE}: {} instead", q.micros() / per_milli)
                        }
                        SHARES_RESOURCE => format!(
                            "write {MILLI_RESOURCE} (thousandths of a GPU, a whole number) instead"
                        ),
                        MILLI_RESOURCE => "give whole thousandths".to_owned(),
                        _ => "give a whole number of bytes (8Gi, 512Mi)".to_owned(),
                    };
                    return Err(AskError::FractionInWorkload {
                        kind: kind.to_owned(),
                        container: name.to_owned(),
                        resource,
                        value: text,
                        instead,
                    });
                }
            }
        }
    }
    Ok(())
}

/// A JSON Pointer from its reference tokens, escaped (`~` → `~0`, `/` → `~1`).
#[must_use]
pub fn json_pointer(tokens: &[&str]) -> String {
    let mut pointer = String::new();
    for token in tokens {
        pointer.push('/');
        pointer.push_str(&token.replace('~', "~0").replace('/', "~1"));
    }
    pointer
}

#[cfg(test)]
mod tests;
