//! `gpuwarden-sim`: replays a job trace against the controller's scheduler on a virtual clock,
//! once per placement mode, and prints a table (see [`gpuwarden_sim`] and
//! `docs/simulation.md`).
//!
//! ```sh
//! gpuwarden-sim --trace controller/sim/trace.jsonl     # the bundled trace
//! gpuwarden-sim --seed 7 --json                        # a generated trace, JSON out
//! gpuwarden-sim --generate 2000 --seed 1 > trace.jsonl # write a trace
//! gpuwarden-sim --sweep-fractional-training 0.15,0.5,0.8,1.0  # one line per generated trace
//! gpuwarden-sim --teams --seed 1                       # teams sharing the cluster, with and without queues
//! gpuwarden-sim --mig 2 --seed 1                        # 2 of the 8 nodes in MIG mode, 30% MIG requests
//! ```

use std::{fs::File, io::BufReader, path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::Parser;
use gpuwarden_controller::placement::ScoringConfig;
use gpuwarden_sim::{
    self as sim, SimConfig,
    cluster::ClusterShape,
    teams::{self, TeamGenConfig},
    trace::{self, GenConfig},
};

/// Replays a GPU job trace under binpack, spread and interference-aware placement, or (--teams)
/// teams sharing the cluster without and with team queues and reclaim.
#[derive(Parser)]
#[command(name = "gpuwarden-sim", version, about)]
struct Cli {
    /// JSON-lines trace to replay (without one, a trace is generated from --seed).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Seed of the generated trace and of the simulated demand.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Write a generated trace of this many jobs to stdout instead of simulating.
    #[arg(long, value_name = "JOBS")]
    generate: Option<usize>,
    /// Jobs of a generated trace.
    #[arg(long, default_value_t = 2000)]
    jobs: usize,
    /// Offered load of a generated trace (GPU-seconds asked per second per GPU).
    #[arg(long, default_value_t = GenConfig::default().load)]
    load: f64,
    /// Fraction of a generated trace's fractional requests that are training jobs.
    #[arg(long, default_value_t = GenConfig::default().fractional_training)]
    fractional_training: f64,
    /// Generate one trace per value of --fractional-training (from --seed) and print a line
    /// for each: the bound, interference-aware against binpack and spread.
    #[arg(long, value_name = "F,F,…", value_delimiter = ',', conflicts_with_all = ["trace", "generate"])]
    sweep_fractional_training: Vec<f64>,
    /// Teams sharing the cluster: generate a trace of teams with guarantees and bursts (from
    /// --seed) and replay it without queues and with team queues and reclaim; print per team
    /// the time-to-start against its guarantee and its share of GPU-hours, and for the cluster
    /// utilization and preemptions.
    #[arg(long, conflicts_with_all = ["trace", "generate", "sweep_fractional_training"])]
    teams: bool,
    /// Hours of arrivals of the --teams trace.
    #[arg(long, default_value_t = TeamGenConfig::default().hours, requires = "teams")]
    hours: f64,
    /// The last NODES nodes have H200s in MIG mode: half their GPUs in NVIDIA's "balanced"
    /// layout (2 × 1g.18gb, 2g.35gb, 3g.71gb), half handed to gpuwarden with no instance, made
    /// on demand by the simulated agents and destroyed once empty. A generated trace then has
    /// --mig-jobs of its jobs ask for one instance.
    #[arg(
        long,
        value_name = "NODES",
        default_value_t = 0,
        conflicts_with = "teams"
    )]
    mig: u32,
    /// Fraction of a generated trace's jobs that ask for one MIG instance (`cuda.mig.1g.18gb=1`,
    /// 2g.35gb, 3g.71gb); default 0.3 with --mig, else 0.
    #[arg(long, value_name = "F")]
    mig_jobs: Option<f64>,
    /// Simulated nodes.
    #[arg(long, default_value_t = 8)]
    nodes: u32,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// Fraction of the first jobs left out of the metrics (in every mode).
    #[arg(long, default_value_t = SimConfig::default().warmup)]
    warmup: f64,
    /// interference-aware: weight of predicted interference.
    #[arg(long)]
    w_interference: Option<f64>,
    /// interference-aware: weight of fragmentation.
    #[arg(long)]
    w_fragmentation: Option<f64>,
    /// interference-aware: weight of packing (a reward).
    #[arg(long)]
    w_packing: Option<f64>,
    /// interference-aware: weight of NUMA spread.
    #[arg(long)]
    w_topology: Option<f64>,
    /// interference-aware: packing cap on predicted summed utilization.
    #[arg(long)]
    packing_cap: Option<f64>,
}

/// Fraction of a generated trace's jobs asking for a MIG instance when --mig is given without
/// --mig-jobs (the share of MIG requests in `cargo xtask bench sched`'s MIG row).
const DEFAULT_MIG_JOBS: f64 = 0.3;

fn main() -> ExitCode {
    match run(&Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpuwarden-sim: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: &Cli) -> anyhow::Result<()> {
    let cluster = ClusterShape {
        nodes: cli.nodes,
        gpus_per_node: cli.gpus_per_node,
    };
    anyhow::ensure!(cluster.gpus() > 0, "the cluster needs at least one GPU");
    let gen_config = gen_config(cli, cluster)?;
    if cli.generate.is_some() {
        print!(
            "{}",
            trace::to_jsonl(&trace::generate(&gen_config, cli.seed))
        );
        return Ok(());
    }
    for f in &cli.sweep_fractional_training {
        anyhow::ensure!(
            (0.0..=1.0).contains(f),
            "--sweep-fractional-training: {f} is not in 0..=1"
        );
    }
    let scoring = scoring(cli)?;
    let config = SimConfig {
        cluster,
        mig_nodes: cli.mig,
        warmup: cli.warmup,
        scoring,
        ..SimConfig::default()
    };
    if cli.teams {
        anyhow::ensure!(
            cli.hours.is_finite() && cli.hours > 0.0,
            "--hours must be a number > 0"
        );
        let trace = teams::generate(
            &TeamGenConfig {
                gpus: cluster.gpus(),
                hours: cli.hours,
            },
            cli.seed,
        );
        let report = teams::evaluate(&trace, &config, cli.seed)?;
        if cli.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.table());
        }
        return Ok(());
    }
    if !cli.sweep_fractional_training.is_empty() {
        let mut rows = Vec::new();
        for &f in &cli.sweep_fractional_training {
            let jobs = trace::generate(
                &GenConfig {
                    fractional_training: f,
                    ..gen_config
                },
                cli.seed,
            );
            rows.push((f, sim::evaluate(&jobs, &config, cli.seed)?));
        }
        if cli.json {
            let rows: Vec<_> = rows
                .iter()
                .map(|(f, r)| serde_json::json!({ "fractional_training": f, "report": r }))
                .collect();
            println!("{}", serde_json::to_string_pretty(&rows)?);
        } else {
            print!("{}", sim::report::sweep_table("fractional training", &rows));
        }
        return Ok(());
    }
    let jobs = match &cli.trace {
        Some(path) => {
            let file =
                File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
            trace::parse(BufReader::new(file)).with_context(|| path.display().to_string())?
        }
        None => trace::generate(&gen_config, cli.seed),
    };
    let report = sim::evaluate(&jobs, &config, cli.seed)?;
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

/// The generator's settings the flags ask for, checked.
fn gen_config(cli: &Cli, cluster: ClusterShape) -> anyhow::Result<GenConfig> {
    let gen_config = GenConfig {
        jobs: cli.generate.unwrap_or(cli.jobs),
        gpus: cluster.gpus(),
        load: cli.load,
        fractional_training: cli.fractional_training,
        mig: cli
            .mig_jobs
            .unwrap_or(if cli.mig > 0 { DEFAULT_MIG_JOBS } else { 0.0 }),
        ..GenConfig::default()
    };
    anyhow::ensure!(
        (0.0..=1.0).contains(&gen_config.mig),
        "--mig-jobs must be in 0..=1"
    );
    anyhow::ensure!(
        cli.mig <= cli.nodes,
        "--mig {} is more than the {} nodes",
        cli.mig,
        cli.nodes
    );
    anyhow::ensure!(
        cli.load.is_finite() && cli.load > 0.0,
        "--load must be a number > 0"
    );
    anyhow::ensure!(
        (0.0..=1.0).contains(&cli.fractional_training),
        "--fractional-training must be in 0..=1"
    );
    Ok(gen_config)
}

/// The `interference-aware` scoring the flags ask for.
fn scoring(cli: &Cli) -> anyhow::Result<ScoringConfig> {
    let mut scoring = ScoringConfig::default();
    let w = &mut scoring.weights;
    for (flag, slot) in [
        (cli.w_interference, &mut w.interference),
        (cli.w_fragmentation, &mut w.fragmentation),
        (cli.w_packing, &mut w.packing),
        (cli.w_topology, &mut w.topology),
    ] {
        if let Some(v) = flag {
            *slot = v;
        }
    }
    if let Some(cap) = cli.packing_cap {
        scoring.packing_cap = cap;
    }
    scoring.validate()?;
    Ok(scoring)
}
