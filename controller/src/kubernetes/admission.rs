//! The mutating admission webhook (`admission.k8s.io/v1` AdmissionReview): a pod whose
//! containers carry `gpuwarden.io/gpu-milli` (or `gpuwarden.io/gpu-shares`) /
//! `gpuwarden.io/gpu-memory` limits leaves it
//! asking the same through DRA.
//!
//! For such a pod the answer is a `JSONPatch` that
//! 1. removes those limits (and equal requests) from each container carrying them — no node
//!    advertises them as extended resources, so the pod would never schedule with them;
//! 2. adds the pod claim [`CLAIM_NAME`] made from the `ResourceClaimTemplate` named for the ask
//!    (`gpuwarden-500m-8gi`), which names both capacities in the slice's whole units (an ask of
//!    one is sized in proportion by the smallest GPU offered to Kubernetes,
//!    [`pod::GpuAsk::sized`]), and the claim to each carrying container's `resources.claims`;
//! 3. records the ask in annotations of the same names, for the scheduler extender.
//!
//! The template is made in the pod's namespace first, through [`ClaimTemplates`] (not on a dry
//! run: the webhook declares `sideEffects: NoneOnDryRun`). Refusals (`allowed: false`) carry
//! the reason in `status.message`: a share above one device or not above zero, a malformed
//! quantity, more memory than any GPU the agents reported, containers asking differently.
//! Pods without the limits, and operations other than CREATE, are allowed untouched. A
//! workload (Deployment, `StatefulSet`, `DaemonSet`, `ReplicaSet`, Job, `CronJob`) is never
//! mutated: one whose pod template carries a gpuwarden limit that is no whole number is refused
//! with what to write instead (the API server would refuse it next, only saying `must be an
//! integer`), any other is allowed. A body that is no `AdmissionReview`, or one about something
//! else, is an error the API server shows (HTTP 400, or a refusal naming the kind).

use base64::Engine as _;
use gpuwarden_types::dns::is_dns_label;
use serde_json::{Value, json};

use super::{
    apiserver::ClaimTemplates,
    pod::{self, AskError, Bounds, CLAIM_NAME, ClaimAsk, PodAsk, json_pointer},
};

/// Why a body can't be answered as an `AdmissionReview` at all (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    /// Not JSON.
    #[error("the body is not JSON: {0}")]
    NotJson(String),
    /// Another API version or kind.
    #[error("expected an admission.k8s.io/v1 AdmissionReview, got {api_version:?} {kind:?}")]
    NotAdmissionReview {
        /// `apiVersion`.
        api_version: String,
        /// `kind`.
        kind: String,
    },
    /// No `request`, or one without a `uid`.
    #[error("the AdmissionReview has no request with a uid")]
    NoRequest,
}

/// Whether the mutated pod keeps a marker resource for the scheduler extender.
///
/// kube-scheduler calls an extender for every pod unless its `managedResources` names a
/// resource the pod's containers request (`HTTPExtender.IsInterested`); the webhook removes
/// gpuwarden's limits, so without a marker nothing is left to match. With
/// [`Marker::ExtenderMarker`] each carrying container keeps `gpuwarden.io/gpu-milli` (a whole
/// number, as limit and request), which kube-scheduler is told to ignore in its own fit check
/// (`ignoredByScheduler: true`) and the kubelet drops at admission as an extended resource its
/// node does not advertise (`pkg/kubelet/lifecycle/predicate.go`,
/// `removeMissingExtendedResources`: "cluster-level resources"). Without the extender
/// configured that way a marked pod never schedules, so it is off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Marker {
    /// Nothing of gpuwarden is left in the containers' resources.
    #[default]
    None,
    /// `gpuwarden.io/gpu-milli` stays in each carrying container's limits and requests.
    ExtenderMarker,
}

/// What the webhook answered, for logs and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Allowed untouched.
    Untouched,
    /// Allowed with a patch.
    Patched {
        /// The template's name.
        template: String,
    },
    /// Refused.
    Refused(String),
}

/// Answers one `AdmissionReview` `body`: the `AdmissionReview` to send back, and what it said.
///
/// # Errors
/// The body is no `AdmissionReview` with a request.
pub async fn review(
    body: &[u8],
    bounds: &Bounds,
    templates: &dyn ClaimTemplates,
    marker: Marker,
) -> Result<(Value, Outcome), ReviewError> {
    let review: Value =
        serde_json::from_slice(body).map_err(|e| ReviewError::NotJson(e.to_string()))?;
    let field = |name: &str| {
        review
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    if field("apiVersion") != "admission.k8s.io/v1" || field("kind") != "AdmissionReview" {
        return Err(ReviewError::NotAdmissionReview {
            api_version: field("apiVersion"),
            kind: field("kind"),
        });
    }
    let request = review.get("request").ok_or(ReviewError::NoRequest)?;
    let uid = request
        .get("uid")
        .and_then(Value::as_str)
        .filter(|u| !u.is_empty())
        .ok_or(ReviewError::NoRequest)?
        .to_owned();
    let outcome_and_patch = decide(request, bounds, templates, marker).await;
    let mut response = json!({ "uid": uid, "allowed": true });
    let outcome = match outcome_and_patch {
        Decision::Untouched => Outcome::Untouched,
        Decision::Patch { template, patch } => {
            response["patchType"] = json!("JSONPatch");
            response["patch"] = json!(
                base64::engine::general_purpose::STANDARD
                    .encode(serde_json::to_vec(&patch).unwrap_or_default())
            );
            Outcome::Patched { template }
        }
        Decision::Refuse { code, message } => {
            response["allowed"] = json!(false);
            response["status"] = json!({ "code": code, "message": message });
            Outcome::Refused(message)
        }
    };
    Ok((
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": response,
        }),
        outcome,
    ))
}

enum Decision {
    Untouched,
    Patch { template: String, patch: Value },
    Refuse { code: u16, message: String },
}

fn refuse(code: u16, message: impl Into<String>) -> Decision {
    Decision::Refuse {
        code,
        message: message.into(),
    }
}

async fn decide(
    request: &Value,
    bounds: &Bounds,
    templates: &dyn ClaimTemplates,
    marker: Marker,
) -> Decision {
    let text = |pointer: &str| {
        request
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let (group, kind) = (text("/kind/group"), text("/kind/kind"));
    if let Some(decision) = workload(request, group, kind) {
        return decision;
    }
    if !(group.is_empty() && kind == "Pod" && text("/subResource").is_empty()) {
        let what = if group.is_empty() {
            format!("{}/{kind}", text("/kind/version"))
        } else {
            format!("{group}/{}/{kind}", text("/kind/version"))
        };
        return refuse(
            400,
            format!(
                "gpuwarden's webhook only mutates Pods (got {what}{}); check the MutatingWebhookConfiguration's rules",
                if text("/subResource").is_empty() {
                    String::new()
                } else {
                    format!(" subresource {}", text("/subResource"))
                }
            ),
        );
    }
    if text("/operation") != "CREATE" {
        return Decision::Untouched;
    }
    let Some(pod) = request.get("object").filter(|o| o.is_object()) else {
        return refuse(400, "the AdmissionReview carries no pod object");
    };
    let asked = match pod::read_limits(pod, Some(bounds)) {
        Ok(Some(asked)) => asked,
        Ok(None) => return Decision::Untouched,
        Err(e) => return refuse(422, e.to_string()),
    };
    if pod
        .pointer("/spec/resourceClaims")
        .and_then(Value::as_array)
        .is_some_and(|claims| {
            claims
                .iter()
                .any(|c| c.get("name").and_then(Value::as_str) == Some(CLAIM_NAME))
        })
    {
        return refuse(422, AskError::ClaimNameTaken.to_string());
    }
    // A pod made by a controller may not carry its namespace yet; the request always does.
    let namespace = Some(text("/namespace"))
        .filter(|n| !n.is_empty())
        .or_else(|| pod.pointer("/metadata/namespace").and_then(Value::as_str))
        .unwrap_or("");
    if !is_dns_label(namespace) {
        return refuse(
            400,
            format!("the pod's namespace {namespace:?} is not a namespace name"),
        );
    }
    let sized = match asked.ask.sized(bounds.smallest_device_memory) {
        Ok(sized) => sized,
        Err(e) => return refuse(422, e.to_string()),
    };
    let template = sized.template(namespace);
    let name = sized.template_name();
    let dry_run = request.get("dryRun").and_then(Value::as_bool) == Some(true);
    if !dry_run {
        match templates.ensure(namespace, &template).await {
            Ok(ensured) => tracing::debug!(namespace, template = %name, ?ensured, "claim template"),
            Err(e) => {
                tracing::warn!(namespace, template = %name, "cannot make the claim template: {e}");
                let code = if matches!(e, super::apiserver::ApiError::Throttled { .. }) {
                    429
                } else {
                    500
                };
                return refuse(
                    code,
                    format!(
                        "gpuwarden could not make ResourceClaimTemplate {namespace}/{name}: {e}"
                    ),
                );
            }
        }
    }
    Decision::Patch {
        patch: patch(pod, &asked, &sized, marker),
        template: name,
    }
}

/// The decision on a workload (`group`/`kind` one of [`pod::WORKLOADS`]); `None` for anything
/// else. A workload's pod template is validated before any Pod exists: a fraction there is
/// refused now, with what to write instead.
fn workload(request: &Value, group: &str, kind: &str) -> Option<Decision> {
    let (_, _, template) = pod::WORKLOADS
        .iter()
        .find(|(g, k, _)| *g == group && *k == kind)?;
    let text = |pointer: &str| request.pointer(pointer).and_then(Value::as_str);
    if text("/subResource").is_some_and(|s| !s.is_empty()) {
        return None;
    }
    if !matches!(text("/operation"), Some("CREATE" | "UPDATE")) {
        return Some(Decision::Untouched);
    }
    let spec = request
        .pointer(&format!("/object{template}"))
        .cloned()
        .unwrap_or(Value::Null);
    Some(match pod::check_workload_template(kind, &spec) {
        Ok(()) => Decision::Untouched,
        Err(e) => refuse(422, e.to_string()),
    })
}

/// The `JSONPatch` (RFC 6902) that turns the limits into the claim asking `sized`, leaving
/// `marker`.
#[must_use]
pub fn patch(pod: &Value, asked: &PodAsk, sized: &ClaimAsk, marker: Marker) -> Value {
    let template = sized.template_name();
    let mut ops = Vec::new();
    for carrier in &asked.carriers {
        let base = ["spec", carrier.list, &carrier.index.to_string()];
        let container = pod.pointer(&json_pointer(&base));
        for (map, resource) in &carrier.found {
            ops.push(json!({
                "op": "remove",
                "path": json_pointer(&[base[0], base[1], base[2], "resources", map, resource]),
            }));
        }
        if marker == Marker::ExtenderMarker {
            let milli = Value::String(sized.milli.to_string());
            for map in ["limits", "requests"] {
                let has_map = container
                    .and_then(|c| c.pointer(&format!("/resources/{map}")))
                    .is_some_and(Value::is_object);
                // Removing keys leaves the map: add to it, or add it whole.
                if has_map {
                    ops.push(json!({
                        "op": "add",
                        "path": json_pointer(&[base[0], base[1], base[2], "resources", map,
                                               pod::MILLI_RESOURCE]),
                        "value": milli,
                    }));
                } else {
                    ops.push(json!({
                        "op": "add",
                        "path": json_pointer(&[base[0], base[1], base[2], "resources", map]),
                        "value": { pod::MILLI_RESOURCE: milli },
                    }));
                }
            }
        }
        let claim = json!({ "name": CLAIM_NAME });
        let claims = container.and_then(|c| c.pointer("/resources/claims"));
        if claims.is_some_and(Value::is_array) {
            ops.push(json!({
                "op": "add",
                "path": json_pointer(&[base[0], base[1], base[2], "resources", "claims", "-"]),
                "value": claim,
            }));
        } else {
            ops.push(json!({
                "op": "add",
                "path": json_pointer(&[base[0], base[1], base[2], "resources", "claims"]),
                "value": [claim],
            }));
        }
    }
    let pod_claim = json!({ "name": CLAIM_NAME, "resourceClaimTemplateName": template });
    if pod
        .pointer("/spec/resourceClaims")
        .is_some_and(Value::is_array)
    {
        ops.push(json!({ "op": "add", "path": "/spec/resourceClaims/-", "value": pod_claim }));
    } else {
        ops.push(json!({ "op": "add", "path": "/spec/resourceClaims", "value": [pod_claim] }));
    }
    let annotations = sized.annotations();
    if pod
        .pointer("/metadata/annotations")
        .is_some_and(Value::is_object)
    {
        for (key, value) in annotations {
            ops.push(json!({
                "op": "add",
                "path": json_pointer(&["metadata", "annotations", key]),
                "value": value,
            }));
        }
    } else {
        let map: serde_json::Map<String, Value> = annotations
            .into_iter()
            .map(|(k, v)| (k.to_owned(), Value::String(v)))
            .collect();
        ops.push(json!({ "op": "add", "path": "/metadata/annotations", "value": map }));
    }
    Value::Array(ops)
}
