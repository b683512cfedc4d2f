//! Who may ask the local socket what (docs/architecture.md, "Nobody is trusted by default").
//!
//! The socket file itself is the first gate: root only (mode 0600), or root and one group
//! (`socket_group`, mode 0660). Whoever gets through may read the snapshot and the node's
//! name. Requests that act on something check the caller's credentials, as the kernel took
//! them at `connect` (`SO_PEERCRED`):
//!
//! - `resume` and `kill`: root, or a caller whose uid is the process's real or saved uid — the
//!   rule `kill(2)` itself applies to an unprivileged sender;
//! - `session_cgroup`: root, or the session's own `gpuwarden run`, which the agent knows as the
//!   uid that first asked for that session's cgroup: the first non-root caller claims the
//!   session for its uid, and other non-root uids are refused from then on. The claims live in
//!   memory, so they are lost when the agent restarts.

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::{HashMap, hash_map::Entry},
    sync::Mutex,
};

/// A caller's credentials, as the kernel took them when it connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caller {
    /// Its effective user id.
    pub uid: u32,
    /// Its process id, when the kernel knows it.
    pub pid: Option<i32>,
}

impl Caller {
    /// The credentials of the peer of `stream`.
    pub(crate) fn of(stream: &tokio::net::UnixStream) -> std::io::Result<Self> {
        let cred = stream.peer_cred()?;
        Ok(Self {
            uid: cred.uid(),
            pid: cred.pid(),
        })
    }

    fn is_root(self) -> bool {
        self.uid == 0
    }
}

/// Why a request is refused; the message is the error line the caller reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// The kernel could not say who the caller is.
    #[error("refused: the caller's credentials are unknown (SO_PEERCRED failed)")]
    UnknownCaller,
    /// The process to signal does not exist (or its owner can't be read).
    #[error("refused: no process {pid} whose owner can be read")]
    NoProcess {
        /// The process.
        pid: u32,
    },
    /// The process belongs to another user.
    #[error(
        "refused: process {pid} belongs to uid {owner}, and uid {caller} may signal only its own \
         processes (or be root)"
    )]
    NotOwner {
        /// The process.
        pid: u32,
        /// Its real uid.
        owner: u32,
        /// The caller's uid.
        caller: u32,
    },
    /// The session's cgroup belongs to another user's `gpuwarden run`.
    #[error(
        "refused: session {session:?} is claimed by uid {owner} (its `gpuwarden run`), not by \
         uid {caller}"
    )]
    ClaimedByOther {
        /// The session.
        session: String,
        /// The uid that claimed it.
        owner: u32,
        /// The caller's uid.
        caller: u32,
    },
}

/// The real and saved user ids of process `pid`, from `/proc/<pid>/status`.
fn process_uids(pid: u32) -> Option<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    // Real, effective, saved, file system.
    let ids: Vec<u32> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    match ids[..] {
        [real, _, saved, ..] => Some((real, saved)),
        _ => None,
    }
}

/// Whether `caller` may have the agent signal process `pid`.
///
/// # Errors
/// The caller is neither root nor the process's owner, or the process can't be read.
pub(crate) fn may_signal(caller: Option<Caller>, pid: u32) -> Result<(), Refusal> {
    let caller = caller.ok_or(Refusal::UnknownCaller)?;
    if caller.is_root() {
        return Ok(());
    }
    let (real, saved) = process_uids(pid).ok_or(Refusal::NoProcess { pid })?;
    if caller.uid == real || caller.uid == saved {
        Ok(())
    } else {
        Err(Refusal::NotOwner {
            pid,
            owner: real,
            caller: caller.uid,
        })
    }
}

/// Which uid's `gpuwarden run` each session belongs to.
#[derive(Debug, Default)]
pub(crate) struct Claims(Mutex<HashMap<String, u32>>);

/// What [`Claims::take`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Root: no claim needed, none made.
    Root,
    /// The caller already held the session.
    Held,
    /// The caller claimed it now: undo with [`Claims::forget`] if the session turns out not
    /// to exist.
    New,
}

impl Claims {
    /// Claims `session` for `caller`, or checks that it holds it.
    ///
    /// # Errors
    /// Another uid claimed the session first, or the caller is unknown.
    pub(crate) fn take(&self, caller: Option<Caller>, session: &str) -> Result<Claim, Refusal> {
        let caller = caller.ok_or(Refusal::UnknownCaller)?;
        if caller.is_root() {
            return Ok(Claim::Root);
        }
        let mut claims = self.0.locked();
        match claims.entry(session.to_owned()) {
            Entry::Occupied(held) if *held.get() == caller.uid => Ok(Claim::Held),
            Entry::Occupied(held) => Err(Refusal::ClaimedByOther {
                session: session.to_owned(),
                owner: *held.get(),
                caller: caller.uid,
            }),
            Entry::Vacant(free) => {
                free.insert(caller.uid);
                Ok(Claim::New)
            }
        }
    }

    /// Drops the claim on `session` (it does not exist here).
    pub(crate) fn forget(&self, session: &str) {
        self.0.locked().remove(session);
    }
}

/// The group id of `group`: a number, or a name looked up in the system's group database.
///
/// # Errors
/// No such group.
pub(crate) fn group_id(group: &str) -> Result<u32, String> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let name = std::ffi::CString::new(group).map_err(|_| "a NUL byte in the name".to_owned())?;
    let mut buffer = vec![0u8; 16 * 1024];
    // SAFETY: all-zero bytes are a valid `group` (null pointers, gid 0) for getgrnam_r to fill.
    let mut entry: libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call, and the buffer's length is its own.
    let rc = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &raw mut entry,
            buffer.as_mut_ptr().cast(),
            buffer.len(),
            &raw mut found,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc).to_string());
    }
    if found.is_null() {
        return Err("no such group".to_owned());
    }
    Ok(entry.gr_gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller as the checks take it (`None` would be a failed `SO_PEERCRED`).
    #[expect(clippy::unnecessary_wraps, reason = "the signature the caller expects")]
    fn uid(uid: u32) -> Option<Caller> {
        Some(Caller { uid, pid: None })
    }

    #[test]
    fn root_signals_anything_and_a_user_only_its_own() {
        let me = std::process::id();
        // SAFETY: getuid can't fail.
        let my_uid = unsafe { libc::getuid() };
        assert_eq!(may_signal(uid(0), me), Ok(()));
        assert_eq!(may_signal(uid(my_uid), me), Ok(()));
        let other = my_uid.wrapping_add(4242);
        assert_eq!(
            may_signal(uid(other), me),
            Err(Refusal::NotOwner {
                pid: me,
                owner: my_uid,
                caller: other
            })
        );
        // Pid 2^31 - 1 is never a process here.
        assert_eq!(
            may_signal(uid(other), 2_147_483_647),
            Err(Refusal::NoProcess { pid: 2_147_483_647 })
        );
        assert_eq!(may_signal(None, me), Err(Refusal::UnknownCaller));
    }

    #[test]
    fn the_first_non_root_caller_claims_a_session() {
        let claims = Claims::default();
        assert_eq!(claims.take(uid(0), "s-1"), Ok(Claim::Root));
        assert_eq!(claims.take(uid(1000), "s-1"), Ok(Claim::New));
        assert_eq!(claims.take(uid(1000), "s-1"), Ok(Claim::Held));
        let refused = claims.take(uid(1001), "s-1").unwrap_err();
        assert!(refused.to_string().contains("uid 1000"), "{refused}");
        assert_eq!(claims.take(uid(0), "s-1"), Ok(Claim::Root));
        claims.forget("s-1");
        assert_eq!(claims.take(uid(1001), "s-1"), Ok(Claim::New));
    }

    #[test]
    fn groups_by_number_or_name() {
        assert_eq!(group_id("4242"), Ok(4242));
        assert_eq!(group_id("root"), Ok(0));
        assert!(group_id("no-such-group-gpuwarden").is_err());
    }
}
