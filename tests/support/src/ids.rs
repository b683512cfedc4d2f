//! Names unique to a test run: container ids and pod UIDs, so tests running at once (and runs
//! one after another on the same kernel) never share a cgroup or a pod.

use std::{
    fmt::Write as _,
    sync::atomic::{AtomicU32, Ordering},
};

/// Makes [`container_id`]s unique within this run.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// A 64-hex container id unique to this run.
#[must_use]
pub fn container_id(seed: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!(
        "{seed}{}{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
    .bytes()
    {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    let mut id = String::with_capacity(64);
    for i in 0..4 {
        let word = h.rotate_left(i * 16) ^ (u64::from(i) * 0x9e37_79b9);
        // Writing to a String can't fail.
        let _ = write!(id, "{word:016x}");
    }
    id
}

/// A pod UID unique to this run.
#[must_use]
pub fn pod_uid(seed: &str) -> String {
    let id = container_id(seed);
    format!(
        "{}-{}-{}-{}-{}",
        &id[0..8],
        &id[8..12],
        &id[12..16],
        &id[16..20],
        &id[20..32]
    )
}
