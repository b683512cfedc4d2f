//! `cargo xtask bench timings`: how fast things the end-to-end tests only wait for happen.
//!
//! The tests assert behaviour with generous deadlines (a shared two-CPU machine makes any hard
//! time limit flaky); the figures they used to assert are measured here and printed, never
//! asserted:
//!
//! - the compute throttle (needs root): how long `cgroup.events` takes to say thawed after
//!   `remove`, after the last handle is dropped and after [`throttle::thaw`], and the fraction of
//!   the time a lone `work-conserving` member at 0.3 runs, over its unthrottled rate measured in
//!   the same run;
//! - leadership on a real etcd: how long after the leader is killed a standby serves, over the
//!   lease's TTL.
//!
//! `cargo xtask bench timings` runs both; `cargo bench -p gpuwarden-tests --bench timings --
//! takeover` (or `throttle`) one.

use std::{
    fs,
    os::unix::fs::MetadataExt,
    time::{Duration, Instant},
};

use gpuwarden_agent::enforcement::throttle::{
    self, ComputePolicy, CpuTimeUsage, Member, Signal, ThrottleConfig, ThrottleHandle,
};
use gpuwarden_controller::store::StoreSpec;
use gpuwarden_test_support::controller::TestController;
use gpuwarden_test_support::{
    Etcd, TestCgroup, is_root,
    spinner::{Spinner, rates, spin_if_asked},
    wait::{self, PATIENCE},
};

/// Rounds per latency (the median and the worst are shown).
const ROUNDS: usize = 7;
/// The lease of the takeover rounds.
const TTL: Duration = Duration::from_secs(2);

fn main() {
    // A spinner is this binary run again.
    spin_if_asked();
    // `cargo bench` passes `--bench`; a word names one section.
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wants = |section: &str| only.is_empty() || only.iter().any(|a| a == section);
    if wants("throttle") {
        if is_root() {
            throttle_timings();
        } else {
            println!("throttle: skipped, it makes and freezes a cgroup (run as root)");
        }
    }
    if wants("takeover") {
        takeover_timings();
    }
}

/// Median and worst of `samples`, in ms.
fn summary(samples: &mut [Duration]) -> String {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "median {:9.2} ms   worst {:9.2} ms   ({} rounds)",
        ms(samples[samples.len() / 2]),
        ms(samples[samples.len() - 1]),
        samples.len()
    )
}

fn frozen(cgroup: &TestCgroup) -> bool {
    fs::read_to_string(cgroup.dir.join("cgroup.events"))
        .expect("cgroup.events")
        .lines()
        .any(|l| l.trim() == "frozen 1")
}

/// How long until `cgroup.events` says `want`.
fn until_frozen(cgroup: &TestCgroup, want: bool) -> Duration {
    let started = Instant::now();
    while frozen(cgroup) != want {
        assert!(
            started.elapsed() < PATIENCE,
            "cgroup.events never said {want}"
        );
        std::hint::spin_loop();
    }
    started.elapsed()
}

#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "a share is in 0..=1, so its ppm fits a u32"
)]
fn member(cgroup: &TestCgroup, share: f64, policy: ComputePolicy) -> Member {
    Member {
        cgroup_dir: cgroup.dir.clone(),
        share_ppm: (share * 1e6).round() as u32,
        policy,
    }
}

fn start_throttle() -> ThrottleHandle {
    throttle::spawn(
        ThrottleConfig::default(),
        Signal::PerCgroup(Box::new(CpuTimeUsage)),
        "gpuwarden-bench",
    )
    .expect("throttle loop")
}

fn throttle_timings() {
    let cgroup = TestCgroup::create(&format!("gpuwarden-bench-timings-{}", std::process::id()));
    let key = fs::metadata(&cgroup.dir).expect("the cgroup").ino();
    let spinner = Spinner::start(&cgroup.dir, &[]);

    let unthrottled = rates(&[&spinner], Duration::from_secs(2))[0];
    let throttle = start_throttle();
    throttle
        .set(0, key, member(&cgroup, 0.3, ComputePolicy::WorkConserving))
        .expect("set");
    std::thread::sleep(Duration::from_millis(500));
    let alone = rates(&[&spinner], Duration::from_secs(3))[0];
    println!(
        "throttle: work-conserving 0.3 alone ran {:.3} of the time, {:.3} of its unthrottled CPU \
         time ({:.3} of the time), {:.3} of its unthrottled iterations",
        alone.cpu,
        alone.of(unthrottled).cpu,
        unthrottled.cpu,
        alone.of(unthrottled).iterations
    );

    let hold = |throttle: &ThrottleHandle| {
        throttle
            .set(0, key, member(&cgroup, 0.05, ComputePolicy::Hard))
            .expect("set");
        until_frozen(&cgroup, true);
    };
    let mut after_remove = Vec::new();
    for _ in 0..ROUNDS {
        hold(&throttle);
        throttle.remove(key).expect("remove");
        after_remove.push(until_frozen(&cgroup, false));
    }
    drop(throttle);
    let mut after_drop = Vec::new();
    for _ in 0..ROUNDS {
        let throttle = start_throttle();
        hold(&throttle);
        drop(throttle);
        after_drop.push(until_frozen(&cgroup, false));
    }
    let mut after_thaw = Vec::new();
    for _ in 0..ROUNDS {
        fs::write(cgroup.dir.join("cgroup.freeze"), "1").expect("freeze");
        until_frozen(&cgroup, true);
        let started = Instant::now();
        throttle::thaw(&cgroup.dir).expect("thaw");
        until_frozen(&cgroup, false);
        after_thaw.push(started.elapsed());
    }
    println!(
        "throttle: thawed after remove       {}",
        summary(&mut after_remove)
    );
    println!(
        "throttle: thawed after the drop     {}",
        summary(&mut after_drop)
    );
    println!(
        "throttle: thawed by thaw()          {}",
        summary(&mut after_thaw)
    );
    drop(spinner);
}

fn takeover_timings() {
    let etcd = Etcd::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut takeovers = Vec::new();
    for round in 0..ROUNDS {
        let store: StoreSpec = etcd
            .store_url(&format!("takeover-{round}"))
            .parse()
            .expect("a store spec");
        let leader = TestController::elected(&store, TTL).start();
        rt.block_on(wait::until_async("the first to lead", PATIENCE, || {
            leader.leads()
        }));
        let standby = TestController::elected(&store, TTL).start();
        // Let the standby campaign before the leader goes.
        std::thread::sleep(Duration::from_millis(500));
        let killed = Instant::now();
        leader.kill();
        rt.block_on(wait::until_async(
            "the standby to lead",
            TTL + PATIENCE,
            || standby.leads(),
        ));
        takeovers.push(killed.elapsed());
    }
    let median = {
        takeovers.sort();
        takeovers[takeovers.len() / 2]
    };
    println!(
        "takeover: a standby leads after the leader is killed  {}; median {:.2} × the TTL ({TTL:?})",
        summary(&mut takeovers),
        median.as_secs_f64() / TTL.as_secs_f64()
    );
}
