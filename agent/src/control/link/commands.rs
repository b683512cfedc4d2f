//! The agent's answers to what the controller sends down the stream: allocations, releases,
//! preemptions, and resumptions (onto the GPUs a session held, or onto others: issue 38).

use std::time::Duration;

use gpuwarden_proto::v1::{self as pb, controller_message::Msg};
use tokio::sync::mpsc;

use super::{LinkChannels, LinkConfig, LinkError, allocation::accept};
use crate::{
    checkpoint::GpuPair,
    control::holdings::{SharedHoldings, lock},
    devices::GpuBackend,
    enforcement::{PreemptionMode, QuotaCommand, confinement, quota::QuotaSpec, suspend::Move},
};

/// The agent's answer to a message from the controller, if it sends one.
pub(super) fn answer(
    config: &LinkConfig,
    backend: &dyn GpuBackend,
    holdings: &SharedHoldings,
    channels: Option<&LinkChannels>,
    message: Option<Msg>,
) -> Option<pb::agent_message::Msg> {
    match message {
        // Asked at each allocation: a device plugin's slots may change while connected.
        Some(Msg::Allocate(a)) => Some(accept(config, backend, holdings, channels, a)),
        Some(Msg::Release(r)) if confinement::check_session_id(&r.session_id).is_err() => {
            // No allocation was ever held under such an id.
            tracing::warn!(session = %r.session_id.chars().take(80).collect::<String>(), "release for a malformed session id ignored");
            None
        }
        Some(Msg::Preempt(p)) if confinement::check_session_id(&p.session_id).is_err() => {
            tracing::warn!(session = %p.session_id.chars().take(80).collect::<String>(), "preemption for a malformed session id ignored");
            None
        }
        Some(Msg::Preempt(p)) => preempt(holdings, channels, p),
        Some(Msg::Resume(r)) => {
            let c = channels.filter(|_| confinement::check_session_id(&r.session_id).is_ok())?;
            let session_id = r.session_id.clone();
            match resume_command(backend, holdings, r) {
                Ok(command) => {
                    let _ = c.quotas.send(command);
                    None
                }
                // Said to the controller, which suspends it again for the GPUs it left.
                Err(why) => Some(pb::agent_message::Msg::Event(pb::EnforcementEvent {
                    session_id,
                    action: "resume_refused".to_owned(),
                    action_kind: pb::EnforcementAction::ResumeRefused.into(),
                    reason: format!("not resumed on the GPUs named ({why}); still suspended"),
                    ..pb::EnforcementEvent::default()
                })),
            }
        }
        Some(Msg::Release(r)) => {
            release_held(holdings, &r.session_id);
            if let Some(c) = channels
                && c.quotas
                    .send(QuotaCommand::Release(r.session_id.clone()))
                    .is_ok()
            {
                // Enforcement reports `released` once the quota is gone.
                return None;
            }
            // Nothing enforced here: the hold was all there was, and it is gone. The
            // controller keeps a terminating session booked until it hears this (issue 40).
            Some(pb::agent_message::Msg::Event(pb::EnforcementEvent {
                session_id: r.session_id,
                action: "released".to_owned(),
                action_kind: pb::EnforcementAction::Released.into(),
                reason: "released: nothing enforced here; its hold is gone".to_owned(),
                ..pb::EnforcementEvent::default()
            }))
        }
        // An instance to make is the stream's own (it registers again after).
        Some(Msg::MakeMigInstance(_)) | None => None,
    }
}

/// What a `Resume` asks of enforcement: a plain resumption where it names no GPUs or the ones
/// the session holds, else a resumption onto the GPUs it names (issue 38), each in place of the
/// held one at its position: the quota there and the GPU pairs, old → new, by this node's
/// UUIDs for the indexes.
///
/// # Errors
/// Why not, where it names GPUs that cannot take the session's place (another model, not a
/// whole GPU here, another count): it stays suspended.
pub(super) fn resume_command(
    backend: &dyn GpuBackend,
    holdings: &SharedHoldings,
    r: pb::Resume,
) -> Result<QuotaCommand, String> {
    let session = r.session_id.clone();
    match plan_resume(backend, holdings, r)? {
        Planned::InPlace(session) => Ok(QuotaCommand::Resume(session)),
        Planned::Onto { moving, moved } => {
            // Written down before anything moves, so that a restart in its middle is known.
            if let Err(e) = lock(holdings).propose_move(*moved) {
                let why = format!("the move could not be recorded: {e}");
                tracing::warn!(%session, "resumption onto other GPUs refused: {why}");
                return Err(why);
            }
            Ok(QuotaCommand::ResumeOnto { session, moving })
        }
    }
}

/// What a `Resume` comes to, before anything is written: a resumption in place, or a move onto
/// the GPUs it names with the allocation the session will hold there.
enum Planned {
    /// On the GPUs it holds.
    InPlace(String),
    /// Onto others.
    Onto {
        moving: Move,
        moved: Box<pb::Allocate>,
    },
}

/// [`resume_command`]'s checks and plan, recording nothing.
fn plan_resume(
    backend: &dyn GpuBackend,
    holdings: &SharedHoldings,
    r: pb::Resume,
) -> Result<Planned, String> {
    let held = lock(holdings).get(&r.session_id).cloned();
    let same = |held: &pb::Allocate| {
        held.devices
            .iter()
            .map(|d| d.index)
            .eq(r.devices.iter().map(|d| d.index))
    };
    let held = match held {
        Some(held) if !r.devices.is_empty() && !same(&held) => held,
        _ => return Ok(Planned::InPlace(r.session_id)),
    };
    let refuse = |why: String| {
        tracing::warn!(session = %r.session_id, "resumption onto other GPUs refused: {why}");
        Err(why)
    };
    if held.devices.len() != r.devices.len() {
        return refuse(format!(
            "{} GPUs named for {} held",
            r.devices.len(),
            held.devices.len()
        ));
    }
    let devices = backend.devices();
    let gpu = |index: u32| devices.iter().find(|d| d.index == index && !d.is_mig);
    let mut pairs = Vec::new();
    for (old, new) in held.devices.iter().zip(&r.devices) {
        let (Some(o), Some(n)) = (gpu(old.index), gpu(new.index)) else {
            return refuse(format!(
                "GPU {} or {} is not a whole GPU here",
                old.index, new.index
            ));
        };
        // The driver restores only onto the same chip (NVIDIA's documentation).
        if o.model != n.model {
            return refuse(format!(
                "GPU {} is a {}, GPU {} a {}",
                o.index, o.model, n.index, n.model
            ));
        }
        // The driver takes UUIDs as bytes: one that is not in NVML's form (a mock GPU's made-up
        // name) fails here, before anything moves, rather than at the restore.
        let pair: GpuPair = format!("{}={}", o.uuid, n.uuid)
            .parse()
            .map_err(|e: crate::checkpoint::CheckpointError| e.to_string())?;
        pairs.push(pair);
    }
    let mut moved = held;
    moved.devices = r.devices;
    let spec = match QuotaSpec::from_allocate(&moved, &devices) {
        Ok(Some(spec)) => spec,
        Ok(None) => return refuse("nothing enforced for it".to_owned()),
        Err(e) => return refuse(e.to_string()),
    };
    Ok(Planned::Onto {
        moving: Move { spec, pairs },
        moved: Box::new(moved),
    })
}

/// Takes up each move onto other GPUs that an earlier run of this agent began and did not
/// settle (issue 38): the controller booked the new GPUs and waits for the answer, this run
/// holds the old ones and re-applied their quota. Enforcement asks the driver where the
/// processes are and completes the move where the earlier run restored any (`resumed`), or
/// refuses it where nothing moved (`resume_refused`: the controller frees the new GPUs and
/// suspends the session again; its next `Resume` restores it on the GPUs it holds). Without
/// enforcement, or where the move can't be rebuilt, it is refused here.
pub(super) async fn take_up_interrupted(
    backend: &dyn GpuBackend,
    holdings: &SharedHoldings,
    channels: Option<&LinkChannels>,
    tx: &mpsc::Sender<pb::AgentMessage>,
) -> Result<(), LinkError> {
    for (to, refusal) in interrupted_moves(holdings) {
        let session = refusal.session_id.clone();
        if let Some(c) = channels {
            lock(holdings).take_up_move(&session);
            let resume = pb::Resume {
                session_id: session.clone(),
                devices: to.devices,
            };
            // Its move record is there already (that is how it was found).
            if let Ok(Planned::Onto { moving, .. }) = plan_resume(backend, holdings, resume) {
                let command = QuotaCommand::TakeUpMove {
                    session: session.clone(),
                    moving,
                    refusal: refusal.reason.clone(),
                };
                if c.quotas.send(command).is_ok() {
                    continue;
                }
            }
        }
        let msg = pb::agent_message::Msg::Event(refusal);
        tx.send(pb::AgentMessage { msg: Some(msg) })
            .await
            .map_err(|_| LinkError::Closed)?;
        if let Err(e) = lock(holdings).settle_move(&session, false) {
            tracing::error!(session, "forgetting the interrupted move: {e}");
        }
    }
    Ok(())
}

/// Each move onto other GPUs that an earlier run of this agent began and did not settle, with
/// the allocation it was going to and the `resume_refused` that says nothing moved: the
/// processes are as the cut-short move left them, checkpointed, or restored onto the new GPUs
/// in part or whole where the restore had begun.
pub(super) fn interrupted_moves(
    holdings: &SharedHoldings,
) -> Vec<(pb::Allocate, pb::EnforcementEvent)> {
    let h = lock(holdings);
    h.interrupted()
        .into_iter()
        .map(|to| {
            let gpus = |a: &pb::Allocate| {
                a.devices
                    .iter()
                    .map(|d| d.index.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let held = h.get(&to.session_id).map(gpus).unwrap_or_default();
            tracing::warn!(session = %to.session_id, "a move to GPUs {} was cut short by a restart", gpus(&to));
            let refusal = pb::EnforcementEvent {
                session_id: to.session_id.clone(),
                action: "resume_refused".to_owned(),
                action_kind: pb::EnforcementAction::ResumeRefused.into(),
                reason: format!(
                    "not resumed on GPUs {}: the agent restarted during the move; still \
                     suspended, holding GPUs {held}",
                    gpus(&to)
                ),
                move_interrupted: true,
                ..pb::EnforcementEvent::default()
            };
            (to, refusal)
        })
        .collect()
}

/// Lets go of `session`'s allocation on disk.
pub(super) fn release_held(holdings: &SharedHoldings, session: &str) {
    if let Err(e) = lock(holdings).release(session) {
        tracing::error!(session, "releasing: {e}");
    }
}

/// Starts a preemption: enforcement signals the workload, kills it at the deadline, releases
/// the quota and sends `preempted` up (the hold is let go as that event passes). Without
/// enforcement there is nothing to signal: the hold goes at once and the answer is `preempted`.
pub(super) fn preempt(
    holdings: &SharedHoldings,
    channels: Option<&LinkChannels>,
    p: pb::Preempt,
) -> Option<pb::agent_message::Msg> {
    tracing::info!(session = %p.session_id, grace_ms = p.grace_ms, "preempting: {}", p.reason);
    if let Some(c) = channels {
        let command = QuotaCommand::Preempt {
            session: p.session_id.clone(),
            grace: Duration::from_millis(u64::from(p.grace_ms)),
            reason: p.reason.clone(),
            mode: PreemptionMode::from_wire(&p.mode),
        };
        if c.quotas.send(command).is_ok() {
            return None;
        }
    }
    release_held(holdings, &p.session_id);
    Some(pb::agent_message::Msg::Event(pb::EnforcementEvent {
        session_id: p.session_id,
        action: "preempted".to_owned(),
        action_kind: pb::EnforcementAction::Preempted.into(),
        reason: format!("preempted ({}): nothing enforced here; released", p.reason),
        ..pb::EnforcementEvent::default()
    }))
}
