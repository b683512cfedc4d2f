//! The sensor's readers as one task behind a handle, as the enforcer is: the maps, the
//! attribution cache and the watched GPU nodes belong to the task; the event reader, map upkeep,
//! usage reports and snapshots send it requests and await the answers.
//!
//! Everything the task does reads `/proc`, cgroupfs or the BPF maps, so it runs on tokio's
//! blocking threads (`spawn_blocking`), never on a worker. Requests go before event work, and
//! the fds of processes that exec'd are re-read a few at a time, so a snapshot waits for at most
//! one such chunk, not for a whole storm of events.

use std::{
    collections::{BTreeMap, VecDeque},
    panic::AssertUnwindSafe,
    path::{Path, PathBuf},
};

use gpuwarden_agent_api::Snapshot;
use gpuwarden_agent_common::maps::GpuNode;
use tokio::sync::{mpsc, oneshot};

use super::snapshot;
use crate::{
    attribution::Attributor,
    enforcement::Standing,
    sensor::{
        Counters, Sensor,
        gpu_nodes::{DeviceNames, GpuNodeGlobs},
        upkeep::{self, Idle},
    },
};

/// Where process information lives.
const PROC_ROOT: &str = "/proc";

/// Processes that exec'd whose fds are re-read in one go, between requests: a request waits
/// for at most this many re-reads.
const EXEC_CHUNK: usize = 2;

/// Batches of kernel events queued for the task; the event reader waits beyond this (and the
/// ring buffer holds the rest, and the kernel drops and counts past it), as when the reader
/// waited on a lock.
const EVENT_BATCHES: usize = 4;

/// What the sensor's readers share: the maps, attribution and the watched nodes. Data flows one
/// way: the kernel fills the maps, this reads and tidies them.
pub(crate) struct Telemetry {
    /// The sensor (its telemetry maps).
    sensor: Sensor,
    /// cgroup id → workload.
    attributor: Attributor,
    /// The GPU device-node globs watched.
    globs: GpuNodeGlobs,
    /// The GPU device nodes watched.
    nodes: BTreeMap<PathBuf, GpuNode>,
    /// Events read from the ring buffer.
    events_received: u64,
    /// When each idle cgroup's counters last changed (map upkeep ages them out).
    idle: Idle,
}

impl Telemetry {
    /// The state of `sensor`'s readers, with the GPU device nodes that match `globs` scanned once.
    pub(crate) fn new(sensor: Sensor, attributor: Attributor, globs: GpuNodeGlobs) -> Self {
        let mut telemetry = Self {
            sensor,
            attributor,
            globs,
            nodes: BTreeMap::new(),
            events_received: 0,
            idle: Idle::default(),
        };
        telemetry.rescan();
        telemetry
    }

    /// Expands the globs, updates the path table, and seeds fds of newly watched paths.
    pub(crate) fn rescan(&mut self) {
        let expansion = self.globs.expand();
        if expansion.nodes == self.nodes {
            return;
        }
        if expansion.nodes.is_empty() {
            tracing::warn!(
                globs = %self.globs.as_slice().join(","),
                "no GPU device nodes match; watching for them to appear (no NVIDIA driver on this machine?)"
            );
        }
        for (path, why) in &expansion.skipped {
            tracing::warn!(path = %path.display(), "not watched: {why}");
        }
        let maps = self.sensor.maps_mut();
        let (added, removed) = upkeep::sync_paths(maps, &expansion.nodes);
        let (files_added, files_removed, match_inodes) = upkeep::sync_files(maps, &expansion.nodes);
        self.sensor.set_match_inodes(match_inodes);
        self.nodes = expansion.nodes;
        let seeded = upkeep::seed(
            self.sensor.maps_mut(),
            &self.nodes,
            &self.attributor,
            Path::new(PROC_ROOT),
            None,
        );
        tracing::info!(
            watched = self.nodes.len(),
            added,
            removed,
            files_added,
            files_removed,
            by_file = self.sensor.matches_by_file(),
            seeded_fds = seeded.fds,
            seeded_processes = seeded.processes,
            "GPU device nodes: {}",
            self.nodes
                .keys()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }

    /// Counts `n` events read from the ring buffer.
    pub(crate) fn count_events(&mut self, n: u64) {
        self.events_received += n;
    }

    /// Process `tgid` exec'd and lives on: keeps the GPU fds that survived the exec.
    pub(crate) fn on_exec(&mut self, tgid: u32) {
        upkeep::reseed_after_exec(
            self.sensor.maps_mut(),
            &self.nodes,
            &self.attributor,
            Path::new(PROC_ROOT),
            tgid,
        );
    }

    /// Writes `devices`' MIG instances to the programs' table (see
    /// [`Sensor::set_mig_instances`]); the names their indexes are reported under, which follow
    /// the list even where the table can't be written.
    pub(crate) fn set_devices(
        &mut self,
        devices: &[crate::devices::GpuDevice],
        caps_major: Option<u32>,
    ) -> DeviceNames {
        if let Err(e) = self.sensor.set_mig_instances(devices, caps_major) {
            tracing::warn!(
                "MIG instances not told apart (their memory counts as their GPU's): {e}"
            );
        }
        self.sensor.device_names().clone()
    }

    /// Releases the GPU files the programs kept for a holder they don't follow that the kernel
    /// has since released (`Sensor::sweep_files`).
    pub(crate) fn sweep_files(&self) {
        self.sensor.sweep_files();
    }

    /// Removes what the kernel can't see go away.
    pub(crate) fn collect_garbage(&mut self) {
        // First the files the kernel released that the programs kept for a holder they don't
        // follow: their clients go, so the pass below sees them gone.
        self.sensor.sweep_files();
        let g = upkeep::collect_garbage(
            self.sensor.maps_mut(),
            &mut self.attributor,
            &mut self.idle,
            Path::new(PROC_ROOT),
            std::time::Instant::now(),
        );
        if g != upkeep::Garbage::default() {
            tracing::debug!(?g, "removed stale entries");
        }
    }

    /// Every counter the maps hold now.
    pub(crate) fn counters(&self) -> Counters {
        self.sensor.counters()
    }

    /// The snapshot's part that the maps and attribution give, joined with `standing`.
    pub(crate) fn snapshot(&mut self, standing: &Standing, node: &str) -> Snapshot {
        let counters = self.sensor.counters();
        snapshot::build(
            &self.sensor,
            counters,
            standing,
            &mut self.attributor,
            node,
            self.events_received,
        )
    }
}

/// What the task runs: [`Telemetry`], or a fake in the unit tests.
trait State: Send + 'static {
    /// Counts `n` events read from the ring buffer.
    fn count_events(&mut self, n: u64);
    /// Process `tgid` exec'd.
    fn on_exec(&mut self, tgid: u32);
    /// Answers `request` (never [`Request::Settled`] or [`Request::Stop`]).
    fn serve(&mut self, request: Request);
}

impl State for Telemetry {
    fn count_events(&mut self, n: u64) {
        Telemetry::count_events(self, n);
    }

    fn on_exec(&mut self, tgid: u32) {
        Telemetry::on_exec(self, tgid);
    }

    fn serve(&mut self, request: Request) {
        match request {
            Request::Snapshot {
                standing,
                node,
                reply,
            } => {
                let _ = reply.send(self.snapshot(&standing, &node));
            }
            Request::Counters(reply) => {
                let _ = reply.send(self.counters());
            }
            Request::Rescan(reply) => {
                self.rescan();
                let _ = reply.send(());
            }
            Request::CollectGarbage(reply) => {
                self.collect_garbage();
                let _ = reply.send(());
            }
            Request::SweepFiles(reply) => {
                self.sweep_files();
                let _ = reply.send(());
            }
            Request::SetDevices {
                devices,
                caps_major,
                reply,
            } => {
                let _ = reply.send(self.set_devices(&devices, caps_major));
            }
            // The task loop handles these itself.
            Request::Settled(_) | Request::Stop => {}
        }
    }
}

enum Request {
    Snapshot {
        standing: Standing,
        node: String,
        reply: oneshot::Sender<Snapshot>,
    },
    Counters(oneshot::Sender<Counters>),
    Rescan(oneshot::Sender<()>),
    CollectGarbage(oneshot::Sender<()>),
    SweepFiles(oneshot::Sender<()>),
    SetDevices {
        devices: Vec<crate::devices::GpuDevice>,
        caps_major: Option<u32>,
        reply: oneshot::Sender<DeviceNames>,
    },
    #[cfg_attr(
        not(any(test, feature = "bench")),
        expect(
            dead_code,
            reason = "asked for only by the tests and the bench (the `bench` feature)"
        )
    )]
    Settled(oneshot::Sender<()>),
    Stop,
}

/// One batch of kernel events, as telemetry needs it.
struct EventBatch {
    /// Events read.
    received: u64,
    /// Processes that exec'd.
    execs: Vec<u32>,
}

/// The telemetry task went away (the agent is stopping).
#[derive(Debug, thiserror::Error)]
#[error("telemetry has stopped")]
pub(crate) struct Stopped;

/// Talks to the telemetry task. Cheap to clone.
#[derive(Clone)]
pub(crate) struct TelemetryHandle {
    requests: mpsc::UnboundedSender<Request>,
    events: mpsc::Sender<EventBatch>,
}

impl TelemetryHandle {
    /// Hands over a batch of `received` kernel events, of which `execs` are the processes that
    /// exec'd; waits while the task is [`EVENT_BATCHES`] batches behind.
    pub(crate) async fn events(&self, received: u64, execs: Vec<u32>) -> Result<(), Stopped> {
        self.events
            .send(EventBatch { received, execs })
            .await
            .map_err(|_| Stopped)
    }

    /// The snapshot's part that the maps and attribution give, joined with `standing`.
    pub(crate) async fn snapshot(
        &self,
        standing: Standing,
        node: String,
    ) -> Result<Snapshot, Stopped> {
        self.ask(|reply| Request::Snapshot {
            standing,
            node,
            reply,
        })
        .await
    }

    /// Every counter the maps hold now.
    pub(crate) async fn counters(&self) -> Result<Counters, Stopped> {
        self.ask(Request::Counters).await
    }

    /// Rescans the GPU device globs; returns once done.
    pub(crate) async fn rescan(&self) -> Result<(), Stopped> {
        self.ask(Request::Rescan).await
    }

    /// Collects the maps' garbage; returns once done.
    pub(crate) async fn collect_garbage(&self) -> Result<(), Stopped> {
        self.ask(Request::CollectGarbage).await
    }

    /// Sweeps the GPU files kept for a holder the programs don't follow; returns once done.
    pub(crate) async fn sweep_files(&self) -> Result<(), Stopped> {
        self.ask(Request::SweepFiles).await
    }

    /// Tells the programs which device index each MIG instance among `devices` is counted as
    /// (the list as it is now, after an instance was made or destroyed); returns the names the
    /// indexes are reported under from now on.
    pub(crate) async fn set_devices(
        &self,
        devices: Vec<crate::devices::GpuDevice>,
        caps_major: Option<u32>,
    ) -> Result<DeviceNames, Stopped> {
        self.ask(|reply| Request::SetDevices {
            devices,
            caps_major,
            reply,
        })
        .await
    }

    /// Returns once every event handed over before is handled (for the tests and the bench).
    #[cfg(any(test, feature = "bench"))]
    pub(crate) async fn settled(&self) -> Result<(), Stopped> {
        self.ask(Request::Settled).await
    }

    /// Ends the task (after the work in hand), which drops the sensor.
    pub(crate) fn stop(&self) {
        let _ = self.requests.send(Request::Stop);
    }

    async fn ask<T>(
        &self,
        request: impl FnOnce(oneshot::Sender<T>) -> Request,
    ) -> Result<T, Stopped> {
        let (reply, answer) = oneshot::channel();
        self.requests.send(request(reply)).map_err(|_| Stopped)?;
        answer.await.map_err(|_| Stopped)
    }
}

/// The link's and the DRA plugin's view of the traced processes, asked before a MIG change.
impl crate::control::link::ProcessView for TelemetryHandle {
    fn busy(
        &self,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Option<std::collections::BTreeSet<u32>>> + Send + '_>,
    > {
        Box::pin(async move {
            self.counters()
                .await
                .ok()
                .map(|c| crate::control::link::busy_in(&c))
        })
    }
}

/// Runs `telemetry` as a task until [`TelemetryHandle::stop`] or every handle is gone.
pub(crate) fn spawn(telemetry: Telemetry) -> (TelemetryHandle, tokio::task::JoinHandle<()>) {
    spawn_state(telemetry)
}

fn spawn_state(state: impl State) -> (TelemetryHandle, tokio::task::JoinHandle<()>) {
    let (requests, requests_rx) = mpsc::unbounded_channel();
    let (events, events_rx) = mpsc::channel(EVENT_BATCHES);
    let task = tokio::spawn(run(state, requests_rx, events_rx));
    (TelemetryHandle { requests, events }, task)
}

/// What the task does next.
enum Next {
    Request(Request),
    Execs,
    Stop,
}

async fn run<S: State>(
    mut state: S,
    mut requests: mpsc::UnboundedReceiver<Request>,
    mut events: mpsc::Receiver<EventBatch>,
) {
    let mut execs: VecDeque<u32> = VecDeque::new();
    let mut events_open = true;
    // Waiting for the events handed over to be handled.
    let mut settling: Vec<oneshot::Sender<()>> = Vec::new();
    loop {
        if execs.is_empty() && !settling.is_empty() {
            match events.try_recv() {
                Ok(batch) => {
                    state.count_events(batch.received);
                    execs.extend(batch.execs);
                    continue;
                }
                Err(_) => {
                    for waiter in settling.drain(..) {
                        let _ = waiter.send(());
                    }
                }
            }
        }
        let next = if execs.is_empty() {
            // Biased: a request waiting goes before more events are taken.
            tokio::select! {
                biased;
                request = requests.recv() => request.map_or(Next::Stop, Next::Request),
                batch = events.recv(), if events_open => {
                    match batch {
                        Some(batch) => {
                            state.count_events(batch.received);
                            execs.extend(batch.execs);
                        }
                        None => events_open = false,
                    }
                    continue;
                }
            }
        } else {
            match requests.try_recv() {
                Ok(request) => Next::Request(request),
                Err(mpsc::error::TryRecvError::Empty) => Next::Execs,
                Err(mpsc::error::TryRecvError::Disconnected) => Next::Stop,
            }
        };
        let work: Box<dyn FnOnce(&mut S) + Send> = match next {
            Next::Stop | Next::Request(Request::Stop) => return,
            Next::Request(Request::Settled(reply)) => {
                settling.push(reply);
                continue;
            }
            Next::Request(request) => Box::new(move |t| t.serve(request)),
            Next::Execs => {
                let chunk: Vec<u32> = execs.drain(..execs.len().min(EXEC_CHUNK)).collect();
                Box::new(move |t| {
                    for tgid in chunk {
                        t.on_exec(tgid);
                    }
                })
            }
        };
        match blocking(state, work).await {
            Some(s) => state = s,
            None => return,
        }
    }
}

/// Runs `work` on `state` on a blocking thread and gives the state back; `None` when the runtime
/// is shutting down. A panic leaves the maps as they were, so it is logged and the state kept.
async fn blocking<S: State>(mut state: S, work: Box<dyn FnOnce(&mut S) + Send>) -> Option<S> {
    tokio::task::spawn_blocking(move || {
        if std::panic::catch_unwind(AssertUnwindSafe(|| work(&mut state))).is_err() {
            tracing::error!("telemetry work panicked; the maps are kept as they were");
        }
        state
    })
    .await
    .ok()
}

#[cfg(test)]
mod tests;
