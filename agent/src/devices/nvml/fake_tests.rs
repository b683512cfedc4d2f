//! The NVML backend's MIG calls against a stand-in `libnvidia-ml` (`fake_nvml.c`, compiled
//! here with the system's C compiler): one H100 in MIG mode, with the driver's refusals. What
//! this shows is the FFI (struct layouts and versions, the two-call placement list, handles,
//! the order of calls, the codes named); the placement table is the stand-in's, not a driver's.

use std::{path::Path, process::Command};

use super::NvmlBackend;
use crate::devices::{
    GpuBackend,
    ondemand::MigChangeError,
    placement::{H100_80GB, Placement},
};

/// Compiles the stand-in into `dir`; its path.
fn build_fake(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("fake_nvml.c");
    std::fs::write(&src, include_str!("fake_nvml.c")).unwrap();
    let lib = dir.join("libfakenvml.so");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
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
    let set_busy = unsafe {
        hooks
            .get::<unsafe extern "C" fn(u32, i32) -> i32>(b"fake_nvml_set_busy\0")
            .unwrap()
    };
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

    // A process in the 3g: the driver refuses (IN_USE on the compute instance), it stays.
    // SAFETY: a plain C function.
    assert_eq!(unsafe { set_busy(m.gpu_instance, 1) }, 0);
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
    assert_eq!(unsafe { set_busy(m.gpu_instance, 0) }, 0);
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
    // The stand-in lists no processes (it lacks the call): a GPU whose processes can't be
    // listed is taken as busy, so no layout change would go ahead.
    assert!(b.busy_devices().contains(&0));
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
