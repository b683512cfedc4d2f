//! The agent's link to the controller: register the node, then keep one stream up — heartbeats
//! and acks up, allocations down — reconnecting with backoff when the controller goes away.
//!
//! The agent accepts an allocation naming slots it doesn't have only when their values are zero;
//! otherwise it answers `UnsupportedResource` (docs/architecture.md, "Slot types are merged").

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use gpuwarden_proto::v1::{
    self as pb, agent_service_client::AgentServiceClient, controller_message::Msg,
};
use gpuwarden_proto::{
    convert,
    follow::{Controllers, FollowError, leader_hint},
};
use gpuwarden_runtime::tls::{ClientTls, TlsFileError};
use gpuwarden_types::slot::names;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio_stream::{StreamExt, wrappers::ReceiverStream};
use tonic::transport::Endpoint;

use super::{
    holdings::{SharedHoldings, lock},
    observed::Observed,
    usage_report::UsageCounters,
};
use crate::{
    checkpoint::GpuPair,
    devices::GpuBackend,
    enforcement::{PreemptionMode, QuotaCommand, confinement, quota::QuotaSpec, suspend::Move},
};

/// The channels between the link and the rest of the agent.
pub struct LinkChannels {
    /// Quotas down to enforcement.
    pub quotas: mpsc::UnboundedSender<QuotaCommand>,
    /// Enforcement events up to the controller (buffered while it is away).
    pub events: mpsc::Receiver<pb::EnforcementEvent>,
    /// Usage reports up to the controller (buffered while it is away).
    pub usage: mpsc::Receiver<pb::SessionUsage>,
    /// Usage reports sent, and dropped where the stream's buffer was full.
    pub usage_counters: Arc<UsageCounters>,
    /// The GPUs offered to Kubernetes and the claims prepared on them, where the node is a DRA
    /// driver: reported at registration and as they change.
    pub observed: Option<Arc<Observed>>,
    /// Where pods' namespaces are known (the kubelet): a user's pod target is authorized by it
    /// when its allocation arrives ([`confinement::authorize_at_arrival`]).
    pub pods: Box<dyn confinement::PodNamespaces + Sync>,
    /// Told each time the link made or destroyed a MIG instance, so whoever owns the programs'
    /// instance table writes the device list again (the message carries nothing: the receiver
    /// reads the list from its backend, which sees every GPU, not only the link's).
    pub devices_changed: mpsc::UnboundedSender<()>,
}

/// What goes up the stream besides heartbeats and answers.
enum Upward {
    Event(pb::EnforcementEvent),
    Usage(pb::SessionUsage),
    Observed,
}

/// Where and as whom to connect.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// Controller URLs, comma-separated: `http://127.0.0.1:50051`, or `https://…` with
    /// [`Self::tls`]; several (`https://ctl-0:50051,https://ctl-1:50051`) when controllers share
    /// an etcd store (the agent follows the leader among them).
    pub controller: String,
    /// The CA to verify an `https://` controller with, and this node's client certificate
    /// (which must name [`Self::node_id`]); read again at each connection.
    pub tls: ClientTls,
    /// Node id.
    pub node_id: String,
    /// Host name.
    pub hostname: String,
    /// eBPF hooks in use, reported at registration.
    pub hooks: Vec<String>,
    /// The GPUs (UUIDs) whose MIG layout gpuwarden may change: their layouts are reported at
    /// registration (issue 37 §3).
    pub mig_reconfigurable: Vec<String>,
}

/// Host CPUs and memory.
fn host_capacity() -> (u64, u64) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    (cpus, mem_kib * 1024)
}

/// The registration message for this node; with `observed`, the GPUs it offers to Kubernetes
/// and the claims held on them too.
#[must_use]
pub fn node_info(
    config: &LinkConfig,
    backend: &dyn GpuBackend,
    running: Vec<String>,
    observed: Option<&Observed>,
) -> pb::NodeInfo {
    let (cpus, mem) = host_capacity();
    let mut slot_types = vec![
        pb::SlotType {
            name: names::CPU.into(),
            kind: pb::SlotKind::Count.into(),
        },
        pb::SlotType {
            name: names::MEM.into(),
            kind: pb::SlotKind::Bytes.into(),
        },
    ];
    slot_types.extend(
        backend
            .slot_types()
            .into_iter()
            .map(|(name, kind)| pb::SlotType {
                name,
                kind: convert::kind_to_pb(kind).into(),
            }),
    );
    let mut capacity: std::collections::HashMap<String, String> = [
        (names::CPU.to_owned(), cpus.to_string()),
        (names::MEM.to_owned(), mem.to_string()),
    ]
    .into();
    capacity.extend(backend.extra_capacity());
    // How many instances of each MIG profile the node offers (its GPU slots follow from the
    // devices; a profile is counted here, where the controller keeps the other slots).
    capacity.extend(crate::devices::mig::slot_capacity(&backend.devices()));
    // The GPUs the operator lets gpuwarden cut (issue 37 §3): each profile they can make is a
    // slot type the node declares, even with no instance of it yet.
    let mig_layouts =
        crate::devices::ondemand::Reconfigurer::new(config.mig_reconfigurable.iter().cloned())
            .layouts(backend);
    for p in mig_layouts.iter().flat_map(|l| &l.profiles) {
        let name = crate::devices::mig::slot_name(&p.profile);
        if !slot_types.iter().any(|t| t.name == name) {
            slot_types.push(pb::SlotType {
                name,
                kind: pb::SlotKind::Count.into(),
            });
        }
    }
    pb::NodeInfo {
        node_id: config.node_id.clone(),
        hostname: config.hostname.clone(),
        slot_types,
        capacity: Some(pb::ResourceSlot { values: capacity }),
        devices: backend.devices().iter().map(device_to_pb).collect(),
        hooks: config.hooks.clone(),
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        running_sessions: running,
        kubernetes_devices: observed
            .map(|o| o.kubernetes_devices().to_vec())
            .unwrap_or_default(),
        observed_sessions: observed.map(Observed::registration).unwrap_or_default(),
        mig_layouts: mig_layouts.iter().map(layout_to_pb).collect(),
    }
}

/// A reconfigurable GPU's layout as the registration reports it.
fn layout_to_pb(l: &crate::devices::ondemand::LayoutReport) -> pb::MigLayout {
    pb::MigLayout {
        gpu_uuid: l.gpu_uuid.clone(),
        gpu_index: l.gpu_index,
        slices: l.slices,
        occupied: l
            .occupied
            .iter()
            .map(|p| pb::MigPlacement {
                start: p.start,
                size: p.size,
            })
            .collect(),
        profiles: l
            .profiles
            .iter()
            .map(|p| pb::MigProfilePlacements {
                profile: p.profile.clone(),
                size: p.size,
                starts: p.starts.clone(),
                free: p.free.clone(),
            })
            .collect(),
    }
}

/// A GPU as the registration names it.
#[must_use]
pub fn device_to_pb(d: &crate::devices::GpuDevice) -> pb::Device {
    pb::Device {
        uuid: d.uuid.clone(),
        model: d.model.clone(),
        memory_bytes: d.memory_bytes,
        numa_node: d.numa_node,
        sm_count: d.sm_count,
        is_mig: d.is_mig,
        index: d.index,
        device_node: d.device_node.clone(),
    }
}

/// The slot names this node has now.
fn known_slots(config: &LinkConfig, backend: &dyn GpuBackend) -> BTreeSet<String> {
    node_info(config, backend, vec![], None)
        .slot_types
        .into_iter()
        .map(|t| t.name)
        .collect()
}

/// The answer to an allocation: `None` to accept it, or the nack.
#[must_use]
pub fn check_allocation(
    known: &BTreeSet<String>,
    allocate: &pb::Allocate,
) -> Option<pb::AllocationNack> {
    let unknown: Vec<&str> = allocate
        .slots
        .iter()
        .flat_map(|s| &s.values)
        .filter(|(name, value)| {
            !known.contains(*name) && !value.chars().all(|c| c == '0' || c == '.')
        })
        .map(|(name, _)| name.as_str())
        .collect();
    if !unknown.is_empty() {
        return Some(pb::AllocationNack {
            session_id: allocate.session_id.clone(),
            reason: "UnsupportedResource".to_owned(),
            message: format!("this node has no slot type {}", unknown.join(", ")),
        });
    }
    // A MIG profile is held on an instance: counted without one (a controller that doesn't
    // know profiles), it would be held nowhere.
    let unplaced: Vec<&str> = allocate
        .slots
        .iter()
        .flat_map(|s| &s.values)
        .filter(|(name, value)| {
            name.starts_with(crate::devices::mig::SLOT_PREFIX)
                && !value.chars().all(|c| c == '0' || c == '.')
        })
        .map(|(name, _)| name.as_str())
        .collect();
    (!unplaced.is_empty() && allocate.devices.is_empty()).then(|| pb::AllocationNack {
        session_id: allocate.session_id.clone(),
        reason: "UnsupportedResource".to_owned(),
        message: format!(
            "{} names no MIG instance to hold it on (a controller places a profile on an \
             instance of it)",
            unplaced.join(", ")
        ),
    })
}

/// Why the link ended or could not start.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The controller list can't be used: fatal, retrying would not help.
    #[error("--controller: {0}")]
    InvalidList(#[from] FollowError),
    /// The controller URL can't be used: fatal, retrying would not help.
    #[error("invalid controller URL {url:?}: {source}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        #[source]
        source: tonic::transport::Error,
    },
    /// A TLS file is missing or unusable, or TLS settings don't fit the URL: fatal, the
    /// agent stops its link naming the file instead of retrying.
    #[error(transparent)]
    Tls(#[from] TlsFileError),
    /// No connection (the controller is down or unreachable).
    #[error("cannot connect: {0}")]
    Connect(#[source] tonic::transport::Error),
    /// The controller refused the registration.
    #[error("registration refused: {}", .0.message())]
    Register(#[source] tonic::Status),
    /// The stream was refused or broke.
    #[error("stream broke: {}", .0.message())]
    Stream(#[source] tonic::Status),
    /// The stream's sending side closed (the connection went away).
    #[error("stream closed")]
    Closed,
}

impl LinkError {
    /// Whether retrying can't help (the agent stops instead).
    #[must_use]
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            Self::InvalidUrl { .. } | Self::InvalidList(_) | Self::Tls(_)
        )
    }

    /// The controller's answer, when it gave one (a standby's names the leader).
    fn status(&self) -> Option<&tonic::Status> {
        match self {
            Self::Register(s) | Self::Stream(s) => Some(s),
            _ => None,
        }
    }
}

/// The controllers of a `--controller` list, each checked.
///
/// # Errors
/// [`LinkError::InvalidList`] or [`LinkError::InvalidUrl`], naming the entry.
pub fn check_controllers(list: &str) -> Result<Controllers, LinkError> {
    let controllers = Controllers::parse(list)?;
    for url in controllers.urls() {
        check_url(url)?;
    }
    Ok(controllers)
}

/// The controller's endpoint.
///
/// # Errors
/// [`LinkError::InvalidUrl`], naming the URL.
pub fn check_url(url: &str) -> Result<Endpoint, LinkError> {
    Endpoint::from_shared(url.to_owned()).map_err(|source| LinkError::InvalidUrl {
        url: url.to_owned(),
        source,
    })
}

/// The controller's endpoint with its TLS settings, the files read now.
///
/// # Errors
/// [`LinkError::InvalidUrl`] or [`LinkError::Tls`], both fatal.
pub fn endpoint(url: &str, tls: &ClientTls) -> Result<Endpoint, LinkError> {
    Ok(tls.apply(check_url(url)?)?)
}

/// Keeps the node registered and its stream up until `shutdown`, reconnecting with backoff when
/// the controller goes away, and following the leader among several controllers: a standby's
/// answer names the leader, tried next at once; any other failure moves on to the next of the
/// list. Returns early, logged as an error, when the link can never work (an invalid URL or TLS
/// file; the daemon checks both with [`check_controllers`] and [`endpoint`] before and stops
/// naming them).
pub async fn run(
    config: LinkConfig,
    backend: Arc<dyn GpuBackend>,
    holdings: SharedHoldings,
    mut channels: Option<LinkChannels>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut controllers = match check_controllers(&config.controller) {
        Ok(controllers) => controllers,
        Err(e) => {
            tracing::error!("controller link stopped: {e}");
            return;
        }
    };
    let mut backoff = Backoff::default();
    // Held across connections, and kept in the agent's store across restarts: the instances
    // made here.
    let reconfigurer = mig::reconfigurer(&config.mig_reconfigurable, backend.as_ref(), &holdings);
    let counters = channels.as_ref().map(|c| Arc::clone(&c.usage_counters));
    let set_connected = |up| {
        if let Some(c) = &counters {
            c.set_connected(up);
        }
    };
    set_connected(false);
    loop {
        let url = controllers.current().to_owned();
        let session = connect_once(
            &url,
            &config,
            backend.as_ref(),
            &holdings,
            channels.as_mut(),
            &reconfigurer,
        );
        tokio::select! {
            () = &mut shutdown => return,
            result = session => {
                set_connected(false);
                match result {
                    Ok(Ended::LayoutChanged) => {
                        tracing::info!(controller = %url, "MIG layout changed; registering again");
                        if let Some(c) = &channels {
                            // Nobody listening (the agent stopping) is no error.
                            let _ = c.devices_changed.send(());
                        }
                        backoff.reset();
                    }
                    Ok(Ended::Closed) => {
                        // A controller that steps down closes the streams: asked again, it names the
                        // leader.
                        tracing::warn!(controller = %url, "controller closed the stream; reconnecting");
                        backoff.reset();
                    }
                    Err(e) if e.is_fatal() => {
                        tracing::error!(controller = %url, "controller link stopped: {e}");
                        return;
                    }
                    Err(e) => {
                        controllers.failed(e.status());
                        if e.status().and_then(leader_hint).is_some() && controllers.current() != url {
                            tracing::info!(standby = %url, leader = %controllers.current(), "following the leader");
                            backoff.reset();
                            continue;
                        }
                        tracing::warn!(controller = %url, next = %controllers.current(), "controller link: {e}; retrying in {:?}", backoff.current());
                    }
                }
            }
        }
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(backoff.next_delay()) => {}
        }
    }
}

/// Doubling delays between reconnections, from 100 ms up to 5 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Self(Self::FIRST)
    }
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    fn current(self) -> Duration {
        self.0
    }

    /// The delay to wait now; the next one doubles.
    fn next_delay(&mut self) -> Duration {
        let now = self.0;
        self.0 = (self.0 * 2).min(Self::MAX);
        now
    }

    fn reset(&mut self) {
        self.0 = Self::FIRST;
    }
}

/// Why a stream ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The controller closed it.
    Closed,
    /// The agent made or destroyed a MIG instance: it registers again, so the controller sees
    /// its devices and layouts as they are now (issue 37 §3).
    LayoutChanged,
}

/// One registration and stream, until the stream ends.
#[expect(
    clippy::too_many_lines,
    reason = "one select loop over the stream's sources, each arm short"
)]
async fn connect_once(
    url: &str,
    config: &LinkConfig,
    backend: &dyn GpuBackend,
    holdings: &SharedHoldings,
    mut channels: Option<&mut LinkChannels>,
    reconfigurer: &crate::devices::ondemand::Reconfigurer,
) -> Result<Ended, LinkError> {
    // Built at each connection, so rotated certificate files are read again.
    let channel = endpoint(url, &config.tls)?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(LinkError::Connect)?;
    let mut client = AgentServiceClient::new(channel);
    let running = lock(holdings).sessions();
    let observed = channels.as_deref().and_then(|c| c.observed.clone());
    let registered = client
        .register(node_info(config, backend, running, observed.as_deref()))
        .await
        .map_err(LinkError::Register)?
        .into_inner();
    let interval = Duration::from_millis(u64::from(registered.heartbeat_interval_ms.max(100)));
    tracing::info!(node = %registered.node_id, controller = %url, "registered");

    let (tx, rx) = mpsc::channel::<pb::AgentMessage>(64);
    let heartbeat = |seq| pb::AgentMessage {
        msg: Some(pb::agent_message::Msg::Heartbeat(pb::Heartbeat {
            node_id: config.node_id.clone(),
            seq,
            running_sessions: lock(holdings).sessions(),
        })),
    };
    tx.send(heartbeat(0)).await.map_err(|_| LinkError::Closed)?;
    let mut inbound = client
        .connect(ReceiverStream::new(rx))
        .await
        .map_err(LinkError::Stream)?
        .into_inner();
    if let Some(c) = channels.as_deref() {
        c.usage_counters.set_connected(true);
    }
    report_interrupted(holdings, &tx).await?;
    let mut ticker = tokio::time::interval(interval);
    let mut seq = 1;
    loop {
        let upward = async {
            match channels.as_mut() {
                Some(c) => tokio::select! {
                    Some(event) = c.events.recv() => Upward::Event(event),
                    Some(usage) = c.usage.recv() => Upward::Usage(usage),
                    () = changed(c.observed.as_deref()) => Upward::Observed,
                    else => std::future::pending().await,
                },
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            upward = upward => match upward {
                Upward::Event(event) => {
                    if matches!(event.action.as_str(), "resumed" | "resume_refused" | "resume_failed")
                        && let Err(e) = lock(holdings).settle_move(&event.session_id, event.action == "resumed")
                    {
                        tracing::error!(session = %event.session_id, "holding the GPUs it resumed on: {e}");
                    }
                    if event.action == "preempted" {
                        mig::note_held(reconfigurer, holdings);
                        // The workload is gone and its quota released: the hold goes too, so
                        // the node's next registration no longer lists the session.
                        release_held(holdings, &event.session_id);
                    }
                    let msg = pb::agent_message::Msg::Event(event);
                    tx.send(pb::AgentMessage { msg: Some(msg) }).await.map_err(|_| LinkError::Closed)?;
                }
                Upward::Usage(usage) => {
                    // A sample is worth less than a heartbeat: never wait for room, drop it.
                    let msg = pb::agent_message::Msg::Usage(usage);
                    let counters = channels.as_deref().map(|c| Arc::clone(&c.usage_counters)).unwrap_or_default();
                    match tx.try_send(pb::AgentMessage { msg: Some(msg) }) {
                        Ok(()) => counters.count_sent(),
                        Err(TrySendError::Full(_)) => counters.count_dropped(),
                        Err(TrySendError::Closed(_)) => return Err(LinkError::Closed),
                    }
                }
                Upward::Observed => {
                    for o in observed.as_deref().map(Observed::take_changes).unwrap_or_default() {
                        let msg = pb::agent_message::Msg::Observed(o);
                        tx.send(pb::AgentMessage { msg: Some(msg) }).await.map_err(|_| LinkError::Closed)?;
                    }
                }
            },
            _ = ticker.tick() => {
                tx.send(heartbeat(seq)).await.map_err(|_| LinkError::Closed)?;
                seq += 1;
                // Instances made here and let go, one busy at the last try included.
                if mig::destroy_idle(reconfigurer, backend, holdings) {
                    return Ok(Ended::LayoutChanged);
                }
            }
            message = inbound.next() => {
                let Some(message) = message else { return Ok(Ended::Closed) };
                let message = message.map_err(LinkError::Stream)?;
                if let Some(Msg::MakeMigInstance(order)) = &message.msg {
                    let Some(nack) = mig::make(reconfigurer, backend, order) else {
                        return Ok(Ended::LayoutChanged);
                    };
                    tx.send(pb::AgentMessage { msg: Some(nack) }).await.map_err(|_| LinkError::Closed)?;
                    continue;
                }
                let released = matches!(message.msg, Some(Msg::Release(_)));
                if released {
                    mig::note_held(reconfigurer, holdings);
                }
                let reply = answer(config, backend, holdings, channels.as_deref(), message.msg);
                if let Some(msg) = reply {
                    tx.send(pb::AgentMessage { msg: Some(msg) }).await.map_err(|_| LinkError::Closed)?;
                }
                if released && mig::destroy_idle(reconfigurer, backend, holdings) {
                    return Ok(Ended::LayoutChanged);
                }
            }
        }
    }
}

/// The agent's answer to a message from the controller, if it sends one.
fn answer(
    config: &LinkConfig,
    backend: &dyn GpuBackend,
    holdings: &SharedHoldings,
    channels: Option<&LinkChannels>,
    message: Option<Msg>,
) -> Option<pb::agent_message::Msg> {
    match message {
        // Asked at each allocation: a device plugin's slots may change while connected.
        Some(Msg::Allocate(a)) => Some(accept(config, backend, holdings, channels, a)),
        Some(Msg::Release(r)) if confinement::check_session_id(&r.session_id).is_err() => {
            // No allocation was ever held under such an id.
            tracing::warn!(session = %r.session_id.chars().take(80).collect::<String>(), "release for a malformed session id ignored");
            None
        }
        Some(Msg::Preempt(p)) if confinement::check_session_id(&p.session_id).is_err() => {
            tracing::warn!(session = %p.session_id.chars().take(80).collect::<String>(), "preemption for a malformed session id ignored");
            None
        }
        Some(Msg::Preempt(p)) => preempt(holdings, channels, p),
        Some(Msg::Resume(r)) => {
            let c = channels.filter(|_| confinement::check_session_id(&r.session_id).is_ok())?;
            let session_id = r.session_id.clone();
            match resume_command(backend, holdings, r) {
                Ok(command) => {
                    let _ = c.quotas.send(command);
                    None
                }
                // Said to the controller, which suspends it again for the GPUs it left.
                Err(why) => Some(pb::agent_message::Msg::Event(pb::EnforcementEvent {
                    session_id,
                    action: "resume_refused".to_owned(),
                    action_kind: pb::EnforcementAction::ResumeRefused.into(),
                    reason: format!("not resumed on the GPUs named ({why}); still suspended"),
                    ..pb::EnforcementEvent::default()
                })),
            }
        }
        Some(Msg::Release(r)) => {
            release_held(holdings, &r.session_id);
            if let Some(c) = channels
                && c.quotas
                    .send(QuotaCommand::Release(r.session_id.clone()))
                    .is_ok()
            {
                // Enforcement reports `released` once the quota is gone.
                return None;
            }
            // Nothing enforced here: the hold was all there was, and it is gone. The
            // controller keeps a terminating session booked until it hears this (issue 40).
            Some(pb::agent_message::Msg::Event(pb::EnforcementEvent {
                session_id: r.session_id,
                action: "released".to_owned(),
                action_kind: pb::EnforcementAction::Released.into(),
                reason: "released: nothing enforced here; its hold is gone".to_owned(),
                ..pb::EnforcementEvent::default()
            }))
        }
        // An instance to make is the stream's own (it registers again after).
        Some(Msg::MakeMigInstance(_)) | None => None,
    }
}

/// What a `Resume` asks of enforcement: a plain resumption where it names no GPUs or the ones
/// the session holds, else a resumption onto the GPUs it names (issue 38), each in place of the
/// held one at its position: the quota there and the GPU pairs, old → new, by this node's
/// UUIDs for the indexes.
///
/// # Errors
/// Why not, where it names GPUs that cannot take the session's place (another model, not a
/// whole GPU here, another count): it stays suspended.
fn resume_command(
    backend: &dyn GpuBackend,
    holdings: &SharedHoldings,
    r: pb::Resume,
) -> Result<QuotaCommand, String> {
    let held = lock(holdings).get(&r.session_id).cloned();
    let same = |held: &pb::Allocate| {
        held.devices
            .iter()
            .map(|d| d.index)
            .eq(r.devices.iter().map(|d| d.index))
    };
    let held = match held {
        Some(held) if !r.devices.is_empty() && !same(&held) => held,
        _ => return Ok(QuotaCommand::Resume(r.session_id)),
    };
    let refuse = |why: String| {
        tracing::warn!(session = %r.session_id, "resumption onto other GPUs refused: {why}");
        Err(why)
    };
    if held.devices.len() != r.devices.len() {
        return refuse(format!(
            "{} GPUs named for {} held",
            r.devices.len(),
            held.devices.len()
        ));
    }
    let devices = backend.devices();
    let gpu = |index: u32| devices.iter().find(|d| d.index == index && !d.is_mig);
    let mut pairs = Vec::new();
    for (old, new) in held.devices.iter().zip(&r.devices) {
        let (Some(o), Some(n)) = (gpu(old.index), gpu(new.index)) else {
            return refuse(format!(
                "GPU {} or {} is not a whole GPU here",
                old.index, new.index
            ));
        };
        // The driver restores only onto the same chip (NVIDIA's documentation).
        if o.model != n.model {
            return refuse(format!(
                "GPU {} is a {}, GPU {} a {}",
                o.index, o.model, n.index, n.model
            ));
        }
        // The driver takes UUIDs as bytes: one that is not in NVML's form (a mock GPU's made-up
        // name) fails here, before anything moves, rather than at the restore.
        let pair: GpuPair = format!("{}={}", o.uuid, n.uuid)
            .parse()
            .map_err(|e: crate::checkpoint::CheckpointError| e.to_string())?;
        pairs.push(pair);
    }
    let mut moved = held;
    moved.devices = r.devices;
    let spec = match QuotaSpec::from_allocate(&moved, &devices) {
        Ok(Some(spec)) => spec,
        Ok(None) => return refuse("nothing enforced for it".to_owned()),
        Err(e) => return refuse(e.to_string()),
    };
    if let Err(e) = lock(holdings).propose_move(moved) {
        return refuse(format!("the move could not be recorded: {e}"));
    }
    Ok(QuotaCommand::ResumeOnto {
        session: r.session_id,
        moving: Move { spec, pairs },
    })
}

/// Sends [`interrupted_moves`] up, forgetting each once sent.
async fn report_interrupted(
    holdings: &SharedHoldings,
    tx: &mpsc::Sender<pb::AgentMessage>,
) -> Result<(), LinkError> {
    for event in interrupted_moves(holdings) {
        let session = event.session_id.clone();
        let msg = pb::agent_message::Msg::Event(event);
        tx.send(pb::AgentMessage { msg: Some(msg) })
            .await
            .map_err(|_| LinkError::Closed)?;
        if let Err(e) = lock(holdings).forget_move(&session) {
            tracing::error!(session, "forgetting the interrupted move: {e}");
        }
    }
    Ok(())
}

/// `resume_refused` for each move onto other GPUs that an earlier run of this agent began and
/// did not settle (issue 38): the controller booked the new GPUs, this run holds the old ones
/// and re-applied their quota, and the processes are as the cut-short move left them, at the
/// latest checkpointed and locked before the restore. The controller frees the new GPUs and
/// suspends the session again; its next `Resume` restores it on the GPUs it holds.
fn interrupted_moves(holdings: &SharedHoldings) -> Vec<pb::EnforcementEvent> {
    let h = lock(holdings);
    h.interrupted()
        .into_iter()
        .map(|to| {
            let gpus = |a: &pb::Allocate| {
                a.devices
                    .iter()
                    .map(|d| d.index.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let held = h.get(&to.session_id).map(gpus).unwrap_or_default();
            tracing::warn!(session = %to.session_id, "a move to GPUs {} was cut short by a restart", gpus(&to));
            pb::EnforcementEvent {
                session_id: to.session_id.clone(),
                action: "resume_refused".to_owned(),
                reason: format!(
                    "not resumed on GPUs {}: the agent restarted during the move; still \
                     suspended, holding GPUs {held}",
                    gpus(&to)
                ),
                ..pb::EnforcementEvent::default()
            }
        })
        .collect()
}

/// Lets go of `session`'s allocation on disk.
fn release_held(holdings: &SharedHoldings, session: &str) {
    if let Err(e) = lock(holdings).release(session) {
        tracing::error!(session, "releasing: {e}");
    }
}

/// Starts a preemption: enforcement signals the workload, kills it at the deadline, releases
/// the quota and sends `preempted` up (the hold is let go as that event passes). Without
/// enforcement there is nothing to signal: the hold goes at once and the answer is `preempted`.
fn preempt(
    holdings: &SharedHoldings,
    channels: Option<&LinkChannels>,
    p: pb::Preempt,
) -> Option<pb::agent_message::Msg> {
    tracing::info!(session = %p.session_id, grace_ms = p.grace_ms, "preempting: {}", p.reason);
    if let Some(c) = channels {
        let command = QuotaCommand::Preempt {
            session: p.session_id.clone(),
            grace: Duration::from_millis(u64::from(p.grace_ms)),
            reason: p.reason.clone(),
            mode: PreemptionMode::from_wire(&p.mode),
        };
        if c.quotas.send(command).is_ok() {
            return None;
        }
    }
    release_held(holdings, &p.session_id);
    Some(pb::agent_message::Msg::Event(pb::EnforcementEvent {
        session_id: p.session_id,
        action: "preempted".to_owned(),
        action_kind: pb::EnforcementAction::Preempted.into(),
        reason: format!("preempted ({}): nothing enforced here; released", p.reason),
        ..pb::EnforcementEvent::default()
    }))
}

/// Resolves when the observed sessions changed; never without them.
async fn changed(observed: Option<&Observed>) {
    match observed {
        Some(o) => o.changed().await,
        None => std::future::pending().await,
    }
}

/// Answers an allocation: refused when it names slots the node lacks or a quota that can't be
/// enforced; otherwise held on disk, acknowledged, and its quota passed down.
fn accept(
    config: &LinkConfig,
    backend: &dyn GpuBackend,
    holdings: &SharedHoldings,
    channels: Option<&LinkChannels>,
    a: pb::Allocate,
) -> pb::agent_message::Msg {
    let nack = |session_id: String, reason: &str, message: String| {
        pb::agent_message::Msg::Nack(pb::AllocationNack {
            session_id,
            reason: reason.to_owned(),
            message,
        })
    };
    if let Some(n) = check_allocation(&known_slots(config, backend), &a) {
        return pb::agent_message::Msg::Nack(n);
    }
    // The id names a cgroup directory and a store key: checked before either is touched.
    if let Err(e) = confinement::check_session_id(&a.session_id) {
        let id = a.session_id.chars().take(80).collect();
        return nack(id, "InvalidQuota", e.to_string());
    }
    let spec = match QuotaSpec::from_allocate(&a, &backend.devices()) {
        Ok(spec) => spec,
        Err(e) => return nack(a.session_id, "InvalidQuota", e.to_string()),
    };
    if let Some(spec) = &spec {
        // Without enforcement (no channels) nothing binds: no pod is known either.
        let pods: &dyn confinement::PodNamespaces =
            channels.map_or(&confinement::NoPods, |c| c.pods.as_ref());
        let held: Vec<QuotaSpec> = {
            let h = lock(holdings);
            h.sessions()
                .iter()
                .filter_map(|s| h.get(s))
                .filter_map(|other| {
                    QuotaSpec::from_allocate(other, &backend.devices())
                        .ok()
                        .flatten()
                })
                .filter(|other| confinement::counts_at_arrival(spec, other, pods))
                .collect()
        };
        let checked = confinement::authorize_at_arrival(spec, pods).and_then(|()| {
            confinement::check_allocation(spec, &held, confinement::own_cgroup().as_deref())
        });
        if let Err(e) = checked {
            // The log names the other session; the answer, which its owner reads, does not.
            if let confinement::Refusal::Overlap {
                other, other_path, ..
            } = &e
            {
                tracing::warn!(session = %a.session_id, target = %spec.target, %other, %other_path, "allocation refused: {e}");
            } else {
                tracing::warn!(session = %a.session_id, target = %spec.target, "allocation refused: {e}");
            }
            return nack(a.session_id, "InvalidQuota", e.to_string());
        }
    }
    let session_id = a.session_id.clone();
    // Acknowledge only what is on disk; a failed write refuses instead.
    if let Err(e) = lock(holdings).hold(a) {
        return nack(session_id, "StoreFailed", e.to_string());
    }
    if let (Some(spec), Some(c)) = (spec, channels) {
        let _ = c.quotas.send(QuotaCommand::Apply(spec));
    }
    pb::agent_message::Msg::Ack(pb::AllocationAck { session_id })
}

mod mig;

#[cfg(test)]
mod tests;
