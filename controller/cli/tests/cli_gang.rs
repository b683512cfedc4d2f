//! Gangs through the `gpuwarden` CLI (docs/teams.md, "Gangs"): a real controller on loopback
//! gRPC and a fake agent with two GPUs that acks every allocation. A member waits, saying how
//! many of its gang exist, until the last one is created; then all run, and `session show` and
//! `session ls` name the gang. Malformed gang flags are refused.

use std::time::Duration;

use gpuwarden_test_support::cli::{gpuwarden, json};

const NODE: &str = "node-gang";

async fn fake_agent(url: String) {
    let (tx, inbound) = gpuwarden_test_support::node::connect(
        &url,
        gpuwarden_test_support::node::with_fake_gpus(NODE, 2),
    )
    .await;
    gpuwarden_test_support::node::acknowledge_all(tx, inbound, |_| {}).await;
}

/// Creates a member of gang `pair` (of 2), a whole GPU; returns its id.
fn member(url: &str) -> String {
    let created = json(
        url,
        &[
            "session",
            "create",
            "-r",
            "cuda.shares=1",
            "--gang",
            "pair",
            "--gang-size",
            "2",
        ],
    );
    assert_eq!(created["gang"]["name"], "pair", "{created}");
    assert_eq!(created["gang"]["size"], 2, "{created}");
    created["id"].as_str().expect("an id").to_owned()
}

fn state(url: &str, id: &str) -> serde_json::Value {
    json(url, &["session", "show", id])
}

#[test]
fn members_wait_for_their_gang_then_run_together_and_show_it() {
    let scratch = gpuwarden_test_support::scratch("gang");
    let ctl = gpuwarden_test_support::controller::TestController::builder(
        &scratch.path().join("controller"),
    )
    .start();
    let (rt, url) = (gpuwarden_test_support::controller::runtime(), ctl.url());
    rt.spawn(fake_agent(url.clone()));
    gpuwarden_test_support::cli::wait_for_node(&url, NODE);

    // Flags that don't make a gang: a usage error, or the controller's refusal naming the field.
    let (code, _, err) = gpuwarden(
        &url,
        &["session", "create", "-r", "cuda.shares=1", "--gang", "g"],
    );
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = gpuwarden(
        &url,
        &[
            "session",
            "create",
            "-r",
            "cuda.shares=1",
            "--gang",
            "g",
            "--gang-size",
            "1",
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("gang.size"), "{err}");

    let first = member(&url);
    // The lone member stays pending and says why, pass after pass.
    for _ in 0..100 {
        if state(&url, &first)["reason"] == "gang pair 1/2 members" {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    rt.block_on(ctl.passes(3));
    let shown = state(&url, &first);
    assert_eq!(shown["state"], "pending", "{shown}");
    assert_eq!(shown["reason"], "gang pair 1/2 members", "{shown}");
    let (code, out, err) = gpuwarden(&url, &["session", "show", &first]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("gang:      pair (2 members)"), "{out}");

    let second = member(&url);
    for _ in 0..100 {
        if [&first, &second]
            .iter()
            .all(|id| state(&url, id)["state"] == "running")
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for id in [&first, &second] {
        assert_eq!(state(&url, id)["state"], "running", "{id}");
    }
    let (code, out, err) = gpuwarden(&url, &["session", "ls"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.matches("gang pair (2 members)").count(), 2, "{out}");
    drop(rt);
}
