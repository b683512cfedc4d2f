//! The process that issued an ioctl: its memory, and the argument it passed.
//!
//! FUSE copies an `_IOC`-encoded ioctl's own parameter struct in and out, but not what that
//! struct points to (allocation params, `IOCTL_XFER_CMD` payloads), and for commands that aren't
//! `_IOC`-encoded (all of UVM's) it copies nothing and doesn't say what the argument was. The
//! caller is blocked in `ioctl(2)` while the daemon answers, so the daemon (root) reads and writes
//! its memory with `process_vm_readv`/`process_vm_writev` and finds the argument in
//! `/proc/<tid>/syscall`.

/// An access to the caller's memory that failed (unmapped address, or the caller is gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fault;

/// Memory of the process behind an ioctl. A trait so the resource manager can be tested without
/// a second process.
pub(crate) trait CallerMemory {
    /// `len` bytes at `addr`.
    fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>, Fault>;
    /// Writes `data` at `addr`.
    fn write(&self, addr: u64, data: &[u8]) -> Result<(), Fault>;
    /// The file the caller's descriptor `fd` refers to (a MIG subscription's `capDescriptor`);
    /// `None` when it has no such descriptor.
    fn fd_path(&self, fd: u64) -> Option<std::path::PathBuf>;
}

/// A thread blocked in `ioctl(2)` on one of the driver's files (FUSE reports the thread id).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Process {
    pub(crate) tid: u32,
}

impl CallerMemory for Process {
    fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>, Fault> {
        let mut buf = vec![0u8; len];
        if len == 0 {
            return Ok(buf);
        }
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: len,
        };
        let remote = libc::iovec {
            iov_base: usize::try_from(addr).map_err(|_| Fault)? as *mut libc::c_void,
            iov_len: len,
        };
        let pid = libc::pid_t::try_from(self.tid).map_err(|_| Fault)?;
        // SAFETY: `local` covers `buf`, which lives across the call; the kernel checks `remote`.
        let n =
            unsafe { libc::process_vm_readv(pid, &raw const local, 1, &raw const remote, 1, 0) };
        if usize::try_from(n).ok() == Some(len) {
            Ok(buf)
        } else {
            Err(Fault)
        }
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), Fault> {
        if data.is_empty() {
            return Ok(());
        }
        let local = libc::iovec {
            iov_base: data.as_ptr().cast_mut().cast(),
            iov_len: data.len(),
        };
        let remote = libc::iovec {
            iov_base: usize::try_from(addr).map_err(|_| Fault)? as *mut libc::c_void,
            iov_len: data.len(),
        };
        let pid = libc::pid_t::try_from(self.tid).map_err(|_| Fault)?;
        // SAFETY: `local` covers `data` (only read from); the kernel checks `remote`.
        let n =
            unsafe { libc::process_vm_writev(pid, &raw const local, 1, &raw const remote, 1, 0) };
        if usize::try_from(n).ok() == Some(data.len()) {
            Ok(())
        } else {
            Err(Fault)
        }
    }

    fn fd_path(&self, fd: u64) -> Option<std::path::PathBuf> {
        self.fd_target(fd)
    }
}

impl Process {
    /// The file behind the thread's descriptor `fd`.
    fn fd_target(self, fd: u64) -> Option<std::path::PathBuf> {
        std::fs::read_link(format!("/proc/{}/fd/{fd}", self.tid)).ok()
    }

    /// The pointer argument of the `ioctl(fd, cmd, arg)` the thread is blocked in.
    pub(crate) fn ioctl_arg(self, cmd: u32) -> Option<u64> {
        let line = std::fs::read_to_string(format!("/proc/{}/syscall", self.tid)).ok()?;
        ioctl_arg_from_syscall(&line, cmd)
    }
}

/// Parses `/proc/<tid>/syscall` (`"<nr> <arg0> … <arg5> <sp> <pc>"`, arguments in hex) and
/// returns the third argument when the thread is in `ioctl(_, cmd, _)`.
pub(crate) fn ioctl_arg_from_syscall(line: &str, cmd: u32) -> Option<u64> {
    let mut fields = line.split_whitespace();
    let nr: libc::c_long = fields.next()?.parse().ok()?;
    if nr != libc::SYS_ioctl {
        return None;
    }
    let mut hex = fields.map(|f| u64::from_str_radix(f.strip_prefix("0x")?, 16).ok());
    let _fd = hex.next()??;
    // The kernel passes `cmd` as an unsigned long; only its low 32 bits are the command.
    let seen = hex.next()??;
    if seen & 0xffff_ffff != u64::from(cmd) {
        return None;
    }
    hex.next()?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_ioctl_argument() {
        let nr = libc::SYS_ioctl;
        let line =
            format!("{nr} 0x5 0x30000001 0x7ffd1234abc8 0x0 0x0 0x0 0x7ffd1234ab00 0x7f00\n");
        assert_eq!(
            ioctl_arg_from_syscall(&line, 0x3000_0001),
            Some(0x7ffd_1234_abc8)
        );
        assert_eq!(ioctl_arg_from_syscall(&line, 73), None, "another command");
        let read = format!("{} 0x5 0x30000001 0x10 0x0 0x0 0x0 0x0 0x0", libc::SYS_read);
        assert_eq!(ioctl_arg_from_syscall(&read, 0x3000_0001), None);
        assert_eq!(ioctl_arg_from_syscall("running", 1), None);
        assert_eq!(ioctl_arg_from_syscall("-1 0x7ffd 0x7f00", 1), None);
    }

    #[test]
    fn reads_and_writes_own_memory() {
        let mut target = [1u8, 2, 3, 4];
        let me = Process {
            tid: std::process::id(),
        };
        let addr = target.as_mut_ptr() as u64;
        assert_eq!(me.read(addr, 4), Ok(vec![1, 2, 3, 4]));
        me.write(addr + 1, &[9, 9]).unwrap();
        // Read through the pointer so the compiler can't assume the array is unchanged.
        let after: Vec<u8> = (0..4)
            .map(|i| {
                // SAFETY: in bounds of `target`.
                unsafe { std::ptr::read_volatile(target.as_ptr().add(i)) }
            })
            .collect();
        assert_eq!(after, [1, 9, 9, 4]);
        assert_eq!(me.read(8, 4), Err(Fault), "unmapped page");
    }
}
