//! `cargo xtask bench throttle`: how closely the compute-share throttle holds a CPU spinner to
//! targets 0.1, 0.3, 0.5 and 0.9 under `hard`, with the CPU-time stand-in for GPU usage.
//!
//! Both modes (slots, the default, and buckets), alone at each target and in pairs that fill the
//! stand-in "GPU". Each row is judged by the time the spinner saw itself run by its own clock
//! (`gpuwarden_test_support::spinner`), over what it saw unthrottled in the same run: a figure
//! the throttle does not regulate (it reads the cgroup's `cpu.stat`). The kernel's CPU time and
//! the iterations over the baseline's are printed beside it. Needs root (it creates cgroup v2
//! cgroups and freezes them). Pairs on this two-CPU machine: in the bucket mode both spinners
//! can run at once on the two CPUs, which a GPU would time-slice; slots never run them together.

#![expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "Measured rates and shares in [0, 1], as f64"
)]

use std::{fs, os::unix::fs::MetadataExt, time::Duration};

use gpuwarden_agent::enforcement::throttle::{
    self, ComputePolicy, CpuTimeSignal, CpuTimeUsage, Member, Signal, ThrottleConfig, ThrottleMode,
};
use gpuwarden_test_support::{
    TestCgroup, is_root,
    spinner::{Rate, Spinner, rates, spin_if_asked},
};

/// One spinner at each share, then pairs that fill the "GPU" (one CPU).
const CASES: [&[f64]; 6] = [&[0.1], &[0.3], &[0.5], &[0.9], &[0.3, 0.7], &[0.5, 0.5]];
const BASELINE: Duration = Duration::from_secs(2);
const SETTLE: Duration = Duration::from_millis(500);
const MEASURE: Duration = Duration::from_secs(6);

/// Each mode with its signal: what the agent runs with mock devices.
fn signal(mode: ThrottleMode) -> Signal {
    match mode {
        ThrottleMode::Slots => Signal::Device(Box::new(CpuTimeSignal::default())),
        ThrottleMode::Buckets => Signal::PerCgroup(Box::new(CpuTimeUsage)),
    }
}

/// What one row measured of each spinner: as the throttle sees it and as the spinner does.
struct Row {
    shares: Vec<f64>,
    rates: Vec<Rate>,
    /// The throttle's own figure: its measured GPU time over the window.
    reported: Vec<f64>,
}

/// Runs `shares` (one spinner each) under `mode`, one row per case.
fn measure(mode: ThrottleMode, cases: &[&[f64]]) -> anyhow::Result<Vec<Row>> {
    let throttle = throttle::spawn(ThrottleConfig::default(), signal(mode), "gpuwarden-bench")?;
    let mut rows = Vec::new();
    for shares in cases {
        // Declared first, dropped last: the spinners are killed before their cgroups go.
        let cgroups: Vec<TestCgroup> = (0..shares.len())
            .map(|i| {
                TestCgroup::create(&format!(
                    "gpuwarden-throttle-bench-{}-{i}",
                    std::process::id()
                ))
            })
            .collect();
        let spinners: Vec<Spinner> = cgroups
            .iter()
            .map(|c| Spinner::start(&c.dir, &[]))
            .collect();
        let mut keys = Vec::new();
        for (cgroup, share) in cgroups.iter().zip(*shares) {
            let key = fs::metadata(&cgroup.dir)?.ino();
            throttle.set(
                0,
                key,
                Member {
                    cgroup_dir: cgroup.dir.clone(),
                    share_ppm: (share * 1e6).round() as u32,
                    policy: ComputePolicy::Hard,
                },
            )?;
            keys.push(key);
        }
        std::thread::sleep(SETTLE);
        let refs: Vec<&Spinner> = spinners.iter().collect();
        let gpu_time = |key: &u64| throttle.stats(*key).map_or(Duration::ZERO, |s| s.gpu_time);
        let before: Vec<Duration> = keys.iter().map(gpu_time).collect();
        let measured = rates(&refs, MEASURE);
        let reported = keys
            .iter()
            .zip(before)
            .map(|(k, b)| gpu_time(k).saturating_sub(b).as_secs_f64() / MEASURE.as_secs_f64())
            .collect();
        rows.push(Row {
            shares: shares.to_vec(),
            rates: measured,
            reported,
        });
        for key in keys {
            throttle.remove(key)?;
        }
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(throttle.shutdown());
    Ok(rows)
}

fn main() -> anyhow::Result<()> {
    // The spinner is this binary run again (gpuwarden-test-support's `spinner`).
    spin_if_asked();
    // cargo bench passes `--bench`; nothing here takes options.
    anyhow::ensure!(
        is_root(),
        "the throttle bench creates and freezes cgroups: it needs root"
    );
    // The baseline: one spinner unthrottled, by its own clock, before the rows.
    let baseline = {
        let cgroup =
            TestCgroup::create(&format!("gpuwarden-throttle-bench-{}", std::process::id()));
        let spinner = Spinner::start(&cgroup.dir, &[]);
        rates(&[&spinner], BASELINE)[0]
    };
    let config = ThrottleConfig::default();
    println!(
        "compute-share throttle on the CPU-time stand-in, policy hard, {MEASURE:?} per row; \
         slots of {:?} with a {:?} guard, buckets of {:?} measured every {:?}",
        config.slots.slot, config.slots.guard, config.period, config.tick
    );
    println!(
        "baseline: one spinner unthrottled saw itself run {:.1} % of the time ({:.1} % by the \
         kernel's CPU time), {:.1} M iterations/s",
        baseline.observed * 100.0,
        baseline.cpu * 100.0,
        baseline.iterations / 1e6
    );
    // Judged by the spinner's own clock (the time it saw itself run), over what it saw
    // unthrottled in the same run: a figure the throttle does not read. The kernel's CPU time,
    // which the stand-in signal reads, is beside it.
    println!(
        "| mode | shares | ran, by its own clock ÷ baseline | error (points) | ran, by the kernel's CPU time | the throttle's own figure | progress ÷ baseline |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    for mode in [ThrottleMode::Slots, ThrottleMode::Buckets] {
        for row in measure(mode, &CASES)? {
            for ((share, rate), reported) in row.shares.iter().zip(&row.rates).zip(&row.reported) {
                let observed = rate.observed / baseline.observed;
                println!(
                    "| {mode:?} | {share:.2} of {:?} | {observed:.3} | {:+.1} | {:.3} | {reported:.3} | {:.3} |",
                    row.shares,
                    (observed - share) * 100.0,
                    rate.cpu,
                    rate.iterations / baseline.iterations,
                );
            }
        }
    }
    Ok(())
}
