//! The eBPF sensor: loading gpuwarden's programs, choosing and attaching their hooks, and the
//! maps they fill.
//!
//! A [`Sensor`] is the programs, links and maps managed as one unit: [`Sensor::load`] probes
//! what the kernel allows ([`probe`]), patches the load-time [`Config`], loads the object
//! embedded in the agent binary and attaches every program; dropping it detaches them.

pub mod probe;
pub mod tracefs;

use std::path::Path;

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, MapError, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{ProgramError, TracePoint},
};
use gpuwarden_agent_common::{
    config::{CONFIG_SYMBOL, Config},
    maps::{
        Allocation, CgroupDeviceKey, ClientInfo, FdKey, GpuNode, HandleKey, IoctlKey, PathKey,
        ProcInfo,
    },
};
use serde::{Deserialize, Serialize};

pub use probe::{Probe, Tier};

/// The programs, compiled by `agent/build.rs` and embedded so the agent ships as one file.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gpuwarden.bpf.o"));

/// Errors while loading and attaching the sensor.
#[derive(Debug, thiserror::Error)]
pub enum SensorError {
    /// tracefs is not mounted and could not be mounted.
    #[error(transparent)]
    Tracefs(#[from] tracefs::TracefsError),
    /// The kernel refused the object.
    #[error("loading the eBPF object failed (are you root, with CAP_BPF and CAP_PERFMON?)")]
    Load(#[source] Box<aya::EbpfError>),
    /// The object lacks a program the agent expects (a build mismatch).
    #[error("the eBPF object has no program {name:?}")]
    MissingProgram {
        /// The program.
        name: &'static str,
    },
    /// The object lacks a map the agent expects (a build mismatch).
    #[error("the eBPF object has no map {name:?}")]
    MissingMap {
        /// The map.
        name: &'static str,
    },
    /// A map has another type than the agent expects.
    #[error("map {name:?}: {source}")]
    Map {
        /// The map.
        name: &'static str,
        /// What is wrong.
        #[source]
        source: MapError,
    },
    /// The verifier refused a program or it could not be attached.
    #[error("program {name:?} ({target}): {source}")]
    Program {
        /// The program.
        name: &'static str,
        /// Where it attaches.
        target: String,
        /// Why it failed.
        #[source]
        source: Box<ProgramError>,
    },
}

/// A program and the tracepoint it attaches to.
struct TracepointProgram {
    name: &'static str,
    category: &'static str,
    /// Some kernels lack the syscall (e.g. `fork` on arm64); the table stays complete without it.
    optional: bool,
}

const fn tp(name: &'static str, category: &'static str, optional: bool) -> TracepointProgram {
    TracepointProgram {
        name,
        category,
        optional,
    }
}

/// Every program of the tracepoint tier, in attach order: fd-table maintenance before the
/// ioctl hooks so no ioctl is seen on an fd the table can't know.
const TRACEPOINTS: &[TracepointProgram] = &[
    tp("sys_enter_openat", "syscalls", false),
    tp("sys_exit_openat", "syscalls", false),
    tp("sys_enter_openat2", "syscalls", true),
    tp("sys_exit_openat2", "syscalls", true),
    tp("sys_enter_close", "syscalls", false),
    tp("sys_enter_dup", "syscalls", false),
    tp("sys_exit_dup", "syscalls", false),
    tp("sys_enter_dup2", "syscalls", true),
    tp("sys_exit_dup2", "syscalls", true),
    tp("sys_enter_dup3", "syscalls", false),
    tp("sys_exit_dup3", "syscalls", false),
    tp("sys_enter_fcntl", "syscalls", false),
    tp("sys_exit_fcntl", "syscalls", false),
    tp("sys_enter_clone", "syscalls", false),
    tp("sys_enter_clone3", "syscalls", true),
    tp("sys_enter_fork", "syscalls", true),
    tp("sys_enter_vfork", "syscalls", true),
    tp("sched_process_fork", "sched", false),
    tp("sched_process_exec", "sched", false),
    tp("sched_process_exit", "sched", false),
    tp("sys_exit_ioctl", "syscalls", false),
    tp("sys_enter_ioctl", "syscalls", false),
];

/// Forwards the programs' aya-log records to the `log` facade (bridged to `tracing`).
pub type KernelLogger = aya_log::EbpfLogger<&'static dyn log::Log>;

/// A hook as reported in snapshots and logs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hook {
    /// Program name.
    pub program: String,
    /// Program type (`tracepoint`, …).
    pub kind: String,
    /// What it attaches to.
    pub target: String,
}

/// The typed maps the agent reads and writes.
pub struct SensorMaps {
    /// GPU device-node paths to track.
    pub gpu_paths: HashMap<MapData, PathKey, GpuNode>,
    /// Open GPU fds.
    pub gpu_fds: HashMap<MapData, FdKey, GpuNode>,
    /// Processes holding GPU fds.
    pub procs: HashMap<MapData, u32, ProcInfo>,
    /// RM clients holding counted memory.
    pub clients: HashMap<MapData, u32, ClientInfo>,
    /// Counted allocations.
    pub allocations: HashMap<MapData, HandleKey, Allocation>,
    /// GPU index of device objects.
    pub object_devices: HashMap<MapData, HandleKey, u32>,
    /// Video memory by (cgroup, GPU).
    pub cgroup_memory: HashMap<MapData, CgroupDeviceKey, u64>,
    /// ioctl counts by (cgroup, device, family, command), per CPU.
    pub ioctl_counts: PerCpuHashMap<MapData, IoctlKey, u64>,
    /// Statistics, per CPU.
    pub stats: PerCpuArray<MapData, u64>,
}

/// Loaded and attached programs with their maps.
pub struct Sensor {
    /// Owns the programs and their links; dropping it detaches everything.
    ebpf: Ebpf,
    /// The maps.
    pub maps: SensorMaps,
    /// The ring buffer of events, for the event reader to take.
    pub events: Option<RingBuf<MapData>>,
    /// What was probed and chosen.
    pub probe: Probe,
    /// Attached programs.
    pub hooks: Vec<Hook>,
}

impl Sensor {
    /// Probes the kernel, loads the programs with `alloc_event_min_bytes`, and attaches them.
    ///
    /// # Errors
    /// Any step that fails, naming the program or map.
    pub fn load(alloc_event_min_bytes: u64) -> Result<Self, SensorError> {
        raise_memlock_limit();
        let tracefs = tracefs::ensure_mounted()?;
        let probe = probe::probe(Path::new("/sys"));
        let config = Config {
            alloc_event_min_bytes,
            ..tracefs::config_offsets(&tracefs)
        };
        let mut ebpf = EbpfLoader::new()
            .override_global(CONFIG_SYMBOL, &config, true)
            .load(OBJECT)
            .map_err(|e| SensorError::Load(Box::new(e)))?;
        let mut hooks = Vec::new();
        for program in TRACEPOINTS {
            let target = format!("{}/{}", program.category, program.name);
            if program.optional
                && !tracefs
                    .join("events")
                    .join(program.category)
                    .join(program.name)
                    .exists()
            {
                tracing::info!(%target, "tracepoint not in this kernel; skipped");
                continue;
            }
            let wrap = |source: ProgramError| SensorError::Program {
                name: program.name,
                target: target.clone(),
                source: Box::new(source),
            };
            let tp: &mut TracePoint = ebpf
                .program_mut(program.name)
                .ok_or(SensorError::MissingProgram { name: program.name })?
                .try_into()
                .map_err(wrap)?;
            tp.load().map_err(wrap)?;
            tp.attach(program.category, program.name).map_err(wrap)?;
            hooks.push(Hook {
                program: program.name.to_owned(),
                kind: "tracepoint".to_owned(),
                target,
            });
        }
        let maps = SensorMaps {
            gpu_paths: take(&mut ebpf, "GPU_PATHS")?,
            gpu_fds: take(&mut ebpf, "GPU_FDS")?,
            procs: take(&mut ebpf, "PROCS")?,
            clients: take(&mut ebpf, "CLIENTS")?,
            allocations: take(&mut ebpf, "ALLOCATIONS")?,
            object_devices: take(&mut ebpf, "OBJECT_DEVICES")?,
            cgroup_memory: take(&mut ebpf, "CGROUP_MEMORY")?,
            ioctl_counts: take(&mut ebpf, "IOCTL_COUNTS")?,
            stats: take(&mut ebpf, "STATS")?,
        };
        let events = Some(take(&mut ebpf, "EVENTS")?);
        Ok(Self {
            ebpf,
            maps,
            events,
            probe,
            hooks,
        })
    }

    /// Starts forwarding the programs' aya-log records to `tracing`; `None` if the object logs
    /// nothing.
    pub fn logger(&mut self) -> Option<KernelLogger> {
        match aya_log::EbpfLogger::init(&mut self.ebpf) {
            Ok(logger) => Some(logger),
            Err(e) => {
                tracing::warn!("kernel-side logging unavailable: {e}");
                None
            }
        }
    }
}

/// Takes map `name` out of the object as type `T`.
fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, SensorError>
where
    T: TryFrom<aya::maps::Map, Error = MapError>,
{
    let map = ebpf
        .take_map(name)
        .ok_or(SensorError::MissingMap { name })?;
    T::try_from(map).map_err(|source| SensorError::Map { name, source })
}

/// Kernels before 5.11 charge BPF memory to `RLIMIT_MEMLOCK`; lift it so large maps load there.
fn raise_memlock_limit() {
    let limit = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: a plain syscall with a valid pointer.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &raw const limit) } != 0 {
        tracing::debug!(
            "could not raise RLIMIT_MEMLOCK: {}",
            std::io::Error::last_os_error()
        );
    }
}
