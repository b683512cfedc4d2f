//! `gpuwarden-sim --help` introduces the simulator, not another binary.

use std::process::Command;

#[test]
fn help_says_what_the_simulator_is() {
    let out = Command::new(env!("CARGO_BIN_EXE_gpuwarden-sim"))
        .arg("--help")
        .output()
        .expect("runs");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    let first = help.lines().next().unwrap_or_default();
    assert!(first.contains("replays a GPU job trace"), "{help}");
    assert!(!help.contains("controller and the gpuwarden CLI"), "{help}");
}
