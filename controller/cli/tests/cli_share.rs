//! Achieved against entitled in `gpuwarden session show`, end to end: a real controller on
//! loopback gRPC and an agent on its stream with two mock GPUs, which acknowledges the
//! allocation and then reports the usage the test hands it. The CLI shows the session's
//! entitled compute share and memory, says that no usage was reported until some is, and then
//! shows the mean of the newest reports and the last one: the figures reported, in text and
//! in `--json`. A `share_deviation` event the agent sends is among the session's events.

use std::sync::mpsc;

use gpuwarden_proto::v1 as pb;
use gpuwarden_test_support::cli;

const NODE: &str = "node-share";
/// Reports the controller's mean covers (`profile::RECENT`).
const WINDOW: usize = 12;

/// The agent: registers two mock GPUs, acknowledges each allocation and passes its session id
/// on; returns its stream's sender, which the test reports usage on.
async fn agent(
    url: String,
    allocated: mpsc::Sender<String>,
) -> tokio::sync::mpsc::Sender<pb::AgentMessage> {
    let (tx, inbound) = gpuwarden_test_support::node::connect(
        &url,
        gpuwarden_test_support::node::with_fake_gpus(NODE, 2),
    )
    .await;
    tokio::spawn(gpuwarden_test_support::node::acknowledge_all(
        tx.clone(),
        inbound,
        move |a| {
            let _ = allocated.send(a.session_id.clone());
        },
    ));
    tx
}

/// `session show id --json` once `done` holds for it.
fn show_when(
    url: &str,
    id: &str,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut shown = serde_json::Value::Null;
    gpuwarden_test_support::wait::until(what, gpuwarden_test_support::wait::PATIENCE, || {
        shown = cli::json(url, &["session", "show", id]);
        done(&shown)
    });
    shown
}

/// Sends `msg` up the agent's stream.
fn send(
    rt: &tokio::runtime::Runtime,
    stream: &tokio::sync::mpsc::Sender<pb::AgentMessage>,
    msg: pb::agent_message::Msg,
) {
    rt.block_on(stream.send(pb::AgentMessage { msg: Some(msg) }))
        .expect("the stream is open");
}

fn close(actual: &serde_json::Value, expected: f64) -> bool {
    actual.as_f64().is_some_and(|a| (a - expected).abs() < 1e-9)
}

#[test]
fn session_show_gives_the_entitled_share_and_the_achieved_one_its_agent_reported() {
    let scratch = gpuwarden_test_support::scratch("cli-share");
    let ctl = gpuwarden_test_support::controller::TestController::builder(
        &scratch.path().join("controller"),
    )
    .start();
    let (rt, url) = (gpuwarden_test_support::controller::runtime(), ctl.url());
    let (allocated_tx, allocated) = mpsc::channel();
    let stream = rt.block_on(agent(url.clone(), allocated_tx));

    let created = cli::json(
        &url,
        &[
            "session",
            "create",
            "-r",
            "cuda.shares=0.5",
            "-r",
            "cuda.mem=1g",
        ],
    );
    let id = created["id"].as_str().expect("an id").to_owned();
    let acked = allocated
        .recv_timeout(gpuwarden_test_support::wait::PATIENCE)
        .expect("the session is allocated");
    assert_eq!(acked, id);
    let running = show_when(&url, &id, "the session runs", |s| s["state"] == "running");

    // Entitled from its allocation; nothing achieved before the agent reports.
    let share = &running["share"];
    assert!(close(&share["entitled_compute"], 0.5), "{share}");
    assert_eq!(share["entitled_memory_bytes"], 1_u64 << 30, "{share}");
    assert_eq!(share["samples"], 0, "{share}");
    assert!(share["achieved"].is_null(), "{share}");
    let text = cli::ok(&url, &["session", "show", &id]);
    assert!(
        text.contains("entitled:  compute 0.500 of each GPU, memory 1073741824 bytes"),
        "{text}"
    );
    assert!(text.contains("achieved:  no usage reported yet"), "{text}");

    // Fifteen reports: the window holds the newest twelve.
    let reports: Vec<(f64, u64)> = (0..15_u32)
        .map(|i| (0.11 + 0.029 * f64::from(i), u64::from(i % 5 + 1) << 20))
        .collect();
    for (at_ms, &(utilization, memory_bytes)) in reports.iter().enumerate() {
        let usage = pb::SessionUsage {
            session_id: id.clone(),
            utilization,
            memory_bytes,
            ioctls_per_sec: 10.0,
            at_ms: i64::try_from(at_ms).expect("small"),
        };
        send(&rt, &stream, pb::agent_message::Msg::Usage(usage));
    }
    let shown = show_when(&url, &id, "every report is in", |s| {
        s["share"]["samples"] == reports.len()
    });
    let newest = &reports[reports.len() - WINDOW..];
    let mean = newest.iter().map(|r| r.0).sum::<f64>() / WINDOW as f64;
    let (last, last_memory) = reports[reports.len() - 1];
    let peak = reports.iter().map(|r| r.1).max().expect("reports");
    let achieved = &shown["share"]["achieved"];
    assert!(close(&achieved["mean"], mean), "{achieved} vs {mean}");
    assert_eq!(achieved["window_samples"], WINDOW, "{achieved}");
    assert!(close(&achieved["last"], last), "{achieved} vs {last}");
    assert_eq!(achieved["last_memory_bytes"], last_memory, "{achieved}");
    assert_eq!(achieved["peak_memory_bytes"], peak, "{achieved}");
    assert!(close(&shown["share"]["entitled_compute"], 0.5), "{shown}");

    let text = cli::ok(&url, &["session", "show", &id]);
    let expected = format!(
        "achieved:  compute {mean:.3} mean of the last {WINDOW} reports, {last:.3} at the last; \
         memory {last_memory} bytes at the last (peak {peak}); {} reports in all",
        reports.len()
    );
    assert!(text.contains(&expected), "{text}\nexpected: {expected}");

    // The agent's share watch flags a lasting deviation as a `share_deviation` event: the
    // session shows it among its events.
    let reason =
        format!("below_entitled: achieved {mean:.3} of entitled 0.500 compute share for 300s");
    let event = pb::EnforcementEvent {
        session_id: id.clone(),
        action: "share_deviation".into(),
        reason: reason.clone(),
        container: "/kubepods/pod-a".into(),
        at_ms: 1,
        ..Default::default()
    };
    send(&rt, &stream, pb::agent_message::Msg::Event(event));
    let shown = show_when(&url, &id, "the share_deviation event", |s| {
        s["events"]
            .as_array()
            .is_some_and(|e| e.iter().any(|e| e["action"] == "share_deviation"))
    });
    let event = shown["events"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["action"] == "share_deviation"))
        .expect("the event");
    assert_eq!(event["reason"], reason.as_str(), "{event}");
    let text = cli::ok(&url, &["session", "show", &id]);
    assert!(
        text.contains("share_deviation") && text.contains(&reason),
        "{text}"
    );
    drop(stream);
    drop(rt);
}
