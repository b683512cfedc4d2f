//! Every byte the GPU holds for a container, on the real kernel with the fake driver: an agent
//! that starts after its workload, the other allocation escapes, releases the driver makes
//! without an `RM_FREE`, device nodes reached by other paths, and managed (UVM) memory.
//! (docs/accounting.md says which figures are exact and which are bounds.)

use std::{path::Path, time::Duration};

use gpuwarden_test_support::{
    TestCgroup,
    agent::{TestAgent, memory},
    ids::container_id,
    require_root,
};
use gpuwarden_tests::{
    fake_driver::{FakeConfig, FakeDriver},
    harness::{Client, Driver},
};

const MIB: u64 = 1 << 20;
/// FUSE reports the last close of a file asynchronously.
const RELEASE: Duration = Duration::from_secs(10);

/// A cgroup named like a Docker container.
fn docker(seed: &str) -> TestCgroup {
    TestCgroup::create(&format!(
        "/system.slice/docker-{}.scope",
        container_id(seed)
    ))
}

/// Opens a client and a device on GPU `gpu`: returns (client, device) handles.
fn handles(client: &mut Client, gpu: u32) -> (u64, u64) {
    let h = client.value("client", "client");
    let dev = client.value(&format!("device {h:#x} {gpu}"), "handle");
    (h, dev)
}

/// The client and its device handle exist before the agent starts (first rollout, or an agent
/// upgrade that lost its pinned maps): later allocations are charged to the container and the
/// process, on the GPU whose node the process holds, and the process's exit releases them.
#[test]
#[ignore = "needs root"]
fn an_agent_started_after_the_handles_counts_later_allocations() {
    require_root();
    let driver = Driver::mount("late");
    let cg = docker("late");
    let mut a = Client::spawn(&driver.dir, Some(&cg));
    let (h, dev) = handles(&mut a, 0);
    let agent = TestAgent::start(&[driver.glob()]);
    a.ok(&format!("alloc {h:#x} {dev:#x} 4m"));
    a.ok(&format!("alloc {h:#x} {dev:#x} 2m nvos64"));
    let c = agent.container(&cg.path).expect("the late process is seen");
    assert_eq!(c.pids, vec![a.pid]);
    assert_eq!(memory(&c, "nvidia0"), 6 * MIB);
    assert_eq!(memory(&c, "unknown"), 0);
    assert_eq!(agent.snapshot().stats.decode_errors, 0);
    a.exit();
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(
        memory(&c, "nvidia0"),
        0,
        "the process's exit releases its bytes"
    );
}

/// A late allocation whose GPU can't be told (the process holds two GPU nodes and its device
/// handle predates the agent) is still charged, under the device "unknown"; a device handle made
/// after the agent started is resolved as before.
#[test]
#[ignore = "needs root"]
fn a_late_allocation_whose_gpu_cannot_be_told_is_charged_to_device_unknown() {
    require_root();
    let driver = Driver::mount("unk");
    let cg = docker("unk");
    let mut a = Client::spawn(&driver.dir, Some(&cg));
    a.ok("open nvidia1");
    let (h, dev) = handles(&mut a, 1);
    let agent = TestAgent::start(&[driver.glob()]);
    a.ok(&format!("alloc {h:#x} {dev:#x} 8m"));
    let dev1 = a.value(&format!("device {h:#x} 1"), "handle");
    // The driver allows one device object per GPU and client in reality; the fake doesn't care.
    a.ok(&format!("alloc {h:#x} {dev1:#x} 2m"));
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(memory(&c, "unknown"), 8 * MIB);
    assert_eq!(memory(&c, "nvidia1"), 2 * MIB);
    assert_eq!(memory(&c, "nvidia0"), 0);
    a.ok(&format!("free {h:#x} {h:#x} {h:#x}"));
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(memory(&c, "unknown"), 0, "freeing the client releases it");
    assert_eq!(memory(&c, "nvidia1"), 0);
    a.exit();
}

/// `RM_VID_HEAP_CONTROL`, `RM_ALLOC_MEMORY` and system memory (`NV01_MEMORY_SYSTEM`, host memory
/// pinned for the GPU) are counted — video memory per GPU, system memory apart — and their frees
/// release them; what holds no memory (VA reservations, framebuffer views) counts nothing. The
/// agent's figures equal the driver's own.
#[test]
#[ignore = "needs root"]
fn every_allocation_path_counts_and_system_memory_apart() {
    require_root();
    let driver = Driver::mount("paths");
    let agent = TestAgent::start(&[driver.glob()]);
    let cg = docker("paths");
    let mut a = Client::spawn(&driver.dir, Some(&cg));
    let (h, dev) = handles(&mut a, 0);
    let heap = a.value(&format!("vidheap {h:#x} {dev:#x} 3m"), "handle");
    a.ok(&format!("vidheap {h:#x} {dev:#x} 1m sysmem"));
    a.ok(&format!("vidheap {h:#x} {dev:#x} 64m virtual"));
    let sys = a.value(&format!("sysmem {h:#x} {dev:#x} 2m"), "handle");
    a.ok(&format!("allocmem {h:#x} {dev:#x} 0xd0000001 8m system"));
    a.ok(&format!("allocmem {h:#x} {dev:#x} 0xd0000002 4m osdesc"));
    a.ok(&format!("allocmem {h:#x} {dev:#x} 0xd0000003 1m local"));
    assert_eq!(driver.fake.ledger(), vec![4 * MIB, 0]);
    assert_eq!(driver.fake.sysmem(), 15 * MIB);
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(
        memory(&c, "nvidia0"),
        4 * MIB,
        "video memory as the driver rounded it"
    );
    assert_eq!(c.system_memory_bytes, 15 * MIB);
    assert_eq!(agent.snapshot().stats.decode_errors, 0);

    a.ok(&format!("vidheap-free {h:#x} {dev:#x} {heap:#x}"));
    a.ok(&format!("free {h:#x} {dev:#x} {sys:#x}"));
    a.ok(&format!("free {h:#x} {dev:#x} 0xd0000001"));
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(memory(&c, "nvidia0"), 0);
    assert_eq!(c.system_memory_bytes, driver.fake.sysmem());
    assert_eq!(c.system_memory_bytes, 5 * MIB);
    a.exit();
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(
        c.system_memory_bytes, 0,
        "the process's exit releases its system memory"
    );
}

/// The node is known by the file it opens, not by the path string: a client whose device nodes
/// are reached through a symlinked directory, a relative path, `/proc/self/fd/N`, or a mount
/// point whose paths are 64 bytes or more is counted like any other.
#[test]
#[ignore = "needs root"]
fn device_nodes_reached_by_any_path_count() {
    require_root();
    let driver = Driver::mount("anypath");
    // A second driver whose paths are too long for a path table.
    let long_dir = driver
        .dir
        .parent()
        .unwrap()
        .join(format!("a-mount-point-with-a-long-name-{}", "x".repeat(40)));
    let long = FakeDriver::mount(&long_dir, &FakeConfig::default()).unwrap();
    assert!(long.path("nvidiactl").as_os_str().len() >= 64);
    let agent = TestAgent::start(&[driver.glob(), format!("{}/nvidia*", long_dir.display())]);
    let link = driver.dir.parent().unwrap().join("link");
    std::os::unix::fs::symlink(&driver.dir, &link).unwrap();

    let cg = docker("anypath");
    let mut clients = vec![
        Client::spawn(&link, Some(&cg)),
        Client::spawn_in(Path::new("."), Some(&cg), Some(&driver.dir)),
        Client::spawn(&long_dir, Some(&cg)),
    ];
    // Through /proc/self/fd/N: the control node reopened by its fd's magic link.
    let mut proc_fd = Client::spawn(&driver.dir, Some(&cg));
    let ctl = proc_fd.value("dup", "fd");
    let reopened = proc_fd.value(&format!("open /proc/self/fd/{ctl}"), "fd");
    proc_fd.ok(&format!("use-ctl {reopened}"));
    clients.push(proc_fd);
    for (i, c) in clients.iter_mut().enumerate() {
        let (h, dev) = handles(c, 0);
        c.ok(&format!("alloc {h:#x} {dev:#x} {}m", 2 * (i + 1)));
    }
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(memory(&c, "nvidia0"), (2 + 4 + 6 + 8) * MIB);
    let mut pids: Vec<u32> = clients.iter().map(|c| c.pid).collect();
    pids.sort_unstable();
    assert_eq!(c.pids, pids);
    assert_eq!(
        driver.fake.ledger()[0] + long.ledger()[0],
        memory(&c, "nvidia0"),
        "the agent's figure is the drivers'"
    );
    for c in clients {
        c.exit();
    }
    assert_eq!(memory(&agent.container(&cg.path).unwrap(), "nvidia0"), 0);
}

/// A GPU fd numbered above 1023 is copied into a forked child: the child's allocations through
/// it count.
#[test]
#[ignore = "needs root"]
fn a_high_gpu_fd_is_copied_into_a_forked_child() {
    require_root();
    let driver = Driver::mount("highfd");
    let agent = TestAgent::start(&[driver.glob()]);
    let cg = docker("highfd");
    let mut p = Client::spawn(&driver.dir, Some(&cg));
    let (h, dev) = handles(&mut p, 0);
    assert_eq!(p.value("dup-to ctl 1500", "fd"), 1500);
    p.ok("fork");
    let reply = p.ok(&format!("child alloc {h:#x} {dev:#x} 8m"));
    assert!(reply.starts_with("child: ok"), "{reply}");
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(
        memory(&c, "nvidia0"),
        8 * MIB,
        "the child's allocation through fd 1500"
    );
    assert_eq!(c.pids.len(), 2);
    p.ok("child exit");
    p.exit();
}

/// What the driver frees without an `RM_FREE` of each object is released: the last close of the
/// file a client was made through (every dup closed), freeing a device handle (its memory and its
/// subdevices' go with it), and `close_range`.
#[test]
#[ignore = "needs root"]
#[expect(
    clippy::many_single_char_names,
    reason = "one letter per actor of the scenario"
)]
fn releases_the_driver_makes_without_a_free_are_seen() {
    require_root();
    let driver = Driver::mount("release");
    let agent = TestAgent::start(&[driver.glob()]);
    let cg = docker("release");
    let held = |agent: &TestAgent| memory(&agent.container(&cg.path).unwrap(), "nvidia0");

    // The last close of the control file.
    let mut a = Client::spawn(&driver.dir, Some(&cg));
    let (h, dev) = handles(&mut a, 0);
    a.ok(&format!("alloc {h:#x} {dev:#x} 4m"));
    a.ok("dup");
    a.ok("close ctl");
    assert_eq!(held(&agent), 4 * MIB, "a dup still holds the file");
    a.ok("close ctl");
    assert_eq!(held(&agent), 0, "the last close frees the client");
    driver.fake.wait_for_ledger(&[0, 0], RELEASE).unwrap();

    // Freeing a device handle.
    let mut b = Client::spawn(&driver.dir, Some(&cg));
    let (h, dev) = handles(&mut b, 0);
    let sub = b.value(&format!("subdevice {h:#x} {dev:#x}"), "handle");
    b.ok(&format!("alloc {h:#x} {dev:#x} 4m"));
    b.ok(&format!("alloc {h:#x} {sub:#x} 2m"));
    b.ok(&format!("vidheap {h:#x} {dev:#x} 2m"));
    let other = b.value(&format!("device {h:#x} 1"), "handle");
    b.ok(&format!("alloc {h:#x} {other:#x} 2m"));
    assert_eq!(held(&agent), 8 * MIB);
    b.ok(&format!("free {h:#x} {h:#x} {dev:#x}"));
    assert_eq!(driver.fake.ledger(), vec![0, 2 * MIB]);
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(memory(&c, "nvidia0"), 0, "the device's memory goes with it");
    assert_eq!(memory(&c, "nvidia1"), 2 * MIB, "another device's stays");
    // The subdevice went too: an allocation under it now fails, and nothing is charged.
    assert!(
        b.send(&format!("alloc {h:#x} {sub:#x} 2m"))
            .starts_with("err")
    );
    assert_eq!(held(&agent), 0);
    b.exit();

    // close_range over every fd from 3 up.
    let mut d = Client::spawn(&driver.dir, Some(&cg));
    let (h, dev) = handles(&mut d, 0);
    d.ok(&format!("alloc {h:#x} {dev:#x} 6m"));
    assert_eq!(held(&agent), 6 * MIB);
    d.ok("close-range 3 4294967295");
    assert_eq!(held(&agent), 0);
    driver.fake.wait_for_ledger(&[0, 0], RELEASE).unwrap();
    d.exit();
}

/// Managed memory (`cudaMallocManaged`) is the length of each mapping of the UVM node: counted
/// apart from video memory (a bound: what the process may place on a GPU), released by
/// `munmap` from its start or by the process's end. The anonymous reservation CUDA maps it over
/// counts nothing.
#[test]
#[ignore = "needs root"]
fn managed_memory_is_the_uvm_mappings_length() {
    require_root();
    let driver = Driver::mount("uvm");
    let agent = TestAgent::start(&[driver.glob()]);
    let cg = docker("uvm");
    let mut a = Client::spawn(&driver.dir, Some(&cg));
    a.ok("uvm init");
    let big = a.value("uvm mmap 64m", "addr");
    a.value("uvm mmap 8m", "addr");
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(c.managed_memory_bytes, 72 * MIB);
    assert_eq!(memory(&c, "nvidia0"), 0, "not video memory");
    a.ok(&format!("uvm munmap {big:#x} 64m"));
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(c.managed_memory_bytes, 8 * MIB);
    a.exit();
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(
        c.managed_memory_bytes, 0,
        "the process's end releases its mappings"
    );
    let s = agent.snapshot();
    let managed = s
        .accuracy
        .iter()
        .find(|f| f.figure == "managed_memory_bytes")
        .expect("the snapshot says how exact each figure is");
    assert_eq!(managed.accuracy, "bound");
    let video = s
        .accuracy
        .iter()
        .find(|f| f.figure == "devices.memory_bytes")
        .unwrap();
    assert_eq!(video.accuracy, "exact");
}
