//! The workload class a Kubernetes pod's usage profile is filed under, one rule for the
//! controller's scheduler extender (which scores a pod by it) and the agent (which files a
//! prepared claim's session under it, so what the pod used teaches the profile the extender
//! reads).

use serde_json::Value;

/// The pod label naming its workload class.
pub const CLASS_LABEL: &str = "gpuwarden.io/class";

/// The workload class of `pod` (a Pod object as the API server returns it): its
/// `gpuwarden.io/class` label, else its controlling owner's name (a `ReplicaSet`'s without the
/// pod-template hash, i.e. the Deployment's), else its own name.
#[must_use]
pub fn workload_class(pod: &Value) -> String {
    let meta = pod.get("metadata");
    let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
    if let Some(class) = text(
        meta.and_then(|m| m.get("labels"))
            .and_then(|l| l.get(CLASS_LABEL)),
    )
    .filter(|c| !c.is_empty())
    {
        return class;
    }
    let owners = meta
        .and_then(|m| m.get("ownerReferences"))
        .and_then(Value::as_array);
    let owner = owners.and_then(|owners| {
        owners
            .iter()
            .find(|o| o.get("controller").and_then(Value::as_bool) == Some(true))
            .or_else(|| owners.first())
    });
    if let Some(owner) = owner
        && let Some(name) = text(owner.get("name"))
    {
        if text(owner.get("kind")).as_deref() == Some("ReplicaSet") {
            // The Deployment controller names its ReplicaSets `<deployment>-<pod-template-hash>`
            // and labels their pods with that hash.
            let hash = text(meta.and_then(|m| m.pointer("/labels/pod-template-hash")));
            let stripped = match hash {
                Some(hash) => name.strip_suffix(&format!("-{hash}")).map(str::to_owned),
                None => name.rsplit_once('-').map(|(base, _)| base.to_owned()),
            };
            return stripped.unwrap_or(name);
        }
        return name;
    }
    text(meta.and_then(|m| m.get("name")))
        .or_else(|| text(meta.and_then(|m| m.get("generateName"))))
        .unwrap_or_default()
}
