//! Trace-driven evaluation of the placement modes: the controller's own [`Scheduler`] against
//! a virtual clock and a simulated cluster.
//!
//! - [`trace`]: the JSON-lines job format and a generator with parameters from published GPU
//!   cluster traces;
//! - [`cluster`]: the simulated nodes, the workloads' utilization processes and the
//!   ground-truth interference, which the scheduler never sees;
//! - [`run`]: the replay of one mode, with a fresh scheduler that learns profiles only from
//!   what the simulated agents report;
//! - [`report`]: completion times, queueing, utilization, fragmentation and SLO misses per
//!   mode, as a table of ratios against `binpack` or as JSON;
//! - [`mig`]: nodes with their GPUs in MIG mode, the simulator playing their agents (instances
//!   made on the controller's order, destroyed once empty; `cargo xtask sim --mig N`);
//! - [`teams`]: teams sharing a cluster — a trace of teams with guarantees and bursts, replayed
//!   without queues and with team queues and reclaim (`cargo xtask sim --teams`).
//!
//! `cargo xtask sim` runs it on the bundled trace (`controller/sim/trace.jsonl`); see
//! `docs/simulation.md`. A crate of its own on top of the controller library, with the
//! `gpuwarden-sim` binary and the scheduler benchmark (`cargo xtask bench sched`).
//!
//! # Example
//!
//! ```
//! use gpuwarden_sim::{self as sim, SimConfig, trace::GenConfig};
//!
//! let config = SimConfig::default();
//! let jobs = sim::trace::generate(&GenConfig { jobs: 40, gpus: config.cluster.gpus(), ..GenConfig::default() }, 7);
//! let report = sim::evaluate(&jobs, &config, 7).unwrap();
//! assert_eq!(report.modes.len(), 3);
//! println!("{}", report.table());
//! ```
//!
//! [`Scheduler`]: gpuwarden_controller::scheduler::Scheduler

pub mod cluster;
pub mod mig;
pub mod report;
pub mod rng;
pub mod run;
pub mod sharing;
pub mod teams;
pub mod trace;

pub use report::{ModeReport, Report};
pub use run::SimError;

use gpuwarden_controller::placement::{Placement, ScoringConfig};

use cluster::ClusterShape;

/// Settings of a simulation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimConfig {
    /// The simulated cluster.
    pub cluster: ClusterShape,
    /// The last this many of its nodes have their GPUs in MIG mode ([`mig::MigNode`]: half
    /// in NVIDIA's "balanced" layout, half reconfigurable with no instance at start). The team
    /// replay ([`teams`]) has none.
    pub mig_nodes: u32,
    /// Virtual seconds per tick.
    pub tick_secs: f64,
    /// Ticks between the simulated agents' usage reports.
    pub report_every: u32,
    /// Fraction of the trace's first jobs excluded from the metrics, in every mode alike
    /// (their runs still teach profiles).
    pub warmup: f64,
    /// A job misses its SLO when its completion time exceeds this × its work.
    pub slo_factor: f64,
    /// Scoring of `interference-aware`.
    pub scoring: ScoringConfig,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            cluster: ClusterShape {
                nodes: 8,
                gpus_per_node: 8,
            },
            mig_nodes: 0,
            tick_secs: 10.0,
            report_every: 1,
            warmup: 0.1,
            slo_factor: 2.0,
            scoring: ScoringConfig::default(),
        }
    }
}

/// Replays `jobs` (sorted by arrival, as [`trace::parse`] returns them) under every mode,
/// each with a fresh scheduler; `seed` drives the simulated demand (the same per job in every
/// mode).
///
/// # Errors
/// A run can't finish (see [`SimError`]).
pub fn evaluate(jobs: &[trace::Job], config: &SimConfig, seed: u64) -> Result<Report, SimError> {
    let total_shares = f64::from(config.cluster.gpus());
    let modes = Placement::ALL
        .iter()
        .map(|&mode| {
            run::run(jobs, mode, config, seed)
                .map(|r| ModeReport::from_run(&r, config.warmup, config.slo_factor, total_shares))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Report {
        jobs: jobs.len(),
        warmup_jobs: run::warmup_count(jobs.len(), config.warmup),
        cluster: (config.cluster.nodes, config.cluster.gpus_per_node),
        mig_nodes: config.mig_nodes.min(config.cluster.nodes),
        slo_factor: config.slo_factor,
        seed,
        modes,
    })
}

#[cfg(test)]
mod tests;
