//! `AgentService`: agents register their node, then hold one stream: heartbeats, acks/nacks,
//! enforcement events, usage and observed sessions (Kubernetes claims the agent prepared) up,
//! `Allocate`/`Release` down. Every message is held to
//! [`crate::limits`]: one out of bounds closes the stream naming the field, and a stream over
//! its rate is closed with `RESOURCE_EXHAUSTED`.

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use gpuwarden_proto::v1::{self as pb, agent_message::Msg, agent_service_server::AgentService};
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt, wrappers::ReceiverStream};
use tonic::{Request, Response, Status, Streaming};

use crate::convert;
use crate::{
    auth::identity::Peer,
    hub::{Hub, Pending, store_status},
    limits::{Bounds, Bucket, LimitError, Refusal},
    store::StoreError,
};

/// The agent-facing service: the controller, and the bounds agents are held to.
#[derive(Clone)]
pub struct AgentApi {
    /// The controller core.
    pub controller: Arc<Hub>,
    /// The bounds agents are held to.
    pub bounds: Arc<Bounds>,
}

#[tonic::async_trait]
impl AgentService for AgentApi {
    async fn register(
        &self,
        request: Request<pb::NodeInfo>,
    ) -> Result<Response<pb::RegisterResponse>, Status> {
        let peer = Peer::of(&request, self.bounds.denials())?;
        let info = request.into_inner();
        self.bounds.counted(self.bounds.limits.node(&info))?;
        peer.speaks_for(&info.node_id, self.bounds.denials())?;
        let report = convert::report_from_pb(&info)?;
        let node_id = report.node_id.clone();
        // A malformed observed session is left out, not the node: its agent would only retry.
        let observed = info
            .observed_sessions
            .iter()
            .filter(|o| !o.ended)
            .filter_map(|o| match convert::observed_from_pb(o) {
                Ok(o) => Some(o),
                Err(e) => {
                    self.bounds.count(Refusal::ForeignSession);
                    tracing::warn!(node = %node_id, session = %o.session_id, "observed session left out: {}", e.message());
                    None
                }
            })
            .collect();
        let (commands, refused) = self
            .controller
            .apply(|s| s.register_observing(report, &info.running_sessions, observed))
            .await
            .map_err(|e| store_status(&e))?
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        for e in refused {
            self.bounds.count(Refusal::ForeignSession);
            tracing::warn!(node = %node_id, "observed session left out: {e}");
        }
        tracing::info!(
            node = %node_id,
            devices = info.devices.len(),
            kubernetes_devices = info.kubernetes_devices.len(),
            observed = info.observed_sessions.len(),
            "agent registered"
        );
        self.controller.dispatch(commands);
        self.controller.kick();
        Ok(Response::new(pb::RegisterResponse {
            node_id,
            heartbeat_interval_ms: u32::try_from(
                self.controller.timing().heartbeat_interval.as_millis(),
            )
            .unwrap_or(u32::MAX),
        }))
    }

    type ConnectStream = Pin<Box<dyn Stream<Item = Result<pb::ControllerMessage, Status>> + Send>>;

    async fn connect(
        &self,
        request: Request<Streaming<pb::AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let peer = Peer::of(&request, self.bounds.denials())?;
        let mut inbound = request.into_inner();
        // The first message names the node.
        let first = inbound.next().await.ok_or_else(|| {
            Status::invalid_argument("the stream closed before its first heartbeat")
        })??;
        self.bounds
            .counted(self.bounds.limits.agent_message(&first))?;
        let Some(Msg::Heartbeat(hb)) = first.msg else {
            return Err(Status::invalid_argument(
                "the first message on the stream must be a heartbeat",
            ));
        };
        let node = hb.node_id;
        // Later messages on the stream are this node's, whatever they name.
        peer.speaks_for(&node, self.bounds.denials())?;
        if !self.controller.read(|s| s.nodes().contains_key(&node)) {
            return Err(Status::failed_precondition(format!(
                "node {node:?} is not registered; call Register first"
            )));
        }
        let (tx, rx) = mpsc::channel(1024);
        // Weak: the stream still ends when the node is dropped from the controller's agents.
        let closer = tx.downgrade();
        self.controller.attach_agent(&node, tx);
        self.controller
            .apply(|s| s.heartbeat(&node))
            .await
            .map_err(|e| store_status(&e))?;

        let controller = Arc::clone(&self.controller);
        let bounds = Arc::clone(&self.bounds);
        tokio::spawn(async move {
            let mut bucket = Bucket::agent_stream(&bounds.limits);
            // Over-rate messages dropped since the last warning, and when that was.
            let mut dropped: (u64, Option<tokio::time::Instant>) = (0, None);
            // The newest change not yet known durable. Commits are in submission order, so its
            // being durable says every earlier one is: the stream reads on meanwhile, and a
            // node's acks that arrive together share one commit.
            let mut unsettled: Option<Settling> = None;
            loop {
                let message = match unsettled.as_mut() {
                    Some(durable) => tokio::select! {
                        biased;
                        message = inbound.next() => message,
                        result = durable => {
                            if let Err(e) = result {
                                tracing::error!(%node, "persisting an agent message: {e}");
                            }
                            unsettled = None;
                            continue;
                        }
                    },
                    None => inbound.next().await,
                };
                let Some(Ok(message)) = message else { break };
                // What a workload can cause (enforcement events, usage) and what only keeps the
                // node alive is dropped over the rate, counted, and the stream stays: a tenant
                // allocating in a loop must not cut its node off. Acks, nacks and observed
                // sessions change state, so a node flooding those is closed.
                let droppable = matches!(
                    message.msg,
                    Some(Msg::Event(_) | Msg::Usage(_) | Msg::Heartbeat(_))
                );
                if droppable && !bucket.take() {
                    bounds.count(Refusal::FloodDropped);
                    dropped.0 += 1;
                    let now = tokio::time::Instant::now();
                    if dropped
                        .1
                        .is_none_or(|at| now.duration_since(at) >= Duration::from_secs(1))
                    {
                        tracing::warn!(%node, dropped = dropped.0, "agent stream over its rate (limits.agent_messages_per_sec {}, limits.agent_message_burst {}): events, usage and heartbeats dropped", bounds.limits.agent_messages_per_sec, bounds.limits.agent_message_burst);
                        dropped = (0, Some(now));
                    }
                    continue;
                }
                let refused = if droppable || bucket.take() {
                    bounds.limits.agent_message(&message).err()
                } else {
                    Some(LimitError::Flood {
                        node: node.clone(),
                        rate: bounds.limits.agent_messages_per_sec,
                        burst: bounds.limits.agent_message_burst,
                    })
                };
                if let Some(e) = refused {
                    tracing::warn!(%node, "closing the agent stream: {e}");
                    let status = bounds.refuse(&e);
                    if let Some(tx) = closer.upgrade() {
                        let _ = tx.try_send(Err(status));
                    }
                    break;
                }
                // Neither changes what a scheduling pass could do.
                let quiet = matches!(message.msg, Some(Msg::Heartbeat(_) | Msg::Usage(_)));
                match change(&controller, &bounds, &node, message.msg) {
                    // Not awaited here: the next message is applied while this one commits.
                    Ok(Some(pending)) => settle_later(&mut unsettled, pending),
                    Ok(None) => {}
                    Err(e) => tracing::error!(%node, "persisting an agent message: {e}"),
                }
                if !quiet {
                    controller.kick();
                }
            }
            if let Some(durable) = unsettled
                && let Err(e) = durable.await
            {
                tracing::error!(%node, "persisting an agent message: {e}");
            }
            tracing::info!(%node, "agent stream closed");
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// A change's wait for durability, held while the stream reads on.
type Settling = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

/// Holds `pending` as the stream's newest unsettled change. Only a change with writes takes the
/// older one's place: a commit starts when a `durable` is polled, and it carries every change
/// queued before it. An empty change (a heartbeat) that took the place of an ack not yet polled
/// left the ack's writes queued with nothing to start their commit, and its session `Scheduled`
/// until some other change came.
fn settle_later(unsettled: &mut Option<Settling>, pending: Pending) {
    if pending.awaits_commit() || unsettled.is_none() {
        *unsettled = Some(Box::pin(pending.durable()));
    }
}

/// Applies one message of `node`'s stream to the scheduler, queueing what it changed; what it
/// drops is counted in `bounds`.
fn change(
    controller: &Arc<Hub>,
    bounds: &Bounds,
    node: &str,
    message: Option<Msg>,
) -> Result<Option<Pending>, StoreError> {
    let pending = match message {
        Some(Msg::Heartbeat(_)) => {
            controller.count_heartbeat();
            controller.change(|s| s.heartbeat(node))?.1
        }
        Some(Msg::Ack(a)) => controller.change(|s| s.ack(node, &a.session_id))?.1,
        Some(Msg::Nack(n)) => {
            tracing::warn!(%node, session = %n.session_id, reason = %n.reason, "agent refused an allocation: {}", n.message);
            let (releases, pending) =
                controller.change(|s| s.nack(node, &n.session_id, &n.reason, &n.message))?;
            if releases.is_empty() {
                pending
            } else {
                // Its gang failed with it: the other members' nodes let go once that is stored.
                let controller = Arc::clone(controller);
                tokio::spawn(async move {
                    match pending.durable().await {
                        Ok(()) => controller.dispatch(releases),
                        Err(e) => tracing::error!("persisting a failed gang: {e}"),
                    }
                });
                return Ok(None);
            }
        }
        Some(Msg::Event(e)) => {
            let event = convert::event_from_pb(&e);
            // Its enum where the agent filled it, else its name (issue 40).
            let action = event.action.clone();
            let (recorded, pending) =
                controller.change(|s| s.record_event(node, &e.session_id, event))?;
            if recorded {
                tracing::info!(%node, session = %e.session_id, %action, container = %e.container, pid = e.pid, device = e.device, "enforcement: {}", e.reason);
            } else {
                bounds.count(Refusal::ForeignSession);
                // A session ended and forgotten, or a confused agent: not worth an error.
                tracing::warn!(%node, session = %e.session_id, %action, "enforcement event for a session not on this node, dropped: {}", e.reason);
            }
            pending
        }
        Some(Msg::Usage(u)) => {
            let sample = convert::usage_from_pb(&u);
            let (recorded, pending) =
                controller.change(|s| s.record_usage(node, &u.session_id, sample))?;
            if !recorded {
                bounds.count(Refusal::ForeignSession);
                tracing::debug!(%node, session = %u.session_id, "usage for a session not running on this node, dropped");
            }
            pending
        }
        Some(Msg::Observed(o)) if o.ended => {
            let (ended, pending) = controller.change(|s| s.observed_ended(node, &o.session_id))?;
            if ended {
                tracing::info!(%node, session = %o.session_id, "observed session ended: its claim was unprepared");
            } else {
                tracing::debug!(%node, session = %o.session_id, "end of an observed session not running on this node, dropped");
            }
            pending
        }
        Some(Msg::Observed(o)) => {
            let observed = match convert::observed_from_pb(&o) {
                Ok(observed) => observed,
                Err(e) => {
                    bounds.count(Refusal::ForeignSession);
                    tracing::warn!(%node, session = %o.session_id, "observed session dropped: {}", e.message());
                    return Ok(None);
                }
            };
            let (result, pending) = controller.change(|s| s.observe(node, observed))?;
            match result {
                Ok(()) => {
                    let claim = o.claim.unwrap_or_default();
                    tracing::info!(%node, session = %o.session_id, claim = %format!("{}/{}", claim.namespace, claim.claim_name), pod = %claim.pod_name, "observed session");
                }
                Err(e) => {
                    bounds.count(Refusal::ForeignSession);
                    tracing::warn!(%node, "observed session dropped: {e}");
                }
            }
            pending
        }
        None => return Ok(None),
    };
    Ok(Some(pending))
}
