#![expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "Shares written as fractions in [0, 1]"
)]

use std::path::PathBuf;

use super::*;
use crate::enforcement::throttle::BusyInterval;

const TICK: Duration = Duration::from_millis(1);

/// A GPU that runs, at each moment, the thawed cgroups' work (each wants `demand` of the GPU)
/// in processor sharing, and a signal that reports its busy time every millisecond: the
/// scheduler alone, without a driver's sampling in the way.
#[derive(Default)]
struct Fake {
    cgroups: BTreeMap<PathBuf, FakeCgroup>,
    last: Option<Instant>,
    pending: Duration,
    /// The signal measures no busy time, only which cgroups ran (a MIG instance's, whose
    /// activity is read from the cgroups' CPU time: a frozen one shows none).
    time_only: bool,
}

#[derive(Default)]
struct FakeCgroup {
    demand: f64,
    frozen: bool,
    got: Duration,
}

impl Fake {
    fn add(&mut self, dir: &str, demand: f64) {
        self.cgroups.insert(
            dir.into(),
            FakeCgroup {
                demand,
                ..FakeCgroup::default()
            },
        );
    }

    /// `d` passes: thawed cgroups run, sharing the GPU.
    fn advance(&mut self, d: Duration) {
        let running: Vec<&mut FakeCgroup> = self
            .cgroups
            .values_mut()
            .filter(|c| !c.frozen && c.demand > 0.0)
            .collect();
        let want: f64 = running.iter().map(|c| c.demand).sum();
        let scale = if want > 1.0 { 1.0 / want } else { 1.0 };
        for c in running {
            let got = d.mul_f64(c.demand * scale);
            c.got += got;
            self.pending += got;
        }
    }
}

impl Freezer for Fake {
    fn set_frozen(&mut self, dir: &Path, frozen: bool) -> io::Result<()> {
        let c = self.cgroups.get_mut(dir).ok_or(io::ErrorKind::NotFound)?;
        c.frozen = frozen;
        Ok(())
    }
}

impl SlotKernel for Fake {
    fn read(&mut self, _gpu: u32, cgroups: &[&Path]) -> io::Result<DeviceReading> {
        let now = self.last.map_or_else(Instant::now, |l| l + TICK);
        let mut reading = DeviceReading {
            active: cgroups
                .iter()
                .map(|d| {
                    self.cgroups
                        .get(*d)
                        .is_some_and(|c| !c.frozen && c.demand > 0.0)
                })
                .collect(),
            ..DeviceReading::default()
        };
        reading.time_only = self.time_only;
        if let Some(last) = self.last
            && !self.time_only
        {
            reading.intervals.push(BusyInterval {
                start: last,
                end: now,
                busy: std::mem::take(&mut self.pending),
            });
        }
        self.last = Some(now);
        Ok(reading)
    }
}

fn member(dir: &str, share: f64, policy: ComputePolicy) -> Member {
    Member {
        cgroup_dir: PathBuf::from(dir),
        share_ppm: (share * 1e6) as u32,
        policy,
    }
}

/// Runs `d` in 1 ms ticks; returns each cgroup's fraction of the GPU over it.
fn run(s: &mut Scheduler, fake: &mut Fake, d: Duration) -> BTreeMap<PathBuf, f64> {
    let before: BTreeMap<PathBuf, Duration> = fake
        .cgroups
        .iter()
        .map(|(k, c)| (k.clone(), c.got))
        .collect();
    let ticks = (d.as_millis() / TICK.as_millis()) as u32;
    for _ in 0..ticks {
        fake.advance(TICK);
        let now = fake.last.map_or_else(Instant::now, |l| l + TICK);
        s.tick(now, fake);
    }
    fake.cgroups
        .iter()
        .map(|(k, c)| {
            (
                k.clone(),
                c.got.saturating_sub(before[k]).as_secs_f64() / d.as_secs_f64(),
            )
        })
        .collect()
}

fn config() -> SlotConfig {
    SlotConfig {
        slot: Duration::from_millis(100),
        guard: Duration::from_millis(2),
        charge: Charge::Held,
    }
}

#[test]
fn one_busy_cgroup_gets_its_share_alone() {
    for share in [0.1, 0.3, 0.5, 0.9] {
        let mut s = Scheduler::new(config());
        let mut fake = Fake::default();
        fake.add("/a", 1.0);
        s.set(0, 1, &member("/a", share, ComputePolicy::Hard));
        run(&mut s, &mut fake, Duration::from_secs(2));
        let got = run(&mut s, &mut fake, Duration::from_secs(20))[Path::new("/a")];
        assert!((got - share).abs() < 0.01, "share {share}: got {got}");
    }
}

/// Runs two cgroups that always want the GPU at shares `a` and `b`, charged by `charge`, on a
/// GPU whose signal measures busy time or (`time_only`) only which cgroups ran; fails if both
/// are ever thawed at once; returns each one's fraction of the model GPU's work over 20 s.
fn busy_pair(time_only: bool, charge: Charge, a: f64, b: f64) -> (f64, f64) {
    let mut s = Scheduler::new(SlotConfig { charge, ..config() });
    let mut fake = Fake {
        time_only,
        ..Fake::default()
    };
    fake.add("/a", 1.0);
    fake.add("/b", 1.0);
    s.set(0, 1, &member("/a", a, ComputePolicy::Hard));
    s.set(0, 2, &member("/b", b, ComputePolicy::Hard));
    run(&mut s, &mut fake, Duration::from_secs(2));
    for _ in 0..5000 {
        run(&mut s, &mut fake, TICK);
        let together = fake.cgroups.values().all(|c| !c.frozen);
        assert!(!together, "{charge:?} {a} + {b}: both thawed at once");
    }
    let got = run(&mut s, &mut fake, Duration::from_secs(20));
    (got[Path::new("/a")], got[Path::new("/b")])
}

/// The pairs [`busy_pair`] is run with, and the check of what each got: within a point above
/// its share, and below by a point, or two where the shares fill the GPU (the switches' guards,
/// 2 ms of 100, are lost).
const PAIRS: [(f64, f64); 4] = [(0.1, 0.9), (0.3, 0.7), (0.5, 0.5), (0.2, 0.3)];

fn assert_pair(what: &str, (a, b): (f64, f64), (got_a, got_b): (f64, f64)) {
    let slack = if a + b > 0.99 { 0.02 } else { 0.01 };
    for (share, got) in [(a, got_a), (b, got_b)] {
        assert!(
            got <= share + 0.01 && got >= share - slack,
            "{what} {a} + {b}: {share} got {got}"
        );
    }
}

#[test]
fn two_busy_cgroups_split_by_their_shares_and_never_run_together() {
    for pair in PAIRS {
        assert_pair(
            "measured",
            pair,
            busy_pair(false, Charge::Held, pair.0, pair.1),
        );
    }
}

#[test]
fn work_conserving_takes_the_slots_nobody_is_owed_and_returns_them() {
    // Whether the signal measures busy time or (time only) only which cgroups ran.
    for time_only in [false, true] {
        let mut s = Scheduler::new(config());
        let mut fake = Fake {
            time_only,
            ..Fake::default()
        };
        fake.add("/a", 1.0);
        fake.add("/b", 0.0);
        s.set(0, 1, &member("/a", 0.3, ComputePolicy::WorkConserving));
        s.set(0, 2, &member("/b", 0.7, ComputePolicy::Hard));
        run(&mut s, &mut fake, Duration::from_secs(2));
        // /b never touches the GPU: after its first slot it is idle and costs /a nothing.
        let got = run(&mut s, &mut fake, Duration::from_secs(10));
        assert!(
            got[Path::new("/a")] > 0.97,
            "time only {time_only}: {got:?}"
        );
        assert!(
            !fake.cgroups[Path::new("/b")].frozen,
            "time only {time_only}: an idle cgroup is left thawed"
        );
        let near = |got: &BTreeMap<PathBuf, f64>, dir: &str, share: f64| {
            let g = got[Path::new(dir)];
            assert!(
                (g - share).abs() < 0.02,
                "time only {time_only}: {dir} got {g}"
            );
        };
        // /b starts work: it rejoins and /a falls back to its share.
        fake.cgroups.get_mut(Path::new("/b")).unwrap().demand = 1.0;
        run(&mut s, &mut fake, Duration::from_secs(2));
        let got = run(&mut s, &mut fake, Duration::from_secs(20));
        near(&got, "/b", 0.7);
        near(&got, "/a", 0.3);
        // /a stops: it turns idle and is left thawed, /b keeps to its share under `hard`.
        fake.cgroups.get_mut(Path::new("/a")).unwrap().demand = 0.0;
        run(&mut s, &mut fake, Duration::from_secs(2));
        let got = run(&mut s, &mut fake, Duration::from_secs(20));
        near(&got, "/b", 0.7);
        assert!(
            !fake.cgroups[Path::new("/a")].frozen,
            "time only {time_only}: {got:?}"
        );
    }
}

#[test]
fn hard_leaves_slots_idle_when_nobody_is_owed() {
    let mut s = Scheduler::new(config());
    let mut fake = Fake::default();
    fake.add("/a", 1.0);
    fake.add("/b", 0.0);
    s.set(0, 1, &member("/a", 0.3, ComputePolicy::Hard));
    s.set(0, 2, &member("/b", 0.3, ComputePolicy::Hard));
    run(&mut s, &mut fake, Duration::from_secs(2));
    let got = run(&mut s, &mut fake, Duration::from_secs(20));
    assert!((got[Path::new("/a")] - 0.3).abs() < 0.01, "{got:?}");
}

#[test]
fn a_cgroup_on_two_gpus_holds_slots_on_both_at_once() {
    let mut s = Scheduler::new(config());
    let mut fake = Fake::default();
    fake.add("/a", 1.0);
    fake.add("/b", 1.0);
    fake.add("/c", 1.0);
    s.set(0, 1, &member("/a", 0.5, ComputePolicy::Hard));
    s.set(1, 1, &member("/a", 0.5, ComputePolicy::Hard));
    s.set(0, 2, &member("/b", 0.5, ComputePolicy::Hard));
    s.set(1, 3, &member("/c", 0.5, ComputePolicy::Hard));
    run(&mut s, &mut fake, Duration::from_secs(2));
    for _ in 0..3000 {
        run(&mut s, &mut fake, TICK);
        let thawed = |d: &str| !fake.cgroups[Path::new(d)].frozen;
        assert!(!(thawed("/a") && (thawed("/b") || thawed("/c"))));
    }
}

#[test]
fn held_and_removed_cgroups() {
    let mut s = Scheduler::new(config());
    let mut fake = Fake::default();
    fake.add("/a", 1.0);
    s.set(0, 1, &member("/a", 1.0, ComputePolicy::Hard));
    let now = Instant::now();
    s.hold(1, Path::new("/a"), true, now, &mut fake);
    assert!(fake.cgroups[Path::new("/a")].frozen, "held at once");
    let got = run(&mut s, &mut fake, Duration::from_secs(1));
    assert!(got[Path::new("/a")] < 1e-9, "{got:?}");
    s.hold(1, Path::new("/a"), false, now, &mut fake);
    run(&mut s, &mut fake, Duration::from_secs(1));
    s.remove(1, now, &mut fake);
    assert!(!fake.cgroups[Path::new("/a")].frozen, "thawed when removed");
    assert!(s.stats(now).next().is_none());
}

#[test]
fn a_gpu_that_delivers_less_shortens_each_share_in_proportion() {
    // Each workload gets only 90 % of the GPU while it holds it (another load beside it): the
    // shares add up to more than the GPU gives, and each loses a tenth of its own.
    let mut s = Scheduler::new(config());
    let mut fake = Fake::default();
    fake.add("/a", 0.9);
    fake.add("/b", 0.9);
    s.set(0, 1, &member("/a", 0.3, ComputePolicy::Hard));
    s.set(0, 2, &member("/b", 0.7, ComputePolicy::Hard));
    run(&mut s, &mut fake, Duration::from_secs(2));
    let got = run(&mut s, &mut fake, Duration::from_secs(20));
    let (a, b) = (got[Path::new("/a")], got[Path::new("/b")]);
    assert!((a / b - 0.3 / 0.7).abs() < 0.03, "{a} : {b}");
    assert!(a + b > 0.87, "{a} + {b}");
}

#[test]
fn a_held_cgroup_stays_frozen_whatever_its_slots() {
    for demand in [0.0, 1.0] {
        let mut s = Scheduler::new(config());
        let mut fake = Fake::default();
        fake.add("/a", demand);
        fake.add("/b", 1.0);
        s.set(0, 1, &member("/a", 0.5, ComputePolicy::Hard));
        s.set(0, 2, &member("/b", 0.5, ComputePolicy::Hard));
        run(&mut s, &mut fake, Duration::from_secs(1));
        let now = fake.last.unwrap();
        s.hold(1, Path::new("/a"), true, now, &mut fake);
        for _ in 0..2000 {
            run(&mut s, &mut fake, TICK);
            assert!(fake.cgroups[Path::new("/a")].frozen, "demand {demand}");
        }
    }
}

#[test]
fn a_gpu_that_measures_nothing_holds_shares_by_time() {
    // Busy charging has nothing to settle against there: slots stay charged as held.
    for charge in [Charge::Held, Charge::Busy] {
        for pair in PAIRS {
            assert_pair(
                &format!("time only, {charge:?}"),
                pair,
                busy_pair(true, charge, pair.0, pair.1),
            );
        }
    }
}
