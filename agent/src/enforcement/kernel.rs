//! The seam between enforcement and the kernel: the narrow traits the [`Enforcer`] talks to,
//! implemented with aya and cgroupfs by the agent (`sensor::maps`, `sensor::DeviceProgram`,
//! [`HostCgroups`](super::cgroup_tree::HostCgroups), [`ProcessSignals`]) and in memory by the
//! unit tests (docs/architecture.md, "The code shows the data path").
//!
//! [`Enforcer`]: super::Enforcer

use std::{
    collections::BTreeSet,
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
};

pub(crate) use super::dmem::DriverLimits;
use crate::sensor::DeviceProgram;
/// The maps enforcement writes (the sensor loads them; enforcement only uses them).
pub(crate) use crate::sensor::maps::QuotaMaps;

/// Device access per bound cgroup (the `cgroup_device` program).
pub(crate) trait DeviceAccess: Send {
    /// Lets the cgroup at `dir`, bound under quota `key`, open only its GPUs. Failures are
    /// logged: memory and compute are still enforced without it.
    fn attach(&mut self, key: u64, dir: &Path);
    /// Lets quota `key`'s cgroups open the MIG capability nodes `minors` (and no other), before
    /// [`Self::attach`]; none: no capability node at all.
    fn allow_caps(&mut self, key: u64, minors: &[u32]);
    /// Lets go of quota `key`'s cgroup.
    fn detach(&mut self, key: u64);
    /// Removes what an earlier agent left attached for keys not in `owned`; returns how many.
    fn sweep(&mut self, owned: &BTreeSet<u64>) -> usize;
}

/// The sensor's `cgroup_device` program is how the agent limits device access.
impl DeviceAccess for DeviceProgram {
    fn attach(&mut self, key: u64, dir: &Path) {
        DeviceProgram::attach(self, key, dir);
    }

    fn allow_caps(&mut self, key: u64, minors: &[u32]) {
        DeviceProgram::allow_caps(self, key, minors);
    }

    fn detach(&mut self, key: u64) {
        DeviceProgram::detach(self, key);
    }

    fn sweep(&mut self, owned: &BTreeSet<u64>) -> usize {
        DeviceProgram::sweep(self, owned)
    }
}

/// A process pinned by a pidfd opened before anything was checked about it (issue 33: `kill`
/// and `resume` checked a pid's owner, then signalled the number, which by then could name
/// another process). A signal through it reaches that process or none: once it has ended, the
/// pidfd answers `ESRCH`, whoever took its number since.
#[derive(Debug)]
pub(crate) struct Pinned {
    pid: u32,
    fd: Option<OwnedFd>,
}

impl Pinned {
    /// Pins process `pid` (`pidfd_open(2)`).
    ///
    /// # Errors
    /// No such process.
    pub(crate) fn open(pid: u32) -> io::Result<Self> {
        let raw = i32::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
        // SAFETY: a plain syscall; the fd it returns is new and ours.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw, 0) };
        let fd = i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pidfd_open returned a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { pid, fd: Some(fd) })
    }

    /// A process known by its number only, for the in-memory fakes.
    #[cfg(test)]
    pub(crate) fn unpinned(pid: u32) -> Self {
        Self { pid, fd: None }
    }

    /// Its number, as it was when pinned.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `signal` through the pidfd (0: only whether the pinned process is still there).
    ///
    /// # Errors
    /// It has ended (`ESRCH`), or may not be signalled.
    pub(crate) fn signal(&self, signal: i32) -> io::Result<()> {
        let Some(fd) = &self.fd else {
            return ProcessSignals.send(self.pid, signal);
        };
        // SAFETY: a plain syscall on an fd we own, with no siginfo.
        let sent = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0u32,
            )
        };
        if sent != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Signals to processes.
pub(crate) trait Signals: Send {
    /// Sends `signal` to process `pid`.
    ///
    /// # Errors
    /// No such process, or not allowed.
    fn send(&self, pid: u32, signal: i32) -> io::Result<()>;
    /// Sends `signal` to the pinned `process` (by request: `kill`, `resume`).
    ///
    /// # Errors
    /// It has ended, or may not be signalled.
    fn send_pinned(&self, process: &Pinned, signal: i32) -> io::Result<()> {
        process.signal(signal)
    }
    /// Whether process `pid` is stopped (`T` in its stat); `None` once it is gone.
    fn is_stopped(&self, pid: u32) -> Option<bool>;
}

/// Everything in the kernel the enforcer touches besides the cgroup tree.
pub(crate) struct Kernel {
    /// The quota maps.
    pub maps: QuotaMaps,
    /// Device access.
    pub devices: Box<dyn DeviceAccess>,
    /// Signals.
    pub signals: Box<dyn Signals>,
    /// The driver's own limit, where the node has it.
    pub driver_limits: Option<Box<dyn DriverLimits>>,
}

/// `kill(2)`.
pub(crate) struct ProcessSignals;

impl Signals for ProcessSignals {
    fn send(&self, pid: u32, signal: i32) -> io::Result<()> {
        let raw = i32::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
        // SAFETY: a plain syscall.
        if unsafe { libc::kill(raw, signal) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn is_stopped(&self, pid: u32) -> Option<bool> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The state follows the command name, which may hold anything but ends at the last ')'.
        let state = stat.rsplit_once(") ")?.1.chars().next()?;
        (state != 'Z' && state != 'X').then_some(matches!(state, 'T' | 't'))
    }
}
