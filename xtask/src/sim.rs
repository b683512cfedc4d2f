//! `cargo xtask sim [--trace FILE] [--seed N] [--json] [ARGS…]`: replays a job trace against the
//! controller's scheduler under every placement mode (the `gpuwarden-sim` binary, in release).
//! Without `--trace`, or a flag that shapes a generated trace (`--seed`, `--jobs`, `--load`,
//! `--fractional-training`, `--sweep-…`, `--generate`, `--teams`, `--mig`, `--mig-jobs`), it
//! replays the bundled trace, `controller/sim/trace.jsonl`. `--teams` replays a generated trace
//! of teams sharing the cluster, without queues and with team queues and reclaim. `--mig N`
//! replays a generated trace with MIG requests on N nodes in MIG mode.

/// The bundled trace, relative to the workspace root.
const BUNDLED: &str = "controller/sim/trace.jsonl";

/// Flags that pick or shape the trace: the bundled one would override them.
const TRACE_FLAGS: [&str; 9] = [
    "--trace",
    "--seed",
    "--jobs",
    "--load",
    "--fractional-training",
    "--sweep",
    "--generate",
    "--teams",
    // `--mig` and `--mig-jobs`: MIG nodes replay a generated trace with MIG requests.
    "--mig",
];

/// Runs the simulator with `args` (passed through).
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let mut cmd = crate::cargo();
    cmd.args([
        "run",
        "--release",
        "-q",
        "-p",
        "gpuwarden-sim",
        "--bin",
        "gpuwarden-sim",
        "--",
    ]);
    let chooses_trace = args
        .iter()
        .any(|a| TRACE_FLAGS.iter().any(|f| a.starts_with(f)));
    if !chooses_trace {
        cmd.args(["--trace", BUNDLED]);
    }
    cmd.args(args);
    crate::status(&mut cmd)
}
