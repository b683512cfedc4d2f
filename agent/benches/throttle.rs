//! `cargo xtask bench throttle`: how closely the compute-share throttle holds a CPU spinner to
//! targets 0.1, 0.3, 0.5 and 0.9 under `hard`, with the CPU-time stand-in for GPU usage.
//!
//! For each target: the fraction of the time the spinner ran (its own CPU time over wall time,
//! what the throttle holds), and its progress (iterations per second) over the baseline measured
//! in the same run, its unthrottled rate before the targets and again after them (the mean of
//! the two). Needs root (it creates a cgroup v2 cgroup and freezes it).

#![expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "Measured rates and shares in [0, 1], as f64"
)]

use std::{fs, os::unix::fs::MetadataExt, time::Duration};

use gpuwarden_agent::enforcement::throttle::{
    self, ComputePolicy, CpuTimeUsage, Member, Signal, ThrottleConfig,
};
use gpuwarden_test_support::{
    TestCgroup, is_root,
    spinner::{Spinner, rates, spin_if_asked},
};

const TARGETS: [f64; 4] = [0.1, 0.3, 0.5, 0.9];
const BASELINE: Duration = Duration::from_secs(2);
const SETTLE: Duration = Duration::from_millis(500);
const MEASURE: Duration = Duration::from_secs(6);

fn main() -> anyhow::Result<()> {
    // The spinner is this binary run again (gpuwarden-test-support's `spinner`).
    spin_if_asked();
    // cargo bench passes `--bench`; nothing here takes options.
    anyhow::ensure!(
        is_root(),
        "the throttle bench creates and freezes a cgroup: it needs root"
    );
    // Declared first, dropped last: the spinner is killed before its cgroup is removed.
    let cgroup = TestCgroup::create(&format!("gpuwarden-throttle-bench-{}", std::process::id()));
    let spinner = Spinner::start(&cgroup.dir, &[]);

    let config = ThrottleConfig::default();
    let before = rates(&[&spinner], BASELINE)[0];
    let throttle = throttle::spawn(config, Signal::PerCgroup(Box::new(CpuTimeUsage)))?;
    let key = fs::metadata(&cgroup.dir)?.ino();
    let mut achieved = Vec::new();
    for target in TARGETS {
        throttle.set(
            0,
            key,
            Member {
                cgroup_dir: cgroup.dir.clone(),
                share_ppm: (target * 1e6).round() as u32,
                policy: ComputePolicy::Hard,
            },
        )?;
        std::thread::sleep(SETTLE);
        achieved.push(rates(&[&spinner], MEASURE)[0]);
    }
    throttle.remove(key)?;
    std::thread::sleep(Duration::from_millis(100));
    let after = rates(&[&spinner], BASELINE)[0];
    let baseline = f64::midpoint(before.iterations, after.iterations);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(throttle.shutdown());

    println!(
        "compute-share throttle, policy hard, period {:?}, tick {:?}, {MEASURE:?} per target",
        config.period, config.tick
    );
    println!(
        "baseline: unthrottled {:.1} M iterations/s before, {:.1} M after ({:+.1} %); \
         on a CPU {:.1} % / {:.1} % of the time",
        before.iterations / 1e6,
        after.iterations / 1e6,
        (after.iterations / before.iterations - 1.0) * 100.0,
        before.cpu * 100.0,
        after.cpu * 100.0,
    );
    // The throttle holds the running fraction of wall time (one CPU standing for one GPU),
    // whatever else the machine runs; iterations per CPU-second drift with what the other
    // (possibly SMT sibling) CPU does, so progress is noisier than the fraction it ran.
    println!(
        "| target | ran (fraction of the time) | error (points) | progress vs unthrottled | error (points) |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for (target, rate) in TARGETS.iter().zip(&achieved) {
        let (progress, cpu) = (rate.iterations / baseline, rate.cpu);
        println!(
            "| {target:.2} | {cpu:.3} | {:+.1} | {progress:.3} | {:+.1} |",
            (cpu - target) * 100.0,
            (progress - target) * 100.0
        );
    }
    Ok(())
}
