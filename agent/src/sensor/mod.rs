//! The eBPF sensor: loading gpuwarden's programs, choosing and attaching their hooks, and the
//! maps they fill.
//!
//! A [`Sensor`] is the programs, links and maps managed as one unit: [`Sensor::load`] probes
//! what the kernel allows ([`probe`]), patches the load-time [`Config`], loads the object
//! embedded in the agent binary and attaches every program; dropping it detaches them.

pub mod device_nodes;
pub mod upkeep;

pub mod pins;
pub mod probe;
pub mod tracefs;

use std::path::Path;

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, MapError, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{CgroupDevice, Lsm, ProgramError, ProgramFd, TracePoint, links::FdLink},
};
use gpuwarden_agent_common::{
    config::{CONFIG_SYMBOL, Config},
    maps::{
        Allocation, CgroupDeviceKey, ClientInfo, FdKey, GpuNode, HandleKey, IoctlKey, PathKey,
        ProcInfo, Quota, enforce_mode,
    },
};
use pins::Pins;
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
    /// The pin directory can't be used.
    #[error(transparent)]
    Pins(#[from] pins::PinError),
    /// A link could not be pinned.
    #[error("cannot pin {name:?} at {path}: {source}")]
    Pin {
        /// The program.
        name: &'static str,
        /// Where.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
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

/// Every map, pinned by name so a restarted agent keeps counters and quotas.
const MAPS: &[&str] = &[
    "GPU_PATHS",
    "GPU_FDS",
    "PROCS",
    "CLIENTS",
    "ALLOCATIONS",
    "OBJECT_DEVICES",
    "CGROUP_MEMORY",
    "IOCTL_COUNTS",
    "STATS",
    "EVENTS",
    "PENDING_OPEN",
    "PENDING_DUP",
    "PENDING_IOCTL",
    "IOCTLS_IN_FLIGHT",
    "PENDING_CLONE",
    "CGROUP_QUOTA",
    "QUOTAS",
    "DENY",
    "SETTINGS",
    "AYA_LOGS",
];

/// The device-access program, attached per bound cgroup.
const DEVICE_PROGRAM: &str = "gpu_devices";
/// The LSM program that refuses over-limit allocations.
const LSM_PROGRAM: &str = "gpu_file_ioctl";

/// How over-limit GPU-memory allocations are acted on (docs/architecture.md, "Enforcement tiers").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryTier {
    /// BPF LSM `file_ioctl` refuses the ioctl with `-ENOMEM`; the process lives.
    LsmDeny,
    /// The `sys_enter_ioctl` tracepoint acts by the quota's policy (kill, stop, report).
    TracepointSignal,
}

impl MemoryTier {
    /// Stable name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::LsmDeny => "lsm_deny",
            Self::TracepointSignal => "tracepoint_signal",
        }
    }
}

/// Picks the memory tier from whether the LSM program attached; the reason says why.
#[must_use]
pub fn choose_memory_tier(lsm: Result<(), String>) -> (MemoryTier, String) {
    match lsm {
        Ok(()) => (
            MemoryTier::LsmDeny,
            "BPF LSM file_ioctl attached: over-limit allocations fail with ENOMEM".to_owned(),
        ),
        Err(why) => (
            MemoryTier::TracepointSignal,
            format!(
                "BPF LSM file_ioctl unavailable ({why}): over-limit allocations are acted on from the tracepoint by policy"
            ),
        ),
    }
}

/// Forwards the programs' aya-log records to the `log` facade (bridged to `tracing`).
pub type KernelLogger = aya_log::EbpfLogger<&'static dyn log::Log>;

pub use gpuwarden_agent_api::snapshot::Hook;

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
    /// The quota each bound cgroup counts against.
    pub cgroup_quota: HashMap<MapData, u64, u64>,
    /// Quotas by bound cgroup id.
    pub quotas: HashMap<MapData, u64, Quota>,
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
    /// How over-limit allocations are acted on, and why.
    pub memory_tier: (MemoryTier, String),
    /// The device-access program, for attaching to bound cgroups.
    pub device_program: Option<ProgramFd>,
    /// Where links are pinned, when they are.
    pub pins: Option<Pins>,
    /// Whether maps and links of an earlier agent were adopted.
    pub adopted: bool,
}

impl Sensor {
    /// Probes the kernel, loads the programs with `alloc_event_min_bytes`, and attaches them.
    ///
    /// # Errors
    /// Any step that fails, naming the program or map.
    pub fn load(alloc_event_min_bytes: u64, pin_dir: Option<&Path>) -> Result<Self, SensorError> {
        raise_memlock_limit();
        let tracefs = tracefs::ensure_mounted()?;
        let probe = probe::probe(Path::new("/sys"));
        let config = Config {
            alloc_event_min_bytes,
            ..tracefs::config_offsets(&tracefs)
        };
        let (pins, adopted) = match pin_dir {
            Some(dir) => {
                let (pins, adopted) = Pins::open(dir, &object_id(&config))?;
                (Some(pins), adopted)
            }
            None => (None, false),
        };
        let mut loader = EbpfLoader::new();
        loader.override_global(CONFIG_SYMBOL, &config, true);
        let map_paths: Vec<(&str, std::path::PathBuf)> = pins
            .iter()
            .flat_map(|p| MAPS.iter().map(move |name| (*name, p.map(name))))
            .collect();
        for (name, path) in &map_paths {
            loader.map_pin_path(name, path.as_path());
        }
        let mut ebpf = loader
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
            let link_pin = pins.as_ref().map(|p| p.link(program.name));
            // An earlier agent's link is still attached: adopt it rather than count twice.
            if link_pin.as_deref().is_some_and(pins::is_pinned) {
                hooks.push(Hook {
                    program: program.name.to_owned(),
                    kind: "tracepoint".to_owned(),
                    target,
                });
                continue;
            }
            let tp: &mut TracePoint = ebpf
                .program_mut(program.name)
                .ok_or(SensorError::MissingProgram { name: program.name })?
                .try_into()
                .map_err(wrap)?;
            tp.load().map_err(wrap)?;
            let id = tp.attach(program.category, program.name).map_err(wrap)?;
            if let Some(path) = link_pin {
                let link = tp.take_link(id).map_err(wrap)?;
                let pin_err = |source: Box<dyn std::error::Error + Send + Sync>| SensorError::Pin {
                    name: program.name,
                    path: path.clone(),
                    source,
                };
                let fd: FdLink = link.try_into().map_err(|e| pin_err(Box::new(e)))?;
                // The pin keeps the link (and the program) attached after the fd closes.
                fd.pin(&path).map_err(|e| pin_err(Box::new(e)))?;
            }
            hooks.push(Hook {
                program: program.name.to_owned(),
                kind: "tracepoint".to_owned(),
                target,
            });
        }
        let device_program = load_device_program(&mut ebpf);
        if device_program.is_some() {
            hooks.push(Hook {
                program: DEVICE_PROGRAM.to_owned(),
                kind: "cgroup_device".to_owned(),
                target: "each cgroup with a quota".to_owned(),
            });
        }
        let memory_tier = choose_memory_tier(attach_lsm(&mut ebpf, pins.as_ref()));
        if memory_tier.0 == MemoryTier::LsmDeny {
            hooks.push(Hook {
                program: LSM_PROGRAM.to_owned(),
                kind: "lsm".to_owned(),
                target: "file_ioctl".to_owned(),
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
            cgroup_quota: take(&mut ebpf, "CGROUP_QUOTA")?,
            quotas: take(&mut ebpf, "QUOTAS")?,
        };
        let mut settings: Array<MapData, u32> = take(&mut ebpf, "SETTINGS")?;
        let mode = match memory_tier.0 {
            MemoryTier::LsmDeny => enforce_mode::LSM_DENY,
            MemoryTier::TracepointSignal => enforce_mode::SIGNAL,
        };
        settings
            .set(0, mode, 0)
            .map_err(|source| SensorError::Map {
                name: "SETTINGS",
                source,
            })?;
        let events = Some(take(&mut ebpf, "EVENTS")?);
        Ok(Self {
            ebpf,
            maps,
            events,
            probe,
            hooks,
            memory_tier,
            device_program,
            pins,
            adopted,
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

/// Identifies this build of the programs with these settings: pins of another are replaced.
fn object_id(config: &Config) -> String {
    // FNV-1a over the object and the load-time settings.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let settings = format!("{config:?}");
    for b in OBJECT.iter().chain(settings.as_bytes()) {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Loads the device-access program; `None` (logged) where the kernel refuses it.
fn load_device_program(ebpf: &mut Ebpf) -> Option<ProgramFd> {
    let loaded = (|| -> Result<ProgramFd, String> {
        let program: &mut CgroupDevice = ebpf
            .program_mut(DEVICE_PROGRAM)
            .ok_or("not in the object")?
            .try_into()
            .map_err(|e: ProgramError| e.to_string())?;
        program.load().map_err(|e| e.to_string())?;
        let fd = program.fd().map_err(|e| e.to_string())?;
        fd.try_clone().map_err(|e| e.to_string())
    })();
    match loaded {
        Ok(fd) => Some(fd),
        Err(e) => {
            tracing::warn!(
                "device access can't be enforced: the cgroup_device program did not load: {e}"
            );
            None
        }
    }
}

/// Loads and attaches the LSM program, pinning its link; the error says why it can't.
fn attach_lsm(ebpf: &mut Ebpf, pins: Option<&Pins>) -> Result<(), String> {
    let pin = pins.map(|p| p.link(LSM_PROGRAM));
    if pin.as_deref().is_some_and(pins::is_pinned) {
        return Ok(());
    }
    let btf = Btf::from_sys_fs().map_err(|e| format!("no kernel BTF: {e}"))?;
    let program: &mut Lsm = ebpf
        .program_mut(LSM_PROGRAM)
        .ok_or("not in the object")?
        .try_into()
        .map_err(|e: ProgramError| e.to_string())?;
    program
        .load("file_ioctl", &btf)
        .map_err(|e| format!("load refused: {}", error_chain(&e)))?;
    let id = program
        .attach()
        .map_err(|e| format!("attach refused: {}", error_chain(&e)))?;
    if let Some(path) = pin {
        let link = program.take_link(id).map_err(|e| e.to_string())?;
        let fd: FdLink = link.into();
        fd.pin(&path).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_tier_is_lsm_where_it_attached_and_the_tracepoint_elsewhere() {
        let (tier, why) = choose_memory_tier(Ok(()));
        assert_eq!(tier, MemoryTier::LsmDeny);
        assert!(why.contains("ENOMEM"), "{why}");
        let (tier, why) = choose_memory_tier(Err("load refused: EPERM".into()));
        assert_eq!(tier, MemoryTier::TracepointSignal);
        assert!(why.contains("EPERM") && why.contains("policy"), "{why}");
        assert_eq!(tier.as_str(), "tracepoint_signal");
    }
}
