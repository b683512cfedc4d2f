#![expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "Shares written as fractions in [0, 1]"
)]

use std::fmt::Write as _;

use super::*;
use crate::enforcement::throttle::{
    Charge, ComputePolicy, DeviceSignal, Member, SlotConfig, ThrottleConfig, control::Controller,
    device::SampledDevice, sampled::SampledSource, slots::Scheduler,
};

const STEP_US: u64 = 100;
const WARMUP: Duration = Duration::from_secs(3);
const MEASURE: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Signal {
    /// Device utilization apportioned by process activity, earning up to `until`.
    Sampled,
    /// The old one: per-pid spans, earning by the tick clock.
    PerPidSpans,
}

/// Runs one tenant per share, each always busy, under `hard`; returns the fraction of the GPU's
/// time each got over [`MEASURE`], after [`WARMUP`].
fn run(shares: &[f64], signal: Signal, sim: SimConfig, config: ThrottleConfig) -> Vec<f64> {
    let handle = SimHandle::new(sim);
    let dirs: Vec<String> = (0..shares.len()).map(|i| format!("/sim/t{i}")).collect();
    for (i, dir) in dirs.iter().enumerate() {
        handle.gpu().add(100 + i as u32, dir);
    }
    let source: Box<dyn UsageSource> = match signal {
        Signal::Sampled => Box::new(SampledSource::new(handle.clone())),
        Signal::PerPidSpans => Box::new(PerPidSpans::new(handle.clone())),
    };
    let mut cgroups = SimCgroups {
        sim: handle.clone(),
        source,
    };
    let mut ctl = Controller::new(config.period);
    for (i, (dir, share)) in dirs.iter().zip(shares).enumerate() {
        let member = Member {
            cgroup_dir: dir.into(),
            share_ppm: (share * 1e6).round() as u32,
            policy: ComputePolicy::Hard,
        };
        ctl.set(0, i as u64, &member);
    }
    let tick_us = config.tick.as_micros() as u64;
    let mut run_for = |d: Duration| {
        let steps = d.as_micros() as u64 / STEP_US;
        for n in 1..=steps {
            handle.gpu().step(STEP_US);
            if (n * STEP_US).is_multiple_of(tick_us) {
                let now = handle.gpu().now();
                ctl.tick(now, &mut cgroups);
            }
        }
    };
    run_for(WARMUP);
    let before: Vec<Duration> = dirs.iter().map(|d| handle.gpu().gpu_time(d)).collect();
    run_for(MEASURE);
    dirs.iter()
        .zip(before)
        .map(|(d, b)| {
            handle.gpu().gpu_time(d).saturating_sub(b).as_secs_f64() / MEASURE.as_secs_f64()
        })
        .collect()
}

/// The targets of issue 15: one tenant, and two sharing the GPU.
const CASES: [&[f64]; 8] = [
    &[0.1],
    &[0.3],
    &[0.5],
    &[0.9],
    &[0.3, 0.5],
    &[0.1, 0.9],
    &[0.3, 0.7],
    &[0.5, 0.5],
];

/// The largest miss in points over [`CASES`], with a line per case for the log.
fn worst(signal: Signal, sim: SimConfig) -> (f64, String) {
    let mut worst = 0.0f64;
    let mut log = String::new();
    for shares in CASES {
        let got = run(shares, signal, sim, ThrottleConfig::default());
        for (share, got) in shares.iter().zip(&got) {
            worst = worst.max((got - share).abs() * 100.0);
        }
        let _ = writeln!(log, "{signal:?} {shares:?} -> {got:.3?}");
    }
    (worst, log)
}

#[test]
fn each_share_holds_within_a_point_on_a_simulated_gpu() {
    let (miss, log) = worst(Signal::Sampled, SimConfig::default());
    println!("{log}");
    assert!(miss <= 1.0, "missed by {miss:.1} points:\n{log}");
}

#[test]
fn the_per_pid_span_signal_misses_on_the_same_gpu() {
    // What the agent did before, on the same simulated GPU: it holds a share of 0.3 far below
    // 0.3 (a frozen process's first sample after a thaw is charged for the whole freeze, and
    // credit earned by the tick clock while the samples lag is cut off by the credit cap).
    let (miss, log) = worst(Signal::PerPidSpans, SimConfig::default());
    println!("{log}");
    assert!(miss > 20.0, "missed by only {miss:.1} points:\n{log}");
    let one = run(
        &[0.3],
        Signal::PerPidSpans,
        SimConfig::default(),
        ThrottleConfig::default(),
    );
    assert!(one[0] < 0.25, "{one:?}");
}

#[test]
fn a_slow_or_late_driver_and_a_deep_queue_still_hold() {
    let base = SimConfig::default();
    for sim in [
        // The slowest sample period NVML documents.
        SimConfig {
            period_us: 1_000_000,
            jitter_us: 10_000,
            ..base
        },
        // Samples visible 30 ms after their timestamp, process samples stamped 3 ms after the
        // device sample.
        SimConfig {
            publish_delay_us: 30_000,
            process_offset_us: 3_000,
            ..base
        },
        // 20 ms of work queued: the GPU runs on that long after a freeze.
        SimConfig {
            depth_us: 20_000.0,
            ..base
        },
    ] {
        let (miss, log) = worst(Signal::Sampled, sim);
        assert!(miss <= 1.0, "{sim:?}: missed by {miss:.1} points:\n{log}");
    }
}

#[test]
fn without_device_samples_the_process_samples_stand_in_within_five_points() {
    let sim = SimConfig {
        device_samples: false,
        ..SimConfig::default()
    };
    let (miss, log) = worst(Signal::Sampled, sim);
    println!("{log}");
    assert!(miss <= 5.0, "missed by {miss:.1} points:\n{log}");
}

/// How the throttle holds shares in [`run_mode`].
#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    /// Exclusive slots on the device samples, charged as held (the default).
    Slots,
    /// Exclusive slots charged the busy time the device samples measured in them.
    SlotsChargedBusy,
    /// Token buckets on device time apportioned by process samples (the mode before).
    Buckets,
}

impl Mode {
    /// What a slot costs in this mode.
    fn charge(self) -> Charge {
        if self == Mode::SlotsChargedBusy {
            Charge::Busy
        } else {
            Charge::Held
        }
    }
}

/// The cases of issue 39: alone, and pairs that fill the GPU.
const CASES_39: [&[f64]; 7] = [
    &[0.1],
    &[0.3],
    &[0.5],
    &[0.9],
    &[0.1, 0.9],
    &[0.3, 0.7],
    &[0.5, 0.5],
];

/// What one run gave each tenant, by the model's own account.
#[derive(Debug)]
struct Got {
    /// Its fraction of the GPU's time over the measured span.
    time: Vec<f64>,
    /// The fraction a tenant gets alone and unthrottled on the same GPU (gpu-check's baseline
    /// row): a share is judged as `time / alone`, the share of what it does alone.
    alone: f64,
    /// Its work (GPU time at the clock it ran at) over the measured span, over the work a
    /// tenant alone and always busy does in the same span.
    work: Vec<f64>,
    /// What the throttle's own figures said it got (its measured GPU time over the span).
    reported: Vec<f64>,
}

/// Runs one always-busy tenant per share for `measure` after a warm-up, on `sim`.
fn run_mode(shares: &[f64], mode: Mode, sim: SimConfig, policy: ComputePolicy) -> Got {
    let measure = Duration::from_secs(20);
    let alone = alone(sim, measure);
    let handle = SimHandle::new(sim);
    let dirs: Vec<String> = (0..shares.len()).map(|i| format!("/sim/t{i}")).collect();
    for (i, dir) in dirs.iter().enumerate() {
        handle.gpu().add(100 + i as u32, dir);
    }
    let members: Vec<Member> = dirs
        .iter()
        .zip(shares)
        .map(|(dir, share)| Member {
            cgroup_dir: dir.into(),
            share_ppm: (share * 1e6).round() as u32,
            policy,
        })
        .collect();
    let tick_us = ThrottleConfig::default().tick.as_micros() as u64;
    let mut engine: Box<dyn FnMut(Instant, bool) -> Vec<Duration>> = match mode {
        Mode::Slots | Mode::SlotsChargedBusy => {
            let mut cgroups = SimCgroups {
                sim: handle.clone(),
                source: Box::new(SampledDevice::new(handle.clone())) as Box<dyn DeviceSignal>,
            };
            let mut s = Scheduler::new(SlotConfig {
                charge: mode.charge(),
                ..SlotConfig::default()
            });
            for (i, m) in members.iter().enumerate() {
                s.set(0, i as u64, m);
            }
            Box::new(move |now, tick| {
                if tick || s.next_event().is_some_and(|at| at <= now) {
                    s.tick(now, &mut cgroups);
                }
                let mut stats: Vec<_> = s.stats(now).collect();
                stats.sort_by_key(|(k, _)| *k);
                stats.into_iter().map(|(_, st)| st.gpu_time).collect()
            })
        }
        Mode::Buckets => {
            let mut cgroups = SimCgroups {
                sim: handle.clone(),
                source: Box::new(SampledSource::new(handle.clone())) as Box<dyn UsageSource>,
            };
            let mut c = Controller::new(ThrottleConfig::default().period);
            for (i, m) in members.iter().enumerate() {
                c.set(0, i as u64, m);
            }
            Box::new(move |now, tick| {
                if tick {
                    c.tick(now, &mut cgroups);
                }
                let mut stats: Vec<_> = c.stats(now).collect();
                stats.sort_by_key(|(k, _)| *k);
                stats.into_iter().map(|(_, st)| st.gpu_time).collect()
            })
        }
    };
    let mut run_for = |d: Duration| {
        let steps = d.as_micros() as u64 / STEP_US;
        let mut reported = Vec::new();
        for n in 1..=steps {
            handle.gpu().step(STEP_US);
            let now = handle.gpu().now();
            reported = engine(now, (n * STEP_US).is_multiple_of(tick_us));
        }
        reported
    };
    run_for(WARMUP);
    let time_before: Vec<Duration> = dirs.iter().map(|d| handle.gpu().gpu_time(d)).collect();
    let work_before: Vec<f64> = dirs.iter().map(|d| handle.gpu().work(d)).collect();
    let reported_before = run_for(Duration::from_micros(STEP_US));
    let reported_after = run_for(measure);
    let span_us = measure.as_secs_f64() * 1e6;
    let gpu = handle.gpu();
    Got {
        alone,
        time: dirs
            .iter()
            .zip(&time_before)
            .map(|(d, b)| gpu.gpu_time(d).saturating_sub(*b).as_secs_f64() / measure.as_secs_f64())
            .collect(),
        work: dirs
            .iter()
            .zip(&work_before)
            .map(|(d, b)| (gpu.work(d) - b) / span_us)
            .collect(),
        reported: reported_after
            .iter()
            .zip(
                reported_before
                    .iter()
                    .chain(std::iter::repeat(&Duration::ZERO)),
            )
            .map(|(a, b)| a.saturating_sub(*b).as_secs_f64() / measure.as_secs_f64())
            .collect(),
    }
}

/// The GPU time per second of one tenant alone and never frozen on `sim`, over `measure` after
/// the warm-up: what gpu-check's baseline row measures.
fn alone(sim: SimConfig, measure: Duration) -> f64 {
    let handle = SimHandle::new(sim);
    handle.gpu().add(100, "/sim/alone");
    let run_for = |d: Duration| {
        for _ in 0..d.as_micros() as u64 / STEP_US {
            handle.gpu().step(STEP_US);
        }
    };
    run_for(WARMUP);
    let before = handle.gpu().gpu_time("/sim/alone");
    run_for(measure);
    let got = handle.gpu().gpu_time("/sim/alone").saturating_sub(before);
    got.as_secs_f64() / measure.as_secs_f64()
}

/// The largest miss in points over [`CASES_39`], judged by the model's GPU time over a tenant's
/// alone (as gpu-check judges), with a line per case for the log.
fn worst_39(mode: Mode, sim: SimConfig) -> (f64, String) {
    let mut worst = 0.0f64;
    let mut log = String::new();
    for shares in CASES_39 {
        let got = run_mode(shares, mode, sim, ComputePolicy::Hard);
        for (share, time) in shares.iter().zip(&got.time) {
            worst = worst.max((time / got.alone - share).abs() * 100.0);
        }
        let _ = writeln!(
            log,
            "{mode:?} {shares:?} -> of alone {:.3?}; time {:.3?} work {:.3?} reported {:.3?} \
             alone {:.3}",
            got.time.iter().map(|t| t / got.alone).collect::<Vec<_>>(),
            got.time,
            got.work,
            got.reported,
            got.alone
        );
    }
    (worst, log)
}

#[test]
fn on_the_h200_model_slots_hold_every_share_within_two_points() {
    let (miss, log) = worst_39(Mode::Slots, SimConfig::h200());
    println!("{log}");
    assert!(miss <= 2.0, "missed by {miss:.2} points:\n{log}");
}

#[test]
fn charged_by_busy_time_a_tenant_alone_gets_more_than_its_share() {
    // What the H200 showed (2026-11-28): its matmul loop kept the GPU 96.7 % busy alone, and a
    // tenant at 0.9 charged by busy time was given slots until it had been busy 0.9 of the
    // time, 93 % of what it does alone.
    let got = run_mode(
        &[0.9],
        Mode::SlotsChargedBusy,
        SimConfig::h200(),
        ComputePolicy::Hard,
    );
    let of_alone = got.time[0] / got.alone;
    assert!(of_alone > 0.92, "{got:?}");
    let got = run_mode(&[0.9], Mode::Slots, SimConfig::h200(), ComputePolicy::Hard);
    let of_alone = got.time[0] / got.alone;
    assert!((of_alone - 0.9).abs() <= 0.02, "{got:?}");
}

/// The model with process samples that land just past the bucket mode's match window (10 ms):
/// each describes the span before the device span it is matched to (the reading of the
/// H200's pairs).
fn late_process_samples() -> SimConfig {
    SimConfig {
        process_window_lag_us: Some(20_000),
        ..SimConfig::h200()
    }
}

#[test]
fn where_process_samples_land_late_the_bucket_mode_misses_and_slots_do_not() {
    let (miss, log) = worst_39(Mode::Buckets, late_process_samples());
    println!("{log}");
    assert!(
        miss > 5.0,
        "the bucket mode missed by only {miss:.2} points:\n{log}"
    );
    let (miss, log) = worst_39(Mode::Slots, late_process_samples());
    println!("{log}");
    assert!(miss <= 2.0, "slots missed by {miss:.2} points:\n{log}");
}

#[test]
fn slots_hold_on_the_documented_drivers_too() {
    let base = SimConfig::h200();
    for sim in [
        // The slowest sample period NVML documents.
        SimConfig {
            period_us: 1_000_000,
            jitter_us: 10_000,
            periods_us: None,
            ..base
        },
        // A sixth of a second with 2 ms of jitter (the simulated GPU before the model).
        SimConfig::default(),
        // The model as first read from the H200's figures, before its recording.
        SimConfig::h200_as_first_read(),
        // A late driver.
        SimConfig {
            publish_delay_us: 60_000,
            ..base
        },
    ] {
        let (miss, log) = worst_39(Mode::Slots, sim);
        assert!(miss <= 2.0, "{sim:?}: missed by {miss:.2} points:\n{log}");
    }
}

#[test]
fn slots_cost_at_most_three_percent_of_the_gpu() {
    for shares in [&[0.5, 0.5][..], &[0.3, 0.7], &[0.1, 0.9]] {
        let got = run_mode(shares, Mode::Slots, SimConfig::h200(), ComputePolicy::Hard);
        let used: f64 = got.time.iter().sum::<f64>() / got.alone;
        assert!(
            used >= 0.97,
            "{shares:?}: the GPU was busy {used:.3} of a tenant alone"
        );
    }
}

#[test]
fn the_loops_own_figure_agrees_with_the_model_within_two_points() {
    for shares in [&[0.3][..], &[0.3, 0.7]] {
        let got = run_mode(shares, Mode::Slots, SimConfig::h200(), ComputePolicy::Hard);
        for (time, reported) in got.time.iter().zip(&got.reported) {
            assert!((time - reported).abs() <= 0.02, "{shares:?}: {got:?}");
        }
    }
}

#[test]
fn work_judges_a_tenant_alone_high_where_time_does_not() {
    // Why gpu-check judges time, not matmul counts: a GPU held partly idle clocks up, so a
    // tenant at 0.3 does more than 0.3 of the work it does alone at full duty (2 points more,
    // at least, on this model).
    let got = run_mode(&[0.3], Mode::Slots, SimConfig::h200(), ComputePolicy::Hard);
    let time = got.time[0] / got.alone;
    assert!((time - 0.3).abs() <= 0.02, "{got:?}");
    assert!(got.work[0] / got.alone > time + 0.02, "{got:?}");
}

#[test]
fn work_conserving_slots_give_an_idle_tenants_time_away() {
    let handle = SimHandle::new(SimConfig::h200());
    handle.gpu().add(100, "/sim/busy");
    handle.gpu().add_idle(101, "/sim/idle");
    let mut cgroups = SimCgroups {
        sim: handle.clone(),
        source: Box::new(SampledDevice::new(handle.clone())) as Box<dyn DeviceSignal>,
    };
    let mut s = Scheduler::new(SlotConfig::default());
    for (key, dir, share) in [(1, "/sim/busy", 0.3), (2, "/sim/idle", 0.7)] {
        s.set(
            0,
            key,
            &Member {
                cgroup_dir: dir.into(),
                share_ppm: (share * 1e6) as u32,
                policy: ComputePolicy::WorkConserving,
            },
        );
    }
    let mut run_for = |d: Duration| {
        for n in 1..=d.as_micros() as u64 / STEP_US {
            handle.gpu().step(STEP_US);
            let now = handle.gpu().now();
            if n % 100 == 0 || s.next_event().is_some_and(|at| at <= now) {
                s.tick(now, &mut cgroups);
            }
        }
    };
    run_for(WARMUP);
    let before = handle.gpu().gpu_time("/sim/busy");
    let measure = Duration::from_secs(10);
    run_for(measure);
    let got = handle
        .gpu()
        .gpu_time("/sim/busy")
        .saturating_sub(before)
        .as_secs_f64()
        / measure.as_secs_f64()
        / alone(SimConfig::h200(), measure);
    assert!(
        got >= 0.97,
        "the busy tenant got {got:.3} of what it does alone"
    );
}
