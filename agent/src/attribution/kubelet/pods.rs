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

    /// What [`parse_pod_list`] promises for a document that is JSON, read independently from
    /// its untyped form: every item whose metadata has a string UID, name and namespace, keyed
    /// by the lowercase UID (the last item wins a repeated UID, as in the `HashMap` it builds).
    fn expected(doc: &serde_json::Value) -> HashMap<String, PodName> {
        let items = doc["items"].as_array().map_or(&[][..], Vec::as_slice);
        items
            .iter()
            .filter_map(|item| {
                let meta = &item["metadata"];
                Some((
                    meta["uid"].as_str()?.to_ascii_lowercase(),
                    PodName {
                        name: meta["name"].as_str()?.to_owned(),
                        namespace: meta["namespace"].as_str()?.to_owned(),
                    },
                ))
            })
            .collect()
    }

    /// One pod list item: each of UID, name and namespace present or not, beside fields the
    /// parser ignores.
    fn item() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        (
            proptest::option::of("[0-9A-Fa-f]{4}(-[0-9A-Fa-f]{4}){0,2}"),
            proptest::option::of("[a-z0-9.-]{1,20}"),
            proptest::option::of("[a-z0-9-]{1,20}"),
            any::<bool>(),
        )
            .prop_map(|(uid, name, namespace, extra)| {
                let mut meta = serde_json::Map::new();
                for (key, value) in [("uid", uid), ("name", name), ("namespace", namespace)] {
                    if let Some(value) = value {
                        meta.insert(key.to_owned(), value.into());
                    }
                }
                if extra {
                    meta.insert("labels".to_owned(), serde_json::json!({"app": "x"}));
                }
                serde_json::json!({"metadata": meta, "spec": {}, "status": {"phase": "Running"}})
            })
    }

    /// A pod list document of up to eight items.
    fn pod_list() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        proptest::collection::vec(item(), 0..8).prop_map(|items| {
            serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
        })
    }

    /// Bytes from anywhere: random, or a well-formed pod list with some bytes overwritten.
    fn hostile_body() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..2048),
            (
                pod_list(),
                proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..4)
            )
                .prop_map(|(doc, edits)| {
                    let mut body = doc.to_string().into_bytes();
                    for (at, byte) in edits {
                        let i = at.index(body.len());
                        body[i] = byte;
                    }
                    body
                }),
        ]
    }

    // Hostile input: whatever the kubelet's port answers (it may be anything that listens
    // there), the parser neither panics nor invents a pod; the names it reads are the ones sent.
    proptest::proptest! {
        /// Never a panic; what is not a pod list is a typed `malformed` error; what is accepted
        /// was JSON (but for invalid UTF-8 inside fields it ignores), and every pod returned is
        /// one of its items, with that item's UID, name and namespace (nothing invented, nothing
        /// dropped that had all three).
        #[test]
        fn hostile_bodies_never_panic(body in hostile_body()) {
            match parse_pod_list(&body) {
                Err(err) => {
                    proptest::prop_assert!(matches!(err, KubeletError::Malformed(_)), "{}", err);
                    proptest::prop_assert_eq!(err.label(), "malformed");
                }
                Ok(pods) => {
                    // Read lossily: serde_json skips the fields the parser ignores without
                    // checking their UTF-8, while every string the parser keeps is checked.
                    let text = String::from_utf8_lossy(&body);
                    let doc: serde_json::Value = serde_json::from_str(&text)
                        .map_err(|e| proptest::test_runner::TestCaseError::fail(format!(
                            "accepted a body that is not JSON ({e}): {text:?}"
                        )))?;
                    proptest::prop_assert!(doc["items"].is_array(), "accepted without items: {}", doc);
                    proptest::prop_assert_eq!(pods, expected(&doc));
                }
            }
        }

        /// A well-formed list gives exactly the items with a UID, name and namespace, keyed by
        /// the lowercase UID; and the same document cut short anywhere is an error, never the
        /// pods read so far.
        #[test]
        fn pod_lists_round_trip_and_a_cut_list_is_an_error(
            doc in pod_list(),
            cut in proptest::prelude::any::<proptest::sample::Index>(),
        ) {
            let body = doc.to_string().into_bytes();
            let pods = parse_pod_list(&body).expect("a well-formed pod list");
            for uid in pods.keys() {
                proptest::prop_assert_eq!(uid, &uid.to_ascii_lowercase());
            }
            proptest::prop_assert_eq!(&pods, &expected(&doc));
            let short = &body[..cut.index(body.len())];
            let err = parse_pod_list(short).expect_err("a cut-short list is refused");
            proptest::prop_assert!(matches!(err, KubeletError::Malformed(_)), "{}", err);
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
            proptest::prop_assert_eq!(pods.len(), 1);
            let pod = &pods[&uid.to_ascii_lowercase()];
            proptest::prop_assert_eq!(&pod.name, &name);
            proptest::prop_assert_eq!(&pod.namespace, &namespace);
        }
    }
}
