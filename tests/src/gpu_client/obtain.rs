//! Ways a process gets a GPU fd other than `openat(2)`: the raw `open` and `creat` system calls,
//! `io_uring`'s `IORING_OP_OPENAT`, an fd received over a Unix socket (`SCM_RIGHTS`), an fd taken
//! from another process (`pidfd_getfd`), and many dups at once. The agent must count and limit
//! the ioctls made on each (docs/accounting.md, "Which files are GPU nodes"); the `gpu-client`
//! commands `open … <how>`, `fd-socket`, `send-fd`, `recv-fd`, `getfd` and `dup-many` use them.

use std::{
    ffi::CString,
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::net::UnixDatagram,
    },
    path::Path,
};

/// How `open <path> <how>` opens the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OpenHow {
    /// `openat(AT_FDCWD, …)`, as the C library's `open` does on x86-64.
    #[default]
    Openat,
    /// The `open` system call itself (`syscall(SYS_open)`).
    Open,
    /// The `creat` system call (`O_CREAT | O_WRONLY | O_TRUNC`).
    Creat,
    /// `io_uring`'s `IORING_OP_OPENAT`: no `openat` system call at all.
    Uring,
}

impl OpenHow {
    /// Parses the word after the path.
    #[must_use]
    pub fn parse(word: &str) -> Option<Self> {
        Some(match word {
            "openat" => Self::Openat,
            "open" => Self::Open,
            "creat" => Self::Creat,
            "uring" => Self::Uring,
            _ => return None,
        })
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// An fd a system call returned (negative: the errno).
fn owned(fd: i64) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: a fresh fd nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `path` read-write (`creat`: write-only, as that call does) and close-on-exec, by `how`.
///
/// # Errors
/// The open fails.
pub fn open(path: &Path, how: OpenHow) -> io::Result<OwnedFd> {
    let c = c_path(path)?;
    let flags = libc::O_RDWR | libc::O_CLOEXEC;
    match how {
        // SAFETY: a valid C string.
        OpenHow::Openat => owned(unsafe { libc::openat(libc::AT_FDCWD, c.as_ptr(), flags) }.into()),
        // SAFETY: as above.
        OpenHow::Open => owned(unsafe { libc::syscall(libc::SYS_open, c.as_ptr(), flags) }),
        // SAFETY: as above.
        OpenHow::Creat => owned(unsafe { libc::syscall(libc::SYS_creat, c.as_ptr(), 0o666) }),
        OpenHow::Uring => open_uring(&c, flags),
    }
}

/// `IORING_OP_OPENAT` on a ring of its own.
fn open_uring(path: &CString, flags: i32) -> io::Result<OwnedFd> {
    let mut ring = io_uring::IoUring::new(2)?;
    let op = io_uring::opcode::OpenAt::new(io_uring::types::Fd(libc::AT_FDCWD), path.as_ptr())
        .flags(flags)
        .build()
        .user_data(1);
    // SAFETY: `path` outlives the submission: the call waits for its completion below.
    unsafe { ring.submission().push(&op) }
        .map_err(|_| io::Error::other("the submission queue is full"))?;
    ring.submit_and_wait(1)?;
    let done = ring
        .completion()
        .next()
        .ok_or_else(|| io::Error::other("no completion"))?;
    if done.result() < 0 {
        return Err(io::Error::from_raw_os_error(-done.result()));
    }
    owned(done.result().into())
}

/// Binds a datagram socket at `path` that [`recv_fd`] reads fds from.
///
/// # Errors
/// The bind fails.
pub fn fd_socket(path: &Path) -> io::Result<OwnedFd> {
    let _ = std::fs::remove_file(path);
    Ok(UnixDatagram::bind(path)?.into())
}

/// The size of one fd, as `CMSG_*` take it (4 bytes).
#[expect(clippy::cast_possible_truncation, reason = "the size of an i32")]
const FD_SIZE: u32 = size_of::<RawFd>() as u32;

/// Sends `fd` over `SCM_RIGHTS` to the socket bound at `path`.
///
/// # Errors
/// The send fails.
pub fn send_fd(path: &Path, fd: RawFd) -> io::Result<()> {
    let socket = UnixDatagram::unbound()?;
    socket.connect(path)?;
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // u64 words keep the control buffer aligned for `cmsghdr`.
    let mut control = [0u64; 4];
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the call.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(FD_SIZE) as usize;
        let cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(FD_SIZE) as usize;
        libc::CMSG_DATA(cmsg).cast::<RawFd>().write_unaligned(fd);
        if libc::sendmsg(socket.as_raw_fd(), &raw const msg, 0) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receives one fd sent with [`send_fd`] on `socket` (made by [`fd_socket`]).
///
/// # Errors
/// The receive fails or carries no fd.
pub fn recv_fd(socket: RawFd) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = [0u64; 4];
    // SAFETY: as in `send_fd`; the kernel fills the control buffer it was given.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = size_of_val(&control);
        if libc::recvmsg(socket, &raw mut msg, libc::MSG_CMSG_CLOEXEC) < 0 {
            return Err(io::Error::last_os_error());
        }
        let cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
        if cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(io::Error::other("the message carried no fd"));
        }
        owned(
            libc::CMSG_DATA(cmsg)
                .cast::<RawFd>()
                .read_unaligned()
                .into(),
        )
    }
}

/// Takes a copy of process `pid`'s fd `fd` (`pidfd_open` + `pidfd_getfd`; root, or a process
/// allowed to ptrace it).
///
/// # Errors
/// Either call fails.
pub fn take_fd(pid: u32, fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: plain system calls; the pidfd is owned at once.
    let pidfd = owned(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: as above.
    owned(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) })
}

/// Duplicates `fd` `count` times (`fcntl(F_DUPFD_CLOEXEC)`), raising this process's fd limits
/// as far as needed (root may go up to `nr_open`); the copies stay open until the process ends.
/// Returns the first and last copy.
///
/// # Errors
/// The limit can't be raised, or a dup fails.
pub fn dup_many(fd: RawFd, count: u32) -> io::Result<(RawFd, RawFd)> {
    let wanted = libc::rlim_t::from(count) + 1024;
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid pointers to an rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) != 0 {
            return Err(io::Error::last_os_error());
        }
        if limit.rlim_cur < wanted {
            limit.rlim_cur = wanted;
            limit.rlim_max = limit.rlim_max.max(wanted);
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    let (mut first, mut last) = (-1, -1);
    for _ in 0..count {
        // SAFETY: a plain fcntl; the copy is deliberately left open (not owned).
        let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if copy < 0 {
            return Err(io::Error::last_os_error());
        }
        if first < 0 {
            first = copy;
        }
        last = copy;
    }
    Ok((first, last))
}
