//! Compute share: a loop that keeps each bound cgroup to its share of a GPU by freezing and
//! thawing it (cgroup v2 `cgroup.freeze`).
//!
//! Two modes, set by the [`Signal`] the loop is given (`throttle_mode` in the agent's file):
//! - **slots** (the default, `slots.rs`): each GPU's time is cut into slots aligned to the
//!   driver's samples, one holder per GPU per slot, the others frozen; a ledger per cgroup gives
//!   the next slot to whoever is owed it. The signal is the GPU's own busy time
//!   ([`DeviceSignal`]: NVML's device samples, [`device`]).
//! - **buckets** (`control.rs`): every tick each member's cumulative busy time
//!   ([`UsageSource`]: NVML's device time apportioned by per-process samples, [`sampled`]) feeds a
//!   token bucket, and a member that used more than its share is frozen until it has earned the
//!   difference back.
//!
//! Policies ([`ComputePolicy`]): `hard` never lets a member above its share; `work-conserving`
//! lets it use capacity the others leave idle, and holds it to its share as soon as they contend.
//!
//! With mock devices both signals are the cgroups' CPU time ([`CpuTimeSignal`],
//! [`CpuTimeUsage`]), one CPU counted as one GPU: **a stand-in for testing the mechanism**, which
//! says nothing about any GPU (`docs/throttle.md`).
//!
//! Configuration flows down through the [`ThrottleHandle`] (a channel); statistics flow up
//! through a map the loop rewrites every tick. The loop thaws everything it froze when it stops,
//! and [`thaw`] undoes what a dead agent may have left frozen.
//!
//! # Example
//! ```no_run
//! # async fn example() -> Result<(), gpuwarden_agent::enforcement::throttle::ThrottleError> {
//! use gpuwarden_agent::enforcement::throttle::{
//!     self, ComputePolicy, CpuTimeSignal, Member, Signal, ThrottleConfig,
//! };
//!
//! let signal = Signal::Device(Box::new(CpuTimeSignal::default()));
//! let throttle = throttle::spawn(ThrottleConfig::default(), signal, "/sys/fs/bpf/gpuwarden")?;
//! throttle.set(0, 4242, Member {
//!     cgroup_dir: "/sys/fs/cgroup/unified/job".into(),
//!     share_ppm: 300_000, // 0.3 of GPU 0
//!     policy: ComputePolicy::Hard,
//! })?;
//! // ...
//! let throttled = throttle.stats(4242).map(|s| s.throttled);
//! throttle.shutdown().await;
//! # Ok(()) }
//! ```

mod control;
mod freezer;
#[cfg(test)]
mod gpu_sim;
mod slots;
mod usage;

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::HashMap,
    ffi::{CStr, CString},
    io,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

pub use self::slots::{Charge, SlotConfig};
pub use self::usage::{
    BusyInterval, CpuTimeSignal, CpuTimeUsage, DeviceReading, DeviceSignal, SignalHealth, Usage,
    UsageSource, device, device_signal_for, sampled, usage_for,
};
use self::{
    control::{Cgroups, Controller},
    freezer::Freezer,
    slots::{Scheduler, SlotKernel},
};

pub use gpuwarden_types::policy::ComputePolicy;

/// A cgroup bound to a share of one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The cgroup's cgroup v2 directory (absolute).
    pub cgroup_dir: PathBuf,
    /// Its share of the GPU in millionths, `1..=1_000_000`.
    pub share_ppm: u32,
    /// What it may do beyond its share.
    pub policy: ComputePolicy,
}

/// What the throttle has done to one cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ThrottleStats {
    /// Total time it was kept frozen.
    pub throttled: Duration,
    /// Frozen now.
    pub frozen: bool,
    /// Its recent measured running fraction (over about one period; the largest of its GPUs).
    pub running_fraction: f64,
    /// GPU time measured for it so far, summed over its GPUs (a counter: one GPU busy for one
    /// second is one second).
    pub gpu_time: Duration,
    /// Its ledger, entitled minus used, in seconds (the least of its GPUs'; positive is time it
    /// is owed); `None` where the mode keeps none.
    pub balance: Option<f64>,
}

/// How the loop runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottleConfig {
    /// Buckets: one freeze/thaw cycle of a member that is always busy; also the most credit idle
    /// time banks (`share × period`).
    pub period: Duration,
    /// How often usage is measured and decisions are made.
    pub tick: Duration,
    /// Slots: how they are cut.
    pub slots: SlotConfig,
}

impl ThrottleConfig {
    /// `period`, measured ten times per period.
    #[must_use]
    pub fn with_period(period: Duration) -> Self {
        Self {
            period,
            tick: period / 10,
            slots: SlotConfig::default(),
        }
    }
}

impl Default for ThrottleConfig {
    /// 100 ms periods, measured every 10 ms; 120 ms slots with a 3 ms guard.
    fn default() -> Self {
        Self::with_period(Duration::from_millis(100))
    }
}

/// What the throttle measures, which also says how it holds shares.
pub enum Signal {
    /// The GPU's own busy time: **exclusive slots** (`slots.rs`), one holder per GPU at a time,
    /// each slot's busy time its holder's. The default.
    Device(Box<dyn DeviceSignal>),
    /// Each cgroup's busy time (apportioned by per-process samples on a real GPU): **token
    /// buckets** (`control.rs`), every member thawed and frozen on its own. Kept for comparison
    /// and for GPUs where slots can't work (`throttle_mode = "buckets"`).
    PerCgroup(Box<dyn UsageSource>),
}

/// The throttle's way of holding shares (`throttle_mode` in the agent's configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ThrottleMode {
    /// Exclusive slots on the GPU's own busy time ([`Signal::Device`]).
    #[default]
    Slots,
    /// Token buckets on per-cgroup busy time ([`Signal::PerCgroup`]).
    Buckets,
}

/// Errors of the throttle's API.
#[derive(Debug, thiserror::Error)]
pub enum ThrottleError {
    /// The configuration can't work.
    #[error(
        "invalid throttle configuration: tick {tick:?} must be non-zero and at most the period {period:?}"
    )]
    InvalidConfig {
        /// The period given.
        period: Duration,
        /// The tick given.
        tick: Duration,
    },
    /// A share outside `1..=1_000_000`.
    #[error("invalid compute share {share_ppm} ppm for cgroup {key}; expected 1..=1000000")]
    InvalidShare {
        /// The cgroup.
        key: u64,
        /// The share given.
        share_ppm: u32,
    },
    /// A cgroup directory that isn't absolute.
    #[error("cgroup directory {dir} for cgroup {key} is not absolute")]
    RelativeDir {
        /// The cgroup.
        key: u64,
        /// The directory given.
        dir: PathBuf,
    },
    /// The loop's thread couldn't be started.
    #[error("cannot start the throttle thread: {0}")]
    Spawn(#[source] io::Error),
    /// The loop has stopped (shut down, or it died).
    #[error("the throttle loop has stopped")]
    Stopped,
}

/// Thaws the cgroup at `cgroup_dir` (writes `0` to its `cgroup.freeze`).
///
/// Meant for agent start, on every persisted binding, so that nothing a dead agent froze stays
/// frozen. A directory that no longer exists has nothing to thaw and is not an error.
///
/// # Errors
/// The directory exists but its `cgroup.freeze` can't be written.
pub fn thaw(cgroup_dir: &Path) -> io::Result<()> {
    match write_freeze(cgroup_dir, false) {
        Err(e) if freezer::is_gone(&e) && !cgroup_dir.exists() => Ok(()),
        other => other,
    }
}

/// The extended attribute on each cgroup the throttle may freeze; its value names the agent
/// instance (its pin folder), so an agent thaws only what one of its own left. `trusted.*`: only
/// a process with `CAP_SYS_ADMIN` sets or removes one, so no tenant forges or hides it.
const FREEZE_MARK: &CStr = c"trusted.gpuwarden.throttle";

/// Thaws every cgroup under `root` that carries the throttle's mark of `owner` (as given to
/// [`spawn`]), and takes the mark off: what a killed agent left frozen, found without its
/// store. Returns how many it thawed.
///
/// Meant for agent start, before the throttle takes any member: the store's thaw
/// ([`thaw`] on every persisted binding) misses an agent restarted without its store.
pub fn thaw_marked(root: &Path, owner: &str) -> usize {
    let mut thawed = 0;
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            // `file_type` does not follow links: the walk stays inside the tree.
            dirs.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        if dir == root || !has_mark(&dir, owner) {
            continue;
        }
        match thaw(&dir) {
            Ok(()) => {
                thawed += 1;
                if let Err(e) = set_mark(&dir, None) {
                    tracing::debug!(dir = %dir.display(), "mark not removed: {e}");
                }
            }
            Err(e) => tracing::warn!(dir = %dir.display(), "left frozen by a dead agent: {e}"),
        }
    }
    thawed
}

fn c_path(dir: &Path) -> io::Result<CString> {
    CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

fn has_mark(dir: &Path, owner: &str) -> bool {
    let Ok(path) = c_path(dir) else {
        return false;
    };
    let mut value = [0u8; 256];
    // SAFETY: valid C strings and a buffer of the size given.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            FREEZE_MARK.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    usize::try_from(n).is_ok_and(|n| value.get(..n) == Some(owner.as_bytes()))
}

/// Sets the mark with `owner` as its value, or removes it (`None`).
fn set_mark(dir: &Path, owner: Option<&str>) -> io::Result<()> {
    let path = c_path(dir)?;
    // SAFETY: valid C strings, and a value of the length given.
    let rc = unsafe {
        match owner {
            Some(owner) => libc::setxattr(
                path.as_ptr(),
                FREEZE_MARK.as_ptr(),
                owner.as_ptr().cast(),
                owner.len(),
                0,
            ),
            None => libc::removexattr(path.as_ptr(), FREEZE_MARK.as_ptr()),
        }
    };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    // Already off.
    if owner.is_none() && e.raw_os_error() == Some(libc::ENODATA) {
        Ok(())
    } else {
        Err(e)
    }
}

fn write_freeze(cgroup_dir: &Path, frozen: bool) -> io::Result<()> {
    std::fs::write(
        cgroup_dir.join("cgroup.freeze"),
        if frozen { "1" } else { "0" },
    )
}

/// The real kernel: the signal, and freezing through `cgroup.freeze`.
struct Kernel {
    signal: Signal,
    /// The value of the marks it sets ([`thaw_marked`]).
    owner: String,
    /// Per GPU: how long its signal's reads took (the slowest, the sum, how many).
    reads: HashMap<u32, (Duration, Duration, u32)>,
}

impl Cgroups for Kernel {
    fn busy(&mut self, gpu: u32, dir: &Path) -> io::Result<Usage> {
        match &mut self.signal {
            Signal::PerCgroup(usage) => usage.busy(gpu, dir),
            Signal::Device(_) => Err(io::ErrorKind::Unsupported.into()),
        }
    }
}

impl SlotKernel for Kernel {
    fn read(&mut self, gpu: u32, cgroups: &[&Path]) -> io::Result<DeviceReading> {
        match &mut self.signal {
            Signal::Device(signal) => {
                let started = Instant::now();
                let reading = signal.read(gpu, cgroups);
                let took = started.elapsed();
                let (max, sum, n) = self.reads.entry(gpu).or_default();
                *max = (*max).max(took);
                *sum = sum.saturating_add(took);
                *n = n.saturating_add(1);
                reading
            }
            Signal::PerCgroup(_) => Err(io::ErrorKind::Unsupported.into()),
        }
    }
}

impl Freezer for Kernel {
    fn set_frozen(&mut self, dir: &Path, frozen: bool) -> io::Result<()> {
        write_freeze(dir, frozen)
    }

    fn mark(&mut self, dir: &Path, marked: bool) -> io::Result<()> {
        set_mark(dir, marked.then_some(self.owner.as_str()))
    }
}

enum Command {
    Set { gpu: u32, key: u64, member: Member },
    Hold { key: u64, dir: PathBuf, held: bool },
    Remove { key: u64 },
    Shutdown(tokio::sync::oneshot::Sender<()>),
}

type StatsMap = Arc<Mutex<Published>>;

/// What the loop publishes every tick.
#[derive(Debug, Default)]
struct Published {
    cgroups: HashMap<u64, ThrottleStats>,
    signals: HashMap<u32, SignalHealth>,
}

/// Controls the throttle loop started by [`spawn`]. Clones control the same loop; when the last
/// one is dropped the loop thaws everything and stops, as after [`ThrottleHandle::shutdown`].
#[derive(Debug, Clone)]
pub struct ThrottleHandle {
    commands: mpsc::Sender<Command>,
    stats: StatsMap,
    mode: ThrottleMode,
}

impl ThrottleHandle {
    /// Adds cgroup `key` to `gpu`'s members, or updates its share, policy or directory there.
    ///
    /// # Errors
    /// The share is out of range, the directory is relative, or the loop has stopped.
    pub fn set(&self, gpu: u32, key: u64, member: Member) -> Result<(), ThrottleError> {
        if !(1..=1_000_000).contains(&member.share_ppm) {
            return Err(ThrottleError::InvalidShare {
                key,
                share_ppm: member.share_ppm,
            });
        }
        if !member.cgroup_dir.is_absolute() {
            return Err(ThrottleError::RelativeDir {
                key,
                dir: member.cgroup_dir,
            });
        }
        self.send(Command::Set { gpu, key, member })
    }

    /// Holds cgroup `key` (at `dir`) frozen until released with `held: false`, whatever its
    /// share says: a workload stopped by its memory policy stays stopped until the agent resumes
    /// it. A cgroup with no share is held too, until [`ThrottleHandle::remove`].
    ///
    /// # Errors
    /// The directory is relative, or the loop has stopped.
    pub fn hold(&self, key: u64, dir: PathBuf, held: bool) -> Result<(), ThrottleError> {
        if !dir.is_absolute() {
            return Err(ThrottleError::RelativeDir { key, dir });
        }
        self.send(Command::Hold { key, dir, held })
    }

    /// Drops cgroup `key` from every GPU and thaws it.
    ///
    /// # Errors
    /// The loop has stopped (and so has thawed it already).
    pub fn remove(&self, key: u64) -> Result<(), ThrottleError> {
        self.send(Command::Remove { key })
    }

    /// What the throttle has done to cgroup `key`, as of the last tick; `None` if it isn't a
    /// member (yet: a member shows up at the first tick after [`ThrottleHandle::set`]).
    #[must_use]
    pub fn stats(&self, key: u64) -> Option<ThrottleStats> {
        self.stats.locked().cgroups.get(&key).copied()
    }

    /// How the loop holds shares.
    #[must_use]
    pub fn mode(&self) -> &'static str {
        match self.mode {
            ThrottleMode::Slots => "slots",
            ThrottleMode::Buckets => "buckets",
        }
    }

    /// How each GPU's signal has behaved, as of the last tick (slots only: the bucket mode's
    /// signal keeps its figures to itself).
    #[must_use]
    pub fn signals(&self) -> Vec<(u32, SignalHealth)> {
        let mut signals: Vec<_> = self
            .stats
            .locked()
            .signals
            .iter()
            .map(|(g, h)| (*g, *h))
            .collect();
        signals.sort_by_key(|(g, _)| *g);
        signals
    }

    /// Stops the loop, thawing everything it froze, and waits for it.
    pub async fn shutdown(self) {
        let (done, stopped) = tokio::sync::oneshot::channel();
        if self.commands.send(Command::Shutdown(done)).is_ok() {
            // An error means the loop died; its guard thawed what it froze on the way out.
            let _ = stopped.await;
        }
    }

    fn send(&self, command: Command) -> Result<(), ThrottleError> {
        self.commands
            .send(command)
            .map_err(|_| ThrottleError::Stopped)
    }
}

/// Starts the throttle loop, holding shares the way `signal` allows (see [`Signal`]). Each
/// cgroup it freezes is marked as `owner`'s first (see [`thaw_marked`]): the agent passes its pin
/// folder, what names it across restarts.
///
/// The loop is a dedicated thread, not a tokio task: it does blocking cgroupfs I/O every tick,
/// and its timing (what every share is measured against) must not depend on how busy the async
/// runtime is. It sleeps between ticks in `recv_timeout`, so commands apply at once.
///
/// # Errors
/// The configuration is invalid, or the thread can't be started.
pub fn spawn(
    config: ThrottleConfig,
    signal: Signal,
    owner: &str,
) -> Result<ThrottleHandle, ThrottleError> {
    if config.tick.is_zero() || config.tick > config.period {
        return Err(ThrottleError::InvalidConfig {
            period: config.period,
            tick: config.tick,
        });
    }
    let (commands, rx) = mpsc::channel();
    let stats = StatsMap::default();
    let (engine, mode) = match signal {
        Signal::Device(_) => (
            Engine::Slots(Scheduler::new(config.slots)),
            ThrottleMode::Slots,
        ),
        Signal::PerCgroup(_) => (
            Engine::Buckets(Controller::new(config.period)),
            ThrottleMode::Buckets,
        ),
    };
    let looped = Loop {
        engine,
        kernel: Kernel {
            signal,
            owner: owner.to_owned(),
            reads: HashMap::new(),
        },
        stats: Arc::clone(&stats),
    };
    std::thread::Builder::new()
        .name("gpuwarden-throttle".into())
        .spawn(move || looped.run(&rx, config.tick))
        .map_err(ThrottleError::Spawn)?;
    Ok(ThrottleHandle {
        commands,
        stats,
        mode,
    })
}

/// What decides: slots or buckets.
enum Engine {
    Slots(Scheduler),
    Buckets(Controller),
}

impl Engine {
    fn set(&mut self, gpu: u32, key: u64, member: &Member) {
        match self {
            Self::Slots(s) => s.set(gpu, key, member),
            Self::Buckets(c) => c.set(gpu, key, member),
        }
    }

    fn hold(&mut self, key: u64, dir: &Path, held: bool, now: Instant, kernel: &mut Kernel) {
        match self {
            Self::Slots(s) => s.hold(key, dir, held, now, kernel),
            Self::Buckets(c) => c.hold(key, dir, held, now, kernel),
        }
    }

    fn remove(&mut self, key: u64, now: Instant, kernel: &mut Kernel) {
        match self {
            Self::Slots(s) => s.remove(key, now, kernel),
            Self::Buckets(c) => c.remove(key, now, kernel),
        }
    }

    fn tick(&mut self, now: Instant, kernel: &mut Kernel) {
        match self {
            Self::Slots(s) => s.tick(now, kernel),
            Self::Buckets(c) => c.tick(now, kernel),
        }
    }

    fn thaw_all(&mut self, now: Instant, kernel: &mut Kernel) {
        match self {
            Self::Slots(s) => s.thaw_all(now, kernel),
            Self::Buckets(c) => c.thaw_all(now, kernel),
        }
    }

    /// A moment between ticks the engine must act at (a slot's guard or end).
    fn next_event(&self) -> Option<Instant> {
        match self {
            Self::Slots(s) => s.next_event(),
            Self::Buckets(_) => None,
        }
    }

    fn stats(&self, now: Instant) -> Vec<(u64, ThrottleStats)> {
        match self {
            Self::Slots(s) => s.stats(now).collect(),
            Self::Buckets(c) => c.stats(now).collect(),
        }
    }
}

/// The loop's state. Dropping it thaws every member, however the loop ends (a panic included).
struct Loop {
    engine: Engine,
    kernel: Kernel,
    stats: StatsMap,
}

impl Loop {
    fn run(mut self, rx: &mpsc::Receiver<Command>, tick: Duration) {
        let mut next_tick = Instant::now() + tick;
        let mut last = Instant::now();
        loop {
            // A slot's guard or end falls between ticks: wake for it too (once: an event the
            // engine did not move on waits for the next regular tick).
            let event = self.engine.next_event().filter(|at| *at > last);
            let due = event.map_or(next_tick, |at| at.min(next_tick));
            let now = Instant::now();
            if now < due {
                match rx.recv_timeout(due - now) {
                    Ok(Command::Set { gpu, key, member }) => self.engine.set(gpu, key, &member),
                    Ok(Command::Hold { key, dir, held }) => {
                        self.engine
                            .hold(key, &dir, held, Instant::now(), &mut self.kernel);
                    }
                    Ok(Command::Remove { key }) => {
                        self.engine.remove(key, Instant::now(), &mut self.kernel);
                    }
                    Ok(Command::Shutdown(done)) => {
                        drop(self); // thaws
                        let _ = done.send(());
                        return;
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
                continue;
            }
            self.engine.tick(now, &mut self.kernel);
            self.publish(now);
            last = now;
            if now >= next_tick {
                next_tick += tick;
                if next_tick <= now {
                    // Fell behind (a stalled machine): don't try to catch up in a burst.
                    next_tick = now + tick;
                }
            }
        }
    }

    fn publish(&self, now: Instant) {
        let cgroups = self.engine.stats(now);
        let signals: Vec<(u32, SignalHealth)> = match (&self.kernel.signal, &self.engine) {
            (Signal::Device(signal), Engine::Slots(scheduler)) => scheduler
                .unattributed()
                .filter_map(|(gpu, unattributed)| {
                    signal.health(gpu).map(|mut h| {
                        h.unattributed = unattributed;
                        if let Some(&(max, sum, n)) = self.kernel.reads.get(&gpu) {
                            h.read_max = max;
                            h.read_mean = sum / n.max(1);
                        }
                        (gpu, h)
                    })
                })
                .collect(),
            _ => Vec::new(),
        };
        let mut stats = self.stats.locked();
        stats.cgroups.clear();
        stats.cgroups.extend(cgroups);
        stats.signals.clear();
        stats.signals.extend(signals);
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let now = Instant::now();
        self.engine.thaw_all(now, &mut self.kernel);
        self.publish(now);
    }
}

#[cfg(test)]
mod tests;
