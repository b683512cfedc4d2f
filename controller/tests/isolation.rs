//! Tenant isolation, round two (issue 33), the controller's side: each attack as a tenant or a
//! local user would try it, over real gRPC on loopback or through the `gpuwarden-controller`
//! binary, one test per attack. (The agent's side is `tests/tests/agent_isolation.rs`.)

mod common;

use std::{path::Path, sync::Arc};

use gpuwarden_controller::{
    auth::{
        clients::ClientRole,
        denials::{self, DenialReason},
        grants::GrantFile,
        tokens::{self, TokenFile},
    },
    limits::{Bounds, Limits},
    server::{Security, Transport},
};
use gpuwarden_proto::v1::{self as pb, agent_service_client::AgentServiceClient};
use tonic::{Code, transport::Channel};

/// A controller on plain-text loopback with `tokens` (and `grants`), served over `transport`.
async fn serve(dir: &Path, transport: Transport, tokens: &Path, grants: Option<&Path>) -> String {
    let security = Security {
        transport,
        tokens: Some(Arc::new(TokenFile::load(tokens).expect("tokens load"))),
        grants: Arc::new(grants.map_or_else(GrantFile::none, |g| {
            GrantFile::load(g).expect("grants load")
        })),
    };
    let addr =
        common::serve_in_process(&dir.join("state"), security, Bounds::new(Limits::default()))
            .await;
    format!("http://{addr}")
}

async fn channel(url: &str) -> Channel {
    Channel::from_shared(url.to_owned())
        .expect("a URL")
        .connect()
        .await
        .expect("connects")
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
    let url = serve(dir.path(), Transport::PlainText, &file, None).await;
    let before = denials::count_of(DenialReason::PlainTextAgent);
    let mut agent = AgentServiceClient::new(channel(&url).await);
    let err = agent
        .register(gpuwarden_test_support::node::with_two_gpus("node-1"))
        .await
        .expect_err("an unauthenticated node registered");
    assert_eq!(err.code(), Code::Unauthenticated, "{}", err.message());
    assert!(err.message().contains("--insecure"), "{}", err.message());
    assert!(denials::count_of(DenialReason::PlainTextAgent) > before);
    // The stream is refused the same way, before its first message is read.
    let (_tx, rx) = tokio::sync::mpsc::channel::<pb::AgentMessage>(1);
    let err = agent
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect_err("an unauthenticated stream opened");
    assert_eq!(err.code(), Code::Unauthenticated, "{}", err.message());

    // With --insecure the operator takes plain-text agents beside tokens.
    let insecure = gpuwarden_test_support::scratch("iso-agents-insecure");
    let url = serve(insecure.path(), Transport::Insecure, &file, None).await;
    AgentServiceClient::new(channel(&url).await)
        .register(gpuwarden_test_support::node::with_two_gpus("node-1"))
        .await
        .expect("--insecure takes a plain-text node");
}
