//! GPU device nodes without a driver behind them, and opening or making one from inside a
//! cgroup: what the agent's cgroup device program judges.
#![expect(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "test helpers: a failed set-up step should fail the test where it happened"
)]

use std::{path::Path, process::Command};

use crate::TestCgroup;

/// Makes a character device node `path` with numbers `major:minor` (a GPU node the cgroup
/// device program judges, without a driver behind it).
pub fn mknod(path: &Path, major: u32, minor: u32) {
    use std::os::unix::fs::FileTypeExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a plain syscall with a valid path.
    let rc = unsafe {
        libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(major, minor),
        )
    };
    assert_eq!(
        rc,
        0,
        "mknod {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    assert!(
        std::fs::metadata(path)
            .unwrap()
            .file_type()
            .is_char_device()
    );
}

/// Runs `script` in a shell that first moves itself into `cg`: whether it succeeded, and its
/// standard error.
fn sh_in(cg: &TestCgroup, script: &str) -> (bool, String) {
    let script = format!("echo $$ > {} && {script}", cg.procs().display());
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Opens `path` from a process inside `cg`; returns the errno (0 on success): `EPERM` from the
/// device program, `ENXIO` from a node with no driver behind it.
#[must_use]
pub fn open_in(cg: &TestCgroup, path: &Path) -> i32 {
    match sh_in(cg, &format!("exec 3< {} && echo opened", path.display())) {
        (true, _) => 0,
        (false, e) if e.contains("Operation not permitted") => libc::EPERM,
        (false, e) if e.contains("No such device or address") => libc::ENXIO,
        (false, e) => panic!("open of {} ended otherwise: {e}", path.display()),
    }
}

/// `mknod path c major minor` from inside `cg`: 0, or the errno it failed with.
#[must_use]
pub fn mknod_in(cg: &TestCgroup, path: &Path, major: u32, minor: u32) -> i32 {
    match sh_in(
        cg,
        &format!("exec mknod {} c {major} {minor}", path.display()),
    ) {
        (true, _) => 0,
        (false, e) if e.contains("Operation not permitted") => libc::EPERM,
        (false, e) => panic!("mknod {} ended otherwise: {e}", path.display()),
    }
}
