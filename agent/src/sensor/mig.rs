//! Which device index each MIG GPU instance is counted as, written for the programs
//! (`MIG_INSTANCES`, `agent-ebpf/src/mig.rs`; docs/mig.md).

use gpuwarden_agent_common::{maps::MAX_GPUS, mig::MigKey};

use crate::devices::GpuDevice;

/// The (parent GPU, GPU instance) → device index entries for `devices`. A GPU instance is
/// counted as its first compute instance's index (memory belongs to the GPU instance); an
/// instance numbered past the programs' per-GPU arrays is left out (its memory then counts as
/// its parent's index) and named in the second list.
#[must_use]
pub fn entries(devices: &[GpuDevice]) -> (Vec<(MigKey, u32)>, Vec<String>) {
    let mut out: Vec<(MigKey, u32)> = Vec::new();
    let mut left_out = Vec::new();
    for d in devices {
        let Some(m) = &d.mig else { continue };
        let key = MigKey {
            gpu: m.parent_index,
            gpu_instance: m.gpu_instance,
        };
        if out.iter().any(|(k, _)| *k == key) {
            continue;
        }
        if d.index as usize >= MAX_GPUS {
            left_out.push(d.uuid.clone());
            continue;
        }
        out.push((key, d.index));
    }
    (out, left_out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(index: u32, gi: u32, ci: u32) -> GpuDevice {
        crate::devices::mig::test_instance(index, gi, ci, "1g.18gb")
    }

    #[test]
    fn each_gpu_instance_is_its_first_compute_instance() {
        let mut whole = instance(0, 0, 0);
        whole.mig = None;
        let devices = [
            whole,
            instance(2, 9, 0),
            instance(3, 9, 1),
            instance(4, 10, 0),
            instance(16, 11, 0),
        ];
        let (entries, left_out) = entries(&devices);
        let key = |gi| MigKey {
            gpu: 1,
            gpu_instance: gi,
        };
        assert_eq!(entries, [(key(9), 2), (key(10), 4)]);
        assert_eq!(left_out, ["MIG-16"]);
    }
}
