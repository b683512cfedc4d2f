//! Team queues over gRPC (docs/teams.md): `ListQueues` and `GetQueue` for any client,
//! `SetQueue` and `DeleteQueue` for admins only. A change is stored before the answer, and the
//! next scheduling pass holds sessions to it.
//!
//! The service trait's methods ([`super::SchedulerApi`]) call these.

use gpuwarden_proto::{details::Details, v1 as pb};
use tonic::{Code, Request, Response, Status};

use super::SchedulerApi;
use crate::convert;
use crate::{
    auth::clients::Caller,
    hub::store_status,
    limits::LimitError,
    scheduler::{QueueError, QueueSpec, QueueView, quotas::QueueQuota},
    slots::ResourceSlot,
};

/// How a refused queue change is answered.
fn queue_status(e: &QueueError) -> Status {
    if e.is_not_found() {
        Details::new("QUEUE_NOT_FOUND").status(Code::NotFound, e.to_string())
    } else {
        Details::new("INVALID_QUEUE")
            .field("queue", e.to_string())
            .status(Code::InvalidArgument, e.to_string())
    }
}

/// A queue's etag (AIP-154): a digest of what an admin sets (its guarantee, limit and
/// members), not of what it holds, so that usage moving does not fail a `SetQueue`.
fn etag(view: &QueueView) -> String {
    // Slots serialize as sorted maps, and members are kept sorted: the same queue, the same
    // bytes, on every controller.
    let spec = serde_json::to_vec(&(&view.name, &view.quota, &view.members)).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, &spec);
    base64::Engine::encode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        &digest.as_ref()[..12],
    )
}

/// Refuses a change sent with `given` (non-empty) when the queue's etag is not that.
fn check_etag(current: Option<&QueueView>, given: &str) -> Result<(), Status> {
    if given.is_empty() {
        return Ok(());
    }
    let now = current.map(etag);
    if now.as_deref() == Some(given) {
        return Ok(());
    }
    let message = match &now {
        Some(now) => format!(
            "the queue changed since it was read (etag {given:?}, now {now:?}); read it again"
        ),
        None => format!("the queue no longer exists (etag {given:?}); read it again"),
    };
    Err(Details::new("ETAG_MISMATCH")
        .meta("etag", now.unwrap_or_default())
        .status(Code::Aborted, message))
}

/// A queue as `caller` sees it: a user sees itself among the members, and no one else.
fn queue_to_pb(view: QueueView, caller: &Caller) -> pb::Queue {
    let etag = etag(&view);
    let QueueView {
        name,
        quota,
        members,
        held,
        borrowed,
    } = view;
    pb::Queue {
        name,
        guaranteed: Some(convert::slots_to_pb(&quota.guaranteed)),
        limit: quota.limit.as_ref().map(convert::slots_to_pb),
        members: members.into_iter().filter(|m| caller.may_see(m)).collect(),
        held: Some(convert::slots_to_pb(&held)),
        borrowed: Some(convert::slots_to_pb(&borrowed)),
        etag,
    }
}

/// `field`'s slots, refusing a zero: dropped as "absent", it would silently mean "no cap" in a
/// limit and nothing at all in a guarantee.
fn slots(field: &str, slots: Option<&pb::ResourceSlot>) -> Result<ResourceSlot, Status> {
    let parsed = convert::slots_from_pb(slots)
        .map_err(|s| Status::invalid_argument(format!("{field}: {}", s.message())))?;
    if let Some(zero) = slots
        .into_iter()
        .flat_map(|s| s.values.keys())
        .find(|k| parsed.get(k).is_zero())
    {
        return Err(Status::invalid_argument(format!(
            "{field}[{zero}]: zero; leave the slot out instead (in a limit, a slot left out is \
             not capped)"
        )));
    }
    Ok(parsed)
}

/// The queue a `SetQueue` asks for, its lengths held to the controller's bounds.
fn spec_from_pb(api: &SchedulerApi, queue: Option<pb::Queue>) -> Result<QueueSpec, Status> {
    let bounds = &api.bounds;
    let limits = &bounds.limits;
    let q = queue.ok_or_else(|| Status::invalid_argument("queue: missing"))?;
    bounds.counted(limits.name("queue.name", &q.name))?;
    bounds.counted(limits.slots("queue.guaranteed", q.guaranteed.as_ref()))?;
    bounds.counted(limits.slots("queue.limit", q.limit.as_ref()))?;
    if q.members.len() > limits.max_list_len {
        return Err(bounds.refuse(&LimitError::TooMany {
            field: "queue.members".to_owned(),
            count: q.members.len(),
            max: limits.max_list_len,
            key: "max_list_len",
        }));
    }
    for member in &q.members {
        bounds.counted(limits.owner("queue.members", member))?;
    }
    Ok(QueueSpec {
        quota: QueueQuota {
            guaranteed: slots("guaranteed", q.guaranteed.as_ref())?,
            limit: q
                .limit
                .as_ref()
                .map(|l| slots("limit", Some(l)))
                .transpose()?,
        },
        name: q.name,
        members: q.members,
    })
}

pub(super) fn list(
    api: &SchedulerApi,
    request: &Request<pb::ListQueuesRequest>,
) -> Result<Response<pb::ListQueuesResponse>, Status> {
    let caller = api.caller(request)?;
    let r = request.get_ref();
    let pager = api.pager("queues", &r.page_token, r.page_size)?;
    let mut queues = api.controller.read(crate::scheduler::Scheduler::queues);
    // In name order, whatever order the scheduler keeps them in: pages follow names.
    queues.sort_by(|a, b| a.name.cmp(&b.name));
    let (queues, next_page_token) = pager.page(
        queues
            .into_iter()
            .filter(|q| pager.admits(&q.name))
            .map(|q| (q.name.clone(), queue_to_pb(q, &caller))),
    );
    Ok(Response::new(pb::ListQueuesResponse {
        queues,
        next_page_token,
    }))
}

pub(super) fn get(
    api: &SchedulerApi,
    request: Request<pb::GetQueueRequest>,
) -> Result<Response<pb::Queue>, Status> {
    let caller = api.caller(&request)?;
    let name = request.into_inner().name;
    api.bounds.counted(api.bounds.limits.name("name", &name))?;
    api.controller
        .read(|s| s.queue_view(&name))
        .map(|q| Response::new(queue_to_pb(q, &caller)))
        .ok_or_else(|| {
            Details::new("QUEUE_NOT_FOUND")
                .meta("queue", name.as_str())
                .status(Code::NotFound, format!("no queue {name:?}"))
        })
}

pub(super) async fn set(
    api: &SchedulerApi,
    request: Request<pb::SetQueueRequest>,
) -> Result<Response<pb::Queue>, Status> {
    let caller = api.caller(&request)?;
    let queue = request.into_inner().queue;
    if let Some(q) = &queue {
        api.bounds
            .counted(api.bounds.limits.name("queue.name", &q.name))?;
    }
    caller.must_be_admin(|| {
        format!(
            "set queue {:?}",
            queue.as_ref().map(|q| q.name.as_str()).unwrap_or_default()
        )
    })?;
    let given = queue.as_ref().map(|q| q.etag.clone()).unwrap_or_default();
    let spec = spec_from_pb(api, queue)?;
    // Checked and set under one lock: no change slips in between.
    let view = api
        .controller
        .apply(|s| {
            check_etag(s.queue_view(&spec.name).as_ref(), &given)?;
            s.set_queue(spec).map_err(|e| queue_status(&e))
        })
        .await
        .map_err(|e| store_status(&e))??;
    tracing::info!(queue = %view.name, admin = %caller.name, "queue set");
    api.controller.kick();
    Ok(Response::new(queue_to_pb(view, &caller)))
}

pub(super) async fn delete(
    api: &SchedulerApi,
    request: Request<pb::DeleteQueueRequest>,
) -> Result<Response<pb::Queue>, Status> {
    let caller = api.caller(&request)?;
    let pb::DeleteQueueRequest { name, etag: given } = request.into_inner();
    api.bounds.counted(api.bounds.limits.name("name", &name))?;
    caller.must_be_admin(|| format!("delete queue {name:?}"))?;
    let view = api
        .controller
        .apply(|s| {
            let current = s.queue_view(&name);
            // A queue gone is NOT_FOUND, whatever the etag: deleting twice answers as before.
            if current.is_some() {
                check_etag(current.as_ref(), &given)?;
            }
            s.delete_queue(&name).map_err(|e| queue_status(&e))
        })
        .await
        .map_err(|e| store_status(&e))??;
    tracing::info!(queue = %view.name, admin = %caller.name, "queue removed");
    api.controller.kick();
    Ok(Response::new(queue_to_pb(view, &caller)))
}
