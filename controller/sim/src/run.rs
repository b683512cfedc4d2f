//! The replay loop: one placement mode, a fresh [`Scheduler`], the trace on a virtual clock.
//!
//! Each tick: jobs that have arrived are created as sessions; a scheduling pass runs and
//! every `Allocate` is acknowledged at once (the simulated agents never refuse); each running
//! job draws its demand, the devices share themselves out by the ground truth
//! ([`super::cluster::contend`]), jobs progress, the agents report what each job got every
//! `report_every` ticks, and finished jobs are terminated (which teaches their class
//! profile). Nothing reads the wall clock: the scheduler's decisions depend on the order of
//! calls only.

use std::collections::BTreeMap;

use gpuwarden_controller::{
    allocator::Allocation,
    metrics::fragmented_shares,
    placement::Placement,
    profile::UsageSample,
    scheduler::{Command, NewSession, RegisterError, Scheduler, SchedulerConfig},
};

use super::{
    SimConfig,
    cluster::{Demand, contend},
    rng::Rng,
    trace::Job,
};

/// A replay that can't finish.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A simulated node was refused.
    #[error("registering a simulated node: {0}")]
    Register(#[from] RegisterError),
    /// Jobs still waiting or running long after the last arrival.
    #[error("the {mode} run is stuck at {at_secs} s with {left} jobs unfinished")]
    Stuck {
        /// The mode.
        mode: Placement,
        /// Virtual time.
        at_secs: f64,
        /// Jobs not finished.
        left: usize,
    },
    /// A team trace's jobs still waiting or running long after the last arrival.
    #[error(
        "the {sharing} run of the team trace is stuck at {at_secs} s with {left} jobs unfinished"
    )]
    SharingStuck {
        /// How the cluster was shared.
        sharing: crate::sharing::Sharing,
        /// Virtual time.
        at_secs: f64,
        /// Jobs not finished.
        left: usize,
    },
}

/// What happened to one job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// Arrival, s.
    pub arrival: f64,
    /// Placement, s.
    pub start: f64,
    /// Completion, s.
    pub finish: f64,
    /// Seconds it would have run alone.
    pub work: f64,
}

/// The raw results of one mode's replay.
#[derive(Debug, Clone, PartialEq)]
pub struct ModeRun {
    /// The mode.
    pub mode: Placement,
    /// Per trace job (in arrival order): its outcome, or `None` when refused at creation.
    pub outcomes: Vec<Option<Outcome>>,
    /// Jobs refused at creation, with the scheduler's reason.
    pub rejected: Vec<(String, String)>,
    /// Σ over the measured ticks of the mean device utilization.
    pub utilization_sum: f64,
    /// Σ over the measured ticks of the mean useful utilization (progress made, in GPU time
    /// alone).
    pub useful_sum: f64,
    /// Σ over the measured ticks of the fragmented shares.
    pub fragmented_sum: f64,
    /// Ticks measured.
    pub measured_ticks: u64,
    /// Classes with a learned profile at the end.
    pub learned_classes: usize,
    /// Virtual seconds until the last job finished.
    pub makespan: f64,
}

/// A job's demand on one device in one tick: `(job id, demand, memory intensity)`.
type Tenant<'a> = (&'a str, f64, f64);

/// A job holding devices.
struct Live {
    index: usize,
    node: String,
    /// Device index and the fraction of the job's per-device demand it carries.
    devices: Vec<(u32, f64)>,
    demand: Demand,
    remaining: f64,
}

/// Replays `jobs` (sorted by arrival) under `mode`.
///
/// # Errors
/// A simulated node is refused, or jobs are left unfinished far past the last arrival.
#[expect(clippy::too_many_lines, reason = "the replay loop reads as one piece")]
pub fn run(
    jobs: &[Job],
    mode: Placement,
    config: &SimConfig,
    seed: u64,
) -> Result<ModeRun, SimError> {
    let mut sched = Scheduler::new(SchedulerConfig {
        strategy: mode,
        scoring: config.scoring,
        ..SchedulerConfig::default()
    });
    for report in config.cluster.reports() {
        sched.register(report, &[])?;
    }
    let dt = config.tick_secs;
    let gpus = f64::from(config.cluster.gpus().max(1));
    let warm = warmup_count(jobs.len(), config.warmup);
    let window = (
        jobs.get(warm).map_or(0.0, |j| j.arrival),
        jobs.last().map_or(0.0, |j| j.arrival),
    );
    let index_of: BTreeMap<&str, usize> = jobs
        .iter()
        .enumerate()
        .map(|(i, j)| (j.id.as_str(), i))
        .collect();
    let mut outcomes: Vec<Option<Outcome>> = vec![None; jobs.len()];
    let mut starts: Vec<f64> = vec![0.0; jobs.len()];
    let mut rejected = Vec::new();
    let mut live: BTreeMap<String, Live> = BTreeMap::new();
    let mut waiting = 0usize;
    let mut next = 0usize;
    let mut run = ModeRun {
        mode,
        outcomes: Vec::new(),
        rejected: Vec::new(),
        utilization_sum: 0.0,
        useful_sum: 0.0,
        fragmented_sum: 0.0,
        measured_ticks: 0,
        learned_classes: 0,
        makespan: 0.0,
    };
    // Generous: every job alone, one after another, after the last arrival.
    let limit = window.1 + jobs.iter().map(|j| j.work).sum::<f64>() + 1e6;
    let mut tick: u64 = 0;
    loop {
        let t = tick as f64 * dt;
        while let Some(job) = jobs.get(next).filter(|j| j.arrival <= t) {
            next += 1;
            let requested = match job.requested() {
                Ok(r) => r,
                Err(e) => {
                    rejected.push((job.id.clone(), e.to_string()));
                    continue;
                }
            };
            match sched.create(NewSession {
                id: job.id.clone(),
                owner: "sim".into(),
                requested,
                class: job.class.clone(),
                ..NewSession::default()
            }) {
                Ok(_) => waiting += 1,
                Err(e) => rejected.push((job.id.clone(), e.to_string())),
            }
        }
        for command in sched.pass() {
            let Command::Allocate {
                node,
                session,
                allocation,
                ..
            } = command
            else {
                continue;
            };
            sched.ack(&node, &session);
            let Some(&index) = index_of.get(session.as_str()) else {
                continue;
            };
            waiting = waiting.saturating_sub(1);
            starts[index] = t;
            let job = &jobs[index];
            let demand = Demand::new(&job.class, Rng::stream(seed, index as u64));
            live.insert(
                session,
                Live {
                    index,
                    node,
                    devices: spread_demand(&allocation),
                    demand,
                    remaining: job.work,
                },
            );
        }
        // Each job's demand this tick, gathered per device.
        let mut devices: BTreeMap<(&str, u32), Vec<Tenant<'_>>> = BTreeMap::new();
        for (id, job) in &mut live {
            let u = job.demand.draw();
            let beta = job.demand.memory_intensity();
            for &(d, weight) in &job.devices {
                devices.entry((job.node.as_str(), d)).or_default().push((
                    id.as_str(),
                    u * weight,
                    beta,
                ));
            }
        }
        // Per job: slowest rate over its devices, and utilization got (summed, for the mean).
        let mut got: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        let mut busy = 0.0;
        let mut useful = 0.0;
        for tenants in devices.values() {
            let shares = contend(&tenants.iter().map(|&(_, u, b)| (u, b)).collect::<Vec<_>>());
            busy += shares.iter().map(|s| s.delivered).sum::<f64>().min(1.0);
            useful += shares.iter().map(|s| s.useful).sum::<f64>().min(1.0);
            for (&(id, _, _), share) in tenants.iter().zip(shares) {
                let entry = got.entry(id.to_owned()).or_insert((f64::INFINITY, 0.0));
                entry.0 = entry.0.min(share.rate);
                entry.1 += share.delivered;
            }
        }
        let report = config.report_every.max(1);
        let mut finished = Vec::new();
        for (id, job) in &mut live {
            let Some(&(rate, delivered)) = got.get(id) else {
                continue;
            };
            if tick.is_multiple_of(u64::from(report)) {
                let devices = job.devices.len().max(1) as f64;
                sched.record_usage(
                    &job.node,
                    id,
                    UsageSample {
                        utilization: delivered / devices,
                        memory_bytes: 0,
                        ioctls_per_sec: 0.0,
                    },
                );
            }
            let step = rate * dt;
            if step >= job.remaining {
                let finish = t + job.remaining / rate;
                let j = &jobs[job.index];
                outcomes[job.index] = Some(Outcome {
                    arrival: j.arrival,
                    start: starts[job.index],
                    finish,
                    work: j.work,
                });
                run.makespan = run.makespan.max(finish);
                finished.push(id.clone());
            } else {
                job.remaining -= step;
            }
        }
        if t >= window.0 && t < window.1 {
            run.utilization_sum += busy / gpus;
            run.useful_sum += useful / gpus;
            run.fragmented_sum += fragmented_shares(&sched);
            run.measured_ticks += 1;
        }
        for id in finished {
            live.remove(&id);
            sched.terminate_released(&id);
        }
        if next == jobs.len() && live.is_empty() && waiting == 0 {
            break;
        }
        tick += 1;
        if tick as f64 * dt > limit {
            return Err(SimError::Stuck {
                mode,
                at_secs: t,
                left: live.len() + waiting + (jobs.len() - next),
            });
        }
    }
    run.outcomes = outcomes;
    run.rejected = rejected;
    run.learned_classes = sched.profiles().iter().count();
    Ok(run)
}

/// Each device of an allocation with the part of the job's demand it carries. Whole devices
/// (`cuda.device=N`) are data-parallel workers: each runs at the job's demand. Shares split
/// over devices carry the job's `⌈shares⌉` device-equivalents of demand in proportion to
/// their parts: 0.81 split 0.41 + 0.40 puts about half the job on each device, 1.76 split
/// 0.88 + 0.88 a full worker on each.
fn spread_demand(allocation: &Allocation) -> Vec<(u32, f64)> {
    let total: f64 = allocation.parts.iter().map(|p| p.shares.as_f64()).sum();
    let workers = total.ceil().max(1.0);
    allocation
        .parts
        .iter()
        .map(|p| {
            let weight = if p.exclusive || total <= 0.0 {
                1.0
            } else {
                (p.shares.as_f64() / total * workers).min(1.0)
            };
            (p.index, weight)
        })
        .collect()
}

/// Jobs excluded from the metrics at the start of a trace.
#[must_use]
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "a clamped share of the job count"
)]
pub fn warmup_count(jobs: usize, warmup: f64) -> usize {
    ((jobs as f64 * warmup.clamp(0.0, 1.0)).floor() as usize).min(jobs.saturating_sub(1))
}
