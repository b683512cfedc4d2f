//! Every byte the GPU holds for a container, on the real kernel with the fake driver: an agent
//! that starts after its workload, the other allocation escapes, releases the driver makes
//! without an `RM_FREE`, device nodes reached by other paths, and managed (UVM) memory.
//! (docs/accounting.md says which figures are exact and which are bounds.)

mod util;

use gpuwarden_test_support::{TestCgroup, require_root};
use util::{Client, Driver, TestAgent, container_id, memory};

const MIB: u64 = 1 << 20;

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
