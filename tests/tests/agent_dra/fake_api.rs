//! A fake Kubernetes API server on loopback (hyper, plain HTTP): it serves ResourceClaims as the
//! `resource.k8s.io/v1` API returns them, Pods and Nodes (`v1`), and keeps the ResourceSlices
//! written to it (as an API server with the DRA gates on or off stores them), recording every
//! request.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::{
    Request, Response,
    body::{Bytes, Frame},
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::{StreamExt as _, wrappers::UnboundedReceiverStream};

/// One request as the fake saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub authorization: Option<String>,
    pub body: Option<Value>,
}

#[derive(Default)]
struct State {
    claims: BTreeMap<String, Value>,
    pods: BTreeMap<String, Value>,
    slices: BTreeMap<String, Value>,
    nodes: BTreeMap<String, Value>,
    /// Plays kube-apiserver with the `DRAConsumableCapacity` gate off: slices are stored without
    /// `allowMultipleAllocations` and the capacities' `requestPolicy`, as
    /// `pkg/registry/resource/resourceslice/strategy.go` (`dropDisabledFields`) drops them.
    gate_off: bool,
    /// Plays kube-apiserver with `DRADeviceTaints` off: devices are stored without `taints`.
    taints_off: bool,
    /// Plays kube-apiserver with `DRAPartitionableDevices` off: slices are stored without
    /// `sharedCounters` and `perDeviceNodeSelection`, devices without `consumesCounters`
    /// (`dropDisabledDRAPartitionableDevicesFields`).
    partitions_off: bool,
    /// The `/version` answer's `gitVersion` (default `v1.36.0`).
    version: Option<String>,
    /// Open watches on ResourceSlices: each gets every slice event, one JSON line each.
    watchers: Vec<mpsc::UnboundedSender<Bytes>>,
    seen: Vec<Seen>,
    next_version: u64,
}

/// The fake API server, stopped when dropped.
pub struct FakeApi {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

const CLAIMS: &str = "/apis/resource.k8s.io/v1/namespaces/";
const PODS: &str = "/api/v1/namespaces/";
const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";
const NODES: &str = "/api/v1/nodes/";

/// What kube-apiserver keeps of a slice: with `DRAConsumableCapacity` off, no
/// `allowMultipleAllocations` nor `requestPolicy`; with `DRADeviceTaints` off, no `taints`
/// (`pkg/registry/resource/resourceslice/strategy.go`, `dropDisabledFields`).
fn as_stored(mut slice: Value, gate_off: bool, taints_off: bool, partitions_off: bool) -> Value {
    if partitions_off && let Some(spec) = slice["spec"].as_object_mut() {
        spec.remove("sharedCounters");
        spec.remove("perDeviceNodeSelection");
    }
    for device in slice["spec"]["devices"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        if taints_off && let Some(d) = device.as_object_mut() {
            d.remove("taints");
        }
        if partitions_off && let Some(d) = device.as_object_mut() {
            d.remove("consumesCounters");
        }
        if !gate_off {
            continue;
        }
        if let Some(d) = device.as_object_mut() {
            d.remove("allowMultipleAllocations");
        }
        for capacity in device["capacity"]
            .as_object_mut()
            .into_iter()
            .flat_map(|c| c.values_mut())
        {
            if let Some(c) = capacity.as_object_mut() {
                c.remove("requestPolicy");
            }
        }
    }
    slice
}

impl FakeApi {
    /// Serves on a free loopback port of `rt`.
    /// [`Self::start`] on `rt`, with the node `name` (`uid`) already there, as the kubelet
    /// registers it before any driver runs.
    pub fn with_node(rt: &tokio::runtime::Runtime, name: &str, uid: &str) -> Self {
        let api = Self::start(rt);
        api.put_node(name, uid);
        api
    }

    pub fn start(rt: &tokio::runtime::Runtime) -> Self {
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        let task = rt.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let state = Arc::clone(&shared);
                tokio::spawn(async move {
                    let service = service_fn(move |req| serve(Arc::clone(&state), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        Self { addr, state, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Serves `claim` (its namespace and name from its metadata).
    pub fn put_claim(&self, claim: Value) {
        let key = format!(
            "{}/{}",
            claim["metadata"]["namespace"].as_str().unwrap(),
            claim["metadata"]["name"].as_str().unwrap()
        );
        self.state.lock().unwrap().claims.insert(key, claim);
    }

    /// Serves `pod` (its namespace and name from its metadata).
    pub fn put_pod(&self, pod: Value) {
        let key = format!(
            "{}/{}",
            pod["metadata"]["namespace"].as_str().unwrap(),
            pod["metadata"]["name"].as_str().unwrap()
        );
        self.state.lock().unwrap().pods.insert(key, pod);
    }

    /// Serves the Node `name` with `uid`.
    pub fn put_node(&self, name: &str, uid: &str) {
        self.state.lock().unwrap().nodes.insert(
            name.to_owned(),
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": name, "uid": uid, "resourceVersion": "1"}}),
        );
    }

    /// What the kubelet does when it starts (`pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go`
    /// wipes the node's slices): deletes every ResourceSlice of `node`; how many there were.
    pub fn kubelet_starts(&self, node: &str) -> usize {
        let mut s = self.state.lock().unwrap();
        let gone: Vec<String> = s
            .slices
            .iter()
            .filter(|(_, slice)| slice["spec"]["nodeName"] == json!(node))
            .map(|(name, _)| name.clone())
            .collect();
        for name in &gone {
            let slice = s.slices.remove(name).unwrap();
            s.event("DELETED", &slice);
        }
        gone.len()
    }

    /// The number of watches on ResourceSlices open now.
    pub fn slice_watches(&self) -> usize {
        let mut s = self.state.lock().unwrap();
        s.watchers.retain(|w| !w.is_closed());
        s.watchers.len()
    }

    /// Turns the `DRAConsumableCapacity` gate off (or on) for what is written from now on.
    pub fn set_gate_off(&self, off: bool) {
        self.state.lock().unwrap().gate_off = off;
    }

    /// Turns the `DRADeviceTaints` gate off (or on) for what is written from now on.
    pub fn set_partitions_off(&self, off: bool) {
        self.state.lock().unwrap().partitions_off = off;
    }

    pub fn set_version(&self, git_version: &str) {
        self.state.lock().unwrap().version = Some(git_version.to_owned());
    }

    pub fn set_taints_off(&self, off: bool) {
        self.state.lock().unwrap().taints_off = off;
    }

    /// Changes the slice `name` in place, as the API server or someone else might.
    pub fn edit_slice(&self, name: &str, change: impl FnOnce(&mut Value)) {
        let mut s = self.state.lock().unwrap();
        change(s.slices.get_mut(name).unwrap());
        let slice = s.slices[name].clone();
        s.event("MODIFIED", &slice);
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// The ResourceSlices held, by name.
    pub fn slices(&self) -> BTreeMap<String, Value> {
        self.state.lock().unwrap().slices.clone()
    }

    /// How many times the ResourceSlice `name` was read (`GET …/resourceslices/<name>`; a
    /// watch is not counted), counted without copying what was seen.
    pub fn slice_reads(&self, name: &str) -> usize {
        let path = format!("{SLICES}/{name}");
        self.state
            .lock()
            .unwrap()
            .seen
            .iter()
            .filter(|s| s.method == "GET" && s.path == path)
            .count()
    }
}

impl State {
    /// Sends a watch event (`ADDED`, `MODIFIED`, `DELETED`) of `slice` to every open watch.
    fn event(&mut self, kind: &str, slice: &Value) {
        let line = Bytes::from(format!("{}\n", json!({"type": kind, "object": slice})));
        self.watchers.retain(|w| w.send(line.clone()).is_ok());
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn reply(status: u16, body: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// A `Status` object as the API server answers errors.
fn status(code: u16, reason: &str, message: &str) -> Response<Full<Bytes>> {
    reply(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code}),
    )
}

type Body = BoxBody<Bytes, Infallible>;

/// A watch on ResourceSlices (`?watch=true`, as `GET …/resourceslices?watch=true&fieldSelector=…`
/// opens one): the slices there now as `ADDED`, then each change, one JSON event a line, as
/// long as the client reads; any other request as [`answer`] answers it.
async fn serve(
    state: Arc<Mutex<State>>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, Infallible> {
    let watch = req.method() == hyper::Method::GET
        && req.uri().path() == SLICES
        && req.uri().query().is_some_and(|q| q.contains("watch=true"));
    if !watch {
        return answer(state, req).await.map(|r| r.map(BodyExt::boxed));
    }
    let (sender, receiver) = mpsc::unbounded_channel();
    {
        let mut s = state.lock().unwrap();
        for slice in s.slices.values() {
            let line = format!("{}\n", json!({"type": "ADDED", "object": slice}));
            sender.send(Bytes::from(line)).unwrap();
        }
        s.watchers.push(sender);
    }
    let stream = UnboundedReceiverStream::new(receiver).map(|b| Ok(Frame::data(b)));
    Ok(Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(StreamBody::new(stream).boxed())
        .unwrap())
}

async fn answer(
    state: Arc<Mutex<State>>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let authorization = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = req.into_body().collect().await.unwrap().to_bytes();
    let body: Option<Value> = (!bytes.is_empty()).then(|| serde_json::from_slice(&bytes).unwrap());
    let mut s = state.lock().unwrap();
    s.seen.push(Seen {
        method: method.clone(),
        path: path.clone(),
        authorization,
        body: body.clone(),
    });
    let response = if let Some(rest) = path.strip_prefix(CLAIMS) {
        // <ns>/resourceclaims/<name>
        let parts: Vec<&str> = rest.split('/').collect();
        match (method.as_str(), parts.as_slice()) {
            ("GET", [ns, "resourceclaims", name]) => match s.claims.get(&format!("{ns}/{name}")) {
                Some(claim) => reply(200, claim),
                None => status(
                    404,
                    "NotFound",
                    &format!("resourceclaims.resource.k8s.io \"{name}\" not found"),
                ),
            },
            _ => status(405, "MethodNotAllowed", "not served by the fake"),
        }
    } else if let Some(rest) = path.strip_prefix(PODS) {
        // <ns>/pods/<name>
        let parts: Vec<&str> = rest.split('/').collect();
        match (method.as_str(), parts.as_slice()) {
            ("GET", [ns, "pods", name]) => match s.pods.get(&format!("{ns}/{name}")) {
                Some(pod) => reply(200, pod),
                None => status(404, "NotFound", &format!("pods \"{name}\" not found")),
            },
            _ => status(405, "MethodNotAllowed", "not served by the fake"),
        }
    } else if let Some(name) = path.strip_prefix(NODES) {
        match (method.as_str(), s.nodes.get(name)) {
            ("GET", Some(node)) => reply(200, node),
            ("GET", None) => status(404, "NotFound", &format!("nodes \"{name}\" not found")),
            _ => status(405, "MethodNotAllowed", "not served by the fake"),
        }
    } else if let Some(rest) = path.strip_prefix(SLICES) {
        let (gate_off, taints_off, partitions_off) = (s.gate_off, s.taints_off, s.partitions_off);
        let body = body.map(|slice| as_stored(slice, gate_off, taints_off, partitions_off));
        let name = rest.trim_start_matches('/');
        s.next_version += 1;
        let version = s.next_version.to_string();
        match (method.as_str(), name, body) {
            ("GET", name, _) if !name.is_empty() => match s.slices.get(name) {
                Some(slice) => reply(200, slice),
                None => status(404, "NotFound", "not found"),
            },
            ("POST", "", Some(mut slice)) => {
                let name = slice["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                if let std::collections::btree_map::Entry::Vacant(entry) = s.slices.entry(name) {
                    slice["metadata"]["resourceVersion"] = json!(version);
                    entry.insert(slice.clone());
                    s.event("ADDED", &slice);
                    reply(201, &slice)
                } else {
                    status(409, "AlreadyExists", "already exists")
                }
            }
            ("PUT", name, Some(mut slice)) if !name.is_empty() => {
                let current = s
                    .slices
                    .get(name)
                    .map(|c| c["metadata"]["resourceVersion"].clone());
                if current.is_some()
                    && current != Some(slice["metadata"]["resourceVersion"].clone())
                {
                    status(409, "Conflict", "the object has been modified")
                } else {
                    slice["metadata"]["resourceVersion"] = json!(version);
                    s.slices.insert(name.to_owned(), slice.clone());
                    s.event("MODIFIED", &slice);
                    reply(200, &slice)
                }
            }
            ("DELETE", name, _) if !name.is_empty() => match s.slices.remove(name) {
                Some(slice) => {
                    s.event("DELETED", &slice);
                    reply(200, &slice)
                }
                None => status(404, "NotFound", "not found"),
            },
            _ => status(405, "MethodNotAllowed", "not served by the fake"),
        }
    } else {
        version(&s, &method, &path)
    };
    Ok(response)
}

/// `/version` (its `gitVersion` as set, `v1.36.0` by default); 404 for anything else.
fn version(s: &State, method: &str, path: &str) -> Response<Full<Bytes>> {
    if path == "/version" && method == "GET" {
        let git = s.version.clone().unwrap_or_else(|| "v1.36.0".to_owned());
        reply(200, &json!({ "gitVersion": git, "major": "1" }))
    } else {
        status(404, "NotFound", "not served by the fake")
    }
}

/// A runtime for the fake API server and the agent's clients in a test: two workers, as the
/// agent's own.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
