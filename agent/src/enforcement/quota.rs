//! Quotas: what an allocation from the controller asks the node to enforce, checked before the
//! agent accepts it.
//!
//! A [`QuotaSpec`] is derived from an `Allocate` and the node's devices: per GPU a memory limit
//! (from `cuda.mem`, or shares × the device's memory when only shares are given) and a compute
//! share, the workload it binds to, and the policies. Anything that can't be enforced is refused
//! with a reason (the agent nacks `InvalidQuota`), never half-applied.

use gpuwarden_agent_common::maps::{MAX_GPUS, memory_policy};
use gpuwarden_proto::{convert, v1 as pb};
use gpuwarden_types::slot::SlotValue;
pub use gpuwarden_types::{
    policy::{ComputePolicy, MemoryPolicy, PolicyError, QuotaPolicy},
    target::{Target, TargetError, TargetScope},
};
use serde::{Deserialize, Serialize};

use crate::devices::GpuDevice;

/// The kernel side's code for a memory policy ([`memory_policy`]).
#[must_use]
pub const fn kernel_code(policy: MemoryPolicy) -> u32 {
    match policy {
        MemoryPolicy::Kill => memory_policy::KILL,
        MemoryPolicy::Stop => memory_policy::STOP,
        MemoryPolicy::Report => memory_policy::REPORT,
    }
}

/// Parts per million of one GPU: the exact unit compute shares travel in here.
pub const PPM: u32 = 1_000_000;

// A slot value's micro-units are parts per million: `parse_share` reads them as such.
const _: () = assert!(PPM as u128 == gpuwarden_types::slot::SCALE);

/// Why an allocation's quota can't be enforced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// A memory or compute policy nobody knows.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A policy message naming none (an unknown name or number, or a string and an enum that
    /// disagree).
    #[error(transparent)]
    WirePolicy(#[from] convert::PolicyFieldError),
    /// A share that is not a decimal number.
    #[error("GPU {index}: share {value:?} is not a decimal number")]
    Share {
        /// GPU index.
        index: u32,
        /// The value given.
        value: String,
    },
    /// A negative share.
    #[error("GPU {index}: share {value} must not be negative")]
    NegativeShare {
        /// GPU index.
        index: u32,
        /// The value given.
        value: String,
    },
    /// More than the whole of one device.
    #[error("GPU {index}: share {value} is more than one whole device")]
    ShareAboveOne {
        /// GPU index.
        index: u32,
        /// The value given.
        value: String,
    },
    /// A memory limit of zero (and no share to derive one from).
    #[error("GPU {index}: a memory limit of 0 bytes would refuse every allocation")]
    ZeroMemory {
        /// GPU index.
        index: u32,
    },
    /// A GPU the node doesn't have.
    #[error("GPU {index}: this node has no such GPU (it has {have})")]
    NoSuchGpu {
        /// GPU index.
        index: u32,
        /// The indexes it has.
        have: String,
    },
    /// A GPU the kernel side can't count memory on.
    #[error("GPU {index}: indexes from {MAX_GPUS} up are not enforced")]
    GpuOutOfRange {
        /// GPU index.
        index: u32,
    },
    /// The same GPU twice.
    #[error("GPU {index} is listed twice")]
    DuplicateGpu {
        /// GPU index.
        index: u32,
    },
    /// A target of the wrong form.
    #[error("bad target: {0}")]
    Target(#[from] TargetError),
}

/// One GPU's part of a quota.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceQuota {
    /// GPU index (`nvidiaN`), or a MIG instance's device index.
    pub index: u32,
    /// Compute share in parts per million of the device; 0 for a memory-only part (not
    /// throttled).
    pub shares_ppm: u32,
    /// GPU-memory limit in bytes.
    pub memory_bytes: u64,
    /// On a MIG instance: the nodes it is opened by (quotas held from before MIG: none).
    #[serde(default)]
    pub mig: Option<MigAccess>,
}

impl DeviceQuota {
    /// The minor of the `/dev/nvidia<N>` node the part's processes open.
    #[must_use]
    pub fn node_minor(&self) -> u32 {
        self.mig.as_ref().map_or(self.index, |m| m.node_minor)
    }
}

/// The nodes a process on a MIG instance opens (docs/mig.md): its parent GPU's, and the GPU and
/// compute instance's capability nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigAccess {
    /// The parent GPU's `/dev/nvidia<N>` minor.
    pub node_minor: u32,
    /// Minors of the capability nodes (`nvidia-cap<N>`) it may open.
    pub cap_minors: Vec<u32>,
}

/// A quota the node enforces for one session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaSpec {
    /// The session.
    pub session_id: String,
    /// The workload it binds to.
    pub target: Target,
    /// What the target was authorized under (quotas held from before scopes: an admin's).
    #[serde(default = "TargetScope::legacy")]
    pub scope: TargetScope,
    /// Over the memory limit (tracepoint tier).
    pub memory_policy: MemoryPolicy,
    /// Compute share policy.
    pub compute_policy: ComputePolicy,
    /// Per GPU, sorted by index.
    pub devices: Vec<DeviceQuota>,
}

impl QuotaSpec {
    /// The quota of `allocate` on a node with `gpus`; `None` when it names no target (booked
    /// only, nothing to enforce).
    ///
    /// # Errors
    /// Anything that can't be enforced, with the reason.
    pub fn from_allocate(
        allocate: &pb::Allocate,
        gpus: &[GpuDevice],
    ) -> Result<Option<Self>, QuotaError> {
        let QuotaPolicy {
            memory: memory_policy,
            compute: compute_policy,
        } = convert::policy_from_pb(allocate.policy.as_ref())?;
        let mut devices: Vec<DeviceQuota> = Vec::with_capacity(allocate.devices.len());
        for part in &allocate.devices {
            let index = part.index;
            if index as usize >= MAX_GPUS {
                return Err(QuotaError::GpuOutOfRange { index });
            }
            let Some(gpu) = gpus.iter().find(|g| g.index == index) else {
                return Err(QuotaError::NoSuchGpu {
                    index,
                    have: gpus
                        .iter()
                        .map(|g| g.index.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            };
            if devices.iter().any(|d| d.index == index) {
                return Err(QuotaError::DuplicateGpu { index });
            }
            let shares_ppm = parse_share(index, &part.shares)?;
            let memory_bytes = if part.memory_bytes > 0 {
                part.memory_bytes
            } else {
                // Only shares: that fraction of the device's memory.
                u64::try_from(
                    u128::from(gpu.memory_bytes) * u128::from(shares_ppm) / u128::from(PPM),
                )
                .unwrap_or(u64::MAX)
            };
            if memory_bytes == 0 {
                return Err(QuotaError::ZeroMemory { index });
            }
            devices.push(DeviceQuota {
                index,
                shares_ppm,
                memory_bytes,
                mig: gpu.mig.as_ref().map(|m| MigAccess {
                    node_minor: m.parent_index,
                    cap_minors: [m.gi_cap_minor, m.ci_cap_minor]
                        .into_iter()
                        .flatten()
                        .collect(),
                }),
            });
        }
        let target = convert::target_from_pb(allocate.target.as_ref());
        if target.is_none() {
            return Ok(None);
        }
        target.check_form()?;
        let target = target.normalized();
        devices.sort_by_key(|d| d.index);
        Ok(Some(Self {
            session_id: allocate.session_id.clone(),
            target,
            scope: convert::scope_from_pb(allocate.scope.as_ref()),
            memory_policy,
            compute_policy,
            devices,
        }))
    }

    /// Total memory limit over its GPUs.
    #[must_use]
    pub fn memory_bytes(&self) -> u64 {
        self.devices.iter().map(|d| d.memory_bytes).sum()
    }

    /// Total compute share over its GPUs, in GPUs.
    #[must_use]
    pub fn shares(&self) -> f64 {
        f64::from(self.devices.iter().map(|d| d.shares_ppm).sum::<u32>()) / f64::from(PPM)
    }
}

/// Parses an exact decimal share ("0.5", "1", ".25", "0") into parts per million, refusing
/// negatives and more than one device. Zero is a memory-only part (`cuda.mem` without shares):
/// its memory is limited, its compute is not. The number is a slot value (the controller's own
/// fixed point, `gpuwarden_types::slot::SlotValue`, whose micro-units are parts per million).
fn parse_share(index: u32, value: &str) -> Result<u32, QuotaError> {
    let bad = || QuotaError::Share {
        index,
        value: value.to_owned(),
    };
    let trimmed = value.trim();
    if trimmed.starts_with('-') {
        return Err(QuotaError::NegativeShare {
            index,
            value: value.to_owned(),
        });
    }
    // Digits past a millionth can't be enforced anyway: the parser refuses them unless zero.
    let share: SlotValue = trimmed.parse().map_err(|_| bad())?;
    if share > SlotValue::ONE {
        return Err(QuotaError::ShareAboveOne {
            index,
            value: value.to_owned(),
        });
    }
    u32::try_from(share.micros()).map_err(|_| bad())
}

#[cfg(test)]
mod tests;
