//! Preemption: a workload signalled and killed at its deadline, or suspended to host memory
//! and resumed (issue 38), with the jobs the enforcer's task runs off the enforcer.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use super::{
    Enforcer,
    events::{Bytes, Happened},
};
use crate::{
    checkpoint::{CheckpointError, GpuPair, helper::Helper},
    enforcement::suspend::{self, Move, Refusal, Suspended, Suspension},
};

/// A suspension or resumption for the enforcer's task to run off the enforcer (each driver
/// call may take seconds): the session, its cgroup, its processes and how to reach the driver.
#[derive(Debug, Clone)]
pub(crate) struct CheckpointJob {
    /// The session.
    pub session: String,
    /// Its bound cgroup.
    pub dir: PathBuf,
    /// Its processes with a GPU context.
    pub pids: Vec<u32>,
    /// The helper.
    pub helper: Helper,
    /// The limit on each call.
    pub step: Duration,
    /// For a resumption onto other GPUs: each GPU left and the one taking its place.
    pub pairs: Vec<GpuPair>,
}

/// The driver asked whether it can restore onto other GPUs, before a move ([`Enforcer::begin_move`]).
#[derive(Debug, Clone)]
pub(crate) struct MoveCheck {
    /// The session.
    pub session: String,
    /// The helper.
    pub helper: Helper,
    /// The limit on the call.
    pub step: Duration,
}

/// A preemption under way: the workload was sent `SIGTERM` and is killed at `deadline`.
#[derive(Debug)]
pub(super) struct Preemption {
    pub(super) deadline: Instant,
    pub(super) reason: String,
}

impl Enforcer {
    /// Preempts `session`: `SIGTERM` to every process of its bound cgroup (and the cgroups
    /// below), which are killed `grace` later ([`Self::advance_preemptions`]) unless they are
    /// gone before. A session with nothing bound (no target, or its cgroup not there) ends at
    /// once. Either way its quota is then released and a `preempted` event goes up, which the
    /// controller link takes as the end of the session's hold on the node.
    pub(crate) fn preempt(&mut self, session: &str, grace: Duration, reason: &str) {
        if self.preempting.contains_key(session) {
            return;
        }
        let dir = self.bound_dir(session);
        let preemption = Preemption {
            deadline: Instant::now() + grace,
            reason: reason.to_owned(),
        };
        let Some(dir) = dir else {
            self.preempting.insert(session.to_owned(), preemption);
            self.finish_preemption(session);
            return;
        };
        let pids = self.tree.procs_below(&dir);
        let mut signalled = 0;
        for &pid in &pids {
            match self.kernel.signals.send(pid, libc::SIGTERM) {
                Ok(()) => signalled += 1,
                Err(e) => tracing::debug!(session, pid, "SIGTERM not sent: {e}"),
            }
        }
        // A workload its memory policy stopped would never see the SIGTERM: let it run to end.
        let stopped: Vec<u32> = self
            .bindings
            .get(session)
            .map(|b| b.stopped.iter().copied().collect())
            .unwrap_or_default();
        if !stopped.is_empty() {
            self.hold_stopped(session, false);
            for pid in stopped {
                let _ = self.kernel.signals.send(pid, libc::SIGCONT);
            }
        }
        let rel = self.tree.relative(&dir);
        let why = format!(
            "preempted ({reason}): SIGTERM to {signalled} processes; killed in {} ms",
            grace.as_millis()
        );
        self.record(Happened::to(session, "preempt").at(rel).because(why));
        self.preempting.insert(session.to_owned(), preemption);
    }

    /// Starts suspending `session` instead of killing it (issue 38): its processes with a GPU
    /// context, for the task to lock and checkpoint off the enforcer ([`suspend::suspend`]).
    /// `None` where it was preempted the kill way instead (no helper configured, nothing
    /// bound) or where a preemption or suspension of it is already under way.
    pub(crate) fn begin_suspend(
        &mut self,
        session: &str,
        grace: Duration,
        reason: &str,
    ) -> Option<CheckpointJob> {
        if self.preempting.contains_key(session) || self.suspensions.contains_key(session) {
            return None;
        }
        let (Some(config), Some(dir)) = (self.suspend.clone(), self.bound_dir(session)) else {
            let why = if self.suspend.is_none() {
                "no checkpoint helper"
            } else {
                "nothing bound"
            };
            self.preempt(session, grace, &format!("{reason}; not suspended: {why}"));
            return None;
        };
        let pids = self.tree.procs_below(&dir);
        let gpu = suspend::with_gpu_context(std::path::Path::new("/proc"), &pids);
        // What goes to host memory: the GPU memory its quota counts now.
        let held = self
            .bindings
            .get(session)
            .and_then(|b| b.key)
            .and_then(|k| self.kernel.maps.quotas.get(&k))
            .map_or(0, |q| q.used.iter().sum::<u64>());
        // Suspensions still copying out: `MemAvailable` does not count their bytes yet.
        let in_flight = self
            .suspensions
            .values()
            .filter(|s| !s.done)
            .map(|s| s.held)
            .sum::<u64>();
        let meminfo = std::fs::read_to_string(&self.meminfo).unwrap_or_default();
        if let Err(why) = suspend::host_room(&meminfo, held, in_flight, config.host_reserve) {
            self.preempt(session, grace, &format!("{reason}; not suspended: {why}"));
            return None;
        }
        let rel = self.tree.relative(&dir);
        let why = format!(
            "suspending ({reason}): {} of {} processes hold a GPU context; their GPU memory \
             goes to host memory",
            gpu.len(),
            pids.len()
        );
        self.record(Happened::to(session, "suspend").at(rel).because(why));
        self.suspensions.insert(
            session.to_owned(),
            Suspension {
                dir: dir.clone(),
                pids: Vec::new(),
                since: Instant::now(),
                reason: reason.to_owned(),
                grace,
                done: false,
                held,
                moving: None,
            },
        );
        Some(CheckpointJob {
            session: session.to_owned(),
            dir,
            pids: gpu,
            helper: config.helper,
            step: config.step_timeout,
            pairs: Vec::new(),
        })
    }

    /// The end of a suspension [`Self::begin_suspend`] started: `suspended` (the cgroup held
    /// frozen), or the driver refused and the workload is preempted the kill way, the event
    /// saying why.
    pub(crate) fn end_suspend(&mut self, session: &str, result: Result<Suspended, Refusal>) {
        let Some(s) = self.suspensions.get_mut(session) else {
            return;
        };
        let rel = self.tree.relative(&s.dir);
        match result {
            Ok(done) => {
                s.pids.clone_from(&done.pids);
                s.done = true;
                let why = format!(
                    "suspended ({}): {} processes checkpointed to host memory and the cgroup \
                     frozen in {} ms; their GPU memory is released",
                    s.reason,
                    done.pids.len(),
                    done.took.as_millis()
                );
                let held = s.held;
                self.hold_frozen(session, true);
                // `used_bytes`: the GPU memory now in host memory (the controller books it).
                self.record(
                    Happened::to(session, "suspended")
                        .at(rel)
                        .bytes(Bytes {
                            used: held,
                            ..Bytes::default()
                        })
                        .because(why),
                );
            }
            Err(refusal) => {
                let Some(s) = self.suspensions.remove(session) else {
                    return;
                };
                let why = format!("not suspended ({refusal}): preempted the kill way instead");
                self.record(
                    Happened::to(session, "suspend_refused")
                        .at(rel)
                        .because(why),
                );
                self.preempt(
                    session,
                    s.grace,
                    &format!("{}; suspend refused: {refusal}", s.reason),
                );
            }
        }
    }

    /// Starts resuming a suspended `session`: its checkpointed processes, for the task to
    /// restore and unlock ([`suspend::resume`]). `None` where it is not suspended (or a
    /// suspension or resumption of it is still under way).
    pub(crate) fn begin_resume(&mut self, session: &str) -> Option<CheckpointJob> {
        self.remember_suspension(session);
        self.start_resume(session, Vec::new())
    }

    /// A suspension of `session` from before this agent started, taken up where its cgroup is
    /// bound: nothing remembered, so its processes with a GPU context are resumed for what the
    /// driver says they are.
    fn remember_suspension(&mut self, session: &str) {
        if self.suspend.is_some()
            && !self.suspensions.contains_key(session)
            && let Some(dir) = self.bound_dir(session)
        {
            // Suspended by an agent before a restart: nothing remembered, so its processes with a
            // GPU context are resumed for what the driver says they are.
            let pids = self.tree.procs_below(&dir);
            let gpu = suspend::with_gpu_context(std::path::Path::new("/proc"), &pids);
            self.suspensions.insert(
                session.to_owned(),
                Suspension {
                    dir,
                    pids: gpu,
                    since: Instant::now(),
                    reason: "suspended before this agent started".to_owned(),
                    grace: Duration::ZERO,
                    done: true,
                    held: 0,
                    moving: None,
                },
            );
        }
    }

    /// Starts resuming suspended `session` onto the GPUs of `pairs` (none: the GPUs it left).
    fn start_resume(&mut self, session: &str, pairs: Vec<GpuPair>) -> Option<CheckpointJob> {
        let config = self.suspend.clone()?;
        // Not while a move's driver check is out: that one starts it.
        let s = self
            .suspensions
            .get_mut(session)
            .filter(|s| s.done && s.moving.is_none())?;
        s.done = false;
        let onto = if pairs.is_empty() {
            "the GPU".to_owned()
        } else {
            let new: Vec<&str> = pairs.iter().map(|p| p.new.as_str()).collect();
            format!("other GPUs ({})", new.join(", "))
        };
        let why = format!(
            "resuming after {} s: {} processes back to {onto}",
            s.since.elapsed().as_secs(),
            s.pids.len()
        );
        let job = CheckpointJob {
            session: session.to_owned(),
            dir: s.dir.clone(),
            pids: s.pids.clone(),
            helper: config.helper,
            step: config.step_timeout,
            pairs,
        };
        let rel = self.tree.relative(&job.dir);
        self.hold_frozen(session, false);
        self.record(Happened::to(session, "resuming").at(rel).because(why));
        Some(job)
    }

    /// Starts resuming suspended `session` onto other GPUs (`moving`: its quota there and the
    /// GPU pairs): first the driver is asked whether its restore takes GPU pairs
    /// ([`suspend::check_gpu_pairs`]), before anything moves. `None` where it is not
    /// suspended, or a suspension, resumption or move of it is under way.
    pub(crate) fn begin_move(&mut self, session: &str, moving: Move) -> Option<MoveCheck> {
        self.remember_suspension(session);
        let config = self.suspend.clone()?;
        let s = self
            .suspensions
            .get_mut(session)
            .filter(|s| s.done && s.moving.is_none())?;
        s.moving = Some(moving);
        Some(MoveCheck {
            session: session.to_owned(),
            helper: config.helper,
            step: config.step_timeout,
        })
    }

    /// The driver's answer for a move [`Self::begin_move`] started: where it can restore onto
    /// other GPUs, the quota moves to them (device rules, memory limits, accounting) and the
    /// resumption starts with the pairs; where it cannot, `resume_refused` says why and the
    /// session stays suspended where it was, nothing moved.
    pub(crate) fn end_move_check(
        &mut self,
        session: &str,
        checked: Result<i32, CheckpointError>,
    ) -> Option<CheckpointJob> {
        let s = self.suspensions.get_mut(session)?;
        let moving = s.moving.take()?;
        let rel = self.tree.relative(&s.dir);
        let new: Vec<String> = moving
            .spec
            .devices
            .iter()
            .map(|d| d.index.to_string())
            .collect();
        match checked {
            Ok(_) => {
                // The quota on the new GPUs before anything runs: the restore opens their nodes
                // from inside the cgroup and allocates there.
                self.apply(moving.spec);
                self.start_resume(session, moving.pairs)
            }
            Err(e) => {
                let why = format!(
                    "not resumed on GPUs {} ({e}); still suspended where it was",
                    new.join(",")
                );
                self.record(Happened::to(session, "resume_refused").at(rel).because(why));
                None
            }
        }
    }

    /// Takes up a move onto other GPUs that an earlier run of this agent began and did not
    /// settle (it stopped between the controller's `Resume` and its answer): the driver is
    /// asked each process's state ([`suspend::restored_any`]) before anything else is done.
    /// `None` where the session is not suspended here (or something of it is under way).
    pub(crate) fn begin_take_up(&mut self, session: &str, moving: Move) -> Option<CheckpointJob> {
        let pairs = moving.pairs.clone();
        // Held as a move is, so nothing else of it starts meanwhile.
        let check = self.begin_move(session, moving)?;
        let s = self.suspensions.get(session)?;
        Some(CheckpointJob {
            session: check.session,
            dir: s.dir.clone(),
            pids: s.pids.clone(),
            helper: check.helper,
            step: check.step,
            pairs,
        })
    }

    /// Says `resume_refused` for `session` with `why`: a resumption that can't start here (a
    /// move taken up after a restart whose session is not suspended here), so the controller,
    /// which booked GPUs for it, does not wait for an answer that never comes.
    pub(crate) fn refuse_resume(&mut self, session: &str, why: &str) {
        let rel = self
            .bound_dir(session)
            .map(|d| self.tree.relative(&d))
            .unwrap_or_default();
        self.record(Happened::to(session, "resume_refused").at(rel).because(why));
    }

    /// The driver's account of a move taken up ([`Self::begin_take_up`]). Where the earlier
    /// run restored any process (it is locked or running on the new GPUs: the GPU memory
    /// moved), the move is completed: the quota moves to the new GPUs and the resumption
    /// restores the rest onto them and unlocks all. Where every process is still checkpointed,
    /// or the driver could not be asked, nothing moved: `resume_refused` with `refusal`, and
    /// the session stays suspended on the GPUs it held.
    pub(crate) fn end_take_up(
        &mut self,
        session: &str,
        restored: Result<bool, Refusal>,
        refusal: &str,
    ) -> Option<CheckpointJob> {
        let s = self.suspensions.get_mut(session)?;
        let moving = s.moving.take()?;
        let rel = self.tree.relative(&s.dir);
        match restored {
            Ok(true) => {
                s.reason = format!(
                    "a move to other GPUs cut short by an agent restart, completed; {}",
                    s.reason
                );
                self.apply(moving.spec);
                self.start_resume(session, moving.pairs)
            }
            Ok(false) => {
                self.record(
                    Happened::to(session, "resume_refused")
                        .at(rel)
                        .because(refusal),
                );
                None
            }
            Err(e) => {
                let why = format!("{refusal} (the driver's state of its processes: {e})");
                self.record(Happened::to(session, "resume_refused").at(rel).because(why));
                None
            }
        }
    }

    /// The end of a resumption: `resumed`, or the restore failed, the workload's GPU state is
    /// lost, and it is ended the kill way.
    pub(crate) fn end_resume(&mut self, session: &str, result: Result<Duration, Refusal>) {
        let Some(s) = self.suspensions.remove(session) else {
            return;
        };
        let rel = self.tree.relative(&s.dir);
        match result {
            Ok(took) => {
                let why = format!(
                    "resumed after {} s suspended ({}): {} processes restored and unlocked in \
                     {} ms",
                    s.since.elapsed().as_secs(),
                    s.reason,
                    s.pids.len(),
                    took.as_millis()
                );
                self.record(Happened::to(session, "resumed").at(rel).because(why));
            }
            Err(refusal) => {
                let why = format!("not resumed ({refusal}): its GPU state is lost");
                self.record(
                    Happened::to(session, "resume_failed")
                        .at(rel)
                        .because(why.clone()),
                );
                self.preempt(session, Duration::ZERO, &why);
            }
        }
    }

    /// Holds `session`'s cgroup frozen against the throttle's periods (or lets it go).
    pub(super) fn hold_frozen(&self, session: &str, held: bool) {
        let Some(b) = self.bindings.get(session) else {
            return;
        };
        if let (Some(key), Some(dir), Some(throttle)) = (b.key, b.dir.clone(), &self.throttle)
            && let Err(e) = throttle.hold(key, dir, held)
        {
            tracing::warn!(session, "suspension not held against the throttle: {e}");
        }
    }

    /// Ends the preemptions whose deadline passed or whose workload is gone.
    pub(crate) fn advance_preemptions(&mut self, now: Instant) {
        let due: Vec<String> = self
            .preempting
            .iter()
            .filter(|(session, p)| {
                now >= p.deadline
                    || self
                        .bound_dir(session)
                        .is_none_or(|dir| self.tree.procs_below(&dir).is_empty())
            })
            .map(|(session, _)| session.clone())
            .collect();
        for session in due {
            self.finish_preemption(&session);
        }
    }

    /// Kills what is left of a preempted workload (`cgroup.kill`, else `SIGKILL` per process),
    /// releases its quota and reports `preempted`.
    pub(super) fn finish_preemption(&mut self, session: &str) {
        let Some(preemption) = self.preempting.remove(session) else {
            return;
        };
        let dir = self.bound_dir(session);
        let rel = dir
            .as_deref()
            .map(|d| self.tree.relative(d))
            .unwrap_or_default();
        let mut killed = 0;
        if let Some(dir) = &dir {
            let pids = self.tree.procs_below(dir);
            killed = pids.len();
            if !pids.is_empty()
                && let Err(e) = self.tree.kill(dir)
            {
                tracing::debug!(
                    session,
                    "cgroup.kill not written ({e}): SIGKILL per process"
                );
                for pid in pids {
                    if let Err(e) = self.kernel.signals.send(pid, libc::SIGKILL) {
                        tracing::debug!(session, pid, "SIGKILL not sent: {e}");
                    }
                }
            }
        }
        self.release(session);
        let why = if killed == 0 {
            format!(
                "preempted ({}): the workload ended; quota released",
                preemption.reason
            )
        } else {
            format!(
                "preempted ({}): {killed} processes killed at the deadline; quota released",
                preemption.reason
            )
        };
        self.record(Happened::to(session, "preempted").at(rel).because(why));
    }
}
