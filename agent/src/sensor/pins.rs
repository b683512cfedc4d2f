//! Pinning under bpffs, so that enforcement outlives the agent (docs/architecture.md, "The agent is the source of truth for its node").
//!
//! Layout under the pin directory (default `/sys/fs/bpf/gpuwarden`):
//!
//! - `object-ID/`: which build of the programs the pins belong to; a different build starts over;
//! - `maps/NAME`: every map, so a restarted agent keeps the counters and quotas;
//! - `links/PROGRAM`: the tracepoint (and LSM) links, adopted as they are by a restarted agent;
//! - `devices/CGROUP_ID`: the device-access link of each bound cgroup.
//!
//! Removing the directory (`gpuwarden-agent unpin`) detaches everything.

use std::{
    ffi::CString,
    os::{
        fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Path, PathBuf},
};

/// Default pin directory.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/gpuwarden";

/// `BPF_FS_MAGIC` from `statfs`.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Errors pinning.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// bpffs is not mounted where the pins go and could not be mounted.
    #[error("cannot mount bpffs at {path}: {source}")]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A pin or directory could not be made or removed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The pin directory of one agent.
#[derive(Debug, Clone)]
pub struct Pins {
    dir: PathBuf,
}

impl Pins {
    /// Opens `dir` for the object whose identity is `object_id`, mounting bpffs at
    /// `/sys/fs/bpf` if needed. Pins of another build are removed first (that detaches their
    /// programs: enforcement has a gap while the new ones attach, as on an upgrade).
    ///
    /// Returns the pins and whether state from an earlier agent was found.
    ///
    /// # Errors
    /// bpffs can't be mounted or the directory can't be made.
    pub fn open(dir: &Path, object_id: &str) -> Result<(Self, bool), PinError> {
        ensure_bpffs(dir)?;
        // bpffs holds only pins and directories: the build is named by a marker directory.
        let marker = dir.join(format!("object-{object_id}"));
        let adopted = marker.is_dir();
        let others: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.starts_with("object-") && !adopted)
            .collect();
        if !others.is_empty() {
            tracing::warn!(
                dir = %dir.display(),
                pinned = others.join(","),
                now = object_id,
                "pinned programs are from another build: replacing them"
            );
            remove(dir)?;
        }
        for sub in ["maps", "links", "devices", &format!("object-{object_id}")] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(|source| PinError::Io {
                what: "cannot make",
                path,
                source,
            })?;
        }
        Ok((
            Self {
                dir: dir.to_owned(),
            },
            adopted,
        ))
    }

    /// The directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where map `name` is pinned.
    #[must_use]
    pub fn map(&self, name: &str) -> PathBuf {
        self.dir.join("maps").join(name)
    }

    /// Where the link of program `name` is pinned.
    #[must_use]
    pub fn link(&self, name: &str) -> PathBuf {
        self.dir.join("links").join(name)
    }

    /// Where the device-access link of cgroup `id` is pinned.
    #[must_use]
    pub fn device_link(&self, cgroup: u64) -> PathBuf {
        self.dir.join("devices").join(cgroup.to_string())
    }
}

/// Removes a pin directory and everything in it (detaching what only the pins held).
///
/// # Errors
/// A pin could not be removed.
pub fn remove(dir: &Path) -> Result<(), PinError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(PinError::Io {
            what: "cannot remove",
            path: dir.to_owned(),
            source,
        }),
    }
}

/// Mounts bpffs at `/sys/fs/bpf` when `dir` is under it and it is not mounted.
fn ensure_bpffs(dir: &Path) -> Result<(), PinError> {
    let mount_point = Path::new("/sys/fs/bpf");
    if !dir.starts_with(mount_point) || is_bpffs(mount_point) {
        return Ok(());
    }
    let target = c_path(mount_point);
    let fstype = c"bpf";
    // SAFETY: valid C strings; a plain syscall.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(PinError::Mount {
            path: mount_point.to_owned(),
            source: std::io::Error::last_os_error(),
        });
    }
    tracing::info!("mounted bpffs at /sys/fs/bpf");
    Ok(())
}

fn is_bpffs(path: &Path) -> bool {
    let c = c_path(path);
    // SAFETY: an all-zero statfs is valid; the pointer is valid for the call.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::statfs(c.as_ptr(), &raw mut st) };
    let magic = st.f_type as i64;
    rc == 0 && magic == BPF_FS_MAGIC
}

fn c_path(path: &Path) -> CString {
    // Paths made here have no NUL bytes; a bad one yields an empty string the kernel refuses.
    CString::new(path.as_os_str().as_bytes()).unwrap_or_default()
}

/// `bpf(2)` commands and attach type used here (aya 0.14 has no pinnable cgroup-device link).
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_CGROUP_DEVICE: u32 = 6;

/// The leading fields of `union bpf_attr` for `BPF_LINK_CREATE`, padded with zeros (the kernel
/// requires the unused tail to be zero).
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    _tail: [u64; 6],
}

/// The leading fields of `union bpf_attr` for `BPF_OBJ_PIN`/`BPF_OBJ_GET`.
#[repr(C)]
#[derive(Default)]
struct ObjAttr {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
    path_fd: i32,
    _pad: u32,
    _tail: [u64; 4],
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<i64> {
    // SAFETY: `attr` is a valid, zero-padded `bpf_attr` prefix of the size given.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr).cast::<libc::c_void>(),
            size_of::<T>(),
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Attaches the cgroup-device program `program` to the cgroup open as `cgroup` through a BPF
/// link; cgroup links always combine with the programs already there (the runtime's own device
/// program stays in force).
///
/// # Errors
/// The kernel refused.
pub fn attach_cgroup_device(
    program: BorrowedFd<'_>,
    cgroup: BorrowedFd<'_>,
) -> std::io::Result<OwnedFd> {
    let mut attr = LinkCreateAttr {
        prog_fd: u32::try_from(program.as_raw_fd()).unwrap_or_default(),
        target_fd: u32::try_from(cgroup.as_raw_fd()).unwrap_or_default(),
        attach_type: BPF_CGROUP_DEVICE,
        ..LinkCreateAttr::default()
    };
    let fd = bpf(BPF_LINK_CREATE, &mut attr)?;
    let fd = i32::try_from(fd).map_err(|_| std::io::Error::other("fd out of range"))?;
    // SAFETY: the kernel returned a new fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Pins the BPF object `fd` at `path`.
///
/// # Errors
/// The kernel refused (e.g. `path` is not on bpffs, or exists).
pub fn pin(fd: BorrowedFd<'_>, path: &Path) -> std::io::Result<()> {
    let c = c_path(path);
    let mut attr = ObjAttr {
        pathname: c.as_ptr() as u64,
        bpf_fd: u32::try_from(fd.as_raw_fd()).unwrap_or_default(),
        ..ObjAttr::default()
    };
    bpf(BPF_OBJ_PIN, &mut attr).map(|_| ())
}

/// Whether a live BPF object is pinned at `path`.
#[must_use]
pub fn is_pinned(path: &Path) -> bool {
    let c = c_path(path);
    let mut attr = ObjAttr {
        pathname: c.as_ptr() as u64,
        ..ObjAttr::default()
    };
    match bpf(BPF_OBJ_GET, &mut attr) {
        Ok(fd) => {
            // SAFETY: the kernel returned a new fd we own; dropping closes it.
            #[expect(
                clippy::cast_possible_truncation,
                reason = "An fd from the kernel fits an int"
            )]
            drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
            true
        }
        Err(_) => false,
    }
}
