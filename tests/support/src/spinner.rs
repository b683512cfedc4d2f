//! CPU-spinning processes in a cgroup, standing in for GPU work where the compute throttle is
//! tested and measured (CPU time is the throttle's stand-in for GPU busy time).
//!
//! A spinner is the calling binary run again with [`SPINNER_ENV`] set: that binary calls
//! [`spin_if_asked`] first (a bench's `main`, or an ignored test the spinner runs by name),
//! which then never returns. It counts its iterations in a file mapped by both processes, and the
//! time it saw itself run: it reads the monotonic clock every few microseconds and counts each
//! step between two reads shorter than [`GAP`]; a longer one is time it was not running (frozen,
//! or waiting for a CPU). That is an account of its running time apart from the kernel's CPU-time
//! accounting the throttle's stand-in signal reads.

use std::{
    ffi::CStr,
    fs,
    os::unix::process::CommandExt,
    path::Path,
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use crate::scratch;

/// Set in a spinner process: the file its counter lives in.
pub const SPINNER_ENV: &str = "GPUWARDEN_TEST_SPINNER";

/// A step between two clock reads longer than this is time the spinner did not run.
pub const GAP: Duration = Duration::from_micros(100);

/// The spinners' nice value (see [`start_in`]).
const SPINNER_NICE: libc::c_int = -10;
const SPINNER_NICE_TEXT: &[u8] = b"-10";

/// In a spinner process (one started by [`Spinner::start`]), spins forever; elsewhere returns at
/// once.
///
/// # Panics
/// The counter file named by [`SPINNER_ENV`] can't be mapped.
pub fn spin_if_asked() {
    let Ok(path) = std::env::var(SPINNER_ENV) else {
        return;
    };
    let counter = Counter::map(Path::new(&path));
    let gap = u64::try_from(GAP.as_nanos()).unwrap_or(u64::MAX);
    let mut n: u64 = 0;
    let mut ran: u64 = 0;
    let mut last = monotonic_ns();
    loop {
        n = std::hint::black_box(n) + 1;
        if n.trailing_zeros() >= 12 {
            let now = monotonic_ns();
            let step = now.saturating_sub(last);
            if step < gap {
                ran += step;
            }
            last = now;
            counter.get().store(n, Ordering::Relaxed);
            counter.ran().store(ran, Ordering::Relaxed);
        }
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Two `u64`s shared between a spinner and the test through a mapped file: iterations, and the
/// nanoseconds it saw itself run.
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
        // SAFETY: maps 16 bytes of a file we just opened (it is 16 bytes long); the mapping
        // outlives the file descriptor, and `Drop` unmaps it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                16,
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
        // SAFETY: a page-aligned, shared mapping of at least 16 bytes, alive as long as `self`.
        unsafe { AtomicU64::from_ptr(self.ptr.cast()) }
    }

    fn ran(&self) -> &AtomicU64 {
        // SAFETY: as `get`; the second, 8-byte-aligned word of the mapping.
        unsafe { AtomicU64::from_ptr(self.ptr.cast::<u64>().add(1)) }
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        // SAFETY: unmaps what `map` mapped.
        unsafe { libc::munmap(self.ptr, 16) };
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

/// A spinning process that counts its iterations; killed when dropped.
pub struct Spinner {
    child: Child,
    counter: Counter,
    /// Holds the counter file; removed after the child is killed and the counter unmapped.
    _scratch: tempfile::TempDir,
}

impl Spinner {
    /// Starts this binary again with `args` as a spinner inside the cgroup directory `cgroup`,
    /// and waits until it spins. `args` must make the binary call [`spin_if_asked`] (a test
    /// binary: the name of the ignored test that does).
    ///
    /// # Panics
    /// The spinner can't be started, or never spins.
    #[must_use]
    pub fn start(cgroup: &Path, args: &[&str]) -> Self {
        let scratch = scratch("spin");
        let counter_path = scratch.path().join("counter");
        fs::write(&counter_path, [0u8; 16]).expect("the counter file");
        let counter = Counter::map(&counter_path);
        let procs =
            gpuwarden_runtime::cgroup::procs_file(cgroup).expect("a cgroup path without NUL");
        let mut command = Command::new(std::env::current_exe().expect("this binary"));
        command
            .args(args)
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
        crate::wait::until("the spinner to start", crate::wait::PATIENCE, || {
            spinner.count() > 0
        });
        spinner
    }

    /// Its iterations so far (in steps of 4,096).
    #[must_use]
    pub fn count(&self) -> u64 {
        self.counter.get().load(Ordering::Relaxed)
    }

    /// Nanoseconds it saw itself run (see the module's doc).
    #[must_use]
    pub fn ran_ns(&self) -> u64 {
        self.counter.ran().load(Ordering::Relaxed)
    }

    /// Its process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
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
pub struct Rate {
    /// Iterations per second.
    pub iterations: f64,
    /// Fraction of the window it ran on a CPU (the kernel's account of its threads).
    pub cpu: f64,
    /// Fraction of the window it saw itself run (its own clock: see the module's doc).
    pub observed: f64,
}

impl Rate {
    /// This rate as a fraction of `unthrottled`, by CPU time and by iterations (on a shared
    /// virtual machine iterations per CPU-second drift by up to ±20 % from one second to the
    /// next, whatever the throttle does).
    #[must_use]
    pub fn of(self, unthrottled: Self) -> Progress {
        Progress {
            cpu: self.cpu / unthrottled.cpu,
            iterations: self.iterations / unthrottled.iterations,
        }
    }
}

/// A [`Rate`] as a fraction of another.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Of the CPU time.
    pub cpu: f64,
    /// Of the iterations.
    pub iterations: f64,
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
#[must_use]
#[expect(
    clippy::cast_precision_loss,
    reason = "counts and nanoseconds of seconds-long windows are far below 2^52"
)]
pub fn rates(spinners: &[&Spinner], window: Duration) -> Vec<Rate> {
    let before: Vec<(u64, u64, u64)> = spinners
        .iter()
        .map(|s| (s.count(), cpu_ns(s.pid()), s.ran_ns()))
        .collect();
    let start = Instant::now();
    std::thread::sleep(window);
    let elapsed = start.elapsed();
    spinners
        .iter()
        .zip(before)
        .map(|(s, (count, cpu, ran))| Rate {
            iterations: (s.count() - count) as f64 / elapsed.as_secs_f64(),
            cpu: (cpu_ns(s.pid()) - cpu) as f64 / elapsed.as_nanos() as f64,
            observed: s.ran_ns().saturating_sub(ran) as f64 / elapsed.as_nanos() as f64,
        })
        .collect()
}
