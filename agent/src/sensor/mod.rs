//! The eBPF sensor: loading gpuwarden's programs, choosing and attaching their hooks, the maps
//! they fill and the events they send.
//!
//! A [`Sensor`] is the programs, links and maps managed as one unit: [`Sensor::load`] probes
//! what the kernel allows ([`probe`]), patches the load-time [`Config`], loads the object
//! embedded in the agent binary and attaches every program; dropping it detaches them.
//!
//! - [`probe`], [`tracefs`], [`pins`]: choosing hooks, tracepoint offsets, pinning in bpffs;
//! - [`gpu_nodes`]: which paths are GPU device nodes;
//! - `maps`: the maps behind a narrow trait (aya here, in memory in tests);
//! - `counters`: the maps' counters, named; `upkeep`: seeding and tidying the maps;
//! - `events`: the ring buffer of events; `device_program`: device access per cgroup;
//! - `load`: the steps of [`Sensor::load`] (the load-time config, the object loaded with its
//!   maps pinned, attaching the programs, taking the maps out of the loaded object);
//!   `driver_hooks`: trying the driver hooks for `probe-hooks`.

pub mod btf;
pub mod btf_walk;
mod counters;
mod device_program;
pub(crate) mod events;
pub mod gpu_nodes;
pub(crate) mod maps;
pub mod mig;
pub mod pins;
pub mod probe;
pub mod tracefs;

mod driver_hooks;
mod load;

pub(crate) mod upkeep;

pub use self::driver_hooks::try_driver_hooks;
use self::load::{
    Attached, attach, configure, error_chain, load_object, object_id, raise_memlock_limit,
    settings, take, take_counting_maps,
};

use std::path::Path;

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, HashMap, Map, MapData, MapError, RingBuf},
    programs::{
        CgroupDevice, FEntry, KProbe, Lsm, ProgramError, ProgramFd, RawTracePoint,
        RawTracePointRunOptions, TestRun as _, TracePoint, links::FdLink,
    },
};
use gpuwarden_agent_common::{
    config::{CONFIG_SYMBOL, Config, FileOffsets, ioctl_match},
    maps::{enforce_mode, setting},
};
use pins::Pins;
use serde::{Deserialize, Serialize};

pub(crate) use counters::{CgroupCounters, Counters};
pub(crate) use device_program::DeviceProgram;
pub use gpuwarden_agent_api::Hook;
use maps::{Named, QuotaMaps, TelemetryMaps};
pub use probe::Probe;

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
    /// A second handle on a map could not be made.
    #[error("cannot open a second handle on map {name:?}: {source}")]
    Handle {
        /// The map.
        name: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
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
    tp("sys_enter_close_range", "syscalls", true),
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
    tp("sys_enter_mmap", "syscalls", false),
    tp("sys_exit_mmap", "syscalls", false),
    tp("sys_enter_munmap", "syscalls", false),
    tp("sys_exit_ioctl", "syscalls", false),
    tp("sys_enter_ioctl", "syscalls", false),
];

/// The programs that read the path at `openat` entry: needed only to match by path.
const PATH_PROGRAMS: &[&str] = &["sys_enter_openat", "sys_enter_openat2"];

/// The kernel's BTF, for the offsets that find an fd's file.
const BTF_PATH: &str = "/sys/kernel/btf/vmlinux";

/// Every map, pinned by name so a restarted agent keeps counters and quotas.
const MAPS: &[&str] = &[
    "GPU_PATHS",
    "GPU_FILES",
    "GPU_FDS",
    "FILES",
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
    "PENDING_MMAP",
    "MMAPS_IN_FLIGHT",
    "UVM_MAPPINGS",
    "CGROUP_QUOTA",
    "QUOTAS",
    "DENY",
    "SETTINGS",
    "SCRATCH_CLIENT",
    "CGROUP_TABLES",
    "CGROUP_TABLES_RELEASED",
    "GPU_MAJORS",
    "MIG_INSTANCES",
    "CLIENT_PARTITIONS",
    "MIG_CAPS_MAJOR",
    "CAP_ACCESS",
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

/// Loaded and attached programs with their maps.
pub struct Sensor {
    /// Owns the programs and their links; dropping it detaches everything.
    ebpf: Ebpf,
    /// The maps telemetry reads and tidies.
    maps: TelemetryMaps,
    /// The quota maps and the device-access program, until enforcement takes them.
    enforcement: Option<(QuotaMaps, DeviceProgram)>,
    /// The ring buffer of events, until the event reader takes it.
    events: Option<RingBuf<MapData>>,
    /// What was probed and chosen.
    probe: Probe,
    /// Attached programs.
    hooks: Vec<Hook>,
    /// How over-limit allocations are acted on, and why.
    memory_tier: (MemoryTier, String),
    /// Whether maps and links of an earlier agent were adopted.
    adopted: bool,
    /// Settings the programs read at run time.
    settings: Array<MapData, u32>,
    /// The device majors of the watched GPU nodes, as a bitmap.
    gpu_majors: Array<MapData, u64>,
    /// GPU nodes are matched by the opened file.
    by_file: bool,
    /// The sweep of files kept for holders the programs don't follow is loaded.
    sweep: bool,
    /// The names its device ids are reported under, from the devices last given to
    /// [`Sensor::set_mig_instances`].
    names: gpu_nodes::DeviceNames,
}

/// The program [`Sensor::sweep_files`] runs.
const SWEEP_PROGRAM: &str = "sweep_files";

impl Sensor {
    /// Probes the kernel, loads the programs with `alloc_event_min_bytes`, and attaches them.
    ///
    /// # Errors
    /// Any step that fails, naming the program or map.
    pub fn load(alloc_event_min_bytes: u64, pin_dir: Option<&Path>) -> Result<Self, SensorError> {
        raise_memlock_limit();
        let tracefs = tracefs::ensure_mounted()?;
        let probe = probe::probe(Path::new("/sys"));
        let (object, config) = configure(alloc_event_min_bytes, &tracefs);
        let (pins, adopted) = match pin_dir {
            Some(dir) => {
                let (pins, adopted) = Pins::open(dir, &object_id(&config))?;
                (Some(pins), adopted)
            }
            None => (None, false),
        };
        let mut ebpf = load_object(&object, &config, pins.as_ref())?;
        let by_file = config.files.valid != 0;
        let Attached {
            hooks,
            device_program,
            memory_tier,
            sweep,
        } = attach(&mut ebpf, &tracefs, pins.as_ref(), by_file)?;
        let (maps, quota_maps) = take_counting_maps(&mut ebpf)?;
        let settings = settings(&mut ebpf, memory_tier.0)?;
        let cap_access = Some(take(&mut ebpf, "CAP_ACCESS")?);
        let gpu_majors: Array<MapData, u64> = take(&mut ebpf, "GPU_MAJORS")?;
        let events = Some(take(&mut ebpf, "EVENTS")?);
        Ok(Self {
            ebpf,
            maps,
            enforcement: Some((
                quota_maps,
                DeviceProgram::new(device_program, pins, cap_access),
            )),
            events,
            probe,
            hooks,
            memory_tier,
            adopted,
            settings,
            gpu_majors,
            by_file,
            sweep,
            names: gpu_nodes::DeviceNames::default(),
        })
    }

    /// Releases the open files the programs kept past their last tracked fd, for a holder they
    /// don't follow, that the kernel has since released, with the clients (and memory) the
    /// driver freed with them (`agent-ebpf/src/sweep.rs`).
    pub(crate) fn sweep_files(&self) {
        if !self.sweep {
            return;
        }
        let ran = self
            .ebpf
            .program(SWEEP_PROGRAM)
            .ok_or(ProgramError::NotLoaded)
            .and_then(<&RawTracePoint>::try_from)
            .and_then(|p| p.test_run(RawTracePointRunOptions::new()));
        if let Err(e) = ran {
            tracing::debug!(
                "the sweep of kept GPU files did not run: {}",
                error_chain(&e)
            );
        }
    }

    /// Tells the programs which device index each MIG GPU instance among `devices` is counted
    /// as (replacing what an earlier agent wrote), and the capability nodes' major; names the
    /// instances' indexes after them ([`Sensor::device_names`]) even where the maps fail.
    ///
    /// # Errors
    /// The map is missing or can't be written.
    pub fn set_mig_instances(
        &mut self,
        devices: &[crate::devices::GpuDevice],
        caps_major: Option<u32>,
    ) -> Result<(), SensorError> {
        const NAME: &str = "MIG_INSTANCES";
        self.names = gpu_nodes::DeviceNames::new(devices);
        // The capability nodes' major: 0 leaves them to the other device programs.
        let major = self
            .ebpf
            .map_mut("MIG_CAPS_MAJOR")
            .ok_or(SensorError::MissingMap {
                name: "MIG_CAPS_MAJOR",
            })?;
        let mut major: Array<&mut MapData, u32> =
            Array::try_from(major).map_err(|source| SensorError::Map {
                name: "MIG_CAPS_MAJOR",
                source,
            })?;
        major
            .set(0, caps_major.unwrap_or(0), 0)
            .map_err(|source| SensorError::Map {
                name: "MIG_CAPS_MAJOR",
                source,
            })?;
        let map = self
            .ebpf
            .map_mut(NAME)
            .ok_or(SensorError::MissingMap { name: NAME })?;
        let mut map: HashMap<&mut MapData, gpuwarden_agent_common::mig::MigKey, u32> =
            HashMap::try_from(map).map_err(|source| SensorError::Map { name: NAME, source })?;
        let (entries, left_out) = mig::entries(devices);
        let stale: Vec<_> = map.keys().filter_map(Result::ok).collect();
        for key in stale {
            let _ = map.remove(&key);
        }
        for (key, index) in entries {
            map.insert(key, index, 0)
                .map_err(|source| SensorError::Map { name: NAME, source })?;
        }
        if !left_out.is_empty() {
            tracing::warn!(
                instances = %left_out.join(", "),
                "MIG instances numbered past the programs' {} GPUs: their memory counts as their parent GPU's",
                gpuwarden_agent_common::maps::MAX_GPUS
            );
        }
        Ok(())
    }

    /// The names its device ids are reported under (a MIG instance's once
    /// [`Sensor::set_mig_instances`] was told of it).
    #[must_use]
    pub fn device_names(&self) -> &gpu_nodes::DeviceNames {
        &self.names
    }

    /// Whether GPU nodes are matched by the opened file (else by path).
    #[must_use]
    pub fn matches_by_file(&self) -> bool {
        self.by_file
    }

    /// Tells the programs whether some watched node is not a device file (the fake driver's),
    /// so opened files are also matched by inode, and which device majors the watched nodes
    /// have (from the file table the agent just synced).
    pub(crate) fn set_match_inodes(&mut self, on: bool) {
        if let Err(e) = self.settings.set(setting::MATCH_INODES, u32::from(on), 0) {
            tracing::warn!("cannot tell the programs to match nodes by inode: {e}");
        }
        let mut bitmap = [0u64; 64];
        for id in self.maps.gpu_files.keys() {
            if id.ino == 0 {
                let major = (id.dev >> 20) as usize;
                bitmap[(major >> 6) & 63] |= 1 << (major & 63);
            }
        }
        for (index, bits) in (0u32..).zip(bitmap) {
            if self.gpu_majors.get(&index, 0).ok() != Some(bits)
                && let Err(e) = self.gpu_majors.set(index, bits, 0)
            {
                tracing::warn!("cannot tell the programs the GPU nodes' majors: {e}");
            }
        }
    }

    /// What was probed and chosen.
    #[must_use]
    pub fn probe(&self) -> &Probe {
        &self.probe
    }

    /// The attached programs.
    #[must_use]
    pub fn hooks(&self) -> &[Hook] {
        &self.hooks
    }

    /// How over-limit allocations are acted on, and why.
    #[must_use]
    pub fn memory_tier(&self) -> (MemoryTier, &str) {
        (self.memory_tier.0, &self.memory_tier.1)
    }

    /// Whether maps and links of an earlier agent were adopted.
    #[must_use]
    pub fn adopted(&self) -> bool {
        self.adopted
    }

    /// The ring buffer of events, for the event reader (once).
    pub(crate) fn take_events(&mut self) -> Option<RingBuf<MapData>> {
        self.events.take()
    }

    /// The quota maps and the device-access program, for the enforcer (once).
    pub(crate) fn take_enforcement(&mut self) -> Option<(QuotaMaps, DeviceProgram)> {
        self.enforcement.take()
    }

    /// Every counter the maps hold now.
    pub(crate) fn counters(&self) -> Counters {
        counters::read(&self.maps)
    }

    /// The maps telemetry tidies.
    pub(crate) fn maps_mut(&mut self) -> &mut TelemetryMaps {
        &mut self.maps
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
