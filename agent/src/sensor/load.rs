//! Loading the programs: the load-time configuration, the object loaded with its maps pinned,
//! attaching the tracepoint tier, the device, sweep and LSM programs, the load-time settings and
//! file offsets, and taking the maps out of the loaded object. [`super::Sensor::load`] runs
//! these steps in order.

use super::{
    Array, BTF_PATH, Btf, CONFIG_SYMBOL, CgroupDevice, Config, DEVICE_PROGRAM, Ebpf, EbpfLoader,
    FdLink, FileOffsets, HashMap, Hook, LSM_PROGRAM, Lsm, MAPS, Map, MapData, MapError, MemoryTier,
    Named, OBJECT, PATH_PROGRAMS, Path, Pins, ProgramError, ProgramFd, QuotaMaps, RawTracePoint,
    SWEEP_PROGRAM, SensorError, TRACEPOINTS, TelemetryMaps, TracePoint, btf, btf_walk,
    choose_memory_tier, enforce_mode, ioctl_match, maps, pins, setting, tracefs,
};

/// The object to load, patched for this kernel, and the load-time [`Config`] its programs read:
/// the event threshold, how an fd's file is found, and the tracepoints' offsets.
pub(super) fn configure(alloc_event_min_bytes: u64, tracefs: &Path) -> (Vec<u8>, Config) {
    let (ioctl_match, typed) = ioctl_match_from_env();
    let (files, rdonly_cast) = file_offsets(typed);
    let object = btf_walk::patch(OBJECT, rdonly_cast).0;
    let config = Config {
        alloc_event_min_bytes,
        files,
        ioctl_match,
        ..tracefs::config_offsets(tracefs)
    };
    (object, config)
}

/// Loads `object` with `config`, its maps pinned under `pins` (adopting those an earlier agent
/// pinned there).
pub(super) fn load_object(
    object: &[u8],
    config: &Config,
    pins: Option<&Pins>,
) -> Result<Ebpf, SensorError> {
    let mut loader = EbpfLoader::new();
    loader.override_global(CONFIG_SYMBOL, config, true);
    let map_paths: Vec<(&str, std::path::PathBuf)> = pins
        .iter()
        .flat_map(|p| MAPS.iter().map(move |name| (*name, p.map(name))))
        .collect();
    for (name, path) in &map_paths {
        loader.map_pin_path(name, path.as_path());
    }
    loader
        .load(object)
        .map_err(|e| SensorError::Load(Box::new(e)))
}

/// What [`attach`] attached or loaded.
pub(super) struct Attached {
    /// The programs attached, and where.
    pub(super) hooks: Vec<Hook>,
    /// The device-access program, loaded to be attached per bound cgroup (`None`: refused).
    pub(super) device_program: Option<ProgramFd>,
    /// How over-limit allocations are acted on, and why.
    pub(super) memory_tier: (MemoryTier, String),
    /// The sweep of kept files is loaded.
    pub(super) sweep: bool,
}

/// Attaches the tracepoint tier, loads the device-access program, attaches the LSM program
/// where the kernel allows (choosing the memory tier by it), and loads the sweep.
pub(super) fn attach(
    ebpf: &mut Ebpf,
    tracefs: &Path,
    pins: Option<&Pins>,
    by_file: bool,
) -> Result<Attached, SensorError> {
    let mut hooks = attach_tracepoints(ebpf, tracefs, pins, by_file)?;
    let device_program = load_device_program(ebpf);
    if device_program.is_some() {
        hooks.push(Hook {
            program: DEVICE_PROGRAM.to_owned(),
            kind: "cgroup_device".to_owned(),
            target: "each cgroup with a quota".to_owned(),
        });
    }
    let memory_tier = choose_memory_tier(attach_lsm(ebpf, pins));
    let sweep = load_sweep(ebpf);
    if memory_tier.0 == MemoryTier::LsmDeny {
        hooks.push(Hook {
            program: LSM_PROGRAM.to_owned(),
            kind: "lsm".to_owned(),
            target: "file_ioctl".to_owned(),
        });
    }
    Ok(Attached {
        hooks,
        device_program,
        memory_tier,
        sweep,
    })
}

/// Takes the maps the programs count in out of the object: those telemetry reads and tidies,
/// and the quota maps enforcement writes. Both hold a handle on the per-cgroup memory counters.
pub(super) fn take_counting_maps(
    ebpf: &mut Ebpf,
) -> Result<(TelemetryMaps, QuotaMaps), SensorError> {
    let cgroup_memory = take_map(ebpf, "CGROUP_MEMORY")?;
    let enforcement_memory = second_handle(&cgroup_memory, "CGROUP_MEMORY")?;
    let maps = TelemetryMaps {
        gpu_paths: named(ebpf, "GPU_PATHS")?,
        gpu_files: named(ebpf, "GPU_FILES")?,
        gpu_fds: named(ebpf, "GPU_FDS")?,
        files: named(ebpf, "FILES")?,
        mappings: named(ebpf, "UVM_MAPPINGS")?,
        procs: named(ebpf, "PROCS")?,
        clients: named(ebpf, "CLIENTS")?,
        allocations: named(ebpf, "ALLOCATIONS")?,
        object_devices: named(ebpf, "OBJECT_DEVICES")?,
        cgroup_memory: convert::<HashMap<MapData, _, u64>>(cgroup_memory, "CGROUP_MEMORY")?,
        ioctl_counts: convert::<aya::maps::PerCpuHashMap<MapData, _, u64>>(
            take_map(ebpf, "IOCTL_COUNTS")?,
            "IOCTL_COUNTS",
        )?,
        stats: convert::<aya::maps::PerCpuArray<MapData, u64>>(take_map(ebpf, "STATS")?, "STATS")?,
        cgroup_tables: named(ebpf, "CGROUP_TABLES")?,
        cgroup_tables_released: named(ebpf, "CGROUP_TABLES_RELEASED")?,
    };
    let quota_maps = QuotaMaps {
        quotas: named(ebpf, "QUOTAS")?,
        cgroup_quota: named(ebpf, "CGROUP_QUOTA")?,
        cgroup_memory: convert::<HashMap<MapData, _, u64>>(enforcement_memory, "CGROUP_MEMORY")?,
    };
    Ok((maps, quota_maps))
}

/// Attaches every program of the tracepoint tier (pinning their links where the agent pins, and
/// adopting those an earlier agent pinned).
fn attach_tracepoints(
    ebpf: &mut Ebpf,
    tracefs: &Path,
    pins: Option<&Pins>,
    by_file: bool,
) -> Result<Vec<Hook>, SensorError> {
    let mut hooks = Vec::new();
    for program in TRACEPOINTS {
        // Matching by the opened file needs no look at the path at entry: every open on the
        // node is spared that program.
        if by_file && PATH_PROGRAMS.contains(&program.name) {
            continue;
        }
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
        let link_pin = pins.map(|p| p.link(program.name));
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
    Ok(hooks)
}

/// Takes the settings array and writes how over-limit allocations are acted on.
pub(super) fn settings(
    ebpf: &mut Ebpf,
    tier: MemoryTier,
) -> Result<Array<MapData, u32>, SensorError> {
    let mut settings: Array<MapData, u32> = take(ebpf, "SETTINGS")?;
    let mode = match tier {
        MemoryTier::LsmDeny => enforce_mode::LSM_DENY,
        MemoryTier::TracepointSignal => enforce_mode::SIGNAL,
    };
    settings
        .set(setting::ENFORCE_MODE, mode, 0)
        .map_err(|source| SensorError::Map {
            name: "SETTINGS",
            source,
        })?;
    Ok(settings)
}

/// The kernel offsets that find an fd's file, or none (matching by path) where the kernel's BTF
/// lacks them; with `typed`, and where this kernel verifies it, the typed walk too, and the
/// `bpf_rdonly_cast` kfunc's id for [`btf_walk::patch`].
fn file_offsets(typed: bool) -> (FileOffsets, Option<u32>) {
    let btf = match btf::Btf::from_path(Path::new(BTF_PATH)) {
        Ok(btf) => btf,
        Err(e) => {
            tracing::warn!(
                "GPU nodes are matched by path only (symlinks, relative and long paths are missed): {e}"
            );
            return (FileOffsets::NONE, None);
        }
    };
    let mut files = match btf.file_offsets() {
        Ok(files) => files,
        Err(e) => {
            tracing::warn!(
                "GPU nodes are matched by path only (symlinks, relative and long paths are missed): {e}"
            );
            return (FileOffsets::NONE, None);
        }
    };
    if !typed {
        return (files, None);
    }
    let walk = btf.typed_walk().and_then(|walk| {
        btf_walk::verifies(&files, walk)
            .map(|()| walk)
            .map_err(|e| btf::BtfError::Missing(format!("a verifier that accepts it ({e})")))
    });
    match walk {
        Ok(walk) => {
            tracing::info!(
                "the fd's file is read at each ioctl with typed loads (one instruction a hop)"
            );
            files.slot_type = walk.slot_type;
            (files, Some(walk.rdonly_cast))
        }
        Err(e) => {
            tracing::warn!(
                "the fd's file is read with a helper call per hop (typed loads unavailable): {e}"
            );
            (files, None)
        }
    }
}

/// Names the baseline `ioctl` match for `cargo xtask bench ebpf`, which times today's programs
/// against the matches they replaced in one run: `fd-table` is the (process, fd) table alone,
/// which misses fds obtained other than through `openat` — never for production;
/// `file-probe-read` tells the file at every ioctl as today, but reads the fd's file with a
/// `bpf_probe_read_kernel` call per hop, as before the typed walk. Read only in a build with the
/// `bench` feature, which the benchmark enables; the shipped agent ignores it.
#[cfg(feature = "bench")]
const IOCTL_MATCH_ENV: &str = "GPUWARDEN_BENCH_IOCTL_MATCH";

/// How `ioctl` enter tells a GPU fd, and whether the walk to the fd's file may be typed: by its
/// file, typed (a build without the `bench` feature has no other way).
#[cfg(not(feature = "bench"))]
fn ioctl_match_from_env() -> (u32, bool) {
    (ioctl_match::FILE, true)
}

/// How `ioctl` enter tells a GPU fd, and whether the walk to the fd's file may be typed: by its
/// file, typed, unless [`IOCTL_MATCH_ENV`] asks for a baseline.
#[cfg(feature = "bench")]
fn ioctl_match_from_env() -> (u32, bool) {
    match std::env::var(IOCTL_MATCH_ENV).as_deref() {
        Ok("fd-table") => {
            tracing::warn!(
                "{IOCTL_MATCH_ENV}=fd-table: GPU fds are told by the fd table alone (the benchmark's baseline); fds obtained without openat are not counted"
            );
            (ioctl_match::FD_TABLE, false)
        }
        Ok("file-probe-read") => {
            tracing::warn!(
                "{IOCTL_MATCH_ENV}=file-probe-read: the fd's file is read with a helper call per hop (the benchmark's baseline)"
            );
            (ioctl_match::FILE, false)
        }
        _ => (ioctl_match::FILE, true),
    }
}

/// Identifies this build of the programs with these settings: pins of another are replaced.
pub(super) fn object_id(config: &Config) -> String {
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

/// Loads the sweep (run, never attached); `false` (logged) where the kernel refuses it: files
/// kept for a holder the programs don't follow then stay counted until a tracked fd of theirs
/// closes.
fn load_sweep(ebpf: &mut Ebpf) -> bool {
    let loaded = ebpf
        .program_mut(SWEEP_PROGRAM)
        .ok_or(ProgramError::NotLoaded)
        .and_then(<&mut RawTracePoint>::try_from)
        .and_then(RawTracePoint::load);
    match loaded {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(
                "GPU files kept for a holder the programs don't follow are not swept: {}",
                error_chain(&e)
            );
            false
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

pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
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
pub(super) fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, SensorError>
where
    T: TryFrom<Map, Error = MapError>,
{
    T::try_from(take_map(ebpf, name)?).map_err(|source| SensorError::Map { name, source })
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<Map, SensorError> {
    ebpf.take_map(name).ok_or(SensorError::MissingMap { name })
}

/// Takes hash map `name` out of the object, behind the [`maps::KernelMap`] trait.
pub(super) fn named<K, V>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<maps::Map<K, V>, SensorError>
where
    K: aya::Pod + Send + 'static,
    V: aya::Pod + Send + 'static,
{
    Ok(convert::<HashMap<MapData, K, V>>(
        take_map(ebpf, name)?,
        name,
    )?)
}

/// Types `map` as `T`, behind the [`maps::KernelMap`] trait.
pub(super) fn convert<T>(map: Map, name: &'static str) -> Result<Box<Named<T>>, SensorError>
where
    T: TryFrom<Map, Error = MapError>,
{
    T::try_from(map)
        .map(|m| Box::new(Named::new(name, m)))
        .map_err(|source| SensorError::Map { name, source })
}

/// A second handle on `map` (its own fd on the same kernel map).
fn second_handle(map: &Map, name: &'static str) -> Result<Map, SensorError> {
    use std::os::fd::AsFd as _;
    let (Map::HashMap(data) | Map::LruHashMap(data)) = map else {
        return Err(SensorError::MissingMap { name });
    };
    let fd = data
        .fd()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| SensorError::Handle { name, source })?;
    let data = MapData::from_fd(fd).map_err(|source| SensorError::Map { name, source })?;
    Ok(match map {
        Map::LruHashMap(_) => Map::LruHashMap(data),
        _ => Map::HashMap(data),
    })
}

/// Kernels before 5.11 charge BPF memory to `RLIMIT_MEMLOCK`; lift it so large maps load there.
pub(super) fn raise_memlock_limit() {
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
