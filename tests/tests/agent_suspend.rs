//! Suspending a workload's GPU memory to the host and resuming it (issue 38), on the real
//! kernel with the fake driver: the agent's checkpoint helper drives the stand-in
//! `libcuda.so.1` (tests/fixtures/fake-libcuda), whose calls make a fake CUDA process free its
//! video memory into a host file and allocate it back. The fake driver's own ledger and the
//! process's checksum of its data are the independent accounts.

#![expect(
    clippy::unwrap_used,
    reason = "a test's helpers unwrap: a failure there is the test failing"
)]

mod util;

use std::time::Duration;

use gpuwarden_agent::checkpoint::{Action, CheckpointError, CuResult, ProcessState};
use gpuwarden_test_support::require_root;
use util::{
    Driver,
    suspend::{CudaProcess, FakeLibcuda},
};

const MIB: u64 = 1 << 20;
const STEP: Duration = Duration::from_secs(10);

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Lock, checkpoint, restore, unlock through the helper: the driver's ledger for the GPU goes
/// to 0 while the process is checkpointed and back to what it held after, its data reaches a
/// host file and returns unchanged (the process's own checksum), and each call reports the
/// state the driver moved the process to.
#[test]
#[ignore = "needs root"]
fn the_helper_moves_a_process_gpu_memory_to_the_host_and_back() {
    require_root();
    let driver = Driver::mount("ckpt");
    let libcuda = FakeLibcuda::build();
    let helper = libcuda.helper();
    let mut p = CudaProcess::spawn(&driver.dir, &libcuda, 0, &["64m", "30m"], None);
    assert_eq!(driver.fake.ledger(), vec![94 * MIB, 0]);
    let (rt, pid) = (rt(), p.pid);
    let act = |action| rt.block_on(helper.act(pid, action, STEP));

    assert_eq!(act(Action::Lock).unwrap(), Some(ProcessState::Locked));
    assert_eq!(
        act(Action::Checkpoint).unwrap(),
        Some(ProcessState::Checkpointed)
    );
    driver
        .fake
        .wait_for_ledger(&[0, 0], STEP)
        .expect("checkpointed: nothing left on the GPU");
    // The first MiB of each allocation is what the fake models; it is on the host now.
    let image = std::fs::metadata(libcuda.image(pid)).unwrap().len();
    assert_eq!(image, 2 * MIB);

    assert_eq!(act(Action::Restore).unwrap(), Some(ProcessState::Locked));
    assert_eq!(driver.fake.ledger(), vec![94 * MIB, 0]);
    assert_eq!(act(Action::Unlock).unwrap(), Some(ProcessState::Running));
    assert_eq!(p.checksum_now(), p.checksum, "the data came back unchanged");
    assert!(!libcuda.image(pid).exists());

    // Out of order: the driver's ILLEGAL_STATE, typed, with its code.
    let err = act(Action::Unlock).unwrap_err();
    assert_eq!(err.code(), Some(CuResult(401)), "{err}");
}

/// A process the driver will not checkpoint: the helper reports `CUDA_ERROR_NOT_SUPPORTED`
/// with the function that refused; nothing moved, and unlocking returns it to running.
#[test]
#[ignore = "needs root"]
fn a_refusal_comes_back_typed_with_the_driver_code() {
    require_root();
    let driver = Driver::mount("ckpt-refuse");
    let libcuda = FakeLibcuda::build();
    let helper = libcuda.helper();
    let mut p = CudaProcess::spawn(&driver.dir, &libcuda, 1, &["8m"], None);
    libcuda.refuse(p.pid);
    let (rt, pid) = (rt(), p.pid);
    let act = |action| rt.block_on(helper.act(pid, action, STEP));
    act(Action::Lock).unwrap();
    let err = act(Action::Checkpoint).unwrap_err();
    match &err {
        CheckpointError::Driver {
            function,
            pid,
            code,
        } => {
            assert_eq!(*function, "cuCheckpointProcessCheckpoint");
            assert_eq!(*pid, p.pid);
            assert_eq!(*code, CuResult::NOT_SUPPORTED);
        }
        other => panic!("{other}"),
    }
    assert!(
        err.to_string().contains("CUDA_ERROR_NOT_SUPPORTED (801)"),
        "{err}"
    );
    assert_eq!(driver.fake.ledger(), vec![0, 8 * MIB]);
    act(Action::Unlock).unwrap();
    assert_eq!(p.checksum_now(), p.checksum);

    // A pid that is no CUDA process, and a library that is not there.
    let err = rt
        .block_on(helper.act(std::process::id(), Action::GetState, STEP))
        .unwrap_err();
    assert_eq!(err.code(), Some(CuResult(1)), "{err}");
    let mut missing = helper.clone();
    missing.library = Some(libcuda.dir.path().join("nope.so"));
    let err = rt
        .block_on(missing.act(p.pid, Action::Lock, STEP))
        .unwrap_err();
    assert!(matches!(err, CheckpointError::Helper { .. }), "{err}");
}
