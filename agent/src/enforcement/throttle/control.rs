//! The throttle's decisions, kept pure: the time is passed in and cgroups are read and frozen
//! through [`Cgroups`], so tests drive it with a fake clock and fake cgroups, without sleeping.
//!
//! Each member (a cgroup on one GPU) has a token bucket counted in nanoseconds of busy time:
//! every tick it earns `share × elapsed` and pays what it measurably used. A member in debt
//! wants to be frozen until it has earned back `share × (1 − share) × period`; for a member that
//! is always busy this makes one freeze/thaw cycle last one period (run `share × period`, stay
//! frozen `(1 − share) × period`), and because debt carries over, measurement lag and freeze
//! latency are paid back rather than lost. Credit is capped at `share × period`, so idle time
//! banks no burst larger than one period's worth.

use std::{
    collections::{BTreeMap, HashMap},
    io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::{ComputePolicy, Member, ThrottleStats};

/// A `work-conserving` member counts the others on its GPU as idle while each uses less than
/// this fraction of its own share.
const IDLE_FRACTION_OF_SHARE: f64 = 0.1;

/// Debt is capped at this many periods, so one wild reading can't freeze a cgroup for long.
const MAX_DEBT_PERIODS: u32 = 10;

const PPM: i128 = 1_000_000;

/// The kernel side of the throttle, faked in tests.
pub(crate) trait Cgroups {
    /// Cumulative busy time of the cgroup at `dir` on `gpu`.
    fn busy(&mut self, gpu: u32, dir: &Path) -> io::Result<Duration>;
    /// Freezes (`true`) or thaws the cgroup at `dir`.
    fn set_frozen(&mut self, dir: &Path, frozen: bool) -> io::Result<()>;
}

/// Whether an error means the cgroup no longer exists.
pub(crate) fn is_gone(err: &io::Error) -> bool {
    // ENODEV: a file of a cgroup that was removed while we held it open.
    err.kind() == io::ErrorKind::NotFound || err.raw_os_error() == Some(libc::ENODEV)
}

/// One cgroup on one GPU.
#[derive(Debug)]
struct Bucket {
    share_ppm: u32,
    policy: ComputePolicy,
    /// Nanoseconds of busy time it may still use; negative is debt.
    credit: i64,
    /// The last reading, and when it was taken; `None` until the first.
    last: Option<(Instant, Duration)>,
    /// Recent running fraction (an exponential average over about one period).
    recent: f64,
    /// This GPU's loop wants the cgroup frozen.
    wants_frozen: bool,
}

impl Bucket {
    fn new(member: &Member) -> Self {
        Self {
            share_ppm: member.share_ppm,
            policy: member.policy,
            credit: 0,
            last: None,
            recent: 0.0,
            wants_frozen: false,
        }
    }

    /// `share × d` in nanoseconds.
    fn of_share(&self, d: Duration) -> i64 {
        let ns = (d.as_nanos() as i128) * i128::from(self.share_ppm) / PPM;
        i64::try_from(ns).unwrap_or(i64::MAX)
    }

    fn cap(&self, period: Duration) -> i64 {
        self.of_share(period)
    }

    /// Credit needed to thaw: `share × (1 − share) × period`.
    fn band(&self, period: Duration) -> i64 {
        let idle_ppm = PPM - i128::from(self.share_ppm);
        let ns = i128::from(self.of_share(period)) * idle_ppm / PPM;
        i64::try_from(ns).unwrap_or(i64::MAX)
    }

    fn observe(&mut self, now: Instant, busy: Duration, period: Duration) {
        if let Some((at, before)) = self.last {
            let elapsed = now.saturating_duration_since(at);
            // A counter that went backwards (a re-created cgroup) counts as no use.
            let used = busy.saturating_sub(before);
            let used_ns = i64::try_from(used.as_nanos()).unwrap_or(i64::MAX);
            let debt_cap = -(i64::try_from((period * MAX_DEBT_PERIODS).as_nanos()).unwrap_or(0));
            self.credit = self
                .credit
                .saturating_add(self.of_share(elapsed))
                .saturating_sub(used_ns)
                .clamp(debt_cap, self.cap(period));
            if !elapsed.is_zero() {
                let sample = used.as_secs_f64() / elapsed.as_secs_f64();
                let alpha = 1.0 - (-elapsed.as_secs_f64() / period.as_secs_f64()).exp();
                self.recent += alpha * (sample - self.recent);
            }
        }
        self.last = Some((now, busy));
    }

    /// Uses the GPU, or wants to: the others on a GPU must then make room.
    fn active(&self) -> bool {
        self.wants_frozen || self.recent >= IDLE_FRACTION_OF_SHARE * f64::from(self.share_ppm) / 1e6
    }

    fn decide(&mut self, others_active: bool, period: Duration) {
        if self.policy == ComputePolicy::WorkConserving && !others_active {
            // Idle capacity is free to use, but it is not lent: no debt is kept for it, so the
            // member falls back to its share as soon as the others contend, without a penalty.
            self.credit = self.credit.max(0);
            self.wants_frozen = false;
        } else if self.wants_frozen {
            self.wants_frozen = self.credit < self.band(period);
        } else {
            self.wants_frozen = self.credit < 0;
        }
    }
}

/// One cgroup, whatever its GPUs.
#[derive(Debug)]
struct Cgroup {
    dir: PathBuf,
    /// What we last wrote to `cgroup.freeze`; `None` until the first write, so the first tick
    /// writes whatever it decides (thawing a cgroup a dead agent left frozen).
    frozen: Option<bool>,
    frozen_since: Option<Instant>,
    throttled: Duration,
    /// A warning about an error other than "gone" was logged (once is enough).
    warned: bool,
}

impl Cgroup {
    fn warn_once(&mut self, what: &str, err: &io::Error) {
        if !self.warned {
            self.warned = true;
            tracing::warn!(cgroup = %self.dir.display(), "throttle: {what}: {err}");
        }
    }

    /// Writes `frozen` if it differs from what we last wrote. `Err` only when the cgroup is gone.
    fn apply(&mut self, now: Instant, frozen: bool, sys: &mut dyn Cgroups) -> Result<(), Gone> {
        if self.frozen == Some(frozen) {
            return Ok(());
        }
        match sys.set_frozen(&self.dir, frozen) {
            Ok(()) => {
                if frozen {
                    self.frozen_since = Some(now);
                } else if let Some(since) = self.frozen_since.take() {
                    self.throttled += now.saturating_duration_since(since);
                }
                self.frozen = Some(frozen);
                Ok(())
            }
            Err(e) if is_gone(&e) => Err(Gone),
            Err(e) => {
                self.warn_once(if frozen { "freezing" } else { "thawing" }, &e);
                Ok(())
            }
        }
    }

    fn throttled(&self, now: Instant) -> Duration {
        self.throttled
            + self
                .frozen_since
                .map_or(Duration::ZERO, |since| now.saturating_duration_since(since))
    }
}

/// The cgroup disappeared.
struct Gone;

/// Every member of every GPU and what the throttle has done to them.
#[derive(Debug)]
pub(crate) struct Controller {
    period: Duration,
    /// GPU → cgroup key → bucket.
    gpus: BTreeMap<u32, BTreeMap<u64, Bucket>>,
    cgroups: HashMap<u64, Cgroup>,
}

impl Controller {
    pub(crate) fn new(period: Duration) -> Self {
        Self {
            period,
            gpus: BTreeMap::new(),
            cgroups: HashMap::new(),
        }
    }

    /// Adds `key` to `gpu`, or updates its share and policy there (keeping its credit).
    pub(crate) fn set(&mut self, gpu: u32, key: u64, member: &Member) {
        let cgroup = self.cgroups.entry(key).or_insert_with(|| Cgroup {
            dir: member.cgroup_dir.clone(),
            frozen: None,
            frozen_since: None,
            throttled: Duration::ZERO,
            warned: false,
        });
        if cgroup.dir != member.cgroup_dir {
            // Moved: whatever we wrote went to the old directory.
            cgroup.dir.clone_from(&member.cgroup_dir);
            cgroup.frozen = None;
            cgroup.warned = false;
        }
        let period = self.period;
        self.gpus
            .entry(gpu)
            .or_default()
            .entry(key)
            .and_modify(|b| {
                b.share_ppm = member.share_ppm;
                b.policy = member.policy;
                b.credit = b.credit.min(b.cap(period));
            })
            .or_insert_with(|| Bucket::new(member));
    }

    /// Drops `key` from every GPU and thaws it.
    pub(crate) fn remove(&mut self, key: u64, now: Instant, sys: &mut dyn Cgroups) {
        self.forget(key);
        if let Some(mut cgroup) = self.cgroups.remove(&key) {
            cgroup.frozen = None; // thaw even if we think it's thawed
            // A cgroup that's gone needs no thawing.
            let _ = cgroup.apply(now, false, sys);
        }
    }

    /// Thaws every cgroup (on shutdown).
    pub(crate) fn thaw_all(&mut self, now: Instant, sys: &mut dyn Cgroups) {
        for cgroup in self.cgroups.values_mut() {
            if cgroup.frozen != Some(false) {
                cgroup.frozen = None;
                let _ = cgroup.apply(now, false, sys);
            }
        }
    }

    fn forget(&mut self, key: u64) {
        for members in self.gpus.values_mut() {
            members.remove(&key);
        }
        self.gpus.retain(|_, members| !members.is_empty());
    }

    /// Measures every member and freezes or thaws each cgroup accordingly.
    pub(crate) fn tick(&mut self, now: Instant, sys: &mut dyn Cgroups) {
        let mut gone = Vec::new();
        for (&gpu, members) in &mut self.gpus {
            for (key, bucket) in members.iter_mut() {
                let Some(cgroup) = self.cgroups.get_mut(key) else {
                    continue;
                };
                match sys.busy(gpu, &cgroup.dir) {
                    Ok(busy) => bucket.observe(now, busy, self.period),
                    Err(e) if is_gone(&e) => gone.push(*key),
                    // Keep the last reading: the next good one accounts for the whole interval.
                    Err(e) => cgroup.warn_once("reading usage", &e),
                }
            }
            let active: Vec<(u64, bool)> = members.iter().map(|(k, b)| (*k, b.active())).collect();
            for (key, bucket) in members.iter_mut() {
                let others_active = active.iter().any(|(k, a)| k != key && *a);
                bucket.decide(others_active, self.period);
            }
        }
        for (key, cgroup) in &mut self.cgroups {
            if gone.contains(key) {
                continue;
            }
            // Frozen when any GPU's loop wants it frozen.
            let frozen = self
                .gpus
                .values()
                .filter_map(|members| members.get(key))
                .any(|b| b.wants_frozen);
            if cgroup.apply(now, frozen, sys).is_err() {
                gone.push(*key);
            }
        }
        for key in gone {
            if let Some(cgroup) = self.cgroups.remove(&key) {
                tracing::debug!(cgroup = %cgroup.dir.display(), key, "throttle: cgroup is gone; dropped");
            }
            self.forget(key);
        }
    }

    /// What the throttle knows of each cgroup, at `now`.
    pub(crate) fn stats(&self, now: Instant) -> impl Iterator<Item = (u64, ThrottleStats)> + '_ {
        self.cgroups.iter().map(move |(&key, cgroup)| {
            let running_fraction = self
                .gpus
                .values()
                .filter_map(|members| members.get(&key))
                .map(|b| b.recent)
                .fold(0.0, f64::max);
            let stats = ThrottleStats {
                throttled: cgroup.throttled(now),
                frozen: cgroup.frozen == Some(true),
                running_fraction,
            };
            (key, stats)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(10);
    const PERIOD: Duration = Duration::from_millis(100);

    /// Fake cgroups: each directory runs a workload that wants `demand` of a GPU (1.0 = always
    /// busy) and makes progress only while thawed.
    #[derive(Default)]
    struct Fake {
        cgroups: HashMap<PathBuf, FakeCgroup>,
        writes: usize,
    }

    #[derive(Default)]
    struct FakeCgroup {
        demand: f64,
        busy: Duration,
        frozen: bool,
        fail_reads: bool,
    }

    impl Fake {
        fn add(&mut self, dir: &str, demand: f64) {
            self.cgroups.insert(
                PathBuf::from(dir),
                FakeCgroup {
                    demand,
                    ..FakeCgroup::default()
                },
            );
        }

        fn get(&mut self, dir: &str) -> &mut FakeCgroup {
            self.cgroups.get_mut(Path::new(dir)).unwrap()
        }

        /// Time passes: thawed workloads progress.
        fn advance(&mut self, d: Duration) {
            for c in self.cgroups.values_mut() {
                if !c.frozen {
                    c.busy += d.mul_f64(c.demand);
                }
            }
        }
    }

    impl Cgroups for Fake {
        fn busy(&mut self, _gpu: u32, dir: &Path) -> io::Result<Duration> {
            match self.cgroups.get(dir) {
                None => Err(io::ErrorKind::NotFound.into()),
                Some(c) if c.fail_reads => Err(io::ErrorKind::PermissionDenied.into()),
                Some(c) => Ok(c.busy),
            }
        }

        fn set_frozen(&mut self, dir: &Path, frozen: bool) -> io::Result<()> {
            let c = self.cgroups.get_mut(dir).ok_or(io::ErrorKind::NotFound)?;
            c.frozen = frozen;
            self.writes += 1;
            Ok(())
        }
    }

    fn member(dir: &str, share: f64, policy: ComputePolicy) -> Member {
        Member {
            cgroup_dir: PathBuf::from(dir),
            share_ppm: (share * 1e6) as u32,
            policy,
        }
    }

    /// Runs `ticks` ticks; returns the busy time each directory gained.
    fn run(
        ctl: &mut Controller,
        fake: &mut Fake,
        clock: &mut Instant,
        ticks: u32,
    ) -> HashMap<PathBuf, Duration> {
        let start: HashMap<_, _> = fake
            .cgroups
            .iter()
            .map(|(d, c)| (d.clone(), c.busy))
            .collect();
        for _ in 0..ticks {
            fake.advance(TICK);
            *clock += TICK;
            ctl.tick(*clock, fake);
        }
        fake.cgroups
            .iter()
            .map(|(d, c)| {
                (
                    d.clone(),
                    c.busy - start.get(d).copied().unwrap_or_default(),
                )
            })
            .collect()
    }

    fn fraction(gained: &HashMap<PathBuf, Duration>, dir: &str, ticks: u32) -> f64 {
        gained[Path::new(dir)].as_secs_f64() / (TICK * ticks).as_secs_f64()
    }

    fn setup() -> (Controller, Fake, Instant) {
        (Controller::new(PERIOD), Fake::default(), Instant::now())
    }

    #[test]
    fn hard_holds_a_busy_member_to_its_share() {
        for share in [0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0] {
            let (mut ctl, mut fake, mut clock) = setup();
            fake.add("/a", 1.0);
            ctl.set(0, 1, &member("/a", share, ComputePolicy::Hard));
            let gained = run(&mut ctl, &mut fake, &mut clock, 1000);
            let got = fraction(&gained, "/a", 1000);
            assert!((got - share).abs() < 0.02, "share {share}: got {got}");
        }
    }

    #[test]
    fn one_cycle_lasts_about_one_period() {
        let (mut ctl, mut fake, mut clock) = setup();
        fake.add("/a", 1.0);
        ctl.set(0, 1, &member("/a", 0.5, ComputePolicy::Hard));
        run(&mut ctl, &mut fake, &mut clock, 100);
        let before = fake.writes;
        run(&mut ctl, &mut fake, &mut clock, 1000); // 10 s
        let cycles = (fake.writes - before) / 2;
        assert!(
            (80..=110).contains(&cycles),
            "{cycles} cycles in 100 periods"
        );
    }

    #[test]
    fn a_light_member_is_never_frozen() {
        let (mut ctl, mut fake, mut clock) = setup();
        fake.add("/a", 0.2);
        ctl.set(0, 1, &member("/a", 0.3, ComputePolicy::Hard));
        let gained = run(&mut ctl, &mut fake, &mut clock, 500);
        assert!((fraction(&gained, "/a", 500) - 0.2).abs() < 1e-9);
        let stats: HashMap<_, _> = ctl.stats(clock).collect();
        assert_eq!(stats[&1].throttled, Duration::ZERO);
        assert!(!stats[&1].frozen);
        assert!((stats[&1].running_fraction - 0.2).abs() < 0.01);
    }

    #[test]
    fn idle_time_banks_at_most_one_period() {
        let (mut ctl, mut fake, mut clock) = setup();
        fake.add("/a", 0.0);
        ctl.set(0, 1, &member("/a", 0.5, ComputePolicy::Hard));
        run(&mut ctl, &mut fake, &mut clock, 1000);
        fake.get("/a").demand = 1.0;
        // 1 s busy after 10 s idle: half of it plus one period's worth of credit, no more.
        let gained = run(&mut ctl, &mut fake, &mut clock, 100);
        let got = fraction(&gained, "/a", 100);
        assert!((0.5..=0.5 + 0.05 + 0.02).contains(&got), "{got}");
    }

    #[test]
    fn two_members_split_by_share() {
        let (mut ctl, mut fake, mut clock) = setup();
        fake.add("/a", 1.0);
        fake.add("/b", 1.0);
        ctl.set(0, 1, &member("/a", 0.3, ComputePolicy::Hard));
        ctl.set(0, 2, &member("/b", 0.7, ComputePolicy::Hard));
        let gained = run(&mut ctl, &mut fake, &mut clock, 1000);
        assert!((fraction(&gained, "/a", 1000) - 0.3).abs() < 0.02);
        assert!((fraction(&gained, "/b", 1000) - 0.7).abs() < 0.02);
    }

    #[test]
    fn work_conserving_uses_idle_capacity_then_falls_back() {
        let (mut ctl, mut fake, mut clock) = setup();
        fake.add("/a", 1.0);
        fake.add("/b", 0.0);
        ctl.set(0, 1, &member("/a", 0.3, ComputePolicy::WorkConserving));
        ctl.set(0, 2, &member("/b", 0.7, ComputePolicy::Hard));
        let alone = run(&mut ctl, &mut fake, &mut clock, 500);
        assert!((fraction(&alone, "/a", 500) - 1.0).abs() < 1e-9);

        fake.get("/b").demand = 1.0;
        let contended = run(&mut ctl, &mut fake, &mut clock, 1000);
        assert!((fraction(&contended, "/a", 1000) - 0.3).abs() < 0.03);
        assert!((fraction(&contended, "/b", 1000) - 0.7).abs() < 0.03);

        // b goes idle again: a gets everything back, soon.
        fake.get("/b").demand = 0.0;
        run(&mut ctl, &mut fake, &mut clock, 50);
        let freed = run(&mut ctl, &mut fake, &mut clock, 500);
        assert!((fraction(&freed, "/a", 500) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn work_conserving_alone_on_its_gpu_is_never_frozen() {
        let (mut ctl, mut fake, mut clock) = setup();
        fake.add("/a", 1.0);
        ctl.set(3, 1, &member("/a", 0.1, ComputePolicy::WorkConserving));
        let gained = run(&mut ctl, &mut fake, &mut clock, 300);
        assert!((fraction(&gained, "/a", 300) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn hard_does_not_use_idle_capacity() {
        let (mut ctl, mut fake, mut clock) = setup();
        fake.add("/a", 1.0);
        fake.add("/b", 0.0);
        ctl.set(0, 1, &member("/a", 0.3, ComputePolicy::Hard));
        ctl.set(0, 2, &member("/b", 0.7, ComputePolicy::Hard));
        let gained = run(&mut ctl, &mut fake, &mut clock, 1000);
        assert!((fraction(&gained, "/a", 1000) - 0.3).abs() < 0.02);
    }

    #[test]
    fn frozen_when_any_gpu_wants_it() {
        let (mut ctl, mut fake, mut clock) = setup();
        fake.add("/a", 1.0);
        // The fake reports the same busy time on both GPUs, like the CPU stand-in.
        ctl.set(0, 1, &member("/a", 0.8, ComputePolicy::Hard));
        ctl.set(1, 1, &member("/a", 0.2, ComputePolicy::Hard));
        let gained = run(&mut ctl, &mut fake, &mut clock, 1000);
        assert!((fraction(&gained, "/a", 1000) - 0.2).abs() < 0.02);
    }

    #[test]
    fn throttled_counts_frozen_time() {
        let (mut ctl, mut fake, mut clock) = setup();
        fake.add("/a", 1.0);
        ctl.set(0, 1, &member("/a", 0.25, ComputePolicy::Hard));
        run(&mut ctl, &mut fake, &mut clock, 1000);
        let stats: HashMap<_, _> = ctl.stats(clock).collect();
        let throttled = stats[&1].throttled.as_secs_f64();
        assert!((throttled - 7.5).abs() < 0.2, "{throttled}");
        assert!((stats[&1].running_fraction - 0.25).abs() < 0.2);
    }

    #[test]
    fn remove_and_thaw_all_thaw() {
        let (mut ctl, mut fake, mut clock) = setup();
        fake.add("/a", 1.0);
        fake.add("/b", 1.0);
        ctl.set(0, 1, &member("/a", 0.1, ComputePolicy::Hard));
        ctl.set(0, 2, &member("/b", 0.1, ComputePolicy::Hard));
        run(&mut ctl, &mut fake, &mut clock, 5);
        assert!(fake.get("/a").frozen && fake.get("/b").frozen);

        ctl.remove(1, clock, &mut fake);
        assert!(!fake.get("/a").frozen);
        assert!(ctl.stats(clock).all(|(k, _)| k == 2));
        run(&mut ctl, &mut fake, &mut clock, 5);
        assert!(!fake.get("/a").frozen, "a removed member stays thawed");

        ctl.thaw_all(clock, &mut fake);
        assert!(!fake.get("/b").frozen);
    }

    #[test]
    fn first_tick_thaws_a_cgroup_left_frozen() {
        let (mut ctl, mut fake, mut clock) = setup();
        fake.add("/a", 1.0);
        fake.get("/a").frozen = true;
        ctl.set(0, 1, &member("/a", 0.5, ComputePolicy::Hard));
        run(&mut ctl, &mut fake, &mut clock, 1);
        assert!(!fake.get("/a").frozen);
    }

    #[test]
    fn a_vanished_cgroup_is_dropped() {
        let (mut ctl, mut fake, mut clock) = setup();
        fake.add("/a", 1.0);
        fake.add("/b", 1.0);
        ctl.set(0, 1, &member("/a", 0.5, ComputePolicy::Hard));
        ctl.set(0, 2, &member("/b", 0.5, ComputePolicy::Hard));
        run(&mut ctl, &mut fake, &mut clock, 10);
        fake.cgroups.remove(Path::new("/a"));
        run(&mut ctl, &mut fake, &mut clock, 10);
        let keys: Vec<u64> = ctl.stats(clock).map(|(k, _)| k).collect();
        assert_eq!(keys, [2]);
        assert!(ctl.gpus[&0].len() == 1);
    }

    #[test]
    fn read_errors_skip_but_keep_the_member() {
        let (mut ctl, mut fake, mut clock) = setup();
        fake.add("/a", 1.0);
        ctl.set(0, 1, &member("/a", 0.5, ComputePolicy::Hard));
        run(&mut ctl, &mut fake, &mut clock, 10);
        fake.get("/a").fail_reads = true;
        run(&mut ctl, &mut fake, &mut clock, 10);
        fake.get("/a").fail_reads = false;
        let gained = run(&mut ctl, &mut fake, &mut clock, 1000);
        assert!((fraction(&gained, "/a", 1000) - 0.5).abs() < 0.03);
    }

    #[test]
    fn updating_a_share_takes_effect() {
        let (mut ctl, mut fake, mut clock) = setup();
        fake.add("/a", 1.0);
        ctl.set(0, 1, &member("/a", 0.8, ComputePolicy::Hard));
        run(&mut ctl, &mut fake, &mut clock, 500);
        ctl.set(0, 1, &member("/a", 0.2, ComputePolicy::Hard));
        let gained = run(&mut ctl, &mut fake, &mut clock, 1000);
        assert!((fraction(&gained, "/a", 1000) - 0.2).abs() < 0.02);
    }
}
