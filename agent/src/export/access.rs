//! Who may ask the local socket what (docs/architecture.md, "Nobody is trusted by default").
//!
//! The socket file itself is the first gate: root only (mode 0600), or root and one group
//! (`socket_group`, mode 0660). Whoever gets through may read the snapshot and the node's
//! name. Requests that act on something check the caller's credentials, as the kernel took
//! them at `connect` (`SO_PEERCRED`):
//!
//! - `resume` and `kill`: root, or a caller whose uid is the process's real or saved uid — the
//!   rule `kill(2)` itself applies to an unprivileged sender. The process is pinned by a pidfd
//!   before its owner is read, and signalled through it, so the process checked is the process
//!   signalled (never one that took its number meanwhile);
//! - `session_cgroup`: root, or the session's own `gpuwarden run`, which the agent knows as the
//!   uid that first asked for that session's cgroup: the first non-root caller claims the
//!   session for its uid, and other non-root uids are refused from then on. The claims live in
//!   memory, so they are lost when the agent restarts.

use crate::enforcement::kernel::Pinned;
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
    /// The session was created by another user's `gpuwarden run`.
    #[error(
        "refused: session {session:?} belongs to another user's `gpuwarden run`, not to uid \
         {caller}"
    )]
    NotRunCaller {
        /// The session.
        session: String,
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

/// Process `pid`, pinned, if `caller` may have the agent signal it: the pidfd is opened first,
/// the owner read from `/proc/<pid>` next, and the pinned process found still there last, so
/// the owner read is the pinned process's.
///
/// # Errors
/// The caller is neither root nor the process's owner, or the process can't be read.
pub(crate) fn may_signal(caller: Option<Caller>, pid: u32) -> Result<Pinned, Refusal> {
    let caller = caller.ok_or(Refusal::UnknownCaller)?;
    let process = Pinned::open(pid).map_err(|_| Refusal::NoProcess { pid })?;
    if !caller.is_root() {
        let (real, saved) = process_uids(pid).ok_or(Refusal::NoProcess { pid })?;
        if caller.uid != real && caller.uid != saved {
            return Err(Refusal::NotOwner {
                pid,
                owner: real,
                caller: caller.uid,
            });
        }
    }
    // Still there: the number named the pinned process while its owner was read.
    process.signal(0).map_err(|_| Refusal::NoProcess { pid })?;
    Ok(process)
}

/// Whether `caller` may have the cgroup of `session`, whose allocation names `run_uid` as the
/// uid of the `gpuwarden run` that created it: root, or that uid (issue 33: another user of the
/// socket could claim it first).
///
/// # Errors
/// Another uid, or the caller is unknown.
pub(crate) fn is_run_caller(
    caller: Option<Caller>,
    session: &str,
    run_uid: Option<u32>,
) -> Result<(), Refusal> {
    let caller = caller.ok_or(Refusal::UnknownCaller)?;
    match run_uid {
        _ if caller.is_root() => Ok(()),
        Some(uid) if uid == caller.uid => Ok(()),
        _ => Err(Refusal::NotRunCaller {
            session: session.to_owned(),
            caller: caller.uid,
        }),
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
        assert_eq!(may_signal(uid(0), me).map(|p| p.pid()), Ok(me));
        assert_eq!(may_signal(uid(my_uid), me).map(|p| p.pid()), Ok(me));
        let other = my_uid.wrapping_add(4242);
        assert_eq!(
            may_signal(uid(other), me).map(|p| p.pid()),
            Err(Refusal::NotOwner {
                pid: me,
                owner: my_uid,
                caller: other
            })
        );
        // Pid 2^31 - 1 is never a process here.
        assert_eq!(
            may_signal(uid(other), 2_147_483_647).map(|p| p.pid()),
            Err(Refusal::NoProcess { pid: 2_147_483_647 })
        );
        assert_eq!(
            may_signal(None, me).map(|p| p.pid()),
            Err(Refusal::UnknownCaller)
        );
    }

    /// Issue 33, attack 9: `kill`/`resume` checked a pid's owner and then signalled the number,
    /// which by then could name another process (pid reuse). The process is now pinned by a
    /// pidfd before the check and signalled through it: once it has ended, a signal reaches
    /// nobody, though another process holds its number. (On main the signal after the check
    /// was `kill(pid)`, which would have killed that other process.)
    #[test]
    #[ignore = "needs root"]
    fn a_signal_reaches_the_checked_process_or_none() {
        use std::process::{Child, Command};

        gpuwarden_test_support::require_root();
        let sleeper = || Command::new("sleep").arg("60").spawn().unwrap();
        let mut checked = sleeper();
        let pid = checked.id();
        let pinned = may_signal(uid(0), pid).unwrap();
        checked.kill().unwrap();
        checked.wait().unwrap();
        // Another process takes the number: the next fork gets ns_last_pid + 1 (retried, as
        // other processes on the machine fork too).
        let mut taker: Option<Child> = None;
        for _ in 0..200 {
            std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).unwrap();
            let mut child = sleeper();
            if child.id() == pid {
                taker = Some(child);
                break;
            }
            child.kill().unwrap();
            child.wait().unwrap();
        }
        let mut taker = taker.expect("no process took the number in 200 tries");
        let err = pinned.signal(libc::SIGKILL).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ESRCH), "{err}");
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            taker.try_wait().unwrap().is_none(),
            "the process that took the number was signalled"
        );
        taker.kill().unwrap();
        taker.wait().unwrap();
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
