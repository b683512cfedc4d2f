//! In-memory stand-ins for the kernel, for enforcement's unit tests: a cgroup tree, device
//! access and signals that record what they were asked, and the quota maps.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use gpuwarden_agent_common::maps::{CgroupDeviceKey, Quota};

use super::{
    cgroup_tree::CgroupFs,
    kernel::{DeviceAccess, DriverLimits, Kernel, QuotaMaps, Signals},
};
use crate::sensor::maps::fake::FakeMap;

/// A cgroup tree in memory: directories with ids, and the cgroup of each process.
#[derive(Clone, Default)]
pub(crate) struct FakeCgroups {
    dirs: Arc<Mutex<BTreeMap<PathBuf, u64>>>,
    pids: Arc<Mutex<BTreeMap<u32, String>>>,
    next: Arc<Mutex<u64>>,
    /// The processes in each cgroup directory (`cgroup.procs`).
    pub procs: Arc<Mutex<BTreeMap<PathBuf, Vec<u32>>>>,
    /// Directories whose `cgroup.kill` was written, in order.
    pub killed: Arc<Mutex<Vec<PathBuf>>>,
    /// The kernel has no `cgroup.kill` (before 5.14).
    pub no_kill_file: Arc<Mutex<bool>>,
}

impl FakeCgroups {
    /// Makes `dir` and its parents; returns its id.
    pub(crate) fn mkdir(&self, dir: impl AsRef<Path>) -> u64 {
        let dir = dir.as_ref();
        let mut dirs = self.dirs.lock().unwrap();
        let mut id = 0;
        for d in dir.ancestors().collect::<Vec<_>>().into_iter().rev() {
            id = *dirs.entry(d.to_owned()).or_insert_with(|| {
                let mut next = self.next.lock().unwrap();
                *next += 1;
                1000 + *next
            });
        }
        id
    }

    /// Removes `dir` and everything below it.
    pub(crate) fn rmdir(&self, dir: impl AsRef<Path>) {
        let dir = dir.as_ref();
        self.dirs.lock().unwrap().retain(|d, _| !d.starts_with(dir));
    }

    /// The id of `dir`.
    pub(crate) fn id_of(&self, dir: impl AsRef<Path>) -> Option<u64> {
        self.dirs.lock().unwrap().get(dir.as_ref()).copied()
    }

    /// Puts process `pid` in the cgroup at `rel` (relative to the root).
    pub(crate) fn put(&self, pid: u32, rel: &str) {
        self.pids.lock().unwrap().insert(pid, rel.to_owned());
    }
}

impl CgroupFs for FakeCgroups {
    fn subdirs(&self, dir: &Path) -> Vec<PathBuf> {
        self.dirs
            .lock()
            .unwrap()
            .keys()
            .filter(|d| d.parent() == Some(dir))
            .cloned()
            .collect()
    }

    fn id(&self, dir: &Path) -> Option<u64> {
        self.id_of(dir)
    }

    fn create(&self, dir: &Path) -> io::Result<()> {
        self.mkdir(dir);
        Ok(())
    }

    fn remove(&self, dir: &Path) -> io::Result<()> {
        if self.id_of(dir).is_none() {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        self.rmdir(dir);
        Ok(())
    }

    fn cgroup_of_pid(&self, pid: u32) -> Option<String> {
        self.pids.lock().unwrap().get(&pid).cloned()
    }

    fn procs(&self, dir: &Path) -> Vec<u32> {
        self.procs
            .lock()
            .unwrap()
            .get(dir)
            .cloned()
            .unwrap_or_default()
    }

    fn kill(&self, dir: &Path) -> io::Result<()> {
        if *self.no_kill_file.lock().unwrap() {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        self.killed.lock().unwrap().push(dir.to_owned());
        self.procs
            .lock()
            .unwrap()
            .retain(|d, _| !d.starts_with(dir));
        Ok(())
    }
}

/// Device access that records attachments; `pinned` holds links "left by an earlier agent".
#[derive(Clone, Default)]
pub(crate) struct FakeDevices {
    /// Keys with a link now.
    pub attached: Arc<Mutex<BTreeSet<u64>>>,
    /// The capability minors each key may open.
    pub caps: Arc<Mutex<std::collections::BTreeMap<u64, Vec<u32>>>>,
}

impl DeviceAccess for FakeDevices {
    fn attach(&mut self, key: u64, _dir: &Path) {
        self.attached.lock().unwrap().insert(key);
    }

    fn allow_caps(&mut self, key: u64, minors: &[u32]) {
        self.caps.lock().unwrap().insert(key, minors.to_vec());
    }

    fn detach(&mut self, key: u64) {
        self.attached.lock().unwrap().remove(&key);
        self.caps.lock().unwrap().remove(&key);
    }

    fn sweep(&mut self, owned: &BTreeSet<u64>) -> usize {
        let mut attached = self.attached.lock().unwrap();
        let before = attached.len();
        attached.retain(|k| owned.contains(k));
        before - attached.len()
    }
}

/// Signals that are recorded, not sent.
#[derive(Clone, Default)]
pub(crate) struct FakeSignals {
    /// (pid, signal) in order.
    pub sent: Arc<Mutex<Vec<(u32, i32)>>>,
    /// Processes that are running (not stopped); every other one is stopped.
    pub running: Arc<Mutex<std::collections::BTreeSet<u32>>>,
}

impl Signals for FakeSignals {
    fn send(&self, pid: u32, signal: i32) -> io::Result<()> {
        self.sent.lock().unwrap().push((pid, signal));
        Ok(())
    }

    fn send_pinned(&self, process: &super::kernel::Pinned, signal: i32) -> io::Result<()> {
        self.send(process.pid(), signal)
    }

    fn is_stopped(&self, pid: u32) -> Option<bool> {
        Some(!self.running.lock().unwrap().contains(&pid))
    }
}

/// The driver's own limit, recording what it was asked: `(dir, GPU, bytes)` set, `(dir, GPU)`
/// lifted.
#[derive(Clone, Default)]
pub(crate) struct FakeDriverLimits {
    pub set: Arc<Mutex<Vec<(PathBuf, u32, u64)>>>,
    pub lifted: Arc<Mutex<Vec<(PathBuf, u32)>>>,
}

impl DriverLimits for FakeDriverLimits {
    fn set(
        &mut self,
        dir: &Path,
        limits: &[(u32, u64)],
    ) -> Result<Vec<u32>, super::dmem::DmemError> {
        let mut set = self.set.lock().unwrap();
        for &(gpu, bytes) in limits {
            set.push((dir.to_owned(), gpu, bytes));
        }
        Ok(limits.iter().map(|&(gpu, _)| gpu).collect())
    }

    fn lift(&mut self, dir: &Path, gpus: &[u32]) -> Result<(), super::dmem::DmemError> {
        let mut lifted = self.lifted.lock().unwrap();
        for &gpu in gpus {
            lifted.push((dir.to_owned(), gpu));
        }
        Ok(())
    }

    fn tier(&self) -> &'static str {
        "driver_dmem"
    }
}

/// The whole fake kernel, with handles to look at it.
#[derive(Clone, Default)]
pub(crate) struct FakeKernel {
    pub quotas: FakeMap<u64, Quota>,
    pub cgroup_quota: FakeMap<u64, u64>,
    pub cgroup_memory: FakeMap<CgroupDeviceKey, u64>,
    pub devices: FakeDevices,
    pub signals: FakeSignals,
    pub cgroups: FakeCgroups,
}

impl FakeKernel {
    /// A [`Kernel`] writing into these fakes.
    pub(crate) fn kernel(&self) -> Kernel {
        Kernel {
            maps: QuotaMaps {
                quotas: self.quotas.boxed(),
                cgroup_quota: self.cgroup_quota.boxed(),
                cgroup_memory: self.cgroup_memory.boxed(),
            },
            devices: Box::new(self.devices.clone()),
            signals: Box::new(self.signals.clone()),
            driver_limits: None,
        }
    }
}
