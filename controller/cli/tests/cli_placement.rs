//! Placement end to end through the `gpuwarden` CLI: a real controller on loopback gRPC and a
//! fake agent on its stream (two GPUs; it acks every allocation and reports a fixed
//! utilization for each session). A finished session teaches its class; interference-aware
//! placement then keeps two busy sessions apart and explains why.

use std::time::Duration;

use gpuwarden_proto::v1 as pb;
use gpuwarden_test_support::cli::{gpuwarden, json};
use tokio_stream::StreamExt;

const NODE: &str = "node-placement";
/// What the fake agent reports every session used.
const UTILIZATION: f64 = 0.9;

async fn fake_agent(url: String) {
    let (tx, mut inbound) = gpuwarden_test_support::node::connect(
        &url,
        gpuwarden_test_support::node::with_fake_gpus(NODE, 2),
    )
    .await;
    while let Some(Ok(message)) = inbound.next().await {
        let send = |msg| tx.send(pb::AgentMessage { msg: Some(msg) });
        let a = match message.msg {
            Some(pb::controller_message::Msg::Allocate(a)) => a,
            Some(pb::controller_message::Msg::Release(r)) => {
                // As the agent confirms a release (issue 40): the session ends TERMINATED.
                let _ = send(pb::agent_message::Msg::Event(pb::EnforcementEvent {
                    session_id: r.session_id,
                    action: "released".into(),
                    ..Default::default()
                }))
                .await;
                continue;
            }
            _ => continue,
        };
        let _ = send(pb::agent_message::Msg::Ack(pb::AllocationAck {
            session_id: a.session_id.clone(),
        }))
        .await;
        // The stream is handled in order: these count, the session is running by now.
        for at_ms in 0..5 {
            let _ = send(pb::agent_message::Msg::Usage(pb::SessionUsage {
                session_id: a.session_id.clone(),
                utilization: UTILIZATION,
                memory_bytes: 2 << 30,
                ioctls_per_sec: 40.0,
                at_ms,
            }))
            .await;
        }
    }
}

/// Creates a session and waits until it runs (and its usage reports are in).
fn create_running(url: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["session", "create", "-r", "cuda.shares=0.5"];
    args.extend_from_slice(extra);
    let created = json(url, &args);
    let id = created["id"].as_str().expect("an id").to_owned();
    for _ in 0..100 {
        let s = json(url, &["session", "show", &id]);
        if s["state"] == "running" {
            // The usage reports follow the ack on the same ordered stream.
            std::thread::sleep(Duration::from_millis(200));
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("session {id} never ran");
}

#[test]
fn a_learned_busy_class_is_kept_apart_and_the_choice_explained() {
    let scratch = gpuwarden_test_support::scratch("placement");
    let ctl = gpuwarden_test_support::controller::TestController::builder(
        &scratch.path().join("controller"),
    )
    .start();
    let (rt, url) = (gpuwarden_test_support::controller::runtime(), ctl.url());
    rt.spawn(fake_agent(url.clone()));
    gpuwarden_test_support::cli::wait_for_node(&url, NODE);

    // Nothing learned yet: asking for a class names it.
    let (code, _, err) = gpuwarden(&url, &["profile", "show", "busy"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("\"busy\"") && err.contains("no profile"),
        "{err}"
    );

    // One run teaches the class what the agent measured.
    let first = create_running(&url, &["--class", "busy"]);
    let id = first["id"].as_str().expect("id");
    assert_eq!(first["class"], "busy");
    let (code, _, err) = gpuwarden(&url, &["session", "rm", id]);
    assert_eq!(code, 0, "{err}");
    // Its GPU share is free once the agent confirms the release (issue 40).
    for _ in 0..100 {
        if json(&url, &["session", "show", id])["state"] == "terminated" {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(json(&url, &["session", "show", id])["state"], "terminated");
    let profiles = json(&url, &["profile", "ls"]);
    let busy = &profiles[0];
    assert_eq!(busy["class"], "busy", "{profiles}");
    assert_eq!(busy["runs"], 1);
    assert_eq!(busy["samples"], 5);
    let mean = busy["mean"].as_f64().expect("a mean");
    assert!((mean - UTILIZATION).abs() < 0.011, "{busy}");
    let (_, shown, _) = gpuwarden(&url, &["profile", "show", "busy"]);
    assert!(shown.contains("runs:        1"), "{shown}");

    // Binpack would stack two 0.5 sessions on one GPU; interference-aware keeps busy ones apart.
    let a = create_running(
        &url,
        &["--class", "busy", "--placement", "interference-aware"],
    );
    let b = create_running(
        &url,
        &["--class", "busy", "--placement", "interference-aware"],
    );
    let gpu = |s: &serde_json::Value| s["devices"][0]["index"].as_u64();
    assert_ne!(gpu(&a), gpu(&b), "{a}\n{b}");

    // The explanation names the chosen devices and each term.
    let e = &b["explanation"];
    assert_eq!(e["mode"], "interference-aware");
    let chosen = &e["candidates"][0];
    assert_eq!(chosen["chosen"], true);
    assert_eq!(chosen["node"], NODE);
    assert_eq!(chosen["devices"][0].as_u64(), gpu(&b));
    let names: Vec<&str> = chosen["terms"]
        .as_array()
        .expect("terms")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["interference", "fragmentation", "packing", "topology"]
    );
    // The device beside a is the other candidate, worse for its predicted interference.
    let other = &e["candidates"][1];
    assert_eq!(other["devices"][0].as_u64(), gpu(&a), "{e}");
    assert!(other["terms"][0]["value"].as_f64() > chosen["terms"][0]["value"].as_f64());
    let (_, human, _) = gpuwarden(
        &url,
        &[
            "session",
            "show",
            b["id"].as_str().expect("id"),
            "--explain",
        ],
    );
    assert!(
        human.contains("placement: interference-aware") && human.contains("chosen"),
        "{human}"
    );

    // A mode that doesn't exist is bad input.
    let (code, _, err) = gpuwarden(
        &url,
        &[
            "session",
            "create",
            "-r",
            "cuda.shares=0.5",
            "--placement",
            "fastest",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("fastest"), "{err}");
}
