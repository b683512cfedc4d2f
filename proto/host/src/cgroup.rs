//! Starting a process inside a cgroup v2.
//!
//! The child moves itself between `fork` and `exec` (writing `0`, "this process", to the
//! cgroup's `cgroup.procs`), so it never runs a single instruction of the new program outside
//! the cgroup: a quota bound to the cgroup sees the program's first GPU call. Only
//! async-signal-safe calls (`open`, `write`, `close`) happen in the child.

use std::{
    ffi::{CStr, CString},
    io,
    os::unix::process::CommandExt as _,
    path::Path,
};

/// The NUL-terminated path of `dir`'s `cgroup.procs`, made before `fork` (the child may not
/// allocate).
///
/// # Errors
/// The path holds a NUL byte.
pub fn procs_file(dir: &Path) -> io::Result<CString> {
    CString::new(
        dir.join("cgroup.procs")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

/// Moves the calling process into the cgroup whose `cgroup.procs` is `procs`. Safe to call
/// between `fork` and `exec`: it only opens, writes and closes.
///
/// # Errors
/// The file can't be opened or written (no such cgroup, no permission, a frozen or
/// threaded cgroup that refuses processes).
pub fn join(procs: &CStr) -> io::Result<()> {
    // SAFETY: `procs` is a valid NUL-terminated path.
    let fd = unsafe { libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is open and the buffer is one valid byte.
    let written = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
    let result = if written == 1 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    };
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    result
}

/// Makes `command` start its process inside the cgroup directory `dir`.
///
/// # Errors
/// `dir`'s path holds a NUL byte. A cgroup that refuses the child makes `spawn` fail with that
/// error.
pub fn spawn_inside(command: &mut std::process::Command, dir: &Path) -> io::Result<()> {
    let procs = procs_file(dir)?;
    // SAFETY: `join` makes only async-signal-safe calls and allocates nothing.
    unsafe {
        command.pre_exec(move || join(&procs));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_procs_file_is_inside_the_directory() {
        let path = procs_file(Path::new("/sys/fs/cgroup/a b")).expect("no NUL");
        assert_eq!(path.to_bytes(), b"/sys/fs/cgroup/a b/cgroup.procs");
    }

    #[test]
    fn joining_a_missing_cgroup_names_the_os_error() {
        let err = join(c"/nonexistent/gpuwarden-test/cgroup.procs").expect_err("no such file");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn a_child_that_cannot_join_is_not_started() {
        let mut command = std::process::Command::new("true");
        spawn_inside(&mut command, Path::new("/nonexistent/gpuwarden-test")).expect("no NUL");
        let err = command.spawn().expect_err("the cgroup does not exist");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
    }
}
