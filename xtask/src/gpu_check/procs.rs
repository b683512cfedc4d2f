//! The processes gpu-check starts, and the only ways it signals them.
//!
//! Every program is started through [`Guard::spawn`]: it is registered under the section that
//! started it, killed with everything below it when the guard drops, when that section's
//! deadline passes ([`kill_section`]) or when the whole run's deadline passes ([`kill_all`]).
//! gpu-check makes itself a child subreaper, so a workload whose `gpuwarden run` parent died is
//! still its child. A signal goes only to a pid above 0 that is gpu-check's child or lies below
//! one of its children ([`signal`]): a pid that was never learned (0) or a negative one (a
//! process group) is refused and logged, never sent.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::BTreeMap,
    fs::File,
    path::Path,
    process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio},
    sync::{
        Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;

/// Live guarded children: pid → (section, label).
static LIVE: Mutex<BTreeMap<u32, (usize, String)>> = Mutex::new(BTreeMap::new());
/// Sections whose deadline passed: a thread of theirs still running starts nothing more.
static CANCELLED: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// Set once the run is ending: nothing more is started.
static CLOSING: AtomicBool = AtomicBool::new(false);
/// Signals refused (pid 0, negative, or not ours), for the log and the tests.
static REFUSED: Mutex<Vec<String>> = Mutex::new(Vec::new());

thread_local! {
    /// The section the current thread runs (0: the rig, outside any section).
    static SECTION: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks this thread as running section `n` (processes it starts are that section's).
pub fn enter_section(n: usize) {
    SECTION.with(|s| s.set(n));
}

/// Makes orphaned descendants (a workload whose `gpuwarden run` died) this process's children,
/// so they can still be found, signalled and reaped.
pub fn become_subreaper() {
    // SAFETY: a plain prctl on this process.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
}

/// The parent of `pid`, from `/proc/PID/stat`.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether `pid` is this process's child or lies below one.
#[must_use]
pub fn is_ours(pid: u32) -> bool {
    let me = std::process::id();
    let mut at = pid;
    for _ in 0..64 {
        match parent_of(at) {
            Some(p) if p == me => return true,
            Some(p) if p > 1 => at = p,
            _ => return false,
        }
    }
    false
}

/// Every process below `pid`, deepest first.
#[must_use]
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            if let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok())
                && let Some(pp) = parent_of(p)
            {
                children.entry(pp).or_default().push(p);
            }
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        for &c in children.get(&p).map_or(&[][..], Vec::as_slice) {
            out.push(c);
            stack.push(c);
        }
    }
    out.reverse();
    out
}

/// Sends `sig` to `pid` when it is safe: `pid` above 0 and ours ([`is_ours`]). Anything else is
/// refused, logged and reported as an error; the signal is never sent.
///
/// # Errors
/// The pid is 0, negative or not ours, or `kill` failed.
pub fn signal(pid: i64, sig: i32, why: &str) -> anyhow::Result<()> {
    let ours = u32::try_from(pid)
        .ok()
        .filter(|&p| p > 0 && p != std::process::id() && is_ours(p));
    let Some(p) = ours else {
        let msg = format!("refused to send signal {sig} to pid {pid} ({why}): not a child of ours");
        eprintln!("gpu-check: {msg}");
        REFUSED.locked().push(msg.clone());
        anyhow::bail!(msg);
    };
    let raw = i32::try_from(p).context("pid out of range")?;
    // SAFETY: `raw` is a positive pid below this process, checked just above.
    if unsafe { libc::kill(raw, sig) } != 0 {
        return Err(std::io::Error::last_os_error()).context(format!("kill({p}, {sig})"));
    }
    Ok(())
}

/// The signals refused so far.
#[must_use]
pub fn refused() -> Vec<String> {
    REFUSED.locked().clone()
}

/// SIGKILLs everything below `pid`, deepest first, and reaps those that became our children.
fn kill_below(pid: u32) {
    for d in descendants(pid) {
        let _ = signal(i64::from(d), libc::SIGKILL, "cleanup");
        if let Ok(raw) = i32::try_from(d) {
            // SAFETY: reaping a pid that may be our (adopted) child; no-op otherwise.
            unsafe { libc::waitpid(raw, std::ptr::null_mut(), libc::WNOHANG) };
        }
    }
}

/// Kills every process the section `n` started, with their descendants; its thread, if still
/// running, starts nothing more.
pub fn kill_section(n: usize) {
    let pids: Vec<u32> = {
        let live = LIVE.locked();
        CANCELLED.locked().push(n);
        live.iter()
            .filter(|(_, (s, _))| *s == n)
            .map(|(&p, _)| p)
            .collect()
    };
    for p in pids {
        kill_below(p);
        let _ = signal(i64::from(p), libc::SIGKILL, "section deadline");
    }
}

/// Kills every guarded process and everything else below this process (orphaned workloads
/// adopted as a subreaper included), and starts nothing more: the whole-run deadline, and the
/// end of a run. Repeats until nothing is left below, since a process being killed may have
/// just started another.
pub fn kill_all() {
    let pids: Vec<u32> = {
        let live = LIVE.locked();
        CLOSING.store(true, Ordering::SeqCst);
        live.keys().copied().collect()
    };
    for p in pids {
        kill_below(p);
        let _ = signal(i64::from(p), libc::SIGKILL, "run deadline");
    }
    for _ in 0..50 {
        kill_below(std::process::id());
        let left = descendants(std::process::id());
        // Zombies of ours are gone already; only live ones count.
        if left
            .iter()
            .all(|&p| process_state(p).is_none_or(|s| s == 'Z'))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The state letter of `pid`, if it exists.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// The labels of the guarded processes still registered.
#[must_use]
pub fn live() -> Vec<String> {
    LIVE.locked()
        .iter()
        .map(|(p, (_, l))| format!("{l} (pid {p})"))
        .collect()
}

/// A child that is killed, with everything below it, when dropped.
pub struct Guard {
    child: Child,
    pid: u32,
    label: String,
}

impl Guard {
    /// Starts `cmd` with stdout, stderr (and stdin when `stdin`) as given, registered under the
    /// current thread's section.
    ///
    /// # Errors
    /// It can't be started.
    pub fn spawn(
        mut cmd: Command,
        label: &str,
        log: &Path,
        piped_stdout: bool,
        stdin: bool,
    ) -> anyhow::Result<Self> {
        let err = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        cmd.stderr(err.try_clone()?);
        cmd.stdout(if piped_stdout {
            Stdio::piped()
        } else {
            Stdio::from(err)
        });
        cmd.stdin(if stdin { Stdio::piped() } else { Stdio::null() });
        // Under the lock: a process is either registered before `kill_all` looks, or not
        // started at all once it has.
        let mut live = LIVE.locked();
        if CLOSING.load(Ordering::SeqCst) {
            anyhow::bail!("not starting {label}: the run is ending");
        }
        let section = SECTION.with(std::cell::Cell::get);
        if CANCELLED.locked().contains(&section) {
            anyhow::bail!("not starting {label}: its section's deadline has passed");
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {label}: {cmd:?}"))?;
        let pid = child.id();
        live.insert(pid, (section, label.to_owned()));
        drop(live);
        Ok(Self {
            child,
            pid,
            label: label.to_owned(),
        })
    }

    /// Takes its piped stdout.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// Takes its piped stdin.
    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }

    /// Its exit status, if it has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits up to `limit` for it to exit.
    pub fn wait_for(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = self.try_wait() {
                return Some(s);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `sig` to it (SIGTERM to stop the agent cleanly).
    ///
    /// # Errors
    /// See [`signal`].
    pub fn signal(&self, sig: i32) -> anyhow::Result<()> {
        signal(i64::from(self.pid), sig, &self.label)
    }

    /// Kills it and everything below it, and reaps it.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        if let Some(s) = self.try_wait() {
            kill_below(self.pid);
            return Some(s);
        }
        kill_below(self.pid);
        let _ = self.child.kill();
        self.child.wait().ok()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.kill();
        LIVE.locked().remove(&self.pid);
    }
}
