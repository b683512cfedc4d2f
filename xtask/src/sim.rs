//! `cargo xtask sim [--trace FILE] [--seed N] [--json] [ARGS…]`: replays a job trace against the
//! controller's scheduler under every placement mode (the `gpuwarden-sim` binary, in release).
//! Without `--trace` or `--seed` it replays the bundled trace, `controller/sim/trace.jsonl`.

/// The bundled trace, relative to the workspace root.
const BUNDLED: &str = "controller/sim/trace.jsonl";

/// Runs the simulator with `args` (passed through).
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let mut cmd = crate::cargo();
    cmd.args([
        "run",
        "--release",
        "-q",
        "-p",
        "gpuwarden-controller",
        "--bin",
        "gpuwarden-sim",
        "--",
    ]);
    let chooses_trace = args
        .iter()
        .any(|a| a.starts_with("--trace") || a.starts_with("--seed"));
    if !chooses_trace {
        cmd.args(["--trace", BUNDLED]);
    }
    cmd.args(args);
    crate::status(&mut cmd)
}
