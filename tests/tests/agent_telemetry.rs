//! The agent on the real kernel: eBPF programs see a synthetic GPU client's ioctls on the fake
//! driver, inside cgroups named like containers, and the snapshot shows exact per-container
//! counts and bytes.

use gpuwarden_test_support::{
    TestCgroup,
    agent::{self, TestAgent, ioctls, memory},
    ids::{container_id, pod_uid},
    require_root,
};
use gpuwarden_tests::harness::{Client, Driver};

const MIB: u64 = 1 << 20;

/// Three containers of three runtimes, each through its own life: allocate, partial free, client
/// free, exit. Failing allocations, VA reservations and non-GPU files count nothing.
#[test]
#[ignore = "needs root"]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn three_containers_get_exact_counts_and_bytes() {
    require_root();
    let driver = Driver::mount("three");
    let agent = TestAgent::start(&[driver.glob()]);

    let docker_id = container_id("docker");
    let docker = TestCgroup::create(&format!("/system.slice/docker-{docker_id}.scope"));
    let (containerd_id, containerd_pod) = (container_id("cri"), pod_uid("cri"));
    let containerd = TestCgroup::create(&format!(
        "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{containerd_id}.scope",
        containerd_pod.replace('-', "_")
    ));
    let (crio_id, crio_pod) = (container_id("crio"), pod_uid("crio"));
    let crio = TestCgroup::create(&format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/crio-{crio_id}.scope",
        crio_pod.replace('-', "_")
    ));

    // Docker: allocate in both param forms and layouts, fail one, free one.
    let mut a = Client::spawn(&driver.dir, Some(&docker));
    let client = a.value("client", "client");
    let dev = a.value(&format!("device {client:#x} 0"), "handle");
    let first = a.value(&format!("alloc {client:#x} {dev:#x} 3m"), "handle");
    assert_eq!(
        a.value(
            &format!("alloc {client:#x} {dev:#x} 5m nvos64 v120"),
            "size"
        ),
        6 * MIB
    );
    assert_eq!(
        a.send(&format!("alloc {client:#x} {dev:#x} 2g")),
        "err status=0x51"
    );
    a.ok(&format!("virtual {client:#x} {dev:#x} 256m"));
    let c = agent
        .container(&docker.path)
        .expect("docker container in the snapshot");
    assert_eq!(c.runtime, "docker");
    assert_eq!(c.container_id.as_deref(), Some(docker_id.as_str()));
    assert_eq!(c.pids, vec![a.pid]);
    // 3 MiB and 5 MiB round up to 4 and 6; the failed 2 GiB and the VA range count nothing.
    assert_eq!(memory(&c, "nvidia0"), 10 * MIB);
    assert_eq!(ioctls(&c, "nvidiactl", "rm_alloc"), 6);
    a.ok(&format!("free {client:#x} {dev:#x} {first:#x}"));
    let c = agent.container(&docker.path).unwrap();
    assert_eq!(memory(&c, "nvidia0"), 6 * MIB);
    assert_eq!(ioctls(&c, "nvidiactl", "rm_free"), 1);
    // Same numbers on files that are not GPU nodes: nothing changes.
    a.ok("ioctl-raw /dev/null 0xc020462b");
    let plain = driver.dir.parent().unwrap().join("plain");
    std::fs::write(&plain, b"").unwrap();
    a.ok(&format!("ioctl-raw {} 0xc020462b", plain.display()));
    let after = agent.container(&docker.path).unwrap();
    assert_eq!(
        after.devices, c.devices,
        "non-GPU ioctls changed the counters"
    );

    // containerd under kubepods: a second GPU, the XFER wrapper, UVM, then freeing the client.
    let mut b = Client::spawn(&driver.dir, Some(&containerd));
    let client_b = b.value("client", "client");
    let dev_b = b.value(&format!("device {client_b:#x} 1"), "handle");
    let sub_b = b.value(&format!("subdevice {client_b:#x} {dev_b:#x}"), "handle");
    assert_eq!(
        b.value(&format!("alloc {client_b:#x} {dev_b:#x} 10m xfer"), "size"),
        10 * MIB
    );
    assert_eq!(
        b.value(&format!("alloc {client_b:#x} {sub_b:#x} 2m nvos64"), "size"),
        2 * MIB
    );
    b.ok("uvm init");
    b.ok("uvm 73");
    b.ok("uvm 73");
    b.ok(&format!("control {client_b:#x} {sub_b:#x} 0x20800122"));
    let c = agent
        .container(&containerd.path)
        .expect("containerd container");
    assert_eq!(c.runtime, "containerd");
    assert_eq!(c.container_id.as_deref(), Some(containerd_id.as_str()));
    assert_eq!(c.pod_uid.as_deref(), Some(containerd_pod.as_str()));
    assert_eq!(c.qos.as_deref(), Some("besteffort"));
    assert_eq!(memory(&c, "nvidia1"), 12 * MIB);
    assert_eq!(memory(&c, "nvidia0"), 0);
    assert_eq!(ioctls(&c, "nvidiactl", "rm_alloc"), 5);
    assert_eq!(ioctls(&c, "nvidiactl", "rm_control"), 1);
    assert_eq!(ioctls(&c, "nvidia-uvm", "uvm_initialize"), 1);
    assert_eq!(ioctls(&c, "nvidia-uvm", "uvm_create_external_range"), 2);
    b.ok(&format!("free {client_b:#x} {client_b:#x} {client_b:#x}"));
    let c = agent.container(&containerd.path).unwrap();
    assert_eq!(
        memory(&c, "nvidia1"),
        0,
        "freeing the client releases all it held"
    );

    // CRI-O: allocate, then exit without freeing.
    let mut d = Client::spawn(&driver.dir, Some(&crio));
    let client_d = d.value("client", "client");
    let dev_d = d.value(&format!("device {client_d:#x} 0"), "handle");
    d.ok(&format!("alloc {client_d:#x} {dev_d:#x} 8m v120"));
    d.ok(&format!("alloc {client_d:#x} {dev_d:#x} 1m"));
    let c = agent.container(&crio.path).expect("cri-o container");
    assert_eq!(c.runtime, "cri-o");
    assert_eq!(c.container_id.as_deref(), Some(crio_id.as_str()));
    assert_eq!(c.pod_uid.as_deref(), Some(crio_pod.as_str()));
    assert_eq!(c.qos.as_deref(), Some("burstable"));
    assert_eq!(memory(&c, "nvidia0"), 10 * MIB);
    d.exit();
    let c = agent.container(&crio.path).unwrap();
    assert_eq!(
        memory(&c, "nvidia0"),
        0,
        "exit releases the process's bytes"
    );
    assert!(c.pids.is_empty(), "{:?}", c.pids);
    assert_eq!(
        ioctls(&c, "nvidiactl", "rm_alloc"),
        4,
        "counts outlive the process"
    );

    // The others are untouched by the third's life.
    assert_eq!(
        memory(&agent.container(&docker.path).unwrap(), "nvidia0"),
        6 * MIB
    );
    assert_eq!(agent.snapshot().stats.decode_errors, 0);
    a.exit();
    b.exit();
}

/// An fd opened before the agent started counts (the table is seeded from /proc).
#[test]
#[ignore = "needs root"]
fn fds_opened_before_the_agent_count() {
    require_root();
    let driver = Driver::mount("seed");
    let cg = TestCgroup::create(&format!(
        "/system.slice/docker-{}.scope",
        container_id("seed")
    ));
    let mut client = Client::spawn(&driver.dir, Some(&cg));
    let agent = TestAgent::start(&[driver.glob()]);
    let h = client.value("client", "client");
    let dev = client.value(&format!("device {h:#x} 0"), "handle");
    client.ok(&format!("alloc {h:#x} {dev:#x} 4m"));
    let c = agent
        .container(&cg.path)
        .expect("seeded process is attributed");
    assert_eq!(c.pids, vec![client.pid]);
    assert_eq!(ioctls(&c, "nvidiactl", "rm_alloc"), 3);
    assert_eq!(memory(&c, "nvidia0"), 4 * MIB);
    client.exit();
    assert_eq!(memory(&agent.container(&cg.path).unwrap(), "nvidia0"), 0);

    // Once the cgroup is removed, housekeeping forgets its counters.
    let id = agent.container(&cg.path).unwrap().cgroup_id;
    drop(cg);
    gpuwarden_test_support::wait::until(
        &format!("housekeeping to forget removed cgroup {id}"),
        gpuwarden_test_support::wait::PATIENCE,
        || {
            !agent
                .snapshot()
                .containers
                .iter()
                .any(|c| c.cgroup_id == id)
        },
    );
}

/// A dup'ed fd, two threads and a forked child are all attributed to the right container.
#[test]
#[ignore = "needs root"]
fn dup_threads_and_fork_are_attributed() {
    require_root();
    let driver = Driver::mount("fork");
    let agent = TestAgent::start(&[driver.glob()]);
    let cg = TestCgroup::create(&format!(
        "/system.slice/docker-{}.scope",
        container_id("fork")
    ));
    let mut p = Client::spawn(&driver.dir, Some(&cg));
    let h = p.value("client", "client");
    let dev = p.value(&format!("device {h:#x} 0"), "handle");

    p.ok("dup");
    p.ok(&format!("alloc {h:#x} {dev:#x} 2m"));
    p.ok(&format!("thread alloc {h:#x} {dev:#x} 4m"));
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(memory(&c, "nvidia0"), 6 * MIB, "dup and thread allocations");
    assert_eq!(c.pids, vec![p.pid], "a thread is not a process");

    let child = u32::try_from(p.value("fork", "pid")).unwrap();
    let reply = p.ok(&format!("child alloc {h:#x} {dev:#x} 8m"));
    assert!(reply.starts_with("child: ok"), "{reply}");
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(memory(&c, "nvidia0"), 14 * MIB);
    let mut pids = vec![p.pid, child];
    pids.sort_unstable();
    assert_eq!(c.pids, pids);
    assert_eq!(ioctls(&c, "nvidiactl", "rm_alloc"), 5);

    // The child's exit frees nothing in the driver: its allocation is on the parent's client,
    // which lives with the parent's file, so it stays counted (docs/accounting.md, "Releases").
    p.ok("child exit");
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(memory(&c, "nvidia0"), 14 * MIB);
    assert_eq!(driver.fake.ledger()[0], 14 * MIB, "the driver's figure");
    assert_eq!(c.pids, vec![p.pid]);
    p.exit();
    let c = agent.container(&cg.path).unwrap();
    assert_eq!(
        memory(&c, "nvidia0"),
        0,
        "the parent's exit closes the file"
    );
}

/// One agent per node: a second one on the same state directory refuses to start, saying why.
#[test]
#[ignore = "needs root"]
fn second_agent_refuses_to_start() {
    require_root();
    let first = TestAgent::start(&["/nonexistent/nvidia*".to_owned()]);
    let config = agent::config(&["/nonexistent/nvidia*".to_owned()], &first.state_dir);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = runtime
        .block_on(gpuwarden_agent::daemon::run_until(config, async {}))
        .expect_err("a second agent started");
    let msg = err.to_string();
    assert!(msg.contains("already running"), "{msg}");
    assert!(msg.contains(&std::process::id().to_string()), "{msg}");
    assert!(
        first.try_snapshot().is_ok(),
        "the first agent must keep running"
    );
}
