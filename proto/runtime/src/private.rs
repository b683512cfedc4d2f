//! Private state directories: what a daemon stores (owners, targets, pod UIDs) is its own.
//!
//! [`make_private`] creates a directory owner-only, refuses one another user owns (that user
//! could swap what is in it), and takes group and other permissions off it and everything
//! below it, whatever the umask made them (issue 33: under umask 022 the agent's `store/` was
//! 0755 and its `db` 0644). The agent runs it on its `--state-dir`, the controller on its sled
//! store.

use std::{
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

/// Why a state directory can't be made private.
#[derive(Debug, thiserror::Error)]
pub enum PrivateDirError {
    /// The directory belongs to another user.
    #[error(
        "state directory {path} belongs to uid {owner}, not to this process's uid {uid}: \
         another user could change what is stored there; use a directory of its own"
    )]
    ForeignOwner {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// This process's effective uid.
        uid: u32,
    },
    /// A file or folder can't be read or changed.
    #[error("cannot make {path} private: {source}")]
    Io {
        /// What could not be read or changed.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Creates `dir` (0700) when it is not there, refuses one another user owns, and makes it and
/// everything below it private: 0700 folders, 0600 files (owner bits kept, group and other
/// bits taken off). Links are not followed; sockets and fifos keep their modes (a daemon sets
/// its socket's itself). Returns how many entries had to be fixed, which it logs.
///
/// # Errors
/// The directory belongs to another user, or something can't be read or changed.
pub fn make_private(dir: &Path) -> Result<usize, PrivateDirError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| PrivateDirError::Io { path, source }
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))?;
    let meta = std::fs::metadata(dir).map_err(io(dir))?;
    // SAFETY: a plain syscall without arguments.
    let uid = unsafe { libc::geteuid() };
    if meta.uid() != uid {
        return Err(PrivateDirError::ForeignOwner {
            path: dir.to_owned(),
            owner: meta.uid(),
            uid,
        });
    }
    let mut fixed = 0;
    let mut todo = vec![dir.to_owned()];
    while let Some(path) = todo.pop() {
        let meta = std::fs::symlink_metadata(&path).map_err(io(&path))?;
        let kind = meta.file_type();
        if kind.is_dir() {
            for entry in std::fs::read_dir(&path).map_err(io(&path))? {
                todo.push(entry.map_err(io(&path))?.path());
            }
        } else if !kind.is_file() {
            continue;
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o700))
                .map_err(io(&path))?;
            fixed += 1;
        }
    }
    if fixed > 0 {
        tracing::warn!(
            dir = %dir.display(),
            fixed,
            "the state directory was readable by others: made private (0700 folders, 0600 files)"
        );
    }
    Ok(fixed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_and_what_it_holds_are_made_private() {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("state");
        let store = dir.join("store");
        std::fs::create_dir_all(store.join("blobs")).unwrap();
        std::fs::write(store.join("db"), "x").unwrap();
        let outside = scratch.path().join("outside");
        std::fs::write(&outside, "not ours to change").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
        for (path, mode) in [(&dir, 0o755), (&store, 0o775), (&store.join("db"), 0o644)] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        // The two folders set loose, the one the umask made, the file.
        assert_eq!(make_private(&dir).unwrap(), 4);
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&store), 0o700);
        assert_eq!(mode(&store.join("blobs")), 0o700);
        assert_eq!(mode(&store.join("db")), 0o600);
        // A link is not followed.
        assert_eq!(mode(&outside), 0o644);
        // Private already: nothing to fix.
        assert_eq!(make_private(&dir).unwrap(), 0);
        // A new one is made private.
        let new = scratch.path().join("new/state");
        make_private(&new).unwrap();
        assert_eq!(mode(&new), 0o700);
    }
}
