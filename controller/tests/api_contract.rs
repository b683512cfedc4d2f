//! The client contract of issue 40 (docs/api.md), over real gRPC on loopback: a
//! `CreateSession` retried with its request id makes one session, in one controller, across a
//! crash and restart on sled, and across a failover on a real etcd; each refusal says why in
//! its details (a reason code, a retry hint where retrying helps, the leader a standby names).

use std::time::Duration;

use gpuwarden_controller::{
    limits::{Bounds, Limits},
    server::Transport,
};
use gpuwarden_proto::{details, v1 as pb};
use gpuwarden_test_support::controller::{ControllerProcess as Member, request, serve_in_process};
use tonic::Code;

/// A session of one CPU named `name` made under `request_id`.
fn retryable(name: &str, request_id: &str) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        request_id: request_id.into(),
        ..request(name)
    }
}

/// The ids of every session `member` lists.
async fn ids(
    client: &mut pb::scheduler_service_client::SchedulerServiceClient<tonic::transport::Channel>,
) -> Vec<String> {
    client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("lists")
        .into_inner()
        .sessions
        .into_iter()
        .map(|s| s.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_retried_with_its_request_id_makes_one_session() {
    let scratch = gpuwarden_test_support::scratch("contract-retry");
    let addr = serve_in_process(
        scratch.path(),
        Transport::PlainText,
        Bounds::new(Limits::default()),
    )
    .await;
    gpuwarden_test_support::node::register(
        &format!("http://{addr}"),
        gpuwarden_test_support::node::with_cpus("n1", 8),
    )
    .await;
    let mut client = pb::scheduler_service_client::SchedulerServiceClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("a URL")
            .connect()
            .await
            .expect("connects"),
    );
    let first = client
        .create_session(retryable("a", "req-1"))
        .await
        .expect("created")
        .into_inner();
    assert_eq!(first.request_id, "req-1");
    // Retries, concurrent ones included, answer the first session.
    let mut tries = Vec::new();
    for _ in 0..8 {
        let mut client = client.clone();
        tries.push(tokio::spawn(async move {
            client
                .create_session(retryable("a", "req-1"))
                .await
                .expect("answered")
                .into_inner()
                .id
        }));
    }
    for t in tries {
        assert_eq!(t.await.expect("joined"), first.id);
    }
    // Another request id, or none, makes another session.
    let other = client
        .create_session(retryable("a", "req-2"))
        .await
        .expect("created")
        .into_inner();
    assert_ne!(other.id, first.id);
    let plain = client
        .create_session(request("a"))
        .await
        .expect("created")
        .into_inner();
    assert_ne!(plain.id, first.id);
    assert_eq!(ids(&mut client).await.len(), 3);
    // Ending is safe to retry, and a listing filters by state.
    for _ in 0..2 {
        let ended = client
            .terminate_session(pb::TerminateSessionRequest {
                id: plain.id.clone(),
            })
            .await
            .expect("ended")
            .into_inner();
        assert_eq!(ended.state(), pb::SessionState::Terminated);
    }
    let only = |states: &[pb::SessionState]| pb::ListSessionsRequest {
        states: states.iter().map(|s| i32::from(*s)).collect(),
        ..Default::default()
    };
    let terminated = client
        .list_sessions(only(&[pb::SessionState::Terminated]))
        .await
        .expect("lists")
        .into_inner()
        .sessions;
    assert_eq!(
        terminated.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        [plain.id.as_str()]
    );
    let live = client
        .list_sessions(only(&[
            pb::SessionState::Pending,
            pb::SessionState::Scheduled,
            pb::SessionState::Running,
        ]))
        .await
        .expect("lists")
        .into_inner()
        .sessions;
    assert_eq!(live.len(), 2);
    // A request id over the id limit is refused, not cut.
    let long = client
        .create_session(retryable("a", &"x".repeat(10_000)))
        .await
        .expect_err("too long");
    assert_eq!(long.code(), tonic::Code::InvalidArgument);
}

/// Creates under one request id on `first`, replaces it with `replace`, retries there: one
/// session.
async fn retried_across(first: Member, replace: impl AsyncFnOnce(Member) -> Member) {
    first.register_node().await;
    let made = first
        .client()
        .await
        .create_session(retryable("across", "req-across"))
        .await
        .expect("created")
        .into_inner();
    let next = replace(first).await;
    let mut client = next.client().await;
    let retried = client
        .create_session(retryable("across", "req-across"))
        .await
        .expect("the retry is answered")
        .into_inner();
    assert_eq!(retried.id, made.id, "the retry answers the first session");
    assert_eq!(ids(&mut client).await, [made.id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_retried_across_a_sled_restart_makes_one_session() {
    let scratch = gpuwarden_test_support::scratch("contract-restart");
    let store = format!("sled:{}", scratch.path().join("store").display());
    let first = Member::start(&store, &[]);
    first.until_serving(Duration::from_secs(10)).await;
    retried_across(first, async |first| {
        // A crash, not a clean stop.
        drop(first);
        let next = Member::start(&store, &[]);
        next.until_serving(Duration::from_secs(10)).await;
        next
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_retried_across_a_failover_on_etcd_makes_one_session() {
    let etcd = gpuwarden_test_support::Etcd::start();
    let store = etcd.store_url("contract-failover");
    let elected = |store: &str| Member::start(store, &["--lease-ttl-secs", "2"]);
    let first = elected(&store);
    first.until_serving(Duration::from_secs(10)).await;
    let standby = elected(&store);
    // The standby names the leader in a typed detail, having done nothing.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let refused = standby
            .client()
            .await
            .create_session(retryable("across", "req-across"))
            .await
            .expect_err("a standby creates nothing");
        assert_eq!(refused.code(), Code::Unavailable);
        assert_eq!(details::reason(&refused).as_deref(), Some("NOT_LEADER"));
        let named = details::not_leader(&refused)
            .expect("a NotLeader detail")
            .leader;
        if named == first.addr.to_string() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the standby never named the leader (last: {named:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    retried_across(first, async |first| {
        drop(first);
        standby.until_serving(Duration::from_secs(15)).await;
        standby
    })
    .await;
}

/// A controller in this process held to `limits`, with a node of 8 CPUs; a client of it.
async fn limited(
    dir: &std::path::Path,
    limits: Limits,
) -> pb::scheduler_service_client::SchedulerServiceClient<tonic::transport::Channel> {
    let addr = serve_in_process(dir, Transport::PlainText, Bounds::new(limits)).await;
    gpuwarden_test_support::node::register(
        &format!("http://{addr}"),
        gpuwarden_test_support::node::with_cpus("n1", 8),
    )
    .await;
    pb::scheduler_service_client::SchedulerServiceClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("a URL")
            .connect()
            .await
            .expect("connects"),
    )
}

/// Its code, reason and retry hint.
fn why(status: &tonic::Status) -> (Code, Option<String>, Option<Duration>) {
    (
        status.code(),
        details::reason(status),
        details::retry_delay(status),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_refusal_names_its_reason_and_only_a_rate_says_when_to_retry() {
    let scratch = gpuwarden_test_support::scratch("contract-errors");
    let mut client = limited(
        scratch.path(),
        Limits {
            max_sessions_per_owner: 1,
            ..Limits::default()
        },
    )
    .await;
    // Three FAILED_PRECONDITIONs told apart.
    let ask = |slots: &[(&str, &str)], node: &str| {
        let mut r = request("x");
        r.requested = Some(pb::ResourceSlot {
            values: slots
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        });
        r.node_id = node.into();
        let mut client = client.clone();
        async move { client.create_session(r).await.expect_err("refused") }
    };
    for (refused, reason) in [
        (ask(&[("fpga", "1")], "").await, "UNKNOWN_SLOT"),
        (ask(&[("cpu", "1000")], "").await, "LARGER_THAN_ANY_NODE"),
        (ask(&[("cpu", "1")], "nowhere").await, "UNKNOWN_NODE"),
    ] {
        assert_eq!(
            why(&refused),
            (Code::FailedPrecondition, Some(reason.into()), None),
            "{refused:?}"
        );
    }
    client
        .create_session(request("first"))
        .await
        .expect("created");
    // The cap: RESOURCE_EXHAUSTED, and no retry hint (retrying won't help until one ends).
    let cap = client
        .create_session(request("second"))
        .await
        .expect_err("over the cap");
    assert_eq!(
        why(&cap),
        (Code::ResourceExhausted, Some("CAP".into()), None)
    );
    let oversized = client
        .create_session(retryable("x", &"x".repeat(10_000)))
        .await
        .expect_err("too long");
    assert_eq!(
        why(&oversized),
        (Code::InvalidArgument, Some("OVERSIZED".into()), None)
    );
    let missing = client
        .get_session(pb::GetSessionRequest { id: "none".into() })
        .await
        .expect_err("no such session");
    assert_eq!(
        why(&missing),
        (Code::NotFound, Some("SESSION_NOT_FOUND".into()), None)
    );

    // A rate: RESOURCE_EXHAUSTED with a hint, one call's worth of the rate.
    let scratch = gpuwarden_test_support::scratch("contract-rate");
    let mut client = limited(
        scratch.path(),
        Limits {
            client_requests_per_sec: 4,
            client_request_burst: 1,
            ..Limits::default()
        },
    )
    .await;
    let mut refused = None;
    for _ in 0..10 {
        if let Err(e) = client.list_nodes(pb::ListNodesRequest::default()).await {
            refused = Some(e);
            break;
        }
    }
    let refused = refused.expect("ten calls at once exceed 4/s with bursts of 1");
    assert_eq!(
        why(&refused),
        (
            Code::ResourceExhausted,
            Some("RATE".into()),
            Some(Duration::from_millis(250))
        )
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    client
        .list_nodes(pb::ListNodesRequest::default())
        .await
        .expect("answered after the hinted delay");
}

/// Nodes the paging test registers.
const NODES: usize = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_hold_every_node_of_ten_thousand_exactly_once_while_nodes_join() {
    let scratch = gpuwarden_test_support::scratch("contract-pages");
    let addr = serve_in_process(
        scratch.path(),
        Transport::PlainText,
        Bounds::new(Limits {
            client_requests_per_sec: 100_000,
            client_request_burst: 100_000,
            ..Limits::default()
        }),
    )
    .await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("a URL")
        .connect()
        .await
        .expect("connects");
    let agents = pb::agent_service_client::AgentServiceClient::new(channel.clone());
    let register = |ids: Vec<String>| {
        let agents = agents.clone();
        async move {
            let mut tasks = Vec::new();
            for chunk in ids.chunks(ids.len().div_ceil(16).max(1)) {
                let mut agents = agents.clone();
                let chunk = chunk.to_vec();
                tasks.push(tokio::spawn(async move {
                    for id in chunk {
                        agents
                            .register(gpuwarden_test_support::node::with_cpus(&id, 1))
                            .await
                            .expect("registers");
                    }
                }));
            }
            for t in tasks {
                t.await.expect("joined");
            }
        }
    };
    let first: Vec<String> = (0..NODES).map(|i| format!("node-{i:05}")).collect();
    register(first.clone()).await;

    let mut client = pb::scheduler_service_client::SchedulerServiceClient::new(channel);
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let mut page_token = String::new();
    let mut pages = 0;
    let (mut late, mut early) = (Vec::new(), Vec::new());
    loop {
        let page = client
            .list_nodes(pb::ListNodesRequest {
                page_size: 700,
                page_token,
            })
            .await
            .expect("lists")
            .into_inner();
        assert!(page.nodes.len() <= 700);
        for n in page.nodes {
            *seen
                .entry(n.info.expect("a node says who it is").node_id)
                .or_default() += 1;
        }
        pages += 1;
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
        // Nodes that join between pages, before and after the cursor, move nothing.
        late.push(format!("node-{:05}-late", pages * 700));
        early.push(format!("node-{pages:05}-early"));
        register(vec![
            late[late.len() - 1].clone(),
            early[early.len() - 1].clone(),
        ])
        .await;
    }
    for id in first.iter().chain(&late) {
        assert_eq!(seen.get(id), Some(&1), "{id} on one page");
    }
    // Those that joined behind the cursor are on no page of this listing.
    for id in &early {
        assert_eq!(seen.get(id), None, "{id} joined before the cursor");
    }
    assert_eq!(pages, (NODES + late.len()).div_ceil(700));
    assert!(seen.values().all(|n| *n == 1), "no node is on two pages");
    // No size: everything at once, as before pages.
    let all = client
        .list_nodes(pb::ListNodesRequest::default())
        .await
        .expect("lists")
        .into_inner();
    assert!(all.nodes.len() >= NODES && all.next_page_token.is_empty());
}

/// How many times each name is on a page, and how many pages there were.
type Paged = (std::collections::BTreeMap<String, usize>, usize);

/// Pages `list` (a page of at most `size` from a token: its names and the next token) to its end.
async fn page_through<F, Fut>(size: u32, mut list: F) -> Paged
where
    F: FnMut(u32, String) -> Fut,
    Fut: std::future::Future<Output = (Vec<String>, String)>,
{
    let (mut seen, mut pages, mut token) = (std::collections::BTreeMap::new(), 0, String::new());
    loop {
        let (names, next) = list(size, token).await;
        assert!(names.len() <= size as usize, "{names:?}");
        for n in names {
            *seen.entry(n).or_default() += 1;
        }
        pages += 1;
        if next.is_empty() {
            return (seen, pages);
        }
        token = next;
    }
}

/// A client of the controller at `url`, once it has set a queue of each of `names`.
async fn admin_sets_queues(
    url: String,
    names: &[String],
) -> pb::scheduler_service_client::SchedulerServiceClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(url)
        .expect("a URL")
        .connect()
        .await
        .expect("connects");
    let client = pb::scheduler_service_client::SchedulerServiceClient::new(channel);
    for (i, name) in names.iter().enumerate() {
        client
            .clone()
            .set_queue(pb::SetQueueRequest {
                queue: Some(pb::Queue {
                    name: name.clone(),
                    members: vec![format!("user-{i}")],
                    ..Default::default()
                }),
            })
            .await
            .expect("set");
    }
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_and_the_allocation_map_page_each_entry_once() {
    const MANY: usize = 23;
    let scratch = gpuwarden_test_support::scratch("contract-other-pages");
    let addr = serve_in_process(
        scratch.path(),
        Transport::PlainText,
        Bounds::new(Limits::default()),
    )
    .await;
    let url = format!("http://{addr}");
    let nodes: Vec<String> = (0..MANY).map(|i| format!("node-{i:02}")).collect();
    let queues: Vec<String> = (0..MANY).map(|i| format!("team-{i:02}")).collect();
    for id in &nodes {
        gpuwarden_test_support::node::register(
            &url,
            gpuwarden_test_support::node::with_cpus(id, 1),
        )
        .await;
    }
    let client = admin_sets_queues(url, &queues).await;
    let list_queues = |page_size, page_token| {
        let mut c = client.clone();
        async move {
            let page = c
                .list_queues(pb::ListQueuesRequest {
                    page_size,
                    page_token,
                })
                .await
                .expect("lists")
                .into_inner();
            let names = page.queues.into_iter().map(|q| q.name).collect();
            (names, page.next_page_token)
        }
    };
    let allocation_map = |page_size, page_token| {
        let mut c = client.clone();
        async move {
            let page = c
                .get_allocation_map(pb::GetAllocationMapRequest {
                    page_size,
                    page_token,
                    ..Default::default()
                })
                .await
                .expect("maps")
                .into_inner();
            let names = page.nodes.into_iter().map(|n| n.node_id).collect();
            (names, page.next_page_token)
        }
    };
    for (what, want, (seen, pages)) in [
        ("queues", &queues, page_through(5, list_queues).await),
        ("nodes", &nodes, page_through(5, allocation_map).await),
    ] {
        let once: Vec<&String> = seen
            .iter()
            .filter(|(_, n)| **n == 1)
            .map(|(k, _)| k)
            .collect();
        assert_eq!(once, want.iter().collect::<Vec<_>>(), "{what}: {seen:?}");
        assert_eq!(seen.len(), want.len(), "{what}: {seen:?}");
        assert_eq!(pages, MANY.div_ceil(5), "{what}");
    }
    // No size: everything on one page, as before pages.
    let (all, next) = list_queues(0, String::new()).await;
    assert_eq!((all.len(), next.as_str()), (MANY, ""));
    let (all, next) = allocation_map(0, String::new()).await;
    assert_eq!((all.len(), next.as_str()), (MANY, ""));
    // A token belongs to its list.
    let (_, queue_token) = list_queues(5, String::new()).await;
    let refused = client
        .clone()
        .get_allocation_map(pb::GetAllocationMapRequest {
            page_size: 5,
            page_token: queue_token,
            ..Default::default()
        })
        .await
        .expect_err("another list's token");
    assert_eq!(
        why(&refused),
        (
            Code::InvalidArgument,
            Some("INVALID_PAGE_TOKEN".into()),
            None
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_change_from_a_stale_read_is_aborted() {
    let scratch = gpuwarden_test_support::scratch("contract-etag");
    let mut client = limited(scratch.path(), Limits::default()).await;
    let set = |cpus: &str, etag: &str| pb::SetQueueRequest {
        queue: Some(pb::Queue {
            name: "team-a".into(),
            guaranteed: Some(pb::ResourceSlot {
                values: [("cpu".to_owned(), cpus.to_owned())].into(),
            }),
            members: vec!["alice".into()],
            etag: etag.into(),
            ..Default::default()
        }),
    };
    let first = client
        .set_queue(set("1", ""))
        .await
        .expect("set")
        .into_inner();
    assert!(!first.etag.is_empty());
    // Two admins read the same queue; the first to write wins, the second is told.
    let read = client
        .get_queue(pb::GetQueueRequest {
            name: "team-a".into(),
        })
        .await
        .expect("read")
        .into_inner();
    assert_eq!(read.etag, first.etag);
    let won = client
        .set_queue(set("2", &read.etag))
        .await
        .expect("the etag matches")
        .into_inner();
    assert_ne!(won.etag, read.etag);
    let lost = client
        .set_queue(set("3", &read.etag))
        .await
        .expect_err("a stale etag");
    assert_eq!(
        why(&lost),
        (Code::Aborted, Some("ETAG_MISMATCH".into()), None)
    );
    let stale_delete = client
        .delete_queue(pb::DeleteQueueRequest {
            name: "team-a".into(),
            etag: read.etag.clone(),
        })
        .await
        .expect_err("a stale etag");
    assert_eq!(stale_delete.code(), Code::Aborted);
    let kept = client
        .get_queue(pb::GetQueueRequest {
            name: "team-a".into(),
        })
        .await
        .expect("still there")
        .into_inner();
    assert_eq!(
        kept.guaranteed.expect("a guarantee").values["cpu"],
        "2",
        "the aborted change did nothing"
    );
    client
        .delete_queue(pb::DeleteQueueRequest {
            name: "team-a".into(),
            etag: won.etag,
        })
        .await
        .expect("the current etag deletes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_watch_is_sent_bookmarks_past_changes_it_does_not_see() {
    use pb::session_event::Event;
    use tokio_stream::StreamExt as _;

    let scratch = gpuwarden_test_support::scratch("contract-bookmarks");
    let mut client = limited(scratch.path(), Limits::default()).await;
    let listed = client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("lists")
        .into_inner();
    let mut events = client
        .watch_session_events(pb::WatchSessionEventsRequest {
            since_revision: listed.revision,
            start: pb::WatchStart::AfterRevision.into(),
            owner: "alice".into(),
            ..Default::default()
        })
        .await
        .expect("watches")
        .into_inner();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .expect("an event within 10 s")
            .expect("the watch goes on")
            .expect("an event")
            .event
            .expect("a session or a bookmark")
    };
    // Caught up at once: the listing's revision.
    assert_eq!(
        next().await,
        Event::Bookmark(pb::WatchBookmark {
            revision: listed.revision
        })
    );
    // Bob's session is not for this watcher: a bookmark past it instead.
    let bobs = client
        .create_session(pb::CreateSessionRequest {
            owner: "bob".into(),
            ..request("bobs")
        })
        .await
        .expect("created")
        .into_inner();
    match next().await {
        Event::Bookmark(b) => assert!(b.revision >= bobs.revision, "{b:?} before {bobs:?}"),
        Event::Session(s) => panic!("a session of {} sent to alice's watch", s.owner),
    }
    let alices = client
        .create_session(request("alices"))
        .await
        .expect("created")
        .into_inner();
    loop {
        match next().await {
            Event::Bookmark(_) => {}
            Event::Session(s) => {
                assert_eq!(s.owner, "alice");
                if s.id == alices.id {
                    break;
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_sets_travel_as_enums_beside_their_strings() {
    let scratch = gpuwarden_test_support::scratch("contract-enums");
    let mut client = limited(scratch.path(), Limits::default()).await;
    let spread = client
        .create_session(pb::CreateSessionRequest {
            placement_mode: pb::PlacementMode::Spread.into(),
            ..request("spread")
        })
        .await
        .expect("created")
        .into_inner();
    assert_eq!(
        (
            spread.placement.as_str(),
            spread.placement_mode(),
            spread.origin.as_str(),
            spread.origin_kind()
        ),
        (
            "spread",
            pb::PlacementMode::Spread,
            "controller",
            pb::SessionOrigin::Controller
        )
    );
    let disagreeing = client
        .create_session(pb::CreateSessionRequest {
            placement: "binpack".into(),
            placement_mode: pb::PlacementMode::Spread.into(),
            ..request("both")
        })
        .await
        .expect_err("two modes");
    assert_eq!(disagreeing.code(), Code::InvalidArgument);
    // The string alone, as older clients send it, fills the enum in the answer.
    let named = client
        .create_session(pb::CreateSessionRequest {
            placement: "binpack".into(),
            ..request("named")
        })
        .await
        .expect("created")
        .into_inner();
    assert_eq!(named.placement_mode(), pb::PlacementMode::Binpack);
}

/// Issue 40: the memory and compute policies as enums beside their deprecated strings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_travel_as_enums_beside_their_strings() {
    let scratch = gpuwarden_test_support::scratch("contract-policies");
    let mut client = limited(scratch.path(), Limits::default()).await;
    let with = |name: &str, policy: pb::QuotaPolicy| pb::CreateSessionRequest {
        policy: Some(policy),
        ..request(name)
    };
    // The enums alone: the answer fills the strings too.
    let numbered = client
        .create_session(with(
            "numbered",
            pb::QuotaPolicy {
                memory_policy: pb::MemoryPolicy::Stop.into(),
                compute_policy: pb::ComputePolicy::WorkConserving.into(),
                ..Default::default()
            },
        ))
        .await
        .expect("created")
        .into_inner()
        .policy
        .expect("a policy");
    assert_eq!(
        (
            numbered.memory.as_str(),
            numbered.memory_policy(),
            numbered.compute.as_str(),
            numbered.compute_policy()
        ),
        (
            "stop",
            pb::MemoryPolicy::Stop,
            "work-conserving",
            pb::ComputePolicy::WorkConserving
        )
    );
    // The strings alone, as older clients send them: the answer fills the enums.
    let named = client
        .create_session(with(
            "named",
            pb::QuotaPolicy {
                memory: "report".into(),
                ..Default::default()
            },
        ))
        .await
        .expect("created")
        .into_inner()
        .policy
        .expect("a policy");
    assert_eq!(
        (named.memory_policy(), named.compute_policy()),
        (pb::MemoryPolicy::Report, pb::ComputePolicy::Hard)
    );
    // Both, agreeing: accepted; disagreeing: refused, naming the field.
    client
        .create_session(with(
            "both",
            pb::QuotaPolicy {
                memory: "stop".into(),
                memory_policy: pb::MemoryPolicy::Stop.into(),
                ..Default::default()
            },
        ))
        .await
        .expect("agreeing halves are accepted");
    for (policy, field) in [
        (
            pb::QuotaPolicy {
                memory: "stop".into(),
                memory_policy: pb::MemoryPolicy::Kill.into(),
                ..Default::default()
            },
            "policy.memory",
        ),
        (
            pb::QuotaPolicy {
                compute: "hard".into(),
                compute_policy: pb::ComputePolicy::WorkConserving.into(),
                ..Default::default()
            },
            "policy.compute",
        ),
        (
            pb::QuotaPolicy {
                memory_policy: 42,
                ..Default::default()
            },
            "policy.memory_policy",
        ),
    ] {
        let refused = client
            .create_session(with("bad", policy))
            .await
            .expect_err("refused");
        assert_eq!(
            (refused.code(), details::reason(&refused).as_deref()),
            (Code::InvalidArgument, Some("INVALID_POLICY")),
            "{refused:?}"
        );
        assert_eq!(details::bad_fields(&refused), [field], "{refused:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_say_why_a_session_waits_and_when_it_was_placed() {
    let scratch = gpuwarden_test_support::scratch("contract-conditions");
    let mut client = limited(scratch.path(), Limits::default()).await;
    let eight = |name: &str| pb::CreateSessionRequest {
        requested: Some(pb::ResourceSlot {
            values: [("cpu".to_owned(), "8".to_owned())].into(),
        }),
        ..request(name)
    };
    let first = client
        .create_session(eight("first"))
        .await
        .expect("created")
        .into_inner();
    let second = client
        .create_session(eight("second"))
        .await
        .expect("created")
        .into_inner();
    let member = client
        .create_session(pb::CreateSessionRequest {
            gang: Some(pb::Gang {
                name: "g".into(),
                size: 3,
            }),
            ..request("member")
        })
        .await
        .expect("created")
        .into_inner();
    // (status, reason) of each session's Scheduled condition, once the passes have run.
    let scheduled = |s: &pb::Session| {
        s.conditions
            .iter()
            .find(|c| c.r#type == "Scheduled")
            .map(|c| (c.status(), c.reason.clone(), c.last_transition_ms))
    };
    let want = [
        (&first.id, pb::ConditionStatus::True, "Placed"),
        (&second.id, pb::ConditionStatus::False, "WaitingForCapacity"),
        (&member.id, pb::ConditionStatus::False, "GangIncomplete"),
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut got = Vec::new();
        for (id, _, _) in &want {
            let s = client
                .get_session(pb::GetSessionRequest { id: (*id).clone() })
                .await
                .expect("found")
                .into_inner();
            got.push((scheduled(&s), s));
        }
        let matches = want.iter().zip(&got).all(|((_, status, reason), (c, _))| {
            c.as_ref()
                .is_some_and(|(st, r, _)| st == status && r == reason)
        });
        if matches {
            // Placed: the time it was placed; waiting: False since it was created.
            let (placed, _) = &got[0];
            let placed_at = placed.as_ref().expect("a condition").2;
            assert!(placed_at >= first.created_at_ms, "placed at {placed_at}");
            let (waiting, s) = &got[1];
            assert_eq!(waiting.as_ref().expect("a condition").2, s.created_at_ms);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "conditions: {:?}",
            got.iter().map(|(c, _)| c).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Ended: no Scheduled condition any more.
    let ended = client
        .terminate_session(pb::TerminateSessionRequest { id: first.id })
        .await
        .expect("ended")
        .into_inner();
    assert!(scheduled(&ended).is_none(), "{:?}", ended.conditions);
}

/// `controller` served in this process on a loopback port, in plain text, held to limits that
/// let a test call as fast as it likes; a channel to it.
async fn serve_controller(
    controller: std::sync::Arc<gpuwarden_controller::api::Hub>,
) -> tonic::transport::Channel {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binds");
    let addr = listener.local_addr().expect("bound");
    tokio::spawn(
        gpuwarden_controller::server::GrpcServer::new(controller, listener)
            .bounds(Bounds::new(Limits {
                client_requests_per_sec: 100_000,
                client_request_burst: 100_000,
                ..Limits::default()
            }))
            .serve(std::future::pending::<()>()),
    );
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("a URL")
        .connect()
        .await
        .expect("connects")
}

/// Issue 40: `GetSession` answers from the stored state, as `ListSessions` and watches do.
/// A change whose commit failed stays in memory (its writes go with the next commit), but no
/// client is shown it until it is stored: a failover before then would lose it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_session_shows_the_stored_state_not_a_change_whose_commit_failed() {
    let mut etcd = gpuwarden_test_support::Etcd::start();
    let spec = etcd
        .store_url("contract-get-stored")
        .parse()
        .expect("a store spec");
    // Leading from the start, with no election: etcd going away fails commits but deposes
    // nobody, so the controller goes on answering.
    let controller = gpuwarden_controller::server::open(
        &spec,
        gpuwarden_controller::scheduler::SchedulerConfig::default(),
        gpuwarden_controller::api::Timing::default(),
    )
    .await
    .expect("opens");
    let channel = serve_controller(controller).await;
    // A node of one CPU, held by another session: this one stays pending, and ending it needs
    // no agent.
    pb::agent_service_client::AgentServiceClient::new(channel.clone())
        .register(gpuwarden_test_support::node::with_cpus("n1", 1))
        .await
        .expect("registers");
    let mut client = pb::scheduler_service_client::SchedulerServiceClient::new(channel);
    let holder = client
        .create_session(request("holder"))
        .await
        .expect("created")
        .into_inner();
    gpuwarden_test_support::wait::until_async(
        "the holder to be placed",
        gpuwarden_test_support::wait::PATIENCE,
        || {
            let (mut client, id) = (client.clone(), holder.id.clone());
            async move {
                client
                    .get_session(pb::GetSessionRequest { id })
                    .await
                    .is_ok_and(|s| s.into_inner().state() == pb::SessionState::Scheduled)
            }
        },
    )
    .await;
    let made = client
        .create_session(request("kept"))
        .await
        .expect("created")
        .into_inner();
    let get = |mut client: pb::scheduler_service_client::SchedulerServiceClient<_>| {
        let id = made.id.clone();
        async move {
            client
                .get_session(pb::GetSessionRequest { id })
                .await
                .expect("found")
                .into_inner()
        }
    };
    let before = get(client.clone()).await;
    assert_eq!(before.state(), pb::SessionState::Pending, "{before:?}");

    etcd.kill();
    let refused = client
        .terminate_session(pb::TerminateSessionRequest {
            id: made.id.clone(),
        })
        .await
        .expect_err("its commit fails while etcd is away");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    // In memory it has ended; stored, it is still pending, and that is what every read shows.
    // (Its revision may have moved since `before`: a pass stored why it waits.)
    let now = get(client.clone()).await;
    assert_eq!(now.state(), pb::SessionState::Pending, "{now:?}");
    let listed = client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("lists")
        .into_inner()
        .sessions
        .into_iter()
        .find(|s| s.id == made.id)
        .expect("listed");
    assert_eq!(
        (listed.state, listed.revision),
        (now.state, now.revision),
        "GetSession and ListSessions agree"
    );

    // Once etcd is back, the next commit carries the failed change's writes, and then it shows.
    etcd.resume();
    gpuwarden_test_support::wait::until_async(
        "a create to be stored again",
        gpuwarden_test_support::wait::PATIENCE,
        || {
            let mut client = client.clone();
            async move { client.create_session(request("next")).await.is_ok() }
        },
    )
    .await;
    let after = get(client.clone()).await;
    assert_eq!(after.state(), pb::SessionState::Terminated, "{after:?}");
    assert!(after.revision > before.revision, "{after:?}");
}

/// Makes the controller learn a profile of `class` as an ended session's usage teaches it:
/// a session of it is placed on a node of one GPU, runs, reports [`MIN_SAMPLES`] samples and
/// ends (its release confirmed at once, as a test playing the agent does), all in one change.
///
/// [`MIN_SAMPLES`]: gpuwarden_controller::profile::MIN_SAMPLES
async fn learn(controller: &gpuwarden_controller::api::Hub, class: &str) {
    use gpuwarden_controller::{
        node::NodeReport,
        profile::{MIN_SAMPLES, UsageSample},
        scheduler::NewSession,
        slots::ResourceSlot,
    };
    let node = NodeReport::with_gpus("n1", 1, 16 << 30, 1);
    let id = format!("run-{class}");
    let learned = controller
        .apply(|s| {
            s.register(node, &[]).expect("registers");
            s.create(NewSession {
                id: id.clone(),
                class: class.into(),
                requested: ResourceSlot::parse_any(&["cuda.shares=0.5"]).expect("valid"),
                ..NewSession::default()
            })
            .expect("created");
            s.pass();
            s.ack("n1", &id);
            for _ in 0..MIN_SAMPLES {
                assert!(
                    s.record_usage("n1", &id, UsageSample::default()),
                    "{id} runs"
                );
            }
            s.terminate_released(&id);
            s.profiles().get(class).is_some()
        })
        .await
        .expect("stored");
    assert!(learned, "a profile of {class}");
}

/// Issue 40: `ListProfiles` pages hold every learned profile exactly once, while profiles go on
/// being learned between pages: one learned after the cursor is on a later page, one behind it
/// on none, and one learned again is not listed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profile_pages_hold_each_profile_once_while_profiles_are_learned() {
    const PROFILES: usize = 40;
    const SIZE: u32 = 6;
    let scratch = gpuwarden_test_support::scratch("contract-profiles");
    let controller = gpuwarden_controller::server::open(
        &gpuwarden_controller::server::sled_in(scratch.path()),
        gpuwarden_controller::scheduler::SchedulerConfig::default(),
        gpuwarden_controller::api::Timing::default(),
    )
    .await
    .expect("opens");
    let first: Vec<String> = (0..PROFILES).map(|i| format!("m-{i:03}")).collect();
    for class in &first {
        learn(&controller, class).await;
    }
    let mut client = pb::scheduler_service_client::SchedulerServiceClient::new(
        serve_controller(std::sync::Arc::clone(&controller)).await,
    );

    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let (mut page_token, mut pages) = (String::new(), 0);
    let (mut late, mut early) = (Vec::new(), Vec::new());
    loop {
        let page = client
            .list_profiles(pb::ListProfilesRequest {
                page_size: SIZE,
                page_token,
            })
            .await
            .expect("lists")
            .into_inner();
        assert!(page.profiles.len() <= SIZE as usize, "{page:?}");
        for p in page.profiles {
            *seen.entry(p.class).or_default() += 1;
        }
        pages += 1;
        if page.next_page_token.is_empty() {
            break;
        }
        // Each page moves the cursor on: a listing that does not ends here, not never.
        assert!(pages <= PROFILES, "{pages} pages and no end: {seen:?}");
        page_token = page.next_page_token;
        // Between pages: a class sorting after every other, one sorting before every other,
        // and the first class learned again (behind the cursor now, its profile changed).
        late.push(format!("z-{pages:03}"));
        early.push(format!("a-{pages:03}"));
        for class in [&late[late.len() - 1], &early[early.len() - 1], &first[0]] {
            learn(&controller, class).await;
        }
    }
    for class in first.iter().chain(&late) {
        assert_eq!(seen.get(class), Some(&1), "{class} on one page");
    }
    for class in &early {
        assert_eq!(
            seen.get(class),
            None,
            "{class} was learned behind the cursor"
        );
    }
    assert!(
        seen.values().all(|n| *n == 1),
        "none on two pages: {seen:?}"
    );
    assert!(
        pages >= PROFILES.div_ceil(SIZE as usize),
        "{pages} pages of {SIZE} for {PROFILES} and more"
    );
    // No size: every profile at once, the ones learned meanwhile included.
    let all = client
        .list_profiles(pb::ListProfilesRequest::default())
        .await
        .expect("lists")
        .into_inner();
    assert_eq!(all.profiles.len(), PROFILES + late.len() + early.len());
    assert!(all.next_page_token.is_empty());
}
