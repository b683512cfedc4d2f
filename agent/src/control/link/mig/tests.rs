//! The agent's own view of its GPU processes before a MIG layout change: judged by the mock's
//! layout and device list, with the mock's driver counting no process (as NVML may list none
//! on an instance).

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, Mutex},
};

use super::*;
use crate::{
    control::holdings::Holdings,
    devices::mock::MockBackend,
    sensor::{CgroupCounters, Counters},
};

/// A view that answers what the test sets.
struct Seen(Mutex<Option<BTreeSet<u32>>>);

impl Seen {
    fn set(&self, busy: Option<&[u32]>) {
        *self.0.lock().unwrap() = busy.map(|b| b.iter().copied().collect());
    }
}

impl ProcessView for Seen {
    fn busy(&self) -> Pin<Box<dyn Future<Output = Option<BTreeSet<u32>>> + Send + '_>> {
        let now = self.0.lock().unwrap().clone();
        Box::pin(async move { now })
    }
}

/// GPU-1 (given, the operator's `3g.71gb` at slices 4-7), GPU-2 (not given).
fn backend() -> MockBackend {
    MockBackend::from_toml(
        include_str!("../../../../../deploy/mock-devices-mig-on-demand.toml"),
        Path::new("/nonexistent/mock.toml"),
    )
    .unwrap()
}

/// GPU-1's instances as the mock's MIG layer holds them: (profile, start).
fn layout(b: &MockBackend) -> Vec<(String, u32)> {
    let mut out: Vec<(String, u32)> = b
        .mig_layouts()
        .into_iter()
        .filter(|(uuid, ..)| uuid == "GPU-1")
        .flat_map(|(_, _, l)| {
            l.instances
                .iter()
                .map(|(p, at)| (p.name.to_owned(), at.start))
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn a_destroy_waits_while_the_agent_sees_a_process_the_driver_does_not() {
    let b = backend();
    let r = Reconfigurer::new(["GPU-1".to_owned()]);
    let holdings: SharedHoldings = Arc::new(Mutex::new(Holdings::default()));
    let before = layout(&b);
    let made = r
        .create(&b, &BTreeSet::new(), "GPU-1", "1g.18gb", 0)
        .unwrap();
    // Held by a session and let go: due at once.
    r.mark_held(&BTreeSet::from([made.uuid.clone()]));
    assert!(b.busy_devices().is_empty(), "the driver counts no process");

    let view = Seen(Mutex::new(None));
    for seen in [Some(&[made.index][..]), None] {
        view.set(seen);
        assert!(
            !destroy_idle(&r, &b, &holdings, Some(&view)).await,
            "{seen:?}"
        );
        assert!(
            b.devices().iter().any(|d| d.uuid == made.uuid),
            "destroyed while the agent sees {seen:?}"
        );
    }
    view.set(Some(&[]));
    assert!(destroy_idle(&r, &b, &holdings, Some(&view)).await);
    assert!(!b.devices().iter().any(|d| d.uuid == made.uuid));
    assert_eq!(layout(&b), before);
}

#[tokio::test]
async fn an_instance_is_not_made_on_a_gpu_the_agent_sees_a_process_on() {
    let b = backend();
    let r = Reconfigurer::new(["GPU-1".to_owned()]);
    let before = layout(&b);
    let operators = b
        .devices()
        .into_iter()
        .find(|d| d.mig.as_ref().is_some_and(|m| m.parent_uuid == "GPU-1"))
        .unwrap();
    let order = pb::MakeMigInstance {
        session_id: "s".into(),
        gpu_uuid: "GPU-1".into(),
        profile: "1g.18gb".into(),
        start: 0,
    };
    // Memory on the operator's instance, as the agent counts it: the GPU is busy.
    let view = Seen(Mutex::new(Some(BTreeSet::from([operators.index]))));
    let Some(pb::agent_message::Msg::Nack(nack)) = make(&r, &b, Some(&view), &order).await else {
        panic!("made under a process")
    };
    assert_eq!(nack.reason, REFUSED);
    assert!(nack.message.contains("process"), "{}", nack.message);
    assert_eq!(layout(&b), before);
    view.set(None);
    assert!(make(&r, &b, Some(&view), &order).await.is_some());
    assert_eq!(layout(&b), before);
    view.set(Some(&[]));
    assert!(make(&r, &b, Some(&view), &order).await.is_none());
    let mut want = before.clone();
    want.push(("1g.18gb".to_owned(), 0));
    want.sort();
    assert_eq!(layout(&b), want);
    // The same order again (sent again after a registration): answered as made, nothing more
    // made, even with a process on the GPU now.
    view.set(Some(&[operators.index]));
    assert!(make(&r, &b, Some(&view), &order).await.is_none());
    assert_eq!(layout(&b), want);
}

#[test]
fn a_device_is_busy_with_memory_on_it_or_a_live_process_that_used_it() {
    let cgroup = |pids: &[u32], devices: &[(u32, u64)]| CgroupCounters {
        pids: pids.to_vec(),
        devices: devices
            .iter()
            .map(|&(i, bytes)| (i, (BTreeMap::from([("alloc".to_owned(), 1)]), bytes)))
            .collect(),
        ..CgroupCounters::default()
    };
    let counters = Counters {
        cgroups: [
            // Memory left by processes gone (held by an open file elsewhere).
            (1, cgroup(&[], &[(3, 4096)])),
            // A live process that used device 5, no memory now.
            (2, cgroup(&[42], &[(5, 0)])),
            // Used device 7 once, nobody left, nothing held.
            (3, cgroup(&[], &[(7, 0)])),
        ]
        .into_iter()
        .collect(),
        ..Counters::default()
    };
    assert_eq!(busy_in(&counters), BTreeSet::from([3, 5]));
}
