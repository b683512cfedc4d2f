//! The replay loop: one placement mode, a fresh [`Scheduler`], the trace on a virtual clock.
//!
//! Each tick: jobs that have arrived are created as sessions; a scheduling pass runs and
//! every `Allocate` is acknowledged at once (the simulated agents never refuse); each running
//! job draws its demand, the devices share themselves out by the ground truth
//! ([`super::cluster::contend`]), jobs progress, the agents report what each job got every
//! `report_every` ticks, and finished jobs are terminated (which teaches their class
//! profile). Nothing reads the wall clock: the scheduler's decisions depend on the order of
//! calls only.
//!
//! With MIG nodes ([`SimConfig::mig_nodes`]) the simulator also plays their agents
//! ([`super::mig`]): after the pass it makes each instance the controller orders
//! (`MakeMigInstance`) and registers the node again; at the end of each tick it destroys the
//! instances it made that no job holds any more (or that none took within their grace) and
//! registers again.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use gpuwarden_controller::{
    allocator::Allocation,
    metrics::fragmented_shares,
    placement::Placement,
    profile::UsageSample,
    scheduler::{Command, NewSession, RegisterError, Scheduler, SchedulerConfig, mig_demand},
};

use super::{
    SimConfig,
    cluster::{Demand, contend},
    mig::{MakeError, MigNode},
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
    /// What happened on the MIG nodes (`None` without them).
    pub mig: Option<MigRun>,
}

/// What happened on the MIG nodes of one replay (all of the trace, warm-up included).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MigRun {
    /// Jobs asking for a MIG profile that became sessions.
    pub requests: usize,
    /// Of those, placed.
    pub placed: usize,
    /// Σ of their waits (placement − arrival), s.
    pub wait_sum: f64,
    /// `MakeMigInstance` orders received.
    pub orders: u64,
    /// Orders the simulated agent refused (a placement the hardware would refuse).
    pub refused: u64,
    /// Instances made.
    pub made: u64,
    /// Instances destroyed.
    pub destroyed: u64,
    /// Most instances made and not yet destroyed at once.
    pub peak_made: u64,
}

/// What a replay shows an observer at each step: after the pass (and the instances it
/// ordered made), and at the end of the tick (jobs finished, idle instances destroyed).
pub struct Step<'a> {
    /// Virtual time, s.
    pub t: f64,
    /// The scheduler.
    pub sched: &'a Scheduler,
    /// The MIG nodes' agents, by node id.
    pub mig: &'a BTreeMap<String, MigNode>,
    /// The jobs the simulated agents hold.
    live: &'a BTreeMap<String, Live>,
}

impl Step<'_> {
    /// What the simulated agents hold: each running job's session, node and device indexes.
    #[must_use]
    pub fn held(&self) -> Vec<(&str, &str, Vec<u32>)> {
        self.live
            .iter()
            .map(|(id, job)| {
                (
                    id.as_str(),
                    job.node.as_str(),
                    job.devices.iter().map(|&(d, _)| d).collect(),
                )
            })
            .collect()
    }
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
pub fn run(
    jobs: &[Job],
    mode: Placement,
    config: &SimConfig,
    seed: u64,
) -> Result<ModeRun, SimError> {
    run_observed(jobs, mode, config, seed, &mut |_| {})
}

/// [`run`], showing `observe` each [`Step`].
///
/// # Errors
/// As [`run`].
#[expect(clippy::too_many_lines, reason = "the replay loop reads as one piece")]
pub fn run_observed(
    jobs: &[Job],
    mode: Placement,
    config: &SimConfig,
    seed: u64,
    observe: &mut dyn FnMut(&Step<'_>),
) -> Result<ModeRun, SimError> {
    let mut sched = Scheduler::new(SchedulerConfig {
        strategy: mode,
        scoring: config.scoring,
        ..SchedulerConfig::default()
    });
    // The last `mig_nodes` nodes are in MIG mode; the others as without them.
    let mig_nodes = config.mig_nodes.min(config.cluster.nodes);
    let plain = (config.cluster.nodes - mig_nodes) as usize;
    for report in config.cluster.reports().into_iter().take(plain) {
        sched.register(report, &[])?;
    }
    let mut agents: BTreeMap<String, MigNode> = BTreeMap::new();
    for n in config.cluster.nodes - mig_nodes..config.cluster.nodes {
        let node = MigNode::new(
            &format!("sim-{n:03}"),
            config.cluster.gpus_per_node,
            (config.cluster.gpus_per_node / 2).max(1),
        );
        sched.register(node.report(), &[])?;
        agents.insert(node.id.clone(), node);
    }
    let mut mig_run = (mig_nodes > 0).then(MigRun::default);
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
        mig: None,
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
            let profile = job.asks_mig();
            match sched.create(NewSession {
                id: job.id.clone(),
                owner: "sim".into(),
                requested,
                class: job.class.clone(),
                ..NewSession::default()
            }) {
                Ok(_) => {
                    waiting += 1;
                    if let Some(m) = mig_run.as_mut().filter(|_| profile) {
                        m.requests += 1;
                    }
                }
                Err(e) => rejected.push((job.id.clone(), e.to_string())),
            }
        }
        let mut orders = VecDeque::new();
        for command in sched.pass() {
            let (node, session, allocation) = match command {
                Command::Allocate {
                    node,
                    session,
                    allocation,
                    ..
                } => (node, session, allocation),
                make @ Command::MakeMigInstance { .. } => {
                    orders.push_back(make);
                    continue;
                }
                _ => continue,
            };
            sched.ack(&node, &session);
            let Some(&index) = index_of.get(session.as_str()) else {
                continue;
            };
            waiting = waiting.saturating_sub(1);
            starts[index] = t;
            if let Some(m) = mig_run.as_mut()
                && jobs[index].asks_mig()
            {
                m.placed += 1;
                m.wait_sum += t - jobs[index].arrival;
            }
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
        if let Some(m) = mig_run.as_mut() {
            make_ordered(&mut sched, &mut agents, &live, orders, m, t)?;
        }
        observe(&Step {
            t,
            sched: &sched,
            mig: &agents,
            live: &live,
        });
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
        for (&(node, index), tenants) in &devices {
            let shares = contend(&tenants.iter().map(|&(_, u, b)| (u, b)).collect::<Vec<_>>());
            // A MIG instance is its compute slices' part of a GPU.
            let weight = agents
                .get(node)
                .and_then(|a| a.weight(index))
                .unwrap_or(1.0);
            busy += weight * shares.iter().map(|s| s.delivered).sum::<f64>().min(1.0);
            useful += weight * shares.iter().map(|s| s.useful).sum::<f64>().min(1.0);
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
        if let Some(m) = mig_run.as_mut() {
            sweep(&mut sched, &mut agents, &live, m, t)?;
        }
        observe(&Step {
            t,
            sched: &sched,
            mig: &agents,
            live: &live,
        });
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
    run.mig = mig_run;
    Ok(run)
}

/// The sessions the simulated agent of `node` holds, and the devices they hold there.
fn held_on(live: &BTreeMap<String, Live>, node: &str) -> (Vec<String>, BTreeSet<u32>) {
    let mut sessions = Vec::new();
    let mut devices = BTreeSet::new();
    for (id, job) in live.iter().filter(|(_, j)| j.node == node) {
        sessions.push(id.clone());
        devices.extend(job.devices.iter().map(|&(d, _)| d));
    }
    (sessions, devices)
}

/// The simulated agents make the instances `orders` ask for, each registering again after its
/// change (or refusing as the real agent does, with an `AllocationNack`); orders the
/// registration sends again are carried out too.
fn make_ordered(
    sched: &mut Scheduler,
    agents: &mut BTreeMap<String, MigNode>,
    live: &BTreeMap<String, Live>,
    mut orders: VecDeque<Command>,
    m: &mut MigRun,
    t: f64,
) -> Result<(), SimError> {
    // An instance ordered again in one round: the registration after its making did not show
    // it where the controller asked for it. Refused rather than made again, so a
    // wrong layout can't loop here.
    let mut ordered = BTreeSet::new();
    while let Some(order) = orders.pop_front() {
        let Command::MakeMigInstance {
            node,
            session,
            gpu_uuid,
            profile,
            start,
        } = order
        else {
            continue;
        };
        m.orders += 1;
        let Some(agent) = agents.get_mut(&node) else {
            continue;
        };
        let made = if ordered.insert((session.clone(), gpu_uuid.clone(), start)) {
            agent.make(&gpu_uuid, &profile, start, t)
        } else {
            Err(MakeError::Again)
        };
        match made {
            Ok(_) => {
                m.made += 1;
                let (running, _) = held_on(live, &node);
                let again = sched.register(agent.report(), &running)?;
                orders.extend(
                    again
                        .into_iter()
                        .filter(|c| matches!(c, Command::MakeMigInstance { .. })),
                );
            }
            Err(e) => {
                m.refused += 1;
                // A refused instance leaves nothing to release (no gang is made instances).
                let _ = sched.nack(&node, &session, mig_demand::REFUSED, &e.to_string());
            }
        }
    }
    m.peak_made = m.peak_made.max(m.made - m.destroyed);
    Ok(())
}

/// Each simulated agent's heartbeat: instances it made that no job holds are destroyed when
/// due, and the node registers again after a change.
fn sweep(
    sched: &mut Scheduler,
    agents: &mut BTreeMap<String, MigNode>,
    live: &BTreeMap<String, Live>,
    m: &mut MigRun,
    t: f64,
) -> Result<(), SimError> {
    let mut again = VecDeque::new();
    for (id, agent) in agents.iter_mut() {
        let (running, held) = held_on(live, id);
        let before = agent.changes().1;
        if agent.sweep(&held, t) {
            m.destroyed += agent.changes().1 - before;
            again.extend(
                sched
                    .register(agent.report(), &running)?
                    .into_iter()
                    .filter(|c| matches!(c, Command::MakeMigInstance { .. })),
            );
        }
    }
    make_ordered(sched, agents, live, again, m, t)
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
