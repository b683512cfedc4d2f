//! GPU-memory limits that nothing inside a container evades, on the real kernel with the fake
//! driver: a GPU fd obtained without `openat` (the raw `open` and `creat` system calls, `io_uring`,
//! `SCM_RIGHTS`, `pidfd_getfd`) is counted and limited like any other, and a container that
//! fills the agent's tables (70,000 dups of one fd; 70,000 device objects and managed mappings)
//! leaves no other container uncounted (docs/accounting.md, "Which files are GPU nodes" and
//! "Budgets").
//!
//! Every scenario ends the same way: the process allocates through the fd it obtained, the
//! bytes are charged to its own container and quota, and the allocation that would cross the
//! quota's 16 MiB gets it killed.

use std::{os::unix::process::ExitStatusExt as _, path::Path, time::Duration};

use gpuwarden_agent_api::snapshot::{Container, TableBudget};
use gpuwarden_proto::v1 as pb;
use gpuwarden_test_support::{
    TestCgroup,
    agent::{self, TestAgent, memory, used},
    devnode,
    ids::container_id,
    require_root, scratch,
};
use gpuwarden_tests::harness::{
    Client, Driver,
    rig::{Rig, session_request},
};

const MIB: u64 = 1 << 20;

/// What the scenarios add to the rig: a container bound to a quota, and clients in it.
trait Scenarios {
    /// A container bound to a 16 MiB GPU-memory quota with the `kill` policy.
    fn limited(&self, seed: &str) -> TestCgroup;
    /// A `gpu-client` on the rig's driver, inside `cg`.
    fn spawn(&self, cg: &TestCgroup) -> Client;
}

impl Scenarios for Rig {
    fn limited(&self, seed: &str) -> TestCgroup {
        let cg = docker(seed);
        let session = self.create(session_request(
            &["cuda.shares=0.5", "cuda.mem=16m"],
            pb::target::Kind::CgroupPath(cg.path.clone()),
            "kill",
        ));
        self.wait_binding(&session.id, "bound");
        cg
    }

    fn spawn(&self, cg: &TestCgroup) -> Client {
        Client::spawn(&self.driver.dir, Some(cg))
    }
}

/// A cgroup named like a Docker container.
fn docker(seed: &str) -> TestCgroup {
    TestCgroup::create(&format!(
        "/system.slice/docker-{}.scope",
        container_id(seed)
    ))
}

/// Makes `client` issue its RM calls through `fd` (a control-node fd it obtained some way),
/// allocates 4 MiB on GPU 0 and checks the bytes are charged to `cg` and its quota, then
/// crosses the quota's 16 MiB and checks the process is killed for it.
fn allocates_counted_and_limited(rig: &Rig, cg: &TestCgroup, mut client: Client, fd: &str) {
    client.ok(&format!("use-ctl {fd}"));
    let h = client.value("client", "client");
    let dev = client.value(&format!("device {h:#x} 0"), "handle");
    client.ok(&format!("alloc {h:#x} {dev:#x} 4m"));
    let c = rig.entry(cg);
    assert_eq!(
        memory(&c, "nvidia0"),
        4 * MIB,
        "the allocation through fd {fd} is counted"
    );
    assert_eq!(used(&c), 4 * MIB, "and charged to the container's quota");
    client.send_only(&format!("alloc {h:#x} {dev:#x} 16m"));
    let status = client.wait_within(Duration::from_secs(20));
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "4 + 16 MiB > 16 MiB through fd {fd} is acted on: {status:?}"
    );
}

/// `syscall(SYS_open)`: x86-64 still has it, and it doesn't pass through the `openat`
/// tracepoints.
#[test]
#[ignore = "needs root"]
fn an_fd_from_the_open_system_call_is_counted_and_limited() {
    require_root();
    let rig = Rig::start("evopen");
    let cg = rig.limited("evopen");
    let mut a = rig.spawn(&cg);
    let fd = a.value("open nvidiactl open", "fd");
    allocates_counted_and_limited(&rig, &cg, a, &fd.to_string());
}

/// `syscall(SYS_creat)` truncates, which the fake driver's files refuse (`ENOSYS`), so it is
/// shown on a character device node instead (`/dev/full`'s numbers, watched as `nvidiactl`):
/// an RM escape issued on the fd `creat` returned is counted as a GPU ioctl of the container.
#[test]
#[ignore = "needs root"]
fn an_fd_from_the_creat_system_call_is_known_at_its_ioctl() {
    require_root();
    let driver = Driver::mount("evcreat");
    let nodes = scratch("evcreat-nodes");
    let ctl = nodes.path().join("nvidiactl");
    devnode::mknod(&ctl, 1, 7);
    let agent = TestAgent::start(&[driver.glob(), ctl.display().to_string()]);
    let cg = docker("evcreat");
    let mut a = Client::spawn(&driver.dir, Some(&cg));
    let fd = a.value(&format!("open {} creat", ctl.display()), "fd");
    // _IOWR('F', NV_ESC_RM_ALLOC, NVOS21): /dev/full answers ENOTTY, the agent counts it.
    a.ok(&format!("ioctl-raw {fd} 0xc020462b"));
    let c = agent.container(&cg.path).expect("the process is seen");
    assert_eq!(agent::ioctls(&c, "nvidiactl", "rm_alloc"), 1);
    a.exit();
}

/// `io_uring`'s `IORING_OP_OPENAT` installs the fd without any open system call.
#[test]
#[ignore = "needs root"]
fn an_fd_opened_through_io_uring_is_counted_and_limited() {
    require_root();
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .map_or(0, |s| s.trim().parse::<u32>().unwrap_or(0));
    assert_eq!(
        disabled, 0,
        "io_uring is disabled on this kernel (kernel.io_uring_disabled)"
    );
    let rig = Rig::start("evuring");
    let cg = rig.limited("evuring");
    let mut a = rig.spawn(&cg);
    let fd = a.value("open nvidiactl uring", "fd");
    allocates_counted_and_limited(&rig, &cg, a, &fd.to_string());
}

/// A process in another container opens the node and sends the fd over a Unix socket: the
/// receiving container, which makes the ioctls, is charged and limited; the sender is not.
#[test]
#[ignore = "needs root"]
fn an_fd_received_over_scm_rights_charges_the_receiver() {
    require_root();
    let rig = Rig::start("evscm");
    let sender_cg = docker("evscm-sender");
    let cg = rig.limited("evscm");
    let mut sender = rig.spawn(&sender_cg);
    let mut receiver = rig.spawn(&cg);
    let dir = scratch("evscm-sock");
    let path = dir.path().join("fds.sock");
    let socket = receiver.value(&format!("fd-socket {}", path.display()), "fd");
    let sent = sender.value("open nvidiactl", "fd");
    sender.ok(&format!("send-fd {} {sent}", path.display()));
    let fd = receiver.value(&format!("recv-fd {socket}"), "fd");
    allocates_counted_and_limited(&rig, &cg, receiver, &fd.to_string());
    let s = rig.agent().container(&sender_cg.path);
    assert_eq!(
        s.map_or(0, |s| memory(&s, "nvidia0")),
        0,
        "the sender's container is not charged"
    );
    sender.exit();
}

/// `pidfd_getfd` copies another process's fd into the caller's table.
#[test]
#[ignore = "needs root"]
fn an_fd_taken_with_pidfd_getfd_charges_the_taker() {
    require_root();
    let rig = Rig::start("evpidfd");
    let owner_cg = docker("evpidfd-owner");
    let cg = rig.limited("evpidfd");
    let mut owner = rig.spawn(&owner_cg);
    let mut taker = rig.spawn(&cg);
    let theirs = owner.value("open nvidiactl", "fd");
    let fd = taker.value(&format!("getfd {} {theirs}", owner.pid), "fd");
    allocates_counted_and_limited(&rig, &cg, taker, &fd.to_string());
    owner.exit();
}

/// One container dups its control fd 70,000 times (more than the node-wide fd table held), over
/// four processes (the hard fd limit here is 20,000 per process): a second container's
/// allocations are still counted and limited.
#[test]
#[ignore = "needs root"]
fn seventy_thousand_dups_in_one_container_leave_the_next_counted() {
    require_root();
    let rig = Rig::start("evdups");
    let flood_cg = docker("evdups-flood");
    let mut flooders = Vec::new();
    for _ in 0..4 {
        let mut f = rig.spawn(&flood_cg);
        f.ok("dup-many ctl 17500");
        flooders.push(f);
    }
    // The flooding container holds its budget of the fd table and no more; what it was refused
    // is in its snapshot entry (dups of an fd it was refused are not tried: they are told at
    // their ioctl like any fd).
    let flood = rig.entry(&flood_cg);
    let fds = table_of(&flood, "fds");
    assert!(fds.budget < 70_000, "{fds:?}");
    assert_eq!(fds.used, fds.budget, "{fds:?}");
    assert!(fds.refused > 17_500 - fds.budget, "{fds:?}");
    assert!(rig.agent().snapshot().stats.budget_refused >= fds.refused);
    let cg = rig.limited("evdups");
    let b = rig.spawn(&cg);
    allocates_counted_and_limited(&rig, &cg, b, "ctl");
    let c = rig.entry(&cg);
    let mine = table_of(&c, "fds");
    assert_eq!(mine.refused, 0, "{mine:?}");
    for f in flooders {
        f.exit();
    }
}

/// One container makes 70,000 device objects and 70,000 managed mappings, more than the kernel's
/// tables of either hold (65,536 each): it holds its budget of each and no more, its mappings
/// past the budget are still counted (until its processes end), and a second container's
/// device objects and managed memory are still told: its allocation on GPU 1 is counted on
/// GPU 1, and its mapping is counted.
#[test]
#[ignore = "needs root"]
fn a_container_filling_the_object_and_mapping_tables_leaves_the_next_counted() {
    require_root();
    let rig = Rig::start("evobjects");
    let flood_cg = docker("evobjects-flood");
    let mut first = rig.spawn(&flood_cg);
    let flood_client = first.value("client", "client");
    let many = format!("device-many {flood_client:#x} 0 70000");
    assert_eq!(first.value(&many, "made"), 70_000);
    first.ok("uvm init");
    // Two processes: a process holds at most `vm.max_map_count` (65,530) mappings.
    let mut second = rig.spawn(&flood_cg);
    for process in [&mut first, &mut second] {
        assert_eq!(process.value("uvm mmap-many 35000 4k", "made"), 35_000);
    }
    let flood = rig.entry(&flood_cg);
    for name in ["device_objects", "managed_mappings"] {
        let t = table_of(&flood, name);
        assert!(t.budget < 65_536 / 2, "{t:?}");
        assert_eq!(t.used, t.budget, "{t:?}");
        assert_eq!(t.used + t.refused, 70_000, "{t:?}");
    }
    assert_eq!(
        flood.managed_memory_bytes,
        70_000 * 4096,
        "mappings refused an entry are still counted"
    );

    let cg = docker("evobjects-next");
    let mut next = rig.spawn(&cg);
    // Two GPU nodes held and no quota: only the device object tells which GPU it allocates on.
    next.value("open nvidia1", "fd");
    let client = next.value("client", "client");
    let dev = next.value(&format!("device {client:#x} 1"), "handle");
    next.ok(&format!("alloc {client:#x} {dev:#x} 4m"));
    next.ok("uvm init");
    next.value("uvm mmap 8m", "addr");
    let c = rig.entry(&cg);
    assert_eq!(memory(&c, "nvidia1"), 4 * MIB, "{c:?}");
    assert_eq!(c.managed_memory_bytes, 8 * MIB, "{c:?}");
    for t in &c.tables {
        assert_eq!(t.refused, 0, "{t:?}");
    }
    first.exit();
    second.exit();
    next.exit();
}

/// A container at its fd budget dups a GPU fd it allocated through: the dup is refused an entry
/// in the fd table, so closing the tracked fd is not the file's last close. The driver keeps the
/// client (and its memory) while the dup holds the file, and so does the count: the bytes stay
/// charged, and an allocation through the dup that crosses the quota is acted on
/// (docs/accounting.md, "Releases the kernel side cannot see").
#[test]
#[ignore = "needs root"]
fn closing_the_tracked_fd_of_a_file_an_untracked_dup_holds_keeps_its_memory_counted() {
    require_root();
    let rig = Rig::start("evuntracked");
    let cg = rig.limited("evuntracked");
    let mut a = rig.spawn(&cg);
    let tracked = a.value("open nvidiactl", "fd");
    a.ok(&format!("use-ctl {tracked}"));
    let h = a.value("client", "client");
    let dev = a.value(&format!("device {h:#x} 0"), "handle");
    a.ok(&format!("alloc {h:#x} {dev:#x} 4m"));
    assert_eq!(used(&rig.entry(&cg)), 4 * MIB);
    // Another file of the node takes the rest of the container's fd budget.
    let budget = table_of(&rig.entry(&cg), "fds").budget;
    let filler = a.value("open nvidiactl", "fd");
    a.ok(&format!("dup-many {filler} {budget}"));
    let untracked = a.value(&format!("dup {tracked}"), "fd");
    let fds = rig.entry(&cg);
    let fds = table_of(&fds, "fds");
    assert_eq!(fds.used, fds.budget, "{fds:?}");
    a.ok(&format!("close {tracked}"));
    assert_eq!(
        used(&rig.entry(&cg)),
        4 * MIB,
        "the file is still open through the dup: its client's memory stays counted"
    );
    a.ok(&format!("use-ctl {untracked}"));
    a.send_only(&format!("alloc {h:#x} {dev:#x} 16m"));
    let status = a.wait_within(Duration::from_secs(20));
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "4 + 16 MiB > 16 MiB through the dup is acted on: {status:?}"
    );
}

/// The helpers the scenarios use: a datagram socket carries an fd between two processes, and
/// `pidfd_getfd` copies one, outside any agent (so a failure above is the agent's).
#[test]
fn the_ways_of_obtaining_an_fd_work_here() {
    use gpuwarden_tests::gpu_client::obtain;
    use std::os::{fd::AsRawFd as _, unix::fs::MetadataExt as _};
    let dir = scratch("obtain");
    let path = dir.path().join("s");
    let socket = obtain::fd_socket(&path).unwrap();
    let file = obtain::open(Path::new("/dev/null"), obtain::OpenHow::Open).unwrap();
    obtain::send_fd(&path, file.as_raw_fd()).unwrap();
    let got = obtain::recv_fd(socket.as_raw_fd()).unwrap();
    let same = |a: &std::os::fd::OwnedFd, b: &std::os::fd::OwnedFd| {
        let meta = |f: &std::os::fd::OwnedFd| {
            std::fs::metadata(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap()
        };
        (meta(a).rdev(), meta(a).ino()) == (meta(b).rdev(), meta(b).ino())
    };
    assert!(same(&file, &got));
    let taken = obtain::take_fd(std::process::id(), file.as_raw_fd()).unwrap();
    assert!(same(&file, &taken));
    let uring = obtain::open(Path::new("/dev/null"), obtain::OpenHow::Uring).unwrap();
    assert!(same(&file, &uring));
}

/// A bound container that holds its budget of RM clients (an eighth of the client table) is
/// refused the next client entry, and from then on its allocations are acted on by its memory
/// policy, even under its limit: their bytes could no longer be counted.
#[test]
#[ignore = "needs root"]
fn a_bound_container_at_its_client_budget_has_its_allocations_acted_on() {
    // The first client is one; the last of these is past the budget.
    at_its_budget_it_is_acted_on("evbudget", "clients", |a, _, budget| {
        for _ in 0..budget {
            a.value("client", "client");
        }
    });
}

/// A bound container at its budget of device objects is acted on like one at its client budget:
/// a device object it makes past the budget is on no GPU the agent knows, so its allocations
/// could be counted on none.
#[test]
#[ignore = "needs root"]
fn a_bound_container_at_its_device_object_budget_has_its_allocations_acted_on() {
    // The first device object is one; the last of these is past the budget.
    at_its_budget_it_is_acted_on("evobjbudget", "device_objects", |a, h, budget| {
        a.value(&format!("device-many {h:#x} 0 {budget}"), "made");
    });
}

/// A bound container allocates 2 MiB, then `fill` (given its client and its budget of `table`)
/// takes its budget there and one more entry: that one is refused, and the next 2 MiB, well
/// under its 16 MiB limit, gets it killed.
fn at_its_budget_it_is_acted_on(tag: &str, table: &str, fill: impl FnOnce(&mut Client, u64, u64)) {
    require_root();
    let rig = Rig::start(tag);
    let cg = rig.limited(tag);
    let mut a = rig.spawn(&cg);
    let h = a.value("client", "client");
    let dev = a.value(&format!("device {h:#x} 0"), "handle");
    a.ok(&format!("alloc {h:#x} {dev:#x} 2m"));
    let budget = table_of(&rig.entry(&cg), table).budget;
    fill(&mut a, h, budget);
    let c = rig.entry(&cg);
    let t = table_of(&c, table);
    assert_eq!((t.used, t.refused), (budget, 1), "{t:?}");
    assert_eq!(used(&c), 2 * MIB, "nothing else allocated");
    a.send_only(&format!("alloc {h:#x} {dev:#x} 2m"));
    let status = a.wait_within(Duration::from_secs(20));
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
}

/// The container's entry for kernel table `name`.
fn table_of(c: &Container, name: &str) -> TableBudget {
    c.tables
        .iter()
        .find(|t| t.table == name)
        .cloned()
        .unwrap_or_else(|| panic!("no {name} table in {:?}", c.tables))
}

/// A process of the bound container `cg` that allocates 4 MiB through a control fd it opened,
/// and the client and device handles it allocated on.
fn allocating_sender(rig: &Rig, cg: &TestCgroup) -> (Client, u64, u64, u64) {
    let mut sender = rig.spawn(cg);
    let sent = sender.value("open nvidiactl", "fd");
    sender.ok(&format!("use-ctl {sent}"));
    let h = sender.value("client", "client");
    let dev = sender.value(&format!("device {h:#x} 0"), "handle");
    sender.ok(&format!("alloc {h:#x} {dev:#x} 4m"));
    let c = rig.entry(cg);
    assert_eq!((memory(&c, "nvidia0"), used(&c)), (4 * MIB, 4 * MIB));
    (sender, sent, h, dev)
}

/// The container's memory on GPU 0 and its quota's used bytes.
fn charged(rig: &Rig, cg: &TestCgroup) -> (u64, u64) {
    let c = rig.entry(cg);
    (memory(&c, "nvidia0"), used(&c))
}

/// A sender in the bound container `cg` that allocated 4 MiB through its control fd (see
/// [`allocating_sender`]), a receiver in another container, and the Unix socket the receiver
/// listens on for that fd.
fn handoff(rig: &Rig, cg: &TestCgroup, seed: &str) -> (Client, Client, Handoff) {
    let receiver_cg = docker(&format!("{seed}-receiver"));
    let mut receiver = rig.spawn(&receiver_cg);
    let dir = scratch(&format!("{seed}-sock"));
    let path = dir.path().join("fds.sock");
    let socket = receiver.value(&format!("fd-socket {}", path.display()), "fd");
    let (sender, sent, client, _) = allocating_sender(rig, cg);
    let handoff = Handoff {
        _receiver_cg: receiver_cg,
        _dir: dir,
        path,
        socket,
        sent,
        client,
    };
    (sender, receiver, handoff)
}

/// The socket a [`handoff`]'s fd travels over, and what the sender made.
struct Handoff {
    /// Kept for the test's length: dropping a cgroup removes it.
    _receiver_cg: TestCgroup,
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    /// The receiver's end.
    socket: u64,
    /// The sender's control fd.
    sent: u64,
    /// The client the sender allocated on.
    client: u64,
}

impl Handoff {
    /// The sender sends its control fd (`SCM_RIGHTS`).
    fn send(&self, sender: &mut Client) {
        sender.ok(&format!("send-fd {} {}", self.path.display(), self.sent));
    }

    /// The receiver takes it: its fd, on which it has issued no ioctl yet.
    fn receive(&self, receiver: &mut Client) -> u64 {
        receiver.value(&format!("recv-fd {}", self.socket), "fd")
    }

    /// The receiver issues an RM call through fd `fd` on the sender's client: from then on the
    /// fd is in the agent's table.
    fn use_in(&self, receiver: &mut Client, fd: u64) {
        receiver.ok(&format!("use-ctl {fd}"));
        receiver.ok(&format!("gpu-ids {:#x}", self.client));
    }
}

/// A process allocates 4 MiB in its bound container, sends its control fd to a process of
/// another container, which issues an ioctl on it, and exits: the file lives on in the
/// receiver, and so does the driver's client with the 4 MiB, so the sender's container stays
/// charged (else it could allocate its whole limit again, over memory the driver still holds).
/// The receiver's exit closes the file: the container is charged nothing.
#[test]
#[ignore = "needs root"]
fn memory_on_a_file_sent_away_stays_charged_until_the_receiver_exits() {
    require_root();
    let rig = Rig::start("evorphan");
    let cg = rig.limited("evorphan");
    let (mut sender, mut receiver, handoff) = handoff(&rig, &cg, "evorphan");
    handoff.send(&mut sender);
    let fd = handoff.receive(&mut receiver);
    handoff.use_in(&mut receiver, fd);
    sender.exit();
    assert_eq!(
        charged(&rig, &cg),
        (4 * MIB, 4 * MIB),
        "the driver still holds the 4 MiB through the receiver's fd"
    );
    assert_eq!(rig.agent().snapshot().stats.orphaned_allocations, 1);
    // So the container can't allocate its whole limit again.
    let mut again = rig.spawn(&cg);
    let h2 = again.value("client", "client");
    let dev2 = again.value(&format!("device {h2:#x} 0"), "handle");
    again.send_only(&format!("alloc {h2:#x} {dev2:#x} 16m"));
    let status = again.wait_within(Duration::from_secs(20));
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "4 + 16 MiB > 16 MiB is acted on: {status:?}"
    );
    receiver.exit();
    // The orphans are the agent's to release once it sees the file gone (its exit handling or
    // the sweep), not the kernel's at the exit itself: waited for, not sampled once.
    wait_uncharged(&rig, &cg, "the file to close with the receiver");
    rig.wait_for("no orphaned allocation left", |r| {
        r.agent().snapshot().stats.orphaned_allocations == 0
    });
}

/// As above, but the receiver issues no ioctl on the fd before the sender exits (the fd is
/// in no table then, only in the kernel's count of the file): the 4 MiB stay charged; the
/// receiver's first ioctl on it makes its fd tracked, and its close releases them.
#[test]
#[ignore = "needs root"]
fn memory_on_a_file_sent_away_before_any_ioctl_stays_charged_until_its_close() {
    require_root();
    let rig = Rig::start("evorphan2");
    let cg = rig.limited("evorphan2");
    let (mut sender, mut receiver, handoff) = handoff(&rig, &cg, "evorphan2");
    handoff.send(&mut sender);
    sender.exit();
    assert_eq!(
        charged(&rig, &cg),
        (4 * MIB, 4 * MIB),
        "the fd in flight holds the file, and the driver the 4 MiB"
    );
    let fd = handoff.receive(&mut receiver);
    assert_eq!(charged(&rig, &cg), (4 * MIB, 4 * MIB));
    handoff.use_in(&mut receiver, fd);
    receiver.ok(&format!("close {fd}"));
    assert_eq!(charged(&rig, &cg), (0, 0), "the file's last close");
    receiver.exit();
}

/// A forked child allocates 4 MiB on its parent's client and exits while the parent holds the
/// file: the driver keeps the child's allocation with the client, and so does the count, until
/// the parent's exit closes the file.
#[test]
#[ignore = "needs root"]
fn a_childs_memory_on_its_parents_client_stays_charged_until_the_file_closes() {
    require_root();
    let rig = Rig::start("evorphanfork");
    let cg = rig.limited("evorphanfork");
    let mut parent = rig.spawn(&cg);
    let h = parent.value("client", "client");
    let dev = parent.value(&format!("device {h:#x} 0"), "handle");
    parent.ok("fork");
    let reply = parent.ok(&format!("child alloc {h:#x} {dev:#x} 4m"));
    assert!(reply.starts_with("child: ok"), "{reply}");
    assert_eq!(charged(&rig, &cg), (4 * MIB, 4 * MIB));
    parent.ok("child exit");
    assert_eq!(
        charged(&rig, &cg),
        (4 * MIB, 4 * MIB),
        "the parent's file holds the client, and the driver the child's 4 MiB"
    );
    parent.exit();
    assert_eq!(
        charged(&rig, &cg),
        (0, 0),
        "the file closed with the parent"
    );
}

/// Waits (the agent's upkeep sweeps every 100 ms here) until the container `cg` is charged
/// nothing.
fn wait_uncharged(rig: &Rig, cg: &TestCgroup, what: &str) {
    rig.wait_for(what, |r| charged(r, cg) == (0, 0));
}

/// As above, but the receiver closes the fd without ever issuing an ioctl on it: no tracked fd
/// says the file closed, so the agent's upkeep sweep reads the kernel's count of the file and
/// releases the 4 MiB once the file is gone.
#[test]
#[ignore = "needs root"]
fn memory_on_a_file_sent_away_is_released_when_its_untracked_holder_closes_it() {
    require_root();
    let rig = Rig::start("evorphan3");
    let cg = rig.limited("evorphan3");
    let (mut sender, mut receiver, handoff) = handoff(&rig, &cg, "evorphan3");
    handoff.send(&mut sender);
    sender.exit();
    let fd = handoff.receive(&mut receiver);
    wait_for_a_sweep(&rig, "evorphan3-control");
    assert_eq!(
        charged(&rig, &cg),
        (4 * MIB, 4 * MIB),
        "a sweep passed while the receiver holds the file"
    );
    receiver.ok(&format!("close {fd}"));
    wait_uncharged(&rig, &cg, "the sweep to release the closed file's 4 MiB");
    receiver.exit();
}

/// Returns once the agent's sweep has run since the call: a file sent away from a second
/// container and closed by its receiver without an ioctl is released only by a sweep.
fn wait_for_a_sweep(rig: &Rig, seed: &str) {
    let cg = rig.limited(seed);
    let (mut sender, mut receiver, handoff) = handoff(rig, &cg, seed);
    handoff.send(&mut sender);
    sender.exit();
    let fd = handoff.receive(&mut receiver);
    receiver.ok(&format!("close {fd}"));
    wait_uncharged(rig, &cg, "a sweep to release the control file's 4 MiB");
    receiver.exit();
}

/// A process that maps its control file (as libcuda maps memory through the nodes) and exits:
/// from kernel 6.16 on, the exit tracepoint runs while the mapping still holds the file, so it
/// looks held elsewhere; the sweep finds it released once the process is gone.
#[test]
#[ignore = "needs root"]
fn memory_of_a_process_that_mapped_its_file_is_released_after_its_exit() {
    require_root();
    let rig = Rig::start("evorphanmap");
    let cg = rig.limited("evorphanmap");
    let (mut a, fd, _, _) = allocating_sender(&rig, &cg);
    a.ok(&format!("map {fd} 4096"));
    a.exit();
    wait_uncharged(&rig, &cg, "the exited process's 4 MiB to be released");
}

/// A process allocates 4 MiB, forks a child (which inherits its fds) and is killed while the
/// child lives: the child holds the file, and the driver the 4 MiB, so the container stays
/// charged until the child ends too.
#[test]
#[ignore = "needs root"]
fn memory_of_a_parent_whose_forked_child_holds_the_file_stays_charged_until_the_child_ends() {
    require_root();
    let rig = Rig::start("evorphanparent");
    let cg = rig.limited("evorphanparent");
    let (mut parent, _, _, _) = allocating_sender(&rig, &cg);
    let child = i32::try_from(parent.value("fork", "pid")).unwrap();
    // The child sleeps (its answer goes nowhere): it outlives its parent, holding every fd.
    parent.send_only("child sleep 600000");
    rig.wait_for("the child to sleep", |_| {
        std::fs::read_to_string(format!("/proc/{child}/syscall"))
            .is_ok_and(|s| s.starts_with("230 ") || s.starts_with("35 "))
    });
    let pid = i32::try_from(parent.pid).unwrap();
    // SAFETY: signals a process this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let status = parent.wait_within(Duration::from_secs(20));
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert_eq!(
        charged(&rig, &cg),
        (4 * MIB, 4 * MIB),
        "the child holds the file, and the driver the parent's 4 MiB"
    );
    // SAFETY: signals the child of the process this test started.
    assert_eq!(unsafe { libc::kill(child, libc::SIGKILL) }, 0);
    wait_uncharged(&rig, &cg, "the child's end to close the file");
}

/// The sender closes its fd once sent, before the receiver issued any ioctl on its copy: its
/// tracked fd was the file's last, but the kernel still counts the receiver's, so the 4 MiB
/// stay charged, through the sender's exit too, until the receiver closes the file.
#[test]
#[ignore = "needs root"]
fn memory_on_a_file_sent_away_and_closed_stays_charged_until_the_receiver_closes_it() {
    require_root();
    let rig = Rig::start("evorphanclose");
    let cg = rig.limited("evorphanclose");
    let (mut sender, mut receiver, handoff) = handoff(&rig, &cg, "evorphanclose");
    handoff.send(&mut sender);
    let fd = handoff.receive(&mut receiver);
    sender.ok(&format!("close {}", handoff.sent));
    assert_eq!(
        charged(&rig, &cg),
        (4 * MIB, 4 * MIB),
        "the receiver holds the file"
    );
    sender.exit();
    assert_eq!(
        charged(&rig, &cg),
        (4 * MIB, 4 * MIB),
        "after the sender's exit"
    );
    receiver.ok(&format!("close {fd}"));
    wait_uncharged(&rig, &cg, "the receiver's close to release the 4 MiB");
    receiver.exit();
}

/// An exec closes the process's GPU fds (close-on-exec): the file it held alone closes, and the
/// driver frees its memory.
#[test]
#[ignore = "needs root"]
fn an_exec_releases_what_the_process_held_alone() {
    require_root();
    let rig = Rig::start("evexec");
    let cg = rig.limited("evexec");
    let (mut a, _, _, _) = allocating_sender(&rig, &cg);
    a.send_only("exec");
    let ready = a.reply();
    assert!(ready.starts_with("ready pid="), "{ready}");
    assert_eq!(charged(&rig, &cg), (0, 0));
    a.exit();
}

/// A process sends its control fd away, then execs: its own fds close, but the file lives on in
/// the receiver, and the driver's 4 MiB with it, until the receiver ends.
#[test]
#[ignore = "needs root"]
fn memory_on_a_file_sent_away_stays_charged_through_the_senders_exec() {
    require_root();
    let rig = Rig::start("evorphanexec");
    let cg = rig.limited("evorphanexec");
    let (mut sender, mut receiver, handoff) = handoff(&rig, &cg, "evorphanexec");
    handoff.send(&mut sender);
    let fd = handoff.receive(&mut receiver);
    handoff.use_in(&mut receiver, fd);
    sender.send_only("exec");
    let ready = sender.reply();
    assert!(ready.starts_with("ready pid="), "{ready}");
    assert_eq!(
        charged(&rig, &cg),
        (4 * MIB, 4 * MIB),
        "the receiver holds the file, and the driver the 4 MiB"
    );
    receiver.exit();
    assert_eq!(
        charged(&rig, &cg),
        (0, 0),
        "the file closed with the receiver"
    );
    sender.exit();
}
