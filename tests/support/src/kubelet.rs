//! A fake kubelet on loopback: answers every request with the current pod list (`GET /pods`),
//! recording each request's head; and the pod lists and kubepods cgroups tests give it.
#![expect(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "test helpers: a failed set-up step should fail the test where it happened"
)]

use std::{
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use crate::TestCgroup;

/// A fake kubelet: answers every request with the current pod list, recording each request's
/// head. Stopped when dropped.
pub struct FakeKubelet {
    addr: SocketAddr,
    body: Arc<Mutex<String>>,
    requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeKubelet {
    /// Serves `body` on a loopback port.
    #[must_use]
    pub fn start(body: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let body = Arc::new(Mutex::new(body));
        let thread = std::thread::spawn({
            let (requests, stop, body) =
                (Arc::clone(&requests), Arc::clone(&stop), Arc::clone(&body));
            move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    let head = read_head(&stream);
                    requests.lock().unwrap().push(head);
                    let body = body.lock().unwrap().clone();
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = (&stream).write_all(response.as_bytes());
                }
            }
        });
        Self {
            addr,
            body,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    /// The URL of its pod list.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}/pods", self.addr)
    }

    /// Serves `body` from now on.
    pub fn serve(&self, body: String) {
        *self.body.lock().unwrap() = body;
    }

    /// The head of each request it got, in order.
    #[must_use]
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_head(stream: &TcpStream) -> String {
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if line == "\r\n" => break,
            Ok(_) => head.push_str(&line),
        }
    }
    head
}

/// A pod list of a `kube-system` pod and the pod `namespace/name` with UID `uid`, as the kubelet
/// serves it.
#[must_use]
pub fn pod_list(uid: &str, name: &str, namespace: &str) -> String {
    format!(
        r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{}},"items":[
            {{"metadata":{{"name":"other","namespace":"kube-system","uid":"00000000-0000-0000-0000-000000000000"}},"spec":{{}},"status":{{"phase":"Running"}}}},
            {{"metadata":{{"name":"{name}","namespace":"{namespace}","uid":"{uid}","labels":{{"app":"train"}}}},"spec":{{"containers":[{{"name":"main","image":"x"}}]}},"status":{{"phase":"Running"}}}}
        ]}}"#
    )
}

/// A container cgroup of a pod, in the systemd driver's kubepods layout (containerd).
#[must_use]
pub fn pod_cgroup(uid: &str, id: &str) -> TestCgroup {
    TestCgroup::create(&format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{id}.scope",
        uid.replace('-', "_")
    ))
}
