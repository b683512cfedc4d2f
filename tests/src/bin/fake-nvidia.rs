//! `fake-nvidia --mount DIR [--gpus N] [--memory BYTES]`: serves the fake NVIDIA driver at DIR
//! until SIGINT or SIGTERM, for trying the agent by hand on a machine without a GPU.

use std::{path::PathBuf, process::ExitCode};

use gpuwarden_tests::fake_driver::{FakeConfig, FakeDriver};

fn main() -> ExitCode {
    let mut dir = None;
    let mut gpus = 2usize;
    let mut memory: u64 = 1 << 30;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let value = args.next();
        match (a.as_str(), value) {
            ("--mount", Some(v)) => dir = Some(PathBuf::from(v)),
            ("--gpus", Some(v)) if v.parse::<usize>().is_ok_and(|n| (1..=4).contains(&n)) => {
                gpus = v.parse().unwrap_or(2);
            }
            ("--memory", Some(v)) if v.parse::<u64>().is_ok() => {
                memory = v.parse().unwrap_or(memory)
            }
            (flag, value) => {
                eprintln!(
                    "fake-nvidia: bad argument {flag:?} {value:?}; usage: fake-nvidia --mount DIR [--gpus 1-4] [--memory BYTES]"
                );
                return ExitCode::from(2);
            }
        }
    }
    let Some(dir) = dir else {
        eprintln!("fake-nvidia: --mount DIR is required");
        return ExitCode::from(2);
    };
    // Block the signals first so the FUSE thread doesn't take them, then wait for one.
    // SAFETY: plain signal-mask calls on a zeroed, then filled, set.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&raw mut set);
        libc::sigaddset(&raw mut set, libc::SIGINT);
        libc::sigaddset(&raw mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, std::ptr::null_mut());
    }
    let driver = match FakeDriver::mount(
        &dir,
        FakeConfig {
            gpu_memory: vec![memory; gpus],
        },
    ) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("fake-nvidia: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("ready {}", driver.dir().display());
    let mut signal = 0;
    // SAFETY: waits on the blocked set.
    unsafe { libc::sigwait(&raw const set, &raw mut signal) };
    drop(driver);
    ExitCode::SUCCESS
}
