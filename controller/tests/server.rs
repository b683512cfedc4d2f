//! The `gpuwarden-controller` binary as an operator starts it.

use std::process::Command;

#[test]
fn a_bad_scoring_config_stops_the_controller_naming_the_key() {
    let scratch = gpuwarden_test_support::scratch("scoring");
    let dir = scratch.path();
    for (toml, words) in [
        (
            "[scheduler.scoring.weights]\npacking = -1\n",
            "scoring weight packing = -1",
        ),
        ("[scheduler.scoring]\npacking_cap = 0\n", "packing_cap = 0"),
        ("[scheduler]\nstrategy = \"fastest\"\n", "fastest"),
    ] {
        let file = dir.join("controller.toml");
        std::fs::write(&file, toml).expect("written");
        let out = Command::new(env!("CARGO_BIN_EXE_gpuwarden-controller"))
            .args(["run", "--listen", "127.0.0.1:0", "--config"])
            .arg(&file)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{toml}: {err}");
        assert!(
            err.contains(words) && err.contains("controller.toml"),
            "{toml}: {err}"
        );
    }
}
