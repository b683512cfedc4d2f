//! `/proc/self/mountinfo`, read once for everyone who needs to find a file system (the cgroup v2
//! hierarchy above all).

use std::{ffi::OsString, io, os::unix::ffi::OsStringExt as _, path::PathBuf};

/// This process's mount table.
pub const SELF: &str = "/proc/self/mountinfo";

/// The cgroup2 mount to use from a mountinfo table. A runtime may mount cgroup2 elsewhere too (in
/// a container's root file system), so the standard places and whole-hierarchy mounts come first.
#[must_use]
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            if right.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            let mut fields = left.split_whitespace().skip(3);
            let root = fields.next()?;
            let mount_point = unescape_octal(fields.next()?);
            let rank = match mount_point.to_str() {
                Some("/sys/fs/cgroup") => 0,
                Some("/sys/fs/cgroup/unified") => 1,
                _ => 2,
            };
            Some(((root != "/", rank), mount_point))
        })
        .min_by_key(|(key, _)| *key)
        .map(|(_, mount_point)| mount_point)
}

/// Undoes mountinfo's `\ooo` escapes (space, tab, newline, backslash).
#[must_use]
pub fn unescape_octal(field: &str) -> PathBuf {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)))
            .and_then(|d| {
                u8::try_from(d.iter().fold(0_u32, |n, b| n * 8 + u32::from(b - b'0'))).ok()
            });
        if let Some(b) = octal {
            out.push(b);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

/// Where the cgroup v2 hierarchy is mounted, from this process's mount table (`/sys/fs/cgroup`
/// on unified hosts, `/sys/fs/cgroup/unified` on hybrid ones).
///
/// # Errors
/// The table can't be read, or lists no cgroup v2 file system (`NotFound`).
pub fn cgroup2_root() -> io::Result<PathBuf> {
    let text = std::fs::read_to_string(SELF)?;
    cgroup2_mount(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("no cgroup v2 file system is mounted (per {SELF})"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_cgroup2_mount() {
        let hybrid = "35 24 0:30 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        // A runtime's extra mount, listed first, loses to the standard place.
        let unified = "29 23 0:26 / /run/c\\0401/cgroup rw - cgroup2 cgroup2 rw\n\
                       30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(unified),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        // A subtree bind mount loses to a whole-hierarchy one; escapes are undone.
        let elsewhere = "29 23 0:26 /kubepods /mnt/sub rw - cgroup2 cgroup2 rw\n\
                         30 23 0:26 / /run/my\\040cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(elsewhere),
            Some(PathBuf::from("/run/my cgroup"))
        );
        assert_eq!(cgroup2_mount("22 1 0:21 / /proc rw - proc proc rw\n"), None);
        assert_eq!(cgroup2_mount("garbage\n\n"), None);
        assert_eq!(unescape_octal("a\\134b\\08"), PathBuf::from("a\\b\\08"));
    }
}
