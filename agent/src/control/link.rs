//! The agent's link to the controller: register the node, then keep one stream up — heartbeats
//! and acks up, allocations down — reconnecting with backoff when the controller goes away.
//!
//! The agent accepts an allocation naming slots it doesn't have only when their values are zero;
//! otherwise it answers `UnsupportedResource` (docs/architecture.md, "Slot types are merged").

use crate::devices::changes::DeviceChanges;
use std::sync::Arc;
use std::time::Duration;

use gpuwarden_proto::follow::leader_hint;
use gpuwarden_proto::v1::{
    self as pb, agent_service_client::AgentServiceClient, controller_message::Msg,
};
use gpuwarden_runtime::tls::ClientTls;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio_stream::{StreamExt, wrappers::ReceiverStream};

use super::{
    holdings::{SharedHoldings, lock},
    observed::Observed,
    usage_report::UsageCounters,
};
use crate::{
    devices::GpuBackend,
    enforcement::{QuotaCommand, confinement},
};

mod allocation;
mod commands;
mod endpoint;
mod mig;
mod registration;

use commands::{answer, release_held, take_up_interrupted};

pub use allocation::check_allocation;
pub use endpoint::{LinkError, check_controllers, check_url, endpoint};
pub use mig::ProcessView;
pub(crate) use mig::busy_in;
pub use registration::{device_to_pb, node_info};

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
    /// instance table writes the device list again; the link registers again only once it is
    /// written.
    pub devices_changed: DeviceChanges,
    /// The agent's own view of its GPU processes, asked before a MIG instance is made or
    /// destroyed (the driver's count is asked too); `None`: the driver's alone.
    pub processes: Option<Arc<dyn ProcessView>>,
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
                        // The controller may place a workload on a new instance as soon as it
                        // sees it: the programs must count that instance first.
                        if let Some(c) = &channels {
                            c.devices_changed.written().await;
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
    take_up_interrupted(backend, holdings, channels.as_deref(), &tx).await?;
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
                Upward::Event(mut event) => {
                    settle_holdings(holdings, reconfigurer, &mut event);
                    send(&tx, pb::agent_message::Msg::Event(event)).await?;
                }
                Upward::Usage(usage) => {
                    let counters = channels.as_deref().map(|c| c.usage_counters.as_ref());
                    send_sample(&tx, counters, usage)?;
                }
                Upward::Observed => {
                    for o in observed.as_deref().map(Observed::take_changes).unwrap_or_default() {
                        send(&tx, pb::agent_message::Msg::Observed(o)).await?;
                    }
                }
            },
            _ = ticker.tick() => {
                tx.send(heartbeat(seq)).await.map_err(|_| LinkError::Closed)?;
                seq += 1;
                // Instances made here and let go, one busy at the last try included.
                let view = channels.as_deref().and_then(|c| c.processes.as_deref());
                if mig::destroy_idle(reconfigurer, backend, holdings, view).await {
                    return Ok(Ended::LayoutChanged);
                }
            }
            message = inbound.next() => {
                let Some(message) = message else { return Ok(Ended::Closed) };
                let message = message.map_err(LinkError::Stream)?;
                if let Some(Msg::MakeMigInstance(order)) = &message.msg {
                    let view = channels.as_deref().and_then(|c| c.processes.as_deref());
                    let Some(nack) = mig::make(reconfigurer, backend, view, order).await else {
                        return Ok(Ended::LayoutChanged);
                    };
                    send(&tx, nack).await?;
                    continue;
                }
                let released = matches!(message.msg, Some(Msg::Release(_)));
                if released {
                    mig::note_held(reconfigurer, holdings);
                }
                let reply = answer(config, backend, holdings, channels.as_deref(), message.msg);
                if let Some(msg) = reply {
                    send(&tx, msg).await?;
                }
                let view = channels.as_deref().and_then(|c| c.processes.as_deref());
                if released && mig::destroy_idle(reconfigurer, backend, holdings, view).await {
                    return Ok(Ended::LayoutChanged);
                }
            }
        }
    }
}

/// Sends `msg` up the stream, waiting for room.
async fn send(
    tx: &mpsc::Sender<pb::AgentMessage>,
    msg: pb::agent_message::Msg,
) -> Result<(), LinkError> {
    tx.send(pb::AgentMessage { msg: Some(msg) })
        .await
        .map_err(|_| LinkError::Closed)
}

/// Sends a usage sample up, counted as sent or dropped: a sample is worth less than a
/// heartbeat, so it never waits for room.
fn send_sample(
    tx: &mpsc::Sender<pb::AgentMessage>,
    counters: Option<&UsageCounters>,
    usage: pb::SessionUsage,
) -> Result<(), LinkError> {
    let msg = pb::agent_message::Msg::Usage(usage);
    let sent = match tx.try_send(pb::AgentMessage { msg: Some(msg) }) {
        Ok(()) => true,
        Err(TrySendError::Full(_)) => false,
        Err(TrySendError::Closed(_)) => return Err(LinkError::Closed),
    };
    match counters {
        Some(c) if sent => c.count_sent(),
        Some(c) => c.count_dropped(),
        None => {}
    }
    Ok(())
}

/// What an enforcement event going up changes in what the node holds: a move onto other GPUs
/// settles with its outcome (issue 38; a refusal of one this run took up after a restart says
/// the move was cut short, so the controller may move the session again); a preempted
/// session's hold goes, so the node's next registration no longer lists it.
fn settle_holdings(
    holdings: &SharedHoldings,
    reconfigurer: &crate::devices::ondemand::Reconfigurer,
    event: &mut pb::EnforcementEvent,
) {
    if event.action == "resume_refused" && lock(holdings).took_up(&event.session_id) {
        event.move_interrupted = true;
    }
    let session = &event.session_id;
    if matches!(
        event.action.as_str(),
        "resumed" | "resume_refused" | "resume_failed"
    ) && let Err(e) = lock(holdings).settle_move(session, event.action == "resumed")
    {
        tracing::error!(%session, "holding the GPUs it resumed on: {e}");
    }
    if event.action == "preempted" {
        mig::note_held(reconfigurer, holdings);
        // The workload is gone and its quota released.
        release_held(holdings, session);
    }
}

/// Resolves when the observed sessions changed; never without them.
async fn changed(observed: Option<&Observed>) {
    match observed {
        Some(o) => o.changed().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
