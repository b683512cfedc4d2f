//! Reading the kubelet's pod list.

use std::collections::HashMap;

use serde::Deserialize;

use super::KubeletError;

/// A pod's name and namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodName {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
}

#[derive(Deserialize)]
struct PodList {
    items: Vec<Pod>,
}

#[derive(Deserialize)]
struct Pod {
    metadata: Metadata,
}

#[derive(Deserialize)]
struct Metadata {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
}

/// Reads a `PodList` JSON document into UID → name and namespace. Pods without a UID, name or
/// namespace are skipped (the kubelet always sets them; a partial entry says nothing usable).
///
/// # Errors
/// The document is not JSON, or has no `items` list of objects with `metadata`.
pub fn parse_pod_list(body: &[u8]) -> Result<HashMap<String, PodName>, KubeletError> {
    let list: PodList = serde_json::from_slice(body).map_err(KubeletError::Malformed)?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|pod| {
            let Metadata {
                name,
                namespace,
                uid,
            } = pod.metadata;
            // The cgroup path gives the UID in lowercase.
            Some((
                uid?.to_ascii_lowercase(),
                PodName {
                    name: name?,
                    namespace: namespace?,
                },
            ))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b3c2f0e-5a8c-4d4e-9f6e-1f2a3b4c5d6e";

    #[test]
    fn reads_a_pod_list() {
        let body = format!(
            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{}},"items":[
                {{"metadata":{{"name":"train-0","namespace":"ml","uid":"{}"}},"spec":{{}},"status":{{}}}},
                {{"metadata":{{"name":"no-uid","namespace":"ml"}}}}
            ]}}"#,
            UID.to_uppercase()
        );
        let pods = parse_pod_list(body.as_bytes()).unwrap();
        assert_eq!(pods.len(), 1);
        assert_eq!(
            pods[UID],
            PodName {
                name: "train-0".to_owned(),
                namespace: "ml".to_owned()
            }
        );
        assert!(parse_pod_list(br#"{"items":[]}"#).unwrap().is_empty());
    }

    #[test]
    fn malformed_lists_are_typed_errors() {
        for body in [
            &b"not json"[..],
            br#"{"kind":"Status","status":"Failure"}"#,
            br#"{"items":{"metadata":{}}}"#,
            br#"{"items":[{"spec":{}}]}"#,
            br#"{"items":[{"metadata":{"uid":7}}]}"#,
        ] {
            let err = parse_pod_list(body).unwrap_err();
            assert!(matches!(err, KubeletError::Malformed(_)), "{err}");
            assert_eq!(err.label(), "malformed");
        }
    }

    // Hostile input: whatever the kubelet's port answers (it may be anything that listens
    // there), the parser neither panics nor invents a pod; the names it reads are the ones sent.
    proptest::proptest! {
        #[test]
        fn hostile_bodies_never_panic(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048)) {
            let _ = parse_pod_list(&body);
        }

        #[test]
        fn names_are_read_as_sent(
            name in "[a-z0-9.-]{1,63}",
            namespace in "[a-z0-9-]{1,63}",
            uid in "[0-9A-Fa-f-]{1,36}",
        ) {
            let body = serde_json::json!({
                "kind": "PodList",
                "apiVersion": "v1",
                "items": [{"metadata": {"name": name, "namespace": namespace, "uid": uid}}]
            });
            let pods = parse_pod_list(body.to_string().as_bytes()).expect("a pod list");
            let pod = &pods[&uid.to_ascii_lowercase()];
            proptest::prop_assert_eq!(&pod.name, &name);
            proptest::prop_assert_eq!(&pod.namespace, &namespace);
        }
    }
}
