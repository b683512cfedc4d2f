//! Teams sharing a cluster (issue 24 §4): a trace of teams with guaranteed capacity that sit idle
//! for long stretches and then burst well past their guarantee, replayed under today's scheduler
//! (no queues) and under team queues with reclaim by preemption, each team's wait against its
//! guarantee compared.
//!
//! - this module: the teams, as the controller's own [`QuotaConfig`] (queues with a guarantee
//!   and a limit in `cuda.shares`, owners as members), and a seeded generator of their jobs;
//! - [`replay`]: the replay of one way of sharing, with preempted sessions stopped after the
//!   grace period and requeued to run again from the start;
//! - [`report`]: per team, time-to-start (all jobs, and the jobs submitted while the team was
//!   within its guarantee) and its share of GPU-hours against its guarantee; for the cluster,
//!   utilization, preemptions and the GPU-hours they lost.
//!
//! `cargo xtask sim --teams` runs it on the generated trace of `--seed` (1 by default); see
//! `docs/simulation.md#teams-sharing-a-cluster`.

pub mod replay;
pub mod report;

use std::fmt::Write as _;

use gpuwarden_controller::{
    scheduler::{
        SchedulerConfig,
        quotas::{QueueQuota, QuotaConfig},
    },
    slots::{ResourceSlot, SlotValue, names},
};

use super::{SimConfig, SimError, rng::Rng, trace::Job};

pub use crate::sharing::Sharing;
pub use replay::{
    RESUME_SECS, SUSPEND_SECS, SharingRun, checkpoint_refused, replay, replay_refusing,
};
pub use report::TeamReport;

/// When a team submits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activity {
    /// Poisson arrivals all along, offering `load` × its guarantee.
    Steady {
        /// GPU-seconds offered per second, as a multiple of the guarantee.
        load: f64,
    },
    /// Idle stretches (exponential, mean `idle_hours`) and bursts (exponential, mean
    /// `burst_hours`) that offer `load` × its guarantee while they last.
    Bursty {
        /// Mean idle stretch, hours.
        idle_hours: f64,
        /// Mean burst, hours.
        burst_hours: f64,
        /// GPU-seconds offered per second during a burst, as a multiple of the guarantee.
        load: f64,
    },
}

/// One team of the generated trace: its queue, its members and how it submits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Team {
    /// Queue name (a DNS label).
    pub name: &'static str,
    /// Owners whose sessions count against the queue.
    pub members: &'static [&'static str],
    /// Guaranteed shares, as a fraction of the cluster's GPUs (rounded to 0.1 share).
    pub guaranteed: f64,
    /// Limit, as a fraction of the cluster's GPUs (`None`: no limit).
    pub limit: Option<f64>,
    /// When it submits.
    pub activity: Activity,
    /// Its requests in `cuda.shares`, with weights.
    pub sizes: &'static [(f64, f64)],
    /// Median seconds a job runs (log-normal, σ [`WORK_SIGMA`]).
    pub median_work: f64,
    /// Workload family of its jobs' classes.
    pub family: &'static str,
}

/// Log-normal σ of every team's work.
pub const WORK_SIGMA: f64 = 1.0;

/// Shortest and longest work, seconds.
pub const WORK_RANGE: (f64, f64) = (120.0, 43_200.0);

/// The teams of the generated trace (assumed, see `docs/simulation.md`): guarantees sum to 92.5 %
/// of the cluster; one steady inference team near its guarantee, three research teams idle for
/// hours and then bursting to 2–3× theirs, and a small team of notebooks that always borrows a
/// little.
pub const TEAMS: [Team; 5] = [
    Team {
        name: "infer",
        members: &["svc-infer", "svc-ranker"],
        guaranteed: 0.25,
        limit: Some(0.375),
        activity: Activity::Steady { load: 0.8 },
        sizes: &[(0.1, 2.0), (0.25, 3.0), (0.5, 3.0), (0.8, 1.0), (1.0, 1.0)],
        median_work: 3600.0,
        family: "infer-online",
    },
    Team {
        name: "research",
        members: &["alice", "bob", "carol"],
        guaranteed: 0.3,
        limit: Some(0.75),
        activity: Activity::Bursty {
            idle_hours: 6.0,
            burst_hours: 3.0,
            load: 3.0,
        },
        sizes: &[(0.5, 1.0), (1.0, 4.0), (2.0, 2.0), (4.0, 1.0)],
        median_work: 5400.0,
        family: "train",
    },
    Team {
        name: "vision",
        members: &["dave", "erin"],
        guaranteed: 0.2,
        limit: Some(0.5),
        activity: Activity::Bursty {
            idle_hours: 5.0,
            burst_hours: 2.0,
            load: 2.5,
        },
        sizes: &[(0.25, 1.0), (0.5, 2.0), (1.0, 3.0), (2.0, 1.0)],
        median_work: 3600.0,
        family: "finetune",
    },
    Team {
        name: "nlp",
        members: &["frank", "grace"],
        guaranteed: 0.125,
        limit: None,
        activity: Activity::Bursty {
            idle_hours: 8.0,
            burst_hours: 3.0,
            load: 3.0,
        },
        sizes: &[(0.5, 1.0), (1.0, 3.0), (2.0, 2.0)],
        median_work: 7200.0,
        family: "train",
    },
    Team {
        name: "interns",
        members: &["heidi", "ivan"],
        guaranteed: 0.05,
        limit: Some(0.125),
        activity: Activity::Steady { load: 1.5 },
        sizes: &[(0.1, 3.0), (0.25, 2.0), (0.5, 1.0)],
        median_work: 2700.0,
        family: "notebook",
    },
];

/// Settings of the team trace generator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TeamGenConfig {
    /// GPUs of the cluster (the guarantees and loads are fractions of it).
    pub gpus: u32,
    /// Hours of arrivals.
    pub hours: f64,
}

impl Default for TeamGenConfig {
    fn default() -> Self {
        Self {
            gpus: 64,
            hours: 72.0,
        }
    }
}

/// A trace of teams: their queues (the controller's configuration) and their jobs, each with
/// its owner.
#[derive(Debug, Clone, PartialEq)]
pub struct TeamTrace {
    /// The queues, in the shape of `[scheduler.quotas]`.
    pub quotas: QuotaConfig,
    /// Jobs sorted by arrival.
    pub jobs: Vec<Job>,
}

impl TeamTrace {
    /// The queue `job`'s owner counts against, if any.
    #[must_use]
    pub fn queue_of<'a>(&'a self, job: &'a Job) -> Option<&'a str> {
        self.quotas
            .queue_of(job.owner.as_deref().unwrap_or_default())
    }

    /// The queues as they go in the controller's config file.
    #[must_use]
    pub fn config_toml(&self) -> String {
        config_toml(&self.quotas)
    }
}

/// `shares` of a GPU as an exact slot value, rounded to 0.1.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "a small non-negative amount of shares, rounded to tenths"
)]
fn shares(shares: f64) -> ResourceSlot {
    let tenths = (shares.max(0.0) * 10.0).round() as u128;
    ResourceSlot::new().with(names::CUDA_SHARES, SlotValue::from_micros(tenths * 100_000))
}

/// The queues of `teams` on a cluster of `gpus` GPUs.
#[must_use]
pub fn quotas(teams: &[Team], gpus: u32) -> QuotaConfig {
    let gpus = f64::from(gpus);
    let mut config = QuotaConfig::default();
    for team in teams {
        config.queues.insert(
            team.name.to_owned(),
            QueueQuota {
                guaranteed: shares(team.guaranteed * gpus),
                limit: team.limit.map(|l| shares(l * gpus)),
            },
        );
        for member in team.members {
            config
                .members
                .insert((*member).to_owned(), team.name.to_owned());
        }
    }
    config
}

/// `quotas` as the controller's config file takes them (`[scheduler.quotas.queues.NAME]`, then
/// `[scheduler.quotas.members]`).
#[must_use]
pub fn config_toml(quotas: &QuotaConfig) -> String {
    let table = |slots: &ResourceSlot| {
        let pairs: Vec<String> = slots
            .iter()
            .map(|(k, v)| format!("\"{k}\" = \"{v}\""))
            .collect();
        format!("{{ {} }}", pairs.join(", "))
    };
    let mut out = String::new();
    for (name, quota) in &quotas.queues {
        let _ = writeln!(out, "[scheduler.quotas.queues.{name}]");
        let _ = writeln!(out, "guaranteed = {}", table(&quota.guaranteed));
        if let Some(limit) = &quota.limit {
            let _ = writeln!(out, "limit = {}", table(limit));
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(out, "[scheduler.quotas.members]");
    for (member, queue) in &quotas.members {
        let _ = writeln!(out, "{member} = \"{queue}\"");
    }
    out
}

/// GPU-seconds one job of `team` asks for on average (its sizes' mean × the log-normal mean work,
/// clamping left out).
fn mean_gpu_seconds(team: &Team) -> f64 {
    let total: f64 = team.sizes.iter().map(|(_, w)| w).sum();
    let size = team.sizes.iter().map(|(s, w)| s * w).sum::<f64>() / total.max(f64::MIN_POSITIVE);
    size * team.median_work * (WORK_SIGMA * WORK_SIGMA / 2.0).exp()
}

/// Generates the jobs of `teams` on a cluster of `config.gpus` GPUs over `config.hours`: each
/// team's arrivals are Poisson at the rate that offers its load while it is active; sizes by the
/// team's weights, log-normal work, a member drawn at random as the owner. Each team draws from
/// its own stream of `seed`, so one team's jobs don't shift when another's change.
#[must_use]
pub fn generate_with(teams: &[Team], config: &TeamGenConfig, seed: u64) -> TeamTrace {
    let gpus = f64::from(config.gpus);
    let end = config.hours * 3600.0;
    let mut drafts: Vec<(f64, Job)> = Vec::new();
    for (t, team) in teams.iter().enumerate() {
        let mut rng = Rng::stream(seed, t as u64);
        let guaranteed = team.guaranteed * gpus;
        let weights: Vec<f64> = team.sizes.iter().map(|(_, w)| *w).collect();
        let per_job = mean_gpu_seconds(team).max(1.0);
        // Active windows: the whole trace, or bursts between idle stretches.
        let mut windows = Vec::new();
        let load = match team.activity {
            Activity::Steady { load } => {
                windows.push((0.0, end));
                load
            }
            Activity::Bursty {
                idle_hours,
                burst_hours,
                load,
            } => {
                let mut at = rng.exp(idle_hours * 3600.0);
                while at < end {
                    let length = rng.exp(burst_hours * 3600.0);
                    windows.push((at, (at + length).min(end)));
                    at += length + rng.exp(idle_hours * 3600.0);
                }
                load
            }
        };
        let rate = load * guaranteed / per_job;
        for (from, to) in windows {
            let mut at = from + rng.exp(1.0 / rate);
            while at < to {
                let size = team.sizes[rng.weighted(&weights)].0;
                let work = (team.median_work * (WORK_SIGMA * rng.normal()).exp())
                    .clamp(WORK_RANGE.0, WORK_RANGE.1)
                    .round();
                let member = team.members[rng.weighted(&vec![1.0; team.members.len()])];
                let variant = rng.next_u64() % 4;
                let arrival = (at * 10.0_f64).round() / 10.0;
                drafts.push((
                    arrival,
                    Job {
                        id: String::new(),
                        arrival,
                        slots: vec![format!("{}={size}", names::CUDA_SHARES)],
                        class: format!("{}-{variant}", team.family),
                        work,
                        owner: Some((*member).to_owned()),
                    },
                ));
                at += rng.exp(1.0 / rate);
            }
        }
    }
    // Stable: ties keep team order.
    drafts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let jobs = drafts
        .into_iter()
        .enumerate()
        .map(|(i, (_, job))| Job {
            id: format!("t{i:05}"),
            ..job
        })
        .collect();
    TeamTrace {
        quotas: quotas(teams, config.gpus),
        jobs,
    }
}

/// [`generate_with`] the bundled [`TEAMS`].
#[must_use]
pub fn generate(config: &TeamGenConfig, seed: u64) -> TeamTrace {
    generate_with(&TEAMS, config, seed)
}

/// Replays `trace` under each way of sharing ([`Sharing::ALL`]) on `config.cluster`, each with
/// a fresh scheduler, and reports per team and for the cluster; `seed` is the trace's, for the
/// header.
///
/// # Errors
/// A replay can't finish (see [`SimError`]).
pub fn evaluate(trace: &TeamTrace, config: &SimConfig, seed: u64) -> Result<TeamReport, SimError> {
    let runs = Sharing::ALL
        .iter()
        .map(|&sharing| replay(trace, sharing, config))
        .collect::<Result<Vec<_>, _>>()?;
    let grace_secs = f64::from(SchedulerConfig::default().preemption_grace_ms) / 1000.0;
    Ok(TeamReport::new(
        trace,
        &runs,
        (config.cluster.nodes, config.cluster.gpus_per_node),
        seed,
        grace_secs,
    ))
}

#[cfg(test)]
mod tests;
