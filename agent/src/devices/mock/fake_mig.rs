//! A fake of NVML's MIG layout calls for one mock GPU in MIG mode (issue 37 §3): GPU instances
//! created at a placement, a compute instance in each, both destroyed again, refused as the
//! driver refuses them.
//!
//! What it refuses, and the NVML status the real call returns for it (nvml.h, and the NVML API
//! reference for `nvmlDeviceCreateGpuInstanceWithPlacement`, `nvmlGpuInstanceDestroy`):
//! - a profile the GPU does not have, or a start the profile may not take
//!   ([`FakeMigError::InvalidArgument`], `NVML_ERROR_INVALID_ARGUMENT`);
//! - a placement that overlaps an instance, or a profile at its instance count
//!   ([`FakeMigError::InsufficientResources`], `NVML_ERROR_INSUFFICIENT_RESOURCES`);
//! - destroying a compute instance a process runs in, or a GPU instance that still holds a
//!   compute instance or a process ([`FakeMigError::InUse`], `NVML_ERROR_IN_USE`);
//! - an id that names nothing ([`FakeMigError::NotFound`], `NVML_ERROR_NOT_FOUND`).
//!
//! GPU instance ids are the lowest free from 1 (the real driver numbers them by placement; no
//! caller here depends on which id it gets). A test marks processes running in an instance
//! with [`FakeMigGpu::set_processes`], as the mock has no real ones.

use std::collections::BTreeMap;

use crate::devices::placement::{GiProfile, GpuModel, Layout, Placement, PlacementRefusal};

/// What the fake refuses, as NVML would.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FakeMigError {
    /// `NVML_ERROR_INVALID_ARGUMENT`: no such profile, or a start it may not take.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// `NVML_ERROR_INSUFFICIENT_RESOURCES`: the placement is taken, or the profile's instances
    /// are all made.
    #[error("insufficient resources: {0}")]
    InsufficientResources(PlacementRefusal),
    /// `NVML_ERROR_IN_USE`: processes or compute instances are still there.
    #[error("in use: {0}")]
    InUse(String),
    /// `NVML_ERROR_NOT_FOUND`.
    #[error("not found: GPU instance {gpu_instance}")]
    NotFound {
        /// The id asked for.
        gpu_instance: u32,
    },
}

/// One GPU instance of the fake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeGpuInstance {
    /// Its profile.
    pub profile: &'static GiProfile,
    /// Where it sits.
    pub placement: Placement,
    /// Its compute instance (one, of the whole instance), once made.
    pub compute_instance: Option<u32>,
    /// Processes running in it.
    pub processes: u32,
}

/// The MIG layout of one mock GPU, changed only through NVML-like calls.
#[derive(Debug, Clone)]
pub struct FakeMigGpu {
    model: &'static GpuModel,
    instances: BTreeMap<u32, FakeGpuInstance>,
}

impl FakeMigGpu {
    /// A GPU of `model` in MIG mode with no instance.
    #[must_use]
    pub fn new(model: &'static GpuModel) -> Self {
        Self {
            model,
            instances: BTreeMap::new(),
        }
    }

    /// The model.
    #[must_use]
    pub fn model(&self) -> &'static GpuModel {
        self.model
    }

    /// The instances, by GPU instance id.
    #[must_use]
    pub fn instances(&self) -> &BTreeMap<u32, FakeGpuInstance> {
        &self.instances
    }

    /// The layout now.
    #[must_use]
    pub fn layout(&self) -> Layout {
        Layout {
            model: self.model,
            instances: self
                .instances
                .values()
                .map(|g| (g.profile, g.placement))
                .collect(),
        }
    }

    /// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: every placement of the profile, taken
    /// or not (NVML's answer does not depend on what exists).
    ///
    /// # Errors
    /// An unknown profile id.
    pub fn possible_placements(&self, profile_id: u32) -> Result<Vec<Placement>, FakeMigError> {
        Ok(self.profile(profile_id)?.placements().collect())
    }

    /// `nvmlDeviceCreateGpuInstanceWithPlacement`: a GPU instance of `profile_id` at
    /// `placement`; its id.
    ///
    /// # Errors
    /// An unknown profile or a start it may not take; an overlap or too many of the profile.
    pub fn create_gpu_instance_with_placement(
        &mut self,
        profile_id: u32,
        placement: Placement,
    ) -> Result<u32, FakeMigError> {
        let profile = self.profile(profile_id)?;
        match self.layout().refusal(profile, placement) {
            None => {}
            Some(r @ PlacementRefusal::BadStart { .. }) => {
                return Err(FakeMigError::InvalidArgument(r.to_string()));
            }
            Some(r) => return Err(FakeMigError::InsufficientResources(r)),
        }
        let id = (1..=u32::MAX)
            .find(|id| !self.instances.contains_key(id))
            .unwrap_or(u32::MAX);
        self.instances.insert(
            id,
            FakeGpuInstance {
                profile,
                placement,
                compute_instance: None,
                processes: 0,
            },
        );
        Ok(id)
    }

    /// `nvmlGpuInstanceCreateComputeInstance` with the profile of the whole GPU instance: its
    /// compute instance id (0).
    ///
    /// # Errors
    /// No such GPU instance; it has its compute instance already (`INSUFFICIENT_RESOURCES`
    /// from the driver, as the whole-instance profile fits once).
    pub fn create_compute_instance(&mut self, gpu_instance: u32) -> Result<u32, FakeMigError> {
        let gi = self.get_mut(gpu_instance)?;
        if gi.compute_instance.is_some() {
            let refusal = PlacementRefusal::TooMany {
                profile: gi.profile.name,
                max: 1,
            };
            return Err(FakeMigError::InsufficientResources(refusal));
        }
        gi.compute_instance = Some(0);
        Ok(0)
    }

    /// `nvmlComputeInstanceDestroy` of the GPU instance's compute instance.
    ///
    /// # Errors
    /// No such instance, or a process runs in it.
    pub fn destroy_compute_instance(&mut self, gpu_instance: u32) -> Result<(), FakeMigError> {
        let gi = self.get_mut(gpu_instance)?;
        if gi.processes > 0 {
            return Err(FakeMigError::InUse(format!(
                "{} processes run in GPU instance {gpu_instance}",
                gi.processes
            )));
        }
        if gi.compute_instance.take().is_none() {
            return Err(FakeMigError::NotFound { gpu_instance });
        }
        Ok(())
    }

    /// `nvmlGpuInstanceDestroy`.
    ///
    /// # Errors
    /// No such instance, or it still has a compute instance or a process.
    pub fn destroy_gpu_instance(&mut self, gpu_instance: u32) -> Result<(), FakeMigError> {
        let gi = self.get_mut(gpu_instance)?;
        if gi.processes > 0 || gi.compute_instance.is_some() {
            return Err(FakeMigError::InUse(format!(
                "GPU instance {gpu_instance} still has {} processes and {} compute instances",
                gi.processes,
                u8::from(gi.compute_instance.is_some())
            )));
        }
        self.instances.remove(&gpu_instance);
        Ok(())
    }

    /// Takes in an instance made before (the mock file's): GPU instance `gpu_instance` of the
    /// profile named `profile` at slice `start`, with its compute instance.
    ///
    /// # Errors
    /// The id is taken, the profile unknown, or the placement refused.
    pub fn insert_existing(
        &mut self,
        gpu_instance: u32,
        profile: &str,
        start: u32,
    ) -> Result<(), FakeMigError> {
        let p = self.model.profile(profile).ok_or_else(|| {
            FakeMigError::InvalidArgument(format!("{} has no profile {profile}", self.model.name))
        })?;
        if self.instances.contains_key(&gpu_instance) {
            return Err(FakeMigError::InvalidArgument(format!(
                "GPU instance {gpu_instance} exists already"
            )));
        }
        let placement = Placement {
            start,
            size: p.size,
        };
        match self.layout().refusal(p, placement) {
            None => {}
            Some(r @ PlacementRefusal::BadStart { .. }) => {
                return Err(FakeMigError::InvalidArgument(r.to_string()));
            }
            Some(r) => return Err(FakeMigError::InsufficientResources(r)),
        }
        self.instances.insert(
            gpu_instance,
            FakeGpuInstance {
                profile: p,
                placement,
                compute_instance: Some(0),
                processes: 0,
            },
        );
        Ok(())
    }

    /// Marks `count` processes running in a GPU instance (the mock has none of its own).
    ///
    /// # Errors
    /// No such instance.
    pub fn set_processes(&mut self, gpu_instance: u32, count: u32) -> Result<(), FakeMigError> {
        self.get_mut(gpu_instance)?.processes = count;
        Ok(())
    }

    fn profile(&self, profile_id: u32) -> Result<&'static GiProfile, FakeMigError> {
        self.model.profile_by_id(profile_id).ok_or_else(|| {
            FakeMigError::InvalidArgument(format!(
                "{} has no GPU instance profile {profile_id}",
                self.model.name
            ))
        })
    }

    fn get_mut(&mut self, gpu_instance: u32) -> Result<&mut FakeGpuInstance, FakeMigError> {
        self.instances
            .get_mut(&gpu_instance)
            .ok_or(FakeMigError::NotFound { gpu_instance })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::placement::{H100_80GB, H200_141GB};

    fn id(model: &GpuModel, name: &str) -> u32 {
        model.profile(name).unwrap().id
    }

    #[test]
    fn creation_is_refused_where_the_driver_refuses_it() {
        let m = &H100_80GB;
        let mut gpu = FakeMigGpu::new(m);
        let three = id(m, "3g.40gb");
        // 3g starts at 0 or 4 only.
        let err = gpu
            .create_gpu_instance_with_placement(three, Placement { start: 2, size: 4 })
            .unwrap_err();
        assert!(matches!(err, FakeMigError::InvalidArgument(_)), "{err}");
        let gi = gpu
            .create_gpu_instance_with_placement(three, Placement { start: 4, size: 4 })
            .unwrap();
        // A 1g.20gb at 6 overlaps it, a second 3g at 4 too, a 7g too; a 4g at 0 fits beside it.
        for (name, start, size) in [("1g.20gb", 6, 2), ("3g.40gb", 4, 4), ("7g.80gb", 0, 8)] {
            let err = gpu
                .create_gpu_instance_with_placement(id(m, name), Placement { start, size })
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    FakeMigError::InsufficientResources(PlacementRefusal::Overlap { .. })
                ),
                "{name}: {err}"
            );
        }
        let four = gpu
            .create_gpu_instance_with_placement(id(m, "4g.40gb"), Placement { start: 0, size: 4 })
            .unwrap();
        assert_ne!(gi, four);
        assert_eq!(gpu.layout().occupied(), 0xff);
        // An unknown profile id (A100's 1g.5gb+me is 20 too, but 1 is no H100 profile).
        assert!(matches!(
            gpu.possible_placements(1),
            Err(FakeMigError::InvalidArgument(_))
        ));
        // Possible placements are every one, taken or not.
        assert_eq!(gpu.possible_placements(three).unwrap().len(), 2);
    }

    #[test]
    fn an_instance_in_use_is_not_destroyed() {
        let m = &H200_141GB;
        let mut gpu = FakeMigGpu::new(m);
        let gi = gpu
            .create_gpu_instance_with_placement(id(m, "1g.18gb"), Placement { start: 6, size: 1 })
            .unwrap();
        assert_eq!(gpu.create_compute_instance(gi), Ok(0));
        assert!(gpu.create_compute_instance(gi).is_err());
        gpu.set_processes(gi, 1).unwrap();
        assert!(matches!(
            gpu.destroy_compute_instance(gi),
            Err(FakeMigError::InUse(_))
        ));
        assert!(matches!(
            gpu.destroy_gpu_instance(gi),
            Err(FakeMigError::InUse(_))
        ));
        gpu.set_processes(gi, 0).unwrap();
        // The compute instance first: the GPU instance still holds it.
        assert!(matches!(
            gpu.destroy_gpu_instance(gi),
            Err(FakeMigError::InUse(_))
        ));
        gpu.destroy_compute_instance(gi).unwrap();
        gpu.destroy_gpu_instance(gi).unwrap();
        assert!(gpu.instances().is_empty());
        assert_eq!(
            gpu.destroy_gpu_instance(gi),
            Err(FakeMigError::NotFound { gpu_instance: gi })
        );
    }
}
