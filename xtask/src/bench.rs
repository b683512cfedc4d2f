//! `cargo xtask bench`: benchmarks that print tables of ratios against a baseline measured in the
//! same run.

mod ebpf;

use clap::Subcommand;

/// The benchmarks.
#[derive(Subcommand)]
pub enum Which {
    /// ns per ioctl (GPU and non-GPU fd) and per unrelated syscall, without and with the agent.
    Ebpf {
        /// Calls per measured batch.
        #[arg(long, default_value_t = 200_000)]
        iterations: u64,
        /// Batches per case (the fastest is reported).
        #[arg(long, default_value_t = 9)]
        rounds: usize,
    },
    /// Scheduling decisions/s and latency for 10,000 pending sessions over 1,000 and 5,000
    /// nodes × 8 GPUs, and heartbeats/s from 1,000 agents over real gRPC.
    Sched,
    /// Sessions/s from create to RUNNING and its latency over real gRPC (1,000 fake agents ×
    /// 8 GPUs, 5,000 sessions), on sled and on a real etcd, with group commit and with one
    /// change per commit as the baseline.
    E2e,
    /// How closely the compute-share throttle (slots and buckets) holds CPU spinners to shares
    /// alone and in pairs (CPU time standing in for GPU usage), judged by the time each spinner
    /// saw itself run by its own clock; needs root.
    Throttle,
    /// Snapshot latency (p50, p99) while the agent's telemetry is flooded with exec events,
    /// shared through one mutex as before and as a task behind a handle as now; needs root.
    Telemetry,
    /// How fast the throttle thaws a cgroup and lends idle capacity, and how soon a standby
    /// leads after the leader is killed: what the end-to-end tests only wait for. The throttle
    /// part needs root.
    Timings,
}

/// Runs one benchmark.
pub fn run(which: &Which) -> anyhow::Result<()> {
    // The benches build the agent (eBPF toolchain) and the controller (protoc for etcd-client).
    crate::setup::run()?;
    match which {
        Which::Ebpf { iterations, rounds } => ebpf::run(*iterations, *rounds),
        Which::Sched => {
            crate::status(crate::cargo().args(["bench", "-p", "gpuwarden-sim", "--bench", "sched"]))
        }
        Which::E2e => {
            crate::status(crate::cargo().args(["bench", "-p", "gpuwarden-sim", "--bench", "e2e"]))
        }
        Which::Throttle => crate::status(crate::cargo().args([
            "bench",
            "-p",
            "gpuwarden-agent",
            "--bench",
            "throttle",
        ])),
        // The rig is behind the agent's `bench` feature, out of the shipped binary.
        Which::Telemetry => crate::status(crate::cargo().args([
            "bench",
            "-p",
            "gpuwarden-agent",
            "--features",
            "bench",
            "--bench",
            "telemetry",
        ])),
        Which::Timings => crate::status(crate::cargo().args([
            "bench",
            "-p",
            "gpuwarden-tests",
            "--bench",
            "timings",
        ])),
    }
}
