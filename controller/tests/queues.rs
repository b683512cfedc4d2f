//! Team queues over real gRPC (docs/teams.md): an admin sets one and a user cannot; a set queue
//! holds the next pass to it; bad input is refused naming the field; a queue set at run time
//! survives a restart on sled and on etcd, and wins over the config file's.

use std::{sync::Arc, time::Duration};

use gpuwarden_controller::{
    auth::{
        clients::ClientRole,
        tokens::{self, TokenFile},
    },
    limits::{Bounds, Limits},
    server::{Security, Transport},
};
use gpuwarden_proto::v1::{self as pb, scheduler_service_client::SchedulerServiceClient};
use gpuwarden_test_support::{
    Etcd,
    controller::{ControllerProcess, serve_in_process},
    scratch,
};
use tonic::{Code, Request, transport::Channel};

/// Long enough for a restarted controller to win the election over its dead self's lease.
const SERVING: Duration = Duration::from_secs(20);

#[expect(
    clippy::unnecessary_wraps,
    reason = "every slot field of the messages is an Option; comparing with one reads shortest"
)]
fn slots(pairs: &[(&str, &str)]) -> Option<pb::ResourceSlot> {
    Some(pb::ResourceSlot {
        values: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    })
}

fn queue(
    name: &str,
    guaranteed: &[(&str, &str)],
    limit: Option<&[(&str, &str)]>,
    members: &[&str],
) -> pb::SetQueueRequest {
    pb::SetQueueRequest {
        queue: Some(pb::Queue {
            name: name.to_owned(),
            guaranteed: slots(guaranteed),
            limit: limit.and_then(slots),
            members: members.iter().map(|m| (*m).to_owned()).collect(),
            ..pb::Queue::default()
        }),
    }
}

fn as_token<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ascii"),
    );
    request
}

async fn client(addr: std::net::SocketAddr) -> SchedulerServiceClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("a URL")
        .connect()
        .await
        .expect("connects");
    SchedulerServiceClient::new(channel)
}

#[tokio::test]
async fn an_admin_sets_a_queue_and_a_user_cannot() {
    let dir = scratch("queues-auth");
    let file = dir.path().join("tokens.toml");
    let admin = tokens::add(&file, "ops", ClientRole::Admin).expect("token");
    let alice = tokens::add(&file, "alice", ClientRole::User).expect("token");
    let addr = serve_in_process(
        &dir.path().join("store"),
        Security {
            transport: Transport::PlainText,
            tokens: Some(Arc::new(TokenFile::load(&file).expect("loads"))),
            grants: Arc::default(),
        },
        Bounds::new(Limits::default()),
    )
    .await;
    let mut c = client(addr).await;
    let set = queue(
        "team-a",
        &[("cuda.shares", "4.5"), ("cuda.mem", "214748364800")],
        Some(&[("cuda.shares", "6")]),
        &["alice", "bob"],
    );
    let refused = c
        .set_queue(as_token(set.clone(), &alice))
        .await
        .expect_err("a user may not set a queue");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("only an admin"), "{refused:?}");
    let set = c
        .set_queue(as_token(set, &admin))
        .await
        .expect("an admin sets it")
        .into_inner();
    assert_eq!(
        set.guaranteed,
        slots(&[("cuda.shares", "4.5"), ("cuda.mem", "214748364800")])
    );
    assert_eq!(set.members, ["alice", "bob"]);
    // A user reads the queues, and sees only itself among the members.
    let seen = c
        .get_queue(as_token(
            pb::GetQueueRequest {
                name: "team-a".into(),
            },
            &alice,
        ))
        .await
        .expect("a user reads a queue")
        .into_inner();
    assert_eq!(seen.members, ["alice"]);
    assert_eq!(seen.limit, slots(&[("cuda.shares", "6")]));
    let refused = c
        .delete_queue(as_token(
            pb::DeleteQueueRequest {
                name: "team-a".into(),
                ..Default::default()
            },
            &alice,
        ))
        .await
        .expect_err("a user may not remove a queue");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let gone = c
        .delete_queue(as_token(
            pb::DeleteQueueRequest {
                name: "team-a".into(),
                ..Default::default()
            },
            &admin,
        ))
        .await
        .expect("an admin removes it")
        .into_inner();
    assert_eq!(gone.name, "team-a");
    let listed = c
        .list_queues(as_token(pb::ListQueuesRequest::default(), &admin))
        .await
        .expect("lists")
        .into_inner();
    assert!(listed.queues.is_empty(), "{listed:?}");
}

#[tokio::test]
async fn bad_queues_are_invalid_arguments_naming_the_field() {
    let dir = scratch("queues-bad");
    let addr = serve_in_process(
        dir.path(),
        Transport::PlainText,
        Bounds::new(Limits::default()),
    )
    .await;
    let mut c = client(addr).await;
    c.set_queue(queue("team-a", &[], None, &["alice"]))
        .await
        .expect("sets");
    for (request, names) in [
        (
            queue(
                "team-b",
                &[("cuda.shares", "4.5")],
                Some(&[("cuda.shares", "4")]),
                &[],
            ),
            "guaranteed[cuda.shares]: 4.5 is above the limit of 4",
        ),
        (
            queue("team-b", &[("gpus", "1")], None, &[]),
            "guaranteed: unknown slot \"gpus\"",
        ),
        (
            queue("team-b", &[], Some(&[("cuda.shares", "0")]), &[]),
            "limit[cuda.shares]: zero",
        ),
        (
            queue("team-b", &[("cuda.shares", "x")], None, &[]),
            "guaranteed: ",
        ),
        (queue("", &[], None, &[]), "name \"\""),
        (queue("Team B", &[], None, &[]), "DNS label"),
        (
            queue("team-b", &[], None, &["alice"]),
            "\"alice\" is already a member of queue \"team-a\"",
        ),
        (pb::SetQueueRequest { queue: None }, "queue: missing"),
    ] {
        let status = c.set_queue(request).await.expect_err(names);
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(names), "{names}: {status:?}");
    }
    let status = c
        .get_queue(pb::GetQueueRequest {
            name: "team-b".into(),
        })
        .await
        .expect_err("nothing of a refused change lands");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
}

/// The state of session `id`, and its reason.
async fn state(c: &mut SchedulerServiceClient<Channel>, id: &str) -> (i32, String) {
    let s = c
        .get_session(pb::GetSessionRequest { id: id.into() })
        .await
        .expect("gets")
        .into_inner();
    (s.state, s.reason)
}

async fn until_state(c: &mut SchedulerServiceClient<Channel>, id: &str, want: pb::SessionState) {
    let started = std::time::Instant::now();
    loop {
        let (state, reason) = state(c, id).await;
        if state == i32::from(want) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{id} is {state} ({reason}), not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_set_queue_holds_the_next_pass_to_its_limit() {
    let dir = scratch("queues-pass");
    let addr = serve_in_process(
        dir.path(),
        Transport::PlainText,
        Bounds::new(Limits::default()),
    )
    .await;
    let url = format!("http://{addr}");
    gpuwarden_test_support::node::register(&url, gpuwarden_test_support::node::with_cpus("n1", 8))
        .await;
    let mut c = client(addr).await;
    let base = c.clone();
    let create = |name: &str| {
        let mut c = base.clone();
        let mut r = gpuwarden_test_support::controller::request(name);
        r.requested = slots(&[("cpu", "1.5")]);
        async move { c.create_session(r).await.expect("created").into_inner().id }
    };
    let one = create("one").await;
    let two = create("two").await;
    until_state(&mut c, &one, pb::SessionState::Scheduled).await;
    until_state(&mut c, &two, pb::SessionState::Scheduled).await;
    // Alice's queue may hold 3.5 CPUs: the two she holds (3) and no 1.5 more.
    c.set_queue(queue(
        "team-a",
        &[("cpu", "1")],
        Some(&[("cpu", "3.5")]),
        &["alice"],
    ))
    .await
    .expect("sets");
    let shown = c
        .get_queue(pb::GetQueueRequest {
            name: "team-a".into(),
        })
        .await
        .expect("gets")
        .into_inner();
    assert_eq!(shown.held, slots(&[("cpu", "3")]));
    assert_eq!(shown.borrowed, slots(&[("cpu", "2")]));
    let three = create("three").await;
    let started = std::time::Instant::now();
    loop {
        let (state, reason) = state(&mut c, &three).await;
        assert_eq!(state, i32::from(pb::SessionState::Pending), "{reason}");
        if reason.contains("queue team-a would pass its limit of 3.5 in cpu") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{reason:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A higher limit lets it in on the next pass.
    c.set_queue(queue(
        "team-a",
        &[("cpu", "1")],
        Some(&[("cpu", "4.5")]),
        &["alice"],
    ))
    .await
    .expect("sets");
    until_state(&mut c, &three, pb::SessionState::Scheduled).await;
}

/// A queue from the config file, then one set at run time: the stored one wins after a restart,
/// and a removal is kept too.
async fn a_set_queue_survives_a_restart(store: &str) {
    let dir = scratch("queues-restart");
    let config = dir.path().join("controller.toml");
    std::fs::write(
        &config,
        r#"
[scheduler.quotas.queues.from-file]
guaranteed = { "cuda.shares" = "1" }
[scheduler.quotas.members]
carol = "from-file"
"#,
    )
    .expect("written");
    let config = config.to_string_lossy().into_owned();
    let controller = ControllerProcess::start(store, &["--config", &config]);
    controller.until_serving(SERVING).await;
    let mut c = controller.client().await;
    let names = |r: pb::ListQueuesResponse| -> Vec<String> {
        r.queues.into_iter().map(|q| q.name).collect()
    };
    let listed = c
        .list_queues(pb::ListQueuesRequest::default())
        .await
        .expect("lists");
    assert_eq!(names(listed.into_inner()), ["from-file"], "{store}");
    c.set_queue(queue(
        "team-a",
        &[("cuda.shares", "4.5")],
        Some(&[("cuda.shares", "6.25")]),
        &["alice"],
    ))
    .await
    .expect("sets");
    c.delete_queue(pb::DeleteQueueRequest {
        name: "from-file".into(),
        ..Default::default()
    })
    .await
    .expect("removes");
    drop(controller);

    let controller = ControllerProcess::start(store, &["--config", &config]);
    controller.until_serving(SERVING).await;
    let mut c = controller.client().await;
    let listed = c
        .list_queues(pb::ListQueuesRequest::default())
        .await
        .expect("lists")
        .into_inner();
    assert_eq!(listed.queues.len(), 1, "{store}: {listed:?}");
    let q = &listed.queues[0];
    assert_eq!(q.name, "team-a");
    assert_eq!(q.guaranteed, slots(&[("cuda.shares", "4.5")]));
    assert_eq!(q.limit, slots(&[("cuda.shares", "6.25")]));
    assert_eq!(q.members, ["alice"]);
}

#[tokio::test]
async fn a_set_queue_survives_a_restart_on_sled() {
    let dir = scratch("sled");
    let store = format!("sled:{}", dir.path().join("store").display());
    a_set_queue_survives_a_restart(&store).await;
}

#[tokio::test]
async fn a_set_queue_survives_a_restart_on_etcd() {
    let etcd = Etcd::start();
    a_set_queue_survives_a_restart(&etcd.store_url("queues")).await;
}
