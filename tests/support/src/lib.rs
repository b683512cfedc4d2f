//! The test helpers of gpuwarden, a module per concern: fixtures every test crate shares, and
//! behind features the harnesses that start a daemon.
//!
//! # The root policy
//!
//! Tests that load eBPF programs, mount FUSE file systems or make cgroups need root. They are
//! marked `#[ignore = "needs root"]` and call [`require_root`] first:
//!
//! - `cargo test` as any user runs everything else, and lists each root test as
//!   `ignored, needs root`, so what was skipped is named;
//! - `cargo xtask test` (CI) runs them too (`-- --include-ignored`), and as a non-root user
//!   each of them fails with the reason instead of passing silently.
//!
//! # A real etcd
//!
//! [`Etcd`] starts Debian's `etcd` on loopback ports for the store's tests; `cargo xtask setup`
//! installs it, and a test run without it fails saying so.
//!
//! # Scratch space
//!
//! [`scratch`] makes a short directory under `/tmp` (the eBPF programs match device paths of
//! fewer than 64 bytes) that is removed when dropped, so a test run leaves nothing behind.
//!
//! # Waiting, not timing
//!
//! [`wait`]: a test waits until what it expects holds, with a generous deadline, instead of
//! sleeping and then asserting or asserting how fast something happened; speed is measured by
//! `cargo xtask bench`.
//!
//! # Nodes and spinners
//!
//! [`node`]: the `NodeInfo` a fake agent registers, and its registration and stream.
//! [`spinner`]: CPU-spinning processes in a cgroup, for the compute throttle's tests and bench.
//!
//! # Stand-ins and names
//!
//! [`kubelet`]: a fake kubelet serving a pod list, and the kubepods cgroups it names.
//! [`devnode`]: GPU device nodes with no driver, opened or made from inside a cgroup.
//! [`ids`]: container ids and pod UIDs unique to a run.
//!
//! # Binaries
//!
//! [`bin`] finds a binary of the package under test, for helpers here that run one
//! (`CARGO_BIN_EXE_<name>` is set only while compiling that package's tests); [`cli`] runs the
//! `gpuwarden` CLI as its end-to-end tests do.
//!
//! # Harnesses behind features
//!
//! The fixtures above link no gpuwarden product crate, so the agent's and the controller's own
//! unit tests use them without compiling the other daemon. What starts a daemon links it, and
//! sits behind a feature named after what it starts, which a test crate turns on in its
//! `[dev-dependencies]`:
//!
//! - `controller`: module `controller`, a controller in the test's process or as its binary;
//! - `agent`: module `agent`, the agent in the test's process, and reading its snapshot;
//! - both: module `cluster`, agent links with mock GPUs registered with a controller;
//! - `otlp`: module `otlp`, an OTLP/gRPC metrics receiver (links the OpenTelemetry protos).
//!
//! What wraps `gpuwarden-tests`' own peers (its fake driver, its `gpu-client` and `cuda-process`
//! binaries) is in that crate's `harness` module, not here: its `spinner` binary links this
//! crate, so this crate can't link it back.
//!
//! The controller's own integration tests may turn `controller` on: Cargo lets a package's
//! dev-dependency depend on that package, and its integration tests link the same
//! `gpuwarden-controller` this crate does. Its unit tests (`controller/src`) must not use those
//! modules: they are a second build of the crate, whose types differ from the ones here.
#![deny(missing_docs)]

#[cfg(feature = "agent")]
pub mod agent;
mod cgroup;
pub mod cli;
#[cfg(all(feature = "agent", feature = "controller"))]
pub mod cluster;
#[cfg(feature = "controller")]
pub mod controller;
pub mod devnode;
mod etcd;
pub mod ids;
pub mod kubelet;
pub mod node;
#[cfg(feature = "otlp")]
pub mod otlp;
pub mod spinner;
pub mod wait;

use std::path::{Path, PathBuf};

pub use cgroup::TestCgroup;
pub use etcd::{Etcd, EtcdTls};

/// A mock device list of two 16 GiB GPUs, indexes 0 and 1 (the fake driver's `nvidia0` and
/// `nvidia1`), in the agent's `--mock-devices` TOML.
pub const TWO_MOCK_GPUS: &str = r#"
[[devices]]
uuid = "GPU-test-0"
model_name = "Mock"
memory_size = "16G"
[[devices]]
uuid = "GPU-test-1"
model_name = "Mock"
memory_size = "16G"
"#;

/// Whether this process runs as root.
#[must_use]
pub fn is_root() -> bool {
    // SAFETY: a plain syscall that can't fail.
    unsafe { libc::geteuid() == 0 }
}

/// Fails the calling test unless it runs as root, saying why. A root test never skips itself:
/// it is `#[ignore = "needs root"]` instead, so `cargo test` names it.
///
/// # Panics
/// Not root.
pub fn require_root() {
    assert!(
        is_root(),
        "this test loads eBPF programs, mounts FUSE file systems or makes cgroups: it needs root \
         (run `cargo xtask test` as root)"
    );
}

/// A fresh directory `/tmp/gw-<tag>XXXXXX`, removed with everything in it when dropped.
///
/// # Panics
/// `/tmp` is not writable.
#[must_use]
pub fn scratch(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("gw-{tag}"))
        .tempdir_in(Path::new("/tmp"))
        .unwrap_or_else(|e| panic!("cannot make a scratch directory under /tmp: {e}"))
}

/// The binary `name` of the package whose test or bench runs: Cargo builds a package's binaries
/// before its integration tests and benches, into the directory above theirs (`deps/`).
///
/// # Panics
/// There is no such binary there (the caller is not an integration test or bench of the
/// package that has it).
#[must_use]
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("no path to this test: {e}"));
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("{} is not in a target directory", exe.display()));
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "no binary {} (only a package's own tests and benches have its binaries built)",
        path.display()
    );
    path
}

/// The first line of `binary --help`, which should say what the binary is, and the whole text.
///
/// # Panics
/// The binary does not run or `--help` fails.
#[must_use]
pub fn help(binary: &str) -> (String, String) {
    let out = std::process::Command::new(binary)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {binary}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{binary} --help failed: {text}");
    (text.lines().next().unwrap_or_default().to_owned(), text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_directories_are_short_and_go_away() {
        let dir = scratch("t");
        let path = dir.path().to_owned();
        assert!(
            path.to_string_lossy().starts_with("/tmp/gw-t"),
            "{}",
            path.display()
        );
        assert!(path.as_os_str().len() < 32, "{}", path.display());
        std::fs::write(path.join("file"), b"x").expect("writable");
        drop(dir);
        assert!(!path.exists(), "{} was left behind", path.display());
    }

    #[test]
    fn bin_looks_beside_the_tests_own_directory() {
        // This crate has no binaries, so the lookup fails; its message names where it looked,
        // which must be the directory above the test's own `deps/`. (The CLI's and the
        // controller's tests find their binaries through it.)
        let exe = std::env::current_exe().expect("this test's path");
        let deps = exe.parent().expect("deps/");
        assert_eq!(deps.file_name().and_then(|n| n.to_str()), Some("deps"));
        let result = std::panic::catch_unwind(|| bin("no-such-binary"));
        let message = *result
            .expect_err("there is no such binary")
            .downcast::<String>()
            .expect("a formatted message");
        let expected = deps
            .parent()
            .expect("the profile directory")
            .join("no-such-binary");
        assert!(
            message.contains(&expected.display().to_string()),
            "{message}"
        );
    }
}
