//! The CLI's tables read at a glance and feed the next command: a real controller on loopback
//! gRPC, a fake agent with two GPUs under a long host name that acks every allocation, and
//! `session ls` / `node ls` read as a user reads them.

use gpuwarden_test_support::cli::{gpuwarden, json};

/// Longer than the columns the tables used to cut node names to (14 and 16).
const NODE: &str = "gpu-worker-eu-west-17";

async fn fake_agent(url: String) {
    let (tx, inbound) = gpuwarden_test_support::node::connect(
        &url,
        gpuwarden_test_support::node::with_fake_gpus(NODE, 2),
    )
    .await;
    gpuwarden_test_support::node::acknowledge_all(tx, inbound, |_| {}).await;
}

/// The rows of a table printed by `args`, split on whitespace, the header first; every line
/// within 100 columns.
fn table(url: &str, args: &[&str]) -> Vec<Vec<String>> {
    let (code, out, err) = gpuwarden(url, args);
    assert_eq!(code, 0, "{args:?}: {err}");
    for line in out.lines() {
        assert!(line.chars().count() <= 100, "over 100 columns:\n{out}");
    }
    out.lines()
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect()
}

/// Each `session ls` row starts with an id `session show` takes back; a session created
/// without a name shows `-` as its name (not its id again, cut); nodes are whole.
#[test]
fn session_and_node_tables_give_whole_ids_the_next_command_takes() {
    let scratch = gpuwarden_test_support::scratch("tables");
    let ctl = gpuwarden_test_support::controller::TestController::builder(
        &scratch.path().join("controller"),
    )
    .start();
    let (rt, url) = (gpuwarden_test_support::controller::runtime(), ctl.url());
    rt.spawn(fake_agent(url.clone()));
    gpuwarden_test_support::cli::wait_for_node(&url, NODE);
    let create = |extra: &[&str]| {
        let mut args = vec!["session", "create", "-r", "cuda.shares=0.5"];
        args.extend_from_slice(extra);
        json(&url, &args)["id"].as_str().expect("an id").to_owned()
    };
    let unnamed = create(&["-r", "cuda.mem=4g"]);
    let named = create(&["--name", "train"]);
    gpuwarden_test_support::wait::until(
        "both sessions to run",
        gpuwarden_test_support::wait::PATIENCE,
        || {
            [&unnamed, &named]
                .iter()
                .all(|id| json(&url, &["session", "show", id])["state"] == "running")
        },
    );

    let rows = table(&url, &["session", "ls"]);
    assert_eq!(rows[0][..4], ["ID", "NAME", "STATE", "NODE"], "{rows:?}");
    assert_eq!(rows.len(), 3, "{rows:?}");
    for row in &rows[1..] {
        let (code, _, err) = gpuwarden(&url, &["session", "show", &row[0]]);
        assert_eq!(code, 0, "`session show {}`: {err}", row[0]);
        let name = if row[0] == unnamed { "-" } else { "train" };
        assert_eq!(row[1], name, "{rows:?}");
        assert_eq!(row[3], NODE, "{rows:?}");
    }
    let unnamed_row = rows.iter().find(|r| r[0] == unnamed).expect("listed");
    assert_eq!(
        unnamed_row.last().map(String::as_str),
        Some("cuda.mem=4g,cuda.shares=0.5"),
        "requests as `-r` takes them: {rows:?}"
    );

    let nodes = table(&url, &["node", "ls"]);
    assert_eq!(nodes[1][0], NODE, "{nodes:?}");
    let (code, _, err) = gpuwarden(&url, &["node", "show", &nodes[1][0]]);
    assert_eq!(code, 0, "{err}");
    rt.shutdown_background();
}
