//! MIG instances as devices (issue 37, docs/mig.md), on the real kernel with the fake driver:
//! two containers on two GPU instances of one GPU, each charged exactly what the driver's own
//! ledger says it charged to that instance. (Its own test binary, its tests one at a time:
//! instance names are the agent's process-wide state.)

// Test helpers fail loudly on anything unexpected.
#![expect(
    clippy::unwrap_used,
    reason = "a test's helpers unwrap: a failure there is the test failing"
)]

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use std::os::unix::process::ExitStatusExt as _;

use gpuwarden_proto::v1 as pb;
use gpuwarden_test_support::{
    TestCgroup,
    agent::{TestAgent, config, memory, used},
    devnode::{mknod, open_in},
    ids::container_id,
    require_root, scratch,
};
use gpuwarden_tests::{
    fake_driver::{FakeConfig, FakeDriver, FakeInstance, ci_cap_minor, gi_cap_minor},
    harness::{Client, Driver, rig::Rig},
};

const MIB: u64 = 1 << 20;

/// Held by each test: the agents of two tests at once would name instances for each other.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
const GIB: u64 = 1 << 30;

/// GPU 1 in MIG mode with GPU instances 9 and 10 (one compute instance each).
fn instances() -> Vec<FakeInstance> {
    [(9, 256 * MIB), (10, 512 * MIB)]
        .into_iter()
        .map(|(gpu_instance, memory)| FakeInstance {
            gpu: 1,
            gpu_instance,
            compute_instances: vec![0],
            memory,
        })
        .collect()
}

/// The mock devices the agent is given for that driver: GPU 0 whole, GPU 1 as its instances.
fn mock_devices(minors: &Path) -> String {
    format!(
        r#"
mig_minors = "{}"

[[devices]]
uuid = "GPU-whole"
model_name = "Fake H200"
memory_size = "1G"

[[devices]]
uuid = "GPU-parent"
model_name = "Fake H200"
memory_size = "1G"
[[devices.instances]]
uuid = "MIG-nine"
profile = "1g.18gb"
gpu_instance = 9
memory_size = "256M"
[[devices.instances]]
uuid = "MIG-ten"
profile = "2g.35gb"
gpu_instance = 10
memory_size = "512M"
"#,
        minors.display()
    )
}

fn docker(seed: &str) -> TestCgroup {
    TestCgroup::create(&format!(
        "/system.slice/docker-{}.scope",
        container_id(seed)
    ))
}

/// A client on the instance's GPU subscribed to it through its capability node (a file named
/// `nvidia-cap<minor>` under `caps`): returns (client, device) handles.
fn on_instance(c: &mut Client, caps: &Path, instance: &FakeInstance) -> (u64, u64) {
    let gpu = instance.gpu;
    if gpu != 0 {
        c.ok(&format!("open nvidia{gpu}"));
    }
    let h = c.value("client", "client");
    let dev = c.value(&format!("device {h:#x} {gpu}"), "handle");
    let sub = c.value(&format!("subdevice {h:#x} {dev:#x}"), "handle");
    let cap = caps.join(format!("nvidia-cap{}", gi_cap_minor(instance)));
    let fd = c.value(&format!("open {}", cap.display()), "fd");
    let partition = c.value(
        &format!("partition {h:#x} {sub:#x} {} {fd}", instance.gpu_instance),
        "handle",
    );
    c.ok(&format!("exec-partition {h:#x} {partition:#x} 0"));
    (h, dev)
}

#[test]
#[ignore = "needs root"]
fn two_containers_on_two_instances_of_one_gpu_are_each_charged_to_theirs() {
    require_root();
    let _one = one_at_a_time();
    let dir = scratch("mig");
    let mig = instances();
    let fake = FakeDriver::mount(
        &dir.path().join("dev"),
        &FakeConfig {
            gpu_memory: vec![GIB, GIB],
            mig: mig.clone(),
        },
    )
    .unwrap();
    let minors = dir.path().join("mig-minors");
    std::fs::write(&minors, fake.mig_minors()).unwrap();
    let caps = dir.path().join("nvidia-caps");
    std::fs::create_dir(&caps).unwrap();
    for i in &mig {
        std::fs::write(caps.join(format!("nvidia-cap{}", gi_cap_minor(i))), "").unwrap();
    }
    let mock = dir.path().join("mock.toml");
    std::fs::write(&mock, mock_devices(&minors)).unwrap();
    let state = scratch("mig-agent");
    let mut cfg = config(&[format!("{}/nvidia*", fake.dir().display())], state.path());
    cfg.mock_devices = Some(mock);
    let agent = TestAgent::start_with(cfg);

    let (cg_a, cg_b) = (docker("mig-a"), docker("mig-b"));
    let mut a = Client::spawn(fake.dir(), Some(&cg_a));
    let mut b = Client::spawn(fake.dir(), Some(&cg_b));
    let (client_nine, dev_nine) = on_instance(&mut a, &caps, &mig[0]);
    let (client_ten, dev_ten) = on_instance(&mut b, &caps, &mig[1]);
    let first = a.value(
        &format!("alloc {client_nine:#x} {dev_nine:#x} 6m"),
        "handle",
    );
    a.ok(&format!("alloc {client_nine:#x} {dev_nine:#x} 3m nvos64"));
    b.ok(&format!("alloc {client_ten:#x} {dev_ten:#x} 20m"));
    b.ok(&format!("vidheap {client_ten:#x} {dev_ten:#x} 7m"));

    // The driver's own account: 6 + 4 (3 rounded to 2 MiB pages) on instance 9, 20 + 8 on 10.
    let ledger = fake.instance_ledger();
    assert_eq!(
        ledger,
        BTreeMap::from([((1, 9), 10 * MIB), ((1, 10), 28 * MIB)])
    );
    let check = |agent: &TestAgent, ledger: &BTreeMap<(usize, u32), u64>| {
        let ca = agent.container(&cg_a.path).unwrap();
        let cb = agent.container(&cg_b.path).unwrap();
        assert_eq!(memory(&ca, "nvidia1/gi9"), ledger[&(1, 9)], "{ca:?}");
        assert_eq!(memory(&cb, "nvidia1/gi10"), ledger[&(1, 10)], "{cb:?}");
        // Nothing on the other instance, on the parent as a whole, or unattributed.
        for (c, other) in [(&ca, "nvidia1/gi10"), (&cb, "nvidia1/gi9")] {
            assert_eq!(memory(c, other), 0);
            assert_eq!(memory(c, "nvidia1"), 0);
            assert_eq!(memory(c, "unknown"), 0);
        }
    };
    check(&agent, &ledger);
    assert_eq!(agent.snapshot().stats.decode_errors, 0);

    // A free comes off the instance it was charged to.
    a.ok(&format!("free {client_nine:#x} {dev_nine:#x} {first:#x}"));
    let ledger = fake.instance_ledger();
    assert_eq!(ledger[&(1, 9)], 4 * MIB);
    check(&agent, &ledger);

    a.exit();
    b.exit();
    assert!(fake.wait_until(std::time::Duration::from_secs(10), |f| {
        f.instance_ledger().values().all(|&b| b == 0)
    }));
    for cg in [&cg_a, &cg_b] {
        let c = agent.container(&cg.path);
        let held: u64 = c.map_or(0, |c| c.devices.iter().map(|d| d.memory_bytes).sum());
        assert_eq!(
            held, 0,
            "the processes' exits release their instances' bytes"
        );
    }
}

/// A character-device major no driver of this machine has (the "local/experimental" range):
/// nodes made with it open with `ENXIO` unless the device program refuses them first.
fn free_major() -> u32 {
    let devices = std::fs::read_to_string("/proc/devices").unwrap();
    let taken: Vec<u32> = devices
        .lines()
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    (240..=254).find(|m| !taken.contains(m)).unwrap()
}

/// A quota on one instance of a GPU in MIG mode opens that instance's capability nodes and its
/// parent's node, not the other instance's (`EPERM`); its memory limit is the instance's and
/// is acted on.
#[test]
#[ignore = "needs root"]
#[expect(clippy::too_many_lines, reason = "one scenario, read top to bottom")]
fn a_quota_on_an_instance_opens_only_its_capability_nodes_and_limits_its_memory() {
    require_root();
    let _one = one_at_a_time();
    let major = free_major();
    // GPU 0 in MIG mode: instances 9 and 10, the only devices the controller sees.
    let mig: Vec<FakeInstance> = instances()
        .into_iter()
        .map(|i| FakeInstance { gpu: 0, ..i })
        .collect();
    let (driver, minors) = mig_driver("migq", vec![GIB], mig.clone());
    let mock = format!(
        r#"
mig_minors = "{}"
mig_caps_major = {major}

[[devices]]
uuid = "GPU-parent"
model_name = "Fake H200"
memory_size = "1G"
[[devices.instances]]
uuid = "MIG-nine"
profile = "1g.18gb"
gpu_instance = 9
memory_size = "256M"
[[devices.instances]]
uuid = "MIG-ten"
profile = "2g.35gb"
gpu_instance = 10
memory_size = "512M"
"#,
        minors.display()
    );
    let rig = Rig::start_on(driver, &mock);
    // The agent declared its profiles: the controller knows them as slot types.
    let types = rig.rt.block_on(async {
        let mut c = rig.client().await;
        c.list_slot_types(pb::ListSlotTypesRequest {})
            .await
            .unwrap()
            .into_inner()
            .slot_types
    });
    for name in ["cuda.mig.1g.18gb", "cuda.mig.2g.35gb"] {
        assert!(types.iter().any(|t| t.name == name), "{name} in {types:?}");
    }
    // The allocation map lists the instances under the GPU they are part of, as the device
    // list above declares them.
    let map = rig.rt.block_on(async {
        let mut c = rig.client().await;
        c.get_allocation_map(pb::GetAllocationMapRequest {
            node_id: "test-node".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
    });
    let rows: Vec<(&str, &str)> = map.nodes[0]
        .devices
        .iter()
        .map(|d| (d.uuid.as_str(), d.parent_uuid.as_str()))
        .collect();
    assert_eq!(
        rows,
        [("MIG-nine", "GPU-parent"), ("MIG-ten", "GPU-parent")]
    );
    let (nodes, files) = capability_nodes("migq", major, &mig, &[("nvidia0", 0), ("nvidia1", 1)]);

    let cg = docker("migq");
    let session = rig.session(
        &["cuda.shares=1", "cuda.mem=16m"],
        pb::target::Kind::CgroupPath(cg.path.clone()),
        "kill",
    );
    rig.wait_binding(&session.id, "bound");
    // The controller chose one of the two instances (device indexes 1 and 2).
    let index = session.devices[0].index;
    let (mine, other) = match index {
        1 => (&mig[0], &mig[1]),
        2 => (&mig[1], &mig[0]),
        i => panic!("the session is on device {i}, no instance"),
    };
    // The parent's node opens (its minor, not the instance's index), the other GPU node not.
    opens_only(&cg, nodes.path(), mine, other);
    assert_eq!(open_in(&cg, &nodes.path().join("nvidia1")), libc::EPERM);
    // Outside the bound cgroup nothing changes.
    let outside = std::fs::File::open(
        nodes
            .path()
            .join(format!("nvidia-cap{}", gi_cap_minor(other))),
    );
    assert_eq!(outside.unwrap_err().raw_os_error(), Some(libc::ENXIO));

    // The memory limit is the instance's: 12 MiB fits, 8 more does not.
    let mut a = Client::spawn(&rig.driver.dir, Some(&cg));
    let (h, dev) = on_instance(&mut a, files.path(), mine);
    a.ok(&format!("alloc {h:#x} {dev:#x} 12m"));
    let c = rig.entry(&cg);
    let name = format!("nvidia0/gi{}", mine.gpu_instance);
    assert_eq!(memory(&c, &name), 12 * MIB);
    assert_eq!(
        rig.driver.fake.instance_ledger()[&(0, mine.gpu_instance)],
        12 * MIB
    );
    killed_on(&rig, &cg, a, &format!("alloc {h:#x} {dev:#x} 8m"), index);

    // A request for the other instance's profile is placed on that instance, and bound.
    let (other_slot, other_index) = if other.gpu_instance == 9 {
        ("cuda.mig.1g.18gb=1", 1)
    } else {
        ("cuda.mig.2g.35gb=1", 2)
    };
    let cg2 = docker("migq2");
    let placed = rig.session(
        &[other_slot],
        pb::target::Kind::CgroupPath(cg2.path.clone()),
        "kill",
    );
    assert_eq!(placed.devices.len(), 1);
    assert_eq!(placed.devices[0].index, other_index);
    assert!(placed.devices[0].exclusive);
    rig.wait_binding(&placed.id, "bound");
}

/// The GPU instance of a MIG device the mock made, read from its UUID (the mock names a made
/// instance `MIG-<parent>-gi<gpu instance>-<n>`).
fn made_gpu_instance(uuid: &str) -> u32 {
    uuid.split("-gi")
        .nth(1)
        .and_then(|rest| rest.split('-').next())
        .and_then(|gi| gi.parse().ok())
        .unwrap_or_else(|| panic!("{uuid} names no GPU instance"))
}

/// An instance the agent makes on the controller's order is written to the programs' table:
/// memory a process of the session allocates on it is counted as the instance (and against the
/// session's quota on it), not as its parent GPU; once the instance is destroyed, memory
/// charged to that GPU instance counts as the parent's again.
#[test]
#[ignore = "needs root"]
fn memory_on_an_instance_made_on_order_is_counted_as_the_instance() {
    require_root();
    let _one = one_at_a_time();
    // The driver lists GPU instances 1-7 of GPU 0 (as the real one lists every instance a GPU
    // could hold); the agent is told of none: GPU 0 is in MIG mode with no instance, and given
    // to gpuwarden to cut.
    let possible = possible_instances(64 * MIB);
    let (driver, minors) = mig_driver("migmade", vec![GIB], possible.clone());
    let rig = on_a_gpu_to_cut(driver, &minors, None);

    // No instance exists: one is made for the session, which is bound to it.
    let cg = docker("migmade");
    let session = rig.session(
        &["cuda.mig.1g.18gb=1"],
        pb::target::Kind::CgroupPath(cg.path.clone()),
        "kill",
    );
    rig.wait_binding(&session.id, "bound");
    assert_eq!(session.devices.len(), 1, "{session:?}");
    let uuid = session.devices[0].uuid.clone();
    let gi = made_gpu_instance(&uuid);
    let instance = possible
        .iter()
        .find(|i| i.gpu_instance == gi)
        .unwrap_or_else(|| panic!("GPU instance {gi} is none the driver lists"));
    let caps = scratch("migmade-caps");
    std::fs::write(
        caps.path()
            .join(format!("nvidia-cap{}", gi_cap_minor(instance))),
        "",
    )
    .unwrap();

    // A process of the session subscribes to the instance and allocates on it.
    let mut a = Client::spawn(&rig.driver.dir, Some(&cg));
    let (h, dev) = on_instance(&mut a, caps.path(), instance);
    a.ok(&format!("alloc {h:#x} {dev:#x} 6m"));
    a.ok(&format!("vidheap {h:#x} {dev:#x} 3m"));
    // Judged by the driver's own account of what it charged to that GPU instance.
    let charged = rig.driver.fake.instance_ledger()[&(0, gi)];
    assert!(charged >= 9 * MIB, "{charged}");
    let name = format!("nvidia0/gi{gi}");
    let c = rig.entry(&cg);
    assert_eq!(memory(&c, &name), charged, "{c:?}");
    assert_eq!(memory(&c, "nvidia0"), 0, "{c:?}");
    assert_eq!(memory(&c, "unknown"), 0, "{c:?}");
    // The session's quota, on the instance, sees it.
    assert_eq!(used(&c), charged, "{c:?}");
    a.exit();
    assert!(
        rig.driver
            .fake
            .wait_until(std::time::Duration::from_secs(10), |f| {
                f.instance_ledger().values().all(|&b| b == 0)
            })
    );

    // The session ends: the instance is destroyed, and the agent registers without it.
    rig.rt.block_on(async {
        rig.client()
            .await
            .terminate_session(pb::TerminateSessionRequest {
                id: session.id.clone(),
            })
            .await
            .unwrap();
    });
    rig.wait_for("the made instance to be destroyed", |r| {
        let nodes = r.nodes();
        nodes.len() == 1
            && nodes[0]
                .info
                .as_ref()
                .is_some_and(|i| i.devices.iter().all(|d| d.uuid != uuid))
    });
    // The link registers again only once the agent's task has written the table without it
    // (`devices::changes`): no margin needed here.
    // The driver still takes the subscription (the fake does not forget instances): the
    // agent's table no longer names that GPU instance, so its memory is the parent's.
    let cg2 = docker("migmade2");
    let mut b = Client::spawn(&rig.driver.dir, Some(&cg2));
    let (h, dev) = on_instance(&mut b, caps.path(), instance);
    b.ok(&format!("alloc {h:#x} {dev:#x} 4m"));
    let charged = rig.driver.fake.instance_ledger()[&(0, gi)];
    let c = rig.entry(&cg2);
    assert_eq!(memory(&c, "nvidia0"), charged, "{c:?}");
    assert_eq!(memory(&c, &name), 0, "{c:?}");
    b.exit();
}

/// An instance made on the controller's order is isolated and limited like one the operator
/// made: the session's quota opens that instance's capability nodes (the minors the agent read
/// from `mig-minors` once the instance existed) and its parent's node, not another instance's
/// (`EPERM`); its memory limit is acted on within the instance (the driver's own ledger of that
/// GPU instance says what fitted).
#[test]
#[ignore = "needs root"]
fn a_quota_on_a_made_instance_opens_only_its_capability_nodes_and_limits_its_memory() {
    require_root();
    let _one = one_at_a_time();
    let major = free_major();
    // Room in the driver past the instance's limit, which the agent acts on first.
    let possible = possible_instances(32 * GIB);
    let (driver, minors) = mig_driver("migmadeq", vec![160 * GIB], possible.clone());
    let rig = on_a_gpu_to_cut(driver, &minors, Some(major));
    // Every instance the driver could hold.
    let (nodes, files) = capability_nodes("migmadeq", major, &possible, &[("nvidia0", 0)]);

    let cg = docker("migmadeq");
    let session = rig.session(
        &["cuda.mig.1g.18gb=1"],
        pb::target::Kind::CgroupPath(cg.path.clone()),
        "kill",
    );
    rig.wait_binding(&session.id, "bound");
    let (index, uuid) = (session.devices[0].index, session.devices[0].uuid.clone());
    let gi = made_gpu_instance(&uuid);
    let mine = possible.iter().find(|i| i.gpu_instance == gi).unwrap();
    let other = possible.iter().find(|i| i.gpu_instance != gi).unwrap();

    opens_only(&cg, nodes.path(), mine, other);

    // The limit is the whole instance's memory (a profile is held whole), as the node declared
    // the made device: up to 8 MiB short of it fits, 16 MiB more is killed.
    let name = format!("nvidia0/gi{gi}");
    let limit = made_device_memory(&rig, &uuid);
    let quota = rig
        .agent()
        .snapshot()
        .bindings
        .into_iter()
        .find(|b| b.session_id == session.id)
        .unwrap()
        .quota;
    assert_eq!(quota.devices.len(), 1, "{quota:?}");
    assert_eq!(quota.devices[0].memory_bytes, limit, "{quota:?}");
    let mut a = Client::spawn(&rig.driver.dir, Some(&cg));
    let (h, dev) = on_instance(&mut a, files.path(), mine);
    let fits = limit - 8 * MIB;
    a.ok(&format!("alloc {h:#x} {dev:#x} {fits}"));
    // Judged by the driver's own ledger of that GPU instance (it charges whole pages).
    let charged = rig.driver.fake.instance_ledger()[&(0, gi)];
    assert!((fits..fits + 2 * MIB).contains(&charged), "{charged}");
    assert_eq!(memory(&rig.entry(&cg), &name), charged);
    killed_on(&rig, &cg, a, &format!("alloc {h:#x} {dev:#x} 16m"), index);
}

/// The capability nodes of `instances` (their GPU and compute instances') as character devices
/// of `major`, with `gpus` and `nvidiactl` as NVIDIA's nodes, in one scratch directory; and the
/// GPU instances' nodes as plain files a client can hold open, in another.
fn capability_nodes(
    tag: &str,
    major: u32,
    instances: &[FakeInstance],
    gpus: &[(&str, u32)],
) -> (tempfile::TempDir, tempfile::TempDir) {
    let nodes = scratch(&format!("{tag}-nodes"));
    let files = scratch(&format!("{tag}-caps"));
    for i in instances {
        for minor in [gi_cap_minor(i), ci_cap_minor(i, 0)] {
            mknod(
                &nodes.path().join(format!("nvidia-cap{minor}")),
                major,
                minor,
            );
        }
        let name = format!("nvidia-cap{}", gi_cap_minor(i));
        std::fs::write(files.path().join(name), "").unwrap();
    }
    for &(name, minor) in gpus.iter().chain(&[("nvidiactl", 255)]) {
        mknod(&nodes.path().join(name), 195, minor);
    }
    (nodes, files)
}

/// In `cg`, `mine`'s two capability nodes under `nodes` open (`ENXIO`: no driver behind the
/// major), `other`'s are refused (`EPERM`), and so do its parent GPU 0's node and `nvidiactl`.
fn opens_only(cg: &TestCgroup, nodes: &Path, mine: &FakeInstance, other: &FakeInstance) {
    let open = |name: String| open_in(cg, &nodes.join(name));
    for (instance, want) in [(mine, libc::ENXIO), (other, libc::EPERM)] {
        for minor in [gi_cap_minor(instance), ci_cap_minor(instance, 0)] {
            assert_eq!(
                open(format!("nvidia-cap{minor}")),
                want,
                "capability node {minor} of GPU instance {}",
                instance.gpu_instance
            );
        }
    }
    assert_eq!(open("nvidia0".into()), libc::ENXIO);
    assert_eq!(open("nvidiactl".into()), libc::ENXIO);
}

/// `command` (an allocation past the quota) gets client `a` in `cg` killed, and the agent
/// records the kill on device `index`.
fn killed_on(rig: &Rig, cg: &TestCgroup, mut a: Client, command: &str, index: u32) {
    a.send_only(command);
    let status = a.wait();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    rig.wait_for("the kill to be recorded", |r| {
        r.agent().container(&cg.path).is_some_and(|c| {
            c.events
                .iter()
                .any(|e| e.action == "kill" && e.device == Some(index))
        })
    });
}

/// The memory of device `uuid` as its node declared it to the controller.
fn made_device_memory(rig: &Rig, uuid: &str) -> u64 {
    rig.nodes()
        .iter()
        .flat_map(|n| n.info.iter().flat_map(|i| &i.devices))
        .find(|d| d.uuid == uuid)
        .unwrap_or_else(|| panic!("no device {uuid} declared"))
        .memory_bytes
}

/// The fake driver mounted with GPUs of `gpu_memory` and the MIG instances `mig`, and its
/// `mig-minors` file written where the agent's device list can name it.
fn mig_driver(tag: &str, gpu_memory: Vec<u64>, mig: Vec<FakeInstance>) -> (Driver, PathBuf) {
    let driver = Driver::mount_with(tag, &FakeConfig { gpu_memory, mig });
    let minors = driver.scratch().join("mig-minors");
    std::fs::write(&minors, driver.fake.mig_minors()).unwrap();
    (driver, minors)
}

/// GPU instances 1-7 of GPU 0, each of `memory`: every instance the driver lists as one a GPU
/// could hold, as the real one does.
fn possible_instances(memory: u64) -> Vec<FakeInstance> {
    (1..=7)
        .map(|gpu_instance| FakeInstance {
            gpu: 0,
            gpu_instance,
            compute_instances: vec![0],
            memory,
        })
        .collect()
}

/// A rig whose agent sees GPU 0 (`GPU-parent`) in MIG mode with no instance, given to
/// gpuwarden to cut; the capability nodes' major, where given.
fn on_a_gpu_to_cut(driver: Driver, minors: &Path, caps_major: Option<u32>) -> Rig {
    let major = caps_major.map_or_else(String::new, |m| format!("mig_caps_major = {m}"));
    let mock = format!(
        r#"
mig_minors = "{}"
{major}

[[devices]]
uuid = "GPU-parent"
model_name = "Fake H200"
memory_size = "1G"
mig_enabled = true
"#,
        minors.display()
    );
    Rig::start_on_with(driver, &mock, |cfg| {
        cfg.mig_reconfigurable = vec!["GPU-parent".into()];
    })
}
