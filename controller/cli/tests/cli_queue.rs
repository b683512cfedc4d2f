//! `gpuwarden queue ls|show|set|rm` against a real controller with a token file, over gRPC on
//! loopback: an admin sets and removes a queue, a user is refused (exit 1); values show exactly
//! as set (4.5 shares, 200g); what a queue holds and borrows follows its sessions; bad input
//! exits 2 before connecting, a queue the controller refuses exits 1 with the reason.

use std::{path::Path, sync::Arc, time::Duration};

use gpuwarden_controller::{
    auth::{
        clients::ClientRole,
        tokens::{self, TokenFile},
    },
    server::{Security, Transport},
};
use gpuwarden_test_support::cli;

fn gpuwarden(url: &str, token: &Path, args: &[&str]) -> (i32, String, String) {
    cli::gpuwarden_with(url, args, &[("GPUWARDEN_TOKEN_FILE", token)])
}

fn ok(url: &str, token: &Path, args: &[&str]) -> String {
    let (code, out, err) = gpuwarden(url, token, args);
    assert_eq!(code, 0, "{args:?}: {err}");
    out
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn an_admin_sets_queues_and_everyone_sees_them_exactly() {
    let scratch = gpuwarden_test_support::scratch("cli-queue");
    let dir = scratch.path();
    let token_file = dir.join("tokens.toml");
    let alice = dir.join("alice.token");
    let ops = dir.join("ops.token");
    for (owner, role, file) in [
        ("alice", ClientRole::User, &alice),
        ("ops", ClientRole::Admin, &ops),
    ] {
        let token = tokens::add(&token_file, owner, role).expect("token added");
        std::fs::write(file, format!("{token}\n")).expect("written");
    }
    let ctl = gpuwarden_test_support::controller::TestController::builder(&dir.join("controller"))
        .security(Security {
            // Plain-text agents beside tokens only because the test says --insecure.
            transport: Transport::Insecure,
            tokens: Some(Arc::new(TokenFile::load(&token_file).expect("tokens load"))),
            grants: Arc::default(),
        })
        .start();
    let (rt, url) = (gpuwarden_test_support::controller::runtime(), ctl.url());
    rt.block_on(gpuwarden_test_support::node::register(
        &url,
        gpuwarden_test_support::node::with_two_gpus("n1"),
    ));

    let shown = ok(
        &url,
        &ops,
        &[
            "queue",
            "set",
            "team-a",
            "--guaranteed",
            "cuda.shares=4.5,cuda.mem=200g",
            "--limit",
            "cuda.shares=6.25",
            "--member",
            "alice",
            "--member",
            "bob",
        ],
    );
    assert!(
        shown.contains("guaranteed: cuda.mem=200g,cuda.shares=4.5\n"),
        "{shown}"
    );
    assert!(shown.contains("limit:      cuda.shares=6.25\n"), "{shown}");
    assert!(shown.contains("members:    alice, bob\n"), "{shown}");

    // A user may not set one (exit 1, the reason named, with its code from the details), but
    // reads them.
    let (code, _, err) = gpuwarden(&url, &alice, &["queue", "set", "mine"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("PermissionDenied")
            && err.contains("only an admin")
            && err.contains("(reason ADMIN_ONLY)"),
        "{err}"
    );
    let table = ok(&url, &alice, &["queue", "ls"]);
    let row = table
        .lines()
        .find(|l| l.starts_with("team-a"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        row.contains("cuda.mem=200g,cuda.shares=4.5") && row.ends_with(" alice"),
        "a user sees only itself among the members: {row}"
    );

    // Alice's sessions: 0.5 within the guarantee of 0.25 (now set lower), 0.25 past it.
    ok(
        &url,
        &ops,
        &[
            "queue",
            "set",
            "team-a",
            "--guaranteed",
            "cuda.shares=0.25",
            "--member",
            "alice",
        ],
    );
    for shares in ["0.2", "0.3"] {
        ok(
            &url,
            &alice,
            &["session", "create", "-r", &format!("cuda.shares={shares}")],
        );
    }
    let mut json = serde_json::Value::Null;
    gpuwarden_test_support::wait::until("both sessions placed", Duration::from_secs(10), || {
        let out = ok(&url, &ops, &["--json", "queue", "ls"]);
        json = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        json[0]["held"]["cuda.shares"] == "0.5"
    });
    let q = &json[0];
    assert_eq!(q["name"], "team-a", "{json}");
    assert_eq!(q["guaranteed"]["cuda.shares"], "0.25", "{json}");
    assert!(q["limit"].is_null(), "no --limit: no limit: {json}");
    assert_eq!(q["borrowed"]["cuda.shares"], "0.25", "{json}");
    assert_eq!(q["members"], serde_json::json!(["alice"]), "{json}");
    let shown = ok(&url, &alice, &["queue", "show", "team-a"]);
    assert!(shown.contains("held:       cuda.shares=0.5\n"), "{shown}");
    assert!(shown.contains("borrowed:   cuda.shares=0.25\n"), "{shown}");
    assert!(shown.contains("limit:      none\n"), "{shown}");

    // Bad input exits 2 naming the flag; a queue the controller refuses exits 1 with why.
    for (args, names) in [
        (
            vec!["queue", "set", "x", "--guaranteed", "cuda.shares=abc"],
            "--guaranteed",
        ),
        (
            vec!["queue", "set", "x", "--limit", "cuda.shares=0"],
            "--limit: cuda.shares=0: zero",
        ),
    ] {
        let (code, _, err) = gpuwarden(&url, &ops, &args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(names), "{args:?}: {err}");
    }
    let (code, _, err) = gpuwarden(
        &url,
        &ops,
        &[
            "queue",
            "set",
            "team-b",
            "--guaranteed",
            "cuda.shares=2",
            "--limit",
            "cuda.shares=1.5",
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("InvalidArgument")
            && err.contains("guaranteed[cuda.shares]: 2 is above the limit of 1.5"),
        "{err}"
    );

    let (code, _, err) = gpuwarden(&url, &alice, &["queue", "rm", "team-a"]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        ok(&url, &ops, &["queue", "rm", "team-a"]),
        "queue team-a removed\n"
    );
    let (code, _, err) = gpuwarden(&url, &ops, &["queue", "show", "team-a"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("NotFound"), "{err}");
}
