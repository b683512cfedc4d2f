use std::sync::{Arc, Mutex};

use super::*;

/// What the fake did, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Did {
    Exec(u32),
    Served,
}

/// Telemetry that logs what it is asked to do; each exec re-read waits for the test's leave, so
/// the test decides when event work ends.
struct Fake {
    log: Arc<Mutex<Vec<Did>>>,
    events: Arc<Mutex<u64>>,
    leave: std::sync::mpsc::Receiver<()>,
}

impl State for Fake {
    fn count_events(&mut self, n: u64) {
        *self.events.lock().unwrap() += n;
    }

    fn on_exec(&mut self, tgid: u32) {
        self.leave.recv().unwrap();
        self.log.lock().unwrap().push(Did::Exec(tgid));
    }

    fn serve(&mut self, request: Request) {
        self.log.lock().unwrap().push(Did::Served);
        match request {
            Request::Counters(reply) => {
                let _ = reply.send(Counters::default());
            }
            Request::Snapshot { reply, .. } => {
                let _ = reply.send(Snapshot::default());
            }
            Request::Rescan(reply)
            | Request::CollectGarbage(reply)
            | Request::SweepFiles(reply) => {
                let _ = reply.send(());
            }
            Request::SetDevices { reply, .. } => {
                let _ = reply.send(DeviceNames::default());
            }
            Request::Settled(_) | Request::Stop => unreachable!("handled by the task"),
        }
    }
}

struct Rig {
    handle: TelemetryHandle,
    task: tokio::task::JoinHandle<()>,
    log: Arc<Mutex<Vec<Did>>>,
    events: Arc<Mutex<u64>>,
    leave: std::sync::mpsc::Sender<()>,
}

fn rig() -> Rig {
    let (leave, leave_rx) = std::sync::mpsc::channel();
    let log = Arc::default();
    let events = Arc::default();
    let (handle, task) = spawn_state(Fake {
        log: Arc::clone(&log),
        events: Arc::clone(&events),
        leave: leave_rx,
    });
    Rig {
        handle,
        task,
        log,
        events,
        leave,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_for_one_chunk_of_exec_work_not_for_the_storm() {
    let r = rig();
    r.handle.events(20, (1..=20).collect()).await.unwrap();
    // Ask while the first chunk is held: the request is queued at the future's first poll (the
    // channel is unbounded), before any of the chunk's execs may end. A spawned task might
    // not have run before the chunk ended, and the next chunk would then wait for leaves this
    // test sends only once it is answered.
    let mut asked = Box::pin({
        let handle = r.handle.clone();
        async move { handle.counters().await }
    });
    let mut answered = None;
    std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(answer) = std::future::Future::poll(asked.as_mut(), cx) {
            answered = Some(answer);
        }
        std::task::Poll::Ready(())
    })
    .await;
    for _ in 0..EXEC_CHUNK {
        r.leave.send(()).unwrap();
    }
    match answered {
        Some(answer) => answer,
        None => asked.await,
    }
    .unwrap();
    let log = r.log.lock().unwrap().clone();
    let before = log.iter().take_while(|d| **d != Did::Served).count();
    assert!(
        before <= EXEC_CHUNK,
        "the request waited for {before} re-reads: {log:?}"
    );
    // The rest of the storm, then settled.
    for _ in 0..20 {
        r.leave.send(()).unwrap();
    }
    r.handle.settled().await.unwrap();
    let log = r.log.lock().unwrap().clone();
    let execs: Vec<u32> = log
        .iter()
        .filter_map(|d| match d {
            Did::Exec(t) => Some(*t),
            Did::Served => None,
        })
        .collect();
    assert_eq!(execs, (1..=20).collect::<Vec<_>>(), "in order, each once");
    assert_eq!(*r.events.lock().unwrap(), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_waits_for_every_event_handed_over_and_stop_ends_the_task() {
    let r = rig();
    for batch in 0..3 {
        r.handle
            .events(5, vec![batch * 2 + 1, batch * 2 + 2])
            .await
            .unwrap();
    }
    let settled = tokio::spawn({
        let handle = r.handle.clone();
        async move { handle.settled().await }
    });
    for _ in 0..6 {
        r.leave.send(()).unwrap();
    }
    settled.await.unwrap().unwrap();
    assert_eq!(r.log.lock().unwrap().len(), 6);
    assert_eq!(*r.events.lock().unwrap(), 15);
    r.handle.stop();
    r.task.await.unwrap();
    assert!(matches!(r.handle.counters().await, Err(Stopped)));
}
