//! The local controls: signals to a bound workload's processes, holding a stopped workload, and
//! finding a session's cgroup for `gpuwarden run`.

use std::path::PathBuf;

use super::{BindState, Enforcer, events::Happened};
use crate::enforcement::{kernel::Pinned, quota::Target};

/// Errors of the local controls.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ControlError {
    /// The pid is in no bound workload.
    #[error("process {0} is not in a workload with a quota on this node")]
    NotBound(u32),
    /// The signal could not be sent.
    #[error("cannot signal process {pid}: {source}")]
    Signal {
        /// The process.
        pid: u32,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// No such session.
    #[error("no quota for session {0:?} on this node")]
    NoSession(String),
}

impl Enforcer {
    /// Sends `signal` (SIGCONT or SIGKILL) to a process of a bound workload, by request,
    /// through the pidfd that pinned it before its owner was checked.
    ///
    /// # Errors
    /// The process is in no bound workload, or can't be signalled (it ended meanwhile).
    pub(crate) fn signal(
        &mut self,
        process: &Pinned,
        resume: bool,
    ) -> Result<String, ControlError> {
        let pid = process.pid();
        let cgroup = self
            .tree
            .cgroup_id_of_pid(pid)
            .ok_or(ControlError::NotBound(pid))?;
        let (session, rel) = self
            .session_of_cgroup(cgroup)
            .ok_or(ControlError::NotBound(pid))?;
        let signal = if resume { libc::SIGCONT } else { libc::SIGKILL };
        let last_stopped = self
            .bindings
            .get(&session)
            .is_some_and(|b| b.held && b.stopped.len() == 1 && b.stopped.contains(&pid));
        if resume && last_stopped {
            // Thawed before the signal, so the process runs as soon as it is continued.
            self.hold_stopped(&session, false);
        }
        self.kernel
            .signals
            .send_pinned(process, signal)
            .map_err(|source| ControlError::Signal { pid, source })?;
        if let Some(b) = self.bindings.get_mut(&session) {
            b.stopped.remove(&pid);
            if last_stopped {
                b.held = false;
            }
        }
        if !resume && last_stopped {
            self.hold_stopped(&session, false);
        }
        let (name, what) = if resume {
            ("resume", "resumed (SIGCONT) by request")
        } else {
            ("kill", "killed (SIGKILL) by request")
        };
        self.record(Happened::to(&session, name).at(rel).by(pid).because(what));
        Ok(session)
    }

    /// Holds the bound cgroup of `session` frozen (or lets go): a process stopped by its memory
    /// policy then stays stopped even if something in its container sends it `SIGCONT`; only a
    /// resume through the agent lets it run (docs/threat-model.md).
    pub(super) fn hold_stopped(&self, session: &str, held: bool) {
        let Some(b) = self.bindings.get(session) else {
            return;
        };
        let (Some(key), Some(dir), Some(throttle)) = (b.key, b.dir.clone(), &self.throttle) else {
            tracing::warn!(
                session,
                "stop not held by freezing: no bound cgroup or no throttle"
            );
            return;
        };
        if let Err(e) = throttle.hold(key, dir, held) {
            tracing::warn!(session, "stop not held by freezing: {e}");
        }
    }

    /// The cgroup directory of `session`'s binding, and whether it is bound.
    ///
    /// # Errors
    /// The session has no quota here.
    pub(crate) fn session_cgroup(&self, session: &str) -> Result<(PathBuf, bool), ControlError> {
        let b = self
            .bindings
            .get(session)
            .ok_or_else(|| ControlError::NoSession(session.to_owned()))?;
        let dir = b.dir.clone().unwrap_or_else(|| match &b.spec.target {
            Target::Managed => self.tree.managed_dir(session),
            Target::CgroupPath(p) => self.tree.root().join(p.trim_start_matches('/')),
            _ => PathBuf::new(),
        });
        Ok((dir, b.state == BindState::Bound))
    }
}
