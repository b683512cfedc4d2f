//! Scheduler clients authenticated and authorized over real gRPC on loopback: bearer tokens
//! from a token file (plain text and TLS), client certificates naming a user or an admin
//! (real rustls, certificates minted in the test). A user acts only on its own sessions, an
//! admin on all; a call without valid credentials is `UNAUTHENTICATED`; the token file is
//! followed without a restart.

use std::{path::PathBuf, process::Command, sync::Arc, time::Duration};

use gpuwarden_controller::{
    api::convert,
    auth::{
        clients::ClientRole,
        denials::DenialReason,
        mint,
        tls::{ReloadingConfig, ServerTlsFiles},
        tokens::{self, TokenFile},
    },
    limits::{Bounds, Limits},
    server::{Security, Transport},
    slots::ResourceSlot,
};
use gpuwarden_proto::v1::{
    self as pb, agent_service_client::AgentServiceClient,
    scheduler_service_client::SchedulerServiceClient,
};
use gpuwarden_runtime::tls::ClientTls;
use tokio_stream::StreamExt as _;
use tonic::{Code, Request, transport::Channel};

/// A controller with a token file (alice and bob users, ops an admin), over plain text or TLS.
struct Served {
    dir: tempfile::TempDir,
    url: String,
    token_file: PathBuf,
    alice: String,
    bob: String,
    ops: String,
    /// The server's bounds, which count whom it refused.
    bounds: Arc<Bounds>,
}

impl Served {
    async fn start(tls: bool) -> Self {
        let dir = gpuwarden_test_support::scratch("clients");
        let token_file = dir.path().join("tokens.toml");
        let alice = tokens::add(&token_file, "alice", ClientRole::User).expect("alice's token");
        let bob = tokens::add(&token_file, "bob", ClientRole::User).expect("bob's token");
        let ops = tokens::add(&token_file, "ops", ClientRole::Admin).expect("ops's token");
        let transport = if tls {
            let certs = dir.path().join("certs");
            mint::mint_into(&certs, &["node-1".to_owned()], &["127.0.0.1".to_owned()], 1)
                .expect("minted");
            mint::mint_clients_into(
                &certs,
                &[
                    ("alice".to_owned(), ClientRole::User),
                    ("ops".to_owned(), ClientRole::Admin),
                ],
                1,
            )
            .expect("minted clients");
            Transport::Tls(Arc::new(
                ReloadingConfig::load(ServerTlsFiles::minted(&certs)).expect("TLS files load"),
            ))
        } else {
            // A plain-text node beside tokens only because the test says --insecure.
            Transport::Insecure
        };
        let security = Security {
            transport,
            tokens: Some(Arc::new(TokenFile::load(&token_file).expect("tokens load"))),
            grants: Arc::default(),
        };
        let bounds = Bounds::new(Limits::default());
        let addr = gpuwarden_test_support::controller::serve_in_process(
            &dir.path().join("state"),
            security,
            Arc::clone(&bounds),
        )
        .await;
        let scheme = if tls { "https" } else { "http" };
        let url = format!("{scheme}://{addr}");
        let served = Self {
            dir,
            url,
            token_file,
            alice,
            bob,
            ops,
            bounds,
        };
        // A node, so sessions asking for GPU shares are accepted and placed.
        let agent = if tls {
            served.tls(Some("node-1"))
        } else {
            ClientTls::default()
        };
        let channel = served.channel(&agent).await;
        tokio::spawn(fake_agent(channel).await);
        served
    }

    /// TLS with the CA and, where named, the client certificate `<file>.pem` (e.g.
    /// `user-alice`, `node-1`).
    fn tls(&self, cert: Option<&str>) -> ClientTls {
        let certs = self.dir.path().join("certs");
        ClientTls {
            ca: Some(certs.join(mint::CA_CERT)),
            cert: cert.map(|c| certs.join(format!("{c}.pem"))),
            key: cert.map(|c| certs.join(format!("{c}.key"))),
        }
    }

    async fn channel(&self, tls: &ClientTls) -> Channel {
        tls.apply(
            tonic::transport::Endpoint::from_shared(self.url.clone())
                .expect("a URL")
                .connect_timeout(Duration::from_secs(5)),
        )
        .expect("TLS settings")
        .connect()
        .await
        .expect("connects")
    }

    async fn client(&self, tls: &ClientTls) -> SchedulerServiceClient<Channel> {
        SchedulerServiceClient::new(self.channel(tls).await)
    }
}

/// `message` with `authorization: Bearer <token>`.
fn bearer<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ASCII"),
    );
    request
}

fn create(owner: &str) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        requested: Some(convert::slots_to_pb(
            &ResourceSlot::parse_any(&["cuda.shares=0.5"]).expect("parses"),
        )),
        owner: owner.to_owned(),
        ..Default::default()
    }
}

fn list(owner: &str) -> pb::ListSessionsRequest {
    pb::ListSessionsRequest {
        owner: owner.to_owned(),
        ..Default::default()
    }
}

fn ids(sessions: &[pb::Session]) -> Vec<&str> {
    sessions.iter().map(|s| s.id.as_str()).collect()
}

fn assert_status(status: &tonic::Status, code: Code, words: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    assert!(
        status.message().contains(words),
        "{:?} lacks {words:?}",
        status.message()
    );
}

/// Waits (bounded) until the server's counter for `reason` passes `before`.
async fn counted_past(bounds: &Bounds, reason: DenialReason, before: u64) -> bool {
    let started = std::time::Instant::now();
    while started.elapsed() < gpuwarden_test_support::wait::PATIENCE {
        if bounds.denials().count_of(reason) > before {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Registers node-1 with two GPUs; the future that then holds its stream and acks every
/// allocation.
async fn fake_agent(channel: Channel) -> impl Future<Output = ()> {
    let (tx, inbound) = gpuwarden_test_support::node::connect_with(
        AgentServiceClient::new(channel),
        gpuwarden_test_support::node::with_two_gpus("node-1"),
    )
    .await;
    gpuwarden_test_support::node::acknowledge_all(tx, inbound, |_| {})
}

/// The session ids the allocation map shows `token`'s caller, once `expected` many are there.
async fn mapped_sessions(
    client: &mut SchedulerServiceClient<Channel>,
    token: &str,
    expected: usize,
) -> Vec<String> {
    let mut seen = Vec::new();
    for _ in 0..100 {
        let map = client
            .get_allocation_map(bearer(pb::GetAllocationMapRequest::default(), token))
            .await
            .expect("a map")
            .into_inner();
        seen = map
            .nodes
            .iter()
            .flat_map(|n| &n.devices)
            .flat_map(|d| d.sessions.clone())
            .collect();
        if seen.len() >= expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    seen.sort();
    seen
}

#[tokio::test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
async fn a_user_token_acts_only_on_its_own_sessions_and_an_admin_on_all() {
    let served = Served::start(false).await;
    let mut client = served.client(&ClientTls::default()).await;
    let (alice, bob, ops) = (&served.alice, &served.bob, &served.ops);

    // A user's sessions are its own, named or not.
    let a1 = client
        .create_session(bearer(create(""), alice))
        .await
        .expect("alice creates")
        .into_inner();
    assert_eq!(a1.owner, "alice");
    let a2 = client
        .create_session(bearer(create("alice"), alice))
        .await
        .expect("alice creates naming herself")
        .into_inner();
    let b1 = client
        .create_session(bearer(create(""), bob))
        .await
        .expect("bob creates")
        .into_inner();
    assert_eq!(b1.owner, "bob");

    let before = served.bounds.denials().count_of(DenialReason::OtherOwner);
    let status = client
        .create_session(bearer(create("bob"), alice))
        .await
        .expect_err("alice can't create for bob");
    assert_status(&status, Code::PermissionDenied, "\"bob\"");
    assert!(counted_past(&served.bounds, DenialReason::OtherOwner, before).await);

    // Alice lists and sees only hers; asking for bob's is refused.
    let mine = client
        .list_sessions(bearer(list(""), alice))
        .await
        .expect("alice lists")
        .into_inner()
        .sessions;
    let mut expected = vec![a1.id.as_str(), a2.id.as_str()];
    expected.sort_unstable();
    let mut got = ids(&mine);
    got.sort_unstable();
    assert_eq!(got, expected);
    let status = client
        .list_sessions(bearer(list("bob"), alice))
        .await
        .expect_err("alice can't list bob's");
    assert_status(&status, Code::PermissionDenied, "only its own sessions");
    let status = client
        .get_session(bearer(pb::GetSessionRequest { id: b1.id.clone() }, alice))
        .await
        .expect_err("alice can't see bob's");
    // Without saying whose it is: an id that does not exist gets the same answer.
    assert_status(&status, Code::PermissionDenied, "only its own sessions");
    assert!(!status.message().contains("\"bob\""), "{status:?}");

    // Alice can't end bob's session; it is untouched.
    let status = client
        .terminate_session(bearer(
            pb::TerminateSessionRequest { id: b1.id.clone() },
            alice,
        ))
        .await
        .expect_err("alice can't end bob's");
    assert_status(&status, Code::PermissionDenied, "may end only its own");
    let still = client
        .get_session(bearer(pb::GetSessionRequest { id: b1.id.clone() }, bob))
        .await
        .expect("bob sees his")
        .into_inner();
    assert!(
        !matches!(
            pb::SessionState::try_from(still.state),
            Ok(pb::SessionState::Terminating | pb::SessionState::Terminated)
        ),
        "{still:?}"
    );

    // The allocation map shows a user the shares of every session but only its own ids.
    let admin_view = mapped_sessions(&mut client, ops, 3).await;
    let mut all = vec![a1.id.clone(), a2.id.clone(), b1.id.clone()];
    all.sort();
    assert_eq!(
        admin_view, all,
        "the admin sees every session on the devices"
    );
    let alice_view = mapped_sessions(&mut client, alice, 2).await;
    let mut hers = vec![a1.id.clone(), a2.id.clone()];
    hers.sort();
    assert_eq!(alice_view, hers);
    let nodes = client
        .list_nodes(bearer(pb::ListNodesRequest::default(), alice))
        .await
        .expect("a user lists nodes")
        .into_inner()
        .nodes;
    assert_eq!(nodes.len(), 1);

    // Alice ends her own.
    let ended = client
        .terminate_session(bearer(
            pb::TerminateSessionRequest { id: a1.id.clone() },
            alice,
        ))
        .await
        .expect("alice ends hers")
        .into_inner();
    assert_eq!(ended.id, a1.id);

    // The admin sees all and ends bob's.
    let all_listed = client
        .list_sessions(bearer(list(""), ops))
        .await
        .expect("ops lists")
        .into_inner()
        .sessions;
    assert!(ids(&all_listed).contains(&b1.id.as_str()), "{all_listed:?}");
    assert_eq!(all_listed.len(), 3);
    client
        .get_session(bearer(pb::GetSessionRequest { id: b1.id.clone() }, ops))
        .await
        .expect("ops sees bob's");
    let ended = client
        .terminate_session(bearer(
            pb::TerminateSessionRequest { id: b1.id.clone() },
            ops,
        ))
        .await
        .expect("ops ends bob's")
        .into_inner();
    assert!(
        matches!(
            pb::SessionState::try_from(ended.state),
            Ok(pb::SessionState::Terminating | pb::SessionState::Terminated)
        ),
        "{ended:?}"
    );
    let for_bob = client
        .create_session(bearer(create("bob"), ops))
        .await
        .expect("an admin creates for anyone")
        .into_inner();
    assert_eq!(for_bob.owner, "bob");
}

#[tokio::test]
async fn a_user_watches_only_its_own_sessions() {
    let served = Served::start(false).await;
    let mut client = served.client(&ClientTls::default()).await;
    let mut watch = client
        .watch_sessions(bearer(pb::WatchSessionsRequest::default(), &served.alice))
        .await
        .expect("alice watches")
        .into_inner();
    let bobs = client
        .create_session(bearer(create(""), &served.bob))
        .await
        .expect("bob creates")
        .into_inner();
    let hers = client
        .create_session(bearer(create(""), &served.alice))
        .await
        .expect("alice creates")
        .into_inner();
    // Everything alice is told about until her session shows up is hers.
    let first = tokio::time::timeout(Duration::from_secs(5), watch.next())
        .await
        .expect("a change in time")
        .expect("the stream is open")
        .expect("a session");
    assert_eq!(first.owner, "alice", "{first:?} (bob's was {})", bobs.id);
    assert_eq!(first.id, hers.id);
}

#[tokio::test]
async fn calls_without_a_valid_token_are_unauthenticated() {
    let served = Served::start(false).await;
    let mut client = served.client(&ClientTls::default()).await;

    let before = served
        .bounds
        .denials()
        .count_of(DenialReason::NoCredentials);
    let status = client
        .list_sessions(list(""))
        .await
        .expect_err("no token, no sessions");
    assert_status(&status, Code::Unauthenticated, "no credentials");
    assert!(counted_past(&served.bounds, DenialReason::NoCredentials, before).await);
    let status = client
        .create_session(create(""))
        .await
        .expect_err("no token, no session");
    assert_status(&status, Code::Unauthenticated, "no credentials");
    let status = client
        .list_nodes(pb::ListNodesRequest::default())
        .await
        .expect_err("no token, no nodes");
    assert_eq!(status.code(), Code::Unauthenticated);

    let before = served.bounds.denials().count_of(DenialReason::BadToken);
    let status = client
        .list_sessions(bearer(list(""), "gwt_not-a-token"))
        .await
        .expect_err("a wrong token");
    assert_status(
        &status,
        Code::Unauthenticated,
        "unknown or revoked bearer token",
    );
    assert!(counted_past(&served.bounds, DenialReason::BadToken, before).await);

    let mut basic = Request::new(list(""));
    basic.metadata_mut().insert(
        "authorization",
        "Basic YWxpY2U6eA==".parse().expect("ASCII"),
    );
    let status = client.list_sessions(basic).await.expect_err("not a bearer");
    assert_status(&status, Code::Unauthenticated, "malformed authorization");

    // A token that is right but for a stray character is wrong.
    let near = format!("{}x", served.alice);
    let status = client
        .list_slot_types(bearer(pb::ListSlotTypesRequest {}, &near))
        .await
        .expect_err("a near miss");
    assert_eq!(status.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn the_token_file_is_followed_without_a_restart() {
    let served = Served::start(false).await;
    let mut client = served.client(&ClientTls::default()).await;

    let carol = tokens::add(&served.token_file, "carol", ClientRole::User).expect("added");
    let created = client
        .create_session(bearer(create(""), &carol))
        .await
        .expect("a token added after the start works")
        .into_inner();
    assert_eq!(created.owner, "carol");

    // Rewrite the file without alice (an atomic rename, as an operator's tool would).
    let text = std::fs::read_to_string(&served.token_file).expect("readable");
    let alice_hash = tokens::hash_hex(&served.alice);
    let kept: Vec<&str> = text
        .split("[[tokens]]")
        .filter(|entry| !entry.contains(&alice_hash))
        .collect();
    let tmp = served.dir.path().join("tokens.toml.new");
    std::fs::write(&tmp, kept.join("[[tokens]]")).expect("written");
    std::fs::rename(&tmp, &served.token_file).expect("renamed");

    let status = client
        .list_sessions(bearer(list(""), &served.alice))
        .await
        .expect_err("a removed token stops working");
    assert_status(&status, Code::Unauthenticated, "unknown or revoked");
    client
        .list_sessions(bearer(list(""), &served.bob))
        .await
        .expect("the tokens kept still work");
    client
        .list_sessions(bearer(list(""), &carol))
        .await
        .expect("the token added still works");
}

#[tokio::test]
async fn client_certificates_act_as_their_user_or_admin_over_tls() {
    let served = Served::start(true).await;

    let mut alice = served.client(&served.tls(Some("user-alice"))).await;
    let created = alice
        .create_session(create(""))
        .await
        .expect("alice's certificate creates")
        .into_inner();
    assert_eq!(created.owner, "alice");
    let status = alice
        .create_session(create("bob"))
        .await
        .expect_err("alice's certificate can't create for bob");
    assert_status(&status, Code::PermissionDenied, "\"bob\"");

    // Bob's session, by his token over TLS, is out of alice's sight and reach.
    let mut anonymous = served.client(&served.tls(None)).await;
    let bobs = anonymous
        .create_session(bearer(create(""), &served.bob))
        .await
        .expect("a token over TLS works without a certificate")
        .into_inner();
    let listed = alice
        .list_sessions(list(""))
        .await
        .expect("alice lists")
        .into_inner()
        .sessions;
    assert_eq!(ids(&listed), [created.id.as_str()]);
    let status = alice
        .terminate_session(pb::TerminateSessionRequest {
            id: bobs.id.clone(),
        })
        .await
        .expect_err("alice can't end bob's");
    assert_eq!(status.code(), Code::PermissionDenied);

    // The admin's certificate sees both.
    let mut ops = served.client(&served.tls(Some("admin-ops"))).await;
    let all = ops
        .list_sessions(list(""))
        .await
        .expect("ops lists")
        .into_inner()
        .sessions;
    assert_eq!(all.len(), 2, "{all:?}");
    ops.terminate_session(pb::TerminateSessionRequest { id: bobs.id })
        .await
        .expect("ops ends bob's");

    // The CA alone proves nothing; a node's certificate is an agent's, not a client's.
    let status = anonymous
        .list_sessions(list(""))
        .await
        .expect_err("no credentials over TLS");
    assert_status(&status, Code::Unauthenticated, "no credentials");
    let before = served.bounds.denials().count_of(DenialReason::NodeAsClient);
    let mut node = served.client(&served.tls(Some("node-1"))).await;
    let status = node
        .list_sessions(list(""))
        .await
        .expect_err("a node is no client");
    assert_status(&status, Code::PermissionDenied, "can't act as a client");
    assert!(counted_past(&served.bounds, DenialReason::NodeAsClient, before).await);
}

#[test]
fn tokens_add_prints_a_token_once_and_appends_its_hash() {
    let scratch = gpuwarden_test_support::scratch("tokens-add");
    let file = scratch.path().join("tokens.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwarden-controller"))
        .args([
            "tokens", "add", "--owner", "alice", "--role", "user", "--file",
        ])
        .arg(&file)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(token.starts_with(tokens::TOKEN_PREFIX), "{token}");
    let text = std::fs::read_to_string(&file).expect("written");
    assert!(text.contains(&tokens::hash_hex(&token)), "{text}");
    assert!(
        !text.contains(&token),
        "the file holds only the hash: {text}"
    );
    let entry = TokenFile::load(&file)
        .expect("loads")
        .lookup(&token)
        .expect("the token is in the file");
    assert_eq!(
        (entry.owner.as_str(), entry.role),
        ("alice", ClientRole::User)
    );

    for bad in [
        &["--owner", "../x", "--role", "user"][..],
        &["--owner", "bob", "--role", "root"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_gpuwarden-controller"))
            .args(["tokens", "add", "--file"])
            .arg(&file)
            .args(bad)
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {out:?}");
    }
}

#[test]
fn a_token_file_that_cant_be_used_stops_the_controller_naming_it() {
    let scratch = gpuwarden_test_support::scratch("tokens-bad");
    let bad = scratch.path().join("tokens.toml");
    std::fs::write(
        &bad,
        "[[tokens]]\nsha256 = \"abc\"\nowner = \"alice\"\nrole = \"user\"\n",
    )
    .expect("written");
    for (file, words) in [
        (scratch.path().join("missing.toml"), "missing.toml"),
        (bad, "entry 1: sha256"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_gpuwarden-controller"))
            .args(["run", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(scratch.path().join("state"))
            .arg("--token-file")
            .arg(&file)
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(words), "{err}");
    }
}
