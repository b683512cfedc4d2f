//! `cargo xtask bench throttle`: how closely the compute-share throttle holds a CPU spinner to
//! targets 0.1, 0.3, 0.5 and 0.9 under `hard`, with the CPU-time stand-in for GPU usage.
//!
//! For each target: the fraction of the time the spinner ran (its own CPU time over wall time,
//! what the throttle holds), and its progress (iterations per second) over the baseline measured
//! in the same run, its unthrottled rate before the targets and again after them (the mean of
//! the two). Needs root (it creates a cgroup v2 cgroup and freezes it).

#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // Measured rates and shares in [0, 1], as f64.

use std::{
    fs,
    os::unix::{fs::MetadataExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use gpuwarden_agent::{
    attribution::Attributor,
    enforcement::throttle::{self, ComputePolicy, CpuTimeUsage, Member, ThrottleConfig},
};

/// Set in the spinner process (this binary run again): the file its counter lives in.
const SPINNER_ENV: &str = "GPUWARDEN_THROTTLE_BENCH_SPINNER";
const TARGETS: [f64; 4] = [0.1, 0.3, 0.5, 0.9];
const BASELINE: Duration = Duration::from_secs(2);
const SETTLE: Duration = Duration::from_millis(500);
const MEASURE: Duration = Duration::from_secs(6);

/// A `u64` shared between the spinner and the bench through a mapped file.
struct Counter(*mut libc::c_void);

impl Counter {
    fn map(path: &Path) -> anyhow::Result<Self> {
        let file = fs::OpenOptions::new().read(true).write(true).open(path)?;
        // SAFETY: maps the 8 bytes of a file we just opened; the mapping outlives the fd.
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
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(Self(ptr))
    }

    fn get(&self) -> &AtomicU64 {
        // SAFETY: a page-aligned shared mapping of 8 bytes, alive as long as `self`.
        unsafe { AtomicU64::from_ptr(self.0.cast()) }
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        // SAFETY: unmaps what `map` mapped.
        unsafe { libc::munmap(self.0, 8) };
    }
}

fn spin(path: &Path) -> anyhow::Result<()> {
    let counter = Counter::map(path)?;
    let mut n: u64 = 0;
    loop {
        n = std::hint::black_box(n) + 1;
        if n.trailing_zeros() >= 12 {
            counter.get().store(n, Ordering::Relaxed);
        }
    }
}

/// Runs between fork and exec of the spinner, so only async-signal-safe calls (setsid,
/// setpriority, open, write, close). Moves it into the cgroup whose `cgroup.procs` is `procs`
/// (the runtime crate's `cgroup::join`) and raises its priority, in a session and autogroup of its
/// own (with autogroups a nice value only counts within a session), so that other work on the
/// machine doesn't starve it: what is measured is the throttle, not the scheduler.
fn start_in(procs: &std::ffi::CStr) -> std::io::Result<()> {
    // SAFETY: plain syscalls on memory we own; the literals are NUL-terminated.
    unsafe {
        libc::setsid();
        let fd = libc::open(
            c"/proc/self/autogroup".as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        );
        if fd >= 0 {
            libc::write(fd, b"-10".as_ptr().cast(), 3);
            libc::close(fd);
        }
        if libc::setpriority(libc::PRIO_PROCESS, 0, -10) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    gpuwarden_runtime::cgroup::join(procs)
}

/// The cgroup, its spinner and the counter; all cleaned up on drop.
struct Setup {
    dir: PathBuf,
    counter_path: PathBuf,
    child: Option<Child>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = fs::write(self.dir.join("cgroup.freeze"), "0");
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = fs::remove_dir(&self.dir);
        let _ = fs::remove_file(&self.counter_path);
    }
}

/// Nanoseconds the process `pid` has run on a CPU (`/proc/<pid>/schedstat`, first field).
fn cpu_ns(pid: u32) -> anyhow::Result<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/schedstat"))?;
    let field = text.split_whitespace().next().unwrap_or_default();
    Ok(field.parse()?)
}

/// Over `window`: iterations per second, and the fraction of the time it ran on a CPU.
fn rate(counter: &Counter, pid: u32, window: Duration) -> anyhow::Result<(f64, f64)> {
    let (before, cpu_before) = (counter.get().load(Ordering::Relaxed), cpu_ns(pid)?);
    let start = Instant::now();
    std::thread::sleep(window);
    let (after, cpu_after) = (counter.get().load(Ordering::Relaxed), cpu_ns(pid)?);
    let elapsed = start.elapsed();
    Ok((
        (after - before) as f64 / elapsed.as_secs_f64(),
        (cpu_after - cpu_before) as f64 / elapsed.as_nanos() as f64,
    ))
}

fn main() -> anyhow::Result<()> {
    if let Some(path) = std::env::var_os(SPINNER_ENV) {
        return spin(Path::new(&path));
    }
    // cargo bench passes `--bench`; nothing here takes options.
    // SAFETY: a plain syscall without arguments.
    anyhow::ensure!(
        unsafe { libc::geteuid() } == 0,
        "the throttle bench creates and freezes a cgroup: it needs root"
    );
    let root = Attributor::detect()?.root().to_owned();
    let pid = std::process::id();
    let mut setup = Setup {
        dir: root.join(format!("gpuwarden-throttle-bench-{pid}")),
        counter_path: std::env::temp_dir().join(format!("gpuwarden-throttle-bench-{pid}")),
        child: None,
    };
    fs::create_dir(&setup.dir)?;
    fs::write(&setup.counter_path, [0u8; 8])?;
    let counter = Counter::map(&setup.counter_path)?;

    let procs = gpuwarden_runtime::cgroup::procs_file(&setup.dir)?;
    let mut command = Command::new(std::env::current_exe()?);
    command
        .env(SPINNER_ENV, &setup.counter_path)
        .stdout(Stdio::null());
    // SAFETY: `start_in` makes only async-signal-safe calls.
    unsafe {
        command.pre_exec(move || start_in(&procs));
    }
    let child = command.spawn()?;
    let pid = child.id();
    setup.child = Some(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter.get().load(Ordering::Relaxed) == 0 {
        anyhow::ensure!(Instant::now() < deadline, "the spinner never started");
        std::thread::sleep(Duration::from_millis(5));
    }

    let config = ThrottleConfig::default();
    let (before, before_cpu) = rate(&counter, pid, BASELINE)?;
    let throttle = throttle::spawn(config, Box::new(CpuTimeUsage))?;
    let key = fs::metadata(&setup.dir)?.ino();
    let mut achieved = Vec::new();
    for target in TARGETS {
        throttle.set(
            0,
            key,
            Member {
                cgroup_dir: setup.dir.clone(),
                share_ppm: (target * 1e6).round() as u32,
                policy: ComputePolicy::Hard,
            },
        )?;
        std::thread::sleep(SETTLE);
        achieved.push(rate(&counter, pid, MEASURE)?);
    }
    throttle.remove(key)?;
    std::thread::sleep(Duration::from_millis(100));
    let (after, after_cpu) = rate(&counter, pid, BASELINE)?;
    let baseline = f64::midpoint(before, after);
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
        before / 1e6,
        after / 1e6,
        (after / before - 1.0) * 100.0,
        before_cpu * 100.0,
        after_cpu * 100.0,
    );
    // The throttle holds the running fraction of wall time (one CPU standing for one GPU),
    // whatever else the machine runs; iterations per CPU-second drift with what the other
    // (possibly SMT sibling) CPU does, so progress is noisier than the fraction it ran.
    println!(
        "| target | ran (fraction of the time) | error (points) | progress vs unthrottled | error (points) |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for (target, (rate, cpu)) in TARGETS.iter().zip(&achieved) {
        let progress = rate / baseline;
        println!(
            "| {target:.2} | {cpu:.3} | {:+.1} | {progress:.3} | {:+.1} |",
            (cpu - target) * 100.0,
            (progress - target) * 100.0
        );
    }
    Ok(())
}
