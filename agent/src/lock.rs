//! The agent's state directory: private, and one agent per node.
//!
//! The directory holds every owner, target and pod UID the node enforces (the sled store), so
//! it is the agent's alone: made 0700 and everything in it 0700 (folders) or 0600 (files) at
//! each start, whatever the umask made them (issue 33: under umask 022 `store/` was 0755 and
//! its `db` 0644, readable by any local user, undoing the 0600 socket). A directory another
//! user owns is refused: that user could swap what is in it (`gpuwarden_runtime::private`).
//! Then an exclusive `flock` on `<state dir>/agent.lock` keeps a second agent out.

use std::{
    fs::File,
    io::{Read, Seek, Write},
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt as _},
    path::{Path, PathBuf},
};

pub use gpuwarden_runtime::private::{PrivateDirError, make_private};

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
    /// The state directory can't be made private (another user owns it, or it can't be
    /// changed).
    #[error(transparent)]
    Private(#[from] PrivateDirError),
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
    /// Makes `state_dir` private ([`make_private`]) and takes the lock in it.
    ///
    /// # Errors
    /// Another agent holds it, the directory belongs to another user, or a file can't be used.
    pub fn acquire(state_dir: &Path) -> Result<Self, LockError> {
        make_private(state_dir)?;
        let path = state_dir.join("agent.lock");
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
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
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn the_state_directory_and_what_it_holds_are_made_private() {
        let scratch = gpuwarden_test_support::scratch("private");
        let dir = scratch.path().join("state");
        let store = dir.join("store");
        std::fs::create_dir_all(store.join("blobs")).unwrap();
        std::fs::write(store.join("db"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("link")).unwrap();
        for (path, mode) in [(&dir, 0o755), (&store, 0o775), (&store.join("db"), 0o644)] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let passwd = mode(Path::new("/etc/passwd"));
        let lock = InstanceLock::acquire(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&store), 0o700);
        assert_eq!(mode(&store.join("blobs")), 0o700);
        assert_eq!(mode(&store.join("db")), 0o600);
        assert_eq!(mode(&dir.join("agent.lock")), 0o600);
        // A link is not followed.
        assert_eq!(mode(Path::new("/etc/passwd")), passwd);
        drop(lock);
        // Private already: nothing to fix.
        assert_eq!(make_private(&dir).unwrap(), 0);
    }

    #[test]
    #[ignore = "needs root"]
    fn a_state_directory_of_another_user_is_refused() {
        gpuwarden_test_support::require_root();
        let scratch = gpuwarden_test_support::scratch("foreign");
        let dir = scratch.path().join("state");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(65_534), None).unwrap();
        let err = InstanceLock::acquire(&dir).unwrap_err();
        assert!(
            matches!(
                err,
                LockError::Private(PrivateDirError::ForeignOwner { owner: 65_534, .. })
            ),
            "{err}"
        );
    }

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
