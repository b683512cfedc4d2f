//! The figures of a team trace under each way of sharing, and the table that shows them.
//!
//! **Within guarantee.** A job counts as submitted while its team was within its guarantee when
//! the team's jobs not yet done at its arrival (running, waiting or requeued), this one
//! included, asked for at most the guarantee ([`super::replay::JobOutcome::within_guarantee`]):
//! the jobs a guarantee promises to start at once.

use std::fmt::Write as _;

use serde::Serialize;

use gpuwarden_controller::slots::names;

use super::{TeamTrace, replay::SharingRun};
use crate::sharing::Sharing;

/// One team under one way of sharing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TeamRow {
    /// Queue name.
    pub team: String,
    /// How the cluster was shared.
    pub sharing: Sharing,
    /// Guaranteed GPUs (`cuda.shares`).
    pub guaranteed: f64,
    /// Jobs placed at least once.
    pub jobs: usize,
    /// Mean and 95th percentile of time-to-start (first placement − arrival), s.
    pub start_mean: f64,
    /// See `start_mean`.
    pub start_p95: f64,
    /// Jobs submitted while the team was within its guarantee.
    pub within_jobs: usize,
    /// Their mean, 95th percentile and longest time-to-start, s.
    pub within_start_mean: f64,
    /// See `within_start_mean`.
    pub within_start_p95: f64,
    /// See `within_start_mean`.
    pub within_start_max: f64,
    /// Mean completion time (finish − arrival), s.
    pub jct_mean: f64,
    /// GPU-hours its runs held (preempted runs included).
    pub gpu_hours: f64,
    /// Its part of all teams' GPU-hours.
    pub gpu_hours_share: f64,
    /// Its guarantee's part of the cluster.
    pub guarantee_share: f64,
    /// Its runs that were preempted.
    pub preempted: usize,
    /// GPU-hours those runs lost.
    pub lost_gpu_hours: f64,
}

/// The cluster under one way of sharing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterRow {
    /// How the cluster was shared.
    pub sharing: Sharing,
    /// Mean fraction of the cluster's GPUs held, from the first arrival to the last.
    pub utilization: f64,
    /// GPU-hours held in all (preempted runs included).
    pub gpu_hours: f64,
    /// Preemptions carried out.
    pub preemptions: usize,
    /// GPU-hours the preempted runs held, lost.
    pub lost_gpu_hours: f64,
    /// Mean time-to-start over every job, s.
    pub start_mean: f64,
    /// Hours until the last job finished.
    pub makespan_hours: f64,
    /// Jobs refused at creation.
    pub rejected: usize,
}

/// A team trace under both ways of sharing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TeamReport {
    /// Jobs in the trace.
    pub jobs: usize,
    /// Nodes × GPUs per node.
    pub cluster: (u32, u32),
    /// Seed of the trace.
    pub seed: u64,
    /// Seconds between a preemption and the workload's stop.
    pub grace_secs: f64,
    /// The queues, as the config file takes them.
    pub config: String,
    /// Per team and way of sharing: team by team, each way of sharing in [`Sharing::ALL`] order.
    pub teams: Vec<TeamRow>,
    /// Per way of sharing.
    pub cluster_rows: Vec<ClusterRow>,
}

/// The `p` quantile of sorted values (nearest rank).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a percentile's rank: non-negative and clamped to the length"
    )]
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn mean(values: &[f64]) -> f64 {
    sum(values.iter().copied()) / values.len().max(1) as f64
}

/// A sum that is +0 when empty (`Iterator::sum` of no floats is −0, which prints as `-0`).
fn sum(values: impl Iterator<Item = f64>) -> f64 {
    values.fold(0.0, |a, b| a + b)
}

impl TeamReport {
    /// The figures of `runs` (one per way of sharing) over `trace`.
    #[must_use]
    pub fn new(
        trace: &TeamTrace,
        runs: &[SharingRun],
        cluster: (u32, u32),
        seed: u64,
        grace_secs: f64,
    ) -> Self {
        let total_gpus = f64::from(cluster.0 * cluster.1).max(1.0);
        let mut teams = Vec::new();
        for (name, quota) in &trace.quotas.queues {
            let guaranteed = quota.guaranteed.get(names::CUDA_SHARES).as_f64();
            for run in runs {
                let all_hours: f64 = sum(run
                    .outcomes
                    .iter()
                    .map(super::replay::JobOutcome::gpu_seconds))
                    / 3600.0;
                let mine: Vec<usize> = (0..trace.jobs.len())
                    .filter(|&i| trace.queue_of(&trace.jobs[i]) == Some(name.as_str()))
                    .filter(|&i| run.outcomes[i].first_start.is_some())
                    .collect();
                let waits = |filter: &dyn Fn(usize) -> bool| {
                    let mut w: Vec<f64> = mine
                        .iter()
                        .filter(|&&i| filter(i))
                        .filter_map(|&i| {
                            let o = &run.outcomes[i];
                            o.first_start.map(|s| s - o.arrival)
                        })
                        .collect();
                    w.sort_by(f64::total_cmp);
                    w
                };
                let all = waits(&|_| true);
                let guaranteed_waits = waits(&|i| run.outcomes[i].within_guarantee);
                let jct: Vec<f64> = mine
                    .iter()
                    .filter_map(|&i| {
                        let o = &run.outcomes[i];
                        o.finish.map(|f| f - o.arrival)
                    })
                    .collect();
                let hours = sum(mine.iter().map(|&i| run.outcomes[i].gpu_seconds())) / 3600.0;
                teams.push(TeamRow {
                    team: name.clone(),
                    sharing: run.sharing,
                    guaranteed,
                    jobs: mine.len(),
                    start_mean: mean(&all),
                    start_p95: percentile(&all, 0.95),
                    within_jobs: guaranteed_waits.len(),
                    within_start_mean: mean(&guaranteed_waits),
                    within_start_p95: percentile(&guaranteed_waits, 0.95),
                    within_start_max: guaranteed_waits.last().copied().unwrap_or(0.0),
                    jct_mean: mean(&jct),
                    gpu_hours: hours,
                    gpu_hours_share: hours / all_hours.max(f64::MIN_POSITIVE),
                    guarantee_share: guaranteed / total_gpus,
                    preempted: mine
                        .iter()
                        .map(|&i| run.outcomes[i].runs.iter().filter(|r| r.preempted).count())
                        .sum(),
                    lost_gpu_hours: sum(mine.iter().map(|&i| run.outcomes[i].lost_gpu_seconds()))
                        / 3600.0,
                });
            }
        }
        let cluster_rows = runs
            .iter()
            .map(|run| {
                let waits: Vec<f64> = run
                    .outcomes
                    .iter()
                    .filter_map(|o| o.first_start.map(|s| s - o.arrival))
                    .collect();
                ClusterRow {
                    sharing: run.sharing,
                    utilization: run.allocated_sum / run.measured_ticks.max(1) as f64,
                    gpu_hours: sum(run
                        .outcomes
                        .iter()
                        .map(super::replay::JobOutcome::gpu_seconds))
                        / 3600.0,
                    preemptions: run.preemptions,
                    lost_gpu_hours: run.lost_gpu_seconds / 3600.0,
                    start_mean: mean(&waits),
                    makespan_hours: run.makespan / 3600.0,
                    rejected: run.rejected.len(),
                }
            })
            .collect();
        Self {
            jobs: trace.jobs.len(),
            cluster,
            seed,
            grace_secs,
            config: trace.config_toml(),
            teams,
            cluster_rows,
        }
    }

    /// The row of `team` under `sharing`.
    #[must_use]
    pub fn team(&self, team: &str, sharing: Sharing) -> Option<&TeamRow> {
        self.teams
            .iter()
            .find(|r| r.team == team && r.sharing == sharing)
    }

    /// The cluster's row under `sharing`.
    #[must_use]
    pub fn cluster(&self, sharing: Sharing) -> Option<&ClusterRow> {
        self.cluster_rows.iter().find(|r| r.sharing == sharing)
    }

    /// The tables: the queues, then per team, then the cluster.
    #[must_use]
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} jobs of {} teams, {} nodes × {} GPUs, trace seed {}, binpack; preempted runs stop after a {} s grace period and run again from the start (queues + suspend: they stop {} s after the decision, keep their work, and resume with {} s more to run; 1 in 4 refused: the driver refuses those jobs' checkpoints, a fixed quarter of the trace, and they go the kill way)",
            self.jobs,
            self.teams.len() / Sharing::ALL.len().max(1),
            self.cluster.0,
            self.cluster.1,
            self.seed,
            self.grace_secs,
            super::replay::SUSPEND_SECS,
            super::replay::RESUME_SECS,
        );
        let _ = writeln!(out);
        let _ = writeln!(out, "```toml");
        let _ = write!(out, "{}", self.config);
        let _ = writeln!(out, "```");
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "| team | guarantee (GPUs) | sharing | jobs | time-to-start mean / p95 (s) | within guarantee: jobs | their time-to-start mean / p95 / max (s) | mean JCT (s) | GPU-hours | share of GPU-hours / guarantee's share of the cluster | preempted runs (GPU-h lost) |"
        );
        let _ = writeln!(
            out,
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for r in &self.teams {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {:.0} / {:.0} | {} | {:.0} / {:.0} / {:.0} | {:.0} | {:.1} | {:.1}% / {:.1}% | {} ({:.1}) |",
                r.team,
                r.guaranteed,
                r.sharing,
                r.jobs,
                r.start_mean,
                r.start_p95,
                r.within_jobs,
                r.within_start_mean,
                r.within_start_p95,
                r.within_start_max,
                r.jct_mean,
                r.gpu_hours,
                100.0 * r.gpu_hours_share,
                100.0 * r.guarantee_share,
                r.preempted,
                r.lost_gpu_hours,
            );
        }
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "| sharing | GPUs held (mean, first to last arrival) | GPU-hours | preemptions | GPU-hours lost to them | time-to-start mean (s) | makespan (h) | refused |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
        for c in &self.cluster_rows {
            let _ = writeln!(
                out,
                "| {} | {:.1}% | {:.1} | {} | {:.1} ({:.1}%) | {:.0} | {:.1} | {} |",
                c.sharing,
                100.0 * c.utilization,
                c.gpu_hours,
                c.preemptions,
                c.lost_gpu_hours,
                100.0 * c.lost_gpu_hours / c.gpu_hours.max(f64::MIN_POSITIVE),
                c.start_mean,
                c.makespan_hours,
                c.rejected,
            );
        }
        out
    }
}
