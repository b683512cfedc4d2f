//! `WatchSessions` as a scheduling client relies on it, over real gRPC on loopback: a watcher
//! that reads slowly (one message a second while thousands of changes happen, then as fast as
//! it can) still sees the final state of every session; a watch resumed from the last revision
//! it read, after a crash and restart on sled or a failover on a real etcd, misses nothing.

use std::{collections::BTreeMap, time::Duration};

use gpuwarden_controller::{
    limits::{Bounds, Limits},
    server::Transport,
};
use gpuwarden_proto::v1::{self as pb, scheduler_service_client::SchedulerServiceClient};
use gpuwarden_test_support::controller::{ControllerProcess as Member, request, serve_in_process};
use tokio_stream::StreamExt as _;
use tonic::transport::Channel;

/// Sessions each test makes: each is created, placed and ended (three changes).
const SESSIONS: usize = 3_000;
/// Concurrent clients making them.
const CLIENTS: usize = 32;
/// Silence after which a watcher is taken to have been sent everything.
const QUIET: Duration = Duration::from_secs(10);

/// A controller in this process on sled in `dir`, with room for every test session of one
/// owner, and a node with room for one; its address.
async fn serve(dir: &std::path::Path) -> std::net::SocketAddr {
    let limits = Limits {
        max_sessions_per_owner: 100_000,
        client_requests_per_sec: 100_000,
        client_request_burst: 100_000,
        ..Limits::default()
    };
    let addr = serve_in_process(dir, Transport::PlainText, Bounds::new(limits)).await;
    register(addr, "n1", 1).await;
    addr
}

/// Registers node `node` with `cpus` CPUs.
async fn register(addr: std::net::SocketAddr, node: &str, cpus: u32) {
    gpuwarden_test_support::node::register(
        &format!("http://{addr}"),
        gpuwarden_test_support::node::with_cpus(node, cpus),
    )
    .await;
}

/// A client on a connection of its own (a stalled watch must not hold up other calls' flow
/// control).
async fn client(addr: std::net::SocketAddr) -> SchedulerServiceClient<Channel> {
    SchedulerServiceClient::new(channel(addr).await)
}

async fn channel(addr: std::net::SocketAddr) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("a URL")
        // HTTP/2's own default window (hyper's client asks for 2 MiB): what a watcher may leave
        // unread before the controller must hold on to the rest. A bigger window only moves
        // the point at which a slow watcher falls behind to more changes than a test makes.
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect()
        .await
        .expect("connects")
}

/// Creates `n` sessions from [`CLIENTS`] concurrent callers while only one fits; then a node
/// with room for all joins, and one pass places them all at once (a burst of `n` changes); then
/// ends each. Their ids.
async fn churn(addr: std::net::SocketAddr, n: usize) -> Vec<String> {
    let client = client(addr).await;
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in (c..n).step_by(CLIENTS) {
                let s = client
                    .create_session(request(&format!("job-{i}")))
                    .await
                    .expect("created")
                    .into_inner();
                ids.push(s.id);
            }
            ids
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.extend(t.await.expect("joined"));
    }
    register(addr, "n2", 1_000_000).await;
    // Placed (or not yet: ending a pending session is a change too).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut tasks = Vec::new();
    for chunk in ids.chunks(ids.len().div_ceil(CLIENTS)) {
        let mut client = client.clone();
        let chunk = chunk.to_vec();
        tasks.push(tokio::spawn(async move {
            for id in chunk {
                client
                    .terminate_session(pb::TerminateSessionRequest { id })
                    .await
                    .expect("ended");
            }
        }));
    }
    for t in tasks {
        t.await.expect("joined");
    }
    ids
}

/// Every session, page by page, and the revision the listing reflects.
async fn list_all(
    client: &mut SchedulerServiceClient<Channel>,
) -> (BTreeMap<String, pb::Session>, u64) {
    let mut all = BTreeMap::new();
    let mut page_token = String::new();
    let mut revision = None;
    loop {
        let page = client
            .list_sessions(pb::ListSessionsRequest {
                page_token,
                ..Default::default()
            })
            .await
            .expect("lists")
            .into_inner();
        // Every page of one listing names the same revision.
        assert_eq!(*revision.get_or_insert(page.revision), page.revision);
        for s in page.sessions {
            assert!(
                all.insert(s.id.clone(), s).is_none(),
                "a session on two pages"
            );
        }
        if page.next_page_token.is_empty() {
            return (all, page.revision);
        }
        page_token = page.next_page_token;
    }
}

/// What a watcher has seen: the last state of each session, and the last revision (which only
/// grows, message after message).
#[derive(Default)]
struct Seen {
    last: BTreeMap<String, pb::Session>,
    revision: u64,
    messages: usize,
}

impl Seen {
    fn take(&mut self, s: pb::Session) {
        assert!(
            s.revision > self.revision,
            "revision {} after {}",
            s.revision,
            self.revision
        );
        self.revision = s.revision;
        self.messages += 1;
        self.last.insert(s.id.clone(), s);
    }
}

/// Reads `stream` until it has been quiet for [`QUIET`].
async fn drain(stream: &mut tonic::Streaming<pb::Session>, seen: &mut Seen) {
    while let Ok(Some(message)) = tokio::time::timeout(QUIET, stream.next()).await {
        seen.take(message.expect("the watch goes on"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_watcher_sees_the_final_state_of_every_session() {
    let scratch = gpuwarden_test_support::scratch("watch-slow");
    let addr = serve(scratch.path()).await;
    let mut client = client(addr).await;
    let mut stream = self::client(addr)
        .await
        .watch_sessions(pb::WatchSessionsRequest::default())
        .await
        .expect("watches")
        .into_inner();

    let churn = tokio::spawn(churn(addr, SESSIONS));
    // One message a second while the changes happen; then it reads as fast as it can.
    let mut seen = Seen::default();
    while !churn.is_finished() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Ok(Some(message)) = tokio::time::timeout(QUIET, stream.next()).await {
            seen.take(message.expect("the watch goes on"));
        }
    }
    let ids = churn.await.expect("the changes are made");
    drain(&mut stream, &mut seen).await;
    let Seen { last, messages, .. } = seen;

    let (truth, _) = list_all(&mut client).await;
    assert_eq!(truth.len(), SESSIONS);
    let wrong: Vec<&String> = ids
        .iter()
        .filter(|id| {
            last.get(*id)
                .map(|s| (s.state, s.updated_at_ms, s.revision))
                != truth
                    .get(*id)
                    .map(|s| (s.state, s.updated_at_ms, s.revision))
        })
        .collect();
    eprintln!(
        "slow watcher: {messages} messages, {} of {SESSIONS} sessions seen, {} without their \
         final state",
        last.len(),
        wrong.len()
    );
    assert!(
        wrong.is_empty(),
        "{} of {SESSIONS} sessions' final state never reached the watcher (first: {:?})",
        wrong.len(),
        wrong.first()
    );
    assert!(
        truth
            .values()
            .all(|s| s.state == pb::SessionState::Terminated as i32)
    );
}

/// What a client sees of `member`'s sessions: every one, page by page, and the listing's
/// revision.
async fn listing(member: &Member) -> (BTreeMap<String, pb::Session>, u64) {
    list_all(&mut member.client().await).await
}

/// Reads `stream` until the watcher holds, for every session `member` lists, that state or a
/// later one (bounded).
async fn catch_up(stream: &mut tonic::Streaming<pb::Session>, seen: &mut Seen, member: &Member) {
    let deadline = tokio::time::Instant::now() + Duration::from_mins(1);
    loop {
        let (truth, _) = listing(member).await;
        let behind: Vec<&pb::Session> = truth
            .values()
            .filter(|s| seen.last.get(&s.id).is_none_or(|l| l.revision < s.revision))
            .collect();
        if behind.is_empty() {
            for s in truth.values() {
                let last = &seen.last[&s.id];
                if last.revision == s.revision {
                    assert_eq!(
                        (last.state, last.updated_at_ms),
                        (s.state, s.updated_at_ms),
                        "one revision, two states: {} ",
                        s.id
                    );
                }
            }
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the watch never delivered {} sessions' latest state (first: {:?} at revision {})",
            behind.len(),
            behind[0].id,
            behind[0].revision
        );
        if let Ok(Some(message)) =
            tokio::time::timeout(Duration::from_millis(500), stream.next()).await
        {
            seen.take(message.expect("the watch goes on"));
        }
    }
}

/// Makes changes on `member`: `create` new sessions named `prefix-N`, then ends the first
/// `end` of those `names` holds.
async fn changes(member: &Member, prefix: &str, create: usize, names: &[String], end: usize) {
    let mut client = member.client().await;
    for i in 0..create {
        client
            .create_session(request(&format!("{prefix}-{i}")))
            .await
            .expect("created");
    }
    let (all, _) = listing(member).await;
    let ids: Vec<String> = all
        .values()
        .filter(|s| names.contains(&s.name) && s.state != pb::SessionState::Terminated as i32)
        .take(end)
        .map(|s| s.id.clone())
        .collect();
    for id in ids {
        client
            .terminate_session(pb::TerminateSessionRequest { id })
            .await
            .expect("ended");
    }
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// A watcher follows `first` from a listing, then stops reading; more changes are made; `first`
/// is replaced (`replace` kills it and returns the controller that serves next); more changes
/// are made there; the watcher resumes from the last revision it read and must hold every
/// session's latest state, with revisions that only grew throughout.
async fn resumed_watch_misses_nothing(first: Member, replace: impl AsyncFnOnce(Member) -> Member) {
    first.register_node().await;
    let (_, listed) = listing(&first).await;
    let mut stream = first
        .client()
        .await
        .watch_sessions(pb::WatchSessionsRequest {
            since_revision: listed,
            ..Default::default()
        })
        .await
        .expect("watches")
        .into_inner();
    let mut seen = Seen::default();
    changes(&first, "early", 20, &[], 0).await;
    catch_up(&mut stream, &mut seen, &first).await;
    let resume_from = seen.revision;
    assert!(resume_from > listed);
    drop(stream);

    // Unread: made while the watcher was away, before the controller went.
    changes(&first, "unread", 10, &names("early", 20), 10).await;
    let next = replace(first).await;
    next.register_node().await;
    changes(&next, "after", 10, &names("unread", 10), 5).await;

    let mut stream = next
        .client()
        .await
        .watch_sessions(pb::WatchSessionsRequest {
            since_revision: resume_from,
            ..Default::default()
        })
        .await
        .expect("resumes")
        .into_inner();
    let before = seen.messages;
    catch_up(&mut stream, &mut seen, &next).await;
    // Every session made before and after is kept (some ended by request, or failed first:
    // their node's agent never connects).
    let (truth, _) = listing(&next).await;
    let mut kept: Vec<String> = truth.values().map(|s| s.name.clone()).collect();
    kept.sort();
    let mut made = [names("early", 20), names("unread", 10), names("after", 10)].concat();
    made.sort();
    assert_eq!(kept, made);
    eprintln!(
        "resumed from revision {resume_from}: {} messages after, now at revision {}",
        seen.messages - before,
        seen.revision
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumed_after_a_sled_restart_misses_nothing() {
    let scratch = gpuwarden_test_support::scratch("watch-restart");
    let store = format!("sled:{}", scratch.path().join("store").display());
    let first = Member::start(&store, &[]);
    first.until_serving(Duration::from_secs(10)).await;
    resumed_watch_misses_nothing(first, async |first| {
        // A crash, not a clean stop.
        drop(first);
        let next = Member::start(&store, &[]);
        next.until_serving(Duration::from_secs(10)).await;
        next
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumed_after_a_failover_misses_nothing() {
    let etcd = gpuwarden_test_support::Etcd::start();
    let store = etcd.store_url("watch-failover");
    let elected = |store: &str| Member::start(store, &["--lease-ttl-secs", "2"]);
    let first = elected(&store);
    first.until_serving(Duration::from_secs(10)).await;
    let standby = elected(&store);
    resumed_watch_misses_nothing(first, async |first| {
        drop(first);
        standby.until_serving(Duration::from_secs(10)).await;
        standby
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_hold_every_session_once_while_sessions_come_and_go() {
    let scratch = gpuwarden_test_support::scratch("watch-pages");
    let limits = Limits {
        max_page_size: 40,
        ..Limits::default()
    };
    let addr = serve_in_process(scratch.path(), Transport::PlainText, Bounds::new(limits)).await;
    register(addr, "n1", 1_000).await;
    let mut client = client(addr).await;
    let mut before = Vec::new();
    for i in 0..200 {
        let s = client
            .create_session(request(&format!("old-{i}")))
            .await
            .expect("created")
            .into_inner();
        before.push(s.id);
    }
    // A page never holds more than the limit, whatever is asked.
    let first = client
        .list_sessions(pb::ListSessionsRequest {
            page_size: 1_000,
            ..Default::default()
        })
        .await
        .expect("lists")
        .into_inner();
    assert_eq!(first.sessions.len(), 40);

    let mut pages = Vec::new();
    let mut page_token = String::new();
    let mut n = 0;
    loop {
        let page = client
            .list_sessions(pb::ListSessionsRequest {
                page_size: 25,
                page_token,
                ..Default::default()
            })
            .await
            .expect("lists")
            .into_inner();
        assert!(page.sessions.len() <= 25);
        pages.push(page.sessions);
        // Between pages: sessions come, and some of those already listed or still ahead end.
        client
            .create_session(request(&format!("new-{n}")))
            .await
            .expect("created");
        for id in [&before[n * 7 % 200], &before[(n * 13 + 150) % 200]] {
            client
                .terminate_session(pb::TerminateSessionRequest { id: id.clone() })
                .await
                .expect("ended");
        }
        n += 1;
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    let listed: Vec<&str> = pages.iter().flatten().map(|s| s.id.as_str()).collect();
    let unique: std::collections::BTreeSet<&str> = listed.iter().copied().collect();
    assert_eq!(unique.len(), listed.len(), "a session on two pages");
    let missing: Vec<&String> = before
        .iter()
        .filter(|id| !unique.contains(id.as_str()))
        .collect();
    assert!(missing.is_empty(), "never listed: {missing:?}");
    // In creation order across pages.
    let created: Vec<(i64, &str)> = pages
        .iter()
        .flatten()
        .map(|s| (s.created_at_ms, s.id.as_str()))
        .collect();
    assert!(created.is_sorted());

    let bad = client
        .list_sessions(pb::ListSessionsRequest {
            page_token: "not a token".into(),
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument, "{bad:?}");
}

/// `CreateSession` answers with the revision of the creation: each create's is above the one
/// before, and a watch from it (as `gpuwarden run` watches its session) delivers the session's
/// next change, its placement, and nothing from before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_creates_revision_sees_its_next_change() {
    let scratch = gpuwarden_test_support::scratch("watch-create");
    let addr = serve(scratch.path()).await;
    let mut client = client(addr).await;
    let first = client
        .create_session(request("first"))
        .await
        .expect("created")
        .into_inner();
    // The node has room for one: the first runs, the second waits.
    wait_for_state(&mut client, &first.id, pb::SessionState::Scheduled).await;
    let second = client
        .create_session(request("second"))
        .await
        .expect("created")
        .into_inner();
    assert!(first.revision > 0, "{first:?}");
    assert!(
        second.revision > first.revision,
        "{first:?} then {second:?}"
    );
    assert_eq!(second.state, pb::SessionState::Pending as i32);

    let mut watch = client
        .watch_sessions(pb::WatchSessionsRequest {
            since_revision: second.revision,
            ..Default::default()
        })
        .await
        .expect("watches")
        .into_inner();
    // Room for the second: the first ends.
    client
        .terminate_session(pb::TerminateSessionRequest {
            id: first.id.clone(),
        })
        .await
        .expect("ended");
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|s: &pb::Session| s.id == second.id && s.state != pb::SessionState::Pending as i32)
    {
        let next = tokio::time::timeout(QUIET, watch.next())
            .await
            .expect("a change within the quiet period")
            .expect("the stream goes on")
            .expect("a session");
        assert!(next.revision > second.revision, "{next:?}");
        seen.push(next);
    }
    assert!(
        !seen
            .iter()
            .any(|s| s.id == second.id && s.revision == second.revision),
        "the creation itself is not delivered again: {seen:?}"
    );
}

/// Polls until session `id` is in `state`.
async fn wait_for_state(
    client: &mut SchedulerServiceClient<Channel>,
    id: &str,
    state: pb::SessionState,
) {
    gpuwarden_test_support::wait::until_async(
        &format!("{id} to be {state:?}"),
        gpuwarden_test_support::wait::PATIENCE,
        || {
            let (mut c, id) = (client.clone(), id.to_owned());
            async move {
                c.get_session(pb::GetSessionRequest { id })
                    .await
                    .is_ok_and(|s| s.into_inner().state >= state as i32)
            }
        },
    )
    .await;
}

/// Issue 40 item 4: a client that lists an empty store (revision 0) and then watches from the
/// listing's revision must see every session created in between, as it does on a store that
/// already holds sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_then_watch_on_an_empty_store_sees_every_create_made_in_between() {
    let scratch = gpuwarden_test_support::scratch("watch-empty");
    let addr = serve(scratch.path()).await;
    let mut client = client(addr).await;
    let (listed, revision) = list_all(&mut client).await;
    assert!(listed.is_empty(), "a fresh store lists nothing");

    let mut made = Vec::new();
    for i in 0..3 {
        let s = client
            .create_session(request(&format!("between-{i}")))
            .await
            .expect("created")
            .into_inner();
        made.push(s.id);
    }
    let mut stream = client
        .watch_sessions(pb::WatchSessionsRequest {
            since_revision: revision,
            ..Default::default()
        })
        .await
        .expect("watches")
        .into_inner();
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < made.len() {
        match tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
            Ok(Some(Ok(s))) => {
                seen.insert(s.id);
            }
            other => panic!(
                "listed at revision {revision}, the watch from it delivered {} of the {} \
                 sessions created in between, then {other:?}",
                seen.len(),
                made.len()
            ),
        }
    }
    for id in &made {
        assert!(
            seen.contains(id),
            "{id} created after the listing was not delivered"
        );
    }

    // Said explicitly: after revision 0 is everything the controller holds; "now" with a
    // revision is a contradiction.
    let mut all = client
        .watch_sessions(pb::WatchSessionsRequest {
            since_revision: 0,
            start: pb::WatchStart::AfterRevision.into(),
            ..Default::default()
        })
        .await
        .expect("watches")
        .into_inner();
    let mut replayed = std::collections::BTreeSet::new();
    while replayed.len() < made.len() {
        let s = tokio::time::timeout(Duration::from_secs(5), all.next())
            .await
            .expect("the watch from 0 replays every session")
            .expect("open")
            .expect("a session");
        replayed.insert(s.id);
    }
    assert_eq!(replayed, seen);
    let refused = client
        .watch_sessions(pb::WatchSessionsRequest {
            since_revision: revision,
            start: pb::WatchStart::Now.into(),
            ..Default::default()
        })
        .await
        .expect_err("a revision with WATCH_START_NOW is refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
}
