//! The enforcer as a task of its own, behind a handle (as the throttle is): quota commands from
//! the controller link, kernel events, the NVML cross-check and local requests arrive as
//! messages; a timer binds what waits. Nothing else holds the enforcer, so nothing waits on a
//! lock shared with telemetry.

use std::{path::PathBuf, time::Duration};

use gpuwarden_agent_common::event::Event;
use tokio::sync::{mpsc, oneshot};

use super::{
    enforcer::{CheckpointJob, ControlError, Enforcer, Standing},
    kernel::Pinned,
    quota::QuotaSpec,
    suspend::{self, Move, PreemptionMode, Refusal, Suspended},
};
use crate::checkpoint::CheckpointError;
use crate::{devices::ProcessMemory, sensor::MemoryTier};

/// How often pending quotas look for their cgroup and bound ones for new children.
pub(crate) const RECONCILE_EVERY: Duration = Duration::from_millis(500);

/// What the controller link and the DRA plugin pass down to enforcement (enforcement consumes
/// it, so it owns it): configuration flows from the controller to the
/// kernel, never back through shared state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaCommand {
    /// Enforce this quota (the allocation is on disk already).
    Apply(QuotaSpec),
    /// Stop enforcing the session's quota.
    Release(String),
    /// End the session's workload (`SIGTERM`, killed after `grace`), then release its quota
    /// and report `preempted` (`Enforcer::preempt`); or, in mode `suspend`, move its GPU
    /// memory to host memory and freeze it, falling back to the kill where the driver refuses
    /// (`Enforcer::begin_suspend`).
    Preempt {
        /// The session.
        session: String,
        /// Between `SIGTERM` and the kill.
        grace: Duration,
        /// Who it yields to and why.
        reason: String,
        /// Kill or suspend.
        mode: PreemptionMode,
    },
    /// Resume a suspended session: thaw, restore and unlock its processes.
    Resume(String),
    /// Resume a suspended session on other GPUs of its node: where the driver's restore takes
    /// GPU pairs, the quota moves to them and the processes are restored there; otherwise the
    /// session stays suspended (`resume_refused`).
    ResumeOnto {
        /// The session.
        session: String,
        /// Its quota on the new GPUs and the GPU pairs.
        moving: Move,
    },
    /// Take up a move onto other GPUs that an earlier run of the agent began and did not
    /// settle: completed where the driver restored any process of it already, otherwise
    /// refused with `refusal` (`Enforcer::end_take_up`).
    TakeUpMove {
        /// The session.
        session: String,
        /// Its quota on the new GPUs and the GPU pairs.
        moving: Move,
        /// The `resume_refused` reason where nothing moved.
        refusal: String,
    },
}

impl QuotaCommand {
    /// The suspended session a resumption command is for: one that waits while the session's
    /// quota looks for its cgroup (after an agent restart), rather than being dropped.
    fn resumes(&self) -> Option<&str> {
        match self {
            Self::Resume(session)
            | Self::ResumeOnto { session, .. }
            | Self::TakeUpMove { session, .. } => Some(session),
            Self::Apply(_) | Self::Release(_) | Self::Preempt { .. } => None,
        }
    }
}

enum Message {
    KernelEvent(Box<Event>),
    CrossCheck(Vec<ProcessMemory>),
    ShareDeviation {
        session: String,
        cgroup_path: String,
        reason: String,
    },
    Signal {
        process: Pinned,
        resume: bool,
        reply: oneshot::Sender<Result<String, ControlError>>,
    },
    SessionCgroup {
        session: String,
        reply: oneshot::Sender<Result<(PathBuf, bool), ControlError>>,
    },
    Standing(oneshot::Sender<(Standing, u64)>),
    /// A command from the local socket, as the controller link would send it.
    Command(QuotaCommand),
}

/// The end of a suspension or resumption run off the enforcer ([`run_job`]).
enum JobDone {
    Suspended {
        session: String,
        result: Result<Suspended, Refusal>,
    },
    Resumed {
        session: String,
        result: Result<Duration, Refusal>,
    },
    /// The driver's version, asked before a resumption onto other GPUs.
    MoveChecked {
        session: String,
        result: Result<i32, CheckpointError>,
    },
    /// The driver's account of a move taken up after a restart: whether any process of it
    /// was restored.
    TakenUp {
        session: String,
        result: Result<bool, Refusal>,
        refusal: String,
    },
}

/// The enforcer task went away (the agent is stopping).
#[derive(Debug, thiserror::Error)]
#[error("enforcement has stopped")]
pub(crate) struct Stopped;

/// Talks to the enforcer task. Cheap to clone.
#[derive(Clone)]
pub(crate) struct EnforcerHandle {
    tx: mpsc::UnboundedSender<Message>,
}

impl EnforcerHandle {
    /// Ties a kernel event (over-limit allocation, refused open) to its session.
    pub(crate) fn kernel_event(&self, event: &Event) {
        let _ = self.tx.send(Message::KernelEvent(Box::new(*event)));
    }

    /// Compares NVML's per-process memory with the bound quotas.
    pub(crate) fn cross_check(&self, samples: Vec<ProcessMemory>) {
        let _ = self.tx.send(Message::CrossCheck(samples));
    }

    /// Reports a share deviation on one of `session`'s containers (a `share_deviation` event).
    pub(crate) fn share_deviation(&self, session: String, cgroup_path: String, reason: String) {
        let _ = self.tx.send(Message::ShareDeviation {
            session,
            cgroup_path,
            reason,
        });
    }

    /// Resumes (SIGCONT) or kills (SIGKILL) a pinned process of a bound workload.
    pub(crate) async fn signal(
        &self,
        process: Pinned,
        resume: bool,
    ) -> Result<Result<String, ControlError>, Stopped> {
        self.ask(|reply| Message::Signal {
            process,
            resume,
            reply,
        })
        .await
    }

    /// A session's cgroup directory and whether its quota is bound there.
    pub(crate) async fn session_cgroup(
        &self,
        session: String,
    ) -> Result<Result<(PathBuf, bool), ControlError>, Stopped> {
        self.ask(|reply| Message::SessionCgroup { session, reply })
            .await
    }

    /// Suspends (or, `resume`, resumes) `session` on a local request, as a preemption in mode
    /// `suspend` would: the outcome shows in the events.
    pub(crate) fn suspend(&self, session: String, resume: bool) -> Result<(), Stopped> {
        let command = if resume {
            QuotaCommand::Resume(session)
        } else {
            QuotaCommand::Preempt {
                reason: "suspended through the agent's socket".to_owned(),
                session,
                grace: Duration::from_secs(30),
                mode: PreemptionMode::Suspend,
            }
        };
        self.tx.send(Message::Command(command)).map_err(|_| Stopped)
    }

    /// The bindings and recent actions, and how many events the controller link dropped.
    pub(crate) async fn standing(&self) -> Result<(Standing, u64), Stopped> {
        self.ask(Message::Standing).await
    }

    async fn ask<T>(
        &self,
        message: impl FnOnce(oneshot::Sender<T>) -> Message,
    ) -> Result<T, Stopped> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(message(reply)).map_err(|_| Stopped)?;
        answer.await.map_err(|_| Stopped)
    }
}

/// Runs `enforcer` until every handle and the quota channel are gone.
pub(crate) fn spawn(
    enforcer: Enforcer,
    quotas: mpsc::UnboundedReceiver<QuotaCommand>,
    tier: MemoryTier,
) -> (EnforcerHandle, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(run(enforcer, rx, quotas, tier));
    (EnforcerHandle { tx }, task)
}

async fn run(
    mut enforcer: Enforcer,
    mut messages: mpsc::UnboundedReceiver<Message>,
    mut quotas: mpsc::UnboundedReceiver<QuotaCommand>,
    tier: MemoryTier,
) {
    let mut reconcile = tokio::time::interval(RECONCILE_EVERY);
    reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut quotas_open = true;
    let (own, mut jobs) = mpsc::unbounded_channel();
    // Resumptions of sessions whose quota is still looking for its cgroup, tried again after
    // each reconcile.
    let mut waiting: Vec<QuotaCommand> = Vec::new();
    loop {
        // Biased: a quota the link passed down is in place before any later request is answered.
        tokio::select! {
            biased;
            command = quotas.recv(), if quotas_open => match command {
                Some(command) => command_or_wait(&mut enforcer, command, &own, &mut waiting),
                None => quotas_open = false,
            },
            message = messages.recv() => match message {
                Some(Message::Command(command)) => {
                    command_or_wait(&mut enforcer, command, &own, &mut waiting);
                }
                Some(message) => handle(&mut enforcer, message, tier),
                None => return,
            },
            Some(done) = jobs.recv() => match done {
                JobDone::Suspended { session, result } => enforcer.end_suspend(&session, result),
                JobDone::Resumed { session, result } => enforcer.end_resume(&session, result),
                JobDone::MoveChecked { session, result } => {
                    if let Some(job) = enforcer.end_move_check(&session, result) {
                        run_job(job, &own, true);
                    }
                }
                JobDone::TakenUp { session, result, refusal } => {
                    if let Some(job) = enforcer.end_take_up(&session, result, &refusal) {
                        run_job(job, &own, true);
                    }
                }
            },
            _ = reconcile.tick() => {
                enforcer.reconcile();
                for command in std::mem::take(&mut waiting) {
                    command_or_wait(&mut enforcer, command, &own, &mut waiting);
                }
            }
        }
    }
}

/// [`command_enforcer`], or kept in `waiting` where it resumes a session whose quota waits
/// for its cgroup (an agent restarted: the quota binds again at a reconcile, and until then
/// nothing of the session is known to be suspended). Passed on once the quota no longer waits:
/// bound, or expired or released (then it finds nothing suspended, as without the wait).
fn command_or_wait(
    enforcer: &mut Enforcer,
    command: QuotaCommand,
    own: &mpsc::UnboundedSender<JobDone>,
    waiting: &mut Vec<QuotaCommand>,
) {
    if let Some(session) = command.resumes()
        && enforcer.awaits_binding(session)
    {
        tracing::debug!(session, "resumption waits for the quota to bind");
        waiting.push(command);
        return;
    }
    command_enforcer(enforcer, command, own);
}

fn command_enforcer(
    enforcer: &mut Enforcer,
    command: QuotaCommand,
    own: &mpsc::UnboundedSender<JobDone>,
) {
    match command {
        QuotaCommand::Apply(spec) => enforcer.apply(spec),
        QuotaCommand::Release(session) => enforcer.release_on_request(&session),
        QuotaCommand::Preempt {
            session,
            grace,
            reason,
            mode: PreemptionMode::Kill,
        } => enforcer.preempt(&session, grace, &reason),
        QuotaCommand::Preempt {
            session,
            grace,
            reason,
            mode: PreemptionMode::Suspend,
        } => {
            if let Some(job) = enforcer.begin_suspend(&session, grace, &reason) {
                run_job(job, own, false);
            }
        }
        QuotaCommand::Resume(session) => {
            if let Some(job) = enforcer.begin_resume(&session) {
                run_job(job, own, true);
            }
        }
        QuotaCommand::TakeUpMove {
            session,
            moving,
            refusal,
        } => {
            let Some(job) = enforcer.begin_take_up(&session, moving) else {
                let why = format!("{refusal} (not suspended here)");
                enforcer.refuse_resume(&session, &why);
                return;
            };
            let own = own.clone();
            tokio::spawn(async move {
                let result = suspend::restored_any(&job.helper, &job.pids, job.step).await;
                let _ = own.send(JobDone::TakenUp {
                    session: job.session,
                    result,
                    refusal,
                });
            });
        }
        QuotaCommand::ResumeOnto { session, moving } => {
            if let Some(check) = enforcer.begin_move(&session, moving) {
                let own = own.clone();
                tokio::spawn(async move {
                    let result = suspend::check_gpu_pairs(&check.helper, check.step).await;
                    let _ = own.send(JobDone::MoveChecked {
                        session: check.session,
                        result,
                    });
                });
            }
        }
    }
}

/// Runs a suspension (or resumption) off the enforcer: each driver call is a helper process
/// that may take seconds. Its end comes back as a message; every call is bounded by the job's
/// step timeout, so the task ends.
fn run_job(job: CheckpointJob, own: &mpsc::UnboundedSender<JobDone>, resume: bool) {
    let own = own.clone();
    tokio::spawn(async move {
        let CheckpointJob {
            session,
            dir,
            pids,
            helper,
            step,
            pairs,
        } = job;
        let message = if resume {
            let result = suspend::resume(&helper, &dir, &pids, &pairs, step).await;
            JobDone::Resumed { session, result }
        } else {
            let result = suspend::suspend(&helper, &dir, &pids, step).await;
            JobDone::Suspended { session, result }
        };
        let _ = own.send(message);
    });
}

fn handle(enforcer: &mut Enforcer, message: Message, tier: MemoryTier) {
    match message {
        // Taken in `run`, which has the job channel.
        Message::Command(_) => {}
        Message::KernelEvent(event) => enforcer.on_kernel_event(&event, tier),
        Message::CrossCheck(samples) => enforcer.cross_check(&samples),
        Message::ShareDeviation {
            session,
            cgroup_path,
            reason,
        } => enforcer.share_deviation(&session, cgroup_path, reason),
        Message::Signal {
            process,
            resume,
            reply,
        } => {
            let _ = reply.send(enforcer.signal(&process, resume));
        }
        Message::SessionCgroup { session, reply } => {
            let _ = reply.send(enforcer.session_cgroup(&session));
        }
        Message::Standing(reply) => {
            let _ = reply.send((enforcer.standing(), enforcer.dropped_upward()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforcement::{
        cgroup_tree::CgroupTree,
        fake::FakeKernel,
        quota::{ComputePolicy, MemoryPolicy, QuotaSpec, Target},
    };

    #[tokio::test]
    async fn commands_and_requests_reach_the_enforcer_task() {
        let fake = FakeKernel::default();
        fake.cgroups.mkdir("/cg/job");
        let (up, mut up_rx) = mpsc::channel(8);
        let tree = CgroupTree::new("/cg".into(), Box::new(fake.cgroups.clone()));
        let enforcer = Enforcer::new(fake.kernel(), tree, up, Duration::from_mins(1), None);
        let (quota_tx, quota_rx) = mpsc::unbounded_channel();
        let (handle, task) = spawn(enforcer, quota_rx, MemoryTier::TracepointSignal);
        quota_tx
            .send(QuotaCommand::Apply(QuotaSpec {
                session_id: "s".into(),
                target: Target::CgroupPath("/job".into()),
                scope: gpuwarden_types::target::TargetScope::admin(true),
                memory_policy: MemoryPolicy::Report,
                compute_policy: ComputePolicy::Hard,
                devices: vec![],
            }))
            .unwrap();
        // Requests are answered in order after the command.
        let (dir, bound) = handle.session_cgroup("s".into()).await.unwrap().unwrap();
        assert_eq!((dir, bound), (PathBuf::from("/cg/job"), true));
        let (standing, dropped) = handle.standing().await.unwrap();
        assert_eq!((standing.bindings.len(), dropped), (1, 0));
        quota_tx.send(QuotaCommand::Release("s".into())).unwrap();
        assert!(handle.session_cgroup("s".into()).await.unwrap().is_err());
        // A Release is confirmed upward once the quota is gone (issue 40): the controller
        // waits for it to end a terminating session. So is one of a session not held.
        quota_tx
            .send(QuotaCommand::Release("never-held".into()))
            .unwrap();
        let _ = handle.standing().await.unwrap();
        let mut sent = Vec::new();
        while let Ok(e) = up_rx.try_recv() {
            sent.push((e.session_id, e.action, e.device_index));
        }
        let released: Vec<&str> = sent
            .iter()
            .filter(|(_, action, _)| action == "released")
            .map(|(session, _, _)| session.as_str())
            .collect();
        assert_eq!(released, ["s", "never-held"], "{sent:?}");
        let unbound = sent.iter().position(|(_, a, _)| a == "unbound");
        let first_release = sent.iter().position(|(_, a, _)| a == "released");
        assert!(unbound < first_release, "{sent:?}");
        // A release concerns no one GPU.
        assert!(
            sent.iter().all(|(_, _, device)| device.is_none()),
            "{sent:?}"
        );
        drop(handle);
        task.await.unwrap();
    }
}
