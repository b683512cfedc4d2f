//! Freezing and thawing one cgroup (`cgroup.freeze`), and the time it spent frozen: what every
//! throttle mode does to the cgroups it regulates, whatever decides when.

use std::{
    collections::HashMap,
    io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// Writes a cgroup's freezer, faked in tests.
pub(crate) trait Freezer {
    /// Freezes (`true`) or thaws the cgroup at `dir`.
    fn set_frozen(&mut self, dir: &Path, frozen: bool) -> io::Result<()>;
}

/// Whether an error means the cgroup no longer exists.
pub(crate) fn is_gone(err: &io::Error) -> bool {
    // ENODEV: a file of a cgroup that was removed while we held it open.
    err.kind() == io::ErrorKind::NotFound || err.raw_os_error() == Some(libc::ENODEV)
}

/// One cgroup, whatever its GPUs.
#[derive(Debug)]
pub(crate) struct Cgroup {
    pub(crate) dir: PathBuf,
    /// What we last wrote to `cgroup.freeze`; `None` until the first write, so the first tick
    /// writes whatever it decides (thawing a cgroup a dead agent left frozen).
    pub(crate) frozen: Option<bool>,
    pub(crate) frozen_since: Option<Instant>,
    pub(crate) throttled: Duration,
    /// A warning about an error other than "gone" was logged (once is enough).
    pub(crate) warned: bool,
    /// Held frozen whatever its buckets say: its workload was stopped by its memory policy, and
    /// only the agent resumes it (a `kill -CONT` from inside must not).
    pub(crate) held: bool,
}

impl Cgroup {
    /// A cgroup the throttle has not written to yet.
    pub(crate) fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            frozen: None,
            frozen_since: None,
            throttled: Duration::ZERO,
            warned: false,
            held: false,
        }
    }

    pub(crate) fn warn_once(&mut self, what: &str, err: &io::Error) {
        if !self.warned {
            self.warned = true;
            tracing::warn!(cgroup = %self.dir.display(), "throttle: {what}: {err}");
        }
    }

    /// Writes `frozen` if it differs from what we last wrote. `Err` only when the cgroup is gone.
    pub(crate) fn apply(
        &mut self,
        now: Instant,
        frozen: bool,
        sys: &mut dyn Freezer,
    ) -> Result<(), Gone> {
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

    pub(crate) fn throttled(&self, now: Instant) -> Duration {
        self.throttled
            + self
                .frozen_since
                .map_or(Duration::ZERO, |since| now.saturating_duration_since(since))
    }
}

/// The cgroup disappeared.
pub(crate) struct Gone;

/// Every cgroup a throttle mode regulates, by key: what both modes do to the set, whatever
/// decides when each is frozen.
pub(crate) type CgroupSet = HashMap<u64, Cgroup>;

/// The cgroup `key` at `dir`, added if new; one that moved forgets what was written to its old
/// directory, so the next decision is written again.
pub(crate) fn member<'a>(cgroups: &'a mut CgroupSet, key: u64, dir: &Path) -> &'a mut Cgroup {
    let cgroup = cgroups
        .entry(key)
        .or_insert_with(|| Cgroup::new(dir.to_owned()));
    if cgroup.dir != dir {
        dir.clone_into(&mut cgroup.dir);
        cgroup.frozen = None;
        cgroup.warned = false;
    }
    cgroup
}

/// Drops `key` and thaws it, even if it is thought thawed (a cgroup that is gone needs no
/// thawing).
pub(crate) fn release(cgroups: &mut CgroupSet, key: u64, now: Instant, sys: &mut dyn Freezer) {
    if let Some(mut cgroup) = cgroups.remove(&key) {
        cgroup.frozen = None;
        let _ = cgroup.apply(now, false, sys);
    }
}

/// Thaws every cgroup not known to be thawed (on shutdown).
pub(crate) fn thaw_all(cgroups: &mut CgroupSet, now: Instant, sys: &mut dyn Freezer) {
    for cgroup in cgroups.values_mut() {
        if cgroup.frozen != Some(false) {
            cgroup.frozen = None;
            let _ = cgroup.apply(now, false, sys);
        }
    }
}
