//! Compute share on this kernel: CPU-spinning processes in real cgroup v2 cgroups, held to their
//! shares by `gpuwarden_agent::enforcement::throttle` with the CPU-time stand-in for GPU usage.
//!
//! Progress is the spinner's own CPU time (per thread, from `/proc`, apart from the cgroup's
//! `cpu.stat` that the throttle reads); the spinners also count their iterations, which the tests
//! print. Each test measures the unthrottled rate first, so "30 %" means 30 % of what the same
//! spinner did unthrottled on this machine a moment earlier. The machine has two CPUs: the
//! tests take a lock so that at most two spinners run at once.

use std::{
    ffi::CStr,
    fs,
    os::unix::{fs::MetadataExt, process::CommandExt},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use gpuwarden_agent::enforcement::throttle::{
    self, ComputePolicy, CpuTimeUsage, Member, ThrottleConfig, ThrottleHandle,
};
use gpuwarden_test_support::{require_root, scratch};

/// Set in a spinner process: the file its counter lives in.
const SPINNER_ENV: &str = "GPUWARDEN_THROTTLE_SPINNER";

/// The spinners' nice value (see [`start_in`]).
const SPINNER_NICE: libc::c_int = -10;
const SPINNER_NICE_TEXT: &[u8] = b"-10";

/// Allowed error, in points of the share.
const TOLERANCE: f64 = 0.05;

/// One test at a time: each runs up to two spinners on a two-CPU machine.
static SERIAL: Mutex<()> = Mutex::new(());

/// Not a test: the body of a spinner process, which is this binary run again with
/// [`SPINNER_ENV`] set (see [`Spinner::start`]). Without it, it returns at once.
#[test]
#[ignore = "the body of the spinner processes the other tests start"]
fn spinner_process() {
    let Ok(path) = std::env::var(SPINNER_ENV) else {
        return;
    };
    let counter = Counter::map(Path::new(&path));
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n) + 1;
        if n.trailing_zeros() >= 12 {
            counter.get().store(n, Ordering::Relaxed);
        }
    }
}

/// A `u64` shared between a spinner and the test through a mapped file.
struct Counter {
    ptr: *mut libc::c_void,
}

impl Counter {
    fn map(path: &Path) -> Self {
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .expect("counter file");
        // SAFETY: maps 8 bytes of a file we just opened (it is 8 bytes long); the mapping
        // outlives the file descriptor, and `Drop` unmaps it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap {}", path.display());
        Self { ptr }
    }

    fn get(&self) -> &AtomicU64 {
        // SAFETY: a page-aligned, shared mapping of at least 8 bytes, alive as long as `self`.
        unsafe { AtomicU64::from_ptr(self.ptr.cast()) }
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        // SAFETY: unmaps what `map` mapped.
        unsafe { libc::munmap(self.ptr, 8) };
    }
}

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
        self.spinners.push(Spinner::start(self.dir()));
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

    /// Asserts the cgroup becomes (and within `within` is) thawed, or frozen.
    fn wait_frozen(&self, want: bool, within: Duration, what: &str) {
        let deadline = Instant::now() + within;
        while self.frozen() != want {
            assert!(
                Instant::now() < deadline,
                "{what}: cgroup.events still says frozen {} after {within:?}",
                u8::from(!want)
            );
            std::thread::sleep(Duration::from_millis(2));
        }
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

/// Runs between fork and exec of a spinner, so only async-signal-safe calls (setsid,
/// setpriority, open, write, close). Raises the process's priority, then moves it into the cgroup
/// whose `cgroup.procs` is `procs` ([`gpuwarden_runtime::cgroup::join`]): other sessions' builds
/// share this two-CPU machine, and what is under test is the throttle, not the scheduler. With
/// autogroups a nice value only counts within a session, so the spinner gets a session of its
/// own and that session's autogroup gets the nice value too.
fn start_in(procs: &CStr) -> std::io::Result<()> {
    // SAFETY: plain syscalls on memory we own; `procs` and the literals are NUL-terminated.
    unsafe {
        libc::setsid();
        let fd = libc::open(
            c"/proc/self/autogroup".as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        );
        if fd >= 0 {
            // Without autogroups (or this file) the plain nice value below is enough.
            libc::write(
                fd,
                SPINNER_NICE_TEXT.as_ptr().cast(),
                SPINNER_NICE_TEXT.len(),
            );
            libc::close(fd);
        }
        if libc::setpriority(libc::PRIO_PROCESS, 0, SPINNER_NICE) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    gpuwarden_runtime::cgroup::join(procs)
}

/// A spinning process that counts its iterations.
struct Spinner {
    child: Child,
    counter: Counter,
    /// Holds the counter file; removed after the child is killed and the counter unmapped.
    _scratch: tempfile::TempDir,
}

impl Spinner {
    fn start(cgroup: &Path) -> Self {
        let scratch = scratch("spin");
        let counter_path = scratch.path().join("counter");
        fs::write(&counter_path, [0u8; 8]).expect("the counter file");
        let counter = Counter::map(&counter_path);
        let procs =
            gpuwarden_runtime::cgroup::procs_file(cgroup).expect("a cgroup path without NUL");
        let mut command = Command::new(std::env::current_exe().expect("this test binary"));
        command
            .args([
                "--exact",
                "spinner_process",
                "--ignored",
                "--test-threads=1",
            ])
            .env(SPINNER_ENV, &counter_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: `start_in` makes only async-signal-safe calls.
        unsafe {
            command.pre_exec(move || start_in(&procs));
        }
        let child = command.spawn().expect("start a spinner");
        let spinner = Self {
            child,
            counter,
            _scratch: scratch,
        };
        // Wait until it spins, so no measurement includes its start.
        let deadline = Instant::now() + Duration::from_secs(10);
        while spinner.count() == 0 {
            assert!(Instant::now() < deadline, "the spinner never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        spinner
    }

    fn count(&self) -> u64 {
        self.counter.get().load(Ordering::Relaxed)
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How fast a spinner went over a window.
#[derive(Debug, Clone, Copy)]
struct Rate {
    /// Iterations per second.
    iterations: f64,
    /// Fraction of the window it ran on a CPU.
    cpu: f64,
}

impl Rate {
    /// This rate as a fraction of `unthrottled`, by CPU time (what the assertions use) and by
    /// iterations (printed; on a shared virtual machine iterations per CPU-second drift by up
    /// to ±20 % from one second to the next, whatever the throttle does).
    fn of(self, unthrottled: Self) -> Progress {
        Progress {
            cpu: self.cpu / unthrottled.cpu,
            iterations: self.iterations / unthrottled.iterations,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Progress {
    cpu: f64,
    iterations: f64,
}

/// Nanoseconds every thread of `pid` has run on a CPU (the first field of each
/// `/proc/<pid>/task/*/schedstat`): the spinner's own CPU time, read apart from the cgroup's
/// `cpu.stat` the throttle reads.
fn cpu_ns(pid: u32) -> u64 {
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).expect("the spinner's threads");
    tasks
        .filter_map(|task| fs::read_to_string(task.ok()?.path().join("schedstat")).ok())
        .filter_map(|text| text.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// The rate of each spinner over `window`, measured together.
fn rates(spinners: &[&Spinner], window: Duration) -> Vec<Rate> {
    let before: Vec<(u64, u64)> = spinners
        .iter()
        .map(|s| (s.count(), cpu_ns(s.child.id())))
        .collect();
    let start = Instant::now();
    std::thread::sleep(window);
    let elapsed = start.elapsed();
    spinners
        .iter()
        .zip(before)
        .map(|(s, (count, cpu))| Rate {
            iterations: (s.count() - count) as f64 / elapsed.as_secs_f64(),
            cpu: (cpu_ns(s.child.id()) - cpu) as f64 / elapsed.as_nanos() as f64,
        })
        .collect()
}

fn start_throttle() -> ThrottleHandle {
    throttle::spawn(ThrottleConfig::default(), Box::new(CpuTimeUsage)).expect("throttle loop")
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
        unthrottled.cpu >= (want + 2.0 * tolerance).min(0.8),
        "{what}: unthrottled, the spinner ran only {:.1} % of the time: the machine is too busy to \
         tell the throttle's effect",
        unthrottled.cpu * 100.0
    );
}

/// One spinner at 0.3 under `hard` runs 30 % ± 5 points of the time over 10 s (of its
/// unthrottled progress, on a quiet machine; see [`assert_near`]).
#[test]
#[ignore = "needs root"]
fn hard_share_holds_one_spinner_to_its_share() {
    require_root();
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
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
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
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

/// `work-conserving` at 0.3 runs near 100 % alone, and about 30 % once a second member contends.
#[test]
#[ignore = "needs root"]
fn work_conserving_uses_idle_capacity_until_contended() {
    require_root();
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
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
    let alone = rates(&[&greedy.spinners[g]], Duration::from_secs(3))[0].of(unthrottled);
    eprintln!("work-conserving alone: {alone:.3?}");
    assert!(
        alone.cpu >= 0.85,
        "work-conserving alone: {:.1} % of unthrottled progress, want ≥ 85 %",
        alone.cpu * 100.0
    );

    let o = other.spin();
    std::thread::sleep(Duration::from_millis(500));
    let contended = rates(&[&greedy.spinners[g]], Duration::from_secs(4))[0];
    assert_near(
        "work-conserving contended",
        contended,
        unthrottled,
        0.3,
        0.1,
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
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut cgroup = SpinCgroup::create("exits");
    let s = cgroup.spin();

    let throttle = start_throttle();
    throttle
        .set(0, cgroup.key, cgroup.member(0.2, ComputePolicy::Hard))
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let first = throttle.stats(cgroup.key).expect("stats").throttled;
    std::thread::sleep(Duration::from_millis(500));
    let second = throttle.stats(cgroup.key).expect("stats").throttled;
    assert!(
        first >= Duration::from_millis(500) && second >= first + Duration::from_millis(250),
        "throttled {first:?} after 1 s at 0.2, then {second:?} 0.5 s later"
    );

    // remove: thawed at once, and stays thawed.
    throttle.remove(cgroup.key).unwrap();
    cgroup.wait_frozen(false, Duration::from_millis(50), "after remove");
    let before = cgroup.spinners[s].count();
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(20));
        assert!(!cgroup.frozen(), "frozen again after remove");
    }
    assert!(cgroup.spinners[s].count() > before);
    assert!(throttle.stats(cgroup.key).is_none());

    // shutdown while frozen.
    throttle
        .set(0, cgroup.key, cgroup.member(0.05, ComputePolicy::Hard))
        .unwrap();
    cgroup.wait_frozen(true, Duration::from_secs(1), "at 0.05");
    shutdown(throttle);
    cgroup.wait_frozen(false, Duration::ZERO, "after shutdown");

    // Dropping the last handle stops the loop, which thaws.
    let throttle = start_throttle();
    throttle
        .set(0, cgroup.key, cgroup.member(0.05, ComputePolicy::Hard))
        .unwrap();
    cgroup.wait_frozen(true, Duration::from_secs(1), "at 0.05");
    drop(throttle);
    cgroup.wait_frozen(
        false,
        Duration::from_millis(200),
        "after dropping the handle",
    );

    // What a dead agent left frozen, thawed at start.
    fs::write(cgroup.dir().join("cgroup.freeze"), "1").unwrap();
    cgroup.wait_frozen(true, Duration::from_secs(1), "frozen by hand");
    throttle::thaw(cgroup.dir()).unwrap();
    cgroup.wait_frozen(false, Duration::from_millis(50), "after thaw");
}

/// A member whose cgroup disappears is dropped; the loop goes on for the others.
#[test]
#[ignore = "needs root"]
fn a_removed_cgroup_is_dropped_and_the_loop_goes_on() {
    require_root();
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
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
    std::thread::sleep(Duration::from_millis(200));
    assert!(throttle.stats(vanishing.key).is_some());
    let (vanishing_key, vanishing_dir) = (vanishing.key, vanishing.dir().to_owned());
    drop(vanishing);
    assert!(!vanishing_dir.exists());
    std::thread::sleep(Duration::from_millis(200));
    assert!(throttle.stats(vanishing_key).is_none());
    let stats = throttle.stats(staying.key).expect("the other member");
    let later = {
        std::thread::sleep(Duration::from_millis(300));
        throttle.stats(staying.key).expect("the other member")
    };
    assert!(later.throttled > stats.throttled, "the loop goes on");
    shutdown(throttle);
    staying.wait_frozen(false, Duration::ZERO, "after shutdown");
}
