//! Ending a session (issue 40, docs/api.md "Terminating"), over real gRPC on loopback against a
//! fake agent that speaks the agent protocol: a session placed on a live node answers
//! TERMINATING, a watcher sees TERMINATING before TERMINATED, its GPU stays booked until the
//! agent confirms the release, and a release never confirmed (an agent from before issue 40)
//! ends after `release_timeout_ms` with a reason saying so. Also the watches' state filter.

use std::time::Duration;

use gpuwarden_controller::{
    limits::{Bounds, Limits},
    server::Transport,
};
use gpuwarden_proto::v1::{
    self as pb, scheduler_service_client::SchedulerServiceClient, session_event::Event,
};
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tonic::transport::Channel;

/// How the fake agent answers a `Release`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnRelease {
    /// Tells the test (through `releases`) and confirms only when the test says so.
    ConfirmWhenTold,
    /// Never confirms, as an agent from before issue 40.
    Never,
}

/// A fake agent of one GPU named `node`: heartbeats every 300 ms (so its node stays up),
/// acknowledges every allocation, sends each released session id to `releases`, and confirms
/// a release (`released` event) for each id the test sends on `confirm` when it answers
/// [`OnRelease::ConfirmWhenTold`].
async fn agent(
    url: String,
    node: &'static str,
    on_release: OnRelease,
    releases: mpsc::Sender<String>,
    mut confirm: mpsc::Receiver<String>,
) {
    let (tx, mut inbound) = gpuwarden_test_support::node::connect(
        &url,
        gpuwarden_test_support::node::with_fake_gpus(node, 1),
    )
    .await;
    let beat = tx.clone();
    tokio::spawn(async move {
        for seq in 1.. {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let heartbeat = pb::agent_message::Msg::Heartbeat(pb::Heartbeat {
                node_id: node.to_owned(),
                seq,
                running_sessions: Vec::new(),
            });
            if beat
                .send(pb::AgentMessage {
                    msg: Some(heartbeat),
                })
                .await
                .is_err()
            {
                return;
            }
        }
    });
    loop {
        tokio::select! {
            message = inbound.next() => {
                let Some(Ok(message)) = message else { return };
                match message.msg {
                    Some(pb::controller_message::Msg::Allocate(a)) => {
                        let ack = pb::agent_message::Msg::Ack(pb::AllocationAck {
                            session_id: a.session_id,
                        });
                        let _ = tx.send(pb::AgentMessage { msg: Some(ack) }).await;
                    }
                    Some(pb::controller_message::Msg::Release(r)) => {
                        let _ = releases.send(r.session_id).await;
                    }
                    _ => {}
                }
            }
            Some(session_id) = confirm.recv(), if on_release == OnRelease::ConfirmWhenTold => {
                let confirmation = pb::agent_message::Msg::Event(pb::EnforcementEvent {
                    session_id,
                    action: "released".into(),
                    reason: "released: its quota is no longer enforced".into(),
                    ..Default::default()
                });
                let _ = tx.send(pb::AgentMessage { msg: Some(confirmation) }).await;
            }
        }
    }
}

/// The test's ends of a fake agent's channels: the releases it was sent, and the confirmations
/// to make.
struct FakeAgent {
    releases: mpsc::Receiver<String>,
    confirm: mpsc::Sender<String>,
}

/// A fake agent for node `n1` behaving as `on_release`, and a client that has seen the node.
async fn with_agent(
    url: &str,
    on_release: OnRelease,
) -> (SchedulerServiceClient<Channel>, FakeAgent) {
    let (releases_tx, releases) = mpsc::channel(8);
    let (confirm, confirm_rx) = mpsc::channel(8);
    tokio::spawn(agent(
        url.to_owned(),
        "n1",
        on_release,
        releases_tx,
        confirm_rx,
    ));
    let c = client(url).await;
    gpuwarden_test_support::node::wait_nodes(&c, 1).await;
    (c, FakeAgent { releases, confirm })
}

/// A whole-GPU session named `name`, once it runs.
async fn running(c: &mut SchedulerServiceClient<Channel>, name: &str) -> pb::Session {
    let s = c
        .create_session(whole_gpu(name))
        .await
        .expect("created")
        .into_inner();
    until_state(c, &s.id, pb::SessionState::Running).await;
    s
}

async fn client(url: &str) -> SchedulerServiceClient<Channel> {
    SchedulerServiceClient::new(
        tonic::transport::Endpoint::from_shared(url.to_owned())
            .expect("a URL")
            .connect()
            .await
            .expect("connects"),
    )
}

/// A session of the whole GPU, named `name`.
fn whole_gpu(name: &str) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        requested: Some(pb::ResourceSlot {
            values: [("cuda.shares".to_owned(), "1".to_owned())].into(),
        }),
        name: name.into(),
        ..Default::default()
    }
}

/// The enum of each `released` event of `session`.
fn released_kinds(session: &pb::Session) -> Vec<pb::EnforcementAction> {
    let released = session.events.iter().filter(|e| e.action == "released");
    released.map(pb::EnforcementEvent::action_kind).collect()
}

async fn get(client: &mut SchedulerServiceClient<Channel>, id: &str) -> pb::Session {
    client
        .get_session(pb::GetSessionRequest { id: id.into() })
        .await
        .expect("shown")
        .into_inner()
}

/// Waits (at most 20 s) until session `id` is in `state`.
async fn until_state(client: &SchedulerServiceClient<Channel>, id: &str, state: pb::SessionState) {
    gpuwarden_test_support::wait::until_async(
        &format!("session {id} {state:?}"),
        Duration::from_secs(20),
        || {
            let mut c = client.clone();
            let id = id.to_owned();
            async move {
                c.get_session(pb::GetSessionRequest { id })
                    .await
                    .is_ok_and(|s| s.into_inner().state() == state)
            }
        },
    )
    .await;
}

/// The sessions the allocation map shows on the GPUs.
async fn booked(client: &mut SchedulerServiceClient<Channel>) -> Vec<String> {
    client
        .get_allocation_map(pb::GetAllocationMapRequest::default())
        .await
        .expect("mapped")
        .into_inner()
        .nodes
        .into_iter()
        .flat_map(|n| n.devices.into_iter().flat_map(|d| d.sessions))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_is_watched_before_terminated_and_the_gpu_stays_booked_until_confirmed() {
    let scratch = gpuwarden_test_support::scratch("terminating");
    let addr = gpuwarden_test_support::controller::serve_in_process(
        scratch.path(),
        Transport::PlainText,
        Bounds::new(Limits::default()),
    )
    .await;
    let url = format!("http://{addr}");
    let (mut c, mut n1) = with_agent(&url, OnRelease::ConfirmWhenTold).await;
    let a = running(&mut c, "a").await;

    // A watcher from now on.
    let mut watch = c
        .watch_sessions(pb::WatchSessionsRequest {
            start: pb::WatchStart::Now.into(),
            ..Default::default()
        })
        .await
        .expect("watches")
        .into_inner();

    let ended = c
        .terminate_session(pb::TerminateSessionRequest { id: a.id.clone() })
        .await
        .expect("ended")
        .into_inner();
    assert_eq!(ended.state(), pb::SessionState::Terminating, "{ended:?}");
    let releasing = ended
        .conditions
        .iter()
        .find(|c| c.r#type == "Releasing")
        .expect("a Releasing condition");
    assert_eq!(
        (releasing.status(), releasing.reason.as_str()),
        (pb::ConditionStatus::True, "WaitingForNode")
    );
    // Ending it again answers as it is.
    let again = c
        .terminate_session(pb::TerminateSessionRequest { id: a.id.clone() })
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(again.state(), pb::SessionState::Terminating);

    // The agent is told once the end is stored.
    let told = tokio::time::timeout(Duration::from_secs(20), n1.releases.recv())
        .await
        .expect("a Release within 20 s");
    assert_eq!(told.as_deref(), Some(a.id.as_str()));

    // Unconfirmed, its GPU is still booked: a session that needs it waits through passes.
    let b = c
        .create_session(whole_gpu("b"))
        .await
        .expect("created")
        .into_inner();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(get(&mut c, &b.id).await.state(), pb::SessionState::Pending);
    assert_eq!(booked(&mut c).await, std::slice::from_ref(&a.id));

    // The watcher has seen a TERMINATING, and nothing ended yet.
    let first = tokio::time::timeout(Duration::from_secs(20), watch.next())
        .await
        .expect("a change within 20 s")
        .expect("open")
        .expect("a session");
    assert_eq!(
        (first.id.as_str(), first.state()),
        (a.id.as_str(), pb::SessionState::Terminating)
    );

    // The agent confirms: TERMINATED follows, and the GPU goes to the waiting session.
    n1.confirm.send(a.id.clone()).await.expect("agent alive");
    let last = loop {
        let s = tokio::time::timeout(Duration::from_secs(20), watch.next())
            .await
            .expect("a change within 20 s")
            .expect("open")
            .expect("a session");
        if s.id == a.id {
            break s;
        }
    };
    assert_eq!(last.state(), pb::SessionState::Terminated, "{last:?}");
    assert!(
        last.reason.contains("node n1 released it"),
        "{}",
        last.reason
    );
    assert!(last.revision > first.revision);
    assert!(!last.conditions.iter().any(|c| c.r#type == "Releasing"));
    // Confirmed by the string alone, as by an agent from before the enum: answered with both.
    assert_eq!(released_kinds(&last), [pb::EnforcementAction::Released]);
    until_state(&c, &b.id, pb::SessionState::Running).await;
}

/// The controller binary with `release_timeout_ms = 1000`, and an agent that never confirms a
/// release (as one from before issue 40).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_never_confirmed_ends_after_the_timeout_with_its_reason() {
    let dir = gpuwarden_test_support::scratch("terminating-timeout");
    let config = dir.path().join("controller.toml");
    std::fs::write(&config, "[scheduler]\nrelease_timeout_ms = 1000\n").expect("written");
    let store = format!("sled:{}", dir.path().join("store").display());
    let controller = gpuwarden_test_support::controller::ControllerProcess::start(
        &store,
        &["--config", &config.to_string_lossy()],
    );
    controller.until_serving(Duration::from_secs(30)).await;
    let url = format!("http://{}", controller.addr);
    let (mut c, mut n1) = with_agent(&url, OnRelease::Never).await;
    let a = running(&mut c, "a").await;
    let ended = c
        .terminate_session(pb::TerminateSessionRequest { id: a.id.clone() })
        .await
        .expect("ended")
        .into_inner();
    assert_eq!(ended.state(), pb::SessionState::Terminating);
    let told = tokio::time::timeout(Duration::from_secs(20), n1.releases.recv())
        .await
        .expect("a Release within 20 s");
    assert_eq!(told.as_deref(), Some(a.id.as_str()));

    until_state(&c, &a.id, pb::SessionState::Terminated).await;
    let a = get(&mut c, &a.id).await;
    assert!(
        a.reason
            .contains("node n1 did not confirm the release within 1000 ms"),
        "{}",
        a.reason
    );
    // Its node is told again as it is given up on.
    let again = tokio::time::timeout(Duration::from_secs(20), n1.releases.recv())
        .await
        .expect("a second Release within 20 s");
    assert_eq!(again.as_deref(), Some(a.id.as_str()));
    // What it held is free again.
    let b = c
        .create_session(whole_gpu("b"))
        .await
        .expect("created")
        .into_inner();
    until_state(&c, &b.id, pb::SessionState::Running).await;
}

/// A watch of one state sends only sessions in it, sends one once more as it leaves it, and
/// moves its bookmarks past the sessions it does not send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_filtered_by_state_sends_only_those_and_bookmarks_past_the_rest() {
    let scratch = gpuwarden_test_support::scratch("watch-states");
    let addr = gpuwarden_test_support::controller::serve_in_process(
        scratch.path(),
        Transport::PlainText,
        Bounds::new(Limits::default()),
    )
    .await;
    let url = format!("http://{addr}");
    let (mut c, _n1) = with_agent(&url, OnRelease::Never).await;
    let mut watch = c
        .watch_session_events(pb::WatchSessionEventsRequest {
            start: pb::WatchStart::Now.into(),
            states: vec![pb::SessionState::Running.into()],
            ..Default::default()
        })
        .await
        .expect("watches")
        .into_inner();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(20), watch.next())
            .await
            .expect("an event within 20 s")
            .expect("open")
            .expect("an event")
            .event
            .expect("a session or a bookmark")
    };
    // The first bookmark: the watch is caught up.
    assert!(matches!(next().await, Event::Bookmark(_)));

    // One runs (the GPU is whole), two wait PENDING behind it.
    let hog = c
        .create_session(whole_gpu("hog"))
        .await
        .expect("created")
        .into_inner();
    let w1 = c
        .create_session(whole_gpu("w1"))
        .await
        .expect("created")
        .into_inner();
    let w2 = c
        .create_session(whole_gpu("w2"))
        .await
        .expect("created")
        .into_inner();
    until_state(&c, &hog.id, pb::SessionState::Running).await;
    // Only the running one comes (bookmarks aside): a watch that ignored the filter would
    // send the pending ones, and the hog's PENDING and SCHEDULED, first.
    let running = next_session(&mut next).await;
    assert_eq!(
        (running.id.as_str(), running.state()),
        (hog.id.as_str(), pb::SessionState::Running)
    );

    // A pending one ends (never sent, so not sent now); then the hog leaves RUNNING: it is
    // sent once more, in its new state.
    let w1_ended = c
        .terminate_session(pb::TerminateSessionRequest { id: w1.id.clone() })
        .await
        .expect("ended")
        .into_inner();
    assert_eq!(w1_ended.state(), pb::SessionState::Terminated);
    c.terminate_session(pb::TerminateSessionRequest { id: hog.id.clone() })
        .await
        .expect("ended");
    let left = next_session(&mut next).await;
    assert_eq!(
        (left.id.as_str(), left.state()),
        (hog.id.as_str(), pb::SessionState::Terminating)
    );

    // Changes it does not send still move it on: a bookmark passes w2's end.
    let w2_ended = c
        .terminate_session(pb::TerminateSessionRequest { id: w2.id.clone() })
        .await
        .expect("ended")
        .into_inner();
    assert_eq!(w2_ended.state(), pb::SessionState::Terminated);
    let w2_revision = get(&mut c, &w2.id).await.revision;
    loop {
        match next().await {
            Event::Bookmark(b) if b.revision >= w2_revision => break,
            Event::Bookmark(_) => {}
            Event::Session(s) => panic!("{} ({:?}) sent to a RUNNING watch", s.id, s.state()),
        }
    }
}

/// The next session a watch sends, past any bookmarks.
async fn next_session(next: &mut impl AsyncFnMut() -> Event) -> pb::Session {
    loop {
        if let Event::Session(s) = next().await {
            return s;
        }
    }
}
