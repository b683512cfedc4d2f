//! `SchedulerService`: sessions, nodes, the allocation map and slot types, for clients.
//!
//! Each method first learns who calls ([`ClientAuth::caller`]); a user then sees and acts on
//! only its own sessions (see [`crate::auth::clients`]). What a caller sends is held to
//! [`crate::limits`] before anything else reads it.

use std::{pin::Pin, sync::Arc};

use gpuwarden_proto::details::Details;
use gpuwarden_proto::v1::{self as pb, scheduler_service_server::SchedulerService};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Code, Request, Response, Status};

use super::{SchedulerApi, queues};
use crate::convert;
use crate::{
    hub::{
        store_status,
        watch::{self, Start, StateFilter, WatchError},
    },
    scheduler::{Created, RequestError},
    session::now_ms,
};

/// A request the scheduler refused: the codes as before, told apart by their `ErrorInfo`
/// reason (docs/api.md, "Errors").
fn request_status(e: &RequestError) -> Status {
    let message = e.to_string();
    match e {
        RequestError::Gpu(_) => Details::new("INVALID_GPU_REQUEST")
            .field("requested", &message)
            .status(Code::InvalidArgument, message),
        RequestError::Empty => Details::new("EMPTY_REQUEST")
            .field("requested", &message)
            .status(Code::InvalidArgument, message),
        RequestError::Target(_) => target_status(message),
        RequestError::Gang(_) => Details::new("INVALID_GANG")
            .field("gang", &message)
            .status(Code::InvalidArgument, message),
        RequestError::UnknownSlot { slot, .. } => Details::new("UNKNOWN_SLOT")
            .meta("slot", slot.as_str())
            .status(Code::FailedPrecondition, message),
        RequestError::Oversized { .. } => {
            Details::new("LARGER_THAN_ANY_NODE").status(Code::FailedPrecondition, message)
        }
        RequestError::UnknownNode(node) => Details::new("UNKNOWN_NODE")
            .meta("node", node.as_str())
            .status(Code::FailedPrecondition, message),
    }
}

/// A target that is malformed for its kind or node.
fn target_status(message: String) -> Status {
    Details::new("INVALID_TARGET")
        .field("target", &message)
        .status(Code::InvalidArgument, message)
}

/// How a watch that cannot go on ends.
fn watch_status(e: &WatchError) -> Status {
    let message = e.to_string();
    match e {
        WatchError::TooOld { compacted, .. } => Details::new("REVISION_COMPACTED")
            .meta("compacted", compacted.to_string())
            .status(Code::OutOfRange, message),
        WatchError::TooNew { latest, .. } => Details::new("REVISION_AHEAD")
            .meta("latest", latest.to_string())
            .status(Code::OutOfRange, message),
        WatchError::TermEnded { resume } => Details::new("TERM_ENDED")
            .meta("resume", resume.to_string())
            .status(Code::Unavailable, message),
    }
}

/// No session `id` (or none the caller may see).
fn no_session(id: &str) -> Status {
    Details::new("SESSION_NOT_FOUND")
        .meta("id", id)
        .status(Code::NotFound, format!("no session {id:?}"))
}

/// Where a watch asked to start.
/// A state filter's states are all `SessionState`s.
fn check_states(states: &[i32]) -> Result<(), Status> {
    match states
        .iter()
        .find(|s| pb::SessionState::try_from(**s).is_err())
    {
        Some(bad) => Err(Details::new("INVALID_STATE")
            .field("states", format!("{bad} is not a SessionState"))
            .status(
                Code::InvalidArgument,
                format!("states: {bad} is not a SessionState"),
            )),
        None => Ok(()),
    }
}

/// A watch's state filter, once its states are checked.
fn state_filter(states: &[i32]) -> Result<StateFilter, Status> {
    check_states(states)?;
    Ok(StateFilter::new(states))
}

fn watch_start(r: &pb::WatchSessionsRequest) -> Result<Start, Status> {
    let since = r.since_revision;
    match pb::WatchStart::try_from(r.start) {
        Ok(pb::WatchStart::Unspecified | pb::WatchStart::Now) if since == 0 => Ok(Start::Now),
        Ok(pb::WatchStart::Unspecified | pb::WatchStart::AfterRevision) => Ok(Start::After(since)),
        Ok(pb::WatchStart::Now) => Err(Status::invalid_argument(format!(
            "since_revision {since} with start WATCH_START_NOW: give one or the other"
        ))),
        Err(_) => Err(Status::invalid_argument(format!(
            "start: {} is not a WatchStart",
            r.start
        ))),
    }
}

/// Where the next page of a listing starts, and the revision of its first page: opaque to
/// clients (URL-safe base64 of `revision:created_at_ms:id`).
struct PageToken {
    revision: u64,
    after: (i64, String),
}

impl PageToken {
    fn encode(&self) -> String {
        use base64::Engine as _;
        let (created, id) = &self.after;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(format!("{}:{created}:{id}", self.revision))
    }

    /// The token in `given`, if any; ids in it are held to `max_id_len`.
    fn parse(given: &str, max_id_len: usize) -> Result<Option<Self>, Status> {
        use base64::Engine as _;
        if given.is_empty() {
            return Ok(None);
        }
        let bad = || {
            Details::new("INVALID_PAGE_TOKEN")
                .field("page_token", "not a token this controller gave")
                .status(
                    Code::InvalidArgument,
                    "page_token: not a token this controller gave",
                )
        };
        // revision, time, id and two colons.
        if given.len() > (max_id_len + 48) * 4 / 3 + 4 {
            return Err(bad());
        }
        let text = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(given)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(bad)?;
        let mut parts = text.splitn(3, ':');
        let (Some(revision), Some(created), Some(id)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        Ok(Some(Self {
            revision: revision.parse().map_err(|_| bad())?,
            after: (created.parse().map_err(|_| bad())?, id.to_owned()),
        }))
    }
}

#[tonic::async_trait]
impl SchedulerService for SchedulerApi {
    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let caller = self.caller(&request)?;
        let mut r = request.into_inner();
        let limits = &self.bounds.limits;
        self.bounds.counted(limits.create(&r))?;
        let owner = caller.owner_for_create(std::mem::take(&mut r.owner))?;
        let unconfined = r.unconfined_target;
        let request_id = Some(std::mem::take(&mut r.request_id)).filter(|r| !r.is_empty());
        let id = self
            .controller
            .new_session_id()
            .ok_or_else(|| Status::unavailable("the system's random source failed; retry"))?;
        let mut new = convert::new_session_from_pb(id, owner, r)?;
        // Checked before authorizing, so a malformed target is named as such.
        new.target
            .validate(new.pinned_node.as_deref())
            .map_err(|e| target_status(e.to_string()))?;
        new.scope = self.clients.authorize_target(
            &caller,
            &new.owner,
            &new.target,
            new.policy,
            unconfined,
        )?;
        let log = self.controller.session_log();
        let (created, pending) = self
            .controller
            .change(|s| {
                // A retry is looked for first, under the scheduler's lock, so that two tries
                // racing make one session, and a retry is not refused for the cap its first try
                // counts against.
                if let Some(first) = request_id
                    .as_deref()
                    .and_then(|r| s.retried(&new.owner, r, now_ms()))
                {
                    let first = first.clone();
                    // Not stored yet (its commit failed, or is under way): written again, so
                    // that this answer, too, waits until it is.
                    if log.get(&first.id).is_none() {
                        s.rewrite(&first.id);
                    }
                    return Ok(Created::Retried(first));
                }
                // Under the scheduler's lock, so a storm of creates stops at exactly the cap.
                let (mine, total) = s.live_sessions(&new.owner);
                self.bounds
                    .counted(limits.admit_session(&new.owner, mine, total))?;
                s.create_once(new, request_id, now_ms())
                    .map_err(|e| request_status(&e))
            })
            .map_err(|e| store_status(&e))?;
        let (Created::New(created) | Created::Retried(created)) = created?;
        // As stored, with the revision of its creation: a watch from it misses nothing after.
        let announced = pending.announced(&created.id).cloned();
        pending.durable().await.map_err(|e| store_status(&e))?;
        let answer = announced
            .or_else(|| log.get(&created.id).map(|s| pb::Session::clone(&s)))
            .unwrap_or_else(|| convert::session_to_pb(&created));
        self.controller.kick();
        Ok(Response::new(answer))
    }

    async fn get_session(
        &self,
        request: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let caller = self.caller(&request)?;
        let id = request.into_inner().id;
        self.bounds.counted(self.bounds.limits.id("id", &id))?;
        // From the stored state, as List and Watch answer: never a change a failover could
        // still lose (a session being created is not found until its creation is stored).
        let mut session = self
            .controller
            .session_log()
            .get(&id)
            .map(|s| pb::Session::clone(&s));
        caller.may_act_on_session(session.as_ref().map(|s| s.owner.as_str()), &id, "see")?;
        // But its share is what its node measured last, not state: usage reports are not
        // stored with the session, so the stored copy's would be as old as its last change.
        if let Some(session) = &mut session
            && let Some(share) = self
                .controller
                .read(|s| s.sessions().get(&id).map(convert::share_to_pb))
        {
            session.share = Some(share);
        }
        session.map(Response::new).ok_or_else(|| no_session(&id))
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let limits = &self.bounds.limits;
        self.bounds.counted(limits.owner("owner", &r.owner))?;
        let owner = caller.owner_filter(r.owner)?;
        let states = r.states.clone();
        check_states(&states)?;
        let token = PageToken::parse(&r.page_token, limits.max_id_len)?;
        let size = match usize::try_from(r.page_size) {
            Ok(0) | Err(_) => limits.max_page_size,
            Ok(n) => n.min(limits.max_page_size),
        }
        .max(1);
        // Room for the answer's other fields within the message limit.
        let budget = limits.max_message_bytes.saturating_sub(4 << 10);
        let page = self.controller.session_log().page(
            |x| {
                (owner.is_empty() || x.owner == owner)
                    && (states.is_empty() || states.contains(&x.state))
            },
            token.as_ref().map(|t| &t.after),
            size,
            budget,
        );
        // Every page of a listing reports the first page's revision: a watch from it misses
        // nothing that changed while the pages were read.
        let revision = token.as_ref().map_or(page.revision, |t| t.revision);
        let next_page_token = page
            .next
            .map(|after| PageToken { revision, after }.encode())
            .unwrap_or_default();
        Ok(Response::new(pb::ListSessionsResponse {
            sessions: page.sessions,
            revision,
            next_page_token,
        }))
    }

    type WatchSessionsStream = Pin<Box<dyn Stream<Item = Result<pb::Session, Status>> + Send>>;

    async fn watch_sessions(
        &self,
        request: Request<pb::WatchSessionsRequest>,
    ) -> Result<Response<Self::WatchSessionsStream>, Status> {
        let caller = self.caller(&request)?;
        let counted_as = self.counted_as(&caller, &request);
        let start = watch_start(request.get_ref())?;
        let mut states = state_filter(&request.get_ref().states)?;
        let log = Arc::clone(self.controller.session_log());
        let start = log.start(start).map_err(|e| watch_status(&e))?;
        // The stream's task owns the guard: its place is freed when the client goes away.
        let guard = self.bounds.counted(self.bounds.open_watch(&counted_as))?;
        let role = self.controller.role().clone();
        let rx = watch::stream(
            log,
            start,
            move |s| caller.may_see(&s.owner) && states.admits(s),
            move |e| match e {
                WatchError::TermEnded { .. } if !role.is_leader() => {
                    // The standby's answer, naming the leader to follow.
                    role.refusal_after(Some(&e.to_string()))
                }
                e => watch_status(&e),
            },
            guard,
        );
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type WatchSessionEventsStream =
        Pin<Box<dyn Stream<Item = Result<pb::SessionEvent, Status>> + Send>>;

    async fn watch_session_events(
        &self,
        request: Request<pb::WatchSessionEventsRequest>,
    ) -> Result<Response<Self::WatchSessionEventsStream>, Status> {
        let caller = self.caller(&request)?;
        let counted_as = self.counted_as(&caller, &request);
        let r = request.into_inner();
        self.bounds
            .counted(self.bounds.limits.owner("owner", &r.owner))?;
        let owner = caller.owner_filter(r.owner.clone())?;
        let start = watch_start(&pb::WatchSessionsRequest {
            since_revision: r.since_revision,
            start: r.start,
            states: Vec::new(),
        })?;
        let mut states = state_filter(&r.states)?;
        let log = Arc::clone(self.controller.session_log());
        let start = log.start(start).map_err(|e| watch_status(&e))?;
        let guard = self.bounds.counted(self.bounds.open_watch(&counted_as))?;
        let role = self.controller.role().clone();
        let rx = watch::events(
            log,
            start,
            move |s| {
                caller.may_see(&s.owner)
                    && (owner.is_empty() || s.owner == owner)
                    && states.admits(s)
            },
            move |e| match e {
                WatchError::TermEnded { .. } if !role.is_leader() => {
                    role.refusal_after(Some(&e.to_string()))
                }
                e => watch_status(&e),
            },
            guard,
        );
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn terminate_session(
        &self,
        request: Request<pb::TerminateSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let caller = self.caller(&request)?;
        let id = request.into_inner().id;
        self.bounds.counted(self.bounds.limits.id("id", &id))?;
        // An owner and an origin never change, so checking before the change is enough; a
        // user learns nothing of an id that is not its own, not even whether it exists.
        let found = self.controller.read(|s| {
            s.sessions()
                .get(&id)
                .map(|x| (x.owner.clone(), x.origin.clone()))
        });
        caller.may_act_on_session(found.as_ref().map(|(o, _)| o.as_str()), &id, "end")?;
        if let Some(claim) = found.as_ref().and_then(|(_, origin)| origin.claim()) {
            // Kubernetes placed it; ending it here would lift a quota the pod still runs
            // under, and the kubelet would never hear of it.
            return Err(Details::new("OWNED_BY_KUBERNETES")
                .meta("namespace", claim.namespace.as_str())
                .meta("claim", claim.claim_name.as_str())
                .meta("pod", claim.pod_name.as_str())
                .status(
                    Code::FailedPrecondition,
                    format!(
                        "session {id} is owned by Kubernetes claim {}/{} (pod {}); delete the \
                         pod or the claim",
                        claim.namespace, claim.claim_name, claim.pod_name
                    ),
                ));
        }
        let controller = Arc::clone(&self.controller);
        let (command, session) = self
            .controller
            .apply(|s| {
                // Waited on only where an agent can confirm the release (issue 40).
                let command = s.terminate_with(&id, |node| controller.agent_connected(node));
                (command, s.sessions().get(&id).map(convert::session_to_pb))
            })
            .await
            .map_err(|e| store_status(&e))?;
        let session = session.ok_or_else(|| no_session(&id))?;
        self.controller.dispatch(command.into_iter().collect());
        self.controller.kick();
        Ok(Response::new(session))
    }

    async fn list_nodes(
        &self,
        request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        // Any client sees every node: a node message names no session.
        self.caller(&request)?;
        let r = request.into_inner();
        let pager = self.pager("nodes", &r.page_token, r.page_size)?;
        let (nodes, next_page_token) = self.controller.read(|s| {
            pager.page(
                s.nodes()
                    .iter()
                    .filter(|(id, _)| pager.admits(id))
                    .map(|(id, n)| (id.clone(), convert::node_to_pb(n))),
            )
        });
        Ok(Response::new(pb::ListNodesResponse {
            nodes,
            next_page_token,
        }))
    }

    async fn get_node(
        &self,
        request: Request<pb::GetNodeRequest>,
    ) -> Result<Response<pb::Node>, Status> {
        self.caller(&request)?;
        let id = request.into_inner().node_id;
        self.bounds.counted(self.bounds.limits.id("node_id", &id))?;
        self.controller
            .read(|s| s.nodes().get(&id).map(convert::node_to_pb))
            .map(Response::new)
            .ok_or_else(|| {
                Details::new("NODE_NOT_FOUND")
                    .meta("node", id.as_str())
                    .status(Code::NotFound, format!("no node {id:?}"))
            })
    }

    async fn get_allocation_map(
        &self,
        request: Request<pb::GetAllocationMapRequest>,
    ) -> Result<Response<pb::GetAllocationMapResponse>, Status> {
        let caller = self.caller(&request)?;
        let r = request.into_inner();
        let id = r.node_id;
        self.bounds.counted(self.bounds.limits.id("node_id", &id))?;
        let pager = self.pager("allocation_map", &r.page_token, r.page_size)?;
        let (nodes, next_page_token) = self.controller.read(|s| {
            pager.page(
                s.nodes()
                    .iter()
                    .filter(|(nid, _)| (id.is_empty() || **nid == id) && pager.admits(nid))
                    .map(|(nid, n)| {
                        (
                            nid.clone(),
                            pb::NodeAllocationMap {
                                node_id: nid.clone(),
                                devices: n
                                    .allocator
                                    .devices()
                                    .iter()
                                    .map(|d| pb::DeviceAllocation {
                                        uuid: d.spec.uuid.clone(),
                                        index: d.spec.index,
                                        capacity_shares: d.capacity.to_string(),
                                        allocated_shares: d.allocated.to_string(),
                                        memory_bytes: d.spec.memory_bytes,
                                        allocated_memory_bytes: d.allocated_memory,
                                        kubernetes: d.kubernetes,
                                        parent_uuid: d.spec.parent_uuid.clone(),
                                        // A user sees the shares others hold, not their session ids.
                                        sessions: d
                                            .sessions
                                            .iter()
                                            .filter(|sid| {
                                                caller.is_admin()
                                                    || s.sessions()
                                                        .get(*sid)
                                                        .is_some_and(|x| caller.may_see(&x.owner))
                                            })
                                            .cloned()
                                            .collect(),
                                    })
                                    .collect(),
                            },
                        )
                    }),
            )
        });
        if !id.is_empty() && nodes.is_empty() && pager.after().is_none() {
            return Err(Details::new("NODE_NOT_FOUND")
                .meta("node", id.as_str())
                .status(Code::NotFound, format!("no node {id:?}")));
        }
        Ok(Response::new(pb::GetAllocationMapResponse {
            nodes,
            next_page_token,
        }))
    }

    async fn list_slot_types(
        &self,
        request: Request<pb::ListSlotTypesRequest>,
    ) -> Result<Response<pb::ListSlotTypesResponse>, Status> {
        self.caller(&request)?;
        let slot_types = self.controller.read(|s| {
            s.registry()
                .iter()
                .map(|(n, k)| pb::SlotType {
                    name: n.to_string(),
                    kind: convert::kind_to_pb(k).into(),
                })
                .collect()
        });
        Ok(Response::new(pb::ListSlotTypesResponse { slot_types }))
    }

    async fn list_profiles(
        &self,
        request: Request<pb::ListProfilesRequest>,
    ) -> Result<Response<pb::ListProfilesResponse>, Status> {
        self.caller(&request)?;
        let r = request.into_inner();
        let pager = self.pager("profiles", &r.page_token, r.page_size)?;
        let (profiles, next_page_token) = self.controller.read(|s| {
            pager.page(
                s.profiles()
                    .iter()
                    .filter(|p| pager.admits(&p.class))
                    .map(|p| (p.class.clone(), convert::profile_to_pb(p))),
            )
        });
        Ok(Response::new(pb::ListProfilesResponse {
            profiles,
            next_page_token,
        }))
    }

    async fn get_profile(
        &self,
        request: Request<pb::GetProfileRequest>,
    ) -> Result<Response<pb::Profile>, Status> {
        let caller = self.caller(&request)?;
        let class = request.into_inner().class;
        self.bounds
            .counted(self.bounds.limits.name("class", &class))?;
        // A user reads the profile its own sessions of that class are filed under.
        let class = self.controller.read(|s| {
            s.config()
                .filed_class(&caller.name, class, caller.is_admin())
        });
        self.controller
            .read(|s| s.profiles().get(&class).map(convert::profile_to_pb))
            .map(Response::new)
            .ok_or_else(|| {
                Details::new("PROFILE_NOT_FOUND")
                    .meta("class", class.as_str())
                    .status(
                        Code::NotFound,
                        format!(
                            "no profile for class {class:?}: no session of it has finished yet"
                        ),
                    )
            })
    }

    async fn list_queues(
        &self,
        request: Request<pb::ListQueuesRequest>,
    ) -> Result<Response<pb::ListQueuesResponse>, Status> {
        queues::list(self, &request)
    }

    async fn get_queue(
        &self,
        request: Request<pb::GetQueueRequest>,
    ) -> Result<Response<pb::Queue>, Status> {
        queues::get(self, request)
    }

    async fn set_queue(
        &self,
        request: Request<pb::SetQueueRequest>,
    ) -> Result<Response<pb::Queue>, Status> {
        queues::set(self, request).await
    }

    async fn delete_queue(
        &self,
        request: Request<pb::DeleteQueueRequest>,
    ) -> Result<Response<pb::Queue>, Status> {
        queues::delete(self, request).await
    }
}
