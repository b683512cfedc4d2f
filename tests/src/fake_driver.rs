//! A fake NVIDIA driver: a FUSE file system answering RM and UVM ioctls.
//!
//! FUSE hands the daemon an `_IOC`-encoded ioctl's parameter bytes and sends back the bytes it
//! answers with; parameters the struct only points to (allocation params, `IOCTL_XFER_CMD`
//! payloads) are read and written in the caller with `process_vm_readv`/`process_vm_writev`,
//! which root may do. Video memory is rounded up to 2 MiB pages (the real driver's large-page
//! granularity) and written back, so a test sees the size the driver chose, not the one asked.
//!
//! Like the real driver, RM errors are reported in the params' `status` with the ioctl itself
//! returning 0; closing the fd that created a client frees the client and all it holds.

use std::{
    collections::HashMap,
    ffi::OsStr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, UNIX_EPOCH},
};

use fuser::{
    FileAttr, FileType, Filesystem, MountOption, ReplyAttr, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyOpen, Request,
};
use gpuwarden_agent_common::nvidia::{
    class, esc, ioctl_nr, ioctl_size, memory_alloc, nvos00, nvos21, nvos64, status, xfer,
};

/// Video memory is allocated in pages of this size.
pub const PAGE: u64 = 2 << 20;

/// `NV_ERR_INVALID_OBJECT_HANDLE`.
pub const STATUS_INVALID_OBJECT_HANDLE: u32 = 0x33;

/// Errors mounting the file system.
#[derive(Debug, thiserror::Error)]
pub enum FakeDriverError {
    /// Mounting failed (needs root and `/dev/fuse`).
    #[error("cannot mount the fake NVIDIA driver at {path}: {source}")]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Settings of a fake driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeConfig {
    /// Video memory per GPU (the number of GPUs is the length).
    pub gpu_memory: Vec<u64>,
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            gpu_memory: vec![1 << 30, 1 << 30],
        }
    }
}

/// The files the driver serves, with their inode numbers.
const FILES: &[(&str, u64)] = &[
    ("nvidiactl", 2),
    ("nvidia-uvm", 3),
    ("nvidia0", 10),
    ("nvidia1", 11),
    ("nvidia2", 12),
    ("nvidia3", 13),
];
const ROOT_INO: u64 = 1;
const UVM_INO: u64 = 3;

/// An RM object.
#[derive(Debug, Clone)]
struct Object {
    parent: u32,
    /// GPU index of a device or subdevice object, or of memory.
    gpu: Option<u32>,
    /// Video memory bytes held.
    bytes: u64,
}

#[derive(Debug)]
struct Client {
    /// The file handle it was created through.
    fh: u64,
    objects: HashMap<u32, Object>,
}

/// The driver's bookkeeping, shared with tests through [`FakeDriver::ledger`].
#[derive(Debug, Default)]
struct State {
    gpu_memory: Vec<u64>,
    gpu_used: Vec<u64>,
    clients: HashMap<u32, Client>,
    next_client: u32,
    next_handle: u32,
    next_fh: u64,
    ioctls: u64,
}

impl State {
    fn free_object(&mut self, client: u32, handle: u32) -> bool {
        let Some(c) = self.clients.get_mut(&client) else {
            return false;
        };
        let Some(object) = c.objects.remove(&handle) else {
            return false;
        };
        // Freeing a parent frees its children.
        let children: Vec<u32> = c
            .objects
            .iter()
            .filter(|(_, o)| o.parent == handle)
            .map(|(h, _)| *h)
            .collect();
        if let Some(gpu) = object.gpu
            && object.bytes > 0
        {
            self.gpu_used[gpu as usize] -= object.bytes;
        }
        for child in children {
            self.free_object(client, child);
        }
        true
    }

    fn free_client(&mut self, client: u32) -> bool {
        let Some(c) = self.clients.remove(&client) else {
            return false;
        };
        for object in c.objects.values() {
            if let Some(gpu) = object.gpu {
                self.gpu_used[gpu as usize] -= object.bytes;
            }
        }
        true
    }
}

/// A mounted fake driver; unmounted when dropped.
pub struct FakeDriver {
    dir: PathBuf,
    state: Arc<Mutex<State>>,
    _session: fuser::BackgroundSession,
}

impl FakeDriver {
    /// Mounts the driver at `dir` (created if missing) and serves it from a background thread.
    ///
    /// # Errors
    /// Mounting failed.
    pub fn mount(dir: &Path, config: FakeConfig) -> Result<Self, FakeDriverError> {
        let err = |source| FakeDriverError::Mount {
            path: dir.to_owned(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(err)?;
        let gpus = config.gpu_memory.len();
        let state = Arc::new(Mutex::new(State {
            gpu_used: vec![0; gpus],
            gpu_memory: config.gpu_memory,
            next_client: 0xc1d0_0000,
            next_handle: 0xcaf0_0000,
            ..State::default()
        }));
        let fs = FakeFs {
            state: Arc::clone(&state),
            gpus: gpus as u64,
        };
        let options = [
            MountOption::FSName("nvidia-fake".to_owned()),
            MountOption::AllowOther,
            MountOption::DefaultPermissions,
        ];
        let session = fuser::spawn_mount2(fs, dir, &options).map_err(err)?;
        Ok(Self {
            dir: dir.to_owned(),
            state,
            _session: session,
        })
    }

    /// The mount point.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of one of the driver's files (`nvidiactl`, `nvidia0`, …).
    #[must_use]
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Video memory bytes allocated per GPU right now.
    #[must_use]
    pub fn ledger(&self) -> Vec<u64> {
        self.lock().gpu_used.clone()
    }

    /// Live clients.
    #[must_use]
    pub fn clients(&self) -> usize {
        self.lock().clients.len()
    }

    /// ioctls answered so far.
    #[must_use]
    pub fn ioctls(&self) -> u64 {
        self.lock().ioctls
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

struct FakeFs {
    state: Arc<Mutex<State>>,
    gpus: u64,
}

fn attr(ino: u64) -> FileAttr {
    let dir = ino == ROOT_INO;
    FileAttr {
        ino,
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: if dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: if dir { 0o755 } else { 0o666 },
        nlink: if dir { 2 } else { 1 },
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

const TTL: Duration = Duration::from_secs(60);

impl FakeFs {
    fn visible(&self, ino: u64) -> bool {
        ino < 10 || ino - 10 < self.gpus
    }
}

impl Filesystem for FakeFs {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let found = FILES
            .iter()
            .find(|(n, ino)| OsStr::new(n) == name && self.visible(*ino));
        match (parent, found) {
            (ROOT_INO, Some((_, ino))) => reply.entry(&TTL, &attr(*ino), 0),
            _ => reply.error(libc::ENOENT),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        if ino == ROOT_INO || FILES.iter().any(|(_, i)| *i == ino) {
            reply.attr(&TTL, &attr(ino));
        } else {
            reply.error(libc::ENOENT);
        }
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        if ino != ROOT_INO {
            reply.error(libc::ENOTDIR);
            return;
        }
        let entries = [
            (ROOT_INO, FileType::Directory, "."),
            (ROOT_INO, FileType::Directory, ".."),
        ]
        .into_iter()
        .chain(
            FILES
                .iter()
                .filter(|(_, i)| self.visible(*i))
                .map(|(n, i)| (*i, FileType::RegularFile, *n)),
        );
        for (i, (ino, kind, name)) in entries
            .enumerate()
            .skip(usize::try_from(offset).unwrap_or(0))
        {
            if reply.add(ino, i64::try_from(i).unwrap_or(i64::MAX) + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn open(&mut self, _req: &Request<'_>, _ino: u64, _flags: i32, reply: ReplyOpen) {
        let mut state = lock(&self.state);
        state.next_fh += 1;
        reply.opened(state.next_fh, 0);
    }

    fn release(
        &mut self,
        _req: &Request<'_>,
        _ino: u64,
        fh: u64,
        _flags: i32,
        _lock_owner: Option<u64>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // Closing the last reference to the fd frees the clients created through it.
        let mut state = lock(&self.state);
        let owned: Vec<u32> = state
            .clients
            .iter()
            .filter(|(_, c)| c.fh == fh)
            .map(|(h, _)| *h)
            .collect();
        for client in owned {
            state.free_client(client);
        }
        reply.ok();
    }

    fn ioctl(
        &mut self,
        req: &Request<'_>,
        ino: u64,
        fh: u64,
        _flags: u32,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        let mut state = lock(&self.state);
        state.ioctls += 1;
        if ino == UVM_INO {
            // UVM commands carry no size, so FUSE passes no data; answer success.
            reply.ioctl(0, &[]);
            return;
        }
        let mut params = in_data.to_vec();
        params.resize(out_size as usize, 0);
        let caller = Caller { pid: req.pid() };
        let result = dispatch(
            &mut state,
            &caller,
            fh,
            ioctl_nr(cmd),
            ioctl_size(cmd),
            &mut params,
        );
        match result {
            Ok(()) => reply.ioctl(0, &params),
            Err(errno) => reply.error(errno),
        }
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The process that issued an ioctl: where pointed-to params live.
struct Caller {
    pid: u32,
}

impl Caller {
    fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>, i32> {
        let mut buf = vec![0u8; len];
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: len,
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        };
        // SAFETY: valid iovecs; the kernel checks the remote range.
        let n = unsafe {
            libc::process_vm_readv(
                self.pid as i32,
                &raw const local,
                1,
                &raw const remote,
                1,
                0,
            )
        };
        if usize::try_from(n).ok() == Some(len) {
            Ok(buf)
        } else {
            Err(libc::EFAULT)
        }
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), i32> {
        let local = libc::iovec {
            iov_base: data.as_ptr().cast_mut().cast(),
            iov_len: data.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: data.len(),
        };
        // SAFETY: valid iovecs; the kernel checks the remote range.
        let n = unsafe {
            libc::process_vm_writev(
                self.pid as i32,
                &raw const local,
                1,
                &raw const remote,
                1,
                0,
            )
        };
        if usize::try_from(n).ok() == Some(data.len()) {
            Ok(())
        } else {
            Err(libc::EFAULT)
        }
    }
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    b.get(off..off + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    b.get(off..off + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

fn put_u32(b: &mut [u8], off: usize, v: u32) {
    if let Some(s) = b.get_mut(off..off + 4) {
        s.copy_from_slice(&v.to_le_bytes());
    }
}

/// Answers one RM escape, editing `params` in place. `Err` is an errno for malformed ioctls.
fn dispatch(
    state: &mut State,
    caller: &Caller,
    fh: u64,
    nr: u32,
    size: u32,
    params: &mut [u8],
) -> Result<(), i32> {
    match nr {
        esc::RM_ALLOC => {
            let status_at = match size {
                nvos21::SIZE => nvos21::STATUS,
                nvos64::SIZE => nvos64::STATUS,
                _ => return Err(libc::EINVAL),
            };
            let params_size = if size == nvos21::SIZE {
                u32_at(params, nvos21::PARAMS_SIZE)
            } else {
                u32_at(params, nvos64::PARAMS_SIZE)
            };
            let status = alloc(state, caller, fh, params, params_size);
            put_u32(params, status_at, status);
            Ok(())
        }
        esc::RM_FREE => {
            if size != nvos00::SIZE {
                return Err(libc::EINVAL);
            }
            let client = u32_at(params, nvos00::H_ROOT);
            let object = u32_at(params, nvos00::H_OBJECT_OLD);
            let freed = if client == object {
                state.free_client(client)
            } else {
                state.free_object(client, object)
            };
            put_u32(
                params,
                nvos00::STATUS,
                if freed {
                    status::OK
                } else {
                    STATUS_INVALID_OBJECT_HANDLE
                },
            );
            Ok(())
        }
        esc::IOCTL_XFER_CMD => {
            if size != xfer::SIZE {
                return Err(libc::EINVAL);
            }
            let inner_nr = u32_at(params, xfer::CMD);
            let inner_size = u32_at(params, xfer::PARAMS_SIZE);
            let ptr = u64_at(params, xfer::PTR);
            if inner_nr == esc::IOCTL_XFER_CMD || inner_size > 16384 {
                return Err(libc::EINVAL);
            }
            let mut inner = caller.read(ptr, inner_size as usize)?;
            dispatch(state, caller, fh, inner_nr, inner_size, &mut inner)?;
            caller.write(ptr, &inner)
        }
        esc::RM_CONTROL => {
            put_u32(
                params,
                gpuwarden_agent_common::nvidia::nvos54::STATUS,
                status::OK,
            );
            Ok(())
        }
        // Version checks, card info, fd registration and the rest: success with zeros.
        _ => Ok(()),
    }
}

/// `RM_ALLOC`: returns the RM status.
fn alloc(state: &mut State, caller: &Caller, fh: u64, params: &mut [u8], params_size: u32) -> u32 {
    let client = u32_at(params, nvos21::H_ROOT);
    let parent = u32_at(params, nvos21::H_OBJECT_PARENT);
    let requested = u32_at(params, nvos21::H_OBJECT_NEW);
    let h_class = u32_at(params, nvos21::H_CLASS);
    let alloc_params = u64_at(params, nvos21::P_ALLOC_PARMS);

    if class::is_client(h_class) {
        let handle = if requested != 0 {
            requested
        } else {
            state.next_client += 1;
            state.next_client
        };
        if state.clients.contains_key(&handle) {
            return status::INVALID_ARGUMENT;
        }
        state.clients.insert(
            handle,
            Client {
                fh,
                objects: HashMap::new(),
            },
        );
        put_u32(params, nvos21::H_OBJECT_NEW, handle);
        return status::OK;
    }
    let Some(c) = state.clients.get(&client) else {
        return STATUS_INVALID_OBJECT_HANDLE;
    };
    let parent_gpu = c.objects.get(&parent).and_then(|o| o.gpu);
    if parent != client && !c.objects.contains_key(&parent) {
        return STATUS_INVALID_OBJECT_HANDLE;
    }
    let handle = if requested != 0 {
        requested
    } else {
        state.next_handle += 1;
        state.next_handle
    };
    if state
        .clients
        .get(&client)
        .is_some_and(|c| c.objects.contains_key(&handle))
    {
        return status::INVALID_ARGUMENT;
    }
    let mut object = Object {
        parent,
        gpu: None,
        bytes: 0,
    };
    match h_class {
        class::DEVICE_0 => {
            let Ok(raw) = caller.read(alloc_params, 4) else {
                return status::INVALID_ARGUMENT;
            };
            let device_id = u32_at(&raw, 0);
            if device_id as usize >= state.gpu_memory.len() {
                return status::INVALID_ARGUMENT;
            }
            object.gpu = Some(device_id);
        }
        class::SUBDEVICE_0 => object.gpu = parent_gpu,
        class::MEMORY_LOCAL_USER => {
            if params_size != memory_alloc::SIZE && params_size != memory_alloc::SIZE_OLD {
                return status::INVALID_ARGUMENT;
            }
            let Some(gpu) = parent_gpu else {
                return STATUS_INVALID_OBJECT_HANDLE;
            };
            let Ok(mut raw) = caller.read(alloc_params, params_size as usize) else {
                return status::INVALID_ARGUMENT;
            };
            let asked = u64_at(&raw, memory_alloc::SIZE_FIELD);
            let bytes = asked.div_ceil(PAGE).max(1) * PAGE;
            let gpu_index = gpu as usize;
            if state.gpu_used[gpu_index] + bytes > state.gpu_memory[gpu_index] {
                return status::NO_MEMORY;
            }
            raw[memory_alloc::SIZE_FIELD..memory_alloc::SIZE_FIELD + 8]
                .copy_from_slice(&bytes.to_le_bytes());
            if caller.write(alloc_params, &raw).is_err() {
                return status::INVALID_ARGUMENT;
            }
            state.gpu_used[gpu_index] += bytes;
            object.gpu = Some(gpu);
            object.bytes = bytes;
        }
        // Virtual ranges, system memory and other objects hold no video memory.
        _ => {}
    }
    if let Some(c) = state.clients.get_mut(&client) {
        c.objects.insert(handle, object);
    }
    put_u32(params, nvos21::H_OBJECT_NEW, handle);
    status::OK
}
