//! What the node tells the controller when it registers: its slot types and capacity, its GPUs,
//! the MIG layouts it may change, and the sessions it holds.

use gpuwarden_proto::{convert, v1 as pb};
use gpuwarden_types::slot::names;

use super::LinkConfig;
use crate::{control::observed::Observed, devices::GpuBackend};

/// Host CPUs and memory.
fn host_capacity() -> (u64, u64) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let mem_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    (cpus, mem_kib * 1024)
}

/// The registration message for this node; with `observed`, the GPUs it offers to Kubernetes
/// and the claims held on them too.
#[must_use]
pub fn node_info(
    config: &LinkConfig,
    backend: &dyn GpuBackend,
    running: Vec<String>,
    observed: Option<&Observed>,
) -> pb::NodeInfo {
    let (cpus, mem) = host_capacity();
    let mut slot_types = vec![
        pb::SlotType {
            name: names::CPU.into(),
            kind: pb::SlotKind::Count.into(),
        },
        pb::SlotType {
            name: names::MEM.into(),
            kind: pb::SlotKind::Bytes.into(),
        },
    ];
    slot_types.extend(
        backend
            .slot_types()
            .into_iter()
            .map(|(name, kind)| pb::SlotType {
                name,
                kind: convert::kind_to_pb(kind).into(),
            }),
    );
    let mut capacity: std::collections::HashMap<String, String> = [
        (names::CPU.to_owned(), cpus.to_string()),
        (names::MEM.to_owned(), mem.to_string()),
    ]
    .into();
    capacity.extend(backend.extra_capacity());
    // How many instances of each MIG profile the node offers (its GPU slots follow from the
    // devices; a profile is counted here, where the controller keeps the other slots).
    capacity.extend(crate::devices::mig::slot_capacity(&backend.devices()));
    // The GPUs the operator lets gpuwarden cut (issue 37 §3): each profile they can make is a
    // slot type the node declares, even with no instance of it yet.
    let mig_layouts =
        crate::devices::ondemand::Reconfigurer::new(config.mig_reconfigurable.iter().cloned())
            .layouts(backend);
    let mut declare = |name: String, kind: pb::SlotKind| {
        if !slot_types.iter().any(|t| t.name == name) {
            slot_types.push(pb::SlotType {
                name,
                kind: kind.into(),
            });
        }
    };
    for p in mig_layouts.iter().flat_map(|l| &l.profiles) {
        declare(
            crate::devices::mig::slot_name(&p.profile),
            pb::SlotKind::Count,
        );
    }
    // A node whose GPUs are all cut on demand may have no device yet; a request for an
    // instance with a memory limit in it (`cuda.mem`) still names the GPU slots.
    if !mig_layouts.is_empty() {
        for &(name, kind) in &gpuwarden_types::slot::names::GPU_SLOTS {
            declare(name.to_owned(), convert::kind_to_pb(kind));
        }
    }
    pb::NodeInfo {
        node_id: config.node_id.clone(),
        hostname: config.hostname.clone(),
        slot_types,
        capacity: Some(pb::ResourceSlot { values: capacity }),
        devices: backend.devices().iter().map(device_to_pb).collect(),
        hooks: config.hooks.clone(),
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        running_sessions: running,
        kubernetes_devices: observed
            .map(Observed::kubernetes_devices)
            .unwrap_or_default(),
        observed_sessions: observed.map(Observed::registration).unwrap_or_default(),
        mig_layouts: mig_layouts.iter().map(convert::mig_layout_to_pb).collect(),
    }
}

/// A GPU as the registration names it.
#[must_use]
pub fn device_to_pb(d: &crate::devices::GpuDevice) -> pb::Device {
    pb::Device {
        uuid: d.uuid.clone(),
        model: d.model.clone(),
        memory_bytes: d.memory_bytes,
        numa_node: d.numa_node,
        sm_count: d.sm_count,
        is_mig: d.is_mig,
        index: d.index,
        device_node: d.device_node.clone(),
        parent_uuid: d
            .mig
            .as_ref()
            .map(|m| m.parent_uuid.clone())
            .unwrap_or_default(),
    }
}
