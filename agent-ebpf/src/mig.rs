//! MIG instances: a client that subscribes to a GPU instance (`AMPERE_SMC_PARTITION_REF` under
//! its subdevice, with the instance's `swizzId`) has its video memory on that GPU counted as the
//! instance's device index, which the agent writes in [`MIG_INSTANCES`] (docs/mig.md).

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap},
};
use gpuwarden_agent_common::{
    maps::{DEVICE_UNKNOWN, HandleKey, MAX_GPUS},
    mig::{CapKey, MAX_CAP_GRANTS, MAX_INSTANCES, MigKey, Partition},
};

use crate::maps::{CLIENTS, OBJECT_DEVICES};

/// The device index of each GPU instance, by (parent GPU, GPU instance id), written by the agent.
#[map(name = "MIG_INSTANCES")]
pub static MIG_INSTANCES: HashMap<MigKey, u32> = HashMap::with_max_entries(MAX_INSTANCES, 0);

/// Each client's subscription to a GPU instance. LRU: a client freed without the programs
/// seeing it (its file closed) leaves an entry that only the generation check ignores; the
/// oldest such go first.
#[map(name = "CLIENT_PARTITIONS")]
pub static CLIENT_PARTITIONS: LruHashMap<u32, Partition> = LruHashMap::with_max_entries(16_384, 0);

/// The major of the capability nodes (`nvidia-caps` in `/proc/devices`), written by the agent;
/// 0: none known, and capability nodes are left to the other device programs.
#[map(name = "MIG_CAPS_MAJOR")]
pub static MIG_CAPS_MAJOR: Array<u32> = Array::with_max_entries(1, 0);

/// The capability nodes each bound cgroup's quota may open, written by the agent.
#[map(name = "CAP_ACCESS")]
pub static CAP_ACCESS: HashMap<CapKey, u32> = HashMap::with_max_entries(MAX_CAP_GRANTS, 0);

/// The capability nodes' major, 0 when none is known.
#[inline(always)]
pub fn caps_major() -> u32 {
    MIG_CAPS_MAJOR.get(0).copied().unwrap_or(0)
}

/// Whether quota `quota`'s cgroups may open capability node `minor`.
#[inline(always)]
pub fn cap_allowed(quota: u64, minor: u32) -> bool {
    let key = CapKey {
        quota,
        minor,
        _pad: 0,
    };
    // SAFETY: only whether an entry exists is read.
    unsafe { CAP_ACCESS.get(key) }.is_some()
}

/// `client` subscribed, through its subdevice `subdevice`, to GPU instance `gpu_instance`:
/// remembers the instance's device index for its video memory, where the agent listed the
/// instance (a GPU the agent doesn't know is left counted as the GPU).
#[inline(always)]
pub fn subscribed(client: u32, subdevice: u32, gpu_instance: u32) {
    // SAFETY: the value is copied out at once.
    let Some(object) = (unsafe {
        OBJECT_DEVICES.get(HandleKey {
            client,
            handle: subdevice,
        })
    })
    .copied() else {
        return;
    };
    let key = MigKey {
        gpu: object.gpu,
        gpu_instance,
    };
    // SAFETY: as above.
    let Some(&instance) = (unsafe { MIG_INSTANCES.get(key) }) else {
        return;
    };
    let partition = Partition {
        instance,
        device_handle: object.device,
        client_generation: generation(client),
    };
    let _ = CLIENT_PARTITIONS.insert(client, partition, 0);
}

/// The device video memory of `client` under device object `device_handle` on GPU `gpu` is
/// counted as: its GPU instance's index when the client subscribed to one through that device,
/// else `gpu`.
#[inline(always)]
#[expect(
    clippy::cast_possible_truncation,
    reason = "`MAX_GPUS` is a small constant"
)]
pub fn device_of(client: u32, device_handle: u32, gpu: u32) -> u32 {
    // SAFETY: the value is copied out at once.
    match unsafe { CLIENT_PARTITIONS.get(client) } {
        Some(p)
            if p.device_handle == device_handle
                && p.client_generation == generation(client)
                && gpu != DEVICE_UNKNOWN =>
        {
            // The agent writes only indexes below MAX_GPUS; the mask keeps that bound where the
            // verifier sees it (the quota check indexes its per-GPU arrays with it).
            p.instance & (MAX_GPUS as u32 - 1)
        }
        _ => gpu,
    }
}

/// `client` was freed: its subscription goes with it.
#[inline(always)]
pub fn forget(client: u32) {
    let _ = CLIENT_PARTITIONS.remove(client);
}

/// The tracked client's generation, 0 when it is not tracked.
#[inline(always)]
fn generation(client: u32) -> u64 {
    CLIENTS.get_ptr(client).map_or(0, |c| {
        // SAFETY: a live map value.
        unsafe { (*c).generation }
    })
}
