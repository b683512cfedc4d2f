//! The `gpuwarden` binary's exit codes and messages: bad input is 2 and names the bad part; an
//! unreachable or refusing controller is 1 with the reason.

use gpuwarden_test_support::cli;

fn gpuwarden(args: &[&str]) -> (i32, String) {
    // A port nothing listens on.
    let (code, _, err) = cli::gpuwarden("http://127.0.0.1:9", args);
    (code, err)
}

#[test]
fn bad_resources_exit_2_naming_the_token() {
    let (code, err) = gpuwarden(&["session", "create", "-r", "mem=2x"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("\"2x\"") && err.contains("\"mem\""), "{err}");
    let (code, err) = gpuwarden(&["session", "create", "-r", "cuda.shares"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("\"cuda.shares\""), "{err}");
}

#[test]
fn usage_errors_exit_2() {
    let (code, err) = gpuwarden(&["session", "frobnicate"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn an_unreachable_controller_exits_1_saying_where() {
    let (code, err) = gpuwarden(&["node", "ls"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("http://127.0.0.1:9"), "{err}");
}

#[test]
fn unknown_policies_exit_2_listing_the_accepted_ones() {
    let (code, err) = gpuwarden(&[
        "session",
        "create",
        "-r",
        "cuda.shares=0.5",
        "--memory-policy",
        "evict",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("\"evict\"") && err.contains("kill, stop, report"),
        "{err}"
    );
    let (code, err) = gpuwarden(&[
        "run",
        "-r",
        "cuda.shares=0.5",
        "--compute-policy",
        "soft",
        "--",
        "true",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("hard, work-conserving"), "{err}");
}

#[test]
fn conflicting_or_malformed_targets_exit_2() {
    let (code, err) = gpuwarden(&[
        "session",
        "create",
        "-r",
        "cuda.shares=0.5",
        "--container",
        "abc",
        "--cgroup",
        "/x",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--container") && err.contains("--cgroup"),
        "{err}"
    );
    let (code, err) = gpuwarden(&[
        "session",
        "create",
        "-r",
        "cuda.shares=0.5",
        "--pod",
        "123e4567-e89b-12d3-a456-426614174000",
        "--container",
        "abc",
    ]);
    assert_eq!(code, 2, "{err}");
    for (flag, value, words) in [
        ("--container", "xyz", "\"xyz\""),
        ("--pod", "not-a-uuid", "not a UUID"),
        ("--cgroup", "system.slice", "not absolute"),
        ("--cgroup", "/a/../b", "\"..\""),
    ] {
        let (code, err) = gpuwarden(&["session", "create", "-r", "cuda.shares=0.5", flag, value]);
        assert_eq!(code, 2, "{flag} {value}: {err}");
        assert!(err.contains(words), "{flag} {value}: {err}");
    }
}

#[test]
fn run_needs_a_command_and_good_resources() {
    let (code, err) = gpuwarden(&["run", "-r", "cuda.shares=0.5"]);
    assert_eq!(code, 2, "{err}");
    let (code, err) = gpuwarden(&["run", "-r", "mem=2x", "--", "true"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("\"2x\""), "{err}");
}

#[test]
fn run_with_no_agent_exits_1_saying_where() {
    let scratch = gpuwarden_test_support::scratch("noagent");
    let socket = scratch.path().join("agent.sock");
    let socket = socket.to_string_lossy();
    let (code, err) = gpuwarden(&[
        "run",
        "-r",
        "cuda.shares=0.5",
        "--agent-socket",
        &socket,
        "--",
        "true",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("agent") && err.contains(&*socket), "{err}");
}
