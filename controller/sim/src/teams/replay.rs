//! The replay of a team trace under one way of sharing: the controller's [`Scheduler`] on a
//! virtual clock, every `Allocate` acknowledged at once.
//!
//! A placed job runs its `work` in virtual seconds: quotas decide who holds which shares, not how
//! co-located jobs slow each other, so this replay leaves the contention model out and the two
//! ways of sharing differ only in the queue. A `Preempt` from a pass is modelled as a real
//! agent carries it out: the workload keeps its shares until the grace period
//! (`preemption_grace_ms`) is over, then stops and the agent reports it `preempted`; the GPU-time
//! of that run counts as lost, and the job is requeued as a new session of the same owner that
//! runs again from the start (as Kueue requeues an evicted workload; no checkpoints).
//!
//! Under [`Sharing::QueuesWithSuspend`] (issue 38, docs/suspend.md) every session asks to be
//! suspended, and the same `Preempt` suspends instead: the workload stops [`SUSPEND_SECS`] after
//! the decision (its GPU memory copied to the host) and the agent reports it `suspended`; the
//! scheduler keeps the session with its home, as the controller does, and its own `Resume`
//! decides when and where it comes back: on its node, on the GPUs it left or others of the same
//! model. The resumed session runs only the work left, plus [`RESUME_SECS`] to copy the memory
//! back. The GPU-time lost is those two copies. Under [`Sharing::QueuesWithSuspendRefusing`] the
//! driver refuses the jobs [`checkpoint_refused`] picks, and the agent falls back to the kill
//! path as it does (its grace period, then a `preempted` report; the job starts over). What this
//! leaves out: the suspended workload's host memory beyond the scheduler's booking.
//!
//! Each tick: runs that end by now end (finished: terminated; preempted: reported, and the job
//! requeued), jobs that have arrived are created, a pass runs. Nothing reads the wall clock.

use std::collections::BTreeMap;

use serde::Serialize;

use gpuwarden_controller::{
    placement::Placement,
    scheduler::{Command, NewSession, Scheduler, SchedulerConfig, quotas::QuotaConfig},
    session::{Action, EnforcementEvent, PreemptionMode},
    slots::names,
};

use super::TeamTrace;
use crate::sharing::Sharing;
use crate::{SimConfig, SimError, trace::Job};

/// Seconds from a suspension's decision to the workload's stop: its GPU memory copied to the
/// host. An assumption, not a measurement: a user report of ~15 s per GPU to checkpoint an
/// 80 GB H100 (NVIDIA/cuda-checkpoint issue 29); `cargo xtask gpu-check` measures ours.
pub const SUSPEND_SECS: f64 = 15.0;

/// Seconds a resumed workload spends copying its memory back before it runs again (the same
/// assumption).
pub const RESUME_SECS: f64 = 15.0;

/// One run of a job: from its placement to its end.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobRun {
    /// The node it ran on.
    pub node: String,
    /// Placement, s.
    pub start: f64,
    /// End, s: its work done, or stopped at the end of its grace period.
    pub end: f64,
    /// Whether it was preempted.
    pub preempted: bool,
    /// Seconds of it whose GPU-time was lost: all of a killed run; a suspended run's copy to
    /// the host and its resumption's copy back.
    pub lost_secs: f64,
}

/// What happened to one job of the trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobOutcome {
    /// Arrival, s.
    pub arrival: f64,
    /// Its first placement, s (`None`: refused at creation).
    pub first_start: Option<f64>,
    /// When its work was done, s.
    pub finish: Option<f64>,
    /// GPUs it holds while it runs (`cuda.shares` + `cuda.device`).
    pub gpus: f64,
    /// Whether it was submitted while its team was within its guarantee: the team's jobs not
    /// yet done (running, waiting or requeued), this one included, asked for at most the
    /// guarantee (in this replay; the same test with or without queues).
    pub within_guarantee: bool,
    /// Its runs, in order: all preempted but the last.
    pub runs: Vec<JobRun>,
}

impl JobOutcome {
    /// GPU-seconds its runs held.
    #[must_use]
    pub fn gpu_seconds(&self) -> f64 {
        self.runs
            .iter()
            .fold(0.0, |a, r| a + self.gpus * (r.end - r.start))
    }

    /// GPU-seconds its preemptions lost.
    #[must_use]
    pub fn lost_gpu_seconds(&self) -> f64 {
        self.runs
            .iter()
            .fold(0.0, |a, r| a + self.gpus * r.lost_secs)
    }
}

/// The raw results of one way of sharing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SharingRun {
    /// How the cluster was shared.
    pub sharing: Sharing,
    /// Per trace job, in arrival order.
    pub outcomes: Vec<JobOutcome>,
    /// Jobs refused at creation, with the scheduler's reason.
    pub rejected: Vec<(String, String)>,
    /// Σ over the ticks from the first to the last arrival of the GPUs held, as a fraction of
    /// the cluster's.
    pub allocated_sum: f64,
    /// Those ticks.
    pub measured_ticks: u64,
    /// Preemptions carried out (runs that ended preempted).
    pub preemptions: usize,
    /// Σ of the GPU-seconds the preempted runs held.
    pub lost_gpu_seconds: f64,
    /// Virtual seconds until the last job finished.
    pub makespan: f64,
}

/// A run holding shares.
struct Live {
    index: usize,
    node: String,
    start: f64,
    /// When its work is done.
    done: f64,
    /// When it stops, once preempted.
    stop: Option<f64>,
    /// When it was told to suspend (`QueuesWithSuspend`).
    suspended_at: Option<f64>,
}

/// GPUs a job holds while it runs.
pub(super) fn gpus_of(job: &Job) -> f64 {
    job.requested().map_or(0.0, |r| {
        r.get(names::CUDA_SHARES).as_f64() + r.get(names::CUDA_DEVICE).as_f64()
    })
}

/// Whether the driver refuses to checkpoint the job at `index` of a trace, under
/// [`Sharing::QueuesWithSuspendRefusing`]: one job in four, spread over the trace by a fixed
/// hash of its index (the same jobs in every run). NVIDIA documents what it refuses (UVM or
/// managed memory, IPC handles, multi-process contexts); how many jobs of a real cluster hold
/// such is not known, so the row shows what a quarter of them would cost.
#[must_use]
pub fn checkpoint_refused(index: usize) -> bool {
    // The top two bits of a Fibonacci hash: 0 for one index in four.
    (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 62 == 0
}

/// Replays `trace` on `config.cluster` (its tick; binpack placement) under `sharing`.
///
/// # Errors
/// A simulated node is refused, or jobs are left unfinished far past the last arrival.
pub fn replay(
    trace: &TeamTrace,
    sharing: Sharing,
    config: &SimConfig,
) -> Result<SharingRun, SimError> {
    replay_refusing(trace, sharing, config, &checkpoint_refused)
}

/// [`replay`], with `refused` picking (by index in the trace) the jobs the driver refuses to
/// checkpoint under [`Sharing::QueuesWithSuspendRefusing`].
///
/// # Errors
/// As [`replay`].
#[expect(clippy::too_many_lines, reason = "the replay loop reads as one piece")]
pub fn replay_refusing(
    trace: &TeamTrace,
    sharing: Sharing,
    config: &SimConfig,
    refused: &dyn Fn(usize) -> bool,
) -> Result<SharingRun, SimError> {
    let jobs = &trace.jobs;
    let quotas = match sharing {
        Sharing::NoQueues => QuotaConfig::default(),
        Sharing::QueuesWithReclaim
        | Sharing::QueuesWithSuspend
        | Sharing::QueuesWithSuspendRefusing => trace.quotas.clone(),
    };
    let suspends = matches!(
        sharing,
        Sharing::QueuesWithSuspend | Sharing::QueuesWithSuspendRefusing
    );
    let checkpoint_refuses =
        |index: usize| sharing == Sharing::QueuesWithSuspendRefusing && refused(index);
    // Work each job has left to run (a suspended job keeps what it did).
    let mut work_left: Vec<f64> = jobs.iter().map(|j| j.work).collect();
    let mut sched = Scheduler::new(SchedulerConfig {
        strategy: Placement::Binpack,
        quotas,
        ..SchedulerConfig::default()
    });
    for report in config.cluster.reports() {
        sched.register(report, &[])?;
    }
    let dt = config.tick_secs;
    let gpus = f64::from(config.cluster.gpus().max(1));
    let window = (
        jobs.first().map_or(0.0, |j| j.arrival),
        jobs.last().map_or(0.0, |j| j.arrival),
    );
    let mut outcomes: Vec<JobOutcome> = jobs
        .iter()
        .map(|j| JobOutcome {
            arrival: j.arrival,
            first_start: None,
            finish: None,
            gpus: gpus_of(j),
            within_guarantee: false,
            runs: Vec::new(),
        })
        .collect();
    // Each team's guarantee, and the GPUs its jobs not yet done ask for.
    let team_of: Vec<Option<&str>> = jobs.iter().map(|j| trace.queue_of(j)).collect();
    let guaranteed: BTreeMap<&str, f64> = trace
        .quotas
        .queues
        .iter()
        .map(|(name, q)| (name.as_str(), q.guaranteed.get(names::CUDA_SHARES).as_f64()))
        .collect();
    let mut outstanding: BTreeMap<&str, f64> = BTreeMap::new();
    let mut run = SharingRun {
        sharing,
        outcomes: Vec::new(),
        rejected: Vec::new(),
        allocated_sum: 0.0,
        measured_ticks: 0,
        preemptions: 0,
        lost_gpu_seconds: 0.0,
        makespan: 0.0,
    };
    // Session id → job index; a requeued job gets a new session (`t00042~1`, `~2`, …).
    let mut index_of: BTreeMap<String, usize> = BTreeMap::new();
    let mut attempts: Vec<u32> = vec![0; jobs.len()];
    let mut live: BTreeMap<String, Live> = BTreeMap::new();
    // Suspended sessions (`QueuesWithSuspend`), each with its node, until the scheduler resumes
    // them; counted among the waiting.
    let mut suspended: BTreeMap<String, String> = BTreeMap::new();
    let mut waiting = 0usize;
    let mut next = 0usize;
    let limit = window.1 + jobs.iter().map(|j| j.work).sum::<f64>() + 1e6;
    let create = |sched: &mut Scheduler, id: String, job: &Job| {
        let requested = job.requested().map_err(|e| e.to_string())?;
        sched
            .create(NewSession {
                id,
                owner: job.owner.clone().unwrap_or_else(|| "sim".to_owned()),
                requested,
                class: job.class.clone(),
                preemption: suspends.then_some(PreemptionMode::Suspend),
                ..NewSession::default()
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let mut tick: u64 = 0;
    loop {
        let t = tick as f64 * dt;
        // Runs that end by now: work done, or stopped at the end of their grace period.
        let due: Vec<String> = live
            .iter()
            .filter(|(_, l)| l.done.min(l.stop.unwrap_or(f64::INFINITY)) <= t)
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            let Some(l) = live.remove(&id) else { continue };
            let outcome = &mut outcomes[l.index];
            match l.stop.filter(|&stop| stop < l.done) {
                None => {
                    outcome.runs.push(JobRun {
                        node: l.node.clone(),
                        start: l.start,
                        end: l.done,
                        preempted: false,
                        lost_secs: 0.0,
                    });
                    outcome.finish = Some(l.done);
                    run.makespan = run.makespan.max(l.done);
                    if let Some(team) = team_of[l.index] {
                        *outstanding.entry(team).or_default() -= outcome.gpus;
                    }
                    sched.terminate_released(&id);
                }
                Some(stop) => {
                    // Suspended: the work until the suspension is kept; lost are the copy to
                    // the host now and the copy back that its resumption runs first. Killed:
                    // all of it, and the job starts over.
                    let lost_secs = if let Some(at) = l.suspended_at {
                        let kept = (at - l.start).max(0.0);
                        work_left[l.index] = (work_left[l.index] - kept).max(0.0) + RESUME_SECS;
                        (stop - at) + RESUME_SECS
                    } else {
                        work_left[l.index] = jobs[l.index].work;
                        stop - l.start
                    };
                    outcome.runs.push(JobRun {
                        node: l.node.clone(),
                        start: l.start,
                        end: stop,
                        preempted: true,
                        lost_secs,
                    });
                    run.preemptions += 1;
                    run.lost_gpu_seconds += outcome.gpus * lost_secs;
                    if l.suspended_at.is_some() {
                        // The same session, suspended with its home until the scheduler
                        // resumes it.
                        let event = EnforcementEvent {
                            action: Action::Suspended,
                            reason: "suspended: its GPU memory copied to the host".into(),
                            ..EnforcementEvent::default()
                        };
                        sched.record_event(&l.node, &id, event);
                        suspended.insert(id, l.node);
                        waiting += 1;
                        continue;
                    }
                    let event = EnforcementEvent {
                        action: Action::Preempted,
                        reason: "stopped at the end of its grace period".into(),
                        ..EnforcementEvent::default()
                    };
                    sched.record_event(&l.node, &id, event);
                    // Requeued: a new session that runs the job again from the start.
                    attempts[l.index] += 1;
                    let job = &jobs[l.index];
                    let again = format!("{}~{}", job.id, attempts[l.index]);
                    match create(&mut sched, again.clone(), job) {
                        Ok(()) => {
                            index_of.insert(again, l.index);
                            waiting += 1;
                        }
                        Err(e) => run.rejected.push((again, e)),
                    }
                }
            }
            index_of.remove(&id);
        }
        while let Some(job) = jobs.get(next).filter(|j| j.arrival <= t) {
            if let Some(team) = team_of[next] {
                let demand = outstanding.entry(team).or_default();
                *demand += outcomes[next].gpus;
                // A little slack: the sum of float shares, not the exact slots.
                outcomes[next].within_guarantee =
                    *demand <= guaranteed.get(team).copied().unwrap_or(0.0) + 1e-9;
            }
            match create(&mut sched, job.id.clone(), job) {
                Ok(()) => {
                    index_of.insert(job.id.clone(), next);
                    waiting += 1;
                }
                Err(e) => run.rejected.push((job.id.clone(), e)),
            }
            next += 1;
        }
        for command in sched.pass() {
            match command {
                Command::Allocate { node, session, .. } => {
                    sched.ack(&node, &session);
                    let Some(&index) = index_of.get(&session) else {
                        continue;
                    };
                    waiting = waiting.saturating_sub(1);
                    outcomes[index].first_start.get_or_insert(t);
                    live.insert(
                        session,
                        Live {
                            index,
                            node,
                            start: t,
                            done: t + work_left[index],
                            stop: None,
                            suspended_at: None,
                        },
                    );
                }
                Command::Preempt {
                    session, grace_ms, ..
                } => {
                    if let Some(l) = live.get_mut(&session) {
                        // A refused checkpoint goes the kill way: the grace period, then
                        // `preempted`, as the agent falls back.
                        if suspends && !checkpoint_refuses(l.index) {
                            l.stop.get_or_insert(t + SUSPEND_SECS);
                            l.suspended_at.get_or_insert(t);
                        } else {
                            l.stop.get_or_insert(t + f64::from(grace_ms) / 1000.0);
                        }
                    }
                }
                Command::Resume { node, session, .. } => {
                    let (Some(home), Some(&index)) =
                        (suspended.remove(&session), index_of.get(&session))
                    else {
                        continue;
                    };
                    debug_assert_eq!(home, node, "a suspended session resumes on its node");
                    waiting = waiting.saturating_sub(1);
                    let event = EnforcementEvent {
                        action: Action::Resumed,
                        reason: "resumed: its GPU memory copied back".into(),
                        ..EnforcementEvent::default()
                    };
                    sched.record_event(&node, &session, event);
                    live.insert(
                        session,
                        Live {
                            index,
                            node,
                            start: t,
                            done: t + work_left[index],
                            stop: None,
                            suspended_at: None,
                        },
                    );
                }
                Command::Release { .. } | Command::MakeMigInstance { .. } => {}
            }
        }
        if t >= window.0 && t < window.1 {
            let held: f64 = live.values().map(|l| outcomes[l.index].gpus).sum();
            run.allocated_sum += held / gpus;
            run.measured_ticks += 1;
        }
        // Ended sessions are of no more use to the replay: forgetting them keeps each pass's
        // look at what every queue holds as short as in a controller with retention.
        if tick.is_multiple_of(360) {
            sched.forget_ended(i64::MAX);
            sched.take_changes();
        }
        if next == jobs.len() && live.is_empty() && waiting == 0 {
            break;
        }
        tick += 1;
        if tick as f64 * dt > limit {
            return Err(SimError::SharingStuck {
                sharing,
                at_secs: t,
                left: live.len() + waiting + (jobs.len() - next),
            });
        }
    }
    run.outcomes = outcomes;
    Ok(run)
}
