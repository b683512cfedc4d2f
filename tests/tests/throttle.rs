//! Compute share on this kernel: CPU-spinning processes in real cgroup v2 cgroups, held to their
//! shares by `gpuwarden_agent::enforcement::throttle` with the CPU-time stand-in for GPU usage.
//!
//! Progress is the spinner's own CPU time (per thread, from `/proc`, apart from the cgroup's
//! `cpu.stat` that the throttle reads); the spinners also count their iterations, which the tests
//! print. Each test measures the unthrottled rate first, so "30 %" means 30 % of what the same
//! spinner did unthrottled on this machine a moment earlier. The machine has two CPUs: the
//! tests take a lock so that at most two spinners run at once.
//!
//! The tests check what the throttle does (holds a share, lends idle capacity, thaws on every
//! exit) with generous tolerances and deadlines; how closely and how fast it does it is measured
//! by `cargo xtask bench throttle` and `cargo xtask bench timings`.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use gpuwarden_agent::devices::samples::{DeviceSample, DriverError, ProcessSample, SampleDriver};
use gpuwarden_agent::enforcement::throttle::{
    self, ComputePolicy, CpuTimeSignal, CpuTimeUsage, Member, Signal, ThrottleConfig,
    ThrottleHandle, device::SampledDevice,
};
use gpuwarden_test_support::{
    require_root,
    spinner::{Rate, Spinner, rates},
    wait::{self, PATIENCE},
};

/// Allowed error, in points of the share. The judge is each spinner's own threads' CPU time
/// (from `/proc`, apart from the cgroup's `cpu.stat` the stand-in signal reads); the slot mode's
/// ledger makes up what other load on the machine takes from a thawed spinner, and a machine too
/// busy to tell is refused by [`assert_near`]'s unthrottled check rather than passed.
const TOLERANCE: f64 = 0.05;

/// One test at a time: each runs up to two spinners on a two-CPU machine.
static SERIAL: Mutex<()> = Mutex::new(());

/// A cgroup v2 directory for one test with the spinners started in it; they are killed and the
/// directory removed on drop.
struct SpinCgroup {
    /// The directory; removed after `Drop` has killed the spinners.
    cgroup: gpuwarden_test_support::TestCgroup,
    key: u64,
    spinners: Vec<Spinner>,
}

impl SpinCgroup {
    fn create(name: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let cgroup = gpuwarden_test_support::TestCgroup::create(&format!(
            "gpuwarden-throttle-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        // A cgroup's id is its directory's inode number.
        let key = fs::metadata(&cgroup.dir).expect("the new cgroup").ino();
        Self {
            cgroup,
            key,
            spinners: Vec::new(),
        }
    }

    fn dir(&self) -> &Path {
        &self.cgroup.dir
    }

    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a share is in 0..=1, so its ppm fits a u32"
    )]
    fn member(&self, share: f64, policy: ComputePolicy) -> Member {
        Member {
            cgroup_dir: self.dir().to_owned(),
            share_ppm: (share * 1e6).round() as u32,
            policy,
        }
    }

    /// Starts a spinner inside this cgroup; returns its index.
    fn spin(&mut self) -> usize {
        self.spinners.push(Spinner::start_program(
            Path::new(env!("CARGO_BIN_EXE_spinner")),
            self.dir(),
            &[],
        ));
        self.spinners.len() - 1
    }

    fn frozen(&self) -> bool {
        let events = fs::read_to_string(self.dir().join("cgroup.events")).expect("cgroup.events");
        events
            .lines()
            .find_map(|l| l.strip_prefix("frozen "))
            .expect("frozen in cgroup.events")
            .trim()
            == "1"
    }

    /// Waits until the cgroup is thawed, or frozen, for at most `within`; how long it took.
    fn wait_frozen(&self, want: bool, within: Duration, what: &str) -> Duration {
        let state = if want { "frozen" } else { "thawed" };
        wait::until(
            &format!("{what}: cgroup.events to say {state}"),
            within,
            || self.frozen() == want,
        )
    }
}

impl Drop for SpinCgroup {
    fn drop(&mut self) {
        // Fatal signals reach frozen processes too; thaw anyway so the waits are quick.
        let _ = fs::write(self.dir().join("cgroup.freeze"), "0");
        self.spinners.clear();
        // `cgroup` removes the directory as it drops, after this.
    }
}

/// The throttle as the agent runs it with mock devices: exclusive slots on the CPU-time
/// stand-in (`GPUWARDEN_TEST_THROTTLE=buckets`: the bucket mode).
fn start_throttle() -> ThrottleHandle {
    let signal = if std::env::var("GPUWARDEN_TEST_THROTTLE").as_deref() == Ok("buckets") {
        Signal::PerCgroup(Box::new(CpuTimeUsage))
    } else {
        Signal::Device(Box::new(CpuTimeSignal::default()))
    };
    throttle::spawn(ThrottleConfig::default(), signal, "gpuwarden-test").expect("throttle loop")
}

/// Stops the loop and waits for it (it thaws what it froze).
fn shutdown(throttle: ThrottleHandle) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(throttle.shutdown());
}

/// Asserts a spinner ran `want` ± `tolerance` of the time (one CPU counting as one GPU), and
/// that unthrottled it ran far more, so that it was the throttle that held it there.
///
/// The running fraction is compared with the share directly rather than divided by the
/// unthrottled fraction: other work on this two-CPU machine (builds of other checkouts) comes and
/// goes, the throttle holds the running fraction of wall time whatever it is, and an unthrottled
/// rate taken two seconds earlier is no reference for the next ten. On a quiet machine the
/// unthrottled spinner runs 100 % of the time and both measures agree; both are printed.
fn assert_near(what: &str, throttled: Rate, unthrottled: Rate, want: f64, tolerance: f64) {
    let progress = throttled.of(unthrottled);
    eprintln!(
        "{what}: ran {:.3} of the time (want {want:.2} ± {tolerance:.2}); {:.3} of its unthrottled \
         CPU time ({:.3} of the time), {:.3} of its unthrottled iterations",
        throttled.cpu, progress.cpu, unthrottled.cpu, progress.iterations
    );
    assert!(
        (throttled.cpu - want).abs() <= tolerance,
        "{what}: ran {:.1} % of the time, want {:.0} % ± {:.0} points",
        throttled.cpu * 100.0,
        want * 100.0,
        tolerance * 100.0
    );
    assert!(
        // Past the band, or a throttle that did nothing could pass.
        unthrottled.cpu >= (want + tolerance + 0.05).min(0.8),
        "{what}: unthrottled, the spinner ran only {:.1} % of the time: the machine is too busy to \
         tell the throttle's effect",
        unthrottled.cpu * 100.0
    );
}

/// One spinner at 0.3 under `hard` runs 30 % of the time over 10 s, within [`TOLERANCE`] (of
/// its unthrottled progress, on a quiet machine; see [`assert_near`]).
#[test]
#[ignore = "needs root"]
fn hard_share_holds_one_spinner_to_its_share() {
    require_root();
    let _serial = SERIAL.locked();
    let mut cgroup = SpinCgroup::create("hard");
    let s = cgroup.spin();
    let spinner = &cgroup.spinners[s];
    let unthrottled = rates(&[spinner], Duration::from_secs(2))[0];

    let throttle = start_throttle();
    throttle
        .set(0, cgroup.key, cgroup.member(0.3, ComputePolicy::Hard))
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let throttled = rates(&[spinner], Duration::from_secs(10))[0];
    assert_near("hard 0.3", throttled, unthrottled, 0.3, TOLERANCE);

    let stats = throttle.stats(cgroup.key).expect("stats of a member");
    assert!(
        (stats.running_fraction - 0.3).abs() < 0.2,
        "running fraction {}",
        stats.running_fraction
    );
    shutdown(throttle);
    cgroup.wait_frozen(false, Duration::ZERO, "after shutdown");
}

/// Two spinners at 0.3 and 0.7 on one GPU each run their share of the time.
#[test]
#[ignore = "needs root"]
fn two_members_split_one_gpu_by_share() {
    require_root();
    let _serial = SERIAL.locked();
    let mut small = SpinCgroup::create("small");
    let mut large = SpinCgroup::create("large");
    let (a, b) = (small.spin(), large.spin());
    let spinners = [&small.spinners[a], &large.spinners[b]];
    let unthrottled = rates(&spinners, Duration::from_secs(2));

    let throttle = start_throttle();
    throttle
        .set(0, small.key, small.member(0.3, ComputePolicy::Hard))
        .unwrap();
    throttle
        .set(0, large.key, large.member(0.7, ComputePolicy::Hard))
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let throttled = rates(&spinners, Duration::from_secs(10));
    shutdown(throttle);
    assert_near("0.3 of two", throttled[0], unthrottled[0], 0.3, TOLERANCE);
    assert_near("0.7 of two", throttled[1], unthrottled[1], 0.7, TOLERANCE);
    small.wait_frozen(false, Duration::ZERO, "after shutdown");
    large.wait_frozen(false, Duration::ZERO, "after shutdown");
}

/// NVML on a MIG instance as nvml.h documents it: device and process utilization samples are
/// "not supported on MIG-enabled GPUs".
struct InstanceWithoutSamples;

impl SampleDriver for InstanceWithoutSamples {
    fn device_samples(&mut self, _: u32, _: u64) -> Result<Vec<DeviceSample>, DriverError> {
        Err(DriverError::NotSupported)
    }
    fn process_samples(&mut self, _: u32, _: u64) -> Result<Vec<ProcessSample>, DriverError> {
        Err(DriverError::NotSupported)
    }
    fn now(&self) -> (Instant, u64) {
        (Instant::now(), 0)
    }
    fn cgroup_of(&self, _: u32) -> Option<PathBuf> {
        None
    }
    fn cgroup_exists(&self, dir: &Path) -> bool {
        dir.is_dir()
    }
}

/// On a GPU that keeps no utilization samples (a MIG instance), the slot throttle holds two
/// spinners at 0.3 and 0.7 by time alone. The signal there says only whether a cgroup ran at all
/// (its `cpu.stat`); the judge is how much each spinner's own threads ran (`/proc`).
#[test]
#[ignore = "needs root"]
fn on_a_gpu_without_samples_two_members_are_held_to_their_shares_by_time() {
    // An instance's index: past every whole GPU's.
    const INSTANCE: u32 = 8;
    require_root();
    let _serial = SERIAL.locked();
    let mut small = SpinCgroup::create("instance-small");
    let mut large = SpinCgroup::create("instance-large");
    let (a, b) = (small.spin(), large.spin());
    let spinners = [&small.spinners[a], &large.spinners[b]];
    let unthrottled = rates(&spinners, Duration::from_secs(2));

    let signal = Signal::Device(Box::new(SampledDevice::new(InstanceWithoutSamples)));
    let throttle = throttle::spawn(ThrottleConfig::default(), signal, "gpuwarden-test")
        .expect("throttle loop");
    throttle
        .set(INSTANCE, small.key, small.member(0.3, ComputePolicy::Hard))
        .unwrap();
    throttle
        .set(INSTANCE, large.key, large.member(0.7, ComputePolicy::Hard))
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let throttled = rates(&spinners, Duration::from_secs(10));
    let signals = throttle.signals();
    shutdown(throttle);
    assert_near(
        "0.3 of an instance",
        throttled[0],
        unthrottled[0],
        0.3,
        TOLERANCE,
    );
    assert_near(
        "0.7 of an instance",
        throttled[1],
        unthrottled[1],
        0.7,
        TOLERANCE,
    );
    assert!(
        signals
            .iter()
            .any(|(gpu, h)| *gpu == INSTANCE && h.time_only),
        "the instance's signal is reported time only: {signals:?}"
    );
    small.wait_frozen(false, Duration::ZERO, "after shutdown");
    large.wait_frozen(false, Duration::ZERO, "after shutdown");
}

/// `work-conserving` at 0.3 runs near 100 % alone, and about 30 % once a second member contends.
#[test]
#[ignore = "needs root"]
fn work_conserving_uses_idle_capacity_until_contended() {
    require_root();
    let _serial = SERIAL.locked();
    let mut greedy = SpinCgroup::create("greedy");
    let mut other = SpinCgroup::create("other");
    let g = greedy.spin();
    let unthrottled = rates(&[&greedy.spinners[g]], Duration::from_secs(2))[0];

    let throttle = start_throttle();
    throttle
        .set(
            0,
            greedy.key,
            greedy.member(0.3, ComputePolicy::WorkConserving),
        )
        .unwrap();
    // A member with nothing running in it is idle.
    throttle
        .set(0, other.key, other.member(0.7, ComputePolicy::Hard))
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // Alone it is never held: the throttle does not freeze it, whatever share of the CPU this
    // machine gives it (printed; `cargo xtask bench timings` measures it).
    wait::until("the loop to take the member", PATIENCE, || {
        throttle.stats(greedy.key).is_some()
    });
    let held_before = throttle.stats(greedy.key).expect("stats").throttled;
    let alone = rates(&[&greedy.spinners[g]], Duration::from_secs(3))[0];
    let held = throttle
        .stats(greedy.key)
        .expect("stats")
        .throttled
        .saturating_sub(held_before);
    eprintln!(
        "work-conserving alone: ran {:.3} of the time, {:.3?} of its unthrottled progress; held \
         {held:?} of 3 s",
        alone.cpu,
        alone.of(unthrottled)
    );
    assert!(
        held < Duration::from_millis(300),
        "work-conserving alone was held frozen {held:?} of 3 s, with no other member running"
    );
    assert!(
        alone.cpu > 0.3 + TOLERANCE || alone.cpu >= 0.9 * unthrottled.cpu,
        "work-conserving alone ran {:.1} % of the time (unthrottled {:.1} %): held to its share \
         although nothing contended",
        alone.cpu * 100.0,
        unthrottled.cpu * 100.0
    );

    let o = other.spin();
    std::thread::sleep(Duration::from_millis(500));
    // Contended, it falls back to its share.
    let contended = rates(&[&greedy.spinners[g]], Duration::from_secs(4))[0];
    assert_near(
        "work-conserving contended",
        contended,
        unthrottled,
        0.3,
        TOLERANCE,
    );
    assert!(other.spinners[o].count() > 0);
    shutdown(throttle);
    greedy.wait_frozen(false, Duration::ZERO, "after shutdown");
}

/// `throttled` grows while a member is held; `remove`, `shutdown`, dropping the handle and
/// [`throttle::thaw`] each leave the cgroup thawed.
#[test]
#[ignore = "needs root"]
fn throttled_grows_and_every_exit_thaws() {
    require_root();
    let _serial = SERIAL.locked();
    let mut cgroup = SpinCgroup::create("exits");
    let s = cgroup.spin();

    let throttle = start_throttle();
    throttle
        .set(0, cgroup.key, cgroup.member(0.2, ComputePolicy::Hard))
        .unwrap();
    // No stats until the loop has taken the member.
    let throttled = || {
        throttle
            .stats(cgroup.key)
            .map_or(Duration::ZERO, |s| s.throttled)
    };
    wait::until("the member to be held frozen 500 ms", PATIENCE, || {
        throttled() >= Duration::from_millis(500)
    });
    let first = throttled();
    wait::until("the held time to grow by 250 ms more", PATIENCE, || {
        throttled() >= first + Duration::from_millis(250)
    });

    // remove: thawed, and stays thawed (how fast: `cargo xtask bench timings`).
    throttle.remove(cgroup.key).unwrap();
    cgroup.wait_frozen(false, PATIENCE, "after remove");
    let before = cgroup.spinners[s].count();
    wait::holds("thawed after remove", Duration::from_millis(200), || {
        !cgroup.frozen()
    });
    wait::until("the spinner to run again", PATIENCE, || {
        cgroup.spinners[s].count() > before
    });
    assert!(throttle.stats(cgroup.key).is_none());

    // shutdown while frozen.
    throttle
        .set(0, cgroup.key, cgroup.member(0.05, ComputePolicy::Hard))
        .unwrap();
    cgroup.wait_frozen(true, PATIENCE, "at 0.05");
    shutdown(throttle);
    cgroup.wait_frozen(false, Duration::ZERO, "after shutdown");

    // Dropping the last handle stops the loop, which thaws.
    let throttle = start_throttle();
    throttle
        .set(0, cgroup.key, cgroup.member(0.05, ComputePolicy::Hard))
        .unwrap();
    cgroup.wait_frozen(true, PATIENCE, "at 0.05");
    drop(throttle);
    cgroup.wait_frozen(false, PATIENCE, "after dropping the handle");

    // What a dead agent left frozen, thawed at start.
    fs::write(cgroup.dir().join("cgroup.freeze"), "1").unwrap();
    cgroup.wait_frozen(true, PATIENCE, "frozen by hand");
    throttle::thaw(cgroup.dir()).unwrap();
    cgroup.wait_frozen(false, PATIENCE, "after thaw");
}

/// A member whose cgroup disappears is dropped; the loop goes on for the others.
#[test]
#[ignore = "needs root"]
fn a_removed_cgroup_is_dropped_and_the_loop_goes_on() {
    require_root();
    let _serial = SERIAL.locked();
    let vanishing = SpinCgroup::create("vanishing");
    let mut staying = SpinCgroup::create("staying");
    staying.spin();

    let throttle = start_throttle();
    throttle
        .set(0, vanishing.key, vanishing.member(0.5, ComputePolicy::Hard))
        .unwrap();
    throttle
        .set(0, staying.key, staying.member(0.1, ComputePolicy::Hard))
        .unwrap();
    wait::until("the loop to take both members", PATIENCE, || {
        throttle.stats(vanishing.key).is_some() && throttle.stats(staying.key).is_some()
    });
    let (vanishing_key, vanishing_dir) = (vanishing.key, vanishing.dir().to_owned());
    drop(vanishing);
    assert!(!vanishing_dir.exists());
    wait::until("the vanished member to be dropped", PATIENCE, || {
        throttle.stats(vanishing_key).is_none()
    });
    let stats = throttle.stats(staying.key).expect("the other member");
    wait::until(
        "the loop to go on holding the other member",
        PATIENCE,
        || {
            throttle
                .stats(staying.key)
                .expect("the other member")
                .throttled
                > stats.throttled
        },
    );
    shutdown(throttle);
    staying.wait_frozen(false, Duration::ZERO, "after shutdown");
}
