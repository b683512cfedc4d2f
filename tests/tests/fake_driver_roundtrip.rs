//! The fake driver on its own: the synthetic client's calls reach it with the real encodings and
//! its answers come back into the client's memory. No eBPF here: if these fail, the agent tests
//! can't be trusted.
//!
//! Mounting FUSE needs root: every test is `#[ignore = "needs root"]` (the root policy of
//! `gpuwarden-test-support`).

use std::{path::Path, time::Duration};

use gpuwarden_test_support::{TestCgroup, require_root, scratch, wait};
use gpuwarden_tests::abi::nvidia::{esc, ioctl_cmd, status, uvm};
use gpuwarden_tests::{
    abi::uvm_params,
    fake_driver::{FakeConfig, FakeDriver, VIDMEM_PAGE, gpu_id},
    gpu_client::{
        Form, GpuClient, ParamsLayout, RmError, ScriptError, ScriptedClient, Via, ioctl_raw,
    },
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// FUSE reports the last close of a file asynchronously.
const RELEASE: Duration = Duration::from_secs(10);

/// The fake driver mounted in a fresh scratch directory.
struct Mounted {
    driver: FakeDriver,
    /// Dropped after the driver has unmounted (fields drop in order).
    _dir: tempfile::TempDir,
}

impl Mounted {
    fn new(config: &FakeConfig) -> Self {
        let dir = scratch("rt");
        let driver =
            FakeDriver::mount(&dir.path().join("dev"), config).expect("mount the fake driver");
        Self { driver, _dir: dir }
    }

    fn client(&self) -> ScriptedClient {
        self.client_in(None)
    }

    fn client_in(&self, cgroup: Option<&Path>) -> ScriptedClient {
        let bin = Path::new(env!("CARGO_BIN_EXE_gpu-client"));
        ScriptedClient::spawn(bin, self.driver.dir(), cgroup).expect("start gpu-client")
    }
}

/// Sends `line` and returns the handle (or other `key`) in its reply, as hex for the next line.
fn hex(c: &mut ScriptedClient, line: &str, key: &str) -> String {
    match c.value(line, key) {
        Ok(v) => format!("{v:#x}"),
        Err(e) => panic!("{e}"),
    }
}

#[test]
#[ignore = "needs root"]
fn allocations_round_trip_with_every_encoding() {
    require_root();
    let m = Mounted::new(&FakeConfig::default());
    let mut c = m.client();
    let client = hex(&mut c, "client", "client");
    let dev0 = hex(&mut c, &format!("device {client} 0"), "handle");
    let dev1 = hex(&mut c, &format!("device {client} 1"), "handle");
    assert_eq!(
        c.send(&format!("device {client} 7")).unwrap(),
        "err status=0x1f",
        "the driver has no GPU 7"
    );

    // Both param forms, both layouts, direct and through IOCTL_XFER_CMD: each writes back the
    // size rounded up to 2 MiB.
    let size = |c: &mut ScriptedClient, line: String| c.value(&line, "size").unwrap();
    assert_eq!(
        size(&mut c, format!("alloc {client} {dev0} 1 nvos21 v120")),
        2 * MIB
    );
    assert_eq!(
        size(&mut c, format!("alloc {client} {dev0} 3m nvos21 v128")),
        4 * MIB
    );
    assert_eq!(
        size(&mut c, format!("alloc {client} {dev0} 4m nvos64 v120")),
        4 * MIB
    );
    assert_eq!(
        size(&mut c, format!("alloc {client} {dev0} 5m nvos64 v128")),
        6 * MIB
    );
    assert_eq!(
        size(&mut c, format!("alloc {client} {dev1} 5m xfer")),
        6 * MIB
    );
    assert_eq!(
        size(&mut c, format!("alloc {client} {dev1} 1m nvos64 v120 xfer")),
        2 * MIB
    );
    assert_eq!(m.driver.ledger(), vec![16 * MIB, 8 * MIB]);
    assert_eq!(VIDMEM_PAGE, 2 * MIB);

    // Over the GPU's memory: NV_ERR_NO_MEMORY, nothing charged. A VA reservation and system
    // memory charge nothing either.
    assert_eq!(
        c.send(&format!("alloc {client} {dev0} 1g")).unwrap(),
        "err status=0x51"
    );
    assert_eq!(
        c.send(&format!("alloc {client} {dev1} 1g nvos64 xfer"))
            .unwrap(),
        "err status=0x51"
    );
    c.ok(&format!("virtual {client} {dev0} 512m")).unwrap();
    c.ok(&format!("sysmem {client} {dev0} 64m")).unwrap();
    assert_eq!(m.driver.ledger(), vec![16 * MIB, 8 * MIB]);

    // What the driver counted: the XFER-wrapped allocations as allocations.
    assert_eq!(m.driver.calls_to("nvidiactl", "rm_alloc"), 14);
    assert_eq!(m.driver.calls_to("nvidiactl", "ioctl_xfer_cmd"), 0);
    m.driver
        .wait_for_ledger(&[16 * MIB, 8 * MIB], RELEASE)
        .unwrap();
}

#[test]
#[ignore = "needs root"]
fn frees_release_objects_devices_and_clients() {
    require_root();
    let m = Mounted::new(&FakeConfig::default());
    let mut c = m.client();
    let client = hex(&mut c, "client", "client");
    let dev0 = hex(&mut c, &format!("device {client} 0"), "handle");
    let dev1 = hex(&mut c, &format!("device {client} 1"), "handle");
    let sub1 = hex(&mut c, &format!("subdevice {client} {dev1}"), "handle");
    let a = hex(&mut c, &format!("alloc {client} {dev0} 2m"), "handle");
    let b = hex(&mut c, &format!("alloc {client} {dev0} 4m"), "handle");
    c.ok(&format!("alloc {client} {sub1} 8m")).unwrap();
    c.ok(&format!("alloc {client} {dev1} 16m")).unwrap();
    assert_eq!(m.driver.ledger(), vec![6 * MIB, 24 * MIB]);

    c.ok(&format!("free {client} {dev0} {a}")).unwrap();
    assert_eq!(m.driver.ledger(), vec![4 * MIB, 24 * MIB]);
    assert_eq!(
        c.send(&format!("free {client} {dev0} {a}")).unwrap(),
        "err status=0x33",
        "NV_ERR_INVALID_OBJECT_HANDLE"
    );
    c.ok(&format!("free {client} {dev0} {b} xfer")).unwrap();
    assert_eq!(m.driver.ledger(), vec![0, 24 * MIB]);

    // A device goes with everything under it, its subdevice's memory included.
    c.ok(&format!("alloc {client} {dev0} 10m")).unwrap();
    c.ok(&format!("free {client} {client} {dev1}")).unwrap();
    assert_eq!(m.driver.ledger(), vec![10 * MIB, 0]);

    // A second client in the same process, then freeing the first client whole.
    let other = hex(&mut c, "client", "client");
    let dev = hex(&mut c, &format!("device {other} 1"), "handle");
    c.ok(&format!("alloc {other} {dev} 2m")).unwrap();
    c.ok(&format!("free {client} {client} {client}")).unwrap();
    assert_eq!(m.driver.ledger(), vec![0, 2 * MIB]);
    assert_eq!(m.driver.clients(), 1);
    assert_eq!(
        c.send(&format!("free {client} {client} {client}")).unwrap(),
        "err status=0x23",
        "NV_ERR_INVALID_CLIENT"
    );
}

#[test]
#[ignore = "needs root"]
fn a_forked_child_allocates_through_the_inherited_fd_and_exit_releases() {
    require_root();
    let m = Mounted::new(&FakeConfig::default());
    let mut c = m.client();
    let client = hex(&mut c, "client", "client");
    let dev = hex(&mut c, &format!("device {client} 0"), "handle");
    c.ok(&format!("alloc {client} {dev} 2m")).unwrap();

    let child = c.value("fork", "pid").unwrap();
    assert_ne!(child, u64::from(c.pid()));
    let reply = c.ok(&format!("child alloc {client} {dev} 8m")).unwrap();
    assert!(reply.starts_with("child: ok handle=0x"), "{reply}");
    let reply = c.ok("child pid").unwrap();
    assert_eq!(reply, format!("child: ok pid={child}"));
    assert_eq!(m.driver.ledger(), vec![10 * MIB, 0]);
    assert_eq!(
        m.driver.client_ledger().into_values().collect::<Vec<_>>(),
        [vec![10 * MIB, 0]],
        "one client, shared by parent and child"
    );

    // The child exits: the parent still holds the fd, so nothing is released.
    assert_eq!(c.ok("child exit").unwrap(), "ok status=0");
    assert_eq!(c.send("child pid").unwrap(), "err no child");
    wait::holds(
        "the parent's 10 MiB kept",
        Duration::from_millis(100),
        || m.driver.ledger() == [10 * MIB, 0],
    );

    // A thread allocates through the same fd.
    c.ok(&format!("thread alloc {client} {dev} 2m")).unwrap();
    assert_eq!(m.driver.ledger(), vec![12 * MIB, 0]);

    // The process exits without freeing anything: the driver releases it all.
    c.exit().unwrap();
    m.driver.wait_for_ledger(&[0, 0], RELEASE).unwrap();
    assert_eq!(m.driver.clients(), 0);
}

#[test]
#[ignore = "needs root"]
fn the_last_close_of_a_duplicated_fd_releases() {
    require_root();
    let m = Mounted::new(&FakeConfig::default());
    let mut c = m.client();
    c.value("dup", "fd").unwrap();
    let client = hex(&mut c, "client", "client");
    let dev = hex(&mut c, &format!("device {client} 1"), "handle");
    c.ok(&format!("alloc {client} {dev} 6m")).unwrap();

    // Closing one of the two fds keeps the open file, and its client: RM calls go on through
    // the other. The last close releases everything.
    c.ok("close ctl").unwrap();
    wait::holds("the 6 MiB kept", Duration::from_millis(100), || {
        m.driver.ledger() == [0, 6 * MIB]
    });
    c.ok(&format!("alloc {client} {dev} 2m")).unwrap();
    assert_eq!(m.driver.ledger(), vec![0, 8 * MIB]);
    c.ok("close ctl").unwrap();
    m.driver.wait_for_ledger(&[0, 0], RELEASE).unwrap();
    assert_eq!(m.driver.clients(), 0);
    assert!(
        c.send("client").unwrap().starts_with("err errno=9"),
        "EBADF once the control fd is gone"
    );
    assert!(c.send("close ctl").unwrap().starts_with("err"));

    // A killed process releases too.
    let mut d = m.client();
    let client = hex(&mut d, "client", "client");
    let dev = hex(&mut d, &format!("device {client} 0"), "handle");
    d.ok(&format!("alloc {client} {dev} 64m")).unwrap();
    assert_eq!(m.driver.ledger(), vec![64 * MIB, 0]);
    d.kill().unwrap();
    m.driver.wait_for_ledger(&[0, 0], RELEASE).unwrap();
}

#[test]
#[ignore = "needs root"]
fn memory_is_per_gpu_and_configurable() {
    require_root();
    let m = Mounted::new(&FakeConfig {
        gpu_memory: vec![64 * MIB, 8 * MIB, GIB],
        mig: Vec::new(),
    });
    assert_eq!(m.driver.gpus(), 3);
    let names: Vec<_> = m
        .driver
        .paths()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        ["nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"]
    );
    let mut listed: Vec<_> = std::fs::read_dir(m.driver.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        ["nvidia-uvm", "nvidia0", "nvidia1", "nvidia2", "nvidiactl"]
    );
    assert!(!m.driver.path("nvidia3").exists());

    let mut c = m.client();
    let client = hex(&mut c, "client", "client");
    let dev1 = hex(&mut c, &format!("device {client} 1"), "handle");
    assert_eq!(
        c.value(&format!("alloc {client} {dev1} 6m"), "size")
            .unwrap(),
        6 * MIB
    );
    // 6 of 8 MiB used: 3 MiB rounds up to 4 and doesn't fit; 2 MiB does, exactly.
    assert_eq!(
        c.send(&format!("alloc {client} {dev1} 3m")).unwrap(),
        "err status=0x51"
    );
    c.ok(&format!("alloc {client} {dev1} 2m")).unwrap();
    assert_eq!(m.driver.ledger(), vec![0, 8 * MIB, 0]);
    assert_eq!(
        c.ok(&format!("gpu-ids {client}")).unwrap(),
        format!("ok ids={:#x},{:#x},{:#x}", gpu_id(0), gpu_id(1), gpu_id(2))
    );
}

/// The library on its own, in this process: UVM status write-back, controls, raw ioctls.
#[test]
#[ignore = "needs root"]
fn uvm_control_and_raw_ioctls_answer_like_the_driver() {
    require_root();
    let m = Mounted::new(&FakeConfig::default());
    let mut gpu = GpuClient::open_on(m.driver.dir(), 1).unwrap();
    let client = gpu.alloc_client().unwrap();
    let device = gpu.alloc_device(client, 1).unwrap();
    let sub = gpu.alloc_subdevice(client, device).unwrap();
    let (memory, size) = gpu
        .alloc_vidmem_xfer(client, sub, 3 * MIB, Form::Nvos64, ParamsLayout::V120)
        .unwrap();
    assert_eq!(size, 4 * MIB);
    assert_eq!(m.driver.ledger(), vec![0, 4 * MIB]);
    assert_eq!(
        gpu.attached_gpu_ids(client).unwrap(),
        vec![gpu_id(0), gpu_id(1)]
    );
    gpu.control(client, sub, 0x2080_0122).unwrap();
    assert!(matches!(
        gpu.control(client, 0xbad, 0x2080_0122),
        Err(RmError::Status {
            status: status::INVALID_OBJECT_HANDLE
        })
    ));
    gpu.register_fd(1).unwrap();

    // UVM: the driver writes rmStatus through the argument pointer.
    let mut init = [0xffu8; uvm_params::initialize::SIZE];
    init[..8].fill(0);
    assert_eq!(gpu.uvm_raw(uvm::INITIALIZE, &mut init).unwrap(), 0);
    assert_eq!(&init[8..12], &[0, 0, 0, 0], "rmStatus written");
    assert_eq!(&init[12..], &[0xff; 4], "nothing past it");
    gpu.uvm_initialize().unwrap();
    gpu.uvm_create_external_range(0x7f00_0000_0000, 4 * MIB)
        .unwrap();
    gpu.uvm_map_external_allocation(0x7f00_0000_0000, 4 * MIB, client, memory)
        .unwrap();
    gpu.uvm_register_gpu([0x42; 16], client).unwrap();
    gpu.uvm_free(0x7f00_0000_0000, 0).unwrap();
    match gpu.uvm_raw(9999, &mut [0u8; 64]) {
        Err(RmError::Ioctl { source, .. }) => assert_eq!(source.raw_os_error(), Some(libc::EINVAL)),
        other => panic!("unknown UVM command answered {other:?}"),
    }
    assert_eq!(m.driver.calls_to("nvidia-uvm", "uvm_initialize"), 2);
    assert_eq!(
        m.driver.calls_to("nvidia-uvm", "uvm_create_external_range"),
        1
    );

    // A malformed size fails the ioctl itself; non-GPU files don't know NVIDIA ioctls.
    let ctl = gpu.ctl_fd().unwrap();
    let err = ioctl_raw(ctl, ioctl_cmd(esc::RM_ALLOC, 24), &mut [0u8; 24]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EINVAL));
    let null = gpu.open_file(Path::new("/dev/null")).unwrap();
    let err = ioctl_raw(null, ioctl_cmd(esc::RM_ALLOC, 32), &mut [0u8; 32]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTTY));

    // Through XFER, the free is an RM_FREE too.
    gpu.free_via(client, sub, memory, Via::Xfer).unwrap();
    assert_eq!(m.driver.ledger(), vec![0, 0]);
    assert_eq!(m.driver.clients(), 1);
    drop(gpu);
    assert!(
        m.driver.wait_until(RELEASE, |d| d.clients() == 0),
        "closing the fds frees the client"
    );
}

#[test]
#[ignore = "needs root"]
fn scripted_clients_start_inside_their_cgroup() {
    require_root();
    let m = Mounted::new(&FakeConfig::default());
    let cgroup = TestCgroup::create(&format!("/gw-rt-{}", std::process::id()));
    let c = m.client_in(Some(&cgroup.dir));
    let membership = std::fs::read_to_string(format!("/proc/{}/cgroup", c.pid())).unwrap();
    let expected = format!("0::{}", cgroup.path);
    assert!(
        membership.lines().any(|l| l == expected),
        "{membership:?} lacks {expected:?}"
    );
    c.exit().unwrap();
    drop(cgroup);

    // A missing binary or cgroup is an error, not a hang.
    let bin = Path::new("/nonexistent/gpu-client");
    assert!(matches!(
        ScriptedClient::spawn(bin, m.driver.dir(), None),
        Err(ScriptError::Spawn { .. })
    ));
    let bin = Path::new(env!("CARGO_BIN_EXE_gpu-client"));
    assert!(ScriptedClient::spawn(bin, m.driver.dir(), Some(Path::new("/nonexistent"))).is_err());
}

#[test]
#[ignore = "needs root"]
fn every_line_gets_one_reply() {
    require_root();
    let m = Mounted::new(&FakeConfig::default());
    let mut c = m.client();
    assert!(c.send("").unwrap().starts_with("err"));
    assert!(
        c.send("frobnicate")
            .unwrap()
            .starts_with("err unknown command")
    );
    assert_eq!(c.send("pid").unwrap(), format!("ok pid={}", c.pid()));
    assert_eq!(c.send("uvm 73").unwrap(), "ok ret=0");
    assert_eq!(c.send("uvm init").unwrap(), "ok");
    assert_eq!(
        c.send("ioctl-raw /dev/null 0xc020462b").unwrap(),
        "ok ret=-1 errno=25"
    );
    assert_eq!(
        c.send("ioctl-raw ctl 0xc018462b").unwrap(),
        "ok ret=-1 errno=22"
    );
    let fd = c.value("open nvidia1", "fd").unwrap();
    c.ok(&format!("close {fd}")).unwrap();
    assert!(c.send("child pid").unwrap().starts_with("err"));
    assert_eq!(c.send("sleep 1").unwrap(), "ok");
    c.ok("register-fd").unwrap();
}
