//! The helper's tie to the agent that started it: a helper whose agent is gone ends too.
//!
//! The agent kills a helper that outlives its timeout, and `kill_on_drop` kills one whose
//! agent stops in an orderly way; neither runs when the agent is killed with `SIGKILL` (an OOM
//! kill, a node drain's last resort). A helper left behind would go on with its driver call:
//! unlocking a process, say, while the agent's next run reads the driver's state of that
//! process and acts on it, so that the two race (the driver refuses the second unlock). Ended
//! with its agent, a helper leaves the driver's state as its call left it, for the next run to
//! read once and settle (docs/suspend.md, "A restart in the middle of a move").
//!
//! `PR_SET_PDEATHSIG` is not used: it fires when the *thread* that forked the helper ends, and
//! a tokio runtime's threads come and go while the agent lives.

use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::Duration,
};

/// The exit status of a helper ended because its agent is gone.
pub const ORPHANED: u8 = 4;

/// Ends this process (status [`ORPHANED`]) as soon as process `parent`, which must be its
/// parent, ends: watched by a thread of its own, through a pidfd where the kernel has them
/// (5.3+), else by asking for the parent every 50 ms.
///
/// # Errors
/// `parent` is gone already, or is not this process's parent (it died before the watch began
/// and this process was handed to another): the caller should end without acting.
pub fn end_with(parent: u32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(parent)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    let pidfd = pidfd_open(pid);
    // Checked after the pidfd is open: a parent that dies from here on is seen by the watch.
    if current_parent() != pid {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("process {parent} is not this helper's parent (any more)"),
        ));
    }
    let watch = match pidfd {
        Ok(fd) => Watch::Pidfd(fd, pid),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Err(e),
        // No pidfds (an older kernel, or a seccomp profile refusing the call).
        Err(_) => Watch::Poll(pid),
    };
    std::thread::Builder::new()
        .name("parent-watch".to_owned())
        .spawn(move || {
            watch.wait();
            // SAFETY: `_exit` ends the process at once, without running destructors or
            // `atexit` handlers that a driver call in another thread may be using.
            unsafe { libc::_exit(i32::from(ORPHANED)) }
        })?;
    Ok(())
}

enum Watch {
    Pidfd(OwnedFd, libc::pid_t),
    Poll(libc::pid_t),
}

impl Watch {
    /// Returns once the parent is gone.
    fn wait(&self) {
        match self {
            Self::Pidfd(fd, pid) => {
                let mut poll = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                loop {
                    // SAFETY: one valid `pollfd` for the duration of the call.
                    let n = unsafe { libc::poll(&raw mut poll, 1, -1) };
                    if n > 0 {
                        return;
                    }
                    if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                        // poll itself failing: fall back to asking.
                        break;
                    }
                }
                Self::Poll(*pid).wait();
            }
            Self::Poll(pid) => {
                while current_parent() == *pid {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }
}

fn current_parent() -> libc::pid_t {
    // SAFETY: getppid cannot fail.
    unsafe { libc::getppid() }
}

fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: `pidfd_open(pid_t pid, unsigned int flags)`; no pointers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("pidfd out of range"))?;
    // SAFETY: the kernel just returned this descriptor, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_that_is_not_the_parent_is_refused() {
        // A process is never its own parent.
        assert!(end_with(std::process::id()).is_err());
    }
}
