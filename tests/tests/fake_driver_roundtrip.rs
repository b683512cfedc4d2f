//! The fake driver on its own: the synthetic client's calls reach it with the real encodings and
//! its answers come back into the client's memory. No eBPF here: if these fail, the agent tests
//! can't be trusted.

mod util;

use util::{Client, Driver, require_root};

const MIB: u64 = 1 << 20;

#[test]
fn allocations_round_trip_through_the_fake_driver() {
    require_root();
    let d = Driver::mount("rt");
    let mut c = Client::spawn(&d.dir, None);
    let client = c.value("client", "client");
    let dev0 = c.value(&format!("device {client:#x} 0"), "handle");
    let dev1 = c.value(&format!("device {client:#x} 1"), "handle");
    assert_eq!(
        c.send(&format!("device {client:#x} 7")),
        "err status=0x1f",
        "no GPU 7"
    );

    // Both param forms, both layouts, the XFER wrapper: each writes back the rounded size.
    let a = c.value(
        &format!("alloc {client:#x} {dev0:#x} 1 nvos21 v120"),
        "handle",
    );
    assert_eq!(
        c.value(
            &format!("alloc {client:#x} {dev0:#x} 3m nvos64 v128"),
            "size"
        ),
        4 * MIB
    );
    assert_eq!(
        c.value(&format!("alloc {client:#x} {dev1:#x} 5m xfer"), "size"),
        6 * MIB
    );
    assert_eq!(d.driver.ledger(), vec![6 * MIB, 6 * MIB]);

    // A failing allocation charges nothing; a VA reservation charges nothing.
    assert_eq!(
        c.send(&format!("alloc {client:#x} {dev0:#x} 1g")),
        "err status=0x51"
    );
    c.ok(&format!("virtual {client:#x} {dev0:#x} 512m"));
    assert_eq!(d.driver.ledger(), vec![6 * MIB, 6 * MIB]);

    // Free one allocation, then a whole device with its children.
    c.ok(&format!("free {client:#x} {dev0:#x} {a:#x}"));
    assert_eq!(d.driver.ledger(), vec![4 * MIB, 6 * MIB]);
    assert_eq!(
        c.send(&format!("free {client:#x} {dev0:#x} {a:#x}")),
        "err status=0x33"
    );
    c.ok(&format!("free {client:#x} {client:#x} {dev1:#x}"));
    assert_eq!(d.driver.ledger(), vec![4 * MIB, 0]);

    // A forked child allocates through the inherited fd.
    c.ok("fork");
    assert!(
        c.ok(&format!("child alloc {client:#x} {dev0:#x} 2m"))
            .starts_with("child: ok")
    );
    assert_eq!(d.driver.ledger(), vec![6 * MIB, 0]);
    c.ok("child exit");

    // Closing the process's fds (exit) frees its clients, as the real driver does.
    assert_eq!(d.driver.clients(), 1);
    c.exit();
    // The kernel sends FUSE's release after the last close, asynchronously: wait for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while d.driver.clients() != 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(d.driver.ledger(), vec![0, 0]);
    assert_eq!(d.driver.clients(), 0);
}
