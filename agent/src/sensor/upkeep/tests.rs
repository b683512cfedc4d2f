use super::*;

#[test]
fn path_keys_are_nul_padded_and_bounded() {
    let key = path_key(Path::new("/dev/nvidia0")).unwrap();
    assert_eq!(&key.path[..12], b"/dev/nvidia0");
    assert!(key.path[12..].iter().all(|b| *b == 0));
    let long = format!("/{}", "x".repeat(PATH_LEN - 1));
    assert!(path_key(Path::new(&long)).is_none());
    let longest = format!("/{}", "x".repeat(PATH_LEN - 2));
    assert!(path_key(Path::new(&longest)).is_some());
}

use std::os::unix::fs::MetadataExt as _;

use gpuwarden_agent_common::maps::{
    Allocation, ClientInfo, FileRefs, HandleKey, Mapping, MappingKey, ObjectInfo, TableReleased,
    TableUse,
};

use crate::{attribution::Attributor, sensor::maps::fake::FakeMap};

/// Telemetry maps in memory, with handles to look at them.
#[derive(Default)]
struct Fakes {
    gpu_fds: FakeMap<FdKey, FdInfo>,
    files: FakeMap<u64, FileRefs>,
    mappings: FakeMap<MappingKey, Mapping>,
    procs: FakeMap<u32, ProcInfo>,
    clients: FakeMap<u32, ClientInfo>,
    allocations: FakeMap<HandleKey, Allocation>,
    object_devices: FakeMap<HandleKey, ObjectInfo>,
    cgroup_memory: FakeMap<CgroupDeviceKey, u64>,
    ioctl_counts: FakeMap<IoctlKey, u64>,
    cgroup_tables: FakeMap<u64, TableUse>,
    cgroup_tables_released: FakeMap<u64, TableReleased>,
}

impl Fakes {
    fn maps(&self) -> TelemetryMaps {
        TelemetryMaps {
            gpu_paths: FakeMap::default().boxed(),
            gpu_files: FakeMap::default().boxed(),
            gpu_fds: self.gpu_fds.boxed(),
            files: self.files.boxed(),
            mappings: self.mappings.boxed(),
            procs: self.procs.boxed(),
            clients: self.clients.boxed(),
            allocations: self.allocations.boxed(),
            object_devices: self.object_devices.boxed(),
            cgroup_memory: self.cgroup_memory.boxed(),
            ioctl_counts: self.ioctl_counts.boxed(),
            stats: FakeMap::default().boxed(),
            cgroup_tables: self.cgroup_tables.boxed(),
            cgroup_tables_released: self.cgroup_tables_released.boxed(),
        }
    }
}

fn proc_info(cgroup: u64, generation: u64) -> ProcInfo {
    ProcInfo {
        cgroup,
        generation,
        max_fd: 3,
        gpu_nodes: 0,
        vidmem: [0; MEMORY_SLOTS],
        sysmem: 0,
        managed: 0,
        outlived: 0,
        _pad: 0,
    }
}

fn ioctl_key(cgroup: u64) -> IoctlKey {
    IoctlKey {
        cgroup,
        device: 0,
        family: 0,
        cmd: 1,
        _pad: 0,
    }
}

fn memory_key(cgroup: u64) -> CgroupDeviceKey {
    CgroupDeviceKey {
        cgroup,
        device: 0,
        kind: 0,
    }
}

/// A scratch `/proc` with live pid 10 and a cgroup root with one cgroup, `live`.
struct Host {
    _dir: tempfile::TempDir,
    proc_root: PathBuf,
    attributor: Attributor,
    root_id: u64,
    live_id: u64,
}

fn host() -> Host {
    let dir = gpuwarden_test_support::scratch("upkeep");
    let proc_root = dir.path().join("proc");
    let cgroups = dir.path().join("cgroup");
    std::fs::create_dir_all(proc_root.join("10")).unwrap();
    std::fs::create_dir_all(cgroups.join("live")).unwrap();
    let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
    let (root_id, live_id) = (ino(&cgroups), ino(&cgroups.join("live")));
    let attributor = Attributor::with_roots(cgroups, proc_root.clone());
    Host {
        _dir: dir,
        proc_root,
        attributor,
        root_id,
        live_id,
    }
}

#[test]
fn garbage_of_processes_that_died_unseen_and_of_removed_cgroups_is_collected() {
    let mut h = host();
    let fakes = Fakes::default();
    let node = GpuNode::default();
    let (live, dead) = (10, 11);
    for tgid in [live, dead] {
        fakes
            .gpu_fds
            .0
            .lock()
            .unwrap()
            .insert(FdKey { tgid, fd: 3 }, FdInfo { node, file: 0 });
        fakes
            .procs
            .0
            .lock()
            .unwrap()
            .insert(tgid, proc_info(h.live_id, u64::from(tgid)));
    }
    // Client 1 belongs to the live process, client 2 to the dead one.
    let client = |tgid: u32| ClientInfo {
        tgid,
        orphans: 0,
        generation: 7,
        proc_generation: u64::from(tgid),
        cgroup: h.live_id,
        vidmem: [0; MEMORY_SLOTS],
        sysmem: 0,
        file: 0,
    };
    let allocation = |tgid: u32| Allocation {
        tgid,
        client_generation: 7,
        ..Allocation::default()
    };
    for (handle, tgid) in [(1, live), (2, dead)] {
        fakes.clients.0.lock().unwrap().insert(handle, client(tgid));
        let key = HandleKey {
            client: handle,
            handle: 9,
        };
        fakes
            .allocations
            .0
            .lock()
            .unwrap()
            .insert(key, allocation(tgid));
        let object = ObjectInfo::default();
        fakes.object_devices.0.lock().unwrap().insert(key, object);
    }
    // Counters of a cgroup that no longer exists, and of one that does.
    let removed = 999_999;
    for cgroup in [removed, h.live_id] {
        fakes
            .ioctl_counts
            .0
            .lock()
            .unwrap()
            .insert(ioctl_key(cgroup), 5);
        fakes
            .cgroup_memory
            .0
            .lock()
            .unwrap()
            .insert(memory_key(cgroup), 1 << 20);
    }

    let mut maps = fakes.maps();
    let mut idle = Idle::default();
    let mut gc = || {
        collect_garbage(
            &mut maps,
            &mut h.attributor,
            &mut idle,
            &h.proc_root,
            Instant::now(),
        )
    };
    assert_eq!(
        gc(),
        Garbage {
            fds: 1,
            processes: 1,
            handles: 0,
            cgroups: 2,
        }
    );
    // The dead process's handles go at the next pass, once its entry is gone.
    assert_eq!(
        gc(),
        Garbage {
            handles: 3,
            ..Garbage::default()
        }
    );
    assert!(fakes.gpu_fds.at(&FdKey { tgid: live, fd: 3 }).is_some());
    assert!(fakes.procs.at(&dead).is_none());
    assert!(fakes.clients.at(&1).is_some() && fakes.clients.at(&2).is_none());
    assert_eq!(fakes.allocations.len(), 1);
    assert_eq!(fakes.object_devices.len(), 1);
    assert_eq!(fakes.ioctl_counts.at(&ioctl_key(h.live_id)), Some(5));
    assert_eq!(fakes.ioctl_counts.at(&ioctl_key(removed)), None);
}

#[test]
fn counters_of_idle_cgroups_outlive_their_processes_then_age_out() {
    let mut h = host();
    let fakes = Fakes::default();
    // Counts left by an earlier run in the host's cgroup, and a cgroup holding bytes.
    fakes
        .ioctl_counts
        .0
        .lock()
        .unwrap()
        .insert(ioctl_key(h.root_id), 40);
    fakes
        .ioctl_counts
        .0
        .lock()
        .unwrap()
        .insert(ioctl_key(h.live_id), 3);
    fakes
        .cgroup_memory
        .0
        .lock()
        .unwrap()
        .insert(memory_key(h.live_id), 1 << 20);
    let mut maps = fakes.maps();
    let mut idle = Idle::default();
    let t0 = Instant::now();
    let mut gc =
        |at: Instant| collect_garbage(&mut maps, &mut h.attributor, &mut idle, &h.proc_root, at);
    assert_eq!(gc(t0).cgroups, 0, "kept while recent");
    // New ioctls restart the clock.
    fakes
        .ioctl_counts
        .0
        .lock()
        .unwrap()
        .insert(ioctl_key(h.root_id), 41);
    assert_eq!(
        gc((t0 + IDLE_TTL).checked_sub(Duration::from_secs(1)).unwrap()).cgroups,
        0
    );
    assert_eq!(gc(t0 + IDLE_TTL + Duration::from_secs(1)).cgroups, 0);
    assert_eq!(
        gc(t0 + 2 * IDLE_TTL).cgroups,
        1,
        "idle past the TTL: aged out"
    );
    assert_eq!(fakes.ioctl_counts.at(&ioctl_key(h.root_id)), None);
    // A cgroup holding GPU memory keeps its counters however long it idles.
    assert_eq!(fakes.ioctl_counts.at(&ioctl_key(h.live_id)), Some(3));
}

#[test]
fn seeding_adds_fds_opened_before_the_programs_and_registers_their_process() {
    let h = host();
    let fakes = Fakes::default();
    let fd_dir = h.proc_root.join("10/fd");
    std::fs::create_dir_all(&fd_dir).unwrap();
    let dev = h.proc_root.join("nvidia0");
    std::fs::write(&dev, b"").unwrap();
    std::os::unix::fs::symlink(&dev, fd_dir.join("7")).unwrap();
    std::os::unix::fs::symlink("/dev/null", fd_dir.join("8")).unwrap();
    std::fs::write(h.proc_root.join("10/cgroup"), "0::/live\n").unwrap();
    let nodes = BTreeMap::from([(dev, GpuNode::default())]);
    let mut maps = fakes.maps();
    let report = seed(&mut maps, &nodes, &h.attributor, &h.proc_root, None);
    assert_eq!(
        report,
        SeedReport {
            fds: 1,
            processes: 1
        }
    );
    assert!(fakes.gpu_fds.at(&FdKey { tgid: 10, fd: 7 }).is_some());
    let info = fakes.procs.at(&10).unwrap();
    assert_eq!((info.cgroup, info.max_fd), (h.live_id, 7));
    assert_eq!(info.gpu_nodes, 1, "it holds nvidia0");
    // Seeding again finds the process registered.
    let again = seed(&mut maps, &nodes, &h.attributor, &h.proc_root, Some(10));
    assert_eq!(again.processes, 0);
}

#[test]
fn the_gpu_node_bits_name_only_gpus() {
    use gpuwarden_agent_common::maps::{DEVICE_CTL, DEVICE_UVM};
    let rm = |device| GpuNode {
        device,
        kind: node_kind::RM,
    };
    let uvm = GpuNode {
        device: DEVICE_UVM,
        kind: node_kind::UVM,
    };
    assert_eq!(gpu_nodes([rm(DEVICE_CTL), uvm, rm(2)]), 0b100);
    assert_eq!(gpu_nodes([rm(0), rm(3), rm(40)]), 0b1001, "no bit past 31");
    assert_eq!(gpu_nodes([]), 0);
}

#[test]
fn seeding_matches_the_file_whatever_path_opened_it() {
    let h = host();
    let fakes = Fakes::default();
    let fd_dir = h.proc_root.join("12/fd");
    std::fs::create_dir_all(&fd_dir).unwrap();
    let dev = h.proc_root.join("nvidia1");
    std::fs::write(&dev, b"").unwrap();
    // The fd names a path the agent doesn't watch (a symlink to the node), as /proc shows an fd
    // opened through a bind mount or a moved directory.
    let alias = h.proc_root.join("alias-of-nvidia1");
    std::os::unix::fs::symlink(&dev, &alias).unwrap();
    std::os::unix::fs::symlink(&alias, fd_dir.join("5")).unwrap();
    std::fs::write(h.proc_root.join("12/cgroup"), "0::/live\n").unwrap();
    let node = GpuNode {
        device: 1,
        kind: node_kind::RM,
    };
    let nodes = BTreeMap::from([(dev, node)]);
    let mut maps = fakes.maps();
    let report = seed(&mut maps, &nodes, &h.attributor, &h.proc_root, Some(12));
    assert_eq!(report.fds, 1);
    let info = fakes.gpu_fds.at(&FdKey { tgid: 12, fd: 5 }).unwrap();
    assert_eq!(
        (info.node, info.file),
        (node, 0),
        "its file is learned at its first ioctl"
    );
    assert_eq!(fakes.procs.at(&12).unwrap().gpu_nodes, 0b10);
}

#[test]
fn the_file_table_holds_the_nodes_files_and_says_when_inodes_must_match() {
    let h = host();
    let fakes = Fakes::default();
    let gpu_files = FakeMap::<FileId, GpuNode>::default();
    let mut maps = fakes.maps();
    maps.gpu_files = gpu_files.boxed();
    let dev = h.proc_root.join("nvidia0");
    std::fs::write(&dev, b"").unwrap();
    let nodes = BTreeMap::from([(dev.clone(), GpuNode::default())]);
    assert_eq!(
        sync_files(&mut maps, &nodes),
        (1, 0, true),
        "a regular file: by inode"
    );
    let id = file_id(&dev).unwrap();
    assert_eq!(id.ino, std::fs::metadata(&dev).unwrap().ino());
    assert_eq!(gpu_files.at(&id), Some(GpuNode::default()));
    assert_eq!(sync_files(&mut maps, &nodes), (0, 0, true));
    // A device file is known by its device number alone.
    let null = file_id(Path::new("/dev/null")).unwrap();
    assert_eq!((null.dev, null.ino), (kernel_dev(1, 3), 0));
    assert_eq!(sync_files(&mut maps, &BTreeMap::new()), (0, 1, false));
    assert_eq!(gpu_files.len(), 0);
}

#[test]
fn open_files_no_fd_refers_to_are_collected() {
    let mut h = host();
    let fakes = Fakes::default();
    let mut maps = fakes.maps();
    let mut idle = Idle::default();
    let me = std::process::id();
    maps.gpu_fds
        .insert(
            FdKey { tgid: me, fd: 3 },
            FdInfo {
                node: GpuNode::default(),
                file: 0xaa,
            },
        )
        .unwrap();
    for file in [0xaa, 0xbb] {
        maps.files.insert(file, FileRefs::default()).unwrap();
    }
    let g = collect_garbage(
        &mut maps,
        &mut h.attributor,
        &mut idle,
        Path::new("/proc"),
        Instant::now(),
    );
    assert_eq!(g.handles, 1);
    assert!(fakes.files.at(&0xaa).is_some() && fakes.files.at(&0xbb).is_none());
}

/// What this module removes itself is noted against the budgets of the cgroups it was counted
/// against (the programs never count it out), added to what earlier passes noted; the counts of
/// a cgroup that is gone are dropped.
#[test]
fn entries_removed_here_are_released_from_their_cgroups_budgets() {
    let mut h = host();
    let fakes = Fakes::default();
    let (live, dead) = (10, 11);
    let (cg, gone) = (h.live_id, 999_999);
    {
        let mut procs = fakes.procs.0.lock().unwrap();
        procs.insert(live, proc_info(cg, 1));
        procs.insert(dead, proc_info(cg, 2));
        let mut fds = fakes.gpu_fds.0.lock().unwrap();
        for (tgid, fd) in [(live, 3), (dead, 3), (dead, 4)] {
            fds.insert(
                FdKey { tgid, fd },
                FdInfo {
                    node: GpuNode::default(),
                    file: 0,
                },
            );
        }
        // A device object of a client that is gone, and a mapping of the dead process.
        fakes.object_devices.0.lock().unwrap().insert(
            HandleKey {
                client: 5,
                handle: 6,
            },
            ObjectInfo {
                gpu: 0,
                device: 6,
                cgroup: cg,
            },
        );
        fakes.mappings.0.lock().unwrap().insert(
            MappingKey {
                tgid: dead,
                _pad: 0,
                addr: 0x1000,
            },
            Mapping {
                bytes: 4096,
                cgroup: cg,
                proc_generation: 2,
            },
        );
        let mut tables = fakes.cgroup_tables.0.lock().unwrap();
        tables.insert(
            cg,
            TableUse {
                used: [3, 2, 0, 0, 1, 1],
                refused: [0; 6],
            },
        );
        tables.insert(gone, TableUse::default());
        fakes.cgroup_tables_released.0.lock().unwrap().insert(
            cg,
            TableReleased {
                released: [1, 0, 0, 0, 0, 0],
            },
        );
    }
    let mut maps = fakes.maps();
    let mut idle = Idle::default();
    collect_garbage(
        &mut maps,
        &mut h.attributor,
        &mut idle,
        &h.proc_root,
        Instant::now(),
    );
    assert_eq!(
        fakes.cgroup_tables_released.at(&cg),
        Some(TableReleased {
            released: [3, 1, 0, 0, 1, 1],
        }),
        "the dead process's two fds, its entry and its mapping, and the gone client's device \
         object, added to the earlier one"
    );
    assert_eq!(
        fakes.cgroup_tables.at(&cg).map(|t| t.used),
        Some([3, 2, 0, 0, 1, 1]),
        "the programs' own counts are left alone"
    );
    assert_eq!(fakes.cgroup_tables.at(&gone), None);
}

/// A client (and its allocation) made by a process the pass's read of the process table
/// predates is its live process's, not garbage: housekeeping running beside a burst of client
/// creations used to drop some of them.
#[test]
fn a_client_of_a_process_registered_during_the_pass_is_kept() {
    let mut h = host();
    let fakes = Fakes::default();
    // Pid 10 is alive but not in the process table (yet, as far as the pass read it).
    let info = ClientInfo {
        tgid: 10,
        orphans: 0,
        generation: 7,
        proc_generation: 3,
        cgroup: h.live_id,
        vidmem: [0; MEMORY_SLOTS],
        sysmem: 0,
        file: 0,
    };
    fakes.clients.0.lock().unwrap().insert(1, info);
    let key = HandleKey {
        client: 1,
        handle: 9,
    };
    let allocation = Allocation {
        tgid: 10,
        client_generation: 7,
        ..Allocation::default()
    };
    fakes.allocations.0.lock().unwrap().insert(key, allocation);
    let mut maps = fakes.maps();
    collect_garbage(
        &mut maps,
        &mut h.attributor,
        &mut Idle::default(),
        &h.proc_root,
        Instant::now(),
    );
    assert!(fakes.clients.at(&1).is_some());
    assert!(fakes.allocations.at(&key).is_some());
    // Its process gone, it is garbage.
    std::fs::remove_dir(h.proc_root.join("10")).unwrap();
    collect_garbage(
        &mut maps,
        &mut h.attributor,
        &mut Idle::default(),
        &h.proc_root,
        Instant::now(),
    );
    assert!(fakes.clients.at(&1).is_none());
    assert!(fakes.allocations.at(&key).is_none());
}

/// A file the programs kept past its last tracked fd (someone they don't follow holds it) stays
/// while it lists clients, and so do the clients holding allocations of ended processes
/// (orphans) and those allocations: the driver keeps them with the file. A client of an ended
/// process without orphans, and a kept file without clients, go as before.
#[test]
fn orphans_and_the_file_that_keeps_them_are_not_garbage() {
    let mut h = host();
    let fakes = Fakes::default();
    let mut maps = fakes.maps();
    let mut idle = Idle::default();
    let ended = u32::MAX - 1;
    let mut kept = FileRefs {
        count: 1,
        held: 1,
        ..FileRefs::default()
    };
    kept.clients[0] = 5;
    let empty = FileRefs {
        held: 1,
        ..FileRefs::default()
    };
    for (file, refs) in [(0xaa, kept), (0xbb, empty), (0xcc, FileRefs::default())] {
        maps.files.insert(file, refs).unwrap();
    }
    let client = |orphans: u32| ClientInfo {
        tgid: ended,
        orphans,
        generation: 7,
        proc_generation: 1,
        cgroup: h.live_id,
        vidmem: [0; MEMORY_SLOTS],
        sysmem: 0,
        file: 0xaa,
    };
    maps.clients.insert(5, client(1)).unwrap();
    maps.clients.insert(6, client(0)).unwrap();
    let orphan = HandleKey {
        client: 5,
        handle: 9,
    };
    let allocation = Allocation {
        client_generation: 7,
        bytes: 4 << 20,
        ..Allocation::default()
    };
    maps.allocations.insert(orphan, allocation).unwrap();
    collect_garbage(
        &mut maps,
        &mut h.attributor,
        &mut idle,
        Path::new("/proc"),
        Instant::now(),
    );
    assert!(fakes.files.at(&0xaa).is_some(), "the kept file");
    assert!(fakes.files.at(&0xbb).is_none() && fakes.files.at(&0xcc).is_none());
    assert!(fakes.clients.at(&5).is_some(), "the client with an orphan");
    assert!(fakes.clients.at(&6).is_none(), "an ended process's client");
    assert!(fakes.allocations.at(&orphan).is_some(), "the orphan");
}
