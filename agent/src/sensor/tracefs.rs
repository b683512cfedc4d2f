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
mod tests {
    use super::*;

    const FORK_6_18: &str = "name: sched_process_fork
ID: 366
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t parent_pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] child_comm;\toffset:16;\tsize:4;\tsigned:0;
\tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;
";

    const EXIT_5_15: &str = "\tfield:char comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:int prio;\toffset:28;\tsize:4;\tsigned:1;
";

    #[test]
    fn reads_offsets_from_format_files() {
        assert_eq!(field_offset(FORK_6_18, "parent_pid"), Some(12));
        assert_eq!(field_offset(FORK_6_18, "child_pid"), Some(20));
        assert_eq!(field_offset(FORK_6_18, "parent_comm"), Some(8));
        assert_eq!(field_offset(EXIT_5_15, "comm"), Some(8));
        assert_eq!(field_offset(EXIT_5_15, "pid"), Some(24));
        assert_eq!(field_offset(EXIT_5_15, "group_dead"), None);
    }

    #[test]
    fn missing_group_dead_is_marked_absent() {
        let scratch = gpuwarden_test_support::scratch("tracefs");
        let dir = scratch.path();
        let exit = dir.join("events/sched/sched_process_exit");
        std::fs::create_dir_all(&exit).unwrap();
        std::fs::write(exit.join("format"), EXIT_5_15).unwrap();
        let config = config_offsets(dir);
        assert_eq!(config.exit_group_dead, FIELD_ABSENT);
        assert_eq!(config.exit_pid, 24);
        // No fork format: the defaults stay.
        assert_eq!(config.fork_child_pid, Config::DEFAULT.fork_child_pid);
    }
}
