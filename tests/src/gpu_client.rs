//! A synthetic GPU client: the ioctls a CUDA process issues, with the real encodings and layouts.
//!
//! [`GpuClient`] is the library; the `gpu-client` binary wraps it in a line protocol so a test
//! can step a process that lives inside a cgroup. After start it prints `ready pid=<pid>`, then
//! answers each command line with one line starting `ok` or `err`:
//!
//! | command | reply |
//! |---|---|
//! | `client` | `ok client=0x…` |
//! | `device <client> <id>` | `ok handle=0x…` |
//! | `subdevice <client> <device>` | `ok handle=0x…` |
//! | `alloc <client> <parent> <bytes>[k\|m\|g] [nvos21\|nvos64] [v120\|v128] [xfer]` | `ok handle=0x… size=<bytes written back>` |
//! | `virtual <client> <parent> <bytes>` | `ok handle=0x…` (a VA reservation) |
//! | `free <client> <parent> <handle>` | `ok` |
//! | `control <client> <object> <cmd>` | `ok` |
//! | `uvm <cmd\|init>` | `ok ret=<n>` |
//! | `dup` | `ok fd=<n>`: RM ioctls go through a `dup` of the control fd from now on |
//! | `ioctl-raw <path> <cmd>` | `ok ret=<n>`: an NVIDIA-looking ioctl on any file |
//! | `thread <command…>` | the command's reply, run on a new thread |
//! | `fork` | `ok pid=<child>`: a child sharing the fds, driven with `child <command…>` |
//! | `child <command…>` | the child's reply; `child exit` ends it |
//! | `close ctl` | `ok` |
//! | `sleep <ms>`, `pid`, `exit` | `ok`, `ok pid=<n>`, (exits without freeing anything) |
//!
//! Numbers are decimal or `0x` hex. An RM error answers `err status=0x…`.

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    path::{Path, PathBuf},
};

use gpuwarden_agent_common::nvidia::{
    class, esc, ioctl_cmd, memory_alloc, nvos00, nvos21, nvos54, nvos64, status, uvm, xfer,
};

/// An RM call that failed.
#[derive(Debug, thiserror::Error)]
pub enum RmError {
    /// The ioctl itself failed.
    #[error("ioctl failed: {0}")]
    Io(#[from] io::Error),
    /// The driver answered a non-zero status.
    #[error("status={0:#x}")]
    Status(u32),
}

/// The parameter struct of `RM_ALLOC`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `NVOS21_PARAMETERS` (32 bytes).
    Nvos21,
    /// `NVOS64_PARAMETERS` (48 bytes).
    Nvos64,
}

/// The size of `NV_MEMORY_ALLOCATION_PARAMS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// 120 bytes (drivers before 545.23.06).
    V120,
    /// 128 bytes.
    V128,
}

/// How an allocation is issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocOptions {
    /// Params struct.
    pub form: Form,
    /// Allocation params size.
    pub layout: Layout,
    /// Wrapped in `IOCTL_XFER_CMD`.
    pub xfer: bool,
}

impl Default for AllocOptions {
    fn default() -> Self {
        Self {
            form: Form::Nvos21,
            layout: Layout::V128,
            xfer: false,
        }
    }
}

/// Open GPU device files and the calls a CUDA process makes on them.
#[derive(Debug)]
pub struct GpuClient {
    ctl: OwnedFd,
    /// A `dup` of `ctl` used for RM calls when set.
    dup: Option<OwnedFd>,
    uvm: OwnedFd,
    gpu: OwnedFd,
}

/// Opens `path` read-write, close-on-exec like libcuda.
///
/// # Errors
/// The open fails.
pub fn open(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    // SAFETY: a valid C string.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Issues `ioctl(fd, cmd, params)`.
///
/// # Errors
/// The ioctl returns -1.
pub fn raw_ioctl(fd: RawFd, cmd: u32, params: &mut [u8]) -> io::Result<i32> {
    // The size the command encodes must fit the buffer, or the kernel would write past it.
    let encoded = (cmd >> 16) & 0x3fff;
    if cmd >> 30 != 0 && encoded as usize > params.len() {
        return Err(io::Error::other(format!(
            "ioctl {cmd:#x} needs {encoded} bytes, buffer has {}",
            params.len()
        )));
    }
    // SAFETY: the buffer is as large as the command says.
    let ret = unsafe { libc::ioctl(fd, libc::c_ulong::from(cmd), params.as_mut_ptr()) };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

impl GpuClient {
    /// Opens `nvidiactl`, `nvidia-uvm` and `nvidia<gpu>` in `dir`.
    ///
    /// # Errors
    /// A file can't be opened.
    pub fn open(dir: &Path, gpu: u32) -> io::Result<Self> {
        Ok(Self {
            ctl: open(&dir.join("nvidiactl"))?,
            dup: None,
            uvm: open(&dir.join("nvidia-uvm"))?,
            gpu: open(&dir.join(format!("nvidia{gpu}")))?,
        })
    }

    /// The fd RM calls go through.
    #[must_use]
    pub fn rm_fd(&self) -> RawFd {
        self.dup.as_ref().unwrap_or(&self.ctl).as_raw_fd()
    }

    /// The GPU node's fd.
    #[must_use]
    pub fn gpu_fd(&self) -> RawFd {
        self.gpu.as_raw_fd()
    }

    /// Sends RM calls through a `dup` of the control fd from now on; returns the new fd.
    ///
    /// # Errors
    /// `dup` fails.
    pub fn use_dup(&mut self) -> io::Result<RawFd> {
        self.dup = Some(self.ctl.try_clone()?);
        Ok(self.rm_fd())
    }

    /// Closes the control fd (and its dup): the driver frees the clients made through it.
    pub fn close_ctl(&mut self) {
        self.dup = None;
        // Replace with /dev/null so the struct stays valid; the real fd is closed.
        if let Ok(null) = open(Path::new("/dev/null")) {
            self.ctl = null;
        }
    }

    /// Issues escape `nr` with `params` on the RM fd, or wrapped in `IOCTL_XFER_CMD`.
    fn rm(&self, nr: u32, params: &mut [u8], via_xfer: bool) -> io::Result<()> {
        let size = u32::try_from(params.len()).map_err(io::Error::other)?;
        if via_xfer {
            let mut outer = [0u8; xfer::SIZE as usize];
            put_u32(&mut outer, xfer::CMD, nr);
            put_u32(&mut outer, xfer::PARAMS_SIZE, size);
            put_u64(&mut outer, xfer::PTR, params.as_mut_ptr() as u64);
            raw_ioctl(
                self.rm_fd(),
                ioctl_cmd(esc::IOCTL_XFER_CMD, xfer::SIZE),
                &mut outer,
            )?;
        } else {
            raw_ioctl(self.rm_fd(), ioctl_cmd(nr, size), params)?;
        }
        Ok(())
    }

    /// `RM_ALLOC`; returns the new handle.
    fn alloc(
        &self,
        client: u32,
        parent: u32,
        h_class: u32,
        alloc_params: &mut [u8],
        options: AllocOptions,
    ) -> Result<u32, RmError> {
        let ptr = if alloc_params.is_empty() {
            0
        } else {
            alloc_params.as_mut_ptr() as u64
        };
        let params_size = u32::try_from(alloc_params.len()).map_err(io::Error::other)?;
        let (mut params, size_at, status_at) = match options.form {
            Form::Nvos21 => (
                vec![0u8; nvos21::SIZE as usize],
                nvos21::PARAMS_SIZE,
                nvos21::STATUS,
            ),
            Form::Nvos64 => (
                vec![0u8; nvos64::SIZE as usize],
                nvos64::PARAMS_SIZE,
                nvos64::STATUS,
            ),
        };
        put_u32(&mut params, nvos21::H_ROOT, client);
        put_u32(&mut params, nvos21::H_OBJECT_PARENT, parent);
        put_u32(&mut params, nvos21::H_CLASS, h_class);
        put_u64(&mut params, nvos21::P_ALLOC_PARMS, ptr);
        put_u32(&mut params, size_at, params_size);
        self.rm(esc::RM_ALLOC, &mut params, options.xfer)?;
        match get_u32(&params, status_at) {
            status::OK => Ok(get_u32(&params, nvos21::H_OBJECT_NEW)),
            s => Err(RmError::Status(s)),
        }
    }

    /// Creates a client (`NV01_ROOT_CLIENT`).
    ///
    /// # Errors
    /// The call fails.
    pub fn alloc_client(&self) -> Result<u32, RmError> {
        self.alloc(0, 0, class::ROOT_CLIENT, &mut [], AllocOptions::default())
    }

    /// Creates a device object (`NV01_DEVICE_0`) for GPU `device_id`.
    ///
    /// # Errors
    /// The call fails.
    pub fn alloc_device(&self, client: u32, device_id: u32) -> Result<u32, RmError> {
        let mut params = [0u8; 56];
        put_u32(&mut params, 0, device_id);
        self.alloc(
            client,
            client,
            class::DEVICE_0,
            &mut params,
            AllocOptions::default(),
        )
    }

    /// Creates a subdevice object (`NV20_SUBDEVICE_0`) under `device`.
    ///
    /// # Errors
    /// The call fails.
    pub fn alloc_subdevice(&self, client: u32, device: u32) -> Result<u32, RmError> {
        let mut params = [0u8; 4];
        self.alloc(
            client,
            device,
            class::SUBDEVICE_0,
            &mut params,
            AllocOptions::default(),
        )
    }

    /// Allocates `bytes` of video memory under `parent`; returns the handle and the size the
    /// driver wrote back.
    ///
    /// # Errors
    /// The call fails (e.g. `Status(0x51)`, out of memory).
    pub fn alloc_vidmem(
        &self,
        client: u32,
        parent: u32,
        bytes: u64,
        options: AllocOptions,
    ) -> Result<(u32, u64), RmError> {
        let len = match options.layout {
            Layout::V120 => memory_alloc::SIZE_OLD,
            Layout::V128 => memory_alloc::SIZE,
        } as usize;
        let mut params = vec![0u8; len];
        put_u64(&mut params, memory_alloc::SIZE_FIELD, bytes);
        let handle = self.alloc(
            client,
            parent,
            class::MEMORY_LOCAL_USER,
            &mut params,
            options,
        )?;
        let size = u64::from_le_bytes(
            params[memory_alloc::SIZE_FIELD..memory_alloc::SIZE_FIELD + 8]
                .try_into()
                .map_err(io::Error::other)?,
        );
        Ok((handle, size))
    }

    /// Reserves `bytes` of GPU virtual addresses (no memory behind them).
    ///
    /// # Errors
    /// The call fails.
    pub fn alloc_virtual(&self, client: u32, parent: u32, bytes: u64) -> Result<u32, RmError> {
        let mut params = vec![0u8; memory_alloc::SIZE as usize];
        put_u32(
            &mut params,
            memory_alloc::FLAGS,
            memory_alloc::FLAGS_VIRTUAL,
        );
        put_u64(&mut params, memory_alloc::SIZE_FIELD, bytes);
        self.alloc(
            client,
            parent,
            class::NV50_MEMORY_VIRTUAL,
            &mut params,
            AllocOptions::default(),
        )
    }

    /// `RM_FREE` of `handle` (of the client itself when `handle == client`).
    ///
    /// # Errors
    /// The call fails.
    pub fn free(&self, client: u32, parent: u32, handle: u32) -> Result<(), RmError> {
        let mut params = [0u8; nvos00::SIZE as usize];
        put_u32(&mut params, nvos00::H_ROOT, client);
        put_u32(&mut params, nvos00::H_OBJECT_PARENT, parent);
        put_u32(&mut params, nvos00::H_OBJECT_OLD, handle);
        self.rm(esc::RM_FREE, &mut params, false)?;
        match get_u32(&params, nvos00::STATUS) {
            status::OK => Ok(()),
            s => Err(RmError::Status(s)),
        }
    }

    /// `RM_CONTROL` with command `cmd` and no params.
    ///
    /// # Errors
    /// The call fails.
    pub fn control(&self, client: u32, object: u32, cmd: u32) -> Result<(), RmError> {
        let mut params = [0u8; nvos54::SIZE as usize];
        put_u32(&mut params, nvos54::H_CLIENT, client);
        put_u32(&mut params, nvos54::H_OBJECT, object);
        put_u32(&mut params, nvos54::CMD, cmd);
        self.rm(esc::RM_CONTROL, &mut params, false)?;
        match get_u32(&params, nvos54::STATUS) {
            status::OK => Ok(()),
            s => Err(RmError::Status(s)),
        }
    }

    /// A UVM command with a zeroed 64-byte params buffer.
    ///
    /// # Errors
    /// The ioctl fails.
    pub fn uvm(&self, cmd: u32) -> io::Result<i32> {
        let mut params = [0u8; 64];
        raw_ioctl(self.uvm.as_raw_fd(), cmd, &mut params)
    }
}

/// One parsed command of the `gpu-client` protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `client`.
    Client,
    /// `device <client> <id>`.
    Device(u32, u32),
    /// `subdevice <client> <device>`.
    Subdevice(u32, u32),
    /// `alloc <client> <parent> <bytes> [options]`.
    Alloc(u32, u32, u64, AllocOptions),
    /// `virtual <client> <parent> <bytes>`.
    Virtual(u32, u32, u64),
    /// `free <client> <parent> <handle>`.
    Free(u32, u32, u32),
    /// `control <client> <object> <cmd>`.
    Control(u32, u32, u32),
    /// `uvm <cmd>`.
    Uvm(u32),
    /// `dup`.
    Dup,
    /// `ioctl-raw <path> <cmd>`.
    IoctlRaw(PathBuf, u32),
    /// `thread <command>`.
    Thread(Box<Command>),
    /// `fork`.
    Fork,
    /// `child <command>`: the command line, parsed again by the child.
    Child(String),
    /// `close ctl`.
    CloseCtl,
    /// `sleep <ms>`.
    Sleep(u64),
    /// `pid`.
    Pid,
    /// `exit`.
    Exit,
}

/// Parses a number in decimal or `0x` hex.
fn number(s: &str) -> Result<u64, String> {
    let parsed = match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.map_err(|_| format!("not a number: {s:?}"))
}

fn number32(s: &str) -> Result<u32, String> {
    u32::try_from(number(s)?).map_err(|_| format!("too large: {s:?}"))
}

/// Parses a size with an optional `k`, `m` or `g` suffix (binary units).
fn bytes(s: &str) -> Result<u64, String> {
    let (digits, shift) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    Ok(number(digits)? << shift)
}

/// Parses one command line.
///
/// # Errors
/// A message naming what is wrong.
pub fn parse(line: &str) -> Result<Command, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let arg = |i: usize| {
        words
            .get(i)
            .copied()
            .ok_or_else(|| format!("{line:?}: missing argument {i}"))
    };
    let rest = || words[1..].join(" ");
    Ok(match words.first().copied() {
        Some("client") => Command::Client,
        Some("device") => Command::Device(number32(arg(1)?)?, number32(arg(2)?)?),
        Some("subdevice") => Command::Subdevice(number32(arg(1)?)?, number32(arg(2)?)?),
        Some("alloc") => {
            let mut options = AllocOptions::default();
            for word in words.iter().skip(4) {
                match *word {
                    "nvos21" => options.form = Form::Nvos21,
                    "nvos64" => options.form = Form::Nvos64,
                    "v120" => options.layout = Layout::V120,
                    "v128" => options.layout = Layout::V128,
                    "xfer" => options.xfer = true,
                    other => return Err(format!("unknown alloc option {other:?}")),
                }
            }
            Command::Alloc(
                number32(arg(1)?)?,
                number32(arg(2)?)?,
                bytes(arg(3)?)?,
                options,
            )
        }
        Some("virtual") => {
            Command::Virtual(number32(arg(1)?)?, number32(arg(2)?)?, bytes(arg(3)?)?)
        }
        Some("free") => Command::Free(number32(arg(1)?)?, number32(arg(2)?)?, number32(arg(3)?)?),
        Some("control") => {
            Command::Control(number32(arg(1)?)?, number32(arg(2)?)?, number32(arg(3)?)?)
        }
        Some("uvm") => match arg(1)? {
            "init" => Command::Uvm(uvm::INITIALIZE),
            n => Command::Uvm(number32(n)?),
        },
        Some("dup") => Command::Dup,
        Some("ioctl-raw") => Command::IoctlRaw(PathBuf::from(arg(1)?), number32(arg(2)?)?),
        Some("thread") => Command::Thread(Box::new(parse(&rest())?)),
        Some("fork") => Command::Fork,
        Some("child") => {
            parse(&rest())?;
            Command::Child(rest())
        }
        Some("close") if arg(1)? == "ctl" => Command::CloseCtl,
        Some("sleep") => Command::Sleep(number(arg(1)?)?),
        Some("pid") => Command::Pid,
        Some("exit") => Command::Exit,
        Some(other) => return Err(format!("unknown command {other:?}")),
        None => return Err("empty line".to_owned()),
    })
}

/// Runs a command that needs only the client; `None` for the process-level ones.
pub fn execute(client: &mut GpuClient, command: &Command) -> Option<String> {
    let rm = |r: Result<String, RmError>| match r {
        Ok(s) => s,
        Err(RmError::Status(s)) => format!("err status={s:#x}"),
        Err(RmError::Io(e)) => format!("err io={e}"),
    };
    Some(match command {
        Command::Client => rm(client.alloc_client().map(|h| format!("ok client={h:#x}"))),
        Command::Device(c, id) => rm(client
            .alloc_device(*c, *id)
            .map(|h| format!("ok handle={h:#x}"))),
        Command::Subdevice(c, d) => rm(client
            .alloc_subdevice(*c, *d)
            .map(|h| format!("ok handle={h:#x}"))),
        Command::Alloc(c, p, b, o) => rm(client
            .alloc_vidmem(*c, *p, *b, *o)
            .map(|(h, size)| format!("ok handle={h:#x} size={size}"))),
        Command::Virtual(c, p, b) => rm(client
            .alloc_virtual(*c, *p, *b)
            .map(|h| format!("ok handle={h:#x}"))),
        Command::Free(c, p, h) => rm(client.free(*c, *p, *h).map(|()| "ok".to_owned())),
        Command::Control(c, o, cmd) => rm(client.control(*c, *o, *cmd).map(|()| "ok".to_owned())),
        Command::Uvm(cmd) => match client.uvm(*cmd) {
            Ok(ret) => format!("ok ret={ret}"),
            Err(e) => format!("err io={e}"),
        },
        Command::Dup => match client.use_dup() {
            Ok(fd) => format!("ok fd={fd}"),
            Err(e) => format!("err io={e}"),
        },
        Command::IoctlRaw(path, cmd) => {
            let mut params = [0u8; 64];
            match open(path).and_then(|fd| raw_ioctl(fd.as_raw_fd(), *cmd, &mut params)) {
                Ok(ret) => format!("ok ret={ret}"),
                Err(e) => format!("ok ret=-1 errno={}", e.raw_os_error().unwrap_or(0)),
            }
        }
        Command::CloseCtl => {
            client.close_ctl();
            "ok".to_owned()
        }
        Command::Sleep(ms) => {
            std::thread::sleep(std::time::Duration::from_millis(*ms));
            "ok".to_owned()
        }
        Command::Pid => format!("ok pid={}", std::process::id()),
        Command::Thread(_) | Command::Fork | Command::Child(_) | Command::Exit => return None,
    })
}

/// The numeric value after `key=` in a reply line.
#[must_use]
pub fn reply_value(reply: &str, key: &str) -> Option<u64> {
    reply
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| number(v).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_command_language() {
        assert_eq!(parse("client"), Ok(Command::Client));
        assert_eq!(
            parse("device 0xc1d00001 1"),
            Ok(Command::Device(0xc1d0_0001, 1))
        );
        assert_eq!(
            parse("alloc 0x10 0x20 64m nvos64 v120 xfer"),
            Ok(Command::Alloc(
                0x10,
                0x20,
                64 << 20,
                AllocOptions {
                    form: Form::Nvos64,
                    layout: Layout::V120,
                    xfer: true
                }
            ))
        );
        assert_eq!(
            parse("alloc 1 2 4096"),
            Ok(Command::Alloc(1, 2, 4096, AllocOptions::default()))
        );
        assert_eq!(parse("uvm init"), Ok(Command::Uvm(uvm::INITIALIZE)));
        assert_eq!(
            parse("thread free 1 2 3"),
            Ok(Command::Thread(Box::new(Command::Free(1, 2, 3))))
        );
        assert_eq!(
            parse("child alloc 1 2 3m"),
            Ok(Command::Child("alloc 1 2 3m".into()))
        );
        assert!(parse("child bogus").is_err());
        assert_eq!(
            parse("ioctl-raw /dev/null 0xc020462b"),
            Ok(Command::IoctlRaw("/dev/null".into(), 0xc020_462b))
        );
        assert!(parse("alloc 1 2").unwrap_err().contains("missing"));
        assert!(parse("alloc 1 2 3x").unwrap_err().contains("3x"));
        assert!(parse("alloc 1 2 3 nvos99").unwrap_err().contains("nvos99"));
        assert!(parse("frobnicate").unwrap_err().contains("frobnicate"));
    }

    #[test]
    fn reads_reply_values() {
        assert_eq!(
            reply_value("ok handle=0xcaf00001 size=2097152", "handle"),
            Some(0xcaf0_0001)
        );
        assert_eq!(
            reply_value("ok handle=0xcaf00001 size=2097152", "size"),
            Some(2 << 20)
        );
        assert_eq!(reply_value("err status=0x51", "status"), Some(0x51));
        assert_eq!(reply_value("ok", "size"), None);
    }
}
