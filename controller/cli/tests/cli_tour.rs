//! The README's "A short tour", run as written, so it can't drift from what the CLI does.
//!
//! The test reads the tour's fenced `sh` blocks out of `README.md` and types them, in order,
//! into one `sh` (so `ID=$(…)` carries to the next line), from a directory where
//! `target/release/gpuwarden` is the CLI under test. The `# …` lines right after a command are
//! what the README says it prints: each must appear, in order, among its stdout and stderr lines
//! (runs of spaces count as one, and `…` stands for any text); every command must exit 0.
//!
//! Around it, what `cargo xtask run` sets up: a controller, and this node (named by its host
//! name, as the agent names it) registering the two mock GPUs of `deploy/mock-devices.toml` with
//! the host's CPUs and memory, acknowledging every allocation. For `gpuwarden run` a fake agent
//! socket hands out a test cgroup; that needs root, so the tour's `sudo` steps run only in the
//! root test (`#[ignore = "needs root"]`, run by `cargo xtask test`), where `sudo` is the
//! command itself. The other test runs the tour up to its first `sudo` step.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    time::Duration,
};

use gpuwarden_proto::v1 as pb;
use gpuwarden_test_support::TestCgroup;
use gpuwarden_types::slot::{SlotValue, names, parse_bytes};

const README: &str = include_str!("../../../README.md");
const MOCK_DEVICES: &str = include_str!("../../../deploy/mock-devices.toml");

/// One command of the tour and what the README says it prints.
#[derive(Debug)]
struct Step {
    command: String,
    expected: Vec<String>,
}

/// The commands of the fenced `sh` blocks of the README's "A short tour", in order.
fn tour() -> Vec<Step> {
    let start = README
        .find("\n## A short tour\n")
        .expect("the README has a short tour");
    let section = &README[start + 1..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let mut steps: Vec<Step> = Vec::new();
    let mut in_sh = false;
    for line in section.lines() {
        match (in_sh, line.trim_end()) {
            (false, "```sh") => in_sh = true,
            (true, "```") => in_sh = false,
            (true, "") | (false, _) => {}
            (true, out) if out.starts_with('#') => {
                let step = steps.last_mut().expect("an output line follows a command");
                step.expected
                    .push(out.trim_start_matches('#').trim().to_owned());
            }
            (true, command) => {
                assert!(!command.ends_with('\\'), "one line per command: {command}");
                steps.push(Step {
                    command: command.to_owned(),
                    expected: Vec::new(),
                });
            }
        }
    }
    assert!(!in_sh, "an unclosed sh block in the tour");
    steps
}

/// Whether `line` is what `expected` says, runs of spaces as one and `…` as any text.
fn matches(expected: &str, line: &str) -> bool {
    let squeeze = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let (expected, line) = (squeeze(expected), squeeze(line));
    let mut parts = expected.split('…');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = line.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        let Some(at) = rest.find(part) else {
            return false;
        };
        rest = &rest[at + part.len()..];
    }
    rest.ends_with(last)
}

/// This node as `cargo xtask run`'s agent registers it on a machine without NVIDIA GPUs: its
/// host name, the mock GPUs, the host's CPUs and memory.
fn mock_node(node: &str) -> pb::NodeInfo {
    let file: toml::Table = MOCK_DEVICES.parse().expect("the mock device file parses");
    let devices: Vec<pb::Device> = file["devices"]
        .as_array()
        .expect("a device list")
        .iter()
        .zip(0u32..)
        .map(|(d, index)| pb::Device {
            uuid: d["uuid"].as_str().expect("a uuid").to_owned(),
            model: d["model_name"].as_str().expect("a model").to_owned(),
            memory_bytes: parse_bytes(d["memory_size"].as_str().expect("a size"))
                .ok()
                .and_then(SlotValue::to_u64)
                .expect("a byte size"),
            numa_node: d["numa_node"]
                .as_integer()
                .and_then(|n| i32::try_from(n).ok())
                .unwrap_or(0),
            sm_count: d["sm_count"]
                .as_integer()
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or(0),
            index,
            device_node: format!("/dev/nvidia{index}"),
            ..Default::default()
        })
        .collect();
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let mem_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .expect("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("MemTotal");
    let kind = |k: pb::SlotKind| i32::from(k);
    let mut slot_types = vec![
        pb::SlotType {
            name: names::CPU.into(),
            kind: kind(pb::SlotKind::Count),
        },
        pb::SlotType {
            name: names::MEM.into(),
            kind: kind(pb::SlotKind::Bytes),
        },
    ];
    slot_types.extend(names::GPU_SLOTS.iter().map(|(name, k)| pb::SlotType {
        name: (*name).into(),
        kind: kind(gpuwarden_proto::convert::kind_to_pb(*k)),
    }));
    pb::NodeInfo {
        node_id: node.into(),
        hostname: node.into(),
        slot_types,
        capacity: Some(pb::ResourceSlot {
            values: [
                (names::CPU.to_owned(), cpus.to_string()),
                (names::MEM.to_owned(), (mem_kib * 1024).to_string()),
            ]
            .into_iter()
            .collect(),
        }),
        devices,
        agent_version: "tour".into(),
        ..Default::default()
    }
}

/// Registers [`mock_node`] with the controller at `url`, beats its heart and acknowledges every
/// allocation, as the agent does.
async fn mock_agent(url: String, node: String) {
    let (tx, inbound) = gpuwarden_test_support::node::connect(&url, mock_node(&node)).await;
    let beat = tx.clone();
    tokio::spawn(async move {
        for seq in 1.. {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let heartbeat = pb::Heartbeat {
                node_id: node.clone(),
                seq,
                running_sessions: vec![],
            };
            let msg = Some(pb::agent_message::Msg::Heartbeat(heartbeat));
            if beat.send(pb::AgentMessage { msg }).await.is_err() {
                return;
            }
        }
    });
    gpuwarden_test_support::node::acknowledge_all(tx, inbound, |_| {}).await;
}

/// The host name, as the agent and `"$(hostname)"` give it.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("a host name")
        .trim()
        .to_owned()
}

/// Types `steps` into one `sh` in `dir` (where `target/release/gpuwarden` is the CLI), against
/// the controller at `url` and the agent socket at `socket`; fails at the first command that
/// exits non-zero or doesn't print what the README says.
fn type_in(steps: &[Step], dir: &Path, url: &str, socket: &Path) {
    let bin = dir.join("target/release");
    std::fs::create_dir_all(&bin).expect("makes target/release");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_gpuwarden"), bin.join("gpuwarden"))
        .expect("links the CLI");
    // The newcomer's program: `run` starts it in the session's cgroup.
    std::fs::write(dir.join("train.py"), "print('training')\n").expect("writes train.py");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).expect("makes out");
    // Already root where `sudo` steps run: `sudo` is the command itself.
    let mut script = String::from("sudo() { \"$@\"; }\n");
    for (i, step) in steps.iter().enumerate() {
        // The command on a line of its own, so a trailing comment ends with the line.
        let _ = writeln!(
            script,
            "{{\n{}\n}} >out/{i}.out 2>&1\necho $? >out/{i}.rc",
            step.command
        );
    }
    let shell = std::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .current_dir(dir)
        .env("GPUWARDEN_CONTROLLER", url)
        .env("GPUWARDEN_AGENT_SOCKET", socket)
        .output()
        .expect("sh runs");
    assert!(shell.status.success(), "sh: {shell:?}");
    let read = |name: String| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    for (i, step) in steps.iter().enumerate() {
        let printed = read(format!("{i}.out"));
        let said = format!("$ {}\n{printed}", step.command);
        assert_eq!(
            read(format!("{i}.rc")).trim(),
            "0",
            "exit status of\n{said}"
        );
        let mut lines = printed.lines();
        for expected in &step.expected {
            assert!(
                lines.any(|line| matches(expected, line)),
                "the README says `{expected}` (in this order) after\n{said}"
            );
        }
    }
}

/// A controller, this node with the mock GPUs, a fake agent socket handing out `cgroup`, and
/// the tour's `steps` typed in.
fn run_tour(steps: &[Step], cgroup: PathBuf) {
    let scratch = gpuwarden_test_support::scratch("tour");
    let node = hostname();
    let socket = scratch.path().join("agent.sock");
    gpuwarden_test_support::cli::fake_agent_socket(&socket, &node, cgroup);
    let ctl = gpuwarden_test_support::controller::TestController::builder(
        &scratch.path().join("controller"),
    )
    .start();
    let (rt, url) = (gpuwarden_test_support::controller::runtime(), ctl.url());
    rt.spawn(mock_agent(url.clone(), node.clone()));
    gpuwarden_test_support::cli::wait_for_node(&url, &node);
    let dir = scratch.path().join("newcomer");
    std::fs::create_dir_all(&dir).expect("makes the newcomer's directory");
    type_in(steps, &dir, &url, &socket);
    rt.shutdown_background();
}

/// The tour up to its first `sudo` step, as any user.
#[test]
fn the_readme_tour_runs_as_written_up_to_sudo() {
    let steps = tour();
    let upto = steps
        .iter()
        .position(|s| s.command.starts_with("sudo "))
        .unwrap_or(steps.len());
    assert!(upto >= 3, "the tour starts with sessions: {steps:#?}");
    let scratch = gpuwarden_test_support::scratch("tour-cgroup");
    run_tour(&steps[..upto], scratch.path().to_owned());
}

/// The whole tour, `gpuwarden run` included.
#[test]
#[ignore = "needs root"]
fn the_readme_tour_runs_as_written() {
    gpuwarden_test_support::require_root();
    let cgroup = TestCgroup::create(&format!("gpuwarden-test-tour-{}", std::process::id()));
    let steps = tour();
    assert!(
        steps.iter().any(|s| s.command.contains("gpuwarden run")),
        "the tour runs a command under a quota: {steps:#?}"
    );
    run_tour(&steps, cgroup.dir.clone());
    drop(cgroup);
}

#[test]
fn readme_output_lines_match_with_ellipses_and_squeezed_spaces() {
    assert!(matches("GPU0 ██ 0.80  s-…,s-…", "GPU0 ██ 0.80 s-1,s-2"));
    assert!(matches("cpu 0/…, mem 0 B/…", "cpu 0/16, mem 0 B/62.5 GiB"));
    assert!(matches("exit 124", "exit 124"));
    assert!(!matches("exit 124", "exit 1240"));
    assert!(!matches("GPU0 …0.80", "GPU1 0.80"));
    assert!(!matches("s-… running", "s-1 pending"));
}
