//! A synthetic GPU client: the ioctls a CUDA process issues, with the real encodings and layouts.
//!
//! [`GpuClient`] opens `nvidiactl`, `nvidia-uvm` and a GPU node in a directory (the fake driver's
//! mount point, or `/dev`) and issues the RM and UVM calls through `ioctl(2)` on those fds:
//! the same bytes libcuda sends, so the agent's eBPF programs can't tell it from a real process.
//!
//! The `gpu-client` binary wraps it in a line protocol ([`script`]) so a test can step a process
//! that lives inside a cgroup; [`ScriptedClient`] drives that binary from a test.
//!
//! # The `gpu-client` command language
//!
//! `gpu-client --dir DIR [--gpu N]` opens `DIR/nvidiactl`, `DIR/nvidia-uvm` and `DIR/nvidiaN`,
//! prints `ready pid=<pid>`, then answers every line on stdin with exactly one line, flushed,
//! starting `ok` or `err` (`exit` alone answers nothing: the process ends). Numbers are decimal
//! or `0x` hex; sizes take a `k`/`m`/`g` suffix (binary units); handles are printed in hex.
//!
//! | command | reply |
//! |---|---|
//! | `client` | `ok client=0x…` (`NV01_ROOT_CLIENT`) |
//! | `device <client> <id>` | `ok handle=0x…` (`NV01_DEVICE_0`, `deviceId` = id) |
//! | `device-many <client> <id> <count>` | `ok made=<count> last=0x…`: `count` device objects on GPU `id` (the first failure answers its error and `made=<n>`) |
//! | `subdevice <client> <device>` | `ok handle=0x…` (`NV20_SUBDEVICE_0`) |
//! | `partition <client> <subdevice> <gpu-instance> <cap-fd>` | `ok handle=0x…` (`AMPERE_SMC_PARTITION_REF`: subscribes to a MIG GPU instance, `capDescriptor` = the fd of its capability node from `open`) |
//! | `exec-partition <client> <partition> <compute-instance>` | `ok handle=0x…` (`AMPERE_SMC_EXEC_PARTITION_REF`) |
//! | `alloc <client> <parent> <size> [nvos21\|nvos64] [v120\|v128] [xfer]` | `ok handle=0x… size=<bytes the driver wrote back>` (video memory; default `nvos21 v128`, `xfer` wraps it in `IOCTL_XFER_CMD`) |
//! | `sysmem <client> <parent> <size>` | `ok handle=0x…` (`NV01_MEMORY_SYSTEM`) |
//! | `allocmem <client> <parent> <handle> <size> [system\|osdesc\|local]` | `ok handle=0x… limit=0x…` (`RM_ALLOC_MEMORY` on the GPU node: `NV01_MEMORY_SYSTEM`, `NV01_MEMORY_SYSTEM_OS_DESCRIPTOR` over a buffer of the client's, or a `NV01_MEMORY_LOCAL_USER` framebuffer view) |
//! | `vidheap <client> <parent> <size> [vidmem\|sysmem\|virtual]` | `ok handle=0x… size=<bytes written back>` (`RM_VID_HEAP_CONTROL` `ALLOC_SIZE`) |
//! | `vidheap-free <client> <parent> <handle>` | `ok` (`RM_VID_HEAP_CONTROL` `FREE`) |
//! | `virtual <client> <parent> <size>` | `ok handle=0x…` (`NV50_MEMORY_VIRTUAL`, a VA reservation) |
//! | `free <client> <parent> <handle> [xfer]` | `ok` (`handle` = `client` frees the client) |
//! | `control <client> <object> <cmd>` | `ok` (`RM_CONTROL` without params) |
//! | `gpu-ids <client>` | `ok ids=0x100,0x200` (`NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS`) |
//! | `register-fd` | `ok` (`REGISTER_FD` of the control fd on the GPU node, as libcuda does) |
//! | `uvm init` | `ok` (`UVM_INITIALIZE`) |
//! | `uvm range <base> <length>` | `ok` (`UVM_CREATE_EXTERNAL_RANGE`) |
//! | `uvm map <base> <length> <client> <memory>` | `ok` (`UVM_MAP_EXTERNAL_ALLOCATION`) |
//! | `uvm free <base> [<length>]` | `ok` (`UVM_FREE`) |
//! | `uvm mmap <length>` | `ok addr=0x…`: managed memory as `cudaMallocManaged` maps it (an anonymous reservation, then the UVM fd mapped over it) |
//! | `uvm mmap-many <count> <length>` | `ok made=<count>`: `count` managed mappings as `uvm mmap` makes them, left in place (the first failure answers its error and `made=<n>`) |
//! | `uvm munmap <addr> <length>` | `ok` |
//! | `uvm <number>` | `ok ret=<n>` (that command with 16 KiB of zeroes) |
//! | `open <path> [openat\|open\|creat\|uring]` | `ok fd=<n>`: holds the file open; a bare name is a file in `DIR`; the word picks the call ([`obtain::OpenHow`]: default `openat`) |
//! | `fd-socket <path>` | `ok fd=<n>`: a datagram socket bound at `path`, for `recv-fd` |
//! | `send-fd <path> <fd>` | `ok`: the fd over `SCM_RIGHTS` to the socket bound at `path` |
//! | `recv-fd <socket>` | `ok fd=<n>`: the fd a `send-fd` sent, held |
//! | `getfd <pid> <fd>` | `ok fd=<n>`: a copy of process `pid`'s fd (`pidfd_getfd`), held |
//! | `dup-many <fd> <count>` | `ok first=<n> last=<n>`: `count` copies, left open, not held (fd limits raised as needed) |
//! | `dup [<fd>]` | `ok fd=<n>`: the copy takes over the fd's role, so after `dup` (of `ctl`) RM calls go through the copy |
//! | `close <fd>` | `ok` |
//! | `map <fd> <length>` | `ok addr=0x…`: a shared mapping of the fd, left in place (as libcuda maps memory through a node) |
//! | `close-range <first> <last>` | `ok`: `close_range(2)` of every fd in the range |
//! | `use-ctl <fd>` | `ok`: RM calls go through `fd` (a node opened with `open`) from now on |
//! | `dup-to <fd> <min>` | `ok fd=<n>`: `F_DUPFD_CLOEXEC` at or above `min` (the fd limit raised if needed); the copy takes over the fd's role |
//! | `ioctl-raw <path\|fd> <cmd>` | `ok ret=<n>` or `ok ret=-1 errno=<e>`: any ioctl, with 16 KiB of zeroes, on any file (`/dev/null`, a regular file, …); a bare word is an fd |
//! | `thread <command…>` | the command's reply, run on a new thread |
//! | `fork` | `ok pid=<n>`: a child sharing every fd, driven with `child …` |
//! | `child <command…>` | `child: <the child's reply>` |
//! | `wait-child` (or `child exit`) | `ok status=<exit status>`: the child exits, freeing nothing |
//! | `kill-child` | `ok`: SIGKILL, then reaped |
//! | `sleep <ms>` | `ok` |
//! | `pid` | `ok pid=<n>` |
//! | `exec` | none from this image: the process execs a fresh `gpu-client` with the same arguments (the fds it held close, being close-on-exec), which prints `ready pid=<n>` |
//! | `exit` | none: exits 0 without freeing anything (the kernel closes the fds) |
//!
//! An fd is `ctl`, `uvm`, `gpu` (the node opened at start) or a number from `open`/`dup`. An RM
//! failure answers `err status=0x…`, a failed system call `err errno=<n> <text>`, a line that
//! doesn't parse `err <why>`.

pub mod obtain;
pub mod script;
mod scripted;

use std::{
    collections::BTreeMap,
    ffi::CString,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    path::{Path, PathBuf},
};

use crate::abi::nvidia::{
    class, device_alloc, esc, ioctl_cmd, memory_alloc, nvos00, nvos02, nvos21, nvos32, nvos54,
    nvos64, smc_exec_partition, smc_partition, status, uvm, xfer,
};

pub use self::scripted::{ScriptError, ScriptedClient};
use crate::{
    abi::{ctrl, uvm_params},
    bytes::{set_u32, set_u64, u32_at, u64_at},
};

/// An RM or UVM call that failed.
#[derive(Debug, thiserror::Error)]
pub enum RmError {
    /// `ioctl(2)` itself failed (a malformed call, a closed fd, a bad pointer).
    #[error("ioctl {cmd:#x} failed: {source}")]
    Ioctl {
        /// The command.
        cmd: u32,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// The driver answered a non-zero `status` (or UVM `rmStatus`).
    #[error("the driver answered status {status:#x}")]
    Status {
        /// The `NV_STATUS`.
        status: u32,
    },
}

impl RmError {
    /// The driver's status, when that is what failed.
    #[must_use]
    pub fn status(&self) -> Option<u32> {
        match self {
            Self::Status { status } => Some(*status),
            Self::Ioctl { .. } => None,
        }
    }
}

/// A failure with the client's files.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A file can't be opened.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The fd isn't one the client holds.
    #[error("fd {fd} is not open")]
    NotOpen {
        /// The fd.
        fd: RawFd,
    },
    /// `dup` failed.
    #[error("cannot dup fd {fd}: {source}")]
    Dup {
        /// The fd.
        fd: RawFd,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The parameter struct of `RM_ALLOC`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Form {
    /// `NVOS21_PARAMETERS` (32 bytes).
    #[default]
    Nvos21,
    /// `NVOS64_PARAMETERS` (48 bytes).
    Nvos64,
}

/// The size of `NV_MEMORY_ALLOCATION_PARAMS`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ParamsLayout {
    /// 120 bytes (drivers before 545.23.06).
    V120,
    /// 128 bytes (545.23.06 and later).
    #[default]
    V128,
}

impl ParamsLayout {
    /// The struct's size.
    #[must_use]
    pub const fn size(self) -> usize {
        match self {
            Self::V120 => memory_alloc::SIZE_OLD as usize,
            Self::V128 => memory_alloc::SIZE as usize,
        }
    }
}

/// How an RM escape reaches the driver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Via {
    /// Its own `_IOWR('F', nr, size)`.
    #[default]
    Direct,
    /// Wrapped in `IOCTL_XFER_CMD`, its params pointed to.
    Xfer,
}

/// An `RM_ALLOC` in full.
#[derive(Debug)]
pub struct RmAlloc<'a> {
    /// `hRoot`.
    pub client: u32,
    /// `hObjectParent`.
    pub parent: u32,
    /// `hObjectNew`: 0 lets the driver pick.
    pub handle: u32,
    /// `hClass`.
    pub class: u32,
    /// What `pAllocParms` points to (null and `paramsSize` 0 when empty); the driver may write
    /// into it.
    pub params: &'a mut [u8],
    /// NVOS21 or NVOS64.
    pub form: Form,
    /// Direct or through `IOCTL_XFER_CMD`.
    pub via: Via,
}

/// An `RM_ALLOC_MEMORY` (`NVOS02_PARAMETERS`).
#[derive(Debug, Clone, Copy)]
pub struct AllocMemory {
    /// `hRoot`.
    pub client: u32,
    /// `hObjectParent`.
    pub parent: u32,
    /// `hObjectNew` (the caller chooses it).
    pub handle: u32,
    /// `hClass`.
    pub class: u32,
    /// `flags` (`NVOS02_FLAGS_*`).
    pub flags: u32,
    /// `pMemory`: the user memory an OS descriptor wraps.
    pub memory: u64,
    /// `limit + 1`.
    pub bytes: u64,
}

/// An fd the client holds, and which open file it refers to.
#[derive(Debug)]
struct Held {
    fd: OwnedFd,
    /// Fds from `dup` share their original's file.
    file: usize,
    /// Later fds of a file take over its role.
    order: u64,
}

/// Open GPU device files and the calls a CUDA process makes on them.
#[derive(Debug)]
pub struct GpuClient {
    dir: PathBuf,
    fds: BTreeMap<RawFd, Held>,
    files: usize,
    order: u64,
    ctl: usize,
    uvm: usize,
    gpus: BTreeMap<u32, usize>,
    /// The GPU opened at start.
    gpu: u32,
}

/// Opens `path` read-write and close-on-exec, as libcuda does.
///
/// # Errors
/// The open fails.
pub fn open_rw(path: &Path) -> Result<OwnedFd, ClientError> {
    let err = |source| ClientError::Open {
        path: path.to_owned(),
        source,
    };
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| err(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
    // SAFETY: a valid C string.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(err(io::Error::last_os_error()));
    }
    // SAFETY: a fresh fd nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Issues `ioctl(fd, cmd, params)` and returns what it returned.
///
/// # Errors
/// The ioctl returned -1, or `cmd` encodes more bytes than `params` holds (the kernel would
/// write past it).
pub fn ioctl_raw(fd: RawFd, cmd: u32, params: &mut [u8]) -> io::Result<i32> {
    let encoded = (cmd >> 16) & 0x3fff;
    if cmd >> 30 != 0 && encoded as usize > params.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "ioctl {cmd:#x} moves {encoded} bytes, the buffer has {}",
                params.len()
            ),
        ));
    }
    // SAFETY: the buffer is at least as large as the command says; for commands that don't say
    // (UVM's), callers pass a buffer as large as the params struct.
    let ret = unsafe { libc::ioctl(fd, libc::c_ulong::from(cmd), params.as_mut_ptr()) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

impl GpuClient {
    /// Opens `nvidiactl`, `nvidia-uvm` and `nvidia0` in `dir`.
    ///
    /// # Errors
    /// A file can't be opened.
    pub fn open(dir: &Path) -> Result<Self, ClientError> {
        Self::open_on(dir, 0)
    }

    /// Opens `nvidiactl`, `nvidia-uvm` and `nvidia<gpu>` in `dir`.
    ///
    /// # Errors
    /// A file can't be opened.
    pub fn open_on(dir: &Path, gpu: u32) -> Result<Self, ClientError> {
        let mut client = Self {
            dir: dir.to_owned(),
            fds: BTreeMap::new(),
            files: 0,
            order: 0,
            ctl: 0,
            uvm: 0,
            gpus: BTreeMap::new(),
            gpu,
        };
        client.ctl = client.hold(open_rw(&dir.join("nvidiactl"))?, None);
        client.uvm = client.hold(open_rw(&dir.join("nvidia-uvm"))?, None);
        client.open_gpu(gpu)?;
        Ok(client)
    }

    /// The GPU whose node was opened at start.
    #[must_use]
    pub fn gpu(&self) -> u32 {
        self.gpu
    }

    /// The directory the files were opened in.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Keeps `fd`, as a new open file or as another fd of `file`; returns its file.
    fn hold(&mut self, fd: OwnedFd, file: Option<usize>) -> usize {
        let file = file.unwrap_or_else(|| {
            self.files += 1;
            self.files
        });
        self.order += 1;
        self.fds.insert(
            fd.as_raw_fd(),
            Held {
                fd,
                file,
                order: self.order,
            },
        );
        file
    }

    /// The newest fd still open on `file`.
    fn fd_of(&self, file: usize) -> Option<RawFd> {
        self.fds
            .iter()
            .filter(|(_, h)| h.file == file)
            .max_by_key(|(_, h)| h.order)
            .map(|(&fd, _)| fd)
    }

    /// The fd RM calls go through: the newest fd of the `nvidiactl` open file.
    #[must_use]
    pub fn ctl_fd(&self) -> Option<RawFd> {
        self.fd_of(self.ctl)
    }

    /// The fd UVM calls go through.
    #[must_use]
    pub fn uvm_fd(&self) -> Option<RawFd> {
        self.fd_of(self.uvm)
    }

    /// The fd of GPU node `nvidia<gpu>`, when open.
    #[must_use]
    pub fn gpu_fd(&self, gpu: u32) -> Option<RawFd> {
        self.gpus.get(&gpu).and_then(|&f| self.fd_of(f))
    }

    /// Every fd held.
    #[must_use]
    pub fn fds(&self) -> Vec<RawFd> {
        self.fds.keys().copied().collect()
    }

    /// Opens `nvidia<gpu>` (again, if it is open: the newest is used).
    ///
    /// # Errors
    /// It can't be opened.
    pub fn open_gpu(&mut self, gpu: u32) -> Result<RawFd, ClientError> {
        let fd = open_rw(&self.dir.join(format!("nvidia{gpu}")))?;
        let raw = fd.as_raw_fd();
        let file = self.hold(fd, None);
        self.gpus.insert(gpu, file);
        Ok(raw)
    }

    /// Opens any file read-write and holds it until [`close`](Self::close).
    ///
    /// # Errors
    /// It can't be opened.
    pub fn open_file(&mut self, path: &Path) -> Result<RawFd, ClientError> {
        let fd = open_rw(path)?;
        let raw = fd.as_raw_fd();
        self.hold(fd, None);
        Ok(raw)
    }

    /// Holds `fd`, obtained some other way (received, taken from another process), as a new open
    /// file; returns its number.
    pub fn adopt(&mut self, fd: OwnedFd) -> RawFd {
        let raw = fd.as_raw_fd();
        self.hold(fd, None);
        raw
    }

    /// Duplicates `fd`; the copy refers to the same open file and, being the newest, takes over
    /// its role (RM calls go through a copy of the control fd).
    ///
    /// # Errors
    /// `fd` isn't held, or `dup` failed.
    pub fn dup(&mut self, fd: RawFd) -> Result<RawFd, ClientError> {
        let held = self.fds.get(&fd).ok_or(ClientError::NotOpen { fd })?;
        let copy = held
            .fd
            .try_clone()
            .map_err(|source| ClientError::Dup { fd, source })?;
        let file = held.file;
        let raw = copy.as_raw_fd();
        self.hold(copy, Some(file));
        Ok(raw)
    }

    /// Makes held fd `fd` (say, a node reopened through another path) the control fd: RM calls
    /// go through it from now on.
    ///
    /// # Errors
    /// `fd` isn't held.
    pub fn use_as_ctl(&mut self, fd: RawFd) -> Result<(), ClientError> {
        let held = self.fds.get(&fd).ok_or(ClientError::NotOpen { fd })?;
        self.ctl = held.file;
        self.order += 1;
        if let Some(h) = self.fds.get_mut(&fd) {
            h.order = self.order;
        }
        Ok(())
    }

    /// Duplicates `fd` onto the lowest free number at or above `min` (`fcntl(F_DUPFD_CLOEXEC)`),
    /// raising the soft fd limit when `min` is past it; the copy takes over the fd's role.
    ///
    /// # Errors
    /// `fd` isn't held, or the limit or the copy failed.
    pub fn dup_at_least(&mut self, fd: RawFd, min: RawFd) -> Result<RawFd, ClientError> {
        let held = self.fds.get(&fd).ok_or(ClientError::NotOpen { fd })?;
        let file = held.file;
        let err = |source| ClientError::Dup { fd, source };
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid pointer to an rlimit.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } != 0 {
            return Err(err(io::Error::last_os_error()));
        }
        let wanted = libc::rlim_t::try_from(min).unwrap_or(0) + 1;
        if limit.rlim_cur < wanted {
            limit.rlim_cur = wanted.max(limit.rlim_cur);
            limit.rlim_max = limit.rlim_max.max(wanted);
            // SAFETY: as above.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) } != 0 {
                return Err(err(io::Error::last_os_error()));
            }
        }
        // SAFETY: a plain fcntl on a held fd.
        let copy = unsafe { libc::fcntl(held.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) };
        if copy < 0 {
            return Err(err(io::Error::last_os_error()));
        }
        // SAFETY: a fresh fd nobody else owns.
        self.hold(unsafe { OwnedFd::from_raw_fd(copy) }, Some(file));
        Ok(copy)
    }

    /// `close_range(first, last, 0)`: closes every fd in the range at once, held or not (the
    /// held ones are forgotten, not closed again).
    ///
    /// # Errors
    /// The call failed.
    pub fn close_range(&mut self, first: u32, last: u32) -> io::Result<()> {
        let fds: Vec<RawFd> = self
            .fds
            .keys()
            .copied()
            .filter(|&fd| u32::try_from(fd).is_ok_and(|n| (first..=last).contains(&n)))
            .collect();
        // SAFETY: a plain system call; the kernel checks the range.
        let ret = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
        if ret != 0 {
            return Err(io::Error::last_os_error());
        }
        for fd in fds {
            if let Some(held) = self.fds.remove(&fd) {
                // Already closed by the kernel.
                std::mem::forget(held.fd);
            }
        }
        Ok(())
    }

    /// Closes `fd`. The driver frees what was allocated through its open file once the last fd
    /// of that file, in this process and in any that inherited it, is closed.
    ///
    /// # Errors
    /// `fd` isn't held.
    pub fn close(&mut self, fd: RawFd) -> Result<(), ClientError> {
        self.fds
            .remove(&fd)
            .map(drop)
            .ok_or(ClientError::NotOpen { fd })
    }

    fn rm_fd(&self) -> RawFd {
        // -1 makes the ioctl fail with EBADF, as it would in a process that closed the fd.
        self.ctl_fd().unwrap_or(-1)
    }

    /// Issues RM escape `nr` with `params` on the control fd, directly or through
    /// `IOCTL_XFER_CMD`.
    fn rm(&self, nr: u32, params: &mut [u8], via: Via) -> Result<(), RmError> {
        let size = u32::try_from(params.len()).unwrap_or(u32::MAX);
        let (cmd, result) = match via {
            Via::Direct => {
                let cmd = ioctl_cmd(nr, size);
                (cmd, ioctl_raw(self.rm_fd(), cmd, params))
            }
            Via::Xfer => {
                let cmd = ioctl_cmd(esc::IOCTL_XFER_CMD, xfer::SIZE);
                let mut outer = [0u8; xfer::SIZE as usize];
                set_u32(&mut outer, xfer::CMD, nr);
                set_u32(&mut outer, xfer::PARAMS_SIZE, size);
                set_u64(&mut outer, xfer::PTR, params.as_mut_ptr() as u64);
                (cmd, ioctl_raw(self.rm_fd(), cmd, &mut outer))
            }
        };
        result
            .map(drop)
            .map_err(|source| RmError::Ioctl { cmd, source })
    }

    /// `RM_ALLOC` in full; returns the new object's handle.
    ///
    /// # Errors
    /// The ioctl failed or the driver answered a non-zero status.
    pub fn rm_alloc(&self, alloc: RmAlloc<'_>) -> Result<u32, RmError> {
        let RmAlloc {
            client,
            parent,
            handle,
            class,
            params,
            form,
            via,
        } = alloc;
        let (size, params_size_at, status_at) = match form {
            Form::Nvos21 => (nvos21::SIZE, nvos21::PARAMS_SIZE, nvos21::STATUS),
            Form::Nvos64 => (nvos64::SIZE, nvos64::PARAMS_SIZE, nvos64::STATUS),
        };
        let mut p = vec![0u8; size as usize];
        set_u32(&mut p, nvos21::H_ROOT, client);
        set_u32(&mut p, nvos21::H_OBJECT_PARENT, parent);
        set_u32(&mut p, nvos21::H_OBJECT_NEW, handle);
        set_u32(&mut p, nvos21::H_CLASS, class);
        if !params.is_empty() {
            set_u64(&mut p, nvos21::P_ALLOC_PARMS, params.as_mut_ptr() as u64);
            set_u32(
                &mut p,
                params_size_at,
                u32::try_from(params.len()).unwrap_or(u32::MAX),
            );
        }
        self.rm(esc::RM_ALLOC, &mut p, via)?;
        match u32_at(&p, status_at) {
            status::OK => Ok(u32_at(&p, nvos21::H_OBJECT_NEW)),
            status => Err(RmError::Status { status }),
        }
    }

    /// Allocates a driver-picked handle of `class` under `parent` with NVOS21, directly.
    fn alloc_simple(
        &self,
        client: u32,
        parent: u32,
        class: u32,
        params: &mut [u8],
    ) -> Result<u32, RmError> {
        self.rm_alloc(RmAlloc {
            client,
            parent,
            handle: 0,
            class,
            params,
            form: Form::Nvos21,
            via: Via::Direct,
        })
    }

    /// Creates a client (`NV01_ROOT_CLIENT`); returns its handle.
    ///
    /// # Errors
    /// The call failed.
    pub fn alloc_client(&self) -> Result<u32, RmError> {
        self.alloc_simple(0, 0, class::ROOT_CLIENT, &mut [])
    }

    /// Creates a device (`NV01_DEVICE_0`) for GPU `device_id` under `client`.
    ///
    /// # Errors
    /// The call failed (`NV_ERR_INVALID_ARGUMENT` for a GPU that doesn't exist).
    pub fn alloc_device(&self, client: u32, device_id: u32) -> Result<u32, RmError> {
        // NV0080_ALLOC_PARAMETERS: deviceId, hClientShare, hTargetClient, hTargetDevice, flags,
        // vaSpaceSize, vaStartInternal, vaLimitInternal, vaMode.
        let mut params = [0u8; 56];
        set_u32(&mut params, device_alloc::DEVICE_ID, device_id);
        self.alloc_simple(client, client, class::DEVICE_0, &mut params)
    }

    /// Creates subdevice 0 (`NV20_SUBDEVICE_0`) under `device`.
    ///
    /// # Errors
    /// The call failed.
    pub fn alloc_subdevice(&self, client: u32, device: u32) -> Result<u32, RmError> {
        // NV2080_ALLOC_PARAMETERS: subDeviceId.
        let mut params = [0u8; 4];
        self.alloc_simple(client, device, class::SUBDEVICE_0, &mut params)
    }

    /// Subscribes `client` to MIG GPU instance `gpu_instance` through `subdevice`
    /// (`AMPERE_SMC_PARTITION_REF`, its `capDescriptor` the fd `cap_fd` of the instance's
    /// capability node, as the user-mode shim fills it); returns the partition's handle.
    ///
    /// # Errors
    /// The call failed.
    pub fn alloc_partition(
        &self,
        client: u32,
        subdevice: u32,
        gpu_instance: u32,
        cap_fd: RawFd,
    ) -> Result<u32, RmError> {
        let mut params = [0u8; smc_partition::SIZE as usize];
        set_u64(
            &mut params,
            smc_partition::CAP_DESCRIPTOR,
            u64::try_from(cap_fd).unwrap_or(u64::MAX),
        );
        set_u32(&mut params, smc_partition::SWIZZ_ID, gpu_instance);
        self.alloc_simple(client, subdevice, class::SMC_PARTITION_REF, &mut params)
    }

    /// Subscribes to compute instance `compute_instance` under partition `partition`
    /// (`AMPERE_SMC_EXEC_PARTITION_REF`); returns its handle.
    ///
    /// # Errors
    /// The call failed.
    pub fn alloc_exec_partition(
        &self,
        client: u32,
        partition: u32,
        compute_instance: u32,
    ) -> Result<u32, RmError> {
        let mut params = [0u8; smc_exec_partition::SIZE as usize];
        set_u32(
            &mut params,
            smc_exec_partition::EXEC_PARTITION_ID,
            compute_instance,
        );
        self.alloc_simple(
            client,
            partition,
            class::SMC_EXEC_PARTITION_REF,
            &mut params,
        )
    }

    fn memory(
        &self,
        client: u32,
        parent: u32,
        class: u32,
        bytes: u64,
        flags: u32,
        (form, layout, via): (Form, ParamsLayout, Via),
    ) -> Result<(u32, u64), RmError> {
        let mut params = vec![0u8; layout.size()];
        set_u32(&mut params, memory_alloc::FLAGS, flags);
        set_u64(&mut params, memory_alloc::SIZE_FIELD, bytes);
        let handle = self.rm_alloc(RmAlloc {
            client,
            parent,
            handle: 0,
            class,
            params: &mut params,
            form,
            via,
        })?;
        Ok((handle, u64_at(&params, memory_alloc::SIZE_FIELD)))
    }

    /// Allocates `bytes` of video memory (`NV01_MEMORY_LOCAL_USER`) under `parent` (a device or
    /// subdevice); returns the handle and the size the driver wrote back.
    ///
    /// # Errors
    /// The call failed: `NV_ERR_NO_MEMORY` (0x51) past the GPU's memory.
    pub fn alloc_vidmem(
        &self,
        client: u32,
        parent: u32,
        bytes: u64,
        form: Form,
        layout: ParamsLayout,
    ) -> Result<(u32, u64), RmError> {
        let how = (form, layout, Via::Direct);
        self.memory(client, parent, class::MEMORY_LOCAL_USER, bytes, 0, how)
    }

    /// [`alloc_vidmem`](Self::alloc_vidmem) through `IOCTL_XFER_CMD`.
    ///
    /// # Errors
    /// The call failed.
    pub fn alloc_vidmem_xfer(
        &self,
        client: u32,
        parent: u32,
        bytes: u64,
        form: Form,
        layout: ParamsLayout,
    ) -> Result<(u32, u64), RmError> {
        let how = (form, layout, Via::Xfer);
        self.memory(client, parent, class::MEMORY_LOCAL_USER, bytes, 0, how)
    }

    /// Allocates `bytes` of host memory for the GPU (`NV01_MEMORY_SYSTEM`).
    ///
    /// # Errors
    /// The call failed.
    pub fn alloc_sysmem(&self, client: u32, parent: u32, bytes: u64) -> Result<u32, RmError> {
        let how = (Form::Nvos21, ParamsLayout::V128, Via::Direct);
        self.memory(client, parent, class::MEMORY_SYSTEM, bytes, 0, how)
            .map(|(h, _)| h)
    }

    /// Reserves `bytes` of GPU virtual addresses (`NV50_MEMORY_VIRTUAL`, flagged virtual-only):
    /// no memory behind them.
    ///
    /// # Errors
    /// The call failed.
    pub fn alloc_virtual(&self, client: u32, parent: u32, bytes: u64) -> Result<u32, RmError> {
        let how = (Form::Nvos21, ParamsLayout::V128, Via::Direct);
        let flags = memory_alloc::FLAGS_VIRTUAL;
        self.memory(
            client,
            parent,
            class::NV50_MEMORY_VIRTUAL,
            bytes,
            flags,
            how,
        )
        .map(|(h, _)| h)
    }

    /// `RM_ALLOC_MEMORY` of `class` as `handle` under `parent`, `limit + 1` bytes, issued on GPU
    /// node `nvidia<gpu>` as the driver requires (its fd field names the control fd); returns the
    /// `limit` the driver answered.
    ///
    /// # Errors
    /// The GPU node isn't open, the ioctl failed or the driver answered a non-zero status.
    pub fn alloc_memory(&self, r: AllocMemory) -> Result<u64, RmError> {
        let mut p = [0u8; nvos02::SIZE as usize];
        set_u32(&mut p, nvos02::H_ROOT, r.client);
        set_u32(&mut p, nvos02::H_OBJECT_PARENT, r.parent);
        set_u32(&mut p, nvos02::H_OBJECT_NEW, r.handle);
        set_u32(&mut p, nvos02::H_CLASS, r.class);
        set_u32(&mut p, nvos02::FLAGS, r.flags);
        set_u64(&mut p, nvos02::P_MEMORY, r.memory);
        set_u64(&mut p, nvos02::LIMIT, r.bytes.saturating_sub(1));
        set_u32(&mut p, nvos02::FD, self.rm_fd().cast_unsigned());
        let cmd = ioctl_cmd(esc::RM_ALLOC_MEMORY, nvos02::SIZE);
        let fd = self.gpu_fd(self.gpu).unwrap_or(-1);
        ioctl_raw(fd, cmd, &mut p).map_err(|source| RmError::Ioctl { cmd, source })?;
        match u32_at(&p, nvos02::STATUS) {
            status::OK => Ok(u64_at(&p, nvos02::LIMIT)),
            status => Err(RmError::Status { status }),
        }
    }

    /// `RM_VID_HEAP_CONTROL` with `params` (an `NVOS32_PARAMETERS` whose head the caller filled
    /// but for the client and parent).
    fn vid_heap(&self, client: u32, parent: u32, p: &mut [u8]) -> Result<(), RmError> {
        set_u32(p, nvos32::H_ROOT, client);
        set_u32(p, nvos32::H_OBJECT_PARENT, parent);
        self.rm(esc::RM_VID_HEAP_CONTROL, p, Via::Direct)?;
        match u32_at(p, nvos32::STATUS) {
            status::OK => Ok(()),
            status => Err(RmError::Status { status }),
        }
    }

    /// `RM_VID_HEAP_CONTROL` `ALLOC_SIZE` of `bytes` under `parent` with `attr` and `flags`
    /// (`NVOS32_ATTR_*`, `NVOS32_ALLOC_FLAGS_*`); returns the handle and the size the driver
    /// wrote back.
    ///
    /// # Errors
    /// The call failed.
    pub fn vid_heap_alloc(
        &self,
        client: u32,
        parent: u32,
        bytes: u64,
        (attr, flags): (u32, u32),
    ) -> Result<(u32, u64), RmError> {
        let mut p = [0u8; nvos32::SIZE as usize];
        set_u32(&mut p, nvos32::FUNCTION, nvos32::FUNCTION_ALLOC_SIZE);
        set_u32(&mut p, nvos32::ALLOC_ATTR, attr);
        set_u32(&mut p, nvos32::ALLOC_FLAGS, flags);
        set_u64(&mut p, nvos32::ALLOC_SIZE, bytes);
        self.vid_heap(client, parent, &mut p)?;
        Ok((u32_at(&p, nvos32::H_MEMORY), u64_at(&p, nvos32::ALLOC_SIZE)))
    }

    /// `RM_VID_HEAP_CONTROL` `FREE` of `handle`.
    ///
    /// # Errors
    /// The call failed.
    pub fn vid_heap_free(&self, client: u32, parent: u32, handle: u32) -> Result<(), RmError> {
        let mut p = [0u8; nvos32::SIZE as usize];
        set_u32(&mut p, nvos32::FUNCTION, nvos32::FUNCTION_FREE);
        set_u32(&mut p, nvos32::H_MEMORY, handle);
        self.vid_heap(client, parent, &mut p)
    }

    /// `RM_FREE` of `handle` with everything under it; of the whole client when `handle` is
    /// `client`.
    ///
    /// # Errors
    /// The call failed (`NV_ERR_INVALID_OBJECT_HANDLE` for a handle that isn't there).
    pub fn free(&self, client: u32, parent: u32, handle: u32) -> Result<(), RmError> {
        self.free_via(client, parent, handle, Via::Direct)
    }

    /// [`free`](Self::free), directly or through `IOCTL_XFER_CMD`.
    ///
    /// # Errors
    /// The call failed.
    pub fn free_via(&self, client: u32, parent: u32, handle: u32, via: Via) -> Result<(), RmError> {
        let mut p = [0u8; nvos00::SIZE as usize];
        set_u32(&mut p, nvos00::H_ROOT, client);
        set_u32(&mut p, nvos00::H_OBJECT_PARENT, parent);
        set_u32(&mut p, nvos00::H_OBJECT_OLD, handle);
        self.rm(esc::RM_FREE, &mut p, via)?;
        match u32_at(&p, nvos00::STATUS) {
            status::OK => Ok(()),
            status => Err(RmError::Status { status }),
        }
    }

    /// `RM_CONTROL` command `cmd` on `object` without params.
    ///
    /// # Errors
    /// The call failed.
    pub fn control(&self, client: u32, object: u32, cmd: u32) -> Result<(), RmError> {
        self.control_with(client, object, cmd, &mut [])
    }

    /// `RM_CONTROL` command `cmd` on `object`; the driver may write into `params`.
    ///
    /// # Errors
    /// The call failed.
    pub fn control_with(
        &self,
        client: u32,
        object: u32,
        cmd: u32,
        params: &mut [u8],
    ) -> Result<(), RmError> {
        let mut p = [0u8; nvos54::SIZE as usize];
        set_u32(&mut p, nvos54::H_CLIENT, client);
        set_u32(&mut p, nvos54::H_OBJECT, object);
        set_u32(&mut p, nvos54::CMD, cmd);
        if !params.is_empty() {
            set_u64(&mut p, nvos54::PARAMS, params.as_mut_ptr() as u64);
            set_u32(
                &mut p,
                nvos54::PARAMS_SIZE,
                u32::try_from(params.len()).unwrap_or(u32::MAX),
            );
        }
        self.rm(esc::RM_CONTROL, &mut p, Via::Direct)?;
        match u32_at(&p, nvos54::STATUS) {
            status::OK => Ok(()),
            status => Err(RmError::Status { status }),
        }
    }

    /// The ids of the GPUs attached (`NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS` on the client).
    ///
    /// # Errors
    /// The call failed.
    pub fn attached_gpu_ids(&self, client: u32) -> Result<Vec<u32>, RmError> {
        let mut ids = [0u8; ctrl::ATTACHED_IDS_SIZE as usize];
        self.control_with(client, client, ctrl::GPU_GET_ATTACHED_IDS, &mut ids)?;
        Ok(ids
            .chunks_exact(4)
            .map(|c| u32_at(c, 0))
            .take_while(|&id| id != ctrl::INVALID_GPU_ID)
            .collect())
    }

    /// `REGISTER_FD` on GPU node `gpu` with the control fd, as libcuda does after opening it.
    ///
    /// # Errors
    /// The GPU node isn't open, or the ioctl failed.
    pub fn register_fd(&self, gpu: u32) -> Result<(), RmError> {
        let cmd = ioctl_cmd(esc::REGISTER_FD, 4);
        let fd = self.gpu_fd(gpu).unwrap_or(-1);
        let mut p = self.rm_fd().to_le_bytes();
        ioctl_raw(fd, cmd, &mut p)
            .map(drop)
            .map_err(|source| RmError::Ioctl { cmd, source })
    }

    /// UVM command `cmd` with `params` on the UVM fd; returns what `ioctl` returned.
    ///
    /// # Errors
    /// The ioctl failed.
    pub fn uvm_raw(&self, cmd: u32, params: &mut [u8]) -> Result<i32, RmError> {
        ioctl_raw(self.uvm_fd().unwrap_or(-1), cmd, params)
            .map_err(|source| RmError::Ioctl { cmd, source })
    }

    /// A UVM command whose params end in `rmStatus` at `status_at`.
    fn uvm_call(&self, cmd: u32, params: &mut [u8], status_at: usize) -> Result<(), RmError> {
        self.uvm_raw(cmd, params)?;
        match u32_at(params, status_at) {
            status::OK => Ok(()),
            status => Err(RmError::Status { status }),
        }
    }

    /// A UVM command whose params are a range, `[base, base + length)`.
    fn uvm_range_call(&self, cmd: u32, base: u64, length: u64) -> Result<(), RmError> {
        use uvm_params::range;
        let mut p = [0u8; range::SIZE];
        set_u64(&mut p, range::BASE, base);
        set_u64(&mut p, range::LENGTH, length);
        self.uvm_call(cmd, &mut p, range::RM_STATUS)
    }

    /// `UVM_INITIALIZE` with no flags.
    ///
    /// # Errors
    /// The call failed.
    pub fn uvm_initialize(&self) -> Result<(), RmError> {
        use uvm_params::initialize;
        let mut p = [0u8; initialize::SIZE];
        self.uvm_call(uvm::INITIALIZE, &mut p, initialize::RM_STATUS)
    }

    /// `UVM_CREATE_EXTERNAL_RANGE` of `[base, base + length)`.
    ///
    /// # Errors
    /// The call failed.
    pub fn uvm_create_external_range(&self, base: u64, length: u64) -> Result<(), RmError> {
        self.uvm_range_call(uvm::CREATE_EXTERNAL_RANGE, base, length)
    }

    /// `UVM_MAP_EXTERNAL_ALLOCATION` of RM memory `memory` of `client` at `[base, base +
    /// length)` (the 256-GPU layout, no per-GPU attributes).
    ///
    /// # Errors
    /// The call failed.
    pub fn uvm_map_external_allocation(
        &self,
        base: u64,
        length: u64,
        client: u32,
        memory: u32,
    ) -> Result<(), RmError> {
        use uvm_params::map_external_allocation as m;
        let mut p = vec![0u8; m::SIZE];
        set_u64(&mut p, m::BASE, base);
        set_u64(&mut p, m::LENGTH, length);
        set_u32(&mut p, m::RM_CTRL_FD, self.rm_fd().cast_unsigned());
        set_u32(&mut p, m::H_CLIENT, client);
        set_u32(&mut p, m::H_MEMORY, memory);
        self.uvm_call(uvm::MAP_EXTERNAL_ALLOCATION, &mut p, m::RM_STATUS)
    }

    /// `UVM_FREE` of the range at `base`.
    ///
    /// # Errors
    /// The call failed.
    pub fn uvm_free(&self, base: u64, length: u64) -> Result<(), RmError> {
        self.uvm_range_call(uvm::FREE, base, length)
    }

    /// Maps `length` bytes of managed memory the way the CUDA driver does for
    /// `cudaMallocManaged`: reserves the range with an anonymous `PROT_NONE` mapping, then maps
    /// the UVM fd over it (`MAP_SHARED | MAP_FIXED`); returns the address.
    ///
    /// # Errors
    /// A mapping failed.
    pub fn uvm_mmap(&self, length: u64) -> io::Result<u64> {
        let len =
            usize::try_from(length).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: a fresh anonymous reservation; nothing else uses the range.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let fd = self.uvm_fd().unwrap_or(-1);
        // SAFETY: maps over the reservation just made, which this process owns.
        let addr = unsafe {
            libc::mmap(
                base,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            // SAFETY: the reservation made above.
            unsafe { libc::munmap(base, len) };
            return Err(e);
        }
        Ok(addr as u64)
    }

    /// Maps `length` bytes of `fd` shared, as libcuda maps memory through a GPU node; the
    /// mapping holds the file open until it is unmapped. Returns the address.
    ///
    /// # Errors
    /// The call failed.
    pub fn map_fd(&self, fd: RawFd, length: u64) -> io::Result<u64> {
        let len =
            usize::try_from(length).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: a fresh mapping wherever the kernel puts it; nothing else uses it.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(addr as u64)
    }

    /// Unmaps `[addr, addr + length)`.
    ///
    /// # Errors
    /// The call failed.
    pub fn munmap(&self, addr: u64, length: u64) -> io::Result<()> {
        let len =
            usize::try_from(length).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the caller names a mapping of its own (a wrong one fails or unmaps its own
        // memory, as munmap would in any process).
        if unsafe { libc::munmap(addr as *mut libc::c_void, len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// `UVM_REGISTER_GPU` of the GPU with `uuid`, through `client`.
    ///
    /// # Errors
    /// The call failed.
    pub fn uvm_register_gpu(&self, uuid: [u8; 16], client: u32) -> Result<(), RmError> {
        use uvm_params::register_gpu as r;
        let mut p = [0u8; r::SIZE];
        p[r::GPU_UUID..r::GPU_UUID + 16].copy_from_slice(&uuid);
        set_u32(&mut p, r::RM_CTRL_FD, self.rm_fd().cast_unsigned());
        set_u32(&mut p, r::H_CLIENT, client);
        self.uvm_call(uvm::REGISTER_GPU, &mut p, r::RM_STATUS)
    }
}

/// The number after `key=` in a reply line (`reply_value("ok handle=0xcaf00001", "handle")`).
#[must_use]
pub fn reply_value(reply: &str, key: &str) -> Option<u64> {
    reply
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| crate::units::number(v).ok())
}

#[cfg(test)]
mod tests;
