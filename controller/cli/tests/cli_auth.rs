//! `gpuwarden --token-file` (or `GPUWARDEN_TOKEN_FILE`) against a controller with a token
//! file, over real gRPC on loopback: a user's token creates, lists and ends its own sessions
//! and is refused another owner's; an admin's ends any; no token is `Unauthenticated` (exit 1);
//! an unreadable token file is bad input (exit 2).

use std::{path::Path, sync::Arc};

use gpuwarden_controller::{
    auth::{
        clients::ClientRole,
        tokens::{self, TokenFile},
    },
    server::{Security, Transport},
};
use gpuwarden_proto::v1 as pb;
use gpuwarden_test_support::{
    cli,
    controller::{self, TestController},
};

/// A controller taking the tokens of `token_file`, with one node holding two GPUs; returns it,
/// the runtime that holds the node's stream (dropped first, it stops the node) and the URL.
fn start(scratch: &Path, token_file: &Path) -> (TestController, tokio::runtime::Runtime, String) {
    let ctl = TestController::builder(&scratch.join("controller"))
        .security(Security {
            // Plain-text agents beside tokens only because the test says --insecure.
            transport: Transport::Insecure,
            tokens: Some(Arc::new(TokenFile::load(token_file).expect("tokens load"))),
            grants: Arc::default(),
        })
        .start();
    let (rt, url) = (controller::runtime(), ctl.url());
    let (tx, inbound) = rt.block_on(gpuwarden_test_support::node::connect(
        &url,
        pb::NodeInfo {
            node_id: "node-auth".into(),
            hostname: "node-auth".into(),
            slot_types: vec![pb::SlotType {
                name: "cuda.shares".into(),
                kind: i32::from(pb::SlotKind::Count),
            }],
            devices: (0..2)
                .map(|i| pb::Device {
                    uuid: format!("GPU-auth-{i}"),
                    memory_bytes: 16 << 30,
                    index: i,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        },
    ));
    // Hold the stream open for the controller's lifetime.
    rt.spawn(async move {
        let _tx = tx;
        let mut inbound = inbound;
        while let Some(Ok(_)) = tokio_stream::StreamExt::next(&mut inbound).await {}
    });
    (ctl, rt, url)
}

fn gpuwarden(url: &str, args: &[&str], token_env: Option<&Path>) -> (i32, String, String) {
    let env = token_env.map(|file| ("GPUWARDEN_TOKEN_FILE", file));
    cli::gpuwarden_with(url, args, env.as_slice())
}

fn json(url: &str, args: &[&str], token_env: Option<&Path>) -> serde_json::Value {
    let (code, out, err) = gpuwarden(url, args, token_env);
    assert_eq!(code, 0, "{args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}: {out}"))
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn a_token_file_makes_the_cli_act_as_its_owner() {
    let scratch = gpuwarden_test_support::scratch("cli-auth");
    let dir = scratch.path();
    let token_file = dir.join("tokens.toml");
    // What a user is handed: the token alone, in a file of its own, with a final newline.
    let alice = dir.join("alice.token");
    let ops = dir.join("ops.token");
    for (owner, role, file) in [
        ("alice", ClientRole::User, &alice),
        ("ops", ClientRole::Admin, &ops),
    ] {
        let token = tokens::add(&token_file, owner, role).expect("token added");
        std::fs::write(file, format!("{token}\n")).expect("written");
    }
    let (_ctl, _rt, url) = start(dir, &token_file);
    let alice_flag = alice.to_string_lossy().into_owned();

    let hers = json(
        &url,
        &[
            "--token-file",
            &alice_flag,
            "--json",
            "session",
            "create",
            "-r",
            "cuda.shares=0.5",
        ],
        None,
    );
    assert_eq!(hers["owner"], "alice", "{hers}");
    // The admin, by the environment, creates for bob.
    let bobs = json(
        &url,
        &[
            "--json",
            "session",
            "create",
            "-r",
            "cuda.shares=0.5",
            "--owner",
            "bob",
        ],
        Some(&ops),
    );
    assert_eq!(bobs["owner"], "bob", "{bobs}");
    let bobs_id = bobs["id"].as_str().expect("an id");

    let listed = json(&url, &["--json", "session", "ls"], Some(&alice));
    let owners: Vec<&str> = listed
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|s| s["owner"].as_str())
        .collect();
    assert_eq!(owners, ["alice"], "{listed}");

    let (code, _, err) = gpuwarden(
        &url,
        &["--token-file", &alice_flag, "session", "rm", bobs_id],
        None,
    );
    assert_eq!(code, 1, "{err}");
    // Refused without saying whose it is (an id that does not exist gets the same answer).
    assert!(
        err.contains("PermissionDenied")
            && err.contains("only its own sessions")
            && !err.contains("\"bob\""),
        "{err}"
    );
    let (code, _, err) = gpuwarden(
        &url,
        &[
            "--token-file",
            &alice_flag,
            "session",
            "create",
            "-r",
            "cuda.shares=0.1",
            "--owner",
            "bob",
        ],
        None,
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("PermissionDenied"), "{err}");

    let (code, _, err) = gpuwarden(&url, &["session", "rm", bobs_id], Some(&ops));
    assert_eq!(code, 0, "the admin ends bob's: {err}");
    let hers_id = hers["id"].as_str().expect("an id");
    let (code, _, err) = gpuwarden(
        &url,
        &["--token-file", &alice_flag, "session", "rm", hers_id],
        None,
    );
    assert_eq!(code, 0, "alice ends hers: {err}");

    // No token: unauthenticated, exit 1 with the reason.
    let (code, _, err) = gpuwarden(&url, &["session", "ls"], None);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("Unauthenticated") && err.contains("no credentials"),
        "{err}"
    );
    // A wrong token: the same code, another reason.
    let wrong = dir.join("wrong.token");
    std::fs::write(&wrong, "gwt_0000\n").expect("written");
    let (code, _, err) = gpuwarden(&url, &["session", "ls"], Some(&wrong));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("unknown or revoked"), "{err}");
    // A token file that can't be read, or holds two words: bad input, before any call.
    let missing = dir.join("missing.token");
    let (code, _, err) = gpuwarden(&url, &["session", "ls"], Some(&missing));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("missing.token"), "{err}");
    std::fs::write(&wrong, "gwt_a gwt_b\n").expect("written");
    let (code, _, err) = gpuwarden(&url, &["session", "ls"], Some(&wrong));
    assert_eq!(code, 2, "{err}");
}
