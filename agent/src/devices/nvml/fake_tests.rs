//! The NVML backend's MIG calls against a stand-in `libnvidia-ml` (`fake_nvml.c`, compiled
//! here with the system's C compiler): one H100 in MIG mode, with the driver's refusals. What
//! this shows is the FFI (struct layouts and versions, the two-call placement list, handles,
//! the order of calls, the codes named); the placement table is the stand-in's, not a driver's.

use std::{collections::BTreeSet, path::Path, process::Command};

const MIB: u64 = 1 << 20;

use super::NvmlBackend;
use crate::devices::{
    GpuBackend,
    ondemand::MigChangeError,
    placement::{H100_80GB, Placement},
};

/// The sizes and offsets of nvml.h's structs the stand-in writes, as nvml-wrapper-sys
/// transcribes the header: the stand-in fails to compile where its own layout differs.
fn layouts() -> Vec<String> {
    use nvml_wrapper_sys::bindings as b;
    [
        (
            "GI_PROFILE_V2_SIZE",
            size_of::<b::nvmlGpuInstanceProfileInfo_v2_t>(),
        ),
        ("GI_INFO_SIZE", size_of::<b::nvmlGpuInstanceInfo_t>()),
        (
            "GI_INFO_PLACEMENT",
            std::mem::offset_of!(b::nvmlGpuInstanceInfo_t, placement),
        ),
        (
            "CI_PROFILE_SIZE",
            size_of::<b::nvmlComputeInstanceProfileInfo_t>(),
        ),
        ("MEMORY_V2_SIZE", size_of::<b::nvmlMemory_v2_t>()),
        (
            "MEMORY_V2_USED",
            std::mem::offset_of!(b::nvmlMemory_v2_t, used),
        ),
        ("ATTRIBUTES_SIZE", size_of::<b::nvmlDeviceAttributes_t>()),
        ("PROCESS_INFO_SIZE", size_of::<b::nvmlProcessInfo_t>()),
        (
            "PROCESS_INFO_GI",
            std::mem::offset_of!(b::nvmlProcessInfo_t, gpuInstanceId),
        ),
    ]
    .into_iter()
    .map(|(name, n)| format!("-DNVML_{name}={n}"))
    .collect()
}

/// Compiles the stand-in into `dir`; its path.
fn build_fake(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("fake_nvml.c");
    std::fs::write(&src, include_str!("fake_nvml.c")).unwrap();
    let lib = dir.join("libfakenvml.so");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .args(layouts())
        .arg(&src)
        .output()
        .expect("a C compiler (cc) builds the stand-in libnvidia-ml");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    lib
}

#[test]
fn instances_are_made_read_back_and_destroyed_through_the_nvml_calls() {
    let scratch = gpuwarden_test_support::scratch("fake-nvml");
    let lib = build_fake(scratch.path());
    let b = NvmlBackend::probe_library(Some(lib.as_os_str())).unwrap();
    // SAFETY: the stand-in is a plain C library without initialisers; the same file NVML
    // loaded, so dlopen hands back the same copy and its state.
    let hooks = unsafe { libloading::Library::new(&lib) }.unwrap();
    // SAFETY: the hooks' C signatures, as declared in fake_nvml.c.
    let process = unsafe {
        hooks
            .get::<unsafe extern "C" fn(u32, u32, u64) -> i32>(b"fake_nvml_process\0")
            .unwrap()
    };
    // SAFETY: as above.
    let refuse_lists =
        unsafe { hooks.get::<unsafe extern "C" fn(i32)>(b"fake_nvml_refuse_lists\0") }.unwrap();
    // SAFETY: as above.
    let gpu_instances =
        unsafe { hooks.get::<unsafe extern "C" fn() -> i32>(b"fake_nvml_gpu_instances\0") }
            .unwrap();
    // SAFETY: plain C functions without preconditions.
    let there = || unsafe { gpu_instances() };

    // The driver's table agrees with the rules: the GPU is reported, empty.
    let layouts = b.mig_layouts();
    assert_eq!(layouts.len(), 1, "the table read and compared");
    let (uuid, index, layout) = &layouts[0];
    assert_eq!((uuid.as_str(), *index), ("GPU-fake-0", 0));
    assert_eq!(layout.model.name, H100_80GB.name);
    assert!(layout.instances.is_empty());
    assert!(
        b.devices().is_empty(),
        "no instance yet, and the parent is not offered"
    );

    // A 3g at slices 4-7: a GPU instance and a compute instance of its whole 3 slices (the
    // stand-in refuses a compute profile of another size).
    let made = b.create_instance("GPU-fake-0", "3g.40gb", 4).unwrap();
    let m = made.mig.clone().unwrap();
    assert_eq!(made.uuid, format!("MIG-fake-0-gi{}", m.gpu_instance));
    assert_eq!(
        (
            m.parent_uuid.as_str(),
            m.profile.as_str(),
            m.compute_instance
        ),
        ("GPU-fake-0", "3g.40gb", 0)
    );
    assert_eq!((made.index, made.memory_bytes), (1, 40_448 << 20));
    assert_eq!(b.devices(), std::slice::from_ref(&made));
    // Read back from the driver: the 3g where it was made.
    let layout = &b.mig_layouts()[0].2;
    assert_eq!(layout.instances.len(), 1);
    assert_eq!(layout.instances[0].0.name, "3g.40gb");
    assert_eq!(layout.instances[0].1, Placement { start: 4, size: 4 });

    // The driver refuses an overlap, named with its call and code; nothing is left made.
    let err = b.create_instance("GPU-fake-0", "2g.20gb", 4).unwrap_err();
    let MigChangeError::Refused { reason, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(
        reason.contains("nvmlDeviceCreateGpuInstanceWithPlacement")
            && reason.contains("NVML_ERROR_INSUFFICIENT_RESOURCES (23)"),
        "{reason}"
    );
    assert_eq!(there(), 1);
    // A start the profile may not take is refused before the driver is asked.
    assert!(matches!(
        b.create_instance("GPU-fake-0", "2g.20gb", 1),
        Err(MigChangeError::Refused { .. })
    ));
    assert!(matches!(
        b.create_instance("GPU-fake-0", "5g.50gb", 0),
        Err(MigChangeError::UnknownProfile { .. })
    ));
    assert!(matches!(
        b.create_instance("GPU-other", "1g.10gb", 0),
        Err(MigChangeError::UnknownGpu { .. })
    ));

    // A second one beside it; the device index after the first.
    let second = b.create_instance("GPU-fake-0", "1g.10gb", 0).unwrap();
    assert_eq!(second.index, 2);
    assert_ne!(second.mig.as_ref().unwrap().gpu_instance, m.gpu_instance);
    assert_eq!(b.mig_layouts()[0].2.occupied(), 0b1111_0001);

    // A process in the 3g: the driver counts it on the 3g's device, and refuses (IN_USE on the
    // compute instance) to destroy it, it stays.
    // SAFETY: a plain C function.
    assert_eq!(unsafe { process(4242, m.gpu_instance, 1 << 20) }, 0);
    assert_eq!(b.busy_devices(), BTreeSet::from([made.index]));
    let err = b.destroy_instance(&made.uuid).unwrap_err();
    let MigChangeError::Refused { reason, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(
        reason.contains("nvmlComputeInstanceDestroy") && reason.contains("NVML_ERROR_IN_USE (19)"),
        "{reason}"
    );
    assert!(b.devices().contains(&made));
    assert_eq!(there(), 2);
    // SAFETY: as above.
    assert_eq!(unsafe { process(4242, m.gpu_instance, 0) }, 0);
    assert!(b.busy_devices().is_empty());
    // Processes that can't be listed: the GPU is taken as busy, no layout change goes ahead.
    // SAFETY: plain C functions.
    unsafe { refuse_lists(2) };
    assert_eq!(b.busy_devices(), BTreeSet::from([0]));
    // SAFETY: as above.
    unsafe { refuse_lists(0) };
    // Gone: compute instance, then GPU instance; its slices free again.
    b.destroy_instance(&made.uuid).unwrap();
    assert_eq!(b.devices(), std::slice::from_ref(&second));
    assert_eq!(there(), 1);
    assert_eq!(b.mig_layouts()[0].2.occupied(), 0b0000_0001);
    b.destroy_instance(&second.uuid).unwrap();
    assert_eq!(there(), 0);
    assert!(matches!(
        b.destroy_instance(&second.uuid),
        Err(MigChangeError::NoInstance { .. })
    ));
    assert!(b.busy_devices().is_empty());
}

#[test]
fn processes_and_memory_are_counted_on_the_instance_the_driver_names() {
    let scratch = gpuwarden_test_support::scratch("fake-nvml-processes");
    let lib = build_fake(scratch.path());
    // SAFETY: as in the test above; loaded first so that the second GPU is there when NVML
    // (the same copy) lists its GPUs.
    let hooks = unsafe { libloading::Library::new(&lib) }.unwrap();
    // SAFETY: the hooks' C signatures, as declared in fake_nvml.c.
    let (whole_gpu, process, refuse_lists) = unsafe {
        (
            hooks
                .get::<unsafe extern "C" fn(i32)>(b"fake_nvml_whole_gpu\0")
                .unwrap(),
            hooks
                .get::<unsafe extern "C" fn(u32, u32, u64) -> i32>(b"fake_nvml_process\0")
                .unwrap(),
            hooks
                .get::<unsafe extern "C" fn(i32)>(b"fake_nvml_refuse_lists\0")
                .unwrap(),
        )
    };
    // SAFETY: plain C functions without preconditions.
    unsafe { whole_gpu(1) };
    let b = NvmlBackend::probe_library(Some(lib.as_os_str())).unwrap();
    // GPU 1 is offered whole; GPU 0, in MIG mode, as the two instances made on it.
    let whole = b.devices()[0].clone();
    assert_eq!((whole.uuid.as_str(), whole.index), ("GPU-fake-1", 1));
    let big = b.create_instance("GPU-fake-0", "3g.40gb", 4).unwrap();
    let small = b.create_instance("GPU-fake-0", "1g.10gb", 0).unwrap();
    let gi = |d: &crate::devices::GpuDevice| d.mig.as_ref().unwrap().gpu_instance;
    // SAFETY: plain C functions.
    unsafe {
        assert_eq!(process(100, gi(&big), 3000 * MIB), 0);
        assert_eq!(process(101, gi(&big), 200 * MIB), 0);
        assert_eq!(process(102, gi(&small), 700 * MIB), 0);
        assert_eq!(process(103, 0, 2000 * MIB), 0);
    }
    let expected = BTreeSet::from([
        (big.index, 100, 3000 * MIB),
        (big.index, 101, 200 * MIB),
        (small.index, 102, 700 * MIB),
        (whole.index, 103, 2000 * MIB),
    ]);
    let counted = |b: &NvmlBackend| -> BTreeSet<(u32, u32, u64)> {
        b.process_memory()
            .iter()
            .map(|p| (p.index, p.pid, p.bytes))
            .collect()
    };
    // From each MIG device's own list (the GPU's own list refused).
    // SAFETY: a plain C function.
    unsafe { refuse_lists(3) };
    assert_eq!(counted(&b), expected);
    assert_eq!(
        b.busy_devices(),
        BTreeSet::from([whole.index, big.index, small.index])
    );
    // The driver's count of each device's memory: each instance its processes' (the stand-in
    // counts nothing else there), the whole GPU its process and the 512 MiB it reserves.
    let memory = b.driver_memory();
    let used = |index| memory.get(&index).map(|m| (m.used, m.reserved));
    assert_eq!(used(big.index), Some((3200 * MIB, 0)));
    assert_eq!(used(small.index), Some((700 * MIB, 0)));
    assert_eq!(used(whole.index), Some((2512 * MIB, 512 * MIB)));
    assert_eq!(
        memory.len(),
        3,
        "the GPU in MIG mode is no device: {memory:?}"
    );

    // MIG devices that don't list their processes: the GPU's list, by GPU instance id.
    // SAFETY: a plain C function.
    unsafe { refuse_lists(1) };
    assert_eq!(counted(&b), expected);
    // Nothing lists them: nothing counted, every GPU taken as busy.
    // SAFETY: as above.
    unsafe { refuse_lists(2) };
    assert!(counted(&b).is_empty());
    assert_eq!(b.busy_devices(), BTreeSet::from([0, whole.index]));
}

#[test]
fn mig_table_reads_the_drivers_profiles_and_finds_them_as_the_rules() {
    // `gpuwarden-agent mig-table`, gpu-check's read-only row: the GPU in MIG mode, its seven
    // profiles read, no disagreement with the rules. A copy of its own (its own state).
    let scratch = gpuwarden_test_support::scratch("fake-nvml-table");
    let lib = build_fake(scratch.path());
    let tables = super::mig_tables_of(Some(lib.as_os_str())).unwrap();
    assert_eq!(tables.len(), 1);
    let t = &tables[0];
    assert!(t.mig_enabled && t.error.is_none(), "{t:?}");
    assert_eq!(t.model, Some("H100"));
    assert_eq!(t.profiles.len(), 7, "{:?}", t.profiles);
    assert!(
        t.profiles
            .contains(&"3g.40gb id 9 x2 {0}:4 {4}:4".to_owned()),
        "{:?}",
        t.profiles
    );
    assert!(t.disagreements.is_empty(), "{:?}", t.disagreements);
}

#[test]
fn an_instance_keeps_no_utilization_samples_so_its_shares_are_held_by_time() {
    use crate::{devices::samples::DriverError, enforcement::throttle::device_signal_for};
    let scratch = gpuwarden_test_support::scratch("fake-nvml-samples");
    let lib = build_fake(scratch.path());
    let b = NvmlBackend::probe_library(Some(lib.as_os_str())).unwrap();
    let made = b.create_instance("GPU-fake-0", "3g.40gb", 4).unwrap();
    let cgroups = scratch.path().join("cgroups");
    let job = cgroups.join("job");
    std::fs::create_dir_all(&job).unwrap();
    std::fs::write(job.join("cpu.stat"), "usage_usec 1000\n").unwrap();

    let mut driver = b.sample_driver(&cgroups).unwrap();
    assert!(matches!(
        driver.device_samples(made.index, 0),
        Err(DriverError::NotSupported)
    ));
    assert!(matches!(
        driver.process_samples(made.index, 0),
        Err(DriverError::NotSupported)
    ));
    // The parent, not offered in MIG mode, is no GPU the throttle reads: an error of its own.
    assert!(matches!(
        driver.device_samples(0, 0),
        Err(DriverError::Other(_))
    ));

    let mut signal = device_signal_for(&b, &cgroups);
    let first = signal.read(made.index, &[job.as_path()]).unwrap();
    std::fs::write(job.join("cpu.stat"), "usage_usec 10001000\n").unwrap();
    let second = signal.read(made.index, &[job.as_path()]).unwrap();
    assert!(first.time_only && second.time_only);
    assert_eq!(
        second.active,
        vec![true],
        "activity from the cgroup's CPU time"
    );
    assert!(second.intervals.is_empty());
}
