//! Traces: the JSON-lines format the simulator replays, and a generator whose parameters come
//! from published GPU cluster traces (each with its source in `docs/simulation.md`).
//!
//! One job per line:
//!
//! ```json
//! {"id": "j00042", "arrival": 1234.5, "slots": ["cuda.shares=0.47"], "class": "infer-online-3", "work": 3600.0}
//! ```
//!
//! `arrival` is seconds from the start of the trace, `slots` the request as `gpuwarden session
//! create -r` takes it, `class` the workload class its profile is learned under, and `work`
//! the seconds it runs when alone on its devices. Blank lines are skipped. A trace of teams
//! sharing a cluster ([`crate::teams`]) adds `"owner"`, the owner whose sessions a team's queue
//! counts (absent: every job is the one owner `sim`'s).

use std::{collections::BTreeSet, fmt::Write as _, io::BufRead};

use serde::{Deserialize, Serialize};

use gpuwarden_controller::slots::{ParseError, ResourceSlot, names};
use gpuwarden_types::mig::{GiProfile, H200_141GB};

use super::{cluster::FAMILIES, rng::Rng};

/// One job of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// Unique id (becomes the session id).
    pub id: String,
    /// Arrival, seconds from the start of the trace.
    pub arrival: f64,
    /// Requested slots, as users type them (`cuda.shares=0.5`, `cuda.device=2`).
    pub slots: Vec<String>,
    /// Workload class.
    pub class: String,
    /// Seconds it runs when alone.
    pub work: f64,
    /// Whose session it is (`None`: the one owner of a trace without teams). Left out of the
    /// JSON when absent, so traces without teams read and write as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

impl Job {
    /// The requested slots, parsed.
    ///
    /// # Errors
    /// A token is malformed.
    pub fn requested(&self) -> Result<ResourceSlot, ParseError> {
        ResourceSlot::parse_any(&self.slots)
    }

    /// Whether it asks for a MIG profile (a `cuda.mig.…` slot).
    #[must_use]
    pub fn asks_mig(&self) -> bool {
        self.slots
            .iter()
            .any(|s| s.starts_with(names::CUDA_MIG_PREFIX))
    }
}

/// A trace that can't be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Reading failed.
    #[error("reading the trace: {0}")]
    Io(#[from] std::io::Error),
    /// A line is not a job.
    #[error("trace line {line}: {error}")]
    Json {
        /// 1-based line number.
        line: usize,
        /// What serde said (in the message, so not also a source: it would print twice).
        error: serde_json::Error,
    },
    /// A line is a job with an impossible value.
    #[error("trace line {line}: {reason}")]
    Invalid {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// No jobs at all.
    #[error("the trace has no jobs")]
    Empty,
}

/// Reads a JSON-lines trace; jobs come back sorted by arrival (stable for ties).
///
/// # Errors
/// A line that isn't valid JSON for a [`Job`], or has a negative or non-finite arrival, a work
/// that isn't positive, malformed slots or a repeated id, names its line.
pub fn parse(reader: impl BufRead) -> Result<Vec<Job>, TraceError> {
    let mut jobs = Vec::new();
    let mut ids = BTreeSet::new();
    for (i, line) in reader.lines().enumerate() {
        let line_no = i + 1;
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let job: Job = serde_json::from_str(&line).map_err(|error| TraceError::Json {
            line: line_no,
            error,
        })?;
        let invalid = |reason: String| TraceError::Invalid {
            line: line_no,
            reason,
        };
        if !job.arrival.is_finite() || job.arrival < 0.0 {
            return Err(invalid(format!(
                "arrival {} must be a finite number ≥ 0",
                job.arrival
            )));
        }
        if !job.work.is_finite() || job.work <= 0.0 {
            return Err(invalid(format!("work {} must be a number > 0", job.work)));
        }
        job.requested().map_err(|e| invalid(e.to_string()))?;
        if !ids.insert(job.id.clone()) {
            return Err(invalid(format!(
                "job id {:?} repeats an earlier one",
                job.id
            )));
        }
        jobs.push(job);
    }
    if jobs.is_empty() {
        return Err(TraceError::Empty);
    }
    jobs.sort_by(|a, b| a.arrival.total_cmp(&b.arrival));
    Ok(jobs)
}

/// Writes jobs as JSON lines.
#[must_use]
pub fn to_jsonl(jobs: &[Job]) -> String {
    let mut out = String::new();
    for job in jobs {
        // A Job always serializes: plain strings and finite numbers.
        if let Ok(line) = serde_json::to_string(job) {
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

/// Fraction of GPU tasks that ask for part of one GPU: 3,078 of the 7,064 GPU tasks of
/// Alibaba's `openb_pod_list_default.csv` (cluster-trace-gpu-v2023, the trace of Weng et al.,
/// ATC'23) have `num_gpu = 1` and `gpu_milli < 1000`.
pub const FRACTIONAL: f64 = 3078.0 / 7064.0;

/// Multi-GPU requests, `(GPUs, fraction of GPU tasks)`: 16, 15 and 44 of the same 7,064 tasks
/// ask for 2, 4 and 8 GPUs.
pub const MULTI_GPU: [(u32, f64); 3] = [(2, 16.0 / 7064.0), (4, 15.0 / 7064.0), (8, 44.0 / 7064.0)];

/// Shares of the fractional requests, `(milli-GPU, tasks)`: the thirteen most common
/// `gpu_milli` values of the same file (3,050 of its 3,078 fractional tasks).
pub const FRACTIONAL_SIZES: [(u32, u32); 13] = [
    (810, 1078),
    (470, 750),
    (320, 328),
    (650, 253),
    (230, 140),
    (460, 128),
    (590, 75),
    (160, 74),
    (550, 72),
    (220, 62),
    (370, 47),
    (110, 24),
    (480, 19),
];

/// What kind of request a job makes, with the mix of workload families for each (assumed,
/// see `docs/simulation.md`): `(family, weight)` in the order of [`FAMILIES`].
const MIX_MULTI: [f64; 6] = [0.9, 0.1, 0.0, 0.0, 0.0, 0.0];
const MIX_WHOLE: [f64; 6] = [0.45, 0.2, 0.0, 0.1, 0.2, 0.05];
const MIX_FRACTIONAL: [f64; 6] = [0.0, 0.0, 0.3, 0.2, 0.25, 0.1];
/// Fractional requests that are training ([`GenConfig::fractional_training`] of them): half
/// `train`, half `finetune`.
const MIX_FRACTIONAL_TRAINING: [f64; 6] = [0.5, 0.5, 0.0, 0.0, 0.0, 0.0];

/// Settings of the generator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GenConfig {
    /// Jobs to generate.
    pub jobs: usize,
    /// GPUs of the cluster the trace is meant for (sets the arrival rate with `load`).
    pub gpus: u32,
    /// Offered load: GPU-seconds requested per second over the cluster's GPUs (the arrival
    /// rate follows from it).
    pub load: f64,
    /// Classes per workload family (`train-0` … `train-N`): how many distinct workloads
    /// recur.
    pub variants: u32,
    /// Median seconds a job runs alone (log-normal).
    pub median_work: f64,
    /// Log-normal σ of the work.
    pub work_sigma: f64,
    /// Shortest and longest work, seconds.
    pub work_range: (f64, f64),
    /// Fraction of the fractional requests that are training jobs (busy, memory-bound); the
    /// rest are inference, notebooks and evaluation.
    pub fractional_training: f64,
    /// Fraction of the jobs that ask for one MIG instance ([`MIG_PROFILES`]); 0 draws nothing
    /// more from the seed, so a trace without them is the one generated before MIG.
    pub mig: f64,
}

impl Default for GenConfig {
    fn default() -> Self {
        Self {
            jobs: 2000,
            gpus: 64,
            load: 0.7,
            variants: 8,
            median_work: 3600.0,
            work_sigma: 1.2,
            work_range: (60.0, 86_400.0),
            fractional_training: 0.15,
            mig: 0.0,
        }
    }
}

/// The MIG requests of a generated trace, `(profile, weight)`: the profiles of an H200's
/// "balanced" layout, the smallest most asked for (assumed, see `docs/simulation.md`).
pub const MIG_PROFILES: [(&str, f64); 3] = [("1g.18gb", 0.5), ("2g.35gb", 0.25), ("3g.71gb", 0.25)];

/// The share of a whole H200 an instance of `profile` is: its compute slices over the GPU's.
fn mig_share(profile: &str) -> f64 {
    let g = crate::mig::profile(profile).and_then(GiProfile::compute_slices);
    f64::from(g.unwrap_or(0)) / f64::from(H200_141GB.compute_slices())
}

/// A job's work alone, s: log-normal, clamped, whole seconds.
fn draw_work(config: &GenConfig, rng: &mut Rng) -> f64 {
    (config.median_work * (config.work_sigma * rng.normal()).exp())
        .clamp(config.work_range.0, config.work_range.1)
        .round()
}

/// Generates a trace: request kinds and sizes in the published proportions, a workload class
/// per job, log-normal work, and Poisson arrivals at the rate that offers `load`.
#[must_use]
pub fn generate(config: &GenConfig, seed: u64) -> Vec<Job> {
    let mut rng = Rng::new(seed);
    let multi_total: f64 = MULTI_GPU.iter().map(|(_, p)| p).sum();
    let size_weights: Vec<f64> = FRACTIONAL_SIZES
        .iter()
        .map(|(_, n)| f64::from(*n))
        .collect();
    // Draw everything but the arrival first: the arrival rate depends on the mean GPU-seconds.
    let mut drafts = Vec::with_capacity(config.jobs);
    let mut gpu_seconds = 0.0;
    let mig_weights: Vec<f64> = MIG_PROFILES.iter().map(|(_, w)| *w).collect();
    for _ in 0..config.jobs {
        // Drawn only when asked for: without MIG requests the stream is the one it was.
        if config.mig > 0.0 && rng.unit() < config.mig {
            let (profile, _) = MIG_PROFILES[rng.weighted(&mig_weights)];
            let family = FAMILIES[rng.weighted(&MIX_FRACTIONAL)].0;
            let variant = rng.next_u64() % u64::from(config.variants.max(1));
            let work = draw_work(config, &mut rng);
            gpu_seconds += mig_share(profile) * work;
            drafts.push((
                format!("cuda.mig.{profile}=1"),
                format!("{family}-{variant}"),
                work,
            ));
            continue;
        }
        let roll = rng.unit();
        let (slot, gpus, mix) = if roll < multi_total {
            let weights: Vec<f64> = MULTI_GPU.iter().map(|(_, p)| *p).collect();
            let n = MULTI_GPU[rng.weighted(&weights)].0;
            (format!("cuda.device={n}"), f64::from(n), &MIX_MULTI)
        } else if roll < multi_total + FRACTIONAL {
            let milli = FRACTIONAL_SIZES[rng.weighted(&size_weights)].0;
            let mix = if rng.unit() < config.fractional_training {
                &MIX_FRACTIONAL_TRAINING
            } else {
                &MIX_FRACTIONAL
            };
            (
                format!("cuda.shares={}", f64::from(milli) / 1000.0),
                f64::from(milli) / 1000.0,
                mix,
            )
        } else {
            ("cuda.device=1".to_owned(), 1.0, &MIX_WHOLE)
        };
        let family = FAMILIES[rng.weighted(mix)].0;
        let variant = rng.next_u64() % u64::from(config.variants.max(1));
        let work = draw_work(config, &mut rng);
        gpu_seconds += gpus * work;
        drafts.push((slot, format!("{family}-{variant}"), work));
    }
    let mean_gpu_seconds = gpu_seconds / config.jobs.max(1) as f64;
    let rate = config.load * f64::from(config.gpus) / mean_gpu_seconds.max(1.0);
    let mut t = 0.0;
    drafts
        .into_iter()
        .enumerate()
        .map(|(i, (slot, class, work))| {
            let job = Job {
                id: format!("j{i:05}"),
                arrival: (t * 10.0_f64).round() / 10.0,
                slots: vec![slot],
                class,
                work,
                owner: None,
            };
            t += rng.exp(1.0 / rate);
            job
        })
        .collect()
}
