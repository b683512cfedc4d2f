//! Waiting for a condition instead of sleeping and then asserting.
//!
//! The tests run on a shared two-CPU machine where other builds come and go: a test that
//! sleeps a fixed time and then asserts, or that asserts how fast something happened, fails
//! when the machine is busy although nothing is wrong. So a test waits until what it expects
//! holds, with a deadline generous enough that only something that never happens reaches it,
//! and asserts the behaviour, not the speed; how fast something happens is a benchmark's
//! figure (`cargo xtask bench`). [`until`] and [`until_async`] return how long the wait took,
//! for a test that prints it.

use std::{
    future::Future,
    time::{Duration, Instant},
};

/// The deadline for something that happens "soon": long enough that a loaded machine never
/// reaches it, short enough that a test waiting for what never happens still ends.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// How often a condition is checked.
const POLL: Duration = Duration::from_millis(50);

/// Waits until `check` holds, checking every 50 ms for up to `within`; how long it took.
///
/// # Panics
/// `check` still fails after `within`; the message names `what`.
pub fn until(what: &str, within: Duration, mut check: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !check() {
        assert!(
            started.elapsed() < within,
            "timed out after {within:?} waiting for {what}"
        );
        std::thread::sleep(POLL);
    }
    started.elapsed()
}

/// [`until`] for an asynchronous check, sleeping on the tokio timer between checks.
///
/// # Panics
/// `check` still fails after `within`; the message names `what`.
pub async fn until_async<F, Fut>(what: &str, within: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < within,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
    started.elapsed()
}

/// [`until`] with [`PATIENCE`]: waits until `check` holds, or fails naming `what`.
///
/// # Panics
/// `check` still fails after [`PATIENCE`].
pub fn wait_for(what: &str, check: impl FnMut() -> bool) {
    until(what, PATIENCE, check);
}

/// [`until_async`] with [`PATIENCE`]: waits until `check` holds, or fails naming `what`.
///
/// # Panics
/// `check` still fails after [`PATIENCE`].
pub async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    until_async(what, PATIENCE, check).await;
}

/// Checks that `check` holds at every poll for `over` (a state that must last, such as a cgroup
/// staying thawed); how many times it was checked.
///
/// # Panics
/// `check` fails at some point; the message names `what`.
pub fn holds(what: &str, over: Duration, mut check: impl FnMut() -> bool) -> u32 {
    let started = Instant::now();
    let mut checks = 0;
    loop {
        assert!(
            check(),
            "{what} stopped holding after {:?}",
            started.elapsed()
        );
        checks += 1;
        if started.elapsed() >= over {
            return checks;
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn until_returns_once_the_condition_holds() {
        let mut n = 0;
        until("three checks", Duration::from_secs(5), || {
            n += 1;
            n >= 3
        });
        assert_eq!(n, 3);
    }

    #[test]
    #[should_panic(expected = "timed out after 50ms waiting for nothing")]
    fn until_fails_naming_what_never_happened() {
        until("nothing", Duration::from_millis(50), || false);
    }

    #[test]
    #[should_panic(expected = "a flag stopped holding")]
    fn holds_fails_when_the_state_changes() {
        let mut n = 0;
        holds("a flag", Duration::from_secs(5), || {
            n += 1;
            n < 3
        });
    }

    #[tokio::test]
    async fn until_async_waits_on_the_timer() {
        let started = Instant::now();
        let took = until_async("a moment", Duration::from_secs(5), || async {
            started.elapsed() >= Duration::from_millis(60)
        })
        .await;
        assert!(took >= Duration::from_millis(60));
    }
}
