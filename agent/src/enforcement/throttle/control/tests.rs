#![expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "Shares written as fractions in [0, 1]"
)]

use std::path::PathBuf;

use super::*;

const TICK: Duration = Duration::from_millis(10);
const PERIOD: Duration = Duration::from_millis(100);

/// Fake cgroups: each directory runs a workload that wants `demand` of a GPU (1.0 = always
/// busy) and makes progress only while thawed.
#[derive(Default)]
struct Fake {
    cgroups: HashMap<PathBuf, FakeCgroup>,
    writes: usize,
    /// The fake's clock: readings are complete up to here.
    now: Option<Instant>,
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

    /// Time passes (to `now`): thawed workloads progress.
    fn advance(&mut self, d: Duration, now: Instant) {
        self.now = Some(now);
        for c in self.cgroups.values_mut() {
            if !c.frozen {
                c.busy += d.mul_f64(c.demand);
            }
        }
    }
}

impl Cgroups for Fake {
    fn busy(&mut self, _gpu: u32, dir: &Path) -> io::Result<Usage> {
        let until = self.now.ok_or(io::ErrorKind::WouldBlock)?;
        match self.cgroups.get(dir) {
            None => Err(io::ErrorKind::NotFound.into()),
            Some(c) if c.fail_reads => Err(io::ErrorKind::PermissionDenied.into()),
            Some(c) => Ok(Usage {
                busy: c.busy,
                until,
            }),
        }
    }
}

impl Freezer for Fake {
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
        *clock += TICK;
        fake.advance(TICK, *clock);
        ctl.tick(*clock, fake);
    }
    fake.cgroups
        .iter()
        .map(|(d, c)| {
            (
                d.clone(),
                c.busy
                    .checked_sub(start.get(d).copied().unwrap_or_default())
                    .unwrap(),
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

#[test]
fn a_held_cgroup_stays_frozen_whatever_its_credit_until_let_go() {
    let (mut ctl, mut fake, mut clock) = setup();
    // An idle member with a full share would be thawed at every tick.
    fake.add("/a", 0.0);
    ctl.set(0, 1, &member("/a", 0.9, ComputePolicy::WorkConserving));
    run(&mut ctl, &mut fake, &mut clock, 3);
    assert!(!fake.get("/a").frozen);
    ctl.hold(1, Path::new("/a"), true, clock, &mut fake);
    assert!(fake.get("/a").frozen, "held at once, not at the next tick");
    run(&mut ctl, &mut fake, &mut clock, 50);
    assert!(
        fake.get("/a").frozen,
        "the buckets do not thaw a held cgroup"
    );
    ctl.hold(1, Path::new("/a"), false, clock, &mut fake);
    assert!(!fake.get("/a").frozen);

    // A cgroup with no share is held the same way, until removed.
    fake.add("/m", 1.0);
    ctl.hold(7, Path::new("/m"), true, clock, &mut fake);
    run(&mut ctl, &mut fake, &mut clock, 5);
    assert!(fake.get("/m").frozen);
    ctl.remove(7, clock, &mut fake);
    assert!(!fake.get("/m").frozen);
}
