//! The FUSE side: a flat directory of the driver's files, whose ioctls go to the resource manager
//! or to UVM.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::BTreeMap,
    ffi::OsStr,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, UNIX_EPOCH},
};

use crate::abi::nvidia::{IOC_READ_WRITE, esc, ioctl_nr, ioctl_size, uvm as uvm_cmd};
use fuser::{
    FileAttr, FileType, Filesystem, ReplyAttr, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyOpen, Request,
};

use super::{caller::Process, rm::Rm, uvm};

const ROOT_INO: u64 = fuser::FUSE_ROOT_ID;
const CTL_INO: u64 = 2;
const UVM_INO: u64 = 3;
/// `nvidia<i>` is inode `GPU_INO + i`.
const GPU_INO: u64 = 100;

/// Attributes are fixed: the kernel may cache them.
const TTL: Duration = Duration::from_hours(1);

/// What the driver and the tests share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) rm: Rm,
    /// ioctls answered, by file name and escape (or UVM command) name.
    pub(crate) calls: BTreeMap<(String, &'static str), u64>,
    last_fh: u64,
}

impl Shared {
    pub(crate) fn new(rm: Rm) -> Self {
        Self {
            rm,
            calls: BTreeMap::new(),
            last_fh: 0,
        }
    }

    fn count(&mut self, file: &str, name: &'static str) {
        *self.calls.entry((file.to_owned(), name)).or_insert(0) += 1;
    }
}

/// Locks the shared state; a panic elsewhere doesn't make the numbers less useful.
pub(crate) fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.locked()
}

/// The names of the files a driver with `gpus` GPUs serves, in directory order.
pub(crate) fn file_names(gpus: usize) -> Vec<String> {
    let mut names: Vec<String> = (0..gpus).map(|i| format!("nvidia{i}")).collect();
    names.push("nvidiactl".to_owned());
    names.push("nvidia-uvm".to_owned());
    names
}

pub(crate) struct FakeFs {
    pub(crate) shared: Arc<Mutex<Shared>>,
    pub(crate) gpus: usize,
}

impl FakeFs {
    fn name(&self, ino: u64) -> Option<String> {
        match ino {
            CTL_INO => Some("nvidiactl".to_owned()),
            UVM_INO => Some("nvidia-uvm".to_owned()),
            _ => {
                let i = usize::try_from(ino.checked_sub(GPU_INO)?).ok()?;
                (i < self.gpus).then(|| format!("nvidia{i}"))
            }
        }
    }

    fn ino(&self, name: &str) -> Option<u64> {
        match name {
            "nvidiactl" => Some(CTL_INO),
            "nvidia-uvm" => Some(UVM_INO),
            _ => {
                let i: usize = name.strip_prefix("nvidia")?.parse().ok()?;
                // No leading zeros or signs: one name per GPU.
                (i < self.gpus && name == format!("nvidia{i}")).then(|| GPU_INO + i as u64)
            }
        }
    }
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

impl Filesystem for FakeFs {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        match name.to_str().and_then(|n| self.ino(n)) {
            Some(ino) if parent == ROOT_INO => reply.entry(&TTL, &attr(ino), 0),
            _ => reply.error(libc::ENOENT),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        if ino == ROOT_INO || self.name(ino).is_some() {
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
        let mut entries = vec![
            (ROOT_INO, FileType::Directory, ".".to_owned()),
            (ROOT_INO, FileType::Directory, "..".to_owned()),
        ];
        for name in file_names(self.gpus) {
            if let Some(ino) = self.ino(&name) {
                entries.push((ino, FileType::RegularFile, name));
            }
        }
        let skip = usize::try_from(offset).unwrap_or(0);
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(skip) {
            let next = i64::try_from(i + 1).unwrap_or(i64::MAX);
            if reply.add(ino, next, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        if self.name(ino).is_none() {
            reply.error(libc::EISDIR);
            return;
        }
        let mut shared = lock(&self.shared);
        shared.last_fh += 1;
        reply.opened(shared.last_fh, 0);
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
        // The last reference to the open file is gone (every dup closed, every process that
        // inherited it exited): like the real driver, free the clients made through it.
        lock(&self.shared).rm.release(fh);
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
        let Some(file) = self.name(ino) else {
            reply.error(libc::ENOTTY);
            return;
        };
        let caller = Process { tid: req.pid() };
        let mut shared = lock(&self.shared);

        if ino == UVM_INO {
            let result = uvm::answer(cmd, &caller, || caller.ioctl_arg(cmd));
            shared.count(&file, uvm_cmd::name(cmd).unwrap_or("unknown"));
            match result {
                Ok(_) => reply.ioctl(0, &[]),
                Err(errno) => reply.error(errno),
            }
            return;
        }

        let nr = ioctl_nr(cmd);
        let size = ioctl_size(cmd) as usize;
        // The real driver copies `size` bytes in and out whatever the direction bits say; FUSE
        // moves data only in the directions they name, so anything but read+write with data is
        // something the fake can't answer faithfully.
        let read_write = cmd >> 30 == IOC_READ_WRITE;
        if size > 0 && (!read_write || in_data.len() != size || out_size as usize != size) {
            shared.count(&file, esc::name(nr).unwrap_or("unknown"));
            reply.error(libc::EINVAL);
            return;
        }
        let mut params = in_data.to_vec();
        match shared.rm.escape(&caller, fh, nr, &mut params) {
            Ok(name) => {
                shared.count(&file, name);
                reply.ioctl(0, &params);
            }
            Err(errno) => {
                shared.count(&file, esc::name(nr).unwrap_or("unknown"));
                reply.error(errno);
            }
        }
    }
}
