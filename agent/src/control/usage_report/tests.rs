#![expect(
    clippy::float_cmp,
    reason = "Zero utilization is exactly 0.0 by construction"
)]

use std::{
    path::Path,
    sync::{Arc, Mutex},
};

use super::*;
use crate::enforcement::throttle::Usage;

/// Busy time by (GPU, directory), set by the test.
#[derive(Clone, Default)]
struct Fake(Arc<Mutex<HashMap<(u32, PathBuf), Duration>>>);

impl Fake {
    fn set(&self, gpu: u32, dir: &str, busy_ms: u64) {
        self.0
            .lock()
            .unwrap()
            .insert((gpu, dir.into()), Duration::from_millis(busy_ms));
    }
}

impl UsageSource for Fake {
    fn busy(&mut self, gpu: u32, dir: &Path) -> io::Result<Usage> {
        let busy = self
            .0
            .lock()
            .unwrap()
            .get(&(gpu, dir.to_owned()))
            .copied()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "gone"))?;
        Ok(Usage {
            busy,
            until: Instant::now(),
        })
    }
}

fn reading(session: &str, dir: Option<&str>, gpus: &[u32], ioctls: u64) -> SessionReading {
    SessionReading {
        session_id: session.into(),
        cgroup_dir: dir.map(PathBuf::from),
        gpus: gpus.to_vec(),
        memory_bytes: 64 << 20,
        ioctls,
    }
}

#[test]
fn utilization_is_the_mean_of_clamped_per_gpu_fractions() {
    let s = Duration::from_secs;
    let ms = Duration::from_millis;
    assert!((utilization(&[s(0)], &[ms(500)], s(1)) - 0.5).abs() < 1e-9);
    // One GPU idle, one over-counted: 0 and 1 → 0.5.
    assert!((utilization(&[s(1), s(0)], &[s(1), s(3)], s(1)) - 0.5).abs() < 1e-9);
    // A counter that went backwards (a new cgroup) counts as idle, not negative.
    assert_eq!(utilization(&[s(5)], &[s(1)], s(1)), 0.0);
    assert_eq!(utilization(&[], &[], s(1)), 0.0);
    assert_eq!(utilization(&[s(0)], &[s(1)], Duration::ZERO), 0.0);
}

#[test]
fn bound_sessions_report_from_their_second_reading_and_pending_ones_idle() {
    let fake = Fake::default();
    let mut r = Reporter::new(Box::new(fake.clone()));
    let t0 = Instant::now();
    fake.set(0, "/cg/a", 1_000);
    fake.set(1, "/cg/a", 1_000);
    let first = r.report(
        vec![
            reading("a", Some("/cg/a"), &[0, 1], 100),
            reading("p", None, &[0], 0),
        ],
        t0,
        1,
    );
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(
        (first[0].session_id.as_str(), first[0].utilization),
        ("p", 0.0)
    );

    // Two seconds later: GPU 0 busy 1.5 s, GPU 1 0.5 s; 300 more ioctls.
    fake.set(0, "/cg/a", 2_500);
    fake.set(1, "/cg/a", 1_500);
    let t1 = t0 + Duration::from_secs(2);
    let second = r.report(vec![reading("a", Some("/cg/a"), &[0, 1], 400)], t1, 2);
    assert_eq!(second.len(), 1);
    let a = &second[0];
    assert_eq!(a.session_id, "a");
    assert!((a.utilization - 0.5).abs() < 1e-9, "{a:?}");
    assert!((a.ioctls_per_sec - 150.0).abs() < 1e-9, "{a:?}");
    assert_eq!((a.memory_bytes, a.at_ms), (64 << 20, 2));
}

#[test]
fn a_new_cgroup_or_a_failed_read_starts_over() {
    let fake = Fake::default();
    let mut r = Reporter::new(Box::new(fake.clone()));
    let t0 = Instant::now();
    let sec = Duration::from_secs(1);
    fake.set(0, "/cg/a", 0);
    assert!(
        r.report(vec![reading("a", Some("/cg/a"), &[0], 0)], t0, 0)
            .is_empty()
    );
    // Rebound elsewhere: a baseline again, not a delta across two cgroups.
    fake.set(0, "/cg/b", 10_000);
    assert!(
        r.report(vec![reading("a", Some("/cg/b"), &[0], 0)], t0 + sec, 0)
            .is_empty()
    );
    // Unreadable: nothing, and the next good reading is a baseline.
    assert!(
        r.report(vec![reading("a", Some("/cg/c"), &[0], 0)], t0 + 2 * sec, 0)
            .is_empty()
    );
    assert!(
        r.report(vec![reading("a", Some("/cg/b"), &[0], 0)], t0 + 3 * sec, 0)
            .is_empty()
    );
    fake.set(0, "/cg/b", 10_250);
    let out = r.report(vec![reading("a", Some("/cg/b"), &[0], 0)], t0 + 4 * sec, 0);
    assert!((out[0].utilization - 0.25).abs() < 1e-9, "{out:?}");
    // A session no longer read is forgotten.
    assert!(r.report(vec![], t0 + 5 * sec, 0).is_empty());
    assert!(r.baselines.is_empty());
}

#[test]
fn polls_split_the_interval_evenly() {
    let ms = Duration::from_millis;
    assert_eq!(poll_plan(ms(5_000)), (ms(500), 10));
    assert_eq!(poll_plan(ms(1_200)), (ms(400), 3));
    assert_eq!(poll_plan(ms(200)), (ms(200), 1));
}
