//! `cargo xtask setup`: installs what a fresh Debian machine lacks, and nothing when all is there.
//!
//! - the eBPF toolchain: Debian's `rustc-web` with the prebuilt `core`
//!   for `bpfel-unknown-none`, LLVM 22, and `bpf-linker` built against it; a rustup nightly with
//!   `rust-src` is used instead when present;
//! - FUSE 3 for the fake NVIDIA driver the tests mount, and etcd for the store's tests;
//! - Prometheus and `promtool`, which scrape the binaries and unit-test the alert rules
//!   (`tests/tests/observability_prometheus.rs`);
//! - runc and containerd, which run real containers in `tests/tests/runtime_container.rs`;
//! - `protoc` with the well-known types, for the `etcd-client` crate's build script;
//! - a Python environment (`target/py`) with `kubernetes-validate`, which checks the Kubernetes
//!   manifests offline against the bundled OpenAPI schemas (`deploy/kubernetes/validate.py`);
//! - `buf` from npm (`target/buf`), which lints the protos and checks them against `main`'s;
//! - a Python environment (`target/py-api`) with grpcio, grpcio-tools and grpcio-status: the
//!   independent client `controller/tests/api_python_client.rs` holds the API to its contract
//!   with.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};
use gpuwarden_ebpf_toolchain::{Missing, Toolchain, find_linker};

use crate::status;

/// Debian packages for Debian's eBPF-capable rustc and for building bpf-linker.
const TOOLCHAIN_PACKAGES: &[&str] = &[
    "rustc-web",
    "libstd-rust-web-dev-bpf",
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
];

/// Debian packages the tests need at run time: FUSE for the fake driver, etcd for the store.
const TEST_PACKAGES: &[&str] = &["fuse3", "etcd-server"];

/// Debian packages the observability test runs: a real Prometheus scraping the binaries, and
/// `promtool` for the alert rules' unit tests (both in `prometheus`).
const PROMETHEUS_PACKAGES: &[&str] = &["prometheus"];

/// Debian packages of the container runtimes the runtime tests drive (containerd brings its
/// `containerd-shim-runc-v2` and `ctr`).
const RUNTIME_PACKAGES: &[&str] = &["runc", "containerd"];

/// Debian packages the `etcd-client` crate's build script needs: `protoc` and the well-known
/// types it imports (gpuwarden's own protos compile with protox and need neither).
const PROTOC_PACKAGES: &[&str] = &["protobuf-compiler", "libprotobuf-dev"];

/// Debian packages that install `buf` from the npm registry (issue 40).
const NPM_PACKAGES: &[&str] = &["npm"];

/// Debian packages for the manifest validator's virtual environment.
const PYTHON_PACKAGES: &[&str] = &["python3", "python3-venv"];

/// What the manifest validator imports, pinned (kubernetes-validate bundles the schemas).
const VALIDATOR_REQUIREMENTS: &[&str] = &["kubernetes-validate==1.37.0", "pyyaml==6.0.3"];

/// Exits 0 when the validator's environment has the pinned packages.
const VALIDATOR_CHECK: &str = "import importlib.metadata as m, sys; \
    sys.exit(m.version('kubernetes-validate') != '1.37.0' or m.version('pyyaml') != '6.0.3')";

/// What the independent API client imports, pinned (grpcio-status brings the googleapis
/// `google.rpc` messages; grpcio-tools generates the stubs at test time).
const API_CLIENT_REQUIREMENTS: &[&str] = &[
    "grpcio==1.85.1",
    "grpcio-tools==1.85.1",
    "grpcio-status==1.85.1",
];

/// Exits 0 when the API client's environment has the pinned packages.
const API_CLIENT_CHECK: &str = "import importlib.metadata as m, sys; \
    sys.exit(any(m.version(p) != '1.85.1' for p in ('grpcio', 'grpcio-tools', 'grpcio-status')))";

/// Installs what is missing.
pub fn run() -> anyhow::Result<()> {
    let mut packages: Vec<&str> = Vec::new();
    let missing = match Toolchain::detect() {
        Ok(toolchain) => {
            println!("setup: eBPF toolchain ready: {toolchain}");
            None
        }
        Err(missing) => Some(missing),
    };
    if let Some(Missing { core, linker }) = missing
        && (core || (linker && !Path::new("/usr/lib/llvm-22/bin/llvm-config").exists()))
    {
        packages.extend(TOOLCHAIN_PACKAGES);
    }
    let fuse = Path::new("/usr/bin/fusermount3").exists() || Path::new("/bin/fusermount3").exists();
    if !fuse || !on_path("etcd") {
        packages.extend(TEST_PACKAGES);
    }
    if !on_path("prometheus") || !on_path("promtool") {
        packages.extend(PROMETHEUS_PACKAGES);
    }
    if !["runc", "containerd", "ctr", "containerd-shim-runc-v2"]
        .iter()
        .all(|p| on_path(p))
    {
        packages.extend(RUNTIME_PACKAGES);
    }
    if !on_path("protoc") || !Path::new("/usr/include/google/protobuf/descriptor.proto").exists() {
        packages.extend(PROTOC_PACKAGES);
    }
    if !on_path("npm") {
        packages.extend(NPM_PACKAGES);
    }
    let validator_ready = succeeds(Command::new(validator_python()).args(["-c", VALIDATOR_CHECK]));
    if !validator_ready && !succeeds(Command::new("python3").args(["-c", "import ensurepip, venv"]))
    {
        packages.extend(PYTHON_PACKAGES);
    }
    if !packages.is_empty() {
        apt_install(&packages)?;
    }
    install_api_client()?;
    if validator_ready {
        println!(
            "setup: manifest validator ready ({})",
            validator_env().display()
        );
    } else {
        install_validator()?;
    }
    crate::buf::install()?;
    if find_linker().is_none() {
        println!("setup: building bpf-linker against LLVM 22 (about a minute)");
        status(
            Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
                .args([
                    "install",
                    "bpf-linker",
                    "--locked",
                    "--no-default-features",
                    "--features",
                    "llvm-22",
                ])
                .env("LLVM_PREFIX", "/usr/lib/llvm-22"),
        )?;
    }
    let toolchain = Toolchain::detect().context("after installing")?;
    println!("setup: done ({toolchain})");
    Ok(())
}

/// The Python environment of the manifest validator (`target/py` unless `CARGO_TARGET_DIR` moves
/// the target directory).
fn validator_env() -> PathBuf {
    crate::target_dir().join("py")
}

/// The Python that runs `deploy/kubernetes/validate.py`.
pub fn validator_python() -> PathBuf {
    validator_env().join("bin").join("python")
}

/// Makes `target/py` afresh and installs the pinned validator packages into it (from PyPI).
fn install_validator() -> anyhow::Result<()> {
    let env = validator_env();
    println!(
        "setup: installing kubernetes-validate into {}",
        env.display()
    );
    status(
        Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&env),
    )?;
    status(
        Command::new(env.join("bin").join("pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(VALIDATOR_REQUIREMENTS),
    )
}

/// Makes `target/py-api` with the pinned API client packages, unless it has them.
fn install_api_client() -> anyhow::Result<()> {
    let env = crate::target_dir().join("py-api");
    let python = env.join("bin").join("python");
    if succeeds(Command::new(&python).args(["-c", API_CLIENT_CHECK])) {
        println!("setup: API client packages ready ({})", env.display());
        return Ok(());
    }
    println!("setup: installing grpcio into {}", env.display());
    status(
        Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&env),
    )?;
    status(
        Command::new(env.join("bin").join("pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(API_CLIENT_REQUIREMENTS),
    )
}

/// Whether `cmd` runs and exits 0 (its output discarded).
fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn apt_install(packages: &[&str]) -> anyhow::Result<()> {
    if !crate::is_root() {
        bail!(
            "missing Debian packages: {}; run `cargo xtask setup` as root or `apt-get install -y {}`",
            packages.join(" "),
            packages.join(" ")
        );
    }
    println!("setup: apt-get install {}", packages.join(" "));
    status(
        Command::new("apt-get")
            .args(["update", "-q"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    status(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// Whether `program` is on `PATH`.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
}
