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

    /// Marks the cgroup at `dir` as one the throttle may freeze (`true`), or takes the mark off:
    /// what an agent that starts after this one died finds and thaws ([`super::thaw_marked`]).
    fn mark(&mut self, dir: &Path, marked: bool) -> io::Result<()> {
        let _ = (dir, marked);
        Ok(())
    }
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
    /// Carries the mark of a cgroup the throttle may freeze ([`Freezer::mark`]): set before its
    /// first freeze, taken off when it leaves the throttle thawed.
    pub(crate) marked: bool,
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
            marked: false,
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
        if frozen && !self.marked {
            // Without the mark a dead agent's freeze outlives it unless its store survives; the
            // freeze still goes ahead (the store's thaw at start remains).
            match sys.mark(&self.dir, true) {
                Ok(()) => self.marked = true,
                Err(e) if is_gone(&e) => return Err(Gone),
                Err(e) => self.warn_once("marking", &e),
            }
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
        cgroup.marked = false;
    }
    cgroup
}

/// Thaws `cgroup` and takes its mark off, even if it is thought thawed: it leaves the throttle.
fn let_go(cgroup: &mut Cgroup, now: Instant, sys: &mut dyn Freezer) {
    cgroup.frozen = None;
    if cgroup.apply(now, false, sys).is_ok() && cgroup.marked {
        // A mark left behind only costs a redundant thaw at the next start.
        if let Err(e) = sys.mark(&cgroup.dir, false)
            && !is_gone(&e)
        {
            cgroup.warn_once("unmarking", &e);
        }
        cgroup.marked = false;
    }
}

/// Drops `key` and thaws it, even if it is thought thawed (a cgroup that is gone needs no
/// thawing).
pub(crate) fn release(cgroups: &mut CgroupSet, key: u64, now: Instant, sys: &mut dyn Freezer) {
    if let Some(mut cgroup) = cgroups.remove(&key) {
        let_go(&mut cgroup, now, sys);
    }
}

/// Thaws every cgroup not known to be thawed and takes the marks off (on shutdown).
pub(crate) fn thaw_all(cgroups: &mut CgroupSet, now: Instant, sys: &mut dyn Freezer) {
    for cgroup in cgroups.values_mut() {
        if cgroup.frozen != Some(false) || cgroup.marked {
            let_go(cgroup, now, sys);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records what was written to each directory.
    #[derive(Default)]
    struct Recorder {
        frozen: HashMap<PathBuf, bool>,
        marked: HashMap<PathBuf, bool>,
        log: Vec<&'static str>,
    }

    impl Freezer for Recorder {
        fn set_frozen(&mut self, dir: &Path, frozen: bool) -> io::Result<()> {
            self.frozen.insert(dir.to_owned(), frozen);
            self.log.push(if frozen { "freeze" } else { "thaw" });
            Ok(())
        }

        fn mark(&mut self, dir: &Path, marked: bool) -> io::Result<()> {
            self.marked.insert(dir.to_owned(), marked);
            self.log.push(if marked { "mark" } else { "unmark" });
            Ok(())
        }
    }

    /// A cgroup is marked before its first freeze (so a freeze that outlives the agent can be
    /// found), once, and unmarked when it leaves the throttle or the throttle stops.
    #[test]
    fn a_cgroup_is_marked_before_it_is_frozen_and_unmarked_when_let_go() {
        let now = Instant::now();
        let mut sys = Recorder::default();
        let mut set = CgroupSet::new();
        let (a, b) = (Path::new("/cg/a"), Path::new("/cg/b"));
        assert!(member(&mut set, 1, a).apply(now, false, &mut sys).is_ok());
        assert_eq!(sys.log, ["thaw"], "a thawed member is not marked");
        for frozen in [true, false, true] {
            assert!(member(&mut set, 1, a).apply(now, frozen, &mut sys).is_ok());
        }
        assert_eq!(sys.log, ["thaw", "mark", "freeze", "thaw", "freeze"]);
        release(&mut set, 1, now, &mut sys);
        assert_eq!(sys.log[5..], ["thaw", "unmark"]);
        assert_eq!((sys.frozen[a], sys.marked[a]), (false, false));

        assert!(member(&mut set, 2, b).apply(now, true, &mut sys).is_ok());
        assert!(member(&mut set, 2, b).apply(now, false, &mut sys).is_ok());
        thaw_all(&mut set, now, &mut sys);
        assert_eq!((sys.frozen[b], sys.marked[b]), (false, false));
        assert_eq!(sys.log.last(), Some(&"unmark"));
    }
}
