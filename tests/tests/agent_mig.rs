//! MIG instances as devices (issue 37, docs/mig.md), on the real kernel with the fake driver:
//! two containers on two GPU instances of one GPU, each charged exactly what the driver's own
//! ledger says it charged to that instance. (Its own test binary: instance names are the
//! agent's process-wide state.)

mod util;

use std::{collections::BTreeMap, path::Path};

use gpuwarden_test_support::{TestCgroup, require_root, scratch};
use gpuwarden_tests::fake_driver::{FakeConfig, FakeDriver, FakeInstance, gi_cap_minor};
use util::{Client, TestAgent, config, container_id, memory};

const MIB: u64 = 1 << 20;
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

/// A client on GPU 1 subscribed to GPU instance `gi` through its capability node (a file named
/// `nvidia-cap<minor>` under `caps`): returns (client, device) handles.
fn on_instance(c: &mut Client, caps: &Path, instance: &FakeInstance) -> (u64, u64) {
    c.ok("open nvidia1");
    let h = c.value("client", "client");
    let dev = c.value(&format!("device {h:#x} 1"), "handle");
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
