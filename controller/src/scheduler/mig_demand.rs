//! MIG instances made on demand (issue 37 §3, docs/mig.md "Instances made on demand"): a
//! session asking for a MIG profile that no idle instance satisfies has one made for it on a
//! GPU its node's operator made reconfigurable.
//!
//! The pass finds no room for the session; the controller then chooses a placement on one of
//! the node's reconfigurable GPUs ([`choose_placement`]), books its slices for the session, and
//! orders the node's agent to make the instance ([`Command::MakeMigInstance`]). The session
//! keeps waiting. The agent registers again once the instance is made, its report listing it;
//! the booking goes and the next pass places the session on the instance like on any other,
//! trying it before every other session until it is placed (the instance is its own: another
//! session of the profile would otherwise take it first and have it made again).
//! An agent that refuses (an `AllocationNack` with reason [`REFUSED`]) frees the booking, and
//! that node is not asked again for that session; its reason says why.
//!
//! Bookings are kept in memory only: a controller that restarts forgets them, and an instance
//! made meanwhile is found in its node's report like any other.

use std::collections::BTreeMap;

use gpuwarden_types::mig::slice_mask;

use super::{Command, Scheduler};
use crate::{
    allocator::{
        GpuRequest,
        mig::{MigGpuLayout, MigPlacement, choose_placement},
    },
    node::{Node, NodeState},
    session::SessionState,
    slots::{ResourceSlot, names},
};

/// The reason an agent's `AllocationNack` gives when it refuses to make an instance.
pub const REFUSED: &str = "MigInstanceRefused";

/// An instance asked of a node for a waiting session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigBooking {
    /// The node asked.
    pub node: String,
    /// Where the instance goes.
    pub placement: MigPlacement,
}

/// The bookings, the instances made and not yet taken, and the nodes that refused.
#[derive(Debug, Clone, Default)]
pub(super) struct MigDemand {
    /// By session.
    booked: Bookings,
    /// Bookings whose instance its node reports made, by session: the session is tried before
    /// the others in each pass until it is placed, so no other session of its profile takes
    /// the instance first.
    made: BTreeMap<String, MigBooking>,
    /// Nodes that refused to make an instance for a session, by session, with what they said.
    refused: BTreeMap<String, BTreeMap<String, String>>,
}

/// `layouts` with the slices of `booked` held too, so that no two sessions are given the same
/// slices while their instances are being made.
fn less_booked<'a>(
    layouts: &[MigGpuLayout],
    booked: impl Iterator<Item = &'a MigPlacement>,
) -> Vec<MigGpuLayout> {
    let mut out = layouts.to_vec();
    for b in booked {
        if let Some(l) = out.iter_mut().find(|l| l.gpu_uuid == b.gpu_uuid)
            && !l.occupied.contains(&(b.start, b.size))
        {
            l.occupied.push((b.start, b.size));
        }
    }
    // What the agent called free is checked against the bookings too.
    for l in &mut out {
        let held = l.occupied.clone();
        for p in &mut l.profiles {
            let size = p.size;
            p.free
                .retain(|&s| !held.iter().any(|&(hs, hz)| s < hs + hz && hs < s + size));
        }
    }
    out
}

/// The bookings by session, and by node: each node's placements and the memory slices they hold
/// on each GPU. The scheduler walks every node for each session that orders an instance; the
/// index spares it gathering each node's bookings from all of them again at each node.
#[derive(Debug, Clone, Default)]
struct Bookings {
    by_session: BTreeMap<String, MigBooking>,
    by_node: BTreeMap<String, NodeBookings>,
}

/// One node's bookings.
#[derive(Debug, Clone, Default)]
struct NodeBookings {
    placements: Vec<MigPlacement>,
    /// The memory slices held, by GPU UUID.
    slices: BTreeMap<String, u64>,
}

impl NodeBookings {
    /// Whether a GPU of `layouts` has a start of `profile` free that no booking overlaps.
    fn room_in(&self, layouts: &[MigGpuLayout], profile: &str) -> bool {
        layouts.iter().any(|l| {
            let held = self.slices.get(&l.gpu_uuid).copied().unwrap_or(0);
            l.profiles
                .iter()
                .filter(|p| p.profile == profile)
                .any(|p| p.free.iter().any(|&s| held & slice_mask(s, p.size) == 0))
        })
    }

    fn add(&mut self, p: &MigPlacement) {
        *self.slices.entry(p.gpu_uuid.clone()).or_default() |= slice_mask(p.start, p.size);
        self.placements.push(p.clone());
    }
}

impl Bookings {
    fn get(&self, session: &str) -> Option<&MigBooking> {
        self.by_session.get(session)
    }

    fn on(&self, node: &str) -> Option<&NodeBookings> {
        self.by_node.get(node)
    }

    fn insert(&mut self, session: String, b: MigBooking) {
        self.by_node
            .entry(b.node.clone())
            .or_default()
            .add(&b.placement);
        if let Some(old) = self.by_session.insert(session, b) {
            // Not how the scheduler books (one booking a session), but kept true.
            self.unindex(&old);
        }
    }

    fn remove(&mut self, session: &str) -> Option<MigBooking> {
        let b = self.by_session.remove(session)?;
        self.unindex(&b);
        Some(b)
    }

    fn retain(&mut self, mut keep: impl FnMut(&String, &MigBooking) -> bool) {
        let mut gone = Vec::new();
        self.by_session.retain(|id, b| {
            let kept = keep(id, b);
            if !kept {
                gone.push(b.clone());
            }
            kept
        });
        for b in &gone {
            self.unindex(b);
        }
    }

    /// Takes `b` out of its node's entry (its GPU's slices from the node's other bookings).
    fn unindex(&mut self, b: &MigBooking) {
        let Some(on) = self.by_node.get_mut(&b.node) else {
            return;
        };
        if let Some(i) = on.placements.iter().position(|p| *p == b.placement) {
            on.placements.swap_remove(i);
        }
        let gpu = &b.placement.gpu_uuid;
        let held = on
            .placements
            .iter()
            .filter(|p| p.gpu_uuid == *gpu)
            .fold(0, |m, p| m | slice_mask(p.start, p.size));
        if held == 0 {
            on.slices.remove(gpu);
        } else {
            on.slices.insert(gpu.clone(), held);
        }
        if on.placements.is_empty() {
            self.by_node.remove(&b.node);
        }
    }
}

/// The profile (`1g.18gb`) of layout profile names whose slot is `slot` (`cuda.mig.1g.18gb`).
fn profile_of_slot(layouts: &[MigGpuLayout], slot: &str) -> Option<String> {
    layouts
        .iter()
        .flat_map(|l| &l.profiles)
        .find(|p| names::is_mig_slot(slot, &p.profile))
        .map(|p| p.profile.clone())
}

/// Whether `node` could make an instance for `requested` (a single instance of one profile
/// its reconfigurable GPUs can hold, with the rest of the request within its capacity):
/// such a request is not too large for the cluster even with no instance of it yet.
#[must_use]
pub fn could_make(node: &Node, requested: &ResourceSlot) -> bool {
    let Ok(gpu) = GpuRequest::from_slots(requested) else {
        return false;
    };
    let Some(slot) = gpu.profile.as_deref() else {
        return false;
    };
    gpu.devices == 1
        && profile_of_slot(&node.report.mig_layouts, slot).is_some()
        && Node::non_gpu(requested).fits_in(&node.report.capacity)
}

impl Scheduler {
    /// For pending session `id`, which found no room: when it asks for one instance of a MIG
    /// profile, the order to make one on a reconfigurable GPU (with its reason to wait), or,
    /// when one is already asked for it, only the reason. `None`: not such a request, or no
    /// node can make one.
    pub(super) fn mig_on_demand(&mut self, id: &str) -> Option<(Option<Command>, String)> {
        let session = self.sessions.get(id)?;
        let gpu = GpuRequest::from_slots(&session.requested).ok()?;
        let slot = gpu.profile.clone()?;
        if gpu.devices != 1 {
            return None;
        }
        // Bookings of sessions no longer waiting were dropped at the pass's start
        // (`mig_made_first`); one placed since keeps its slices until the next pass.
        // A node that went away with the order: asked elsewhere (or again once it is back).
        let gone = |node: &str| {
            self.nodes
                .get(node)
                .is_none_or(|n| n.state != NodeState::Ready)
        };
        if self.mig.booked.get(id).is_some_and(|b| gone(&b.node)) {
            self.mig.booked.remove(id);
        }
        let session = self.sessions.get(id)?;
        if let Some(b) = self.mig.booked.get(id) {
            let p = &b.placement;
            return Some((
                None,
                format!(
                    "waiting for node {} to make a {} instance on GPU {} (memory slices {}-{})",
                    b.node,
                    p.profile,
                    p.gpu_index,
                    p.start,
                    p.start + p.size - 1
                ),
            ));
        }
        let non_gpu = Node::non_gpu(&session.requested);
        let refused = self.mig.refused.get(id);
        let nothing = NodeBookings::default();
        let mut chosen = None;
        for (nid, n) in &self.nodes {
            if n.state != NodeState::Ready
                || n.report.mig_layouts.is_empty()
                || session.pinned_node.as_ref().is_some_and(|p| p != nid)
                || refused.is_some_and(|r| r.contains_key(nid))
                || !(non_gpu.is_zero() || n.non_gpu_fits(&non_gpu))
            {
                continue;
            }
            let Some(profile) = profile_of_slot(&n.report.mig_layouts, &slot) else {
                continue;
            };
            let booked = self.mig.booked.on(nid).unwrap_or(&nothing);
            // A node with no start of the profile left free is passed over before its layouts
            // are copied: in a busy pass most nodes are.
            if !booked.room_in(&n.report.mig_layouts, &profile) {
                continue;
            }
            let layouts = less_booked(&n.report.mig_layouts, booked.placements.iter());
            if let Some(placement) = choose_placement(&layouts, &profile) {
                chosen = Some((nid.clone(), placement));
                break;
            }
        }
        let Some((node, placement)) = chosen else {
            // Still waiting: the refusal stays its reason until something else can be done.
            let (node, said) = refused?.iter().next_back()?;
            return Some((
                None,
                format!("node {node} refused to make a MIG instance for it: {said}"),
            ));
        };
        let reason = format!(
            "node {node} is making a {} instance for it on GPU {} (memory slices {}-{})",
            placement.profile,
            placement.gpu_index,
            placement.start,
            placement.start + placement.size - 1
        );
        let command = Command::MakeMigInstance {
            node: node.clone(),
            session: id.to_owned(),
            gpu_uuid: placement.gpu_uuid.clone(),
            profile: placement.profile.clone(),
            start: placement.start,
        };
        tracing::info!(session = id, %node, gpu = %placement.gpu_uuid, profile = %placement.profile, start = placement.start, "asking for a MIG instance");
        self.mig
            .booked
            .insert(id.to_owned(), MigBooking { node, placement });
        Some((Some(command), reason))
    }

    /// Node `node` registered: bookings whose instance its report now holds go (the session is
    /// placed on it as on any instance); those of sessions no longer waiting go; the others on
    /// it are asked again (the order may have been lost with the stream).
    pub(super) fn mig_registered(&mut self, node: &str) -> Vec<Command> {
        let Some(n) = self.nodes.get(node) else {
            return Vec::new();
        };
        let layouts = n.report.mig_layouts.clone();
        let mut again = Vec::new();
        let made_for = &mut self.mig.made;
        let sessions = &self.sessions;
        // Only this node's bookings are looked at, the others at the next pass's start
        // (`mig_made_first` prunes): a registration costs the node's bookings, not every one.
        self.mig.booked.retain(|session, b| {
            if b.node != node {
                return true;
            }
            if sessions
                .get(session)
                .is_none_or(|s| s.state != SessionState::Pending)
            {
                return false;
            }
            let p = &b.placement;
            let made = layouts
                .iter()
                .any(|l| l.gpu_uuid == p.gpu_uuid && l.occupied.contains(&(p.start, p.size)));
            let listed = layouts.iter().any(|l| l.gpu_uuid == p.gpu_uuid);
            if !made && listed {
                again.push(Command::MakeMigInstance {
                    node: node.to_owned(),
                    session: session.clone(),
                    gpu_uuid: p.gpu_uuid.clone(),
                    profile: p.profile.clone(),
                    start: p.start,
                });
            }
            if made {
                made_for.insert(session.clone(), b.clone());
            }
            !made && listed
        });
        again
    }

    /// `order` with the sessions whose instance was made for them first (in `order`'s order
    /// among themselves): each is tried before a session that could take its instance.
    pub(super) fn mig_made_first(&mut self, order: Vec<String>) -> Vec<String> {
        self.mig_prune();
        let nodes = &self.nodes;
        self.mig.made.retain(|_, b| {
            nodes
                .get(&b.node)
                .is_some_and(|n| n.state == NodeState::Ready)
        });
        if self.mig.made.is_empty() {
            return order;
        }
        let (mut first, rest): (Vec<String>, Vec<String>) = order
            .into_iter()
            .partition(|id| self.mig.made.contains_key(id));
        first.extend(rest);
        first
    }

    /// Node `node` refused to make the instance for `session` (`reason` [`REFUSED`]): the
    /// booking goes, the node is not asked again for it, and its reason says why. Whether the
    /// refusal was one of these.
    pub(super) fn mig_refused(
        &mut self,
        node: &str,
        session: &str,
        reason: &str,
        message: &str,
    ) -> bool {
        if reason != REFUSED || self.mig.booked.get(session).is_none_or(|b| b.node != node) {
            return false;
        }
        self.mig.booked.remove(session);
        self.mig
            .refused
            .entry(session.to_owned())
            .or_default()
            .insert(node.to_owned(), message.to_owned());
        let why = format!("node {node} refused to make a MIG instance for it: {message}");
        tracing::warn!(session, node, "{why}");
        if let Some(s) = self.sessions.get_mut(session) {
            s.reason = why;
            self.changes.sessions.insert(session.to_owned());
        }
        true
    }

    /// Drops the bookings and refusals of sessions no longer waiting.
    fn mig_prune(&mut self) {
        let sessions = &self.sessions;
        let waiting = |id: &String| {
            sessions
                .get(id)
                .is_some_and(|s| s.state == SessionState::Pending)
        };
        self.mig.booked.retain(|id, _| waiting(id));
        self.mig.made.retain(|id, _| waiting(id));
        self.mig.refused.retain(|id, _| waiting(id));
    }

    /// The instances asked for and not yet reported made, by session.
    #[must_use]
    pub fn mig_bookings(&self) -> BTreeMap<String, MigBooking> {
        self.mig.booked.by_session.clone()
    }
}

#[cfg(test)]
mod tests;
