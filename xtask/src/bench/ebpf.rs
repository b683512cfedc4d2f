//! `cargo xtask bench ebpf`: what the agent's hooks cost the rest of the machine.
//!
//! Three cases, each timed without the agent, then with it attached, in one run:
//! - an `ioctl` on a non-GPU fd (`/dev/null`): pays the tracepoint and one fd-table lookup;
//! - an `ioctl` on a GPU fd: a character device with `/dev/full`'s numbers but named `nvidia0`
//!   and listed in `--gpu-devices` (the programs know a node by its device number, so `/dev/null`,
//!   the non-GPU case, must have another), so the programs decode a real `RM_ALLOC` (NVOS21, class
//!   `NV01_MEMORY_LOCAL_USER`, 128-byte params) at entry and look it up at exit; the device
//!   answers `ENOTTY`, so the exit stops before reading the driver's answer back;
//! - `getppid`, a syscall the agent doesn't hook, which pays only for syscall tracing being on;
//! - `openat` + `close` of a regular file: every open on the node pays the look-up of the opened
//!   file in the task's fd table and of its device number (or, with the fake driver's nodes,
//!   inode) among the GPU nodes;
//! - an `ioctl` on `/dev/null` with a terminal's command (`TCGETS`), as most ioctls on a node
//!   are: no NVIDIA escape has its number, so the programs stop before looking at the fd (the
//!   first case keeps `RM_ALLOC`'s command, the worst a non-GPU ioctl can be);
//! - the GPU-fd ioctl again from a cgroup with a quota (a session of the controller bound to a
//!   cgroup this process moves into), so the decode also pays the quota check: the look-ups of
//!   the cgroup's quota that every allocating ioctl of a bound workload makes.
//!
//! Each case runs `rounds` batches of `iterations` calls pinned to one CPU; the table shows the
//! fastest batch, the estimate least disturbed by other work on the machine (the costs measured
//! are deterministic; noise only ever adds).
//!
//! The agent runs three times in the same run: first with the baseline `ioctl` match (the
//! (process, fd) table alone, as before GPU files were told at the ioctl;
//! `GPUWARDEN_BENCH_IOCTL_MATCH=fd-table`), then telling the file at every ioctl with a
//! `bpf_probe_read_kernel` call per hop of the walk to it (`file-probe-read`, the first build
//! that told the file), then as shipped (the same walk as typed loads), so the second table
//! compares the three on the same machine in the same minute. The third gives, for the same
//! three, the time the `ioctl` programs themselves took per call, from the kernel's BPF
//! statistics (`BPF_ENABLE_STATS`, on only for that pass): what the builds differ in, without
//! the rest of the syscall and far less of the machine's noise.

use std::{
    ffi::CString,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{status, workspace};

/// `_IOWR('F', NV_ESC_RM_ALLOC, NVOS21)`.
const RM_ALLOC_NVOS21: libc::c_ulong = 0xC020_462B;

/// Floors from the issue, in added ns.
const FLOOR_NON_GPU_IOCTL: f64 = 80.0;
const FLOOR_GPU_IOCTL: f64 = 400.0;
const FLOOR_UNRELATED: f64 = 25.0;
/// Ours: what identifying the opened file may add to an open (a few kernel reads and one hash
/// look-up; the path read it replaces cost about the same).
const FLOOR_OPEN: f64 = 250.0;

/// NVOS21 params of a video-memory allocation, with the allocation params they point at.
#[repr(C)]
struct AllocCall {
    nvos21: [u32; 8],
    alloc: [u32; 32],
}

impl AllocCall {
    fn new() -> Box<Self> {
        let mut call = Box::new(Self {
            nvos21: [0; 8],
            alloc: [0; 32],
        });
        let alloc_ptr = call.alloc.as_ptr() as u64;
        call.nvos21[0] = 0xc1d0_0001; // hRoot
        call.nvos21[1] = 0xcaf0_0001; // hObjectParent
        call.nvos21[3] = 0x40; // NV01_MEMORY_LOCAL_USER
        call.nvos21[4] = (alloc_ptr & 0xffff_ffff) as u32;
        call.nvos21[5] = (alloc_ptr >> 32) as u32;
        call.nvos21[6] = 128; // paramsSize
        call.alloc[16] = 64 << 20; // size (low word)
        call
    }
}

struct Case {
    name: &'static str,
    floor: f64,
    call: Box<dyn Fn()>,
}

pub fn run(iterations: u64, rounds: usize) -> anyhow::Result<()> {
    if !crate::is_root() {
        bail!("the benchmark attaches eBPF programs: run as root");
    }
    // The baselines are chosen by `GPUWARDEN_BENCH_IOCTL_MATCH`, which only an agent built with
    // its `bench` feature reads.
    let bin = crate::build_bench_binaries()?;
    let agent_bin = bin.join("gpuwarden-agent");
    // Under /tmp rather than $TMPDIR: the programs match device paths shorter than 64 bytes.
    // Removed when dropped, on every way out of this function.
    let scratch = tempfile::Builder::new()
        .prefix("gw-bench")
        .tempdir_in("/tmp")
        .context("cannot make a scratch directory under /tmp")?;
    let dir = scratch.path();
    let gpu_node = dir.join("nvidia0");
    mknod_null(&gpu_node)?;
    pin_to_cpu(0);

    let null = open(Path::new("/dev/null"))?;
    let gpu = open(&gpu_node)?;
    let params = AllocCall::new();
    let (null_fd, gpu_fd) = (null.as_raw_fd(), gpu.as_raw_fd());
    let params_ptr = &raw const params.nvos21 as usize;
    let cases = cases(null_fd, gpu_fd, params_ptr);

    let without = time_all(&cases, iterations, rounds);
    let url = format!("http://{}", controller_addr());
    let mut controller = start_controller(&bin, dir)?;
    let time_with = |mode| {
        start_agent(&agent_bin, dir, &gpu_node, &url, Some(mode)).map(|mut agent| {
            let times = time_all(&cases, iterations, rounds);
            let program = program_ns(&cases, iterations);
            stop(&mut agent);
            (times, program)
        })
    };
    let baselines =
        time_with("fd-table").and_then(|fd_table| Ok((fd_table, time_with("file-probe-read")?)));
    let (baseline, probe_read) = match baselines {
        Ok(times) => times,
        Err(e) => {
            stop(&mut controller);
            return Err(e);
        }
    };
    let mut agent = match start_agent(&agent_bin, dir, &gpu_node, &url, None) {
        Ok(agent) => agent,
        Err(e) => {
            stop(&mut controller);
            return Err(e);
        }
    };
    let with = time_all(&cases, iterations, rounds);
    let with_program = program_ns(&cases, iterations);
    let bound = measure_bound(&bin, dir, &url, &*cases[1].call, iterations, rounds);
    let counted = decoded_count(&agent_bin, &dir.join("agent.sock"));
    stop(&mut agent);
    stop(&mut controller);
    drop(scratch);
    let counted = counted?;
    let bound = bound?;
    let expected = iterations * rounds as u64;
    if counted < expected {
        bail!(
            "the agent counted {counted} rm_alloc ioctls on the GPU fd, expected at least {expected}: the GPU case did not take the decoded path"
        );
    }

    println!(
        "\ncargo xtask bench ebpf — {iterations} calls × {rounds} batches per case, fastest batch, pinned to CPU 0"
    );
    print_rows(&cases, &without, &with, bound);
    print_baseline(&cases, &without, [&baseline.0, &probe_read.0, &with]);
    print_program(&cases, [&baseline.1, &probe_read.1, &with_program]);
    println!(
        "(the quota check adds {:+.0} ns to a decoded GPU ioctl; the agent counted {counted} decoded rm_alloc ioctls on the GPU fd)",
        bound - with[1]
    );
    Ok(())
}

/// The cases timed: ioctls on `null_fd` and `gpu_fd` with the `RM_ALLOC` params at
/// `params_ptr`, a syscall the agent doesn't hook, an open, and an ioctl on `null_fd` with a
/// command the NVIDIA driver has no escape for.
fn cases(null_fd: i32, gpu_fd: i32, params_ptr: usize) -> [Case; 5] {
    [
        Case {
            name: "ioctl, non-GPU fd (/dev/null)",
            floor: FLOOR_NON_GPU_IOCTL,
            // SAFETY: a valid fd and a readable buffer; the device rejects the command.
            call: Box::new(move || unsafe {
                libc::ioctl(null_fd, RM_ALLOC_NVOS21, params_ptr);
            }),
        },
        Case {
            name: "ioctl, GPU fd (decoded RM_ALLOC)",
            floor: FLOOR_GPU_IOCTL,
            // SAFETY: as above.
            call: Box::new(move || unsafe {
                libc::ioctl(gpu_fd, RM_ALLOC_NVOS21, params_ptr);
            }),
        },
        Case {
            name: "getppid (not hooked)",
            floor: FLOOR_UNRELATED,
            // SAFETY: a plain syscall.
            call: Box::new(|| unsafe {
                libc::syscall(libc::SYS_getppid);
            }),
        },
        Case {
            name: "openat + close, regular file",
            floor: FLOOR_OPEN,
            // SAFETY: a valid C string; the fd is closed at once.
            call: Box::new(move || unsafe {
                let fd = libc::open(
                    c"/proc/self/stat".as_ptr(),
                    libc::O_RDONLY | libc::O_CLOEXEC,
                );
                if fd >= 0 {
                    libc::close(fd);
                }
            }),
        },
        Case {
            name: "ioctl, non-GPU fd, another driver's command (TCGETS)",
            floor: FLOOR_NON_GPU_IOCTL,
            // SAFETY: a valid fd and a writable buffer the size of a `termios`; /dev/null
            // answers `ENOTTY`.
            call: Box::new(move || unsafe {
                let mut termios: libc::termios = std::mem::zeroed();
                libc::ioctl(null_fd, libc::TCGETS, &raw mut termios);
            }),
        },
    ]
}

/// The table's header and rows: each case without and with the agent, then the GPU-fd case from
/// a cgroup with a quota (`bound`) against the same case without the agent.
fn print_rows(cases: &[Case], without: &[f64], with: &[f64], bound: f64) {
    println!(
        "| case | without agent (ns) | with agent (ns) | added (ns) | ratio | floor (added ns) | |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|");
    for ((case, w), a) in cases.iter().zip(without).zip(with) {
        let added = a - w;
        let verdict = if added <= case.floor {
            "within"
        } else {
            "OVER"
        };
        println!(
            "| {} | {w:.0} | {a:.0} | {added:+.0} | {:.2}× | ≤ {:.0} | {verdict} |",
            case.name,
            a / w,
            case.floor
        );
    }
    let added = bound - without[1];
    let verdict = if added <= FLOOR_GPU_IOCTL {
        "within"
    } else {
        "OVER"
    };
    println!(
        "| ioctl, GPU fd, cgroup with a quota (decode + quota check) | {:.0} | {bound:.0} | {added:+.0} | {:.2}× | ≤ {FLOOR_GPU_IOCTL:.0} | {verdict} |",
        without[1],
        bound / without[1]
    );
}

/// The agent as shipped against the baseline `ioctl` matches, case by case: `times` are the fd
/// table's, the file told with a helper call per hop, and the file told with typed loads.
fn print_baseline(cases: &[Case], without: &[f64], times: [&[f64]; 3]) {
    let [fd_table, probe_read, now] = times;
    println!(
        "\n| case | fd table (ns) | file, helper reads (ns) | file, typed loads (ns) | added: fd table / helper reads / typed (ns) | typed / fd table | typed / helper reads |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (i, case) in cases.iter().enumerate() {
        let (w, b, p, a) = (without[i], fd_table[i], probe_read[i], now[i]);
        println!(
            "| {} | {b:.0} | {p:.0} | {a:.0} | {:+.0} / {:+.0} / {:+.0} | {:.2}× | {:.2}× |",
            case.name,
            b - w,
            p - w,
            a - w,
            a / b,
            a / p
        );
    }
}

/// The time the `ioctl` programs take per call, from the kernel's own statistics: the same three
/// builds, without the noise of the rest of the syscall (rows only for the cases that run them).
fn print_program(cases: &[Case], times: [&[Option<f64>]; 3]) {
    println!(
        "\n| case | ioctl programs per call: fd table (ns) | file, helper reads (ns) | file, typed loads (ns) | typed / fd table |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (i, case) in cases.iter().enumerate() {
        let [Some(b), Some(p), Some(a)] = times.map(|t| t.get(i).copied().flatten()) else {
            continue;
        };
        println!(
            "| {} | {b:.0} | {p:.0} | {a:.0} | {:.2}× |",
            case.name,
            a / b
        );
    }
}

/// The programs whose time [`program_ns`] reads.
const IOCTL_PROGRAMS: [&str; 2] = ["sys_enter_ioctl", "sys_exit_ioctl"];

/// Run time (ns) and runs of the `ioctl` programs loaded now (0 while statistics are off).
fn ioctl_program_stats() -> (u64, u64) {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str().is_some_and(|n| IOCTL_PROGRAMS.contains(&n)))
        .fold((0, 0), |(time, runs), p| {
            let ns = u64::try_from(p.run_time().as_nanos()).unwrap_or(u64::MAX);
            (time + ns, runs + p.run_count())
        })
}

/// For each case, the time the `ioctl` programs took per call over `iterations` calls, with the
/// kernel's BPF run-time statistics on (only for this pass: they add two clock reads to every
/// program run); `None` for a case that doesn't run them, or where statistics can't be enabled.
#[expect(
    clippy::cast_precision_loss,
    reason = "ns per call, printed to the ns: an f64 holds the totals closely enough"
)]
fn program_ns(cases: &[Case], iterations: u64) -> Vec<Option<f64>> {
    let Ok(_stats) = aya::sys::enable_stats(aya::sys::Stats::RunTime) else {
        return vec![None; cases.len()];
    };
    cases
        .iter()
        .map(|case| {
            let (time, runs) = ioctl_program_stats();
            for _ in 0..iterations {
                (case.call)();
            }
            let (time_after, runs_after) = ioctl_program_stats();
            (runs_after.saturating_sub(runs) >= iterations)
                .then(|| time_after.saturating_sub(time) as f64 / iterations as f64)
        })
        .collect()
}

/// The controller's address for this run (a port of its own, so a running controller is left
/// alone).
fn controller_addr() -> String {
    format!("127.0.0.1:{}", 40_000 + std::process::id() % 20_000)
}

fn start_controller(bin: &Path, dir: &Path) -> anyhow::Result<Child> {
    Command::new(bin.join("gpuwarden-controller"))
        .args(["run", "--listen", &controller_addr(), "--state-dir"])
        .arg(dir.join("controller"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .context("cannot start gpuwarden-controller")
}

/// Binds a session's quota to a new cgroup, moves this process into it, times `call` there, and
/// moves back.
fn measure_bound(
    bin: &Path,
    dir: &Path,
    url: &str,
    call: &dyn Fn(),
    iterations: u64,
    rounds: usize,
) -> anyhow::Result<f64> {
    let root = gpuwarden_runtime::mountinfo::cgroup2_root()?;
    let home = std::fs::read_to_string("/proc/self/cgroup")?
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
        .context("this process has no cgroup v2 path")?;
    let name = format!("/gpuwarden-bench-{}", std::process::id());
    let cgroup = root.join(name.trim_start_matches('/'));
    std::fs::create_dir_all(&cgroup)
        .with_context(|| format!("cannot make {}", cgroup.display()))?;
    let result = (|| {
        // Memory only: no compute share, so the throttle leaves this process alone and the
        // timing measures the quota check and nothing else.
        status(
            Command::new(bin.join("gpuwarden"))
                .args(["--controller", url, "session", "create"])
                // Not a workload's cgroup: the bench, an admin, says so.
                .args(["-r", "cuda.mem=64g", "--cgroup", &name, "--unconfined"])
                .args(["--node", BENCH_NODE])
                .stdout(Stdio::null()),
        )?;
        let socket = dir.join("agent.sock");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !bound(&bin.join("gpuwarden-agent"), &socket) {
            if Instant::now() > deadline {
                bail!("the session's quota did not bind to {name} within 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        std::fs::write(cgroup.join("cgroup.procs"), std::process::id().to_string())?;
        Ok(fastest_ns(call, iterations, rounds))
    })();
    let back = root.join(home.trim_start_matches('/')).join("cgroup.procs");
    std::fs::write(&back, std::process::id().to_string())
        .with_context(|| format!("cannot move back to {}", back.display()))?;
    let _ = std::fs::remove_dir(&cgroup);
    result
}

/// The node name the benchmark's agent registers under.
const BENCH_NODE: &str = "gpuwarden-bench";

/// Whether the agent reports a bound quota.
fn bound(agent_bin: &Path, socket: &Path) -> bool {
    Command::new(agent_bin)
        .args(["snapshot", "--json", "--socket"])
        .arg(socket)
        .stderr(Stdio::null())
        .output()
        .ok()
        .and_then(|out| serde_json::from_slice::<serde_json::Value>(&out.stdout).ok())
        .is_some_and(|doc| {
            doc["bindings"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|b| b["state"] == "bound")
        })
}

/// Each case's fastest batch, in ns per call.
fn time_all(cases: &[Case], iterations: u64, rounds: usize) -> Vec<f64> {
    cases
        .iter()
        .map(|c| fastest_ns(&*c.call, iterations, rounds))
        .collect()
}

/// The fastest of `rounds` batches, in ns per call.
#[expect(
    clippy::cast_precision_loss,
    reason = "ns per call, printed to the ns: an f64 holds the batch's ns and count closely enough"
)]
fn fastest_ns(call: &dyn Fn(), iterations: u64, rounds: usize) -> f64 {
    // Warm caches and the CPU's frequency first.
    for _ in 0..iterations / 10 {
        call();
    }
    let mut batches: Vec<f64> = (0..rounds.max(1))
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iterations {
                call();
            }
            start.elapsed().as_nanos() as f64 / iterations as f64
        })
        .collect();
    batches.sort_by(f64::total_cmp);
    batches[0]
}

/// Starts the agent; `baseline`: with one of the `ioctl` matches of before
/// (`GPUWARDEN_BENCH_IOCTL_MATCH`).
fn start_agent(
    bin: &Path,
    dir: &Path,
    gpu_node: &Path,
    controller: &str,
    baseline: Option<&str>,
) -> anyhow::Result<Child> {
    let socket = dir.join("agent.sock");
    let mut command = Command::new(bin);
    if let Some(mode) = baseline {
        command.env("GPUWARDEN_BENCH_IOCTL_MATCH", mode);
    }
    let mut child = command
        .arg("run")
        .arg("--gpu-devices")
        .arg(gpu_node)
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(dir)
        // Nothing pinned: the benchmark leaves no programs behind.
        .arg("--no-pin")
        .args(["--controller", controller, "--node-name", BENCH_NODE])
        .arg("--mock-devices")
        .arg(workspace().join("deploy/mock-devices.toml"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            bail!("the agent exited early ({status})");
        }
        if decoded_count(bin, &socket).is_ok() {
            return Ok(child);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    stop(&mut child);
    bail!(
        "the agent did not answer on {} within 30 s",
        socket.display()
    )
}

/// The agent's count of `rm_alloc` ioctls on GPU 0 across all containers.
fn decoded_count(bin: &Path, socket: &Path) -> anyhow::Result<u64> {
    let out = Command::new(bin)
        .args(["snapshot", "--json", "--socket"])
        .arg(socket)
        .stderr(Stdio::null())
        .output()?;
    if !out.status.success() {
        bail!("snapshot failed");
    }
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let mut total = 0;
    for c in doc["containers"].as_array().into_iter().flatten() {
        for d in c["devices"].as_array().into_iter().flatten() {
            if d["device"] == "nvidia0" {
                total += d["ioctls"]["rm_alloc"].as_u64().unwrap_or(0);
            }
        }
    }
    Ok(total)
}

fn stop(child: &mut Child) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id().cast_signed(), libc::SIGTERM) };
    let _ = child.wait();
}

fn open(path: &Path) -> anyhow::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: a valid C string.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        bail!(
            "open {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes `path` a character device with `/dev/full`'s numbers (1:7): it opens, and answers
/// every ioctl with `ENOTTY`, and it is not `/dev/null` (the non-GPU case).
fn mknod_null(path: &Path) -> anyhow::Result<()> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: a valid C string.
    let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 7)) };
    if rc != 0 {
        bail!(
            "mknod {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; the calls take valid pointers.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const set);
    }
}
