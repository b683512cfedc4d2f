//! The `gpuwarden` binary's exit codes and messages: bad input is 2 and names the bad part; an
//! unreachable or refusing controller is 1 with the reason.

use std::process::Command;

fn gpuwarden(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwarden"))
        .args(args)
        // A port nothing listens on.
        .env("GPUWARDEN_CONTROLLER", "http://127.0.0.1:9")
        .output()
        .expect("gpuwarden runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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
