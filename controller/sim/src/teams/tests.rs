use std::collections::BTreeMap;

use gpuwarden_controller::scheduler::SchedulerConfig;

use super::*;
use crate::cluster::ClusterShape;

fn config(nodes: u32) -> SimConfig {
    SimConfig {
        cluster: ClusterShape {
            nodes,
            gpus_per_node: 8,
        },
        ..SimConfig::default()
    }
}

fn job(id: &str, owner: &str, arrival: f64, shares: &str, work: f64) -> Job {
    Job {
        id: id.into(),
        arrival,
        slots: vec![format!("cuda.shares={shares}")],
        class: "train-0".into(),
        work,
        owner: Some(owner.into()),
    }
}

/// One node of 8 GPUs; teams a and b guaranteed 4 each. b takes the whole node for ten hours at
/// t = 0 (borrowing a's 4); a asks for 2 GPUs at t = 600.
fn borrower_holds_the_cluster() -> TeamTrace {
    TeamTrace {
        quotas: quotas(&two_teams(), 8),
        ..borrower_holds_the_cluster_jobs()
    }
}

/// Teams a and b, each guaranteed half the cluster.
fn two_teams() -> [Team; 2] {
    [
        Team {
            name: "a",
            members: &["alice"],
            guaranteed: 0.5,
            limit: None,
            activity: Activity::Steady { load: 0.0 },
            sizes: &[(1.0, 1.0)],
            median_work: 3600.0,
            family: "train",
        },
        Team {
            name: "b",
            members: &["bob"],
            guaranteed: 0.5,
            limit: None,
            activity: Activity::Steady { load: 0.0 },
            sizes: &[(1.0, 1.0)],
            median_work: 3600.0,
            family: "train",
        },
    ]
}

/// The jobs of [`borrower_holds_the_cluster`].
fn borrower_holds_the_cluster_jobs() -> TeamTrace {
    let mut jobs: Vec<Job> = (1..=8)
        .map(|i| job(&format!("b{i}"), "bob", 0.0, "1", 36_000.0))
        .collect();
    jobs.push(job("a1", "alice", 600.0, "1", 3600.0));
    jobs.push(job("a2", "alice", 600.0, "1", 3600.0));
    TeamTrace {
        quotas: QuotaConfig::default(),
        jobs,
    }
}

fn index(trace: &TeamTrace, id: &str) -> usize {
    trace.jobs.iter().position(|j| j.id == id).unwrap()
}

#[test]
fn within_guarantee_jobs_start_no_later_with_queues_and_borrowers_are_preempted() {
    let trace = borrower_holds_the_cluster();
    let config = config(1);
    let today = replay(&trace, Sharing::NoQueues, &config).unwrap();
    let queues = replay(&trace, Sharing::QueuesWithReclaim, &config).unwrap();
    for id in ["a1", "a2"] {
        let i = index(&trace, id);
        let (before, after) = (&today.outcomes[i], &queues.outcomes[i]);
        assert!(before.within_guarantee && after.within_guarantee, "{id}");
        let (before, after) = (before.first_start.unwrap(), after.first_start.unwrap());
        assert!(after <= before, "{id}: {after} > {before}");
        // Without queues a waits for b's jobs to end; with them, one grace period per victim
        // (30 s, victims one at a time as FIFO tries a's jobs).
        assert!((before - 36_000.0).abs() < 1e-9, "{id}: {before}");
        assert!(after <= 600.0 + 2.0 * 30.0 + 10.0, "{id}: {after}");
    }
    assert_eq!(today.preemptions, 0);
    assert!(today.lost_gpu_seconds.abs() < 1e-9);
    assert_eq!(queues.preemptions, 2);
    // b's two newest jobs yield, each after its grace period, and run again from the start once
    // there is room: borrowing again as soon as a's jobs end.
    let mut preempted_runs = 0;
    let mut lost = 0.0;
    for (i, o) in queues.outcomes.iter().enumerate() {
        for r in o.runs.iter().filter(|r| r.preempted) {
            preempted_runs += 1;
            lost += o.gpus * (r.end - r.start);
            assert!(trace.jobs[i].id.starts_with('b'), "{o:?}");
        }
        let finished = o.runs.last().unwrap();
        assert!(!finished.preempted, "{o:?}");
        assert!(
            (finished.end - finished.start - trace.jobs[i].work).abs() < 1e-9,
            "{o:?}"
        );
    }
    assert_eq!(preempted_runs, queues.preemptions);
    assert!((lost - queues.lost_gpu_seconds).abs() < 1e-9);
    // b8 ran 0..630 and b7 0..660: 1,290 GPU-seconds lost.
    assert!(
        (queues.lost_gpu_seconds - 1290.0).abs() < 1e-9,
        "{queues:?}"
    );
    let b8 = &queues.outcomes[index(&trace, "b8")];
    assert_eq!(b8.runs.len(), 2, "{b8:?}");
    assert!((b8.runs[1].start - (630.0 + 3600.0)).abs() < 1e-9, "{b8:?}");
    assert!(
        (b8.finish.unwrap() - (4230.0 + 36_000.0)).abs() < 1e-9,
        "{b8:?}"
    );
    let report = TeamReport::new(&trace, &[today, queues], (1, 8), 0, 30.0);
    let a = report.team("a", Sharing::QueuesWithReclaim).unwrap();
    assert_eq!((a.within_jobs, a.preempted), (2, 0));
    let b = report.team("b", Sharing::QueuesWithReclaim).unwrap();
    assert_eq!(b.preempted, 2);
    assert!((b.lost_gpu_hours - 1290.0 / 3600.0).abs() < 1e-9);
}

/// The same trace with reclaim suspending: the victims stop after the copy to the host, not a
/// grace period, keep the work they did, and lose only the two copies (15 s each per GPU).
#[test]
fn suspending_the_borrowers_loses_only_the_copies() {
    let trace = borrower_holds_the_cluster();
    let config = config(1);
    let kill = replay(&trace, Sharing::QueuesWithReclaim, &config).unwrap();
    let suspend = replay(&trace, Sharing::QueuesWithSuspend, &config).unwrap();
    assert_eq!(suspend.preemptions, 2);
    assert!(
        (suspend.lost_gpu_seconds - 2.0 * (SUSPEND_SECS + RESUME_SECS)).abs() < 1e-9,
        "{suspend:?}"
    );
    assert!((kill.lost_gpu_seconds - 1290.0).abs() < 1e-9);
    for id in ["a1", "a2"] {
        let start = suspend.outcomes[index(&trace, id)].first_start.unwrap();
        assert!(start <= 600.0 + 2.0 * SUSPEND_SECS + 10.0, "{id}: {start}");
    }
    // b8 was suspended at 600 (stopped at 615) and resumes once a's jobs end, with what it had
    // left plus the copy back to run.
    let b8 = &suspend.outcomes[index(&trace, "b8")];
    assert_eq!(b8.runs.len(), 2, "{b8:?}");
    assert!((b8.runs[0].end - 615.0).abs() < 1e-9, "{b8:?}");
    let resumed = b8.runs[1].end - b8.runs[1].start;
    assert!(
        (resumed - (36_000.0 - 600.0 + RESUME_SECS)).abs() < 1e-9,
        "{b8:?}"
    );
    let kill_b8 = &kill.outcomes[index(&trace, "b8")];
    assert!(b8.finish.unwrap() < kill_b8.finish.unwrap());
    let report = TeamReport::new(&trace, &[kill, suspend], (1, 8), 0, 30.0);
    let b = report.team("b", Sharing::QueuesWithSuspend).unwrap();
    assert_eq!(b.preempted, 2);
    assert!((b.lost_gpu_hours - 60.0 / 3600.0).abs() < 1e-9);
}

#[test]
fn no_preemption_while_every_team_stays_within_its_guarantee() {
    let mut trace = borrower_holds_the_cluster();
    // b asks for its guarantee only: nothing to reclaim, a's jobs fit at once.
    trace
        .jobs
        .retain(|j| !["b5", "b6", "b7", "b8"].contains(&j.id.as_str()));
    let run = replay(&trace, Sharing::QueuesWithReclaim, &config(1)).unwrap();
    assert_eq!(run.preemptions, 0);
    assert!((run.outcomes[index(&trace, "a1")].first_start.unwrap() - 600.0).abs() < 1e-9);
}

#[test]
fn the_generated_teams_are_the_controllers_queues() {
    #[derive(serde::Deserialize)]
    struct File {
        scheduler: SchedulerConfig,
    }
    let gen_config = TeamGenConfig {
        gpus: 64,
        hours: 72.0,
    };
    let trace = generate(&gen_config, 1);
    // The config printed goes into the controller's config file as it is.
    let file: File = toml::from_str(&trace.config_toml()).unwrap();
    assert_eq!(file.scheduler.quotas, trace.quotas);
    // Guarantees fit the cluster, exactly.
    let guaranteed = trace
        .quotas
        .queues
        .values()
        .fold(ResourceSlot::new(), |acc, q| {
            acc.checked_add(&q.guaranteed).unwrap()
        });
    assert!(
        guaranteed.get(names::CUDA_SHARES) <= SlotValue::from_int(64),
        "{guaranteed}"
    );
    assert_eq!(trace.quotas.queues.len(), TEAMS.len());
    // Every job belongs to a team; some ask for part of a GPU.
    assert!(trace.jobs.iter().all(|j| trace.queue_of(j).is_some()));
    assert!(
        trace
            .jobs
            .iter()
            .any(|j| gpus_of_job(j) < 1.0 && gpus_of_job(j) > 0.0)
    );
    // Bursty teams: an idle stretch of hours, and a moment their demand (had every job started
    // at once) is well past the guarantee.
    for team in TEAMS
        .iter()
        .filter(|t| matches!(t.activity, Activity::Bursty { .. }))
    {
        let mine: Vec<&Job> = trace
            .jobs
            .iter()
            .filter(|j| trace.queue_of(j) == Some(team.name))
            .collect();
        let longest_gap = mine
            .windows(2)
            .map(|w| w[1].arrival - w[0].arrival)
            .fold(0.0, f64::max);
        assert!(longest_gap > 2.0 * 3600.0, "{}: {longest_gap}", team.name);
        let peak = mine
            .iter()
            .map(|j| {
                mine.iter()
                    .filter(|k| k.arrival <= j.arrival && j.arrival < k.arrival + k.work)
                    .map(|k| gpus_of_job(k))
                    .sum::<f64>()
            })
            .fold(0.0, f64::max);
        let guarantee = team.guaranteed * 64.0;
        assert!(
            peak > 1.5 * guarantee,
            "{}: {peak} vs {guarantee}",
            team.name
        );
    }
    assert_eq!(trace, generate(&gen_config, 1));
    assert_ne!(trace.jobs, generate(&gen_config, 2).jobs);
}

fn gpus_of_job(job: &Job) -> f64 {
    replay::gpus_of(job)
}

fn small_report(seed: u64) -> TeamReport {
    let trace = generate(
        &TeamGenConfig {
            gpus: 16,
            hours: 12.0,
        },
        seed,
    );
    evaluate(&trace, &config(2), seed).unwrap()
}

#[test]
fn same_seed_same_table_and_lost_gpu_hours_add_up() {
    let report = small_report(3);
    let again = small_report(3);
    assert_eq!(report, again);
    assert_eq!(report.table(), again.table());
    assert_ne!(report.table(), small_report(4).table());
    let table = report.table();
    for team in TEAMS {
        assert!(table.contains(&format!("| {} |", team.name)), "{table}");
    }
    for sharing in Sharing::ALL {
        assert!(table.contains(&format!("| {sharing} |")), "{table}");
    }
    let today = report.cluster(Sharing::NoQueues).unwrap();
    let queues = report.cluster(Sharing::QueuesWithReclaim).unwrap();
    assert_eq!((today.preemptions, today.rejected), (0, 0));
    assert!(queues.preemptions > 0, "{queues:?}");
    for cluster in [today, queues] {
        let rows: Vec<&report::TeamRow> = report
            .teams
            .iter()
            .filter(|r| r.sharing == cluster.sharing)
            .collect();
        let lost: f64 = rows.iter().map(|r| r.lost_gpu_hours).sum();
        let hours: f64 = rows.iter().map(|r| r.gpu_hours).sum();
        let preempted: usize = rows.iter().map(|r| r.preempted).sum();
        assert!((lost - cluster.lost_gpu_hours).abs() < 1e-6, "{cluster:?}");
        assert!((hours - cluster.gpu_hours).abs() < 1e-6, "{cluster:?}");
        assert_eq!(preempted, cluster.preemptions);
        let shares: f64 = rows.iter().map(|r| r.gpu_hours_share).sum();
        assert!((shares - 1.0).abs() < 1e-9, "{shares}");
        assert!((0.0..=1.0).contains(&cluster.utilization), "{cluster:?}");
    }
    // Every team's jobs ran in both: the same jobs, the same count.
    let counts: BTreeMap<(&str, Sharing), usize> = report
        .teams
        .iter()
        .map(|r| ((r.team.as_str(), r.sharing), r.jobs))
        .collect();
    for team in TEAMS {
        assert_eq!(
            counts[&(team.name, Sharing::NoQueues)],
            counts[&(team.name, Sharing::QueuesWithReclaim)]
        );
    }
}

/// A suspended job comes back on the node it left (the driver restores only onto the same
/// chip), even when the other node has room first: two nodes of 8 GPUs, b fills both at t = 0
/// (b1 done at t = 2,000), a asks for one GPU at t = 600 and holds it for 20,000 s. The
/// borrower suspended for it waits for its node, not for the GPU b1 frees on the other (where
/// a requeued session, the replay's model before, started at t = 2,000).
#[test]
fn a_suspended_job_resumes_on_the_node_it_left() {
    let mut trace = borrower_holds_the_cluster_jobs();
    trace.quotas = quotas(&two_teams(), 16);
    trace.jobs = (1..=16)
        .map(|i| {
            let work = if i == 1 { 2_000.0 } else { 36_000.0 };
            job(&format!("b{i}"), "bob", 0.0, "1", work)
        })
        .collect();
    trace.jobs.push(job("a1", "alice", 600.0, "1", 20_000.0));
    let run = replay(&trace, Sharing::QueuesWithSuspend, &config(2)).unwrap();
    assert_eq!(run.preemptions, 1, "{:?}", run.outcomes);
    let (victim, runs) = run
        .outcomes
        .iter()
        .enumerate()
        .find_map(|(i, o)| o.runs.first().filter(|r| r.preempted).map(|_| (i, &o.runs)))
        .unwrap();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(
        runs[1].node, runs[0].node,
        "{}: {runs:?}",
        trace.jobs[victim].id
    );
    // It waited for a1 to end on its node; b1 freed a GPU on the other at t = 2,000.
    assert!(runs[1].start >= 600.0 + 20_000.0, "{runs:?}");
}

/// The same trace with the driver refusing b8's checkpoint: b8 goes the kill way (its grace
/// period, then it starts over, all of its run lost as under reclaim), b7 is suspended as
/// before. Judged against the kill and suspend replays of the same trace.
#[test]
fn a_refused_checkpoint_is_a_kill_and_the_others_still_suspend() {
    let trace = borrower_holds_the_cluster();
    let config = config(1);
    let kill = replay(&trace, Sharing::QueuesWithReclaim, &config).unwrap();
    let suspend = replay(&trace, Sharing::QueuesWithSuspend, &config).unwrap();
    let b8_index = index(&trace, "b8");
    let refusing = replay_refusing(&trace, Sharing::QueuesWithSuspendRefusing, &config, &|i| {
        i == b8_index
    })
    .unwrap();
    assert_eq!(refusing.preemptions, 2);
    let b8 = &refusing.outcomes[b8_index];
    assert_eq!(
        b8.runs[0], kill.outcomes[b8_index].runs[0],
        "b8's first run ends as under reclaim"
    );
    // b7, suspended (when depends on b8's grace period), loses only the two copies.
    let b7 = &refusing.outcomes[index(&trace, "b7")];
    assert!(b7.runs[0].preempted, "{b7:?}");
    assert!(
        (b7.runs[0].lost_secs - (SUSPEND_SECS + RESUME_SECS)).abs() < 1e-9,
        "{b7:?}"
    );
    let lost = kill.outcomes[b8_index].runs[0].lost_secs + SUSPEND_SECS + RESUME_SECS;
    assert!(
        (refusing.lost_gpu_seconds - lost).abs() < 1e-9,
        "{refusing:?}"
    );
    // Refusing nobody is the suspend replay; refusing everybody, the kill replay's losses.
    let none = replay_refusing(&trace, Sharing::QueuesWithSuspendRefusing, &config, &|_| {
        false
    });
    assert!((none.unwrap().lost_gpu_seconds - suspend.lost_gpu_seconds).abs() < 1e-9);
    let all = replay_refusing(&trace, Sharing::QueuesWithSuspendRefusing, &config, &|_| {
        true
    });
    assert!((all.unwrap().lost_gpu_seconds - kill.lost_gpu_seconds).abs() < 1e-9);
}

/// The refused jobs are a quarter of a trace, give or take, spread over it (each tenth of the
/// trace has its share).
#[test]
fn a_quarter_of_the_jobs_are_refused_a_checkpoint() {
    let refused = (0..10_000).filter(|&i| checkpoint_refused(i)).count();
    assert!((2_300..2_700).contains(&refused), "{refused}");
    for tenth in 0..10 {
        let n = (tenth * 1_000..(tenth + 1) * 1_000)
            .filter(|&i| checkpoint_refused(i))
            .count();
        assert!((150..350).contains(&n), "tenth {tenth}: {n}");
    }
}
