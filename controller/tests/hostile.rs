//! The attacker over real gRPC and real mutual TLS on loopback, as a deployment runs: every call
//! carries a certificate minted for the test (an admin's for the scheduler service, each node's
//! own for the agent service). Oversized strings and maps, messages over the size limit, unknown
//! enum values, NaN and negative usage, create storms, thousands of Watch streams, nodes claiming
//! absurd hardware, floods on an agent stream, a client past its rate, a user watching another
//! owner's session events. Each is refused with the code and the field or limit named;
//! afterwards the controller still answers and every acknowledged session is still there.
//! (Wrong, missing and borrowed certificates are `tls.rs`'s; tokens and users `clients.rs`'s.)

use std::{path::PathBuf, sync::Arc, time::Duration};

use gpuwarden_controller::{
    auth::{
        clients::ClientRole,
        denials::DenialReason,
        grants::GrantFile,
        mint,
        tls::{ReloadingConfig, ServerTlsFiles},
    },
    limits::{Bounds, Limits, Refusal},
    server::{Security, Transport},
};
use gpuwarden_proto::v1::{
    self as pb, agent_message::Msg, agent_service_client::AgentServiceClient,
    scheduler_service_client::SchedulerServiceClient,
};
use gpuwarden_runtime::tls::ClientTls;
use tokio_stream::StreamExt as _;
use tonic::{Code, Status, transport::Channel};

/// What the admin granted: alice her slice and her namespace; mallory nothing.
const GRANTS: &str = r#"
[[grants]]
owner = "alice"
cgroup_prefixes = ["/tenants/alice.slice"]
namespaces = ["team-a"]
"#;

/// The nodes the attacker speaks as; each has its own certificate.
const NODES: [&str; 4] = ["node-0", "node-1", "node-2", "node-big"];

/// The controller under attack: held to `limits`, serving mutual TLS with certificates for
/// [`NODES`] and for an admin, with node-0 registered.
struct Target {
    dir: tempfile::TempDir,
    url: String,
    /// The admin's channel to the scheduler service.
    admin: Channel,
    /// Its bounds, which count what it refuses.
    bounds: Arc<Bounds>,
}

impl Target {
    async fn start(limits: Limits) -> Self {
        let dir = gpuwarden_test_support::scratch("hostile");
        let certs = dir.path().join("certs");
        let nodes: Vec<String> = NODES.iter().map(|n| (*n).to_owned()).collect();
        let names = ["localhost".to_owned(), "127.0.0.1".to_owned()];
        mint::mint_into(&certs, &nodes, &names, 1).expect("minted");
        mint::mint_clients_into(
            &certs,
            &[
                ("ops".to_owned(), ClientRole::Admin),
                ("alice".to_owned(), ClientRole::User),
                ("mallory".to_owned(), ClientRole::User),
            ],
            1,
        )
        .expect("minted the clients");
        let tls = ReloadingConfig::load(ServerTlsFiles::minted(&certs)).expect("TLS files load");
        let grants = dir.path().join("grants.toml");
        std::fs::write(&grants, GRANTS).expect("grant file written");
        let security = Security {
            transport: Transport::Tls(Arc::new(tls)),
            tokens: None,
            grants: Arc::new(GrantFile::load(&grants).expect("grants load")),
        };
        let state = dir.path().join("state");
        let bounds = Bounds::new(limits);
        let addr = gpuwarden_test_support::controller::serve_in_process(
            &state,
            security,
            Arc::clone(&bounds),
        )
        .await;
        let url = format!("https://{addr}");
        let admin = channel(&url, &certs, "admin-ops").await;
        let target = Self {
            dir,
            url,
            admin,
            bounds,
        };
        // node-0 brings the slot types sessions ask for; it never opens a stream.
        target
            .agent("node-0")
            .await
            .register(node("node-0"))
            .await
            .expect("node-0 registers");
        target
    }

    /// What it refused or dropped for `reason` so far.
    fn count_of(&self, reason: Refusal) -> u64 {
        self.bounds.refusals().count_of(reason)
    }

    fn certs(&self) -> PathBuf {
        self.dir.path().join("certs")
    }

    /// A scheduler client acting as the admin.
    fn scheduler(&self) -> SchedulerServiceClient<Channel> {
        // The client sends whatever it is given: the server's limits are under test.
        SchedulerServiceClient::new(self.admin.clone()).max_decoding_message_size(usize::MAX)
    }

    /// A scheduler client holding user `name`'s certificate.
    async fn user(&self, name: &str) -> SchedulerServiceClient<Channel> {
        SchedulerServiceClient::new(
            channel(&self.url, &self.certs(), &format!("user-{name}")).await,
        )
    }

    /// An agent-service client holding `node`'s certificate.
    async fn agent(&self, node: &str) -> AgentServiceClient<Channel> {
        AgentServiceClient::new(channel(&self.url, &self.certs(), node).await)
    }
}

/// A TLS channel to `url` trusting the minted CA and presenting `<identity>.pem`.
async fn channel(url: &str, certs: &std::path::Path, identity: &str) -> Channel {
    let tls = ClientTls {
        ca: Some(certs.join(mint::CA_CERT)),
        cert: Some(certs.join(format!("{identity}.pem"))),
        key: Some(certs.join(format!("{identity}.key"))),
    };
    tls.apply(tonic::transport::Endpoint::from_shared(url.to_owned()).expect("a URL"))
        .expect("TLS settings")
        .connect()
        .await
        .expect("connects over TLS")
}

fn request(slots: &[(&str, &str)]) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        requested: Some(pb::ResourceSlot {
            values: slots
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }),
        name: "job".into(),
        ..Default::default()
    }
}

/// Asserts `result` failed with `code` and a message holding every one of `words`.
#[track_caller]
fn refused<T: std::fmt::Debug>(result: Result<T, Status>, code: Code, words: &[&str]) -> String {
    let status = result.expect_err("refused");
    assert_eq!(status.code(), code, "{status:?}");
    for w in words {
        assert!(status.message().contains(w), "{w:?} not in {status:?}");
    }
    // An answer never echoes the megabyte it refused.
    assert!(
        status.message().len() < 1024,
        "{} bytes",
        status.message().len()
    );
    status.message().to_owned()
}

fn node(id: &str) -> pb::NodeInfo {
    gpuwarden_test_support::node::with_two_gpus(id)
}

fn heartbeat(node: &str) -> pb::AgentMessage {
    pb::AgentMessage {
        msg: Some(Msg::Heartbeat(pb::Heartbeat {
            node_id: node.into(),
            ..Default::default()
        })),
    }
}

fn usage(session: &str, utilization: f64, ioctls_per_sec: f64) -> pb::AgentMessage {
    pb::AgentMessage {
        msg: Some(Msg::Usage(pb::SessionUsage {
            session_id: session.into(),
            utilization,
            ioctls_per_sec,
            ..Default::default()
        })),
    }
}

/// Registers `id` and opens its stream; the sender for more messages and what comes down.
async fn connect(
    target: &Target,
    id: &str,
) -> (
    tokio::sync::mpsc::Sender<pb::AgentMessage>,
    tonic::Streaming<pb::ControllerMessage>,
) {
    gpuwarden_test_support::node::connect_with(target.agent(id).await, node(id)).await
}

/// The status that ends `inbound`, skipping what the controller sent before it.
async fn closing_status(inbound: &mut tonic::Streaming<pb::ControllerMessage>) -> Status {
    let wait = async {
        loop {
            match inbound.next().await {
                Some(Ok(_)) => {}
                Some(Err(status)) => return status,
                None => panic!("the stream ended without a status"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), wait)
        .await
        .expect("the stream is closed in time")
}

/// The controller still answers: a normal create and a listing that holds it and every id in
/// `acknowledged`.
async fn still_healthy(target: &Target, acknowledged: &[String]) {
    let mut client = target.scheduler();
    let created = client
        .create_session(request(&[("cuda.shares", "0.5")]))
        .await
        .expect("a normal create works")
        .into_inner();
    let listed: Vec<String> = client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("a normal list works")
        .into_inner()
        .sessions
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert!(listed.contains(&created.id), "{listed:?}");
    for id in acknowledged {
        assert!(listed.contains(id), "acknowledged session {id} lost");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_strings_maps_and_messages_are_refused_naming_the_field() {
    let target = Target::start(Limits::default()).await;
    let mut client = target.scheduler();
    let acknowledged = client
        .create_session(request(&[("cuda.shares", "0.25")]))
        .await
        .expect("a normal create")
        .into_inner()
        .id;
    let mb = "x".repeat(1 << 20);

    let r = pb::CreateSessionRequest {
        name: mb.clone(),
        ..request(&[("cuda.shares", "0.5")])
    };
    refused(
        client.create_session(r).await,
        Code::InvalidArgument,
        &["name: 1048576 bytes", "limits.max_name_len"],
    );
    let r = pb::CreateSessionRequest {
        owner: mb.clone(),
        ..request(&[("cuda.shares", "0.5")])
    };
    refused(
        client.create_session(r).await,
        Code::InvalidArgument,
        &["owner: 1048576 bytes", "limits.max_owner_len"],
    );
    refused(
        client.create_session(request(&[(&mb, "1")])).await,
        Code::InvalidArgument,
        &["requested key: 1048576 bytes", "limits.max_slot_key_len"],
    );
    refused(
        client
            .get_session(pb::GetSessionRequest { id: mb.clone() })
            .await,
        Code::InvalidArgument,
        &["id: 1048576 bytes", "limits.max_id_len"],
    );
    refused(
        client
            .list_sessions(pb::ListSessionsRequest {
                owner: mb.clone(),
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        &["owner: 1048576 bytes"],
    );

    // 10,000 slot keys, each valid on its own.
    let keys: Vec<String> = (0..10_000).map(|i| format!("k{i}")).collect();
    let many: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "1")).collect();
    refused(
        client.create_session(request(&many)).await,
        Code::InvalidArgument,
        &["requested: 10000 entries", "limits.max_slots_per_request"],
    );

    // More digits than the fixed point holds: too precise, and too long.
    refused(
        client
            .create_session(request(&[("cuda.shares", "0.0000001")]))
            .await,
        Code::InvalidArgument,
        &["cuda.shares", "more than 6 fractional digits"],
    );
    let digits = "9".repeat(60);
    refused(
        client
            .create_session(request(&[("cuda.shares", &digits)]))
            .await,
        Code::InvalidArgument,
        &["requested[cuda.shares]", "limits.max_slot_value_len"],
    );
    // A value within the length but past what a u128 of millionths holds.
    refused(
        client
            .create_session(request(&[("cuda.shares", &"9".repeat(39))]))
            .await,
        Code::InvalidArgument,
        &["too large"],
    );

    // Over the 4 MiB message limit: tonic refuses it before the service sees it.
    let r = pb::CreateSessionRequest {
        name: "x".repeat(5 << 20),
        ..request(&[("cuda.shares", "0.5")])
    };
    let message = refused(
        client.create_session(r).await,
        Code::OutOfRange,
        &["4194304"],
    );
    eprintln!("over the message limit: {message}");

    still_healthy(&target, &[acknowledged]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_storm_stops_at_exactly_the_owner_cap_and_loses_nothing() {
    const CAP: usize = 25;
    let target = Target::start(Limits {
        max_sessions_per_owner: CAP,
        ..Limits::default()
    })
    .await;
    // Concurrent creates, so the cap is tested against races, not only in sequence.
    let attempts: Vec<_> = (0..CAP * 3)
        .map(|_| {
            let mut client = target.scheduler();
            tokio::spawn(async move {
                client
                    .create_session(pb::CreateSessionRequest {
                        owner: "mallory".into(),
                        ..request(&[("cuda.shares", "0.01")])
                    })
                    .await
            })
        })
        .collect();
    let mut acknowledged = Vec::new();
    let mut refusals = 0;
    for attempt in attempts {
        match attempt.await.expect("the task ran") {
            Ok(s) => acknowledged.push(s.into_inner().id),
            Err(status) => {
                refused(
                    Err::<(), _>(status),
                    Code::ResourceExhausted,
                    &[
                        "sessions of \"mallory\"",
                        "limit of 25",
                        "limits.max_sessions_per_owner",
                    ],
                );
                refusals += 1;
            }
        }
    }
    assert_eq!(acknowledged.len(), CAP);
    assert_eq!(refusals, CAP * 2);
    // Another owner is not held to mallory's cap.
    let mut client = target.scheduler();
    client
        .create_session(pb::CreateSessionRequest {
            owner: "alice".into(),
            ..request(&[("cuda.shares", "0.01")])
        })
        .await
        .expect("alice still creates");
    // Ending one frees a place.
    client
        .terminate_session(pb::TerminateSessionRequest {
            id: acknowledged[0].clone(),
        })
        .await
        .expect("ends");
    client
        .create_session(pb::CreateSessionRequest {
            owner: "mallory".into(),
            ..request(&[("cuda.shares", "0.01")])
        })
        .await
        .expect("a place was freed");
    still_healthy(&target, &acknowledged).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_watch_streams_are_refused_past_the_cap_and_the_first_keep_working() {
    let limits = Limits::default();
    let cap = limits.max_watches_per_caller;
    let target = Target::start(limits).await;
    let mut client = target.scheduler();
    let mut open = Vec::new();
    for _ in 0..cap {
        open.push(
            client
                .watch_sessions(pb::WatchSessionsRequest::default())
                .await
                .expect("within the cap")
                .into_inner(),
        );
    }
    for _ in 0..2_000 {
        refused(
            client
                .watch_sessions(pb::WatchSessionsRequest::default())
                .await,
            Code::ResourceExhausted,
            &["open Watch streams", "limits.max_watches_per_caller"],
        );
    }
    let created = client
        .create_session(request(&[("cuda.shares", "0.5")]))
        .await
        .expect("creates")
        .into_inner();
    for stream in &mut open {
        let seen = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("the watch still delivers")
            .expect("not ended")
            .expect("a session");
        assert_eq!(seen.id, created.id);
    }
    // A watcher that goes away frees its place.
    drop(open.pop());
    let mut reopened = None;
    for _ in 0..50 {
        match client
            .watch_sessions(pb::WatchSessionsRequest::default())
            .await
        {
            Ok(s) => {
                reopened = Some(s);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert!(reopened.is_some(), "the freed place was never reused");
    still_healthy(&target, &[created.id]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_claiming_absurd_hardware_or_unknown_enums_are_refused() {
    let target = Target::start(Limits::default()).await;
    let mut agent = target.agent("node-big").await;
    let mut gpus = node("node-big");
    gpus.devices = (0..10_000)
        .map(|i| pb::Device {
            uuid: format!("GPU-{i}"),
            memory_bytes: 16 << 30,
            index: i,
            ..Default::default()
        })
        .collect();
    refused(
        agent.register(gpus).await,
        Code::InvalidArgument,
        &["devices: 10000 entries", "limits.max_devices_per_node"],
    );
    let mut memory = node("node-big");
    memory.devices[1].memory_bytes = u64::MAX;
    refused(
        agent.register(memory).await,
        Code::InvalidArgument,
        &["devices[1].memory_bytes", "limits.max_device_memory_bytes"],
    );
    let mut types = node("node-big");
    types.slot_types = (0..1_000)
        .map(|i| pb::SlotType {
            name: format!("t{i}"),
            kind: pb::SlotKind::Count.into(),
        })
        .collect();
    refused(
        agent.register(types).await,
        Code::InvalidArgument,
        &["slot_types: 1000 entries", "limits.max_slot_types_per_node"],
    );
    // A MIG instance naming a megabyte as its GPU (issue 37's parent_uuid).
    let mut parent = node("node-big");
    parent.devices[0].parent_uuid = "p".repeat(1 << 20);
    refused(
        agent.register(parent).await,
        Code::InvalidArgument,
        &["devices[0].parent_uuid: 1048576 bytes", "limits.max_id_len"],
    );
    let mut id = node("node-big");
    id.node_id = "n".repeat(1 << 20);
    refused(
        agent.register(id).await,
        Code::InvalidArgument,
        &["node_id: 1048576 bytes", "limits.max_id_len"],
    );
    // An enum value no version defines: refused, naming the slot type.
    let mut kind = node("node-big");
    kind.slot_types[0].kind = 99;
    refused(
        agent.register(kind).await,
        Code::InvalidArgument,
        &["slot type \"cuda.shares\" has no kind"],
    );
    // None of them registered anything.
    let nodes: Vec<String> = target
        .scheduler()
        .list_nodes(pb::ListNodesRequest::default())
        .await
        .expect("lists")
        .into_inner()
        .nodes
        .into_iter()
        .filter_map(|n| n.info.map(|i| i.node_id))
        .collect();
    assert_eq!(nodes, ["node-0"]);
    still_healthy(&target, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nan_or_negative_usage_closes_the_agent_stream_naming_the_field() {
    let target = Target::start(Limits::default()).await;
    for (message, field) in [
        (usage("s-1", f64::NAN, 0.0), "usage.utilization: NaN"),
        (usage("s-1", -0.5, 0.0), "usage.utilization: -0.5"),
        (
            usage("s-1", 0.5, f64::INFINITY),
            "usage.ioctls_per_sec: inf",
        ),
    ] {
        let (tx, mut inbound) = connect(&target, "node-1").await;
        tx.send(message).await.expect("sent");
        let status = closing_status(&mut inbound).await;
        refused(
            Err::<(), _>(status),
            Code::InvalidArgument,
            &[field, "not a finite, non-negative number"],
        );
    }
    still_healthy(&target, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_and_events_for_sessions_not_on_the_node_are_dropped_and_counted() {
    let target = Target::start(Limits::default()).await;
    let mut client = target.scheduler();
    // On node-2 (registered, never connected): no session of node-1's.
    target
        .agent("node-2")
        .await
        .register(node("node-2"))
        .await
        .expect("node-2 registers");
    let elsewhere = client
        .create_session(pb::CreateSessionRequest {
            node_id: "node-2".into(),
            ..request(&[("cuda.shares", "0.5")])
        })
        .await
        .expect("creates")
        .into_inner();
    let (tx, _inbound) = connect(&target, "node-1").await;
    let before = target.count_of(Refusal::ForeignSession);
    tx.send(usage(&elsewhere.id, 0.5, 1.0)).await.expect("sent");
    tx.send(pb::AgentMessage {
        msg: Some(Msg::Event(pb::EnforcementEvent {
            session_id: elsewhere.id.clone(),
            action: "kill".into(),
            reason: "forged".into(),
            ..Default::default()
        })),
    })
    .await
    .expect("sent");
    // Counted by the target's bounds as the stream is read: at least these two.
    for _ in 0..100 {
        if target.count_of(Refusal::ForeignSession) >= before + 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(target.count_of(Refusal::ForeignSession) >= before + 2);
    let session = client
        .get_session(pb::GetSessionRequest {
            id: elsewhere.id.clone(),
        })
        .await
        .expect("still there")
        .into_inner();
    assert!(session.events.is_empty(), "{:?}", session.events);
    still_healthy(&target, &[elsewhere.id]).await;
}

/// What a tenant can make its node send in a loop (enforcement events under `report`, usage)
/// and heartbeats are dropped over the rate and counted; the node stays connected and is still
/// told what to enforce.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_flood_is_dropped_and_counted_and_the_node_stays_connected() {
    let target = Target::start(Limits {
        agent_messages_per_sec: 10,
        agent_message_burst: 50,
        ..Limits::default()
    })
    .await;
    let (tx, mut inbound) = connect(&target, "node-1").await;
    let before = target.count_of(Refusal::FloodDropped);
    for i in 0..1_000 {
        let message = if i % 2 == 0 {
            heartbeat("node-1")
        } else {
            pb::AgentMessage {
                msg: Some(Msg::Event(pb::EnforcementEvent {
                    session_id: "a-tenant-in-a-loop".into(),
                    action: "report".into(),
                    reason: "over its limit".into(),
                    ..Default::default()
                })),
            }
        };
        tx.send(message).await.expect("the stream stays open");
    }
    // At least what this flood was over its burst and rate.
    let mut dropped = 0;
    for _ in 0..200 {
        dropped = target.count_of(Refusal::FloodDropped) - before;
        if dropped >= 800 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(dropped >= 800, "{dropped} dropped");
    // Still connected: a session pinned to node-1 is allocated down the same stream.
    let pinned = target
        .scheduler()
        .create_session(pb::CreateSessionRequest {
            node_id: "node-1".into(),
            ..request(&[("cuda.shares", "0.5")])
        })
        .await
        .expect("creates")
        .into_inner();
    let allocated = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match inbound.next().await {
                Some(Ok(pb::ControllerMessage {
                    msg: Some(pb::controller_message::Msg::Allocate(a)),
                })) if a.session_id == pinned.id => return a,
                Some(Ok(_)) => {}
                other => panic!("the node was cut off: {other:?}"),
            }
        }
    })
    .await
    .expect("the allocation arrives in time");
    assert_eq!(allocated.session_id, pinned.id);
    still_healthy(&target, &[pinned.id]).await;
}

/// Acks change state: a node flooding them is closed (it may reconnect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_flooding_acks_is_closed_with_resource_exhausted() {
    let target = Target::start(Limits {
        agent_messages_per_sec: 10,
        agent_message_burst: 50,
        ..Limits::default()
    })
    .await;
    let (tx, mut inbound) = connect(&target, "node-1").await;
    let flood = tokio::spawn(async move {
        for _ in 0..1_000 {
            let ack = pb::AgentMessage {
                msg: Some(Msg::Ack(pb::AllocationAck {
                    session_id: "nothing".into(),
                })),
            };
            if tx.send(ack).await.is_err() {
                break;
            }
        }
    });
    let status = closing_status(&mut inbound).await;
    refused(
        Err::<(), _>(status),
        Code::ResourceExhausted,
        &[
            "node-1",
            "limits.agent_messages_per_sec",
            "limits.agent_message_burst",
        ],
    );
    flood.abort();
    // The node may come back with a fresh stream.
    let (_tx, _inbound) = connect(&target, "node-1").await;
    still_healthy(&target, &[]).await;
}

#[tokio::test]
async fn a_client_calling_past_its_rate_is_refused_then_served_again() {
    let target = Target::start(Limits {
        client_requests_per_sec: 20,
        client_request_burst: 30,
        ..Limits::default()
    })
    .await;
    let before = target.count_of(Refusal::Rate);
    let mut client = target.scheduler();
    let mut served = 0;
    let status = loop {
        match client.list_slot_types(pb::ListSlotTypesRequest {}).await {
            Ok(_) => served += 1,
            Err(status) => break status,
        }
        assert!(served <= 1_000, "never refused");
    };
    // The burst, and what refilled while it was spent.
    assert!(served >= 30, "refused after {served} calls");
    refused(
        Err::<(), _>(status),
        Code::ResourceExhausted,
        &[
            "limits.client_requests_per_sec",
            "limits.client_request_burst",
        ],
    );
    assert!(target.count_of(Refusal::Rate) > before);
    // 200 ms refill four calls.
    tokio::time::sleep(Duration::from_millis(200)).await;
    client
        .list_slot_types(pb::ListSlotTypesRequest {})
        .await
        .expect("served again");
}

fn targeted(kind: pb::target::Kind) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        target: Some(pb::Target { kind: Some(kind) }),
        ..request(&[("cuda.shares", "0.01"), ("cuda.mem", "1048576")])
    }
}

/// The attack that opened issue 21: a user aims a quota (memory policy kill, 1 % of a GPU) at a
/// cgroup, pod or container that holds another tenant's workload, or at every pod on the node.
/// Refused with the target and the owner named; inside what an admin granted, accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_binds_sessions_only_to_what_it_was_granted() {
    use pb::target::Kind;
    let target = Target::start(Limits::default()).await;
    let denials = target.bounds.denials();
    assert_eq!(denials.count_of(DenialReason::TargetNotGranted), 0);
    let mut mallory = target.user("mallory").await;
    let pod = "123e4567-e89b-12d3-a456-426614174000";
    let container = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    for (kind, named) in [
        (
            Kind::CgroupPath("/h1victim.slice".into()),
            "cgroup /h1victim.slice",
        ),
        (
            Kind::CgroupPath("/kubepods.slice".into()),
            "cgroup /kubepods.slice",
        ),
        (Kind::CgroupPath("/".into()), "cgroup /"),
        (Kind::PodUid(pod.into()), pod),
        (Kind::ContainerId(container.into()), container),
    ] {
        refused(
            mallory
                .create_session(pb::CreateSessionRequest {
                    policy: Some(pb::QuotaPolicy {
                        memory: "kill".into(),
                        compute: String::new(),
                        ..Default::default()
                    }),
                    ..targeted(kind)
                })
                .await,
            Code::PermissionDenied,
            &["\"mallory\"", named],
        );
    }
    // Neither an admin's word nor a weaker policy is a user's to take.
    refused(
        mallory
            .create_session(pb::CreateSessionRequest {
                unconfined_target: true,
                ..targeted(Kind::CgroupPath("/h1victim.slice".into()))
            })
            .await,
        Code::PermissionDenied,
        &["only an admin"],
    );
    refused(
        mallory
            .create_session(pb::CreateSessionRequest {
                policy: Some(pb::QuotaPolicy {
                    memory: "report".into(),
                    compute: String::new(),
                    ..Default::default()
                }),
                node_id: "node-0".into(),
                ..targeted(Kind::Managed(true))
            })
            .await,
        Code::PermissionDenied,
        &["memory policy report", "kill, stop"],
    );
    assert!(denials.count_of(DenialReason::TargetNotGranted) >= 7);

    // alice inside her grants is served; a step outside is not.
    let mut alice = target.user("alice").await;
    let mine = alice
        .create_session(targeted(Kind::CgroupPath(
            "/tenants/alice.slice/job-1".into(),
        )))
        .await
        .expect("inside the granted prefix")
        .into_inner();
    assert_eq!(mine.owner, "alice");
    alice
        .create_session(targeted(Kind::PodUid(pod.into())))
        .await
        .expect("a pod: its namespace is checked on its node");
    refused(
        alice
            .create_session(targeted(Kind::CgroupPath("/tenants/alice.slice2".into())))
            .await,
        Code::PermissionDenied,
        &["\"alice\"", "outside the granted cgroup prefixes"],
    );
    still_healthy(&target, &[mine.id]).await;
}

/// A user gets the same answer for another owner's session as for an id that does not exist,
/// so ids can't be probed; the other session is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_cannot_tell_another_owners_session_from_none() {
    let target = Target::start(Limits::default()).await;
    let theirs = target
        .scheduler()
        .create_session(request(&[("cuda.shares", "0.5")]))
        .await
        .expect("the admin creates")
        .into_inner();
    let mut mallory = target.user("mallory").await;
    let end = |id: &str| pb::TerminateSessionRequest { id: id.into() };
    let other = refused(
        mallory.terminate_session(end(&theirs.id)).await,
        Code::PermissionDenied,
        &["only its own sessions"],
    );
    let none = refused(
        mallory.terminate_session(end("no-such-session")).await,
        Code::PermissionDenied,
        &["only its own sessions"],
    );
    assert_eq!(
        other.replace(&theirs.id, "ID"),
        none.replace("no-such-session", "ID")
    );
    refused(
        mallory
            .get_session(pb::GetSessionRequest {
                id: theirs.id.clone(),
            })
            .await,
        Code::PermissionDenied,
        &["only its own sessions"],
    );
    // An admin still learns that an id does not exist.
    refused(
        target
            .scheduler()
            .terminate_session(end("no-such-session"))
            .await,
        Code::NotFound,
        &["no-such-session"],
    );
    let still = target
        .scheduler()
        .get_session(pb::GetSessionRequest {
            id: theirs.id.clone(),
        })
        .await
        .expect("still there")
        .into_inner();
    assert_ne!(still.state, pb::SessionState::Terminated as i32);
    still_healthy(&target, &[theirs.id]).await;
}

/// The events `watch` sends until every id in `want` came and it has passed revision `past`
/// (a session or bookmark at or after it: every change up to it was sent or was not for this
/// watcher). Bounded: 20 s in all.
async fn watched_until(
    watch: &mut tonic::Streaming<pb::SessionEvent>,
    want: &[&str],
    past: u64,
) -> Vec<pb::Session> {
    use pb::session_event::Event;
    let mut sent = Vec::new();
    let mut reached = 0;
    let read = async {
        while !(reached >= past
            && want
                .iter()
                .all(|id| sent.iter().any(|s: &pb::Session| s.id == *id)))
        {
            let event = watch
                .next()
                .await
                .expect("the watch goes on")
                .expect("an event")
                .event
                .expect("a session or a bookmark");
            match event {
                Event::Session(s) => {
                    reached = reached.max(s.revision);
                    sent.push(s);
                }
                Event::Bookmark(b) => reached = reached.max(b.revision),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .unwrap_or_else(|_| panic!("{want:?} and revision {past} within 20 s"));
    sent
}

/// Issue 40's `WatchSessionEvents` with an `owner` filter, judged by what each session is: a
/// user naming another owner is refused with the owner named and counted; a user naming no
/// owner is sent only its own sessions, those from before the watch and those created during
/// it, never the other owner's; an admin naming a user is sent that user's and no one else's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_of_session_events_sends_no_other_owners_sessions() {
    let target = Target::start(Limits::default()).await;
    let mut alice = target.user("alice").await;
    let mut mallory = target.user("mallory").await;
    let create = async |client: &mut SchedulerServiceClient<Channel>, owner: &str| {
        let created = client
            .create_session(request(&[("cuda.shares", "0.1")]))
            .await
            .expect("a user creates its own")
            .into_inner();
        assert_eq!(created.owner, owner);
        created
    };
    let a1 = create(&mut alice, "alice").await;
    let m1 = create(&mut mallory, "mallory").await;
    let from_zero = |owner: &str| pb::WatchSessionEventsRequest {
        since_revision: 0,
        start: pb::WatchStart::AfterRevision.into(),
        owner: owner.into(),
        ..Default::default()
    };

    // Naming another owner is refused, as ListSessions is: not silently narrowed.
    let before = target.bounds.denials().count_of(DenialReason::OtherOwner);
    refused(
        mallory.watch_session_events(from_zero("alice")).await,
        Code::PermissionDenied,
        &["\"mallory\"", "only its own sessions", "\"alice\""],
    );
    assert_eq!(
        target.bounds.denials().count_of(DenialReason::OtherOwner),
        before + 1
    );

    // No owner named: mallory's own, from the replay and live, and none of alice's.
    let mut watch = mallory
        .watch_session_events(from_zero(""))
        .await
        .expect("a user watches its own")
        .into_inner();
    let a2 = create(&mut alice, "alice").await;
    let m2 = create(&mut mallory, "mallory").await;
    let a3 = create(&mut alice, "alice").await;
    let sent = watched_until(&mut watch, &[&m1.id, &m2.id], a3.revision).await;
    let alices = [&a1.id, &a2.id, &a3.id];
    for s in &sent {
        assert_eq!(s.owner, "mallory", "{} sent to mallory's watch", s.id);
        assert!(!alices.contains(&&s.id), "alice's {} sent to mallory", s.id);
    }
    drop(watch);

    // An admin naming alice: all of alice's, before and during the watch, and none of mallory's.
    let mut admin = target.scheduler();
    let mut watch = admin
        .watch_session_events(from_zero("alice"))
        .await
        .expect("an admin watches any owner")
        .into_inner();
    let m3 = create(&mut mallory, "mallory").await;
    let a4 = create(&mut alice, "alice").await;
    let m4 = create(&mut mallory, "mallory").await;
    let sent = watched_until(&mut watch, &[&a1.id, &a2.id, &a3.id, &a4.id], m4.revision).await;
    let mallorys = [&m1.id, &m2.id, &m3.id, &m4.id];
    for s in &sent {
        assert_eq!(s.owner, "alice", "{} sent to a watch of alice's", s.id);
        assert!(!mallorys.contains(&&s.id), "mallory's {} sent", s.id);
    }
    drop(watch);
    still_healthy(&target, &[a4.id, m4.id]).await;
}

/// The queue calls added for team quotas: a user can neither set nor remove a queue, an
/// oversized queue is refused naming the field and counted, and nothing refused is kept.
#[tokio::test]
async fn a_user_cannot_change_team_queues_and_an_oversized_queue_is_refused_and_counted() {
    let limits = Limits::default();
    let max_list = limits.max_list_len;
    let target = Target::start(limits).await;
    let queue = |name: &str, members: Vec<String>| pb::SetQueueRequest {
        queue: Some(pb::Queue {
            name: name.into(),
            guaranteed: Some(pb::ResourceSlot {
                values: [("cpu".to_owned(), "1".to_owned())].into(),
            }),
            members,
            ..Default::default()
        }),
    };
    let mut mallory = target.user("mallory").await;
    refused(
        mallory
            .set_queue(queue("mine", vec!["mallory".into()]))
            .await,
        Code::PermissionDenied,
        &["mallory", "only an admin"],
    );
    let mut admin = target.scheduler();
    admin
        .set_queue(queue("lab", vec!["alice".into()]))
        .await
        .expect("the admin sets a queue");
    refused(
        mallory
            .delete_queue(pb::DeleteQueueRequest {
                name: "lab".into(),
                ..Default::default()
            })
            .await,
        Code::PermissionDenied,
        &["mallory", "only an admin"],
    );
    let oversized_before = target.count_of(Refusal::Oversized);
    let members: Vec<String> = (0..=max_list).map(|i| format!("u{i}")).collect();
    refused(
        admin.set_queue(queue("huge", members)).await,
        Code::InvalidArgument,
        &["queue.members"],
    );
    assert_eq!(target.count_of(Refusal::Oversized), oversized_before + 1);
    // What was refused is not there; what the admin set still is, as it was.
    refused(
        mallory
            .get_queue(pb::GetQueueRequest {
                name: "huge".into(),
            })
            .await,
        Code::NotFound,
        &["huge"],
    );
    refused(
        admin
            .get_queue(pb::GetQueueRequest {
                name: "mine".into(),
            })
            .await,
        Code::NotFound,
        &["mine"],
    );
    let lab = admin
        .get_queue(pb::GetQueueRequest { name: "lab".into() })
        .await
        .expect("the admin's queue is kept")
        .into_inner();
    assert_eq!(lab.members, ["alice"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_gangs_are_refused_naming_the_field_and_nothing_is_kept() {
    let target = Target::start(Limits::default()).await;
    let mut client = target.scheduler();
    let oversized = target.count_of(Refusal::Oversized);
    let gang = |name: &str, size| pb::CreateSessionRequest {
        gang: Some(pb::Gang {
            name: name.into(),
            size,
        }),
        ..request(&[("cuda.shares", "0.5")])
    };
    refused(
        client.create_session(gang(&"g".repeat(1 << 20), 2)).await,
        Code::InvalidArgument,
        &["gang.name: 1048576 bytes", "limits.max_name_len"],
    );
    refused(
        client.create_session(gang("g", u32::MAX)).await,
        Code::InvalidArgument,
        &["gang.size: 4294967295", "limits.max_sessions_per_owner"],
    );
    assert_eq!(target.count_of(Refusal::Oversized), oversized + 2);
    for (name, size, words) in [
        ("g", 0, "gang.size 0"),
        ("", 2, "gang.name"),
        ("../etc", 2, "gang.name"),
    ] {
        refused(
            client.create_session(gang(name, size)).await,
            Code::InvalidArgument,
            &[words],
        );
    }
    // A member past the gang's size, or naming another size, is refused too.
    let first = client
        .create_session(gang("pair", 2))
        .await
        .expect("a member")
        .into_inner();
    assert_eq!(
        first.gang,
        Some(pb::Gang {
            name: "pair".into(),
            size: 2
        })
    );
    refused(
        client.create_session(gang("pair", 3)).await,
        Code::InvalidArgument,
        &["gang.size 3", "\"pair\""],
    );
    client
        .create_session(gang("pair", 2))
        .await
        .expect("the second member");
    refused(
        client.create_session(gang("pair", 2)).await,
        Code::InvalidArgument,
        &["\"pair\"", "all its 2 members"],
    );
    let kept = client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("lists")
        .into_inner()
        .sessions;
    assert_eq!(kept.len(), 2, "only the two members: {kept:?}");
}
