//! tracefs: where tracepoints are listed, and their record layouts.

use std::{
    ffi::CString,
    path::{Path, PathBuf},
};

use gpuwarden_agent_common::config::{Config, FIELD_ABSENT};

/// Errors finding or mounting tracefs.
#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    /// Not mounted, and mounting failed.
    #[error("tracefs is not mounted and mounting it at {path} failed: {source}")]
    Mount {
        /// Where it was mounted.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// Finds tracefs, mounting it at `/sys/kernel/tracing` when neither it nor debugfs's copy is
/// there (aya finds tracepoint ids through it).
///
/// # Errors
/// Mounting failed.
pub fn ensure_mounted() -> Result<PathBuf, TracefsError> {
    for dir in [TRACEFS, DEBUGFS_TRACING] {
        if Path::new(dir).join("events").is_dir() {
            return Ok(PathBuf::from(dir));
        }
    }
    let path = PathBuf::from(TRACEFS);
    let c = |s: &str| CString::new(s).unwrap_or_default();
    let (source, target, fstype) = (c("tracefs"), c(TRACEFS), c("tracefs"));
    // SAFETY: valid C strings; no data argument.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(TracefsError::Mount {
            path,
            source: std::io::Error::last_os_error(),
        });
    }
    tracing::info!("mounted tracefs at {TRACEFS}");
    Ok(path)
}

/// The tracepoint field offsets of this kernel, falling back to the defaults field by field.
#[must_use]
pub fn config_offsets(tracefs: &Path) -> Config {
    let mut config = Config::DEFAULT;
    let format = |event: &str| {
        std::fs::read_to_string(tracefs.join("events/sched").join(event).join("format"))
            .unwrap_or_default()
    };
    let fork = format("sched_process_fork");
    if let Some(off) = field_offset(&fork, "parent_pid") {
        config.fork_parent_pid = off;
    }
    if let Some(off) = field_offset(&fork, "child_pid") {
        config.fork_child_pid = off;
    }
    let exit = format("sched_process_exit");
    if let Some(off) = field_offset(&exit, "pid") {
        config.exit_pid = off;
    }
    config.exit_group_dead = if exit.is_empty() {
        config.exit_group_dead
    } else {
        field_offset(&exit, "group_dead").unwrap_or(FIELD_ABSENT)
    };
    config
}

/// The offset of `field` in a tracepoint `format` file.
#[must_use]
pub fn field_offset(format: &str, field: &str) -> Option<u32> {
    format.lines().find_map(|line| {
        let line = line.trim();
        let decl = line.strip_prefix("field:")?.split(';').next()?;
        let name = decl.split_whitespace().last()?;
        let name = name.split('[').next()?;
        if name != field {
            return None;
        }
        let offset = line
            .split(';')
            .find_map(|p| p.trim().strip_prefix("offset:"))?;
        offset.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests;
