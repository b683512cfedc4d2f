//! `fake-nvidia --mount DIR [--gpus N] [--memory SIZE]`: serves the fake NVIDIA driver at DIR
//! until SIGINT or SIGTERM, for trying the agent by hand on a machine without a GPU. Prints
//! `ready DIR` once mounted. Needs root.

use std::{path::PathBuf, process::ExitCode};

use gpuwarden_tests::{
    fake_driver::{FakeConfig, FakeDriver, MAX_GPUS},
    units,
};

const USAGE: &str = "usage: fake-nvidia --mount DIR [--gpus N] [--memory SIZE, e.g. 1g]";

fn main() -> ExitCode {
    let mut dir = None;
    let mut gpus = 2;
    let mut memory = 1 << 30;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next();
        match (flag.as_str(), value.as_deref()) {
            ("--mount", Some(v)) => dir = Some(PathBuf::from(v)),
            ("--gpus", Some(v))
                if v.parse::<usize>()
                    .is_ok_and(|n| (1..=MAX_GPUS).contains(&n)) =>
            {
                gpus = v.parse().unwrap_or(gpus);
            }
            ("--memory", Some(v)) if units::size(v).is_ok() => {
                memory = units::size(v).unwrap_or(memory);
            }
            (flag, value) => {
                eprintln!("fake-nvidia: bad argument {flag:?} {value:?}; {USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(dir) = dir else {
        eprintln!("fake-nvidia: --mount DIR is required; {USAGE}");
        return ExitCode::from(2);
    };
    // Block the signals before the FUSE thread starts, so it inherits the mask and only
    // `sigwait` below takes them.
    // SAFETY: a zeroed sigset_t is a valid argument to sigemptyset.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: plain signal-mask calls on a set we own.
    unsafe {
        libc::sigemptyset(&raw mut set);
        libc::sigaddset(&raw mut set, libc::SIGINT);
        libc::sigaddset(&raw mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &raw const set, std::ptr::null_mut());
    }
    let driver = match FakeDriver::mount(&dir, &FakeConfig::uniform(gpus, memory)) {
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
    eprintln!(
        "fake-nvidia: signal {signal}; in use per GPU at exit: {:?}",
        driver.ledger()
    );
    driver.unmount();
    ExitCode::SUCCESS
}
