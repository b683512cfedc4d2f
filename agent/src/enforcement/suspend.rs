//! Suspending a workload instead of killing it (issue 38, docs/suspend.md): each process of
//! its cgroup that holds a GPU context is locked and checkpointed through the driver (its GPU
//! memory copied to host memory and released on the GPU), then the cgroup is frozen; resuming
//! thaws the cgroup, restores and unlocks each. Every driver call runs in the checkpoint
//! helper process under a timeout ([`crate::checkpoint`]).
//!
//! The freeze comes after the checkpoint, not before: the driver does the copy on a thread
//! inside the target process (docs/suspend.md, "Order"), which a frozen cgroup would stop.
//! A refusal part-way is undone (restored, unlocked) so the caller can fall back to the kill
//! path with the workload as it was.

use std::{
    future::Future,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::checkpoint::{Action, CheckpointError, GpuPair, ProcessState, helper::Helper};

pub use gpuwarden_types::policy::PreemptionMode;

/// How the agent suspends workloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuspendConfig {
    /// The checkpoint helper.
    pub helper: Helper,
    /// The limit on each driver call (lock, checkpoint, restore, unlock of one process).
    pub step_timeout: Duration,
    /// Host memory a suspension leaves available: where the GPU memory to
    /// copy out would take the node's `MemAvailable` below it, the workload is killed instead.
    pub host_reserve: u64,
}

impl SuspendConfig {
    /// The host memory a suspension leaves available unless configured: 1 GiB.
    pub const DEFAULT_HOST_RESERVE: u64 = 1 << 30;
}

/// Whether the host has room for `footprint` bytes of GPU memory copied out, leaving `reserve`
/// of `MemAvailable` (read from `meminfo`, the text of `/proc/meminfo`) once the `in_flight`
/// bytes of suspensions still copying out (which `MemAvailable` does not count yet) are there
/// too. Unknown where `meminfo` does not tell (then the suspension goes ahead, as before the
/// check).
///
/// # Errors
/// Why not, naming the numbers.
pub(crate) fn host_room(
    meminfo: &str,
    footprint: u64,
    in_flight: u64,
    reserve: u64,
) -> Result<(), String> {
    let Some(available) = meminfo.lines().find_map(|l| {
        let kib = l.strip_prefix("MemAvailable:")?.trim().strip_suffix("kB")?;
        kib.trim().parse::<u64>().ok()?.checked_mul(1024)
    }) else {
        return Ok(());
    };
    if footprint.saturating_add(in_flight).saturating_add(reserve) <= available {
        return Ok(());
    }
    let others = if in_flight == 0 {
        String::new()
    } else {
        format!(
            " after the {} MiB of suspensions under way",
            in_flight.div_ceil(1 << 20)
        )
    };
    Err(format!(
        "the host has {} MiB available; its {} MiB of GPU memory{others} would leave less than \
         the {} MiB reserve",
        available >> 20,
        footprint.div_ceil(1 << 20),
        reserve >> 20
    ))
}

/// Makes checkpoint calls on processes (the helper; a fake in unit tests).
pub(crate) trait Checkpointer: Send + Sync {
    fn act(
        &self,
        pid: u32,
        action: Action,
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<ProcessState>, CheckpointError>> + Send;

    /// Restores `pid` onto other GPUs (`pairs`: old → new).
    fn restore_onto(
        &self,
        pid: u32,
        pairs: &[GpuPair],
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<ProcessState>, CheckpointError>> + Send;

    /// The driver's CUDA version.
    fn driver_version(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<i32, CheckpointError>> + Send;
}

impl Checkpointer for Helper {
    fn act(
        &self,
        pid: u32,
        action: Action,
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<ProcessState>, CheckpointError>> + Send {
        Helper::act(self, pid, action, timeout)
    }

    fn restore_onto(
        &self,
        pid: u32,
        pairs: &[GpuPair],
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<ProcessState>, CheckpointError>> + Send {
        Helper::restore_onto(self, pid, pairs, timeout)
    }

    fn driver_version(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<i32, CheckpointError>> + Send {
        Helper::driver_version(self, timeout)
    }
}

/// Whether the driver can restore onto other GPUs ([`crate::checkpoint::GPU_PAIRS_SINCE`]):
/// asked before anything of a move to other GPUs is done, so that a refusal leaves the
/// suspension as it was.
///
/// # Errors
/// The driver is too old ([`CheckpointError::NoGpuPairs`]), or could not be asked.
pub(crate) async fn check_gpu_pairs(
    c: &impl Checkpointer,
    step: Duration,
) -> Result<i32, CheckpointError> {
    let driver_version = c.driver_version(step).await?;
    if driver_version < crate::checkpoint::GPU_PAIRS_SINCE {
        return Err(CheckpointError::NoGpuPairs { driver_version });
    }
    Ok(driver_version)
}

/// A workload suspended: which processes were checkpointed, how long it took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Suspended {
    /// The processes checkpointed, in order.
    pub pids: Vec<u32>,
    /// Lock, checkpoint and freeze together.
    pub took: Duration,
}

/// Why a suspension did not happen (the workload was put back as it was, where it could be).
#[derive(Debug, thiserror::Error)]
#[error("process {pid}: {source}")]
pub(crate) struct Refusal {
    /// The process the driver refused.
    pub pid: u32,
    /// What it answered.
    #[source]
    pub source: CheckpointError,
}

/// The processes among `pids` that hold a GPU context: those with the driver's control node
/// (`nvidiactl`, the fake driver's file of that name in tests) open, as every CUDA process
/// does. A process that has gone is left out.
pub(crate) fn with_gpu_context(proc_root: &Path, pids: &[u32]) -> Vec<u32> {
    pids.iter()
        .copied()
        .filter(|pid| {
            std::fs::read_dir(proc_root.join(pid.to_string()).join("fd")).is_ok_and(|fds| {
                fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|target| target.file_name().is_some_and(|n| n == "nvidiactl"))
                })
            })
        })
        .collect()
}

/// Writes `cgroup.freeze` of `dir`.
fn freeze(dir: &Path, frozen: bool) -> std::io::Result<()> {
    std::fs::write(dir.join("cgroup.freeze"), if frozen { "1" } else { "0" })
}

/// Locks and checkpoints each of `pids` (each call within `step`), then freezes `dir`. A
/// refusal undoes what was done: the checkpointed are restored, the locked unlocked.
pub(crate) async fn suspend(
    c: &impl Checkpointer,
    dir: &Path,
    pids: &[u32],
    step: Duration,
) -> Result<Suspended, Refusal> {
    let start = Instant::now();
    let mut locked = Vec::new();
    let mut checkpointed = Vec::new();
    let mut failed = None;
    for &pid in pids {
        match c.act(pid, Action::Lock, step).await {
            Ok(_) => locked.push(pid),
            Err(source) => {
                failed = Some(Refusal { pid, source });
                break;
            }
        }
    }
    if failed.is_none() {
        for &pid in pids {
            match c.act(pid, Action::Checkpoint, step).await {
                Ok(_) => checkpointed.push(pid),
                Err(source) => {
                    failed = Some(Refusal { pid, source });
                    break;
                }
            }
        }
    }
    if let Some(refusal) = failed {
        undo(c, &checkpointed, &locked, step).await;
        return Err(refusal);
    }
    if let Err(e) = freeze(dir, true) {
        // The GPU memory is on the host and the processes' CUDA calls are blocked: the
        // suspension holds without the freeze, only their CPU side keeps running.
        tracing::warn!(dir = %dir.display(), "suspended but not frozen: {e}");
    }
    Ok(Suspended {
        pids: pids.to_vec(),
        took: start.elapsed(),
    })
}

async fn undo(c: &impl Checkpointer, checkpointed: &[u32], locked: &[u32], step: Duration) {
    for &pid in checkpointed {
        if let Err(e) = c.act(pid, Action::Restore, step).await {
            tracing::warn!(pid, "not restored after a refused suspension: {e}");
        }
    }
    for &pid in locked {
        if let Err(e) = c.act(pid, Action::Unlock, step).await {
            tracing::warn!(pid, "not unlocked after a refused suspension: {e}");
        }
    }
}

/// Thaws `dir`, then restores each of `pids` the driver has checkpointed (onto other GPUs
/// where `pairs` name them: old → new) and unlocks each it has locked (each call within
/// `step`); how long it took. A process the driver says runs is left alone, and one whose
/// state it does not tell is restored and unlocked. Stops at the first failure: that process's
/// GPU state may be lost.
pub(crate) async fn resume(
    c: &impl Checkpointer,
    dir: &Path,
    pids: &[u32],
    pairs: &[GpuPair],
    step: Duration,
) -> Result<Duration, Refusal> {
    let start = Instant::now();
    if let Err(e) = freeze(dir, false) {
        tracing::warn!(dir = %dir.display(), "not thawed before the restore: {e}");
    }
    let refused = |pid| move |source| Refusal { pid, source };
    let mut locked = Vec::new();
    for &pid in pids {
        match c.act(pid, Action::GetState, step).await {
            Ok(Some(ProcessState::Running)) => {}
            Ok(Some(ProcessState::Locked)) => locked.push(pid),
            _ => {
                if pairs.is_empty() {
                    c.act(pid, Action::Restore, step).await
                } else {
                    c.restore_onto(pid, pairs, step).await
                }
                .map_err(refused(pid))?;
                locked.push(pid);
            }
        }
    }
    for pid in locked {
        c.act(pid, Action::Unlock, step)
            .await
            .map_err(refused(pid))?;
    }
    Ok(start.elapsed())
}

/// Whether the driver tells of any of `pids` that it is no longer checkpointed (locked,
/// running, failed or busy): a restore of it ran, in part at least. Asked after an agent restart, of a
/// move the earlier run did not settle.
///
/// # Errors
/// The driver could not be asked about a process.
pub(crate) async fn restored_any(
    c: &impl Checkpointer,
    pids: &[u32],
    step: Duration,
) -> Result<bool, Refusal> {
    for &pid in pids {
        let state = c
            .act(pid, Action::GetState, step)
            .await
            .map_err(|source| Refusal { pid, source })?;
        // A state the driver does not tell counts as checkpointed, as in [`resume`].
        if state.is_some_and(|s| s != ProcessState::Checkpointed) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// A suspension under way or in place, as the enforcer keeps it.
#[derive(Debug, Clone)]
pub(crate) struct Suspension {
    /// The cgroup frozen.
    pub dir: PathBuf,
    /// The processes checkpointed (empty while under way).
    pub pids: Vec<u32>,
    /// Since when (the start of the suspension).
    pub since: Instant,
    /// Why (whom it yields to).
    pub reason: String,
    /// The grace a fall-back kill gets.
    pub grace: Duration,
    /// Done: checkpointed and frozen.
    pub done: bool,
    /// GPU memory its quota counted when the suspension began: what goes to host memory.
    pub held: u64,
    /// A move to other GPUs asked for and waiting for the driver's word that it can
    /// ([`check_gpu_pairs`]); taken when the resumption starts.
    pub moving: Option<Move>,
}

/// Where a suspended session resumes when not on the GPUs it left: its quota on the new GPUs,
/// and the pairs the restore passes the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    /// The session's quota with the new GPUs in place of the old.
    pub spec: crate::enforcement::quota::QuotaSpec,
    /// Each GPU left (UUID) and the one taking its place.
    pub pairs: Vec<GpuPair>,
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::checkpoint::CuResult;

    /// Records each call; refuses `refuse` = (pid, action) with `CUDA_ERROR_NOT_SUPPORTED`;
    /// answers `GetState` from `states` (none: not told).
    #[derive(Default)]
    struct Fake {
        calls: Mutex<Vec<(u32, Action)>>,
        refuse: Option<(u32, Action)>,
        states: std::collections::BTreeMap<u32, ProcessState>,
        /// Restores onto other GPUs, with their pairs.
        onto: Mutex<Vec<(u32, Vec<GpuPair>)>>,
        /// What `cuDriverGetVersion` answers.
        version: i32,
    }

    impl Checkpointer for Fake {
        fn act(
            &self,
            pid: u32,
            action: Action,
            _: Duration,
        ) -> impl Future<Output = Result<Option<ProcessState>, CheckpointError>> + Send {
            self.calls.lock().unwrap().push((pid, action));
            let refused = self.refuse == Some((pid, action));
            let state = (action == Action::GetState)
                .then(|| self.states.get(&pid).copied())
                .flatten();
            async move {
                if state.is_some() {
                    Ok(state)
                } else if refused {
                    Err(CheckpointError::Driver {
                        function: action.function(),
                        pid,
                        code: CuResult::NOT_SUPPORTED,
                    })
                } else {
                    Ok(None)
                }
            }
        }

        fn restore_onto(
            &self,
            pid: u32,
            pairs: &[GpuPair],
            timeout: Duration,
        ) -> impl Future<Output = Result<Option<ProcessState>, CheckpointError>> + Send {
            self.onto.lock().unwrap().push((pid, pairs.to_vec()));
            self.act(pid, Action::Restore, timeout)
        }

        fn driver_version(
            &self,
            _: Duration,
        ) -> impl Future<Output = Result<i32, CheckpointError>> + Send {
            let version = self.version;
            async move { Ok(version) }
        }
    }

    const STEP: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn a_suspension_locks_all_then_checkpoints_all_then_freezes() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Fake::default();
        let done = suspend(&fake, dir.path(), &[7, 8], STEP).await.unwrap();
        assert_eq!(done.pids, [7, 8]);
        assert_eq!(
            *fake.calls.lock().unwrap(),
            [
                (7, Action::Lock),
                (8, Action::Lock),
                (7, Action::Checkpoint),
                (8, Action::Checkpoint)
            ]
        );
        let frozen = std::fs::read_to_string(dir.path().join("cgroup.freeze")).unwrap();
        assert_eq!(frozen, "1");

        fake.calls.lock().unwrap().clear();
        resume(&fake, dir.path(), &[7, 8], &[], STEP).await.unwrap();
        let frozen = std::fs::read_to_string(dir.path().join("cgroup.freeze")).unwrap();
        assert_eq!(frozen, "0", "thawed before the restore");
        assert_eq!(
            *fake.calls.lock().unwrap(),
            [
                (7, Action::GetState),
                (7, Action::Restore),
                (8, Action::GetState),
                (8, Action::Restore),
                (7, Action::Unlock),
                (8, Action::Unlock)
            ]
        );
    }

    #[test]
    fn a_suspension_must_leave_the_reserve_of_host_memory_available() {
        const MIB: u64 = 1 << 20;
        let meminfo = "MemTotal:       24000000 kB\nMemFree:         1000000 kB\n\
                       MemAvailable:    2097152 kB\nBuffers:           1 kB\n";
        // 2 GiB available: 1 GiB out with a 1 GiB reserve fits exactly, a byte more does not.
        assert_eq!(host_room(meminfo, 1024 * MIB, 0, 1024 * MIB), Ok(()));
        let why = host_room(meminfo, 1024 * MIB + 1, 0, 1024 * MIB).unwrap_err();
        assert!(
            why.contains("2048 MiB available")
                && why.contains("1025 MiB of GPU memory")
                && why.contains("1024 MiB reserve"),
            "{why}"
        );
        // The footprint counts: with none, the same reserve fits.
        assert_eq!(host_room(meminfo, 0, 0, 2048 * MIB), Ok(()));
        // No MemAvailable (a kernel before 3.14): not known, not refused.
        assert_eq!(host_room("MemTotal: 1 kB\n", u64::MAX, 0, u64::MAX), Ok(()));
        // Sums that would overflow are refused, not wrapped.
        assert!(host_room(meminfo, u64::MAX, 0, 1).is_err());
        // Suspensions still copying out count as taken: 512 MiB out with 512 MiB under way
        // fits the 1 GiB above the reserve exactly, a byte more under way does not.
        assert_eq!(host_room(meminfo, 512 * MIB, 512 * MIB, 1024 * MIB), Ok(()));
        let why = host_room(meminfo, 512 * MIB, 512 * MIB + 1, 1024 * MIB).unwrap_err();
        assert!(why.contains("under way"), "{why}");
    }

    #[tokio::test]
    async fn a_move_began_where_the_driver_holds_any_process_no_longer_checkpointed() {
        let with = |states: &[(u32, ProcessState)]| Fake {
            states: states.iter().copied().collect(),
            ..Fake::default()
        };
        let checkpointed = with(&[
            (7, ProcessState::Checkpointed),
            (8, ProcessState::Checkpointed),
        ]);
        assert!(!restored_any(&checkpointed, &[7, 8], STEP).await.unwrap());
        // A state the driver does not tell (pid 9) says nothing moved.
        assert!(!restored_any(&checkpointed, &[7, 9], STEP).await.unwrap());
        for moved in [
            ProcessState::Locked,
            ProcessState::Running,
            ProcessState::Failed,
        ] {
            let fake = with(&[(7, ProcessState::Checkpointed), (8, moved)]);
            assert!(
                restored_any(&fake, &[7, 8], STEP).await.unwrap(),
                "{moved:?}"
            );
        }
        // Only the driver was asked: nothing restored, unlocked or checkpointed.
        assert!(
            checkpointed
                .calls
                .lock()
                .unwrap()
                .iter()
                .all(|&(_, a)| a == Action::GetState)
        );
        let refusing = Fake {
            refuse: Some((8, Action::GetState)),
            ..with(&[(7, ProcessState::Checkpointed)])
        };
        let err = restored_any(&refusing, &[7, 8], STEP).await.unwrap_err();
        assert_eq!(err.pid, 8);
    }

    #[tokio::test]
    async fn a_resume_restores_only_what_the_driver_holds_checkpointed() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Fake {
            states: [
                (7, ProcessState::Checkpointed),
                (8, ProcessState::Locked),
                (9, ProcessState::Running),
            ]
            .into(),
            ..Fake::default()
        };
        resume(&fake, dir.path(), &[7, 8, 9], &[], STEP)
            .await
            .unwrap();
        let acted: Vec<(u32, Action)> = fake
            .calls
            .lock()
            .unwrap()
            .iter()
            .copied()
            .filter(|&(_, a)| a != Action::GetState)
            .collect();
        assert_eq!(
            acted,
            [
                (7, Action::Restore),
                (7, Action::Unlock),
                (8, Action::Unlock)
            ]
        );
    }

    #[tokio::test]
    async fn a_refusal_is_undone_and_nothing_is_frozen() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Fake {
            refuse: Some((8, Action::Checkpoint)),
            ..Fake::default()
        };
        let refusal = suspend(&fake, dir.path(), &[7, 8], STEP).await.unwrap_err();
        assert_eq!(refusal.pid, 8);
        assert_eq!(refusal.source.code(), Some(CuResult::NOT_SUPPORTED));
        assert!(
            refusal
                .to_string()
                .contains("CUDA_ERROR_NOT_SUPPORTED (801)")
        );
        let calls = fake.calls.lock().unwrap().clone();
        assert_eq!(
            calls[4..],
            [
                (7, Action::Restore),
                (7, Action::Unlock),
                (8, Action::Unlock)
            ],
            "{calls:?}"
        );
        assert!(!dir.path().join("cgroup.freeze").exists());
    }

    #[tokio::test]
    async fn a_resume_onto_other_gpus_passes_the_pairs_to_each_restore() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Fake {
            states: [(8, ProcessState::Running)].into(),
            ..Fake::default()
        };
        let pairs = vec![GpuPair {
            old: "GPU-00000000-0000-0000-0000-000000000000".into(),
            new: "GPU-00000000-0000-0000-0000-000000000001".into(),
        }];
        resume(&fake, dir.path(), &[7, 8], &pairs, STEP)
            .await
            .unwrap();
        // 8 runs: nothing to restore; 7 is restored onto the new GPU, with the pairs.
        assert_eq!(*fake.onto.lock().unwrap(), [(7, pairs)]);
    }

    #[tokio::test]
    async fn only_a_driver_from_13000_may_restore_onto_other_gpus() {
        let old = Fake {
            version: 12_080,
            ..Fake::default()
        };
        let err = check_gpu_pairs(&old, STEP).await.unwrap_err();
        assert!(
            matches!(
                err,
                CheckpointError::NoGpuPairs {
                    driver_version: 12_080
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("cannot restore onto other GPUs"));
        let new = Fake {
            version: 13_000,
            ..Fake::default()
        };
        assert_eq!(check_gpu_pairs(&new, STEP).await.unwrap(), 13_000);
    }

    #[test]
    fn gpu_uuids_read_as_the_driver_takes_them() {
        let bytes =
            crate::checkpoint::uuid_bytes("GPU-6a4c2f9e-0000-4000-8000-0000000000ff").unwrap();
        assert_eq!(bytes[..4], [0x6a, 0x4c, 0x2f, 0x9e]);
        assert_eq!(bytes[15], 0xff);
        for bad in ["GPU-test-0", "GPU-6a4c2f9e-0000-4000-8000-00000000zzzz", ""] {
            assert!(crate::checkpoint::uuid_bytes(bad).is_err(), "{bad}");
        }
        let pair: GpuPair =
            "GPU-6a4c2f9e-0000-4000-8000-000000000000=GPU-6a4c2f9e-0000-4000-8000-000000000001"
                .parse()
                .unwrap();
        assert!(pair.new.ends_with('1'));
        assert!("GPU-test-0=GPU-test-1".parse::<GpuPair>().is_err());
    }

    #[test]
    fn only_the_words_suspend_and_kill_mean_anything() {
        assert_eq!(
            PreemptionMode::from_wire("suspend"),
            PreemptionMode::Suspend
        );
        for word in ["", "kill", "Suspend", "hibernate"] {
            assert_eq!(PreemptionMode::from_wire(word), PreemptionMode::Kill);
        }
    }

    #[test]
    fn a_process_with_the_control_node_open_has_a_gpu_context() {
        let root = tempfile::tempdir().unwrap();
        let fds = root.path().join("41/fd");
        std::fs::create_dir_all(&fds).unwrap();
        std::os::unix::fs::symlink("/dev/nvidiactl", fds.join("3")).unwrap();
        std::fs::create_dir_all(root.path().join("42/fd")).unwrap();
        std::os::unix::fs::symlink("/dev/null", root.path().join("42/fd/0")).unwrap();
        assert_eq!(with_gpu_context(root.path(), &[41, 42, 43]), [41]);
    }
}
