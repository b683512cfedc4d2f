//! The link's part in MIG instances made on demand (issue 37 §3, docs/mig.md "Instances made
//! on demand"): make the instance the controller asks for, destroy those made here once no
//! session holds them. Either change is reported by registering again, the registration
//! listing the node's devices and layouts as they are now.

use std::{collections::BTreeSet, future::Future, pin::Pin, time::Duration};

use gpuwarden_proto::v1 as pb;

use super::super::holdings::{SharedHoldings, lock};
use crate::{
    devices::{
        GpuBackend,
        ondemand::{self, Reconfigurer},
    },
    sensor::Counters,
};

/// The agent's own view of the GPU processes it traced (the telemetry task's counters), asked
/// before a MIG layout change beside the driver's count: NVML's per-instance process list is
/// not to be relied on alone (docs/mig.md, "Instances made on demand").
pub trait ProcessView: Send + Sync {
    /// The device indexes (GPUs and MIG instances) the agent sees a process or GPU memory on
    /// now; `None` when it can't tell (the telemetry task gone): then nothing is changed.
    fn busy(&self) -> Pin<Box<dyn Future<Output = Option<BTreeSet<u32>>> + Send + '_>>;
}

/// The device indexes `counters` attribute GPU memory to, or a process to: a cgroup with a
/// process holding GPU files that has used the device. (The telemetry task's handle answers
/// [`ProcessView`] with it, in `export`: the link does not reach up to the task.)
pub(crate) fn busy_in(counters: &Counters) -> BTreeSet<u32> {
    counters
        .cgroups
        .values()
        .flat_map(|c| {
            c.devices
                .iter()
                .filter(|(_, (_, bytes))| *bytes > 0 || !c.pids.is_empty())
                .map(|(index, _)| *index)
        })
        .collect()
}

/// What `view` sees busy; with no view (a link without the daemon's telemetry), nothing.
async fn seen_busy(view: Option<&dyn ProcessView>) -> Option<BTreeSet<u32>> {
    match view {
        Some(v) => v.busy().await,
        None => Some(BTreeSet::new()),
    }
}

/// The link's [`Reconfigurer`] for the GPUs `allowed`: the instances made here kept in the
/// agent's store beside the holdings, those a previous run made taken back. A store that can't
/// be read is logged and the instances made are then kept in memory only (those made before are
/// never destroyed: nothing is taken for made here that the store does not say).
pub(super) fn reconfigurer(
    allowed: &[String],
    backend: &dyn GpuBackend,
    holdings: &SharedHoldings,
) -> Reconfigurer {
    let allowed = allowed.iter().cloned();
    let tree = match lock(holdings).open_tree(ondemand::TREE) {
        Ok(Some(tree)) => tree,
        // Holdings in memory (tests): so are the instances made.
        Ok(None) => return Reconfigurer::new(allowed),
        Err(e) => {
            tracing::error!(
                "MIG instances made: agent store not opened ({e}); kept in memory only"
            );
            return Reconfigurer::new(allowed);
        }
    };
    match Reconfigurer::open(allowed.clone(), tree, backend) {
        Ok((reconfigurer, problems)) => {
            for p in problems {
                tracing::warn!("{p}");
            }
            reconfigurer
        }
        Err(e) => {
            tracing::error!(
                "{e}: instances made before are not destroyed, new ones kept in memory only"
            );
            Reconfigurer::new(allowed)
        }
    }
}

/// How long an instance made for a session waits for a session to hold it before it is
/// destroyed (the session ended, or went elsewhere, meanwhile).
pub(super) const UNCLAIMED_GRACE: Duration = Duration::from_mins(2);

/// The reason of the nack that refuses an order to make an instance (the controller's
/// `scheduler::mig_demand::REFUSED`).
pub(super) const REFUSED: &str = "MigInstanceRefused";

/// Makes the instance `order` asks for; `None` when made (or there already: an order sent
/// again answers as the first did), else the nack to send (a GPU not listed, a process on it as
/// the agent's `view` or the driver sees it, the driver's refusal).
pub(super) async fn make(
    reconfigurer: &Reconfigurer,
    backend: &dyn GpuBackend,
    view: Option<&dyn ProcessView>,
    order: &pb::MakeMigInstance,
) -> Option<pb::agent_message::Msg> {
    let there = backend.mig_layouts().iter().any(|(gpu, _, layout)| {
        *gpu == order.gpu_uuid
            && layout
                .instances
                .iter()
                .any(|(p, at)| p.name == order.profile && at.start == order.start)
    });
    if there {
        tracing::info!(session = %order.session_id, gpu = %order.gpu_uuid, profile = %order.profile, start = order.start, "MIG instance asked for is there already; registering again");
        return None;
    }
    let made = match seen_busy(view).await {
        Some(seen) => reconfigurer
            .create(backend, &seen, &order.gpu_uuid, &order.profile, order.start)
            .map_err(|e| e.to_string()),
        None => Err("the agent's view of its GPU processes can't be read".to_owned()),
    };
    match made {
        Ok(device) => {
            tracing::info!(session = %order.session_id, instance = %device.uuid, index = device.index, "MIG instance made; registering again");
            None
        }
        Err(e) => {
            tracing::warn!(session = %order.session_id, gpu = %order.gpu_uuid, profile = %order.profile, start = order.start, "MIG instance refused: {e}");
            Some(pb::agent_message::Msg::Nack(pb::AllocationNack {
                session_id: order.session_id.clone(),
                reason: REFUSED.to_owned(),
                message: e,
            }))
        }
    }
}

/// Destroys the instances made here that no held session names any more (retried at each
/// heartbeat while one is busy, as the agent's `view` or the driver sees it); whether any was
/// destroyed.
pub(super) async fn destroy_idle(
    reconfigurer: &Reconfigurer,
    backend: &dyn GpuBackend,
    holdings: &SharedHoldings,
    view: Option<&dyn ProcessView>,
) -> bool {
    let held = held_devices(holdings);
    let due = reconfigurer.idle(&held, UNCLAIMED_GRACE);
    if due.is_empty() {
        return false;
    }
    let Some(seen) = seen_busy(view).await else {
        tracing::warn!(
            "MIG instances not destroyed yet: the agent's view of its GPU processes can't be read"
        );
        return false;
    };
    let mut changed = false;
    for uuid in due {
        match reconfigurer.release(backend, &seen, &uuid) {
            Ok(destroyed) => changed |= destroyed,
            Err(e) => {
                tracing::warn!(instance = %uuid, "MIG instance not destroyed yet, tried again later: {e}");
            }
        }
    }
    changed
}

/// Notes the instances made here that a session holds now, before a hold is let go: the
/// instance is then destroyed once let go even if no heartbeat saw it held (a short session).
pub(super) fn note_held(reconfigurer: &Reconfigurer, holdings: &SharedHoldings) {
    reconfigurer.mark_held(&held_devices(holdings));
}

/// The UUIDs of the devices the node's sessions hold.
fn held_devices(holdings: &SharedHoldings) -> BTreeSet<String> {
    let h = lock(holdings);
    h.sessions()
        .iter()
        .filter_map(|s| h.get(s))
        .flat_map(|a| a.devices.iter().map(|d| d.uuid.clone()))
        .collect()
}

#[cfg(test)]
mod tests;
