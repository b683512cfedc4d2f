//! The suspend tests' peers: the stand-in `libcuda.so.1` built from
//! `tests/fixtures/fake-libcuda/libcuda.c`, and fake CUDA processes (`cuda-process`) it acts on.

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
};

use gpuwarden_agent::checkpoint::helper::Helper;
use gpuwarden_test_support::{TestCgroup, scratch};
use tempfile::TempDir;

/// The stand-in driver library, built with gcc into a scratch directory, which is also where
/// the fake CUDA processes it acts on keep their sockets and host images.
pub struct FakeLibcuda {
    /// The scratch directory holding the library, sockets and images.
    pub dir: TempDir,
}

impl FakeLibcuda {
    /// Builds the library (gcc must be on the path).
    pub fn build() -> Self {
        let dir = scratch("libcuda");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake-libcuda/libcuda.c");
        let status = Command::new("gcc")
            .args(["-Wall", "-Werror", "-shared", "-fPIC", "-o"])
            .arg(dir.path().join("libcuda.so.1"))
            .arg(&source)
            .status()
            .expect("gcc runs");
        assert!(status.success(), "gcc failed on {}", source.display());
        Self { dir }
    }

    /// The library's path.
    pub fn library(&self) -> PathBuf {
        self.dir.path().join("libcuda.so.1")
    }

    /// The agent's helper (its own binary, built in this crate) loading this library.
    pub fn helper(&self) -> Helper {
        Helper {
            program: gpuwarden_test_support::bin("agent-under-test"),
            library: Some(self.library()),
        }
    }

    /// Makes the driver refuse to checkpoint `pid` (as it refuses managed or IPC memory).
    pub fn refuse(&self, pid: u32) {
        std::fs::write(self.dir.path().join(format!("{pid}.refuse")), "").unwrap();
    }

    /// The host image of `pid`'s GPU memory, while it is checkpointed.
    pub fn image(&self, pid: u32) -> PathBuf {
        self.dir.path().join(format!("{pid}.img"))
    }
}

/// A fake CUDA process holding video memory through the fake driver; killed when dropped.
pub struct CudaProcess {
    /// Its pid.
    pub pid: u32,
    /// The checksum of its "device" data when it started.
    pub checksum: String,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl CudaProcess {
    /// Starts one on the driver at `dev`, GPU `gpu`, with one allocation per size in `allocs`
    /// (`64m`…), served by `libcuda`, inside `cgroup` if given.
    pub fn spawn(
        dev: &Path,
        libcuda: &FakeLibcuda,
        gpu: u32,
        allocs: &[&str],
        cgroup: Option<&TestCgroup>,
    ) -> Self {
        let mut cmd = Command::new(gpuwarden_test_support::bin("cuda-process"));
        cmd.arg("--dir")
            .arg(dev)
            .arg("--ckpt-dir")
            .arg(libcuda.dir.path())
            .args(["--gpu", &gpu.to_string()]);
        for a in allocs {
            cmd.args(["--alloc", a]);
        }
        if let Some(cg) = cgroup {
            gpuwarden_runtime::cgroup::spawn_inside(&mut cmd, &cg.dir).unwrap();
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let (pid, checksum) = line
            .trim()
            .strip_prefix("ready pid=")
            .and_then(|rest| rest.split_once(" checksum="))
            .unwrap_or_else(|| panic!("cuda-process did not start: {line:?}"));
        Self {
            pid: pid.parse().unwrap(),
            checksum: checksum.to_owned(),
            child,
            stdin,
            stdout,
        }
    }

    /// The checksum of its data now (a CUDA call: it waits while the process is locked).
    pub fn checksum_now(&mut self) -> String {
        writeln!(self.stdin, "checksum").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim()
            .strip_prefix("ok checksum=")
            .unwrap_or_else(|| panic!("checksum answered {line:?}"))
            .to_owned()
    }

    /// Whether it still runs.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits for it to end; how it ended.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().unwrap()
    }
}

impl Drop for CudaProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
