//! The `gpu-client` line protocol: [`parse`] turns a line into a [`Command`] (a pure function),
//! [`Session`] runs commands on a [`GpuClient`] and serves a whole script. The language is
//! described in the [parent module](super).

use std::{
    fmt::Write as _,
    io::{self, BufRead, BufReader, Write},
    os::fd::{FromRawFd, OwnedFd, RawFd},
    path::{Path, PathBuf},
    time::Duration,
};

use crate::abi::nvidia::{class, nvos02, nvos32};

use super::{
    AllocMemory, ClientError, Form, GpuClient, ParamsLayout, RmError, Via, ioctl_raw,
    obtain::{self, OpenHow},
};
use crate::units::{NumberError, number, number32, size};

/// A line that isn't a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Nothing but blanks.
    #[error("empty line")]
    Empty,
    /// The first word isn't a command.
    #[error("unknown command {word:?}")]
    UnknownCommand {
        /// The word.
        word: String,
    },
    /// An argument is missing.
    #[error("{command}: missing {what}")]
    Missing {
        /// The command.
        command: &'static str,
        /// What is missing.
        what: &'static str,
    },
    /// A word after the arguments that means nothing to the command.
    #[error("{command}: unexpected {word:?}")]
    Unexpected {
        /// The command.
        command: &'static str,
        /// The word.
        word: String,
    },
    /// A number that doesn't parse.
    #[error(transparent)]
    Number(#[from] NumberError),
    /// A command that can't run where it was asked to (`thread fork`, `child exit` inside
    /// `thread`, …).
    #[error("{command} can't run inside {within}")]
    NotNested {
        /// The inner command.
        command: &'static str,
        /// `thread`.
        within: &'static str,
    },
}

/// Which of the client's fds a command means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdRef {
    /// The control fd (`nvidiactl`; the newest copy after `dup`).
    Ctl,
    /// The UVM fd.
    Uvm,
    /// The GPU node opened at start.
    Gpu,
    /// An fd by number.
    Number(RawFd),
}

/// What `ioctl-raw` issues its ioctl on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A file opened for the call and closed after.
    Path(PathBuf),
    /// An fd the client holds.
    Fd(FdRef),
}

/// UVM commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UvmCommand {
    /// `UVM_INITIALIZE`.
    Init,
    /// `UVM_CREATE_EXTERNAL_RANGE`.
    Range {
        /// Start.
        base: u64,
        /// Length.
        length: u64,
    },
    /// `UVM_MAP_EXTERNAL_ALLOCATION`.
    Map {
        /// Start.
        base: u64,
        /// Length.
        length: u64,
        /// The RM client.
        client: u32,
        /// The RM memory handle.
        memory: u32,
    },
    /// `UVM_FREE`.
    Free {
        /// Start.
        base: u64,
        /// Length.
        length: u64,
    },
    /// `mmap` of the UVM fd (managed memory).
    Mmap {
        /// Length.
        length: u64,
    },
    /// `count` managed mappings of `length` each, left in place.
    MmapMany {
        /// How many.
        count: u32,
        /// Length of each.
        length: u64,
    },
    /// `munmap`.
    Munmap {
        /// Start.
        addr: u64,
        /// Length.
        length: u64,
    },
    /// Any command number, with zeroed params.
    Raw(u32),
}

/// What `allocmem` allocates (`RM_ALLOC_MEMORY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryClass {
    /// `NV01_MEMORY_SYSTEM`, host memory, not mapped.
    System,
    /// `NV01_MEMORY_SYSTEM_OS_DESCRIPTOR` over a buffer of the client's.
    OsDescriptor,
    /// `NV01_MEMORY_LOCAL_USER`: a view of the framebuffer (allocates nothing).
    LocalView,
}

/// Where `vidheap` allocates (`RM_VID_HEAP_CONTROL` `ALLOC_SIZE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeapKind {
    /// `NVOS32_ATTR_LOCATION_VIDMEM`.
    Video,
    /// `NVOS32_ATTR_LOCATION_PCI`.
    System,
    /// `NVOS32_ALLOC_FLAGS_VIRTUAL`.
    Virtual,
}

/// One line of the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `client`.
    Client,
    /// `device <client> <id>`.
    Device {
        /// `hRoot`.
        client: u32,
        /// `deviceId`.
        id: u32,
    },
    /// `device-many <client> <id> <count>`: `count` device objects on one GPU.
    DeviceMany {
        /// `hRoot`.
        client: u32,
        /// `deviceId`.
        id: u32,
        /// How many.
        count: u32,
    },
    /// `subdevice <client> <device>`.
    Subdevice {
        /// `hRoot`.
        client: u32,
        /// The device.
        device: u32,
    },
    /// `partition <client> <subdevice> <gpu-instance> <cap-fd>`.
    Partition {
        /// `hRoot`.
        client: u32,
        /// The subdevice.
        subdevice: u32,
        /// `swizzId`.
        gpu_instance: u32,
        /// `capDescriptor`.
        cap: FdRef,
    },
    /// `exec-partition <client> <partition> <compute-instance>`.
    ExecPartition {
        /// `hRoot`.
        client: u32,
        /// The partition reference.
        partition: u32,
        /// `execPartitionId`.
        compute_instance: u32,
    },
    /// `alloc <client> <parent> <size> [nvos21|nvos64] [v120|v128] [xfer]`.
    Alloc {
        /// `hRoot`.
        client: u32,
        /// A device or subdevice.
        parent: u32,
        /// Bytes asked for.
        bytes: u64,
        /// NVOS21 or NVOS64.
        form: Form,
        /// 120- or 128-byte params.
        layout: ParamsLayout,
        /// Direct or through `IOCTL_XFER_CMD`.
        via: Via,
    },
    /// `sysmem <client> <parent> <size>`.
    Sysmem {
        /// `hRoot`.
        client: u32,
        /// The parent.
        parent: u32,
        /// Bytes.
        bytes: u64,
    },
    /// `allocmem <client> <parent> <handle> <size> [system|osdesc|local]`.
    AllocMemory {
        /// `hRoot`.
        client: u32,
        /// The parent.
        parent: u32,
        /// The new handle.
        handle: u32,
        /// Bytes.
        bytes: u64,
        /// Which class.
        class: MemoryClass,
    },
    /// `vidheap <client> <parent> <size> [vidmem|sysmem|virtual]`.
    VidHeap {
        /// `hRoot`.
        client: u32,
        /// The parent (a device).
        parent: u32,
        /// Bytes.
        bytes: u64,
        /// Where.
        kind: HeapKind,
    },
    /// `vidheap-free <client> <parent> <handle>`.
    VidHeapFree {
        /// `hRoot`.
        client: u32,
        /// The parent.
        parent: u32,
        /// `hMemory`.
        handle: u32,
    },
    /// `virtual <client> <parent> <size>`.
    Virtual {
        /// `hRoot`.
        client: u32,
        /// The parent.
        parent: u32,
        /// Bytes of address space.
        bytes: u64,
    },
    /// `free <client> <parent> <handle> [xfer]`.
    Free {
        /// `hRoot`.
        client: u32,
        /// `hObjectParent`.
        parent: u32,
        /// `hObjectOld`.
        handle: u32,
        /// Direct or through `IOCTL_XFER_CMD`.
        via: Via,
    },
    /// `control <client> <object> <cmd>`.
    Control {
        /// `hClient`.
        client: u32,
        /// `hObject`.
        object: u32,
        /// The control command.
        cmd: u32,
    },
    /// `gpu-ids <client>`.
    GpuIds {
        /// `hClient`.
        client: u32,
    },
    /// `register-fd`.
    RegisterFd,
    /// `uvm …`.
    Uvm(UvmCommand),
    /// `open <path> [openat|open|creat|uring]`.
    Open {
        /// The file (a bare name is in the client's directory).
        path: PathBuf,
        /// Which call opens it.
        how: OpenHow,
    },
    /// `fd-socket <path>`: a datagram socket bound at `path` that `recv-fd` reads.
    FdSocket {
        /// Where to bind.
        path: PathBuf,
    },
    /// `send-fd <path> <fd>`: `fd` over `SCM_RIGHTS` to the socket bound at `path`.
    SendFd {
        /// The receiver's socket.
        path: PathBuf,
        /// The fd to send.
        fd: FdRef,
    },
    /// `recv-fd <socket fd>`: one fd from a socket made by `fd-socket`, held.
    RecvFd {
        /// The socket.
        socket: FdRef,
    },
    /// `getfd <pid> <fd>`: a copy of another process's fd (`pidfd_getfd`), held.
    GetFd {
        /// The other process.
        pid: u32,
        /// Its fd.
        fd: u32,
    },
    /// `dup-many <fd> <count>`: `count` copies of `fd`, left open and not held.
    DupMany {
        /// The fd to copy.
        fd: FdRef,
        /// How many copies.
        count: u32,
    },
    /// `dup [<fd>]`.
    Dup {
        /// The fd to copy.
        fd: FdRef,
    },
    /// `map <fd> <length>`.
    Map {
        /// The fd.
        fd: FdRef,
        /// Bytes.
        length: u64,
    },
    /// `close <fd>`.
    Close {
        /// The fd.
        fd: FdRef,
    },
    /// `close-range <first> <last>`.
    CloseRange {
        /// First fd.
        first: u32,
        /// Last fd.
        last: u32,
    },
    /// `use-ctl <fd>`.
    UseCtl {
        /// The fd.
        fd: FdRef,
    },
    /// `dup-to <fd> <min>`.
    DupTo {
        /// The fd to copy.
        fd: FdRef,
        /// The lowest number the copy may have.
        min: u32,
    },
    /// `ioctl-raw <path|fd> <cmd>`.
    IoctlRaw {
        /// Where.
        target: Target,
        /// The command.
        cmd: u32,
    },
    /// `thread <command…>`.
    Thread(Box<Command>),
    /// `fork`.
    Fork,
    /// `child <command…>`: the line after `child`, for the child to parse.
    Child(String),
    /// `wait-child` or `child exit`.
    WaitChild,
    /// `kill-child`.
    KillChild,
    /// `sleep <ms>`.
    Sleep {
        /// Milliseconds.
        ms: u64,
    },
    /// `pid`.
    Pid,
    /// `exec`.
    Exec,
    /// `exit`.
    Exit,
}

/// Parses one line.
///
/// # Errors
/// What is wrong with it.
#[expect(clippy::too_many_lines, reason = "one arm per script command")]
pub fn parse(line: &str) -> Result<Command, ParseError> {
    let mut words = line.split_whitespace();
    let Some(first) = words.next() else {
        return Err(ParseError::Empty);
    };
    let rest: Vec<&str> = words.collect();
    let args = Args {
        command: command_name(first).ok_or_else(|| ParseError::UnknownCommand {
            word: first.to_owned(),
        })?,
        words: &rest,
    };
    let command = match args.command {
        "client" => Command::Client,
        "device" => Command::Device {
            client: args.u32(0, "client")?,
            id: args.u32(1, "device id")?,
        },
        "device-many" => Command::DeviceMany {
            client: args.u32(0, "client")?,
            id: args.u32(1, "device id")?,
            count: args.u32(2, "count")?,
        },
        "subdevice" => Command::Subdevice {
            client: args.u32(0, "client")?,
            device: args.u32(1, "device")?,
        },
        "partition" => Command::Partition {
            client: args.u32(0, "client")?,
            subdevice: args.u32(1, "subdevice")?,
            gpu_instance: args.u32(2, "gpu instance")?,
            cap: fd_ref(args.word(3, "cap fd")?)?,
        },
        "exec-partition" => Command::ExecPartition {
            client: args.u32(0, "client")?,
            partition: args.u32(1, "partition")?,
            compute_instance: args.u32(2, "compute instance")?,
        },
        "alloc" => {
            let (mut form, mut layout, mut via) = Default::default();
            for &word in args.words.iter().skip(3) {
                match word {
                    "nvos21" => form = Form::Nvos21,
                    "nvos64" => form = Form::Nvos64,
                    "v120" => layout = ParamsLayout::V120,
                    "v128" => layout = ParamsLayout::V128,
                    "xfer" => via = Via::Xfer,
                    _ => return Err(args.unexpected(word)),
                }
            }
            return Ok(Command::Alloc {
                client: args.u32(0, "client")?,
                parent: args.u32(1, "parent")?,
                bytes: args.size(2, "size")?,
                form,
                layout,
                via,
            });
        }
        "sysmem" => Command::Sysmem {
            client: args.u32(0, "client")?,
            parent: args.u32(1, "parent")?,
            bytes: args.size(2, "size")?,
        },
        "allocmem" => {
            let class = match args.words.get(4) {
                None | Some(&"system") => MemoryClass::System,
                Some(&"osdesc") => MemoryClass::OsDescriptor,
                Some(&"local") => MemoryClass::LocalView,
                Some(word) => return Err(args.unexpected(word)),
            };
            args.at_most(5)?;
            return Ok(Command::AllocMemory {
                client: args.u32(0, "client")?,
                parent: args.u32(1, "parent")?,
                handle: args.u32(2, "handle")?,
                bytes: args.size(3, "size")?,
                class,
            });
        }
        "vidheap" => {
            let kind = match args.words.get(3) {
                None | Some(&"vidmem") => HeapKind::Video,
                Some(&"sysmem") => HeapKind::System,
                Some(&"virtual") => HeapKind::Virtual,
                Some(word) => return Err(args.unexpected(word)),
            };
            args.at_most(4)?;
            return Ok(Command::VidHeap {
                client: args.u32(0, "client")?,
                parent: args.u32(1, "parent")?,
                bytes: args.size(2, "size")?,
                kind,
            });
        }
        "vidheap-free" => Command::VidHeapFree {
            client: args.u32(0, "client")?,
            parent: args.u32(1, "parent")?,
            handle: args.u32(2, "handle")?,
        },
        "virtual" => Command::Virtual {
            client: args.u32(0, "client")?,
            parent: args.u32(1, "parent")?,
            bytes: args.size(2, "size")?,
        },
        "free" => {
            let via = match args.words.get(3) {
                None => Via::Direct,
                Some(&"xfer") => Via::Xfer,
                Some(word) => return Err(args.unexpected(word)),
            };
            args.at_most(4)?;
            return Ok(Command::Free {
                client: args.u32(0, "client")?,
                parent: args.u32(1, "parent")?,
                handle: args.u32(2, "handle")?,
                via,
            });
        }
        "control" => Command::Control {
            client: args.u32(0, "client")?,
            object: args.u32(1, "object")?,
            cmd: args.u32(2, "command")?,
        },
        "gpu-ids" => Command::GpuIds {
            client: args.u32(0, "client")?,
        },
        "register-fd" => Command::RegisterFd,
        "uvm" => return parse_uvm(&args),
        "open" => Command::Open {
            path: PathBuf::from(args.word(0, "path")?),
            how: match args.words.get(1) {
                None => OpenHow::default(),
                Some(word) => OpenHow::parse(word).ok_or_else(|| args.unexpected(word))?,
            },
        },
        "fd-socket" => Command::FdSocket {
            path: PathBuf::from(args.word(0, "path")?),
        },
        "send-fd" => Command::SendFd {
            path: PathBuf::from(args.word(0, "path")?),
            fd: fd_ref(args.word(1, "fd")?)?,
        },
        "recv-fd" => Command::RecvFd {
            socket: fd_ref(args.word(0, "socket fd")?)?,
        },
        "getfd" => Command::GetFd {
            pid: args.u32(0, "pid")?,
            fd: args.u32(1, "fd")?,
        },
        "dup-many" => Command::DupMany {
            fd: fd_ref(args.word(0, "fd")?)?,
            count: args.u32(1, "count")?,
        },
        "dup" => Command::Dup {
            fd: match args.words.first() {
                None => FdRef::Ctl,
                Some(word) => fd_ref(word)?,
            },
        },
        "close" => Command::Close {
            fd: fd_ref(args.word(0, "fd")?)?,
        },
        "map" => Command::Map {
            fd: fd_ref(args.word(0, "fd")?)?,
            length: args.size(1, "length")?,
        },
        "close-range" => Command::CloseRange {
            first: args.u32(0, "first fd")?,
            last: args.u32(1, "last fd")?,
        },
        "use-ctl" => Command::UseCtl {
            fd: fd_ref(args.word(0, "fd")?)?,
        },
        "dup-to" => Command::DupTo {
            fd: fd_ref(args.word(0, "fd")?)?,
            min: args.u32(1, "lowest fd")?,
        },
        "ioctl-raw" => {
            let target = args.word(0, "path or fd")?;
            Command::IoctlRaw {
                target: if target.contains('/') {
                    Target::Path(PathBuf::from(target))
                } else {
                    Target::Fd(fd_ref(target)?)
                },
                cmd: args.u32(1, "command")?,
            }
        }
        "thread" => {
            let inner = parse(&args.words.join(" "))?;
            if let Some(name) = process_level(&inner) {
                return Err(ParseError::NotNested {
                    command: name,
                    within: "thread",
                });
            }
            return Ok(Command::Thread(Box::new(inner)));
        }
        "fork" => Command::Fork,
        "child" => {
            let line = args.words.join(" ");
            return Ok(match parse(&line)? {
                Command::Exit => Command::WaitChild,
                _ => Command::Child(line),
            });
        }
        "wait-child" => Command::WaitChild,
        "kill-child" => Command::KillChild,
        "sleep" => Command::Sleep {
            ms: args.number(0, "milliseconds")?,
        },
        "pid" => Command::Pid,
        "exec" => Command::Exec,
        "exit" => Command::Exit,
        other => {
            return Err(ParseError::UnknownCommand {
                word: other.to_owned(),
            });
        }
    };
    args.at_most(arity(&command))?;
    Ok(command)
}

/// The commands, by their first word.
const COMMANDS: &[&str] = &[
    "client",
    "device",
    "device-many",
    "subdevice",
    "partition",
    "exec-partition",
    "alloc",
    "sysmem",
    "allocmem",
    "vidheap",
    "vidheap-free",
    "virtual",
    "free",
    "control",
    "gpu-ids",
    "register-fd",
    "uvm",
    "open",
    "fd-socket",
    "send-fd",
    "recv-fd",
    "getfd",
    "dup-many",
    "dup",
    "close",
    "map",
    "close-range",
    "use-ctl",
    "dup-to",
    "ioctl-raw",
    "thread",
    "fork",
    "child",
    "wait-child",
    "kill-child",
    "sleep",
    "pid",
    "exec",
    "exit",
];

fn command_name(word: &str) -> Option<&'static str> {
    COMMANDS.iter().copied().find(|&c| c == word)
}

/// How many words a fixed-shape command takes after its name.
fn arity(command: &Command) -> usize {
    match command {
        Command::Device { .. }
        | Command::Subdevice { .. }
        | Command::IoctlRaw { .. }
        | Command::CloseRange { .. }
        | Command::Map { .. }
        | Command::Open { .. }
        | Command::SendFd { .. }
        | Command::GetFd { .. }
        | Command::DupMany { .. }
        | Command::DupTo { .. } => 2,
        Command::Partition { .. } => 4,
        Command::Sysmem { .. }
        | Command::DeviceMany { .. }
        | Command::ExecPartition { .. }
        | Command::Virtual { .. }
        | Command::Control { .. }
        | Command::VidHeapFree { .. } => 3,
        Command::GpuIds { .. }
        | Command::FdSocket { .. }
        | Command::RecvFd { .. }
        | Command::Dup { .. }
        | Command::Close { .. }
        | Command::UseCtl { .. }
        | Command::Sleep { .. } => 1,
        _ => 0,
    }
}

/// The name of a command that acts on the process rather than the client.
fn process_level(command: &Command) -> Option<&'static str> {
    match command {
        Command::Fork => Some("fork"),
        Command::Child(_) => Some("child"),
        Command::WaitChild => Some("wait-child"),
        Command::KillChild => Some("kill-child"),
        Command::Exec => Some("exec"),
        Command::Exit => Some("exit"),
        _ => None,
    }
}

fn parse_uvm(args: &Args<'_>) -> Result<Command, ParseError> {
    let sub = args.word(0, "uvm command")?;
    let tail = Args {
        command: "uvm",
        words: &args.words[1..],
    };
    let (command, arity) = match sub {
        "init" => (UvmCommand::Init, 0),
        "range" => (
            UvmCommand::Range {
                base: tail.number(0, "base")?,
                length: tail.size(1, "length")?,
            },
            2,
        ),
        "map" => (
            UvmCommand::Map {
                base: tail.number(0, "base")?,
                length: tail.size(1, "length")?,
                client: tail.u32(2, "client")?,
                memory: tail.u32(3, "memory")?,
            },
            4,
        ),
        "free" => (
            UvmCommand::Free {
                base: tail.number(0, "base")?,
                length: match tail.words.get(1) {
                    Some(w) => size(w)?,
                    None => 0,
                },
            },
            2,
        ),
        "mmap" => (
            UvmCommand::Mmap {
                length: tail.size(0, "length")?,
            },
            1,
        ),
        "mmap-many" => (
            UvmCommand::MmapMany {
                count: tail.u32(0, "count")?,
                length: tail.size(1, "length")?,
            },
            2,
        ),
        "munmap" => (
            UvmCommand::Munmap {
                addr: tail.number(0, "address")?,
                length: tail.size(1, "length")?,
            },
            2,
        ),
        number => (UvmCommand::Raw(number32(number)?), 0),
    };
    tail.at_most(arity)?;
    Ok(Command::Uvm(command))
}

fn fd_ref(word: &str) -> Result<FdRef, ParseError> {
    Ok(match word {
        "ctl" => FdRef::Ctl,
        "uvm" => FdRef::Uvm,
        "gpu" => FdRef::Gpu,
        n => FdRef::Number(
            RawFd::try_from(number32(n)?)
                .map_err(|_| NumberError::TooLarge { word: n.to_owned() })?,
        ),
    })
}

/// The words after a command's name.
struct Args<'a> {
    command: &'static str,
    words: &'a [&'a str],
}

impl Args<'_> {
    fn word(&self, i: usize, what: &'static str) -> Result<&str, ParseError> {
        self.words.get(i).copied().ok_or(ParseError::Missing {
            command: self.command,
            what,
        })
    }

    fn u32(&self, i: usize, what: &'static str) -> Result<u32, ParseError> {
        Ok(number32(self.word(i, what)?)?)
    }

    fn number(&self, i: usize, what: &'static str) -> Result<u64, ParseError> {
        Ok(number(self.word(i, what)?)?)
    }

    fn size(&self, i: usize, what: &'static str) -> Result<u64, ParseError> {
        Ok(size(self.word(i, what)?)?)
    }

    fn unexpected(&self, word: &str) -> ParseError {
        ParseError::Unexpected {
            command: self.command,
            word: word.to_owned(),
        }
    }

    fn at_most(&self, n: usize) -> Result<(), ParseError> {
        match self.words.get(n) {
            Some(word) => Err(self.unexpected(word)),
            None => Ok(()),
        }
    }
}

/// A forked child and the pipes that drive it.
#[derive(Debug)]
struct Child {
    pid: libc::pid_t,
    to: std::fs::File,
    from: BufReader<std::fs::File>,
}

/// How [`Session::serve`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The input ended.
    Eof,
    /// `exit`: the caller should exit without cleaning up.
    Exit,
}

/// A client serving the protocol, with at most one forked child.
#[derive(Debug)]
pub struct Session {
    client: GpuClient,
    child: Option<Child>,
}

impl Session {
    /// A session on `client`.
    #[must_use]
    pub fn new(client: GpuClient) -> Self {
        Self {
            client,
            child: None,
        }
    }

    /// Answers lines from `input` on `output`, one line each, flushed, until EOF or `exit`.
    ///
    /// `fork` forks the calling process: call this from a single-threaded process (the
    /// `gpu-client` binary).
    ///
    /// # Errors
    /// Reading or writing failed.
    pub fn serve(&mut self, input: &mut dyn BufRead, output: &mut dyn Write) -> io::Result<Ended> {
        let mut line = String::new();
        loop {
            line.clear();
            if input.read_line(&mut line)? == 0 {
                return Ok(Ended::Eof);
            }
            let reply = match parse(&line) {
                Err(e) => format!("err {e}"),
                Ok(Command::Exit) => return Ok(Ended::Exit),
                Ok(command) => self.run(&command),
            };
            writeln!(output, "{reply}")?;
            output.flush()?;
        }
    }

    /// Runs one command; returns its reply line (without the newline).
    ///
    /// `exit` is answered `err`: ending the process is [`serve`](Self::serve)'s caller's job.
    pub fn run(&mut self, command: &Command) -> String {
        match command {
            Command::Fork => self.fork(),
            Command::Child(line) => self.child(line),
            Command::WaitChild => self.wait_child(),
            Command::KillChild => self.kill_child(),
            Command::Exit => "err exit is handled by serve".to_owned(),
            Command::Exec => exec_self(),
            other => execute(&mut self.client, other),
        }
    }

    fn fork(&mut self) -> String {
        if let Some(c) = &self.child {
            return format!("err child {} is still running", c.pid);
        }
        match self.spawn_child() {
            Ok(pid) => format!("ok pid={pid}"),
            Err(e) => errno_reply(&e),
        }
    }

    fn spawn_child(&mut self) -> io::Result<libc::pid_t> {
        let (child_in, to_child) = pipe()?;
        let (from_child, child_out) = pipe()?;
        // SAFETY: the process is single-threaded here (`thread` joins before replying), so the
        // child may go on using the allocator and the client.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            drop((to_child, from_child));
            let _ = self.serve(&mut BufReader::new(child_in), &mut { child_out });
            // SAFETY: leave at once, closing every fd: the parent's state (its stdin buffer, its
            // destructors) isn't the child's to flush.
            unsafe { libc::_exit(0) };
        }
        self.child = Some(Child {
            pid,
            to: to_child,
            from: BufReader::new(from_child),
        });
        Ok(pid)
    }

    fn child(&mut self, line: &str) -> String {
        let Some(c) = self.child.as_mut() else {
            return "err no child".to_owned();
        };
        let mut reply = String::new();
        let asked = writeln!(c.to, "{line}").and_then(|()| c.to.flush());
        match asked.and_then(|()| c.from.read_line(&mut reply)) {
            Ok(n) if n > 0 => format!("child: {}", reply.trim_end()),
            _ => "err the child is gone".to_owned(),
        }
    }

    fn wait_child(&mut self) -> String {
        let Some(mut c) = self.child.take() else {
            return "err no child".to_owned();
        };
        let _ = writeln!(c.to, "exit").and_then(|()| c.to.flush());
        drop(c.to);
        reap(c.pid)
    }

    fn kill_child(&mut self) -> String {
        let Some(c) = self.child.take() else {
            return "err no child".to_owned();
        };
        // SAFETY: signalling our own child.
        unsafe { libc::kill(c.pid, libc::SIGKILL) };
        match reap(c.pid) {
            r if r.starts_with("ok") => "ok".to_owned(),
            r => r,
        }
    }
}

fn reap(pid: libc::pid_t) -> String {
    let mut status = 0;
    // SAFETY: waiting for our own child.
    if unsafe { libc::waitpid(pid, &raw mut status, 0) } < 0 {
        return errno_reply(&io::Error::last_os_error());
    }
    if libc::WIFEXITED(status) {
        format!("ok status={}", libc::WEXITSTATUS(status))
    } else {
        format!("ok signal={}", libc::WTERMSIG(status))
    }
}

fn pipe() -> io::Result<(std::fs::File, std::fs::File)> {
    let mut fds = [0; 2];
    // SAFETY: a valid array of two fds.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fds nobody else owns.
    Ok(unsafe {
        (
            OwnedFd::from_raw_fd(fds[0]).into(),
            OwnedFd::from_raw_fd(fds[1]).into(),
        )
    })
}

fn errno_reply(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => format!("err errno={n} {e}"),
        None => format!("err {e}"),
    }
}

fn rm_reply(result: Result<String, RmError>) -> String {
    match result {
        Ok(reply) => reply,
        Err(RmError::Status { status }) => format!("err status={status:#x}"),
        Err(RmError::Ioctl { source, .. }) => errno_reply(&source),
    }
}

/// Holds an fd a command obtained and answers its number.
fn held_reply(client: &mut GpuClient, result: io::Result<OwnedFd>) -> String {
    match result {
        Ok(fd) => format!("ok fd={}", client.adopt(fd)),
        Err(e) => errno_reply(&e),
    }
}

fn client_reply(result: Result<String, ClientError>) -> String {
    match result {
        Ok(reply) => reply,
        Err(ClientError::Open { source, .. } | ClientError::Dup { source, .. }) => {
            errno_reply(&source)
        }
        Err(e @ ClientError::NotOpen { .. }) => format!("err {e}"),
    }
}

fn resolve(client: &GpuClient, fd: FdRef) -> Result<RawFd, ClientError> {
    match fd {
        FdRef::Ctl => client.ctl_fd().ok_or(ClientError::NotOpen { fd: -1 }),
        FdRef::Uvm => client.uvm_fd().ok_or(ClientError::NotOpen { fd: -1 }),
        FdRef::Gpu => client
            .gpu_fd(client.gpu)
            .ok_or(ClientError::NotOpen { fd: -1 }),
        FdRef::Number(n) => Ok(n),
    }
}

/// A file named on a command line: a bare name is in the client's directory.
fn in_dir(client: &GpuClient, path: &Path) -> PathBuf {
    if path.components().count() == 1 && !path.has_root() {
        client.dir.join(path)
    } else {
        path.to_owned()
    }
}

/// Runs a command that needs only the client (everything but `fork`, `child`, `wait-child`,
/// `kill-child` and `exit`, which answer `err`); returns the reply line.
#[expect(clippy::too_many_lines, reason = "one arm per script command")]
pub fn execute(client: &mut GpuClient, command: &Command) -> String {
    let handle = |h: u32| format!("ok handle={h:#x}");
    match command {
        Command::Client => rm_reply(client.alloc_client().map(|h| format!("ok client={h:#x}"))),
        Command::Device { client: c, id } => rm_reply(client.alloc_device(*c, *id).map(handle)),
        Command::DeviceMany {
            client: c,
            id,
            count,
        } => {
            let mut made = 0u32;
            let mut last = 0;
            while made < *count {
                match client.alloc_device(*c, *id) {
                    Ok(h) => last = h,
                    Err(e) => return format!("{} made={made}", rm_reply(Err(e))),
                }
                made += 1;
            }
            format!("ok made={made} last={last:#x}")
        }
        Command::Subdevice { client: c, device } => {
            rm_reply(client.alloc_subdevice(*c, *device).map(handle))
        }
        Command::Partition {
            client: c,
            subdevice,
            gpu_instance,
            cap,
        } => match resolve(client, *cap) {
            Ok(fd) => rm_reply(
                client
                    .alloc_partition(*c, *subdevice, *gpu_instance, fd)
                    .map(handle),
            ),
            Err(e) => format!("err {e}"),
        },
        Command::ExecPartition {
            client: c,
            partition,
            compute_instance,
        } => rm_reply(
            client
                .alloc_exec_partition(*c, *partition, *compute_instance)
                .map(handle),
        ),
        Command::Alloc {
            client: c,
            parent,
            bytes,
            form,
            layout,
            via,
        } => {
            let result = match via {
                Via::Direct => client.alloc_vidmem(*c, *parent, *bytes, *form, *layout),
                Via::Xfer => client.alloc_vidmem_xfer(*c, *parent, *bytes, *form, *layout),
            };
            rm_reply(result.map(|(h, size)| format!("ok handle={h:#x} size={size}")))
        }
        Command::Sysmem {
            client: c,
            parent,
            bytes,
        } => rm_reply(client.alloc_sysmem(*c, *parent, *bytes).map(handle)),
        Command::Virtual {
            client: c,
            parent,
            bytes,
        } => rm_reply(client.alloc_virtual(*c, *parent, *bytes).map(handle)),
        Command::AllocMemory {
            client: c,
            parent,
            handle: h,
            bytes,
            class: which,
        } => {
            let host = (nvos02::LOCATION_PCI << nvos02::FLAGS_LOCATION_SHIFT)
                | (nvos02::MAPPING_NO_MAP << nvos02::FLAGS_MAPPING_SHIFT);
            let (class, flags, memory) = match which {
                MemoryClass::System => (class::MEMORY_SYSTEM, host, 0),
                // The buffer the descriptor wraps lives as long as the process.
                MemoryClass::OsDescriptor => {
                    let len = usize::try_from(*bytes).unwrap_or(0);
                    let buffer: &'static mut [u8] = vec![0u8; len].leak();
                    (
                        class::MEMORY_SYSTEM_OS_DESCRIPTOR,
                        host,
                        buffer.as_mut_ptr() as u64,
                    )
                }
                MemoryClass::LocalView => (
                    class::MEMORY_LOCAL_USER,
                    nvos02::LOCATION_VIDMEM << nvos02::FLAGS_LOCATION_SHIFT,
                    0,
                ),
            };
            let r = AllocMemory {
                client: *c,
                parent: *parent,
                handle: *h,
                class,
                flags,
                memory,
                bytes: *bytes,
            };
            rm_reply(
                client
                    .alloc_memory(r)
                    .map(|limit| format!("ok handle={h:#x} limit={limit:#x}")),
            )
        }
        Command::VidHeap {
            client: c,
            parent,
            bytes,
            kind,
        } => {
            let location = |l: u32| l << nvos32::ATTR_LOCATION_SHIFT;
            let how = match kind {
                HeapKind::Video => (location(nvos32::LOCATION_VIDMEM), 0),
                HeapKind::System => (location(nvos32::LOCATION_PCI), 0),
                HeapKind::Virtual => (0, nvos32::FLAGS_VIRTUAL),
            };
            rm_reply(
                client
                    .vid_heap_alloc(*c, *parent, *bytes, how)
                    .map(|(h, size)| format!("ok handle={h:#x} size={size}")),
            )
        }
        Command::VidHeapFree {
            client: c,
            parent,
            handle: h,
        } => rm_reply(client.vid_heap_free(*c, *parent, *h).map(|()| ok())),
        Command::Free {
            client: c,
            parent,
            handle: h,
            via,
        } => rm_reply(client.free_via(*c, *parent, *h, *via).map(|()| ok())),
        Command::Control {
            client: c,
            object,
            cmd,
        } => rm_reply(client.control(*c, *object, *cmd).map(|()| ok())),
        Command::GpuIds { client: c } => rm_reply(client.attached_gpu_ids(*c).map(|ids| {
            let mut reply = "ok ids=".to_owned();
            for (i, id) in ids.iter().enumerate() {
                let sep = if i == 0 { "" } else { "," };
                let _ = write!(reply, "{sep}{id:#x}");
            }
            reply
        })),
        Command::RegisterFd => rm_reply(client.register_fd(client.gpu).map(|()| ok())),
        Command::Uvm(uvm) => rm_reply(match *uvm {
            UvmCommand::Init => client.uvm_initialize().map(|()| ok()),
            UvmCommand::Range { base, length } => client
                .uvm_create_external_range(base, length)
                .map(|()| ok()),
            UvmCommand::Map {
                base,
                length,
                client: c,
                memory,
            } => client
                .uvm_map_external_allocation(base, length, c, memory)
                .map(|()| ok()),
            UvmCommand::Free { base, length } => client.uvm_free(base, length).map(|()| ok()),
            // Not ioctls: a failed system call answers its errno the same way.
            UvmCommand::Mmap { length } => client
                .uvm_mmap(length)
                .map(|addr| format!("ok addr={addr:#x}"))
                .map_err(|source| RmError::Ioctl { cmd: 0, source }),
            UvmCommand::MmapMany { count, length } => {
                let mut made = 0u32;
                while made < count {
                    if let Err(e) = client.uvm_mmap(length) {
                        return format!("{} made={made}", errno_reply(&e));
                    }
                    made += 1;
                }
                Ok(format!("ok made={made}"))
            }
            UvmCommand::Munmap { addr, length } => client
                .munmap(addr, length)
                .map(|()| ok())
                .map_err(|source| RmError::Ioctl { cmd: 0, source }),
            UvmCommand::Raw(cmd) => {
                let mut params = vec![0u8; RAW_BUFFER];
                client
                    .uvm_raw(cmd, &mut params)
                    .map(|ret| format!("ok ret={ret}"))
            }
        }),
        Command::Open { path, how } => {
            let path = in_dir(client, path);
            let opened = obtain::open(&path, *how).map_err(|source| ClientError::Open {
                path: path.clone(),
                source,
            });
            client_reply(opened.map(|fd| format!("ok fd={}", client.adopt(fd))))
        }
        Command::FdSocket { path } => held_reply(client, obtain::fd_socket(path)),
        Command::SendFd { path, fd } => match resolve(client, *fd) {
            Ok(fd) => match obtain::send_fd(path, fd) {
                Ok(()) => ok(),
                Err(e) => errno_reply(&e),
            },
            Err(e) => client_reply(Err(e)),
        },
        Command::RecvFd { socket } => match resolve(client, *socket) {
            Ok(socket) => held_reply(client, obtain::recv_fd(socket)),
            Err(e) => client_reply(Err(e)),
        },
        Command::GetFd { pid, fd } => held_reply(
            client,
            obtain::take_fd(*pid, RawFd::try_from(*fd).unwrap_or(RawFd::MAX)),
        ),
        Command::DupMany { fd, count } => match resolve(client, *fd) {
            Ok(fd) => match obtain::dup_many(fd, *count) {
                Ok((first, last)) => format!("ok first={first} last={last}"),
                Err(e) => errno_reply(&e),
            },
            Err(e) => client_reply(Err(e)),
        },
        Command::Dup { fd } => client_reply(
            resolve(client, *fd)
                .and_then(|fd| client.dup(fd))
                .map(|fd| format!("ok fd={fd}")),
        ),
        Command::Close { fd } => client_reply(
            resolve(client, *fd)
                .and_then(|fd| client.close(fd))
                .map(|()| ok()),
        ),
        Command::Map { fd, length } => match resolve(client, *fd) {
            Ok(fd) => match client.map_fd(fd, *length) {
                Ok(addr) => format!("ok addr={addr:#x}"),
                Err(e) => errno_reply(&e),
            },
            Err(e) => client_reply(Err(e)),
        },
        Command::CloseRange { first, last } => match client.close_range(*first, *last) {
            Ok(()) => ok(),
            Err(e) => errno_reply(&e),
        },
        Command::UseCtl { fd } => client_reply(
            resolve(client, *fd)
                .and_then(|fd| client.use_as_ctl(fd))
                .map(|()| ok()),
        ),
        Command::DupTo { fd, min } => client_reply(
            resolve(client, *fd)
                .and_then(|fd| client.dup_at_least(fd, RawFd::try_from(*min).unwrap_or(RawFd::MAX)))
                .map(|fd| format!("ok fd={fd}")),
        ),
        Command::IoctlRaw { target, cmd } => raw(client, target, *cmd),
        Command::Thread(inner) => std::thread::scope(|s| {
            s.spawn(move || execute(client, inner))
                .join()
                .unwrap_or_else(|_| "err the thread panicked".to_owned())
        }),
        Command::Sleep { ms } => {
            std::thread::sleep(Duration::from_millis(*ms));
            ok()
        }
        Command::Pid => format!("ok pid={}", std::process::id()),
        Command::Fork
        | Command::Child(_)
        | Command::WaitChild
        | Command::KillChild
        | Command::Exec
        | Command::Exit => "err only a session runs process commands".to_owned(),
    }
}

/// Large enough for any `_IOC` size (14 bits) and any UVM params struct.
const RAW_BUFFER: usize = 16 << 10;

/// Replaces the process with a fresh `gpu-client` of the same arguments (its fds, opened
/// close-on-exec as libcuda opens them, close); returns only the error if the exec failed.
fn exec_self() -> String {
    use std::os::unix::process::CommandExt as _;
    let e = std::process::Command::new("/proc/self/exe")
        .args(std::env::args_os().skip(1))
        .exec();
    errno_reply(&e)
}

fn ok() -> String {
    "ok".to_owned()
}

fn raw(client: &GpuClient, target: &Target, cmd: u32) -> String {
    let opened;
    let fd = match target {
        Target::Path(path) => match super::open_rw(&in_dir(client, path)) {
            Ok(fd) => {
                opened = fd;
                std::os::fd::AsRawFd::as_raw_fd(&opened)
            }
            Err(e) => return client_reply(Err(e)),
        },
        Target::Fd(fd) => match resolve(client, *fd) {
            Ok(fd) => fd,
            Err(e) => return client_reply(Err(e)),
        },
    };
    let mut params = vec![0u8; RAW_BUFFER];
    match ioctl_raw(fd, cmd, &mut params) {
        Ok(ret) => format!("ok ret={ret}"),
        Err(e) => format!("ok ret=-1 errno={}", e.raw_os_error().unwrap_or(0)),
    }
}

#[cfg(test)]
mod tests;
