//! The Kubernetes side over real sockets: the admission webhook over HTTPS on loopback (a
//! rustls client trusting the minted CA), making its `ResourceClaimTemplates` through a fake API
//! server (HTTPS too, recording what it is sent), and the scheduler extender over plain HTTP.
//!
//! The `AdmissionReviews` are written as the API reference shows them (`admission.k8s.io/v1`,
//! the pod as the API server serializes it: quantities in canonical form, `500m`); the
//! `ExtenderArgs` as kube-scheduler's `extender/v1` types marshal (Go field names as keys). The
//! returned `JSONPatch` is applied (RFC 6902) and the pod that results is checked whole.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
};

use base64::Engine as _;
use bytes::Bytes;
use gpuwarden_controller::{
    api::{Hub, Timing},
    auth::{mint, tls::ServerTlsFiles},
    kubernetes::{
        admission::Marker,
        apiserver::ApiServer,
        serve::{Hooks, ServingCert, serve_extender, serve_webhook},
    },
    limits::{Bounds, Limits},
    node::NodeReport,
    profile::UsageSample,
    scheduler::{NewSession, SchedulerConfig},
    server,
    slots::ResourceSlot,
};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

const GIB: u64 = 1 << 30;

// ---- the fake API server -------------------------------------------------------------------

/// What the fake API server was sent: (method, path, authorization header, body).
type Calls = Arc<Mutex<Vec<(String, String, String, Value)>>>;

/// An HTTPS API server on loopback that stores `ResourceClaimTemplates` by namespace and name
/// (`201` the first time, `409 AlreadyExists` after), or answers every call with `refuse`.
async fn fake_api_server(
    tls: &ServerTlsFiles,
    refuse: Option<(u16, &'static str)>,
) -> (SocketAddr, Calls) {
    let cert = Arc::new(ServingCert::load(tls.cert.clone(), tls.key.clone()).expect("loads"));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("bound");
    let calls: Calls = Arc::default();
    let stored: Arc<Mutex<BTreeMap<String, Value>>> = Arc::default();
    let recorded = Arc::clone(&calls);
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.expect("accepts");
            let tls = tokio_rustls::TlsAcceptor::from(cert.current())
                .accept(tcp)
                .await
                .expect("handshake");
            let (calls, stored) = (Arc::clone(&recorded), Arc::clone(&stored));
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let (calls, stored) = (Arc::clone(&calls), Arc::clone(&stored));
                async move {
                    let method = req.method().to_string();
                    let path = req.uri().path().to_owned();
                    let auth = req
                        .headers()
                        .get(http::header::AUTHORIZATION)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    let body = req.into_body().collect().await.expect("body").to_bytes();
                    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    calls
                        .lock()
                        .expect("lock")
                        .push((method, path.clone(), auth, body.clone()));
                    let (status, answer) = if let Some((code, message)) = refuse {
                        (
                            code,
                            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}),
                        )
                    } else {
                        let name = body
                            .pointer("/metadata/name")
                            .and_then(Value::as_str)
                            .unwrap_or("");
                        let key = format!("{path}/{name}");
                        let mut stored = stored.lock().expect("lock");
                        match stored.entry(key) {
                            std::collections::btree_map::Entry::Occupied(_) => (
                                409,
                                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                "message": format!("resourceclaimtemplates.resource.k8s.io \"{name}\" already exists"),
                                "reason": "AlreadyExists", "code": 409}),
                            ),
                            std::collections::btree_map::Entry::Vacant(slot) => {
                                slot.insert(body.clone());
                                (201, body)
                            }
                        }
                    };
                    let mut response =
                        hyper::Response::new(Full::new(Bytes::from(answer.to_string())));
                    *response.status_mut() = StatusCode::from_u16(status).expect("a status");
                    Ok::<_, std::convert::Infallible>(response)
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service),
            );
        }
    });
    (addr, calls)
}

// ---- clients ---------------------------------------------------------------------------------

/// POSTs `body` to `path` over HTTPS, trusting `ca` and asking for `localhost`.
async fn post_tls(addr: SocketAddr, ca: &Path, path: &str, body: &[u8]) -> (StatusCode, Vec<u8>) {
    let mut roots = rustls::RootCertStore::empty();
    for cert in gpuwarden_runtime::tls::read_certs(ca, "CA").expect("reads") {
        roots.add(cert).expect("adds");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.expect("connects");
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            rustls_pki_types::ServerName::try_from("localhost").expect("a name"),
            tcp,
        )
        .await
        .expect("TLS handshake with the webhook");
    exchange(TokioIo::new(stream), path, body).await
}

/// POSTs `body` to `path` over plain HTTP.
async fn post_plain(addr: SocketAddr, path: &str, body: &[u8]) -> (StatusCode, Vec<u8>) {
    let tcp = TcpStream::connect(addr).await.expect("connects");
    exchange(TokioIo::new(tcp), path, body).await
}

async fn exchange<S>(io: TokioIo<S>, path: &str, body: &[u8]) -> (StatusCode, Vec<u8>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .expect("HTTP");
    tokio::spawn(connection);
    let request = Request::post(path)
        .header(http::header::HOST, "localhost")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::copy_from_slice(body)))
        .expect("a request");
    let response = sender.send_request(request).await.expect("an answer");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
        .to_vec();
    (status, body)
}

// ---- the cluster -----------------------------------------------------------------------------

/// Everything a test talks to.
struct Cluster {
    _dir: tempfile::TempDir,
    controller: Arc<Hub>,
    ca: std::path::PathBuf,
    webhook: SocketAddr,
    extender: SocketAddr,
    api_calls: Calls,
}

/// A controller knowing nodes `a` (one 80 GiB GPU running a busy `train` tenant), `b` (one
/// idle 80 GiB GPU), `full` (one 40 GiB GPU, 0.9 of it taken); the webhook on HTTPS with
/// minted certificates, the extender on plain HTTP, templates made through the fake API server.
async fn cluster(refuse: Option<(u16, &'static str)>) -> Cluster {
    cluster_marking(refuse, Marker::None).await
}

/// [`cluster`] with the webhook leaving `marker` on mutated pods.
#[expect(clippy::too_many_lines, reason = "one cluster, set up in order")]
async fn cluster_marking(refuse: Option<(u16, &'static str)>, marker: Marker) -> Cluster {
    let dir = gpuwarden_test_support::scratch("kubernetes");
    mint::mint_into(
        dir.path(),
        &[],
        &["localhost".to_owned(), "127.0.0.1".to_owned()],
        1,
    )
    .expect("mints");
    let tls = ServerTlsFiles::minted(dir.path());
    let controller = server::open(
        &server::sled_in(dir.path()),
        SchedulerConfig::default(),
        Timing::default(),
    )
    .await
    .expect("opens");
    controller
        .apply(|s| {
            s.register(NodeReport::with_gpus("a", 1, 80 * GIB, 1), &[])
                .expect("registers");
            s.register(NodeReport::with_gpus("b", 1, 80 * GIB, 1), &[])
                .expect("registers");
            s.register(NodeReport::with_gpus("full", 1, 40 * GIB, 1), &[])
                .expect("registers");
            let start = |s: &mut gpuwarden_controller::scheduler::Scheduler,
                         id: &str,
                         class: &str,
                         node: &str,
                         shares: &str| {
                s.create(NewSession {
                    id: id.into(),
                    owner: "u".into(),
                    class: class.into(),
                    pinned_node: Some(node.into()),
                    requested: ResourceSlot::parse_any(&[&format!("cuda.shares={shares}")])
                        .expect("parses"),
                    ..NewSession::default()
                })
                .expect("creates");
                s.pass();
                assert_eq!(s.sessions()[id].node.as_deref(), Some(node), "{id} placed");
                s.ack(node, id);
            };
            // `train` learns that it keeps a GPU busy (90 %) from one finished run.
            start(s, "teach", "train", "a", "0.1");
            for _ in 0..5 {
                assert!(s.record_usage(
                    "a",
                    "teach",
                    UsageSample {
                        utilization: 0.9,
                        ..UsageSample::default()
                    }
                ));
            }
            s.terminate("teach");
            start(s, "busy", "train", "a", "0.3");
            start(s, "filler", "other", "full", "0.9");
        })
        .await
        .expect("persists");
    let (api, api_calls) = fake_api_server(&tls, refuse).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "test-token\n").expect("writes");
    // The minted serving certificate names localhost; the client trusts the minted CA.
    let templates = ApiServer::new(
        &format!("https://localhost:{}", api.port()),
        Some(&dir.path().join(mint::CA_CERT)),
        Some(token),
    )
    .expect("an API server");
    let hooks = Arc::new(Hooks {
        controller: Arc::clone(&controller),
        templates: Arc::new(templates),
        bounds: Bounds::new(Limits::default()),
        marker,
    });
    let cert = Arc::new(ServingCert::load(tls.cert.clone(), tls.key.clone()).expect("loads"));
    let webhook_listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let webhook = webhook_listener.local_addr().expect("bound");
    tokio::spawn(serve_webhook(
        webhook_listener,
        cert,
        Arc::clone(&hooks),
        std::future::pending(),
    ));
    let extender_listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let extender = extender_listener.local_addr().expect("bound");
    tokio::spawn(serve_extender(
        extender_listener,
        hooks,
        std::future::pending(),
    ));
    Cluster {
        ca: dir.path().join(mint::CA_CERT),
        _dir: dir,
        controller,
        webhook,
        extender,
        api_calls,
    }
}

// ---- fixtures --------------------------------------------------------------------------------

/// A pod as the API server hands it to a webhook at CREATE: containers `train` (asking
/// `shares`, `memory` and a CPU) and `sidecar` (nothing of gpuwarden).
fn pod(shares: Option<&str>, memory: Option<&str>) -> Value {
    let mut limits = json!({"cpu": "2", "memory": "4Gi"});
    if let Some(s) = shares {
        limits["gpuwarden.io/gpu-shares"] = json!(s);
    }
    if let Some(m) = memory {
        limits["gpuwarden.io/gpu-memory"] = json!(m);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "trainer-7c9d8f6b5-",
            "namespace": "ml",
            "labels": {"app": "trainer", "pod-template-hash": "7c9d8f6b5"},
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "trainer-7c9d8f6b5",
                "uid": "4b1e2a56-0c3f-4f49-9f0b-0e3c1b6a7d11", "controller": true,
                "blockOwnerDeletion": true
            }]
        },
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": "registry.example/train:1.0",
                    "resources": {"limits": limits, "requests": {"cpu": "2", "memory": "4Gi"}},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent"
                },
                {
                    "name": "sidecar",
                    "image": "registry.example/log:1.0",
                    "resources": {},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent"
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority"
        },
        "status": {}
    })
}

/// An `AdmissionReview` for `object` (kind `kind` in `group`), as the API server sends it.
fn review_of(group: &str, kind: &str, resource: &str, object: &Value, dry_run: bool) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": group, "version": "v1", "kind": kind},
            "resource": {"group": group, "version": "v1", "resource": resource},
            "requestKind": {"group": group, "version": "v1", "kind": kind},
            "requestResource": {"group": group, "version": "v1", "resource": resource},
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "0b6d3a5c-1f2e-4d7a-8c9b-2a1e3f4d5c6b",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]
            },
            "object": object,
            "oldObject": null,
            "dryRun": dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

fn pod_review(object: &Value) -> Value {
    review_of("", "Pod", "pods", object, false)
}

/// The webhook's answer to `review`: its `response`.
async fn admit(c: &Cluster, review: &Value) -> Value {
    let (status, body) = post_tls(
        c.webhook,
        &c.ca,
        "/mutate",
        &serde_json::to_vec(review).expect("JSON"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let answer: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(
        answer["response"]["uid"], review["request"]["uid"],
        "the uid comes back"
    );
    answer["response"].clone()
}

/// Applies an RFC 6902 patch of `add` and `remove` operations (all the webhook sends).
fn apply_patch(doc: &mut Value, ops: &Value) {
    for op in ops.as_array().expect("a patch is an array") {
        let path = op["path"].as_str().expect("a path");
        let (parent, token) = path.rsplit_once('/').expect("a pointer");
        let key = token.replace("~1", "/").replace("~0", "~");
        let target = doc
            .pointer_mut(parent)
            .unwrap_or_else(|| panic!("{parent} exists"));
        match (op["op"].as_str().expect("an op"), target) {
            ("add", Value::Array(items)) if key == "-" => items.push(op["value"].clone()),
            ("add", Value::Object(map)) => {
                map.insert(key, op["value"].clone());
            }
            ("remove", Value::Object(map)) => {
                assert!(map.remove(&key).is_some(), "remove {path}: absent");
            }
            (other, target) => panic!("unexpected {other} at {path} on {target}"),
        }
    }
}

fn decoded_patch(response: &Value) -> Value {
    assert_eq!(response["patchType"], "JSONPatch");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().expect("a patch"))
        .expect("base64");
    serde_json::from_slice(&bytes).expect("JSON")
}

// ---- the webhook -----------------------------------------------------------------------------

#[tokio::test]
async fn a_pod_asking_half_a_gpu_and_8gi_is_turned_into_a_claim() {
    let c = cluster(None).await;
    let original = pod(Some("500m"), Some("8Gi"));
    let response = admit(&c, &pod_review(&original)).await;
    assert_eq!(response["allowed"], true, "{response}");
    let mut mutated = original.clone();
    apply_patch(&mut mutated, &decoded_patch(&response));

    let mut expected = original.clone();
    expected["spec"]["containers"][0]["resources"] = json!({
        "limits": {"cpu": "2", "memory": "4Gi"},
        "requests": {"cpu": "2", "memory": "4Gi"},
        "claims": [{"name": "gpuwarden-gpu"}]
    });
    expected["spec"]["resourceClaims"] =
        json!([{"name": "gpuwarden-gpu", "resourceClaimTemplateName": "gpuwarden-500m-8gi"}]);
    expected["metadata"]["annotations"] = json!({
        "gpuwarden.io/gpu-shares": "0.5",
        "gpuwarden.io/gpu-memory": (8 * GIB).to_string()
    });
    assert_eq!(
        mutated, expected,
        "the sidecar and every other field untouched"
    );

    // The template went to the API server once, in the pod's namespace, with the token.
    let calls = c.api_calls.lock().expect("lock").clone();
    assert_eq!(calls.len(), 1);
    let (method, path, auth, template) = &calls[0];
    assert_eq!(method, "POST");
    assert_eq!(
        path,
        "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaimtemplates"
    );
    assert_eq!(auth, "Bearer test-token");
    assert_eq!(
        template,
        &json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": "gpuwarden-500m-8gi",
                "namespace": "ml",
                "labels": {"app.kubernetes.io/managed-by": "gpuwarden"}
            },
            "spec": {"spec": {"devices": {"requests": [{
                "name": "gpu",
                "exactly": {
                    "deviceClassName": "gpu.gpuwarden.io",
                    "capacity": {"requests": {"milli": "500", "memory": "8Gi"}}
                }
            }]}}}
        })
    );

    // The next pod of the same size finds the template there (409) and is patched the same.
    let again = admit(&c, &pod_review(&original)).await;
    assert_eq!(again["allowed"], true);
    assert_eq!(decoded_patch(&again), decoded_patch(&response));
    assert_eq!(c.api_calls.lock().expect("lock").len(), 2);

    // A dry run is patched but makes nothing.
    let dry = admit(
        &c,
        &review_of("", "Pod", "pods", &pod(Some("0.25"), None), true),
    )
    .await;
    assert_eq!(dry["allowed"], true);
    // Compute only: memory in proportion to the smallest GPU known (40 GiB, node `full`).
    assert!(
        decoded_patch(&dry)
            .to_string()
            .contains("gpuwarden-250m-10gi")
    );
    assert_eq!(
        c.api_calls.lock().expect("lock").len(),
        2,
        "nothing made on a dry run"
    );
}

/// [`pod`] asking `gpuwarden.io/gpu-milli: <milli>` and 8 GiB, limit and request alike (what
/// the API server requires of an extended resource in any workload's pod template).
fn milli_pod(milli: &str) -> Value {
    let mut p = pod(None, Some("8Gi"));
    let resources = &mut p["spec"]["containers"][0]["resources"];
    resources["limits"]["gpuwarden.io/gpu-milli"] = json!(milli);
    resources["requests"]["gpuwarden.io/gpu-milli"] = json!(milli);
    resources["requests"]["gpuwarden.io/gpu-memory"] = json!("8Gi");
    p
}

#[tokio::test]
async fn a_pod_asking_500_milli_gets_the_same_claim_as_half() {
    let c = cluster(None).await;
    let original = milli_pod("500");
    let response = admit(&c, &pod_review(&original)).await;
    assert_eq!(response["allowed"], true, "{response}");
    let mut mutated = original.clone();
    apply_patch(&mut mutated, &decoded_patch(&response));
    assert_eq!(
        mutated["spec"]["containers"][0]["resources"],
        json!({
            "limits": {"cpu": "2", "memory": "4Gi"},
            "requests": {"cpu": "2", "memory": "4Gi"},
            "claims": [{"name": "gpuwarden-gpu"}]
        }),
        "limits and requests of both names removed"
    );
    assert_eq!(
        mutated["spec"]["resourceClaims"],
        json!([{"name": "gpuwarden-gpu", "resourceClaimTemplateName": "gpuwarden-500m-8gi"}])
    );
    let half = admit(&c, &pod_review(&pod(Some("0.5"), Some("8Gi")))).await;
    assert_eq!(
        mutated["metadata"]["annotations"],
        json!({"gpuwarden.io/gpu-shares": "0.5", "gpuwarden.io/gpu-memory": (8 * GIB).to_string()})
    );
    assert!(
        decoded_patch(&half)
            .to_string()
            .contains("gpuwarden-500m-8gi")
    );
}

#[tokio::test]
async fn with_the_extender_marker_gpu_milli_stays_for_managed_resources() {
    let c = cluster_marking(None, Marker::ExtenderMarker).await;
    for (original, milli) in [
        (pod(Some("0.25"), Some("8Gi")), "250"),
        (milli_pod("500"), "500"),
    ] {
        let response = admit(&c, &pod_review(&original)).await;
        assert_eq!(response["allowed"], true, "{response}");
        let mut mutated = original.clone();
        apply_patch(&mut mutated, &decoded_patch(&response));
        // A whole number as limit and request: valid in any pod (extended resources must be
        // integers, the request equal to the limit), and what `managedResources` matches.
        assert_eq!(
            mutated["spec"]["containers"][0]["resources"],
            json!({
                "limits": {"cpu": "2", "memory": "4Gi", "gpuwarden.io/gpu-milli": milli},
                "requests": {"cpu": "2", "memory": "4Gi", "gpuwarden.io/gpu-milli": milli},
                "claims": [{"name": "gpuwarden-gpu"}]
            })
        );
        assert_eq!(
            mutated["spec"]["containers"][1]["resources"],
            json!({}),
            "the sidecar asks nothing and gets no marker"
        );
    }
}

#[tokio::test]
async fn the_gpus_offered_to_kubernetes_size_and_bound_the_ask() {
    let c = cluster(None).await;
    // A node whose one 16 GiB GPU is offered to Kubernetes: from now on the webhook goes by the
    // Kubernetes GPUs (the 80 and 40 GiB ones are the controller's).
    c.controller
        .apply(|s| {
            let mut report = NodeReport::with_gpus("k8s", 1, 16 * GIB, 1);
            report.kubernetes_devices = std::mem::take(&mut report.devices);
            s.register(report, &[]).expect("registers");
        })
        .await
        .expect("persists");
    let response = admit(&c, &pod_review(&pod(Some("0.25"), None))).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(
        decoded_patch(&response)
            .to_string()
            .contains("gpuwarden-250m-4gi"),
        "a quarter of 16 GiB"
    );
    let response = admit(&c, &pod_review(&pod(None, Some("32Gi")))).await;
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .expect("a message")
            .contains("the largest: 17179869184 bytes"),
        "{response}"
    );
}

#[tokio::test]
async fn existing_claims_and_annotations_are_appended_to() {
    let c = cluster(None).await;
    let mut original = pod(Some("0.25"), None);
    original["metadata"]["annotations"] = json!({"team": "vision"});
    original["spec"]["resourceClaims"] = json!([{"name": "scratch", "resourceClaimName": "nvme"}]);
    original["spec"]["containers"][0]["resources"]["claims"] = json!([{"name": "scratch"}]);
    let response = admit(&c, &pod_review(&original)).await;
    assert_eq!(response["allowed"], true, "{response}");
    let mut mutated = original.clone();
    apply_patch(&mut mutated, &decoded_patch(&response));
    assert_eq!(
        mutated["spec"]["resourceClaims"],
        json!([{"name": "scratch", "resourceClaimName": "nvme"},
               {"name": "gpuwarden-gpu", "resourceClaimTemplateName": "gpuwarden-250m-10gi"}])
    );
    assert_eq!(
        mutated["spec"]["containers"][0]["resources"]["claims"],
        json!([{"name": "scratch"}, {"name": "gpuwarden-gpu"}])
    );
    assert_eq!(
        mutated["metadata"]["annotations"],
        json!({"team": "vision", "gpuwarden.io/gpu-shares": "0.25",
               "gpuwarden.io/gpu-memory": (10 * GIB).to_string()})
    );
}

#[tokio::test]
async fn refusals_say_why_and_make_nothing() {
    let c = cluster(None).await;
    let mut mismatched = pod(Some("0.5"), None);
    mismatched["spec"]["containers"][1]["resources"] =
        json!({"limits": {"gpuwarden.io/gpu-shares": "250m"}});
    let mut taken = pod(Some("0.5"), None);
    taken["spec"]["resourceClaims"] =
        json!([{"name": "gpuwarden-gpu", "resourceClaimName": "mine"}]);
    let mut both = pod(Some("0.5"), None);
    both["spec"]["containers"][0]["resources"]["limits"]["gpuwarden.io/gpu-milli"] = json!("500");
    let cases: [(Value, &str); 13] = [
        (milli_pod("1500"), "is more than one GPU"),
        (milli_pod("2500m"), "is not a whole number of thousandths"),
        (
            pod(Some("0.0005"), None),
            "is finer than a thousandth of a GPU",
        ),
        (both, "not both"),
        (pod(Some("1500m"), None), "is more than one GPU"),
        (pod(Some("2"), Some("8Gi")), "is more than one GPU"),
        (pod(Some("0"), None), "must be above 0"),
        (pod(Some("-500m"), None), "must be above 0"),
        (pod(Some("half"), None), "is not a Kubernetes quantity"),
        (
            pod(None, Some("96Gi")),
            "is more than any GPU has (the largest: 85899345920 bytes)",
        ),
        (
            pod(Some("0.333"), None),
            "not a multiple of the share quantum 0.01",
        ),
        (mismatched, "ask for different GPU parts"),
        (
            taken,
            "already has a resource claim named \"gpuwarden-gpu\"",
        ),
    ];
    for (object, why) in cases {
        let response = admit(&c, &pod_review(&object)).await;
        assert_eq!(response["allowed"], false, "{object}");
        let message = response["status"]["message"].as_str().expect("a message");
        assert!(message.contains(why), "{message:?} should say {why:?}");
        assert!(response.get("patch").is_none());
    }
    assert!(
        c.api_calls.lock().expect("lock").is_empty(),
        "nothing made for refused pods"
    );
}

#[tokio::test]
async fn pods_without_the_limits_and_other_operations_are_untouched() {
    let c = cluster(None).await;
    for review in [pod_review(&pod(None, None)), {
        let mut update = pod_review(&pod(Some("0.5"), None));
        update["request"]["operation"] = json!("UPDATE");
        update
    }] {
        let response = admit(&c, &review).await;
        assert_eq!(response["allowed"], true);
        assert!(
            response.get("patch").is_none() && response.get("patchType").is_none(),
            "{response}"
        );
    }
    assert!(c.api_calls.lock().expect("lock").is_empty());
}

#[tokio::test]
async fn non_pods_and_malformed_reviews_are_clear_errors() {
    let c = cluster(None).await;
    let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}});
    let response = admit(&c, &review_of("", "Service", "services", &service, false)).await;
    assert_eq!(response["allowed"], false);
    assert!(
        response["status"]["message"]
            .as_str()
            .expect("a message")
            .contains("only mutates Pods (got v1/Service)"),
        "{response}"
    );
    for (body, why) in [
        (b"not json".to_vec(), "not JSON"),
        (br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"x"}}"#.to_vec(), "expected an admission.k8s.io/v1 AdmissionReview"),
        (br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(), "no request with a uid"),
    ] {
        let (status, answer) = post_tls(c.webhook, &c.ca, "/mutate", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.contains(why), "{answer:?} should say {why:?}");
    }
    // The admission path is not on the plain-HTTP listener.
    let (status, _) = post_plain(c.extender, "/mutate", b"{}").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// A workload of `kind` whose pod template is [`pod`]'s spec with `limits` on `train`.
fn workload(group: &str, kind: &str, limits: &Value) -> Value {
    let mut spec = pod(None, None)["spec"].clone();
    spec["containers"][0]["resources"]["limits"] = limits.clone();
    let template = json!({"metadata": {"labels": {"app": "trainer"}}, "spec": spec});
    let body = if kind == "CronJob" {
        json!({"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": template}}})
    } else {
        json!({"selector": {"matchLabels": {"app": "trainer"}}, "template": template})
    };
    json!({"apiVersion": format!("{group}/v1"), "kind": kind,
           "metadata": {"name": "trainer", "namespace": "ml"}, "spec": body})
}

#[tokio::test]
async fn a_fraction_in_a_workload_is_refused_saying_what_to_write() {
    let c = cluster(None).await;
    for (group, kind, resource) in [
        ("apps", "Deployment", "deployments"),
        ("apps", "StatefulSet", "statefulsets"),
        ("batch", "Job", "jobs"),
        ("batch", "CronJob", "cronjobs"),
    ] {
        // The API server would refuse `500m` next ("must be an integer"); the webhook runs
        // first (mutating admission precedes validation) and says what to write.
        let half = workload(group, kind, &json!({"gpuwarden.io/gpu-shares": "500m"}));
        let response = admit(&c, &review_of(group, kind, resource, &half, false)).await;
        assert_eq!(response["allowed"], false, "{kind}: {response}");
        let message = response["status"]["message"].as_str().expect("a message");
        assert!(
            message.contains(&format!("this {kind}'s pod template"))
                && message.contains("write gpuwarden.io/gpu-milli: 500 instead"),
            "{message}"
        );
        // Whole numbers pass untouched: the Pods it makes are mutated one by one.
        let whole = workload(
            group,
            kind,
            &json!({"gpuwarden.io/gpu-milli": 500, "gpuwarden.io/gpu-memory": "8Gi"}),
        );
        let response = admit(&c, &review_of(group, kind, resource, &whole, false)).await;
        assert_eq!(response["allowed"], true, "{kind}: {response}");
        assert!(response.get("patch").is_none());
    }
    let fractional_memory = workload(
        "apps",
        "Deployment",
        &json!({"gpuwarden.io/gpu-memory": "1.5"}),
    );
    let response = admit(
        &c,
        &review_of(
            "apps",
            "Deployment",
            "deployments",
            &fractional_memory,
            false,
        ),
    )
    .await;
    assert!(
        response["status"]["message"]
            .as_str()
            .expect("a message")
            .contains("give a whole number of bytes"),
        "{response}"
    );
    assert!(c.api_calls.lock().expect("lock").is_empty(), "nothing made");
}

#[tokio::test]
async fn an_api_server_refusal_refuses_the_pod_with_its_message() {
    let c = cluster(Some((403, "resourceclaimtemplates.resource.k8s.io is forbidden: User \"system:serviceaccount:gpuwarden:gpuwarden-controller\" cannot create resource"))).await;
    let response = admit(&c, &pod_review(&pod(Some("0.5"), Some("8Gi")))).await;
    assert_eq!(response["allowed"], false);
    let message = response["status"]["message"].as_str().expect("a message");
    assert!(
        message.contains("could not make ResourceClaimTemplate ml/gpuwarden-500m-8gi"),
        "{message}"
    );
    assert!(
        message.contains("403") && message.contains("cannot create resource"),
        "{message}"
    );
}

// ---- the extender ----------------------------------------------------------------------------

/// `ExtenderArgs` as kube-scheduler marshals them with `nodeCacheCapable: true`.
fn args_with_names(pod: &Value, names: &[&str]) -> Value {
    json!({"Pod": pod, "Nodes": null, "NodeNames": names})
}

/// The pod after the webhook: its ask in annotations, its class from a label or its owner.
fn admitted_pod(class: Option<&str>) -> Value {
    let mut p = pod(None, None);
    p["metadata"]["name"] = json!("trainer-7c9d8f6b5-x2x9q");
    p["metadata"]["annotations"] = json!({"gpuwarden.io/gpu-shares": "0.5"});
    if let Some(class) = class {
        p["metadata"]["labels"]["gpuwarden.io/class"] = json!(class);
    }
    p["spec"]["resourceClaims"] =
        json!([{"name": "gpuwarden-gpu", "resourceClaimTemplateName": "gpuwarden-500m-20gi"}]);
    p
}

async fn extend(c: &Cluster, verb: &str, args: &Value) -> Value {
    let (status, body) = post_plain(
        c.extender,
        &format!("/extender/{verb}"),
        &serde_json::to_vec(args).expect("JSON"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).expect("JSON")
}

fn scores(list: &Value) -> BTreeMap<String, i64> {
    list.as_array()
        .expect("a HostPriorityList")
        .iter()
        .map(|h| {
            (
                h["Host"].as_str().expect("Host").to_owned(),
                h["Score"].as_i64().expect("Score"),
            )
        })
        .collect()
}

#[tokio::test]
async fn prioritize_keeps_a_busy_class_away_from_a_busy_node() {
    let c = cluster(None).await;
    let nodes = ["a", "b", "full", "ghost"];
    let busy = scores(
        &extend(
            &c,
            "prioritize",
            &args_with_names(&admitted_pod(Some("train")), &nodes),
        )
        .await,
    );
    assert!(
        busy["b"] > busy["a"],
        "idle b above a, which runs a busy train tenant: {busy:?}"
    );
    assert_eq!(busy["b"], 10);
    assert_eq!(busy["full"], 0, "0.1 free can't hold 0.5");
    assert_eq!(busy["ghost"], 0, "no agent");
    assert!(busy.values().all(|s| (0..=10).contains(s)));

    // Without the label the class is the Deployment's name (the ReplicaSet's less its hash),
    // which has no profile yet: it is scored from the prior, and still fits only a and b.
    let owned = scores(
        &extend(
            &c,
            "prioritize",
            &args_with_names(&admitted_pod(None), &nodes),
        )
        .await,
    );
    assert!(
        owned["a"] > 0 && owned["b"] > 0 && owned["full"] == 0 && owned["ghost"] == 0,
        "{owned:?}"
    );

    // A pod that asks nothing of gpuwarden: neutral everywhere.
    let neutral =
        scores(&extend(&c, "prioritize", &args_with_names(&pod(None, None), &nodes)).await);
    assert_eq!(neutral.values().copied().collect::<Vec<_>>(), [0, 0, 0, 0]);
    // The same scorer as sessions: the controller's own placement of a `train` session also
    // picks b.
    let placed = c
        .controller
        .apply(|s| {
            s.create(NewSession {
                id: "probe".into(),
                owner: "u".into(),
                class: "train".into(),
                placement: Some(gpuwarden_controller::placement::Placement::InterferenceAware),
                requested: ResourceSlot::parse_any(&["cuda.shares=0.5"]).expect("parses"),
                ..NewSession::default()
            })
            .expect("creates");
            s.pass();
            s.sessions()["probe"].node.clone()
        })
        .await
        .expect("persists");
    assert_eq!(placed.as_deref(), Some("b"));
}

#[tokio::test]
async fn filter_drops_nodes_that_cannot_hold_the_ask() {
    let c = cluster(None).await;
    let result = extend(
        &c,
        "filter",
        &args_with_names(&admitted_pod(Some("train")), &["a", "b", "full", "ghost"]),
    )
    .await;
    assert_eq!(result["NodeNames"], json!(["a", "b"]));
    assert_eq!(result["Nodes"], Value::Null);
    assert!(
        result["FailedNodes"]["full"]
            .as_str()
            .expect("why")
            .contains("no GPU here can hold shares 0.5")
    );
    assert!(
        result["FailedAndUnresolvableNodes"]["ghost"]
            .as_str()
            .expect("why")
            .contains("no gpuwarden agent")
    );
    assert_eq!(result["Error"], "");

    // Not node-cache capable: a NodeList in, the passing NodeList out.
    let node = |name: &str| json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}, "spec": {}, "status": {}});
    let list = json!({"Pod": admitted_pod(Some("train")), "Nodes": {"metadata": {}, "items": [node("a"), node("full")]}, "NodeNames": null});
    let result = extend(&c, "filter", &list).await;
    assert_eq!(result["Nodes"]["items"], json!([node("a")]));
    assert_eq!(result["NodeNames"], Value::Null);

    // Asking nothing: every node passes.
    let result = extend(
        &c,
        "filter",
        &args_with_names(&pod(None, None), &["a", "ghost"]),
    )
    .await;
    assert_eq!(result["NodeNames"], json!(["a", "ghost"]));
    assert_eq!(result["FailedNodes"], json!({}));

    // A malformed body is a 400 naming it.
    let (status, body) = post_plain(c.extender, "/extender/filter", b"{\"Pod\": 3").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&body).contains("no ExtenderArgs"));
}
