//! MIG instances made on demand (issue 37 §3, docs/mig.md "Instances made on demand"): a
//! session asking for a MIG profile that no idle instances satisfy has them made for it on
//! GPUs its node's operator made reconfigurable.
//!
//! The pass finds no room for the session; the controller then chooses, on one node, a
//! placement for each instance the session lacks there (what it asks less the node's idle
//! instances of the profile) on the node's reconfigurable GPUs ([`choose_placement`], one after
//! another), books their slices for the session, and orders the node's agent to make each
//! ([`Command::MakeMigInstance`]). The session keeps waiting. The agent registers again after
//! each instance it makes, its report listing it; once every one is listed the booking goes
//! and the next pass places the session on the instances like on any others, trying it before
//! every other session until it is placed (the instances are its own: another session of the
//! profile would otherwise take them first and have them made again).
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
        mig::{MigGpuLayout, MigPlacement, choose_placement, most_instances},
    },
    node::{Node, NodeState},
    session::SessionState,
    slots::{ResourceSlot, names},
};

/// The reason an agent's `AllocationNack` gives when it refuses to make an instance.
pub const REFUSED: &str = "MigInstanceRefused";

/// The instances asked of a node for a waiting session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigBooking {
    /// The node asked.
    pub node: String,
    /// Where each instance goes (one or more, on one node).
    pub placements: Vec<MigPlacement>,
}

impl MigBooking {
    /// The placements, for a reason: `a 2g.20gb instance on GPU 1 (memory slices 0-1)`, or
    /// `2 1g.10gb instances on GPU 1 (memory slices 0-0, 1-1)`.
    fn describe(&self) -> String {
        let Some(first) = self.placements.first() else {
            return "no instance".to_owned();
        };
        let gpus: std::collections::BTreeSet<u32> =
            self.placements.iter().map(|p| p.gpu_index).collect();
        let on = if gpus.len() > 1 { "GPUs" } else { "GPU" };
        let gpus = gpus
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let slices = self
            .placements
            .iter()
            .map(|p| format!("{}-{}", p.start, p.start + p.size - 1))
            .collect::<Vec<_>>()
            .join(", ");
        let what = match self.placements.len() {
            1 => format!("a {} instance", first.profile),
            n => format!("{n} {} instances", first.profile),
        };
        format!("{what} on {on} {gpus} (memory slices {slices})")
    }

    /// The orders that make its instances (`session`'s).
    fn orders(&self, session: &str) -> impl Iterator<Item = Command> + '_ {
        let session = session.to_owned();
        self.placements
            .iter()
            .map(move |p| Command::MakeMigInstance {
                node: self.node.clone(),
                session: session.clone(),
                gpu_uuid: p.gpu_uuid.clone(),
                profile: p.profile.clone(),
                start: p.start,
            })
    }
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
        let on = self.by_node.entry(b.node.clone()).or_default();
        for p in &b.placements {
            on.add(p);
        }
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

    /// Takes `b` out of its node's entry (its GPUs' slices from the node's other bookings).
    fn unindex(&mut self, b: &MigBooking) {
        let Some(on) = self.by_node.get_mut(&b.node) else {
            return;
        };
        for placement in &b.placements {
            if let Some(i) = on.placements.iter().position(|p| p == placement) {
                on.placements.swap_remove(i);
            }
        }
        for gpu in b.placements.iter().map(|p| &p.gpu_uuid) {
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

/// Whether `layouts` (a node's report) hold an instance at placement `p`.
fn is_made(layouts: &[MigGpuLayout], p: &MigPlacement) -> bool {
    layouts
        .iter()
        .any(|l| l.gpu_uuid == p.gpu_uuid && l.occupied.contains(&(p.start, p.size)))
}

/// The node's idle instances of profile slot `slot` (`cuda.mig.1g.18gb`).
fn idle_instances(node: &Node, slot: &str) -> usize {
    node.allocator
        .devices()
        .iter()
        .filter(|d| d.is_idle() && d.profile.as_deref() == Some(slot))
        .count()
}

/// Whether `node` could hold `requested` once instances are made (instances of one profile,
/// no more than its other GPUs' instances of it and its reconfigurable GPUs emptied could hold,
/// with the rest of the request within its capacity): such a request is not too large for the
/// cluster even with no instance of it yet.
#[must_use]
pub fn could_make(node: &Node, requested: &ResourceSlot) -> bool {
    let Ok(gpu) = GpuRequest::from_slots(requested) else {
        return false;
    };
    let Some(slot) = gpu.profile.as_deref() else {
        return false;
    };
    let layouts = &node.report.mig_layouts;
    let Some(profile) = profile_of_slot(layouts, slot) else {
        return false;
    };
    let elsewhere = node
        .allocator
        .devices()
        .iter()
        .filter(|d| {
            d.profile.as_deref() == Some(slot)
                && !layouts.iter().any(|l| l.gpu_uuid == d.spec.parent_uuid)
        })
        .count();
    let made: u32 = layouts.iter().map(|l| most_instances(l, &profile)).sum();
    u64::try_from(elsewhere).unwrap_or(u64::MAX) + u64::from(made) >= u64::from(gpu.devices)
        && Node::non_gpu(requested).fits_in(&node.report.capacity)
}

impl Scheduler {
    /// For pending session `id`, which found no room: when it asks for instances of a MIG
    /// profile, the orders to make those it lacks on one node's reconfigurable GPUs (with its
    /// reason to wait), or, when they are already asked for it, only the reason. `None`: not
    /// such a request, or no node can make them.
    pub(super) fn mig_on_demand(&mut self, id: &str) -> Option<(Vec<Command>, String)> {
        let (slot, wanted) = self.asked_instances(id)?;
        self.drop_booking_on_gone_node(id);
        if let Some(b) = self.mig.booked.get(id) {
            return Some((
                Vec::new(),
                format!("waiting for node {} to make {}", b.node, b.describe()),
            ));
        }
        let Some(booking) = self.find_booking(id, &slot, wanted, true) else {
            // Still waiting: the refusal stays its reason until something else can be done.
            let (node, said) = self.mig.refused.get(id)?.iter().next_back()?;
            return Some((
                Vec::new(),
                format!("node {node} refused to make a MIG instance for it: {said}"),
            ));
        };
        let reason = format!(
            "node {} is making {} for it",
            booking.node,
            booking.describe()
        );
        let orders = self.book(id, booking);
        Some((orders, reason))
    }

    /// For a gang whose members found no room together: the orders that make the instances of
    /// every member asking for a MIG profile that has none booked or made, all or none (a gang
    /// that can't have all made keeps waiting with nothing asked), with the gang's reason to
    /// wait. `None`: no member waits for an instance (none asks for a profile, or all of theirs
    /// are made), or no node can make what one lacks.
    ///
    /// Unlike a single session's, a member's booking does not count the node's idle instances
    /// of its profile: the gang's other members may be counting the same ones. What is made
    /// beyond need is destroyed by its agent once no one takes it.
    pub(super) fn mig_gang_on_demand(
        &mut self,
        members: &[String],
    ) -> Option<(Vec<Command>, String)> {
        let asking: Vec<(String, String, usize)> = members
            .iter()
            .filter_map(|id| {
                let (slot, wanted) = self.asked_instances(id)?;
                Some((id.clone(), slot, wanted))
            })
            .collect();
        if asking.is_empty() {
            return None;
        }
        let mut orders = Vec::new();
        let mut booked_now: Vec<String> = Vec::new();
        for (id, slot, wanted) in &asking {
            self.drop_booking_on_gone_node(id);
            // Booked, or made and waiting for the others: nothing more to ask for it.
            if self.mig.booked.get(id).is_some() || self.made_still_there(id) {
                continue;
            }
            let Some(booking) = self.find_booking(id, slot, *wanted, false) else {
                for id in &booked_now {
                    self.mig.booked.remove(id);
                }
                return None;
            };
            orders.extend(self.book(id, booking));
            booked_now.push(id.clone());
        }
        let waiting = asking
            .iter()
            .filter(|(id, ..)| self.mig.booked.get(id).is_some())
            .count();
        // Every member's instances made: what the gang lacks is something else (reclaim's).
        (waiting > 0).then(|| {
            (
                orders,
                format!("MIG instances being made for {waiting} of its members"),
            )
        })
    }

    /// Whether the instances made for session `id` are still on its node (an agent destroys one
    /// no session took within its grace).
    fn made_still_there(&self, id: &str) -> bool {
        let Some(b) = self.mig.made.get(id) else {
            return false;
        };
        let Some(n) = self.nodes.get(&b.node) else {
            return false;
        };
        b.placements
            .iter()
            .all(|p| is_made(&n.report.mig_layouts, p))
    }

    /// The profile slot and number of instances session `id` asks for, if it asks for a MIG
    /// profile.
    fn asked_instances(&self, id: &str) -> Option<(String, usize)> {
        let session = self.sessions.get(id)?;
        let gpu = GpuRequest::from_slots(&session.requested).ok()?;
        let slot = gpu.profile?;
        Some((slot, usize::try_from(gpu.devices).ok()?))
    }

    /// Drops `id`'s booking if its node went away with the order: asked elsewhere (or again
    /// once it is back). Bookings of sessions no longer waiting were dropped at the pass's start
    /// (`mig_made_first`); one placed since keeps its slices until the next pass.
    fn drop_booking_on_gone_node(&mut self, id: &str) {
        let gone = |node: &str| {
            self.nodes
                .get(node)
                .is_none_or(|n| n.state != NodeState::Ready)
        };
        if self.mig.booked.get(id).is_some_and(|b| gone(&b.node)) {
            self.mig.booked.remove(id);
        }
    }

    /// Books `booking` for session `id`; the orders that make its instances.
    fn book(&mut self, id: &str, booking: MigBooking) -> Vec<Command> {
        let orders: Vec<Command> = booking.orders(id).collect();
        tracing::info!(session = id, node = %booking.node, "asking for {}", booking.describe());
        self.mig.booked.insert(id.to_owned(), booking);
        orders
    }

    /// The first ready node session `id` may go to (its pin, its non-GPU slots, no refusal for
    /// it) where `wanted` instances of profile slot `slot` can be had, and the placements of
    /// those to make there: what the node's idle ones lack where `count_idle`, else all of
    /// them; each placement chosen with the ones before it and every other booking held.
    fn find_booking(
        &self,
        id: &str,
        slot: &str,
        wanted: usize,
        count_idle: bool,
    ) -> Option<MigBooking> {
        let session = self.sessions.get(id)?;
        let non_gpu = Node::non_gpu(&session.requested);
        let refused = self.mig.refused.get(id);
        let nothing = NodeBookings::default();
        for (nid, n) in &self.nodes {
            if n.state != NodeState::Ready
                || n.report.mig_layouts.is_empty()
                || session.pinned_node.as_ref().is_some_and(|p| p != nid)
                || refused.is_some_and(|r| r.contains_key(nid))
                || !(non_gpu.is_zero() || n.non_gpu_fits(&non_gpu))
            {
                continue;
            }
            let Some(profile) = profile_of_slot(&n.report.mig_layouts, slot) else {
                continue;
            };
            let booked = self.mig.booked.on(nid).unwrap_or(&nothing);
            // A node with no start of the profile left free is passed over before its layouts
            // are copied: in a busy pass most nodes are.
            if !booked.room_in(&n.report.mig_layouts, &profile) {
                continue;
            }
            // A node with enough idle ones failed for another reason: making more won't help.
            let idle = if count_idle {
                idle_instances(n, slot)
            } else {
                0
            };
            let lacking = wanted.saturating_sub(idle);
            if lacking == 0 {
                continue;
            }
            let mut layouts = less_booked(&n.report.mig_layouts, booked.placements.iter());
            let mut placements = Vec::with_capacity(lacking);
            while placements.len() < lacking {
                let Some(placement) = choose_placement(&layouts, &profile) else {
                    break;
                };
                layouts = less_booked(&layouts, std::iter::once(&placement));
                placements.push(placement);
            }
            if placements.len() == lacking {
                return Some(MigBooking {
                    node: nid.clone(),
                    placements,
                });
            }
        }
        None
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
            let made = |p: &MigPlacement| is_made(&layouts, p);
            let listed = b
                .placements
                .iter()
                .all(|p| layouts.iter().any(|l| l.gpu_uuid == p.gpu_uuid));
            let all_made = b.placements.iter().all(made);
            if all_made {
                made_for.insert(session.clone(), b.clone());
            } else if listed {
                again.extend(
                    b.orders(session)
                        .zip(&b.placements)
                        .filter(|(_, p)| !made(p))
                        .map(|(order, _)| order),
                );
            }
            !all_made && listed
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
