//! A fake NVIDIA driver: a FUSE file system whose files answer the driver's ioctls.
//!
//! [`FakeDriver::mount`] serves, in a directory of the test's choosing, `nvidia0` …
//! `nvidia<N-1>`, `nvidiactl` and `nvidia-uvm` as regular files (open them `O_RDWR`). Their
//! ioctls are answered with the real encodings and parameter layouts of
//! [`crate::abi::nvidia`] (the test side's own table, checked against NVIDIA's headers, not the
//! product's):
//!
//! - `RM_ALLOC` (NVOS21 and NVOS64) of clients (`NV01_ROOT*`, handles
//!   `0xc1d00001`, `0xc1d00002`, … unique across the driver), devices (`deviceId` checked against
//!   the GPU count), subdevices, video memory (`NV01_MEMORY_LOCAL_USER` with 120- or 128-byte
//!   `NV_MEMORY_ALLOCATION_PARAMS`), virtual ranges (charged nothing) and system memory
//!   (`NV01_MEMORY_SYSTEM`, the size asked, in [`FakeDriver::sysmem`]). Object
//!   handles the driver picks are `0xcaf00001`, `0xcaf00002`, …; a handle the caller asks for is
//!   used if free.
//! - Video memory is rounded up to [`VIDMEM_PAGE`] (2 MiB, the real driver's large-page
//!   granularity) and the rounded size is written back into the caller's `size` field before the
//!   ioctl returns; past the GPU's capacity the allocation fails with `NV_ERR_NO_MEMORY` and
//!   charges nothing.
//! - `RM_ALLOC_MEMORY` (`nvos02_with_fd`) of system memory, pinned user memory (OS descriptors)
//!   and framebuffer views, and `RM_VID_HEAP_CONTROL` (`NVOS32`) `ALLOC_SIZE` and `FREE`, with the
//!   driver's flag checks.
//! - `RM_FREE` frees an object with everything under it, or a whole client.
//! - `RM_CONTROL` succeeds for any command on a valid object;
//!   `NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS` lists the GPUs.
//! - `IOCTL_XFER_CMD` is unwrapped; `CARD_INFO`, `CHECK_VERSION_STR`, `REGISTER_FD`,
//!   `ATTACH_GPUS_TO_FD` and escapes the fake doesn't model succeed.
//! - Every UVM command the agent names succeeds, with `rmStatus` set where its offset is stable.
//! - Closing the last reference to an open file (every dup closed, every process that inherited
//!   it gone) frees the clients allocated through it, as the real driver does when a process
//!   exits. FUSE reports that close asynchronously: wait with [`FakeDriver::wait_for_ledger`].
//!
//! As with the real driver, an RM error is a non-zero `status` in the params with the ioctl
//! returning 0; only malformed ioctls (a size that doesn't match the escape) fail with `EINVAL`,
//! and pointers that can't be read with `EFAULT`.
//!
//! How the data gets there: FUSE copies an `_IOC`-encoded ioctl's struct in and out; what the
//! struct points to is read and written in the caller with `process_vm_readv`/`writev`, and UVM's
//! argument pointer is found in `/proc/<tid>/syscall`. So mounting and serving need root.
//!
//! # Example
//!
//! ```no_run
//! use gpuwarden_tests::fake_driver::{FakeConfig, FakeDriver};
//!
//! let driver = FakeDriver::mount("/tmp/fake-dev".as_ref(), &FakeConfig::default())?;
//! // ... run a GPU client against driver.path("nvidiactl") ...
//! assert_eq!(driver.ledger(), vec![0, 0]);
//! # Ok::<(), gpuwarden_tests::fake_driver::FakeDriverError>(())
//! ```

mod caller;
mod fs;
mod rm;
mod uvm;

use std::{
    collections::BTreeMap,
    ffi::CString,
    fmt::Write as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use fuser::MountOption;

pub use self::rm::{CLIENT_HANDLE_BASE, OBJECT_HANDLE_BASE, VIDMEM_PAGE, gpu_id};
use self::{
    fs::{FakeFs, Shared, file_names, lock},
    rm::Rm,
};

/// The most GPUs a fake driver serves (`NV0000_CTRL_GPU_MAX_ATTACHED_GPUS`).
pub const MAX_GPUS: usize = 32;

/// What went wrong setting up a fake driver.
#[derive(Debug, thiserror::Error)]
pub enum FakeDriverError {
    /// The configuration names no GPU, or too many.
    #[error("a fake driver serves 1 to {MAX_GPUS} GPUs, not {count}")]
    GpuCount {
        /// The number asked for.
        count: usize,
    },
    /// The mount point can't be created.
    #[error("cannot create the mount point {}: {source}", path.display())]
    MountPoint {
        /// The mount point.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Mounting failed: it needs root (or `fusermount3`) and `/dev/fuse`.
    #[error("cannot mount the fake NVIDIA driver at {}: {source}", path.display())]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The ledger didn't reach the expected numbers in time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GPU memory in use is {seen:?} bytes per GPU, expected {expected:?} (waited {waited:?})")]
pub struct LedgerTimeout {
    /// Bytes per GPU when the wait ended.
    pub seen: Vec<u64>,
    /// Bytes per GPU waited for.
    pub expected: Vec<u64>,
    /// How long it waited.
    pub waited: Duration,
}

/// Settings of a fake driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeConfig {
    /// Video memory of each GPU, in bytes; its length is the number of GPUs.
    pub gpu_memory: Vec<u64>,
    /// MIG GPU instances: a GPU with any is in MIG mode.
    pub mig: Vec<FakeInstance>,
}

impl FakeConfig {
    /// `gpus` GPUs of `bytes` each.
    #[must_use]
    pub fn uniform(gpus: usize, bytes: u64) -> Self {
        Self {
            gpu_memory: vec![bytes; gpus],
            mig: Vec::new(),
        }
    }
}

/// A MIG GPU instance of a fake GPU (docs/mig.md).
///
/// On a GPU in MIG mode a client allocates video memory only once subscribed to a GPU instance
/// (`AMPERE_SMC_PARTITION_REF` under its subdevice, with the instance's `swizzId` and, as
/// `capDescriptor`, an fd of a file named `nvidia-cap<minor>` for the instance's minor in
/// [`FakeDriver::mig_minors`]); its memory is then charged to the instance, up to the
/// instance's size (the fake's codes: `NV_ERR_INSUFFICIENT_PERMISSIONS` without a subscription
/// or with the wrong capability, `NV_ERR_NO_MEMORY` past the instance).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeInstance {
    /// The GPU (`nvidia<gpu>`).
    pub gpu: usize,
    /// The GPU instance id (`swizzId`).
    pub gpu_instance: u32,
    /// Its compute instance ids (`execPartitionId`s an `AMPERE_SMC_EXEC_PARTITION_REF` names).
    pub compute_instances: Vec<u32>,
    /// Its video memory, bytes.
    pub memory: u64,
}

/// The capability minor of a GPU instance's `access` node, as the fake numbers them: 15 GPU
/// instances per GPU and 9 minors per GPU instance (its own, then 8 compute instances'), after
/// `config` (1) and `monitor` (2).
#[must_use]
pub fn gi_cap_minor(i: &FakeInstance) -> u32 {
    let gpu = u32::try_from(i.gpu).unwrap_or(u32::MAX);
    3u32.saturating_add(
        gpu.saturating_mul(15)
            .saturating_add(i.gpu_instance)
            .saturating_mul(9),
    )
}

/// The capability minor of compute instance `ci` of GPU instance `i` (see [`gi_cap_minor`]).
#[must_use]
pub fn ci_cap_minor(i: &FakeInstance, ci: u32) -> u32 {
    gi_cap_minor(i).saturating_add(1).saturating_add(ci)
}

impl Default for FakeConfig {
    /// Two GPUs of 1 GiB.
    fn default() -> Self {
        Self::uniform(2, 1 << 30)
    }
}

/// A mounted fake driver, unmounted when dropped.
pub struct FakeDriver {
    dir: PathBuf,
    gpus: usize,
    mig: Vec<FakeInstance>,
    shared: Arc<Mutex<Shared>>,
    session: Option<fuser::BackgroundSession>,
}

impl std::fmt::Debug for FakeDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeDriver")
            .field("dir", &self.dir)
            .field("gpus", &self.gpus)
            .finish_non_exhaustive()
    }
}

impl FakeDriver {
    /// Mounts a driver at `dir` (created if missing) and serves it from a background thread.
    ///
    /// # Errors
    /// A bad GPU count, or the mount failed (not root, no `/dev/fuse`).
    pub fn mount(dir: &Path, config: &FakeConfig) -> Result<Self, FakeDriverError> {
        let gpus = config.gpu_memory.len();
        if !(1..=MAX_GPUS).contains(&gpus) {
            return Err(FakeDriverError::GpuCount { count: gpus });
        }
        std::fs::create_dir_all(dir).map_err(|source| FakeDriverError::MountPoint {
            path: dir.to_owned(),
            source,
        })?;
        let shared = Arc::new(Mutex::new(Shared::new(
            Rm::new(&config.gpu_memory).with_instances(&config.mig),
        )));
        let fs = FakeFs {
            shared: Arc::clone(&shared),
            gpus,
        };
        let options = [
            MountOption::FSName("nvidia-fake".to_owned()),
            // Clients may run as other users (a test dropping privileges).
            MountOption::AllowOther,
            MountOption::DefaultPermissions,
        ];
        let session =
            fuser::spawn_mount2(fs, dir, &options).map_err(|source| FakeDriverError::Mount {
                path: dir.to_owned(),
                source,
            })?;
        Ok(Self {
            dir: dir.to_owned(),
            gpus,
            mig: config.mig.clone(),
            shared,
            session: Some(session),
        })
    }

    /// The mount point.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The number of GPUs.
    #[must_use]
    pub fn gpus(&self) -> usize {
        self.gpus
    }

    /// The path of one of the driver's files (`"nvidiactl"`, `"nvidia-uvm"`, `"nvidia0"`, …).
    #[must_use]
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Every file the driver serves: `nvidia0` … `nvidia<N-1>`, `nvidiactl`, `nvidia-uvm`.
    #[must_use]
    pub fn paths(&self) -> Vec<PathBuf> {
        file_names(self.gpus)
            .into_iter()
            .map(|n| self.dir.join(n))
            .collect()
    }

    /// Video memory held right now, in bytes per GPU.
    #[must_use]
    pub fn ledger(&self) -> Vec<u64> {
        lock(&self.shared).rm.used()
    }

    /// Video memory held right now by each MIG GPU instance, by (GPU, GPU instance id): the
    /// driver's own account of what it charged to each.
    #[must_use]
    pub fn instance_ledger(&self) -> BTreeMap<(usize, u32), u64> {
        lock(&self.shared).rm.instance_used()
    }

    /// The text of `/proc/driver/nvidia-caps/mig-minors` for this driver's instances.
    #[must_use]
    pub fn mig_minors(&self) -> String {
        let mut text = String::from("config 1\nmonitor 2\n");
        for i in &self.mig {
            let (gpu, gi) = (i.gpu, i.gpu_instance);
            let _ = writeln!(text, "gpu{gpu}/gi{gi}/access {}", gi_cap_minor(i));
            for &ci in &i.compute_instances {
                let _ = writeln!(
                    text,
                    "gpu{gpu}/gi{gi}/ci{ci}/access {}",
                    ci_cap_minor(i, ci)
                );
            }
        }
        text
    }

    /// Host memory held right now for the GPUs (system memory objects and user memory pinned
    /// for them), in bytes.
    #[must_use]
    pub fn sysmem(&self) -> u64 {
        lock(&self.shared).rm.sysmem()
    }

    /// Video memory held right now by each live client, in bytes per GPU.
    #[must_use]
    pub fn client_ledger(&self) -> BTreeMap<u32, Vec<u64>> {
        lock(&self.shared).rm.used_by_client()
    }

    /// Live clients.
    #[must_use]
    pub fn clients(&self) -> usize {
        lock(&self.shared).rm.clients()
    }

    /// ioctls answered (successfully or not), by file name and escape name (`esc::name`, or
    /// `uvm::name` on `nvidia-uvm`; an `IOCTL_XFER_CMD` counts as the escape it carries;
    /// `"unknown"` for numbers without a name).
    #[must_use]
    pub fn calls(&self) -> BTreeMap<(String, &'static str), u64> {
        lock(&self.shared).calls.clone()
    }

    /// ioctls named `name` answered on file `file`.
    #[must_use]
    pub fn calls_to(&self, file: &str, name: &str) -> u64 {
        lock(&self.shared)
            .calls
            .iter()
            .filter(|((f, n), _)| f == file && *n == name)
            .map(|(_, &count)| count)
            .sum()
    }

    /// Waits until [`ledger`](Self::ledger) equals `expected`: files closed by an exiting process
    /// are released asynchronously.
    ///
    /// # Errors
    /// It didn't within `timeout`; the error says what it was.
    pub fn wait_for_ledger(
        &self,
        expected: &[u64],
        timeout: Duration,
    ) -> Result<(), LedgerTimeout> {
        let start = Instant::now();
        loop {
            let seen = self.ledger();
            if seen == expected {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                return Err(LedgerTimeout {
                    seen,
                    expected: expected.to_vec(),
                    waited: start.elapsed(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until `done(self)` holds, polling every 10 ms; returns whether it did within
    /// `timeout`.
    pub fn wait_until(&self, timeout: Duration, mut done: impl FnMut(&Self) -> bool) -> bool {
        let start = Instant::now();
        loop {
            if done(self) {
                return true;
            }
            if start.elapsed() >= timeout {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Unmounts now (dropping does the same).
    pub fn unmount(mut self) {
        self.detach();
    }

    fn detach(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        // Lazily: a client still holding a file keeps being served until it closes it, and the
        // directory is free for the next test at once.
        if let Ok(path) = CString::new(self.dir.as_os_str().as_encoded_bytes()) {
            // SAFETY: a valid C string; the result is ignored because fuser unmounts as well.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
        drop(session);
    }
}

impl Drop for FakeDriver {
    fn drop(&mut self) {
        self.detach();
    }
}
