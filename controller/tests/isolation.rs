//! Tenant isolation, round two (issue 33), the controller's side: each attack as a tenant or a
//! local user would try it, over real gRPC on loopback or through the `gpuwarden-controller`
//! binary, one test per attack. (The agent's side is `tests/tests/agent_isolation.rs`.)

use std::{path::Path, sync::Arc};

use gpuwarden_controller::{
    auth::{
        clients::ClientRole,
        denials::DenialReason,
        grants::GrantFile,
        tokens::{self, TokenFile},
    },
    limits::{Bounds, Limits},
    server::{Security, Transport},
};
use gpuwarden_proto::v1::{
    self as pb, agent_service_client::AgentServiceClient,
    scheduler_service_client::SchedulerServiceClient,
};
use gpuwarden_test_support::controller::serve_in_process;
use tonic::{Code, Request, transport::Channel};

/// A controller served in this process, and what counts its refusals.
struct Served {
    url: String,
    /// Its bounds: whom it refused.
    bounds: Arc<Bounds>,
    /// Its token file and grant file: their unusable versions.
    tokens: Arc<TokenFile>,
    grants: Arc<GrantFile>,
}

/// A controller on plain-text loopback with `tokens` (and `grants`), served over `transport`.
async fn serve(dir: &Path, transport: Transport, tokens: &Path, grants: Option<&Path>) -> Served {
    let tokens = Arc::new(TokenFile::load(tokens).expect("tokens load"));
    let grants = Arc::new(grants.map_or_else(GrantFile::none, |g| {
        GrantFile::load(g).expect("grants load")
    }));
    let security = Security {
        transport,
        tokens: Some(Arc::clone(&tokens)),
        grants: Arc::clone(&grants),
    };
    let bounds = Bounds::new(Limits::default());
    let addr = serve_in_process(&dir.join("state"), security, Arc::clone(&bounds)).await;
    Served {
        url: format!("http://{addr}"),
        bounds,
        tokens,
        grants,
    }
}

async fn channel(url: &str) -> Channel {
    Channel::from_shared(url.to_owned())
        .expect("a URL")
        .connect()
        .await
        .expect("connects")
}

fn bearer<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ASCII"),
    );
    request
}

/// Lists sessions with `token`: the code it gets (`Ok` when served).
async fn list_with(url: &str, token: &str) -> Code {
    let mut c = SchedulerServiceClient::new(channel(url).await);
    c.list_sessions(bearer(pb::ListSessionsRequest::default(), token))
        .await
        .map_or_else(|s| s.code(), |_| Code::Ok)
}

/// Issue 33, attack 2: with `--token-file` on plain-text loopback, clients needed tokens but a
/// process with no credential registered as `node-1` and would have received every tenant's
/// allocations for it. Now it is `UNAUTHENTICATED`, counted as `plain_text_agent`; the
/// operator's explicit `--insecure` still takes it (the local run with tokens), and an open
/// controller (no tokens, no TLS: nobody authenticates) too.
#[tokio::test]
async fn a_process_without_credentials_is_no_node_while_clients_need_tokens() {
    let dir = gpuwarden_test_support::scratch("iso-agents");
    let file = dir.path().join("tokens.toml");
    tokens::add(&file, "alice", ClientRole::User).expect("a token");
    let served = serve(dir.path(), Transport::PlainText, &file, None).await;
    let url = served.url;
    let denials = served.bounds.denials();
    let mut agent = AgentServiceClient::new(channel(&url).await);
    let err = agent
        .register(gpuwarden_test_support::node::with_two_gpus("node-1"))
        .await
        .expect_err("an unauthenticated node registered");
    assert_eq!(err.code(), Code::Unauthenticated, "{}", err.message());
    assert!(err.message().contains("--insecure"), "{}", err.message());
    assert_eq!(denials.count_of(DenialReason::PlainTextAgent), 1);
    // The stream is refused the same way, before its first message is read.
    let (_tx, rx) = tokio::sync::mpsc::channel::<pb::AgentMessage>(1);
    let err = agent
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect_err("an unauthenticated stream opened");
    assert_eq!(err.code(), Code::Unauthenticated, "{}", err.message());
    assert_eq!(denials.count_of(DenialReason::PlainTextAgent), 2);

    // With --insecure the operator takes plain-text agents beside tokens.
    let insecure = gpuwarden_test_support::scratch("iso-agents-insecure");
    let served = serve(insecure.path(), Transport::Insecure, &file, None).await;
    AgentServiceClient::new(channel(&served.url).await)
        .register(gpuwarden_test_support::node::with_two_gpus("node-1"))
        .await
        .expect("--insecure takes a plain-text node");
    assert_eq!(
        served
            .bounds
            .denials()
            .count_of(DenialReason::PlainTextAgent),
        0
    );
}

/// Issue 33, attack 3: deleting the token file left every token working, and an edit that
/// removed a token but broke the TOML elsewhere kept the old set. Now a deleted file revokes
/// every token, an unusable edit keeps only the tokens whose entry it still holds, and each is
/// counted (`gpuwarden.controller.config.unusable`). The grant file fails closed the same way:
/// a user whose grant is gone (file deleted, or an unusable edit) binds only its own cgroups.
#[tokio::test]
async fn token_and_grant_files_fail_closed() {
    let dir = gpuwarden_test_support::scratch("iso-files");
    let file = dir.path().join("tokens.toml");
    let alice = tokens::add(&file, "alice", ClientRole::User).expect("alice's token");
    let ops = tokens::add(&file, "ops", ClientRole::Admin).expect("ops's token");
    let grants = dir.path().join("grants.toml");
    let granted = "[[grants]]\nowner = \"alice\"\ncgroup_prefixes = [\"/tenants/alice.slice\"]\n";
    std::fs::write(&grants, granted).expect("grants written");
    let served = serve(dir.path(), Transport::PlainText, &file, Some(&grants)).await;
    let url = served.url.clone();
    assert_eq!(list_with(&url, &alice).await, Code::Ok);
    assert_eq!(list_with(&url, &ops).await, Code::Ok);

    // The grant lets alice name her slice.
    let in_slice = || pb::CreateSessionRequest {
        requested: Some(pb::ResourceSlot {
            values: [("cpu".to_owned(), "1".to_owned())].into(),
        }),
        target: Some(pb::Target {
            kind: Some(pb::target::Kind::CgroupPath(
                "/tenants/alice.slice/job".into(),
            )),
        }),
        ..Default::default()
    };
    let create = |token: String| {
        let url = url.clone();
        async move {
            let mut c = SchedulerServiceClient::new(channel(&url).await);
            c.create_session(bearer(in_slice(), &token))
                .await
                .map_or_else(|s| s.code(), |_| Code::Ok)
        }
    };
    assert_ne!(create(alice.clone()).await, Code::PermissionDenied);

    // An edit that removes alice's entry and leaves a typo elsewhere: alice is revoked, ops
    // (still written there) keeps working, and the failure is counted.
    assert_eq!(served.tokens.unusable(), 0);
    let text = std::fs::read_to_string(&file).expect("read");
    let ops_only: String = text
        .split("\n[[tokens]]")
        .filter(|entry| !entry.contains(&tokens::hash_hex(&alice)))
        .collect::<Vec<_>>()
        .join("\n[[tokens]]");
    std::fs::write(&file, format!("{ops_only}\n[[tokens]\n")).expect("a broken edit");
    assert_eq!(list_with(&url, &alice).await, Code::Unauthenticated);
    assert_eq!(list_with(&url, &ops).await, Code::Ok);
    assert_eq!(served.tokens.unusable(), 1);

    // Deleted: no token works (counted too).
    std::fs::remove_file(&file).expect("deleted");
    assert_eq!(list_with(&url, &ops).await, Code::Unauthenticated);
    assert_eq!(served.tokens.unusable(), 2);
    // Written again: the tokens in it work again.
    std::fs::write(&file, text).expect("restored");
    assert_eq!(list_with(&url, &alice).await, Code::Ok);

    // The grant file deleted: alice's slice is no longer hers.
    assert_eq!(served.grants.unusable(), 0);
    std::fs::remove_file(&grants).expect("deleted");
    assert_eq!(create(alice.clone()).await, Code::PermissionDenied);
    assert_eq!(served.grants.unusable(), 1);
    // Back, then broken by a typo: nothing is granted while it can't be read.
    std::fs::write(&grants, granted).expect("restored");
    assert_ne!(create(alice.clone()).await, Code::PermissionDenied);
    std::fs::write(&grants, format!("{granted}[[grants]\n")).expect("a broken edit");
    assert_eq!(create(alice.clone()).await, Code::PermissionDenied);
    assert_eq!(served.grants.unusable(), 2);
    // Nothing of this is the token file's.
    assert_eq!(served.tokens.unusable(), 2);
}

/// Issue 33, attack 6: `certs mint` wrote `.<name>.tmp` without `O_EXCL`/`O_NOFOLLOW`, so a
/// local user who made that name first (here a link to a file of its own) got the CA's private
/// key. Now the temporary names are random and made new, never through a link; and a folder
/// others may write into is refused before anything is written.
#[test]
fn certs_mint_cannot_be_raced_in_a_shared_folder() {
    use std::{
        os::unix::fs::{PermissionsExt as _, symlink},
        process::Command,
    };

    let scratch = gpuwarden_test_support::scratch("iso-mint");
    let mint = |out: &Path| {
        Command::new(env!("CARGO_BIN_EXE_gpuwarden-controller"))
            .args(["certs", "mint", "--nodes", "node-1", "--out"])
            .arg(out)
            .output()
            .expect("runs")
    };
    // The attacker's file, and links at the names main's `certs mint` wrote through.
    let stolen = scratch.path().join("stolen");
    std::fs::write(&stolen, "").expect("written");
    let out = scratch.path().join("certs");
    std::fs::create_dir(&out).expect("made");
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    for name in ["ca.key", "server.key", "node-1.key"] {
        symlink(&stolen, out.join(format!(".{name}.tmp"))).expect("planted");
    }
    let done = mint(&out);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&stolen).expect("read"),
        "",
        "a key went through the planted link"
    );
    let key = std::fs::symlink_metadata(out.join("ca.key")).expect("the CA key");
    assert!(key.file_type().is_file());
    assert_eq!(key.permissions().mode() & 0o777, 0o600);

    // A folder its group or everyone may write into is refused, and nothing is written there.
    for mode in [0o770, 0o777, 0o1777] {
        let shared = scratch.path().join(format!("shared-{mode:o}"));
        std::fs::create_dir(&shared).expect("made");
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(mode)).expect("chmod");
        let refused = mint(&shared);
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "minted into mode {mode:o}");
        assert!(
            err.contains("writable by its group or by everyone"),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(&shared).expect("listed").count(), 0);
    }
}

/// Issue 33, attack 7: session ids were `s-<ms hex><counter>`, so another user of a node's
/// agent socket could tell the id of the next `gpuwarden run` session and claim its cgroup
/// first. Now each id carries 64 random bits: two sessions created one after the other differ
/// in at least 16 hex digits beyond what they share (on main, in at most the 15 the time and
/// the counter take).
#[tokio::test]
async fn session_ids_cannot_be_guessed_from_the_last_one() {
    let dir = gpuwarden_test_support::scratch("iso-ids");
    let addr = serve_in_process(
        &dir.path().join("state"),
        Transport::PlainText,
        Bounds::new(Limits::default()),
    )
    .await;
    let url = format!("http://{addr}");
    // A node brings the `cpu` slot the sessions ask for.
    gpuwarden_test_support::node::register(&url, gpuwarden_test_support::node::with_cpus("n1", 64))
        .await;
    let mut c = SchedulerServiceClient::new(channel(&url).await);
    let mut ids = Vec::new();
    for _ in 0..20 {
        let s = c
            .create_session(gpuwarden_test_support::controller::request("guess"))
            .await
            .expect("created")
            .into_inner();
        ids.push(s.id);
    }
    for pair in ids.windows(2) {
        let shared = pair[0]
            .bytes()
            .zip(pair[1].bytes())
            .take_while(|(a, b)| a == b)
            .count();
        let unknown = pair[1].len() - shared;
        assert!(
            unknown >= 16,
            "{} follows {} with only {unknown} new digits",
            pair[1],
            pair[0]
        );
    }
}

/// Issue 33, attack 8: removing a grant did not touch the sessions created under it; they kept
/// their quotas (and bound again after a restart). Now a new version of the grant file is
/// checked against every session users created: one no longer granted fails, saying why, and
/// its node is told to release it.
#[tokio::test]
async fn a_withdrawn_grant_ends_the_sessions_it_allowed() {
    use tokio_stream::StreamExt as _;

    let dir = gpuwarden_test_support::scratch("iso-revoke");
    let file = dir.path().join("tokens.toml");
    let alice = tokens::add(&file, "alice", ClientRole::User).expect("alice's token");
    let grants = dir.path().join("grants.toml");
    std::fs::write(
        &grants,
        "[[grants]]\nowner = \"alice\"\ncgroup_prefixes = [\"/tenants/alice.slice\"]\n",
    )
    .expect("grants written");
    // A plain-text node beside tokens: the test's --insecure.
    let url = serve(dir.path(), Transport::Insecure, &file, Some(&grants))
        .await
        .url;
    let (tx, mut inbound) = gpuwarden_test_support::node::connect(
        &url,
        gpuwarden_test_support::node::with_cpus("node-1", 8),
    )
    .await;
    let (released_tx, mut released) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = inbound.next().await {
            match message.msg {
                Some(pb::controller_message::Msg::Allocate(a)) => {
                    let ack = pb::agent_message::Msg::Ack(pb::AllocationAck {
                        session_id: a.session_id,
                    });
                    let _ = tx.send(pb::AgentMessage { msg: Some(ack) }).await;
                }
                Some(pb::controller_message::Msg::Release(r)) => {
                    let _ = released_tx.send(r.session_id);
                }
                _ => {}
            }
        }
    });
    let mut c = SchedulerServiceClient::new(channel(&url).await);
    let request = pb::CreateSessionRequest {
        requested: Some(pb::ResourceSlot {
            values: [("cpu".to_owned(), "1".to_owned())].into(),
        }),
        target: Some(pb::Target {
            kind: Some(pb::target::Kind::CgroupPath(
                "/tenants/alice.slice/job".into(),
            )),
        }),
        ..Default::default()
    };
    let session = c
        .create_session(bearer(request, &alice))
        .await
        .expect("granted")
        .into_inner();
    let state = |c: &mut SchedulerServiceClient<Channel>| {
        let mut c = c.clone();
        let (id, token) = (session.id.clone(), alice.clone());
        async move {
            c.get_session(bearer(pb::GetSessionRequest { id }, &token))
                .await
                .expect("her session")
                .into_inner()
        }
    };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while state(&mut c).await.state != pb::SessionState::Running as i32 {
        assert!(tokio::time::Instant::now() < deadline, "never ran");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    // The admin takes alice's slice away.
    std::fs::write(&grants, "").expect("grant withdrawn");
    let ended = loop {
        let s = state(&mut c).await;
        if s.state == pb::SessionState::Failed as i32 {
            break s;
        }
        assert!(
            tokio::time::Instant::now() < deadline + std::time::Duration::from_secs(10),
            "still {:?} after its grant was withdrawn",
            s.state
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(
        ended.reason.contains("grant was withdrawn") && ended.reason.contains("alice.slice"),
        "{}",
        ended.reason
    );
    let released = tokio::time::timeout(std::time::Duration::from_secs(10), released.recv())
        .await
        .expect("a release within 10 s");
    assert_eq!(released.as_deref(), Some(session.id.as_str()));
}

/// Issue 33, attack 5 (the controller's side): its sled store, which holds every owner,
/// target and pod UID, was made under the umask (0755 folders, 0644 files). Now the store's
/// folder is 0700 and its files 0600 once the controller runs, what an earlier controller left
/// there included.
#[test]
fn the_controllers_store_is_private() {
    use std::os::unix::fs::PermissionsExt as _;

    let scratch = gpuwarden_test_support::scratch("iso-store");
    let store = scratch.path().join("store");
    std::fs::create_dir_all(&store).expect("made");
    std::fs::write(store.join("left-behind"), "owners, targets").expect("written");
    std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::set_permissions(
        store.join("left-behind"),
        std::fs::Permissions::from_mode(0o644),
    )
    .expect("chmod");
    let ctl = gpuwarden_test_support::controller::ControllerProcess::start(
        &format!("sled:{}", store.display()),
        &[],
    );
    let mode = |p: &Path| std::fs::metadata(p).expect("there").permissions().mode() & 0o777;
    assert_eq!(mode(&store), 0o700);
    assert_eq!(mode(&store.join("left-behind")), 0o600);
    assert_eq!(mode(&store.join("db")), 0o600, "sled's own file");
    drop(ctl);
}

/// Issue 33, attack 7 (second half): a `gpuwarden run` session's cgroup went to whichever uid
/// asked the agent first. Now the uid `gpuwarden run` says it runs as travels with the session
/// to its node's allocation, where the agent gives the cgroup to that uid alone
/// (`agent/src/export/server.rs`); here, the controller's part: the allocation carries it.
#[tokio::test]
async fn a_run_sessions_uid_reaches_its_allocation() {
    use tokio_stream::StreamExt as _;

    let dir = gpuwarden_test_support::scratch("iso-run-uid");
    let addr = serve_in_process(
        &dir.path().join("state"),
        Transport::PlainText,
        Bounds::new(Limits::default()),
    )
    .await;
    let url = format!("http://{addr}");
    let (_tx, mut inbound) = gpuwarden_test_support::node::connect(
        &url,
        gpuwarden_test_support::node::with_cpus("node-1", 8),
    )
    .await;
    let mut c = SchedulerServiceClient::new(channel(&url).await);
    let mut request = gpuwarden_test_support::controller::request("run");
    request.node_id = "node-1".into();
    request.target = Some(pb::Target {
        kind: Some(pb::target::Kind::Managed(true)),
    });
    request.run_caller = Some(pb::RunCaller { uid: 4242 });
    let session = c
        .create_session(request)
        .await
        .expect("created")
        .into_inner();
    let allocate = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while let Some(Ok(message)) = inbound.next().await {
            if let Some(pb::controller_message::Msg::Allocate(a)) = message.msg {
                return a;
            }
        }
        panic!("the stream ended without an allocation");
    })
    .await
    .expect("an allocation within 10 s");
    assert_eq!(allocate.session_id, session.id);
    assert_eq!(allocate.run_caller.map(|c| c.uid), Some(4242));
}
