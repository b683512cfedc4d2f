//! One agent per node: an exclusive `flock` on `<state dir>/agent.lock`.

use std::{
    fs::File,
    io::{Read, Seek, Write},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

/// Errors taking the lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another agent holds it.
    #[error(
        "another gpuwarden-agent is already running on this node (pid {pid}, lock {path}); \
         stop it first, or give this one its own --state-dir"
    )]
    Held {
        /// The holder's pid, as it wrote it.
        pid: String,
        /// The lock file.
        path: PathBuf,
    },
    /// The lock file can't be opened or written.
    #[error("cannot use lock file {path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The held lock; released when dropped (or when the process dies, however it dies).
#[derive(Debug)]
pub struct InstanceLock {
    _file: File,
}

impl InstanceLock {
    /// Takes the lock in `state_dir`, creating the directory.
    ///
    /// # Errors
    /// Another agent holds it, or the file can't be used.
    pub fn acquire(state_dir: &Path) -> Result<Self, LockError> {
        let path = state_dir.join("agent.lock");
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(state_dir).map_err(io)?;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        // SAFETY: a plain syscall on an fd we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                return Err(LockError::Held {
                    pid: pid.trim().to_owned(),
                    path,
                });
            }
            return Err(io(err));
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_is_refused_with_the_first_pid() {
        let scratch = gpuwarden_test_support::scratch("lock");
        let dir = scratch.path().join("state");
        let first = InstanceLock::acquire(&dir).unwrap();
        let err = InstanceLock::acquire(&dir).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&std::process::id().to_string()), "{msg}");
        assert!(msg.contains("already running"), "{msg}");
        drop(first);
        InstanceLock::acquire(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
