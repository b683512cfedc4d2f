//! `cuda-process --dir DEV --ckpt-dir DIR [--gpu N] --alloc SIZE…`: a fake CUDA process that
//! the stand-in `libcuda.so.1` (`tests/fixtures/fake-libcuda/libcuda.c`) can checkpoint.
//!
//! It allocates video memory through the fake driver at `DEV` (one allocation per `--alloc`,
//! sizes with `k`/`m`/`g`), fills a "device copy" of each with data derived from its pid, and
//! serves the driver's checkpoint channel on `DIR/<pid>.sock` from a thread of its own, as
//! libcuda does inside a real process: `lock` blocks its CUDA calls, `checkpoint` copies the
//! data to the host file `DIR/<pid>.img` and frees every allocation (`RM_FREE`, so the agent's
//! eBPF accounting sees the bytes go), `restore` allocates them again and reads the data back,
//! `unlock` lets CUDA calls run. `restore OLD:NEW…` (GPU indexes, the stand-in's reading of the
//! driver's GPU pairs) allocates them on GPU `NEW` instead, through that GPU's node, when the
//! process was on `OLD`; pairs that leave its GPU out are refused (`CUDA_ERROR_INVALID_VALUE`).
//!
//! It prints `ready pid=<pid> checksum=<hex>` and answers stdin lines: `checksum` (a CUDA call:
//! waits while locked) → `ok checksum=<hex>`; `exit` ends it.

use std::{
    io::{BufRead, BufReader, Read as _, Write},
    os::unix::net::UnixListener,
    path::PathBuf,
    process::ExitCode,
    sync::{Arc, Condvar, Mutex, PoisonError},
    time::Duration,
};

use gpuwarden_tests::gpu_client::{Form, GpuClient, ParamsLayout};

/// Bytes of each allocation whose contents are kept and checkpointed (the rest is not
/// modelled: a host file of the full size would only cost the test's disk).
const CONTENT: u64 = 1 << 20;

/// `CUDA_ERROR_INVALID_VALUE`: GPU pairs that do not cover the process's GPU.
const INVALID_VALUE: u32 = 1;
/// `CUDA_ERROR_ILLEGAL_STATE`: a call out of order.
const ILLEGAL_STATE: u32 = 401;
/// `CUDA_ERROR_UNKNOWN`.
const UNKNOWN: u32 = 999;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Locked,
    Checkpointed,
}

impl State {
    fn word(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Locked => "locked",
            Self::Checkpointed => "checkpointed",
        }
    }
}

/// One allocation: its handle while on the GPU, its size, its contents while on the GPU.
struct Allocation {
    handle: Option<u32>,
    size: u64,
    data: Vec<u8>,
}

struct Process {
    gpu: GpuClient,
    /// The fake driver's directory, where another GPU's node is opened on a move.
    dev: PathBuf,
    /// The GPU its memory is on.
    index: u32,
    client: u32,
    device: u32,
    allocations: Vec<Allocation>,
    state: State,
    image: PathBuf,
}

impl Process {
    fn checksum(&self) -> u64 {
        // FNV-1a over every allocation's contents.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.allocations.iter().flat_map(|a| &a.data) {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        h
    }

    fn checkpoint(&mut self) -> Result<(), String> {
        let mut image = Vec::new();
        for a in &self.allocations {
            image.extend_from_slice(&a.data);
        }
        std::fs::write(&self.image, &image).map_err(|e| format!("host image: {e}"))?;
        for a in &mut self.allocations {
            if let Some(h) = a.handle.take() {
                self.gpu
                    .free(self.client, self.device, h)
                    .map_err(|e| e.to_string())?;
            }
            a.data = Vec::new();
        }
        Ok(())
    }

    /// Moves the process to GPU `to` (its memory is on the host now): that GPU's node opened,
    /// a client and device on it, the old GPU's files closed.
    fn move_to(&mut self, to: u32) -> Result<(), String> {
        let gpu = GpuClient::open_on(&self.dev, to).map_err(|e| e.to_string())?;
        let client = gpu.alloc_client().map_err(|e| e.to_string())?;
        let device = gpu.alloc_device(client, to).map_err(|e| e.to_string())?;
        (self.gpu, self.client, self.device, self.index) = (gpu, client, device, to);
        Ok(())
    }

    fn restore(&mut self) -> Result<(), String> {
        let mut image = Vec::new();
        std::fs::File::open(&self.image)
            .and_then(|mut f| f.read_to_end(&mut image))
            .map_err(|e| format!("host image: {e}"))?;
        let mut at = 0;
        for a in &mut self.allocations {
            let (h, _) = self
                .gpu
                .alloc_vidmem(
                    self.client,
                    self.device,
                    a.size,
                    Form::Nvos21,
                    ParamsLayout::V128,
                )
                .map_err(|e| e.to_string())?;
            a.handle = Some(h);
            let n = usize::try_from(a.size.min(CONTENT)).unwrap_or(0);
            a.data = image.get(at..at + n).ok_or("short host image")?.to_vec();
            at += n;
        }
        let _ = std::fs::remove_file(&self.image);
        Ok(())
    }
}

type Shared = Arc<(Mutex<Process>, Condvar)>;

/// Answers one checkpoint request line.
fn serve_one(shared: &Shared, request: &str) -> String {
    let (lock, turned) = &**shared;
    let mut p = lock.lock().unwrap_or_else(PoisonError::into_inner);
    let word = request.split_whitespace().next().unwrap_or("");
    let next = match (word, p.state) {
        ("state", s) => Ok(s),
        ("lock", State::Running) => Ok(State::Locked),
        ("checkpoint", State::Locked) => p
            .checkpoint()
            .map(|()| State::Checkpointed)
            .map_err(|e| (UNKNOWN, e)),
        ("restore", State::Checkpointed) => {
            let pairs: Option<Vec<(u32, u32)>> = request
                .split_whitespace()
                .skip(1)
                .map(|pair| {
                    let (old, new) = pair.split_once(':')?;
                    Some((old.parse().ok()?, new.parse().ok()?))
                })
                .collect();
            let to = match pairs {
                None => Err((INVALID_VALUE, format!("unreadable pairs in {request:?}"))),
                Some(pairs) if pairs.is_empty() => Ok(p.index),
                Some(pairs) => pairs
                    .iter()
                    .find(|(old, _)| *old == p.index)
                    .map(|&(_, new)| new)
                    .ok_or((INVALID_VALUE, format!("no pair covers GPU {}", p.index))),
            };
            to.and_then(|to| {
                if to == p.index {
                    Ok(())
                } else {
                    p.move_to(to).map_err(|e| (UNKNOWN, e))
                }
            })
            .and_then(|()| p.restore().map_err(|e| (UNKNOWN, e)))
            .map(|()| State::Locked)
        }
        ("unlock", State::Locked) => Ok(State::Running),
        _ => Err((ILLEGAL_STATE, format!("{request} while {}", p.state.word()))),
    };
    match next {
        Ok(state) => {
            p.state = state;
            turned.notify_all();
            format!("ok {}", state.word())
        }
        Err((code, why)) => {
            eprintln!("cuda-process: {why}");
            format!("err {code}")
        }
    }
}

fn size(text: &str) -> Option<u64> {
    let (digits, unit) = match text.char_indices().last()? {
        (i, 'k') => (&text[..i], 1 << 10),
        (i, 'm') => (&text[..i], 1 << 20),
        (i, 'g') => (&text[..i], 1 << 30),
        _ => (text, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

fn start() -> Result<Shared, String> {
    let (mut dev, mut ckpt, mut gpu_index, mut sizes) = (None, None, 0, Vec::new());
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--dir" => dev = Some(PathBuf::from(value)),
            "--ckpt-dir" => ckpt = Some(PathBuf::from(value)),
            "--gpu" => gpu_index = value.parse().map_err(|_| "bad --gpu")?,
            "--alloc" => sizes.push(size(&value).ok_or("bad --alloc")?),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    let (dev, ckpt) = dev.zip(ckpt).ok_or("--dir and --ckpt-dir are required")?;
    let gpu = GpuClient::open_on(&dev, gpu_index).map_err(|e| e.to_string())?;
    let client = gpu.alloc_client().map_err(|e| e.to_string())?;
    let device = gpu
        .alloc_device(client, gpu_index)
        .map_err(|e| e.to_string())?;
    let pid = std::process::id();
    let mut seed = u64::from(pid) | 1;
    let mut allocations = Vec::new();
    for s in sizes {
        let (h, size) = gpu
            .alloc_vidmem(client, device, s, Form::Nvos21, ParamsLayout::V128)
            .map_err(|e| e.to_string())?;
        let n = usize::try_from(size.min(CONTENT)).unwrap_or(0);
        let data = (0..n)
            .map(|_| {
                // xorshift64: contents no two processes share.
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed.to_le_bytes()[0]
            })
            .collect();
        allocations.push(Allocation {
            handle: Some(h),
            size,
            data,
        });
    }
    let listener = UnixListener::bind(ckpt.join(format!("{pid}.sock")))
        .map_err(|e| format!("checkpoint socket: {e}"))?;
    let shared: Shared = Arc::new((
        Mutex::new(Process {
            gpu,
            dev,
            index: gpu_index,
            client,
            device,
            allocations,
            state: State::Running,
            image: ckpt.join(format!("{pid}.img")),
        }),
        Condvar::new(),
    ));
    let served = Arc::clone(&shared);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut line = String::new();
            let mut reader = BufReader::new(&stream);
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let answer = serve_one(&served, line.trim());
            let _ = writeln!(&stream, "{answer}");
        }
    });
    Ok(shared)
}

fn main() -> ExitCode {
    let shared = match start() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cuda-process: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (lock, turned) = &*shared;
    let mut out = std::io::stdout().lock();
    let checksum = lock
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .checksum();
    if writeln!(
        out,
        "ready pid={} checksum={checksum:x}",
        std::process::id()
    )
    .and_then(|()| out.flush())
    .is_err()
    {
        return ExitCode::FAILURE;
    }
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let reply = match line.trim() {
            "checksum" => {
                // A CUDA call: it blocks while the process is locked or checkpointed.
                let mut p = lock.lock().unwrap_or_else(PoisonError::into_inner);
                while p.state != State::Running {
                    p = turned
                        .wait_timeout(p, Duration::from_secs(1))
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                format!("ok checksum={:x}", p.checksum())
            }
            "exit" => return ExitCode::SUCCESS,
            other => format!("err unknown command {other:?}"),
        };
        if writeln!(out, "{reply}").and_then(|()| out.flush()).is_err() {
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
