//! Real GPUs through NVML (nvml-wrapper loads `libnvidia-ml.so.1` at run time, so the agent
//! builds and runs on machines without it).

use gpuwarden_runtime::sync::Lock as _;
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use nvml_wrapper::{
    Nvml,
    bitmasks::event::EventTypes,
    enum_wrappers::device::{EccCounter, MemoryError, Sampling},
    enums::{
        device::{SampleValue, UsedGpuMemory},
        event::XidError,
    },
    error::NvmlError,
};

use super::samples::{DeviceSample, DriverError, ProcessSample, SampleDriver};
use super::{
    GpuBackend, GpuDevice, ProcessMemory,
    health::{self, GpuHealth, HealthState, Xid},
    mig,
};

/// `NVML_DEVICE_MIG_ENABLE`: the current MIG mode of a GPU in MIG mode.
const MIG_ENABLED: u32 = 1;

/// The MIG devices (compute instances) of a GPU in MIG mode, as NVML lists them; a slot NVML
/// finds empty, or an instance it can't read, is left out (logged).
fn mig_instances(nvml: &Nvml, parent: &nvml_wrapper::Device<'_>) -> Vec<mig::Found> {
    let slots = parent.mig_device_count().unwrap_or(0);
    (0..slots)
        .filter_map(|slot| {
            let d = match parent.mig_device_by_index(slot) {
                Ok(d) => d,
                Err(NvmlError::NotFound) => return None,
                Err(e) => {
                    tracing::warn!(slot, "MIG device not read: {e}");
                    return None;
                }
            };
            let read = || -> Result<mig::Found, NvmlError> {
                let attributes = d.attributes().ok();
                Ok(mig::Found {
                    uuid: d.uuid()?,
                    name: d.name().unwrap_or_default(),
                    memory_bytes: d.memory_info()?.total,
                    sm_count: attributes.as_ref().map_or(0, |a| a.multiprocessor_count),
                    gpu_instance: instance_id(nvml, &d, InstanceLevel::Gpu)?,
                    compute_instance: instance_id(nvml, &d, InstanceLevel::Compute)?,
                    slices: attributes.map_or(0, |a| a.gpu_instance_slice_count),
                })
            };
            read()
                .inspect_err(|e| tracing::warn!(slot, "MIG device not read: {e}"))
                .ok()
        })
        .collect()
}

/// Which id of a MIG device to read.
#[derive(Debug, Clone, Copy)]
enum InstanceLevel {
    Gpu,
    Compute,
}

/// A MIG device's GPU or compute instance id: calls nvml-wrapper does not wrap, made on its
/// library directly.
fn instance_id(
    nvml: &Nvml,
    d: &nvml_wrapper::Device<'_>,
    level: InstanceLevel,
) -> Result<u32, NvmlError> {
    let lib = nvml.lib();
    let mut id: std::ffi::c_uint = 0;
    // SAFETY: the handle is a live MIG device handle of this NVML; `id` is a valid out pointer.
    let status = unsafe {
        let handle = d.handle();
        match level {
            InstanceLevel::Gpu => lib.nvmlDeviceGetGpuInstanceId(handle, &raw mut id),
            InstanceLevel::Compute => lib.nvmlDeviceGetComputeInstanceId(handle, &raw mut id),
        }
    };
    nvml_wrapper::error::nvml_try(status)?;
    Ok(id)
}

/// GPUs NVML lists.
pub struct NvmlBackend {
    devices: Vec<GpuDevice>,
    /// NVML's index of each GPU, by the GPU's minor number (our index).
    nvml_index: HashMap<u32, u32>,
    nvml: Arc<Nvml>,
    /// XID errors seen since start, by GPU index (filled by the event thread).
    xids: Arc<Mutex<HashMap<u32, Vec<Xid>>>>,
    /// Set on drop: the event thread stops within a second.
    stop: Arc<AtomicBool>,
}

impl Drop for NvmlBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl NvmlBackend {
    /// Initialises NVML and lists the GPUs.
    ///
    /// # Errors
    /// NVML can't be loaded or initialised.
    pub fn probe() -> Result<Self, NvmlError> {
        let nvml = Nvml::init()?;
        let count = nvml.device_count()?;
        let mut physical = Vec::new();
        for i in 0..count {
            let d = nvml.device_by_index(i)?;
            let index = d.minor_number().unwrap_or(i);
            let mig_mode = d.mig_mode().is_ok_and(|m| m.current == MIG_ENABLED);
            let device = GpuDevice {
                uuid: d.uuid()?,
                model: d.name().unwrap_or_else(|_| "NVIDIA GPU".to_owned()),
                memory_bytes: d.memory_info()?.total,
                numa_node: d
                    .numa_node_id()
                    .ok()
                    .and_then(|n| i32::try_from(n).ok())
                    .unwrap_or(-1),
                sm_count: d.attributes().map_or(0, |a| a.multiprocessor_count),
                is_mig: false,
                index,
                device_node: format!("/dev/nvidia{index}"),
                mig: None,
            };
            physical.push((i, device, mig_mode));
        }
        // A GPU in MIG mode is offered as its instances, numbered after every GPU's minor.
        let minors = mig::MigMinors::read(Path::new(mig::MIG_MINORS));
        let mut next = mig::first_instance_index(physical.iter().map(|(_, d, _)| d.index));
        let mut devices = Vec::new();
        let mut instances = Vec::new();
        let mut nvml_index = HashMap::new();
        for (i, device, mig_mode) in physical {
            if !mig_mode {
                nvml_index.insert(device.index, i);
                devices.push(device);
                continue;
            }
            let parent = nvml.device_by_index(i)?;
            for found in mig_instances(&nvml, &parent) {
                instances.push(mig::instance_device(&device, found, next, &minors));
                next = next.saturating_add(1);
            }
        }
        devices.extend(instances);
        let backend = Self {
            devices,
            nvml_index,
            nvml: Arc::new(nvml),
            xids: Arc::default(),
            stop: Arc::default(),
        };
        backend.watch_xids();
        Ok(backend)
    }

    /// Starts the thread that waits for XID events and records each, attributed to the cgroup
    /// of the GPU's only process when it has exactly one (NVML's event names no process).
    /// Where the driver offers no such events, there is no thread and no XID counts.
    fn watch_xids(&self) {
        let (nvml, xids, stop) = (
            Arc::clone(&self.nvml),
            Arc::clone(&self.xids),
            Arc::clone(&self.stop),
        );
        let by_uuid: HashMap<String, u32> = self
            .devices
            .iter()
            .map(|d| (d.uuid.clone(), d.index))
            .collect();
        let indexes: Vec<u32> = self.nvml_index.values().copied().collect();
        let spawned = std::thread::Builder::new()
            .name("nvml-xid".to_owned())
            .spawn(move || {
                let Ok(mut set) = nvml.create_event_set() else {
                    return;
                };
                let mut registered = 0;
                for i in indexes {
                    let Ok(device) = nvml.device_by_index(i) else {
                        continue;
                    };
                    match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                        Ok(s) => {
                            set = s;
                            registered += 1;
                        }
                        Err(e) => {
                            tracing::info!("XID events unavailable: {}", e.error);
                            return;
                        }
                    }
                }
                if registered == 0 {
                    return;
                }
                while !stop.load(Ordering::Relaxed) {
                    let event = match set.wait(1000) {
                        Ok(event) => event,
                        Err(NvmlError::Timeout) => continue,
                        Err(e) => {
                            tracing::warn!("XID events: {e}; no longer watched");
                            return;
                        }
                    };
                    let Some(index) = event
                        .device
                        .uuid()
                        .ok()
                        .and_then(|u| by_uuid.get(&u).copied())
                    else {
                        continue;
                    };
                    let code = match event.event_data {
                        Some(XidError::Value(code)) => code,
                        _ => 0,
                    };
                    let processes = event.device.running_compute_processes().unwrap_or_default();
                    let cgroup = match processes.as_slice() {
                        [only] => health::cgroup_of(Path::new("/proc"), only.pid),
                        _ => None,
                    };
                    tracing::warn!(gpu = index, xid = code, cgroup = ?cgroup, "GPU XID error");
                    xids.locked()
                        .entry(index)
                        .or_default()
                        .push(Xid { code, cgroup });
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("XID events not watched: {e}");
        }
    }
}

impl GpuBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn devices(&self) -> Vec<GpuDevice> {
        self.devices.clone()
    }

    fn caps_major(&self) -> Option<u32> {
        mig::caps_major(&std::fs::read_to_string("/proc/devices").ok()?)
    }

    fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    fn process_memory(&self) -> Vec<ProcessMemory> {
        let mut out = Vec::new();
        for (&index, &nvml_index) in &self.nvml_index {
            let Ok(device) = self.nvml.device_by_index(nvml_index) else {
                continue;
            };
            let compute = device.running_compute_processes().unwrap_or_default();
            let graphics = device.running_graphics_processes().unwrap_or_default();
            for p in compute.into_iter().chain(graphics) {
                if let UsedGpuMemory::Used(bytes) = p.used_gpu_memory {
                    out.push(ProcessMemory {
                        index,
                        pid: p.pid,
                        bytes,
                    });
                }
            }
        }
        out
    }

    fn utilization(&self) -> Option<std::collections::BTreeMap<u32, f64>> {
        // A GPU NVML can't read this time is left out (reported as unknown), not zero.
        Some(
            self.nvml_index
                .iter()
                .filter_map(|(&index, &nvml_index)| {
                    let rates = self
                        .nvml
                        .device_by_index(nvml_index)
                        .ok()?
                        .utilization_rates()
                        .ok()?;
                    Some((index, f64::from(rates.gpu.min(100)) / 100.0))
                })
                .collect(),
        )
    }

    fn health(&self) -> Vec<GpuHealth> {
        let xids = self.xids.locked();
        self.nvml_index
            .iter()
            .map(|(&index, &nvml_index)| {
                let xids = xids.get(&index).cloned().unwrap_or_default();
                let Ok(device) = self.nvml.device_by_index(nvml_index) else {
                    // Fallen off the bus, or otherwise out of NVML's reach.
                    return GpuHealth {
                        index,
                        state: HealthState::Failed,
                        xids,
                        ..GpuHealth::default()
                    };
                };
                let ecc = |kind| device.total_ecc_errors(kind, EccCounter::Aggregate).ok();
                let ecc_uncorrected = ecc(MemoryError::Uncorrected);
                let state = match device.utilization_rates() {
                    Err(NvmlError::GpuLost) => HealthState::Failed,
                    // Uncorrected memory errors or an XID: it works, with faults.
                    _ if ecc_uncorrected.is_some_and(|n| n > 0) || !xids.is_empty() => {
                        HealthState::Degraded
                    }
                    _ => HealthState::Ok,
                };
                GpuHealth {
                    index,
                    state,
                    power_watts: device.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
                    energy_joules: device
                        .total_energy_consumption()
                        .ok()
                        .map(|mj| mj as f64 / 1000.0),
                    memory_utilization: device
                        .utilization_rates()
                        .ok()
                        .map(|u| f64::from(u.memory.min(100)) / 100.0),
                    ecc_corrected: ecc(MemoryError::Corrected),
                    ecc_uncorrected,
                    xids,
                }
            })
            .collect()
    }

    fn sample_driver(&self, cgroup_root: &Path) -> Option<Box<dyn SampleDriver>> {
        Some(Box::new(NvmlSamples {
            nvml: Arc::clone(&self.nvml),
            nvml_index: self.nvml_index.clone(),
            cgroup_root: cgroup_root.to_owned(),
            device_clock: None,
            process_clock: None,
        }))
    }
}

/// NVML as a [`SampleDriver`]: each GPU's device utilization samples and its per-process SM
/// utilization samples (the throttle's `sampled` usage turns them into each cgroup's busy time:
/// each GPU's busy time apportioned among the processes active in each sample period).
pub struct NvmlSamples {
    nvml: Arc<Nvml>,
    nvml_index: HashMap<u32, u32>,
    cgroup_root: PathBuf,
    /// The clock of the device samples' timestamps, once one was seen.
    device_clock: Option<SampleClock>,
    /// The clock of the process samples' timestamps, once one was seen.
    process_clock: Option<SampleClock>,
}

impl NvmlSamples {
    fn device(&self, gpu: u32) -> Result<nvml_wrapper::Device<'_>, DriverError> {
        let index = self
            .nvml_index
            .get(&gpu)
            .ok_or_else(|| DriverError::Other(format!("no GPU {gpu}")))?;
        self.nvml.device_by_index(*index).map_err(driver_error)
    }
}

fn driver_error(e: NvmlError) -> DriverError {
    match e {
        NvmlError::NotSupported => DriverError::NotSupported,
        e => DriverError::Other(e.to_string()),
    }
}

impl SampleDriver for NvmlSamples {
    fn device_samples(
        &mut self,
        gpu: u32,
        last_seen_us: u64,
    ) -> Result<Vec<DeviceSample>, DriverError> {
        let since = self.device_clock.map_or(0, |c| c.to_native(last_seen_us));
        match self.device(gpu)?.samples(Sampling::GpuUtilization, since) {
            Ok(samples) => {
                let clock = SampleClock::learn(
                    &mut self.device_clock,
                    samples.first().map(|s| s.timestamp),
                );
                Ok(samples
                    .iter()
                    .map(|s| DeviceSample {
                        timestamp_us: clock.to_realtime(s.timestamp),
                        util_percent: percent(&s.value),
                    })
                    .collect())
            }
            // No samples newer than the last seen.
            Err(NvmlError::NotFound) => Ok(Vec::new()),
            Err(e) => Err(driver_error(e)),
        }
    }

    fn process_samples(
        &mut self,
        gpu: u32,
        last_seen_us: u64,
    ) -> Result<Vec<ProcessSample>, DriverError> {
        let since = self.process_clock.map_or(0, |c| c.to_native(last_seen_us));
        match self.device(gpu)?.process_utilization_stats(since) {
            Ok(samples) => {
                let clock = SampleClock::learn(
                    &mut self.process_clock,
                    samples.first().map(|s| s.timestamp),
                );
                Ok(samples
                    .iter()
                    .map(|s| ProcessSample {
                        pid: s.pid,
                        timestamp_us: clock.to_realtime(s.timestamp),
                        sm_util_percent: s.sm_util,
                    })
                    .collect())
            }
            Err(NvmlError::NotFound) => Ok(Vec::new()),
            Err(e) => Err(driver_error(e)),
        }
    }

    fn now(&self) -> (Instant, u64) {
        (Instant::now(), realtime_us())
    }

    fn cgroup_of(&self, pid: u32) -> Option<PathBuf> {
        cgroup_dir_of(&self.cgroup_root, pid)
    }

    fn cgroup_exists(&self, dir: &Path) -> bool {
        dir.is_dir()
    }
}

/// A sample's value as a percentage.
fn percent(value: &SampleValue) -> u32 {
    let v = match *value {
        SampleValue::U32(v) => u64::from(v),
        SampleValue::U64(v) => v,
        SampleValue::I64(v) => u64::try_from(v).unwrap_or(0),
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "clamped to 0..=100"
        )]
        SampleValue::F64(v) => v.clamp(0.0, 100.0).round() as u64,
    };
    u32::try_from(v.min(100)).unwrap_or(100)
}

/// The clock NVML stamped a stream of samples with, as an offset to the real-time clock.
///
/// NVML documents its timestamps only as "CPU timestamps in microseconds". Process samples carry
/// the real-time clock (µs since the epoch) on the drivers reported publicly, but device samples
/// have been seen counting from boot (polarsignals/gpu-metrics-agent#37, on a DGX Spark). The two
/// streams are matched by time, so each is moved onto the real-time clock by the offset its
/// first sample shows, fixed from then on so that "last seen" goes back to NVML exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct SampleClock {
    /// Real time minus the stream's clock, µs.
    offset_us: u64,
}

impl SampleClock {
    /// The clock of a stream whose sample was stamped `ts_us`: whichever of the real-time and
    /// the since-boot clocks it is nearer (none seen yet: the real-time clock).
    fn of(ts_us: u64, clocks: &Clocks) -> Self {
        let since_boot =
            ts_us != 0 && ts_us.abs_diff(clocks.boot_us) < ts_us.abs_diff(clocks.real_us);
        Self {
            offset_us: if since_boot {
                clocks.real_us.saturating_sub(clocks.boot_us)
            } else {
                0
            },
        }
    }

    /// The clock `known`, or learned from a stream's first sample stamped `first_us` (until one
    /// comes, the real-time clock, without remembering it).
    fn learn(known: &mut Option<Self>, first_us: Option<u64>) -> Self {
        match (*known, first_us) {
            (Some(clock), _) => clock,
            (None, Some(ts)) => *known.insert(Self::of(ts, &Clocks::now())),
            (None, None) => Self::default(),
        }
    }

    fn to_realtime(self, ts_us: u64) -> u64 {
        ts_us.saturating_add(self.offset_us)
    }

    fn to_native(self, realtime_us: u64) -> u64 {
        realtime_us.saturating_sub(self.offset_us)
    }
}

/// The machine's real-time and since-boot clocks, µs.
#[derive(Debug, Clone, Copy)]
struct Clocks {
    real_us: u64,
    boot_us: u64,
}

impl Clocks {
    fn now() -> Self {
        Self {
            real_us: realtime_us(),
            boot_us: boottime_us(),
        }
    }
}

/// The real-time clock, µs since the epoch: the clock samples are moved onto.
fn realtime_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// Time since boot (`CLOCK_BOOTTIME`), µs; 0 if it can't be read.
fn boottime_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &raw mut ts) } != 0 {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let micros = u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000;
    secs.saturating_mul(1_000_000).saturating_add(micros)
}

/// The cgroup v2 directory of a process.
fn cgroup_dir_of(root: &Path, pid: u32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(root.join(rel.trim().trim_start_matches('/')))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLOCKS: Clocks = Clocks {
        real_us: 1_790_000_000_000_000,
        boot_us: 86_400_000_000,
    };

    #[test]
    fn real_time_stamps_are_kept_and_since_boot_ones_moved_onto_real_time() {
        let real = SampleClock::of(CLOCKS.real_us - 150_000, &CLOCKS);
        assert_eq!(
            real.to_realtime(CLOCKS.real_us - 150_000),
            CLOCKS.real_us - 150_000
        );
        let boot = SampleClock::of(CLOCKS.boot_us - 150_000, &CLOCKS);
        assert_eq!(
            boot.to_realtime(CLOCKS.boot_us - 150_000),
            CLOCKS.real_us - 150_000
        );
        // "Last seen" goes back to NVML in its own clock, exactly.
        let seen = boot.to_realtime(CLOCKS.boot_us + 7);
        assert_eq!(boot.to_native(seen), CLOCKS.boot_us + 7);
        // No sample yet: the real-time clock, not remembered; the first sample decides.
        let mut known = None;
        assert_eq!(SampleClock::learn(&mut known, None), real);
        assert_eq!(known, None);
        let boot_us = boottime_us();
        let learned = SampleClock::learn(&mut known, Some(boot_us));
        assert_ne!(learned, real, "a since-boot stamp moves the stream");
        assert_eq!(known, Some(learned));
        assert_eq!(
            SampleClock::learn(&mut known, Some(realtime_us())),
            learned,
            "fixed once learned"
        );
    }

    #[test]
    fn the_machines_clocks_read_as_expected() {
        let clocks = Clocks::now();
        assert!(
            clocks.boot_us > 0 && clocks.boot_us < clocks.real_us,
            "{clocks:?}"
        );
    }
}
