//! The driver tier on a directory laid out like a cgroup-v2 root with the `dmem` controller:
//! the file formats are the kernel's (Documentation/admin-guide/cgroup-v2.rst, "DMEM").

use super::*;

const CAPACITY: &str = "\
drm/0000:03:00.0/vram0 8514437120
nvidia/0000:3b:00.0/vidmem 85899345920
nvidia/0000:1a:00.0/vidmem 85899345920
drm/0000:03:00.0/stolen 0
";

/// A root with two NVIDIA GPUs and an Intel one, and a cgroup `a/b` below it.
fn tree() -> (tempfile::TempDir, PathBuf) {
    let dir = gpuwarden_test_support::scratch("dmem");
    let root = dir.path().to_owned();
    std::fs::write(root.join("dmem.capacity"), CAPACITY).unwrap();
    let cgroup = root.join("a").join("b");
    std::fs::create_dir_all(&cgroup).unwrap();
    // A fresh cgroup has no limit on any region.
    std::fs::write(
        cgroup.join("dmem.max"),
        "drm/0000:03:00.0/vram0 max\nnvidia/0000:1a:00.0/vidmem max\nnvidia/0000:3b:00.0/vidmem max\n",
    )
    .unwrap();
    (dir, cgroup)
}

#[test]
fn nested_keyed_files_parse() {
    let limits = parse("nvidia/0000:1a:00.0/vidmem 1073741824\ndrm/x/vram0 max\n\nbad\n");
    assert_eq!(
        limits.get("nvidia/0000:1a:00.0/vidmem"),
        Some(&Limit::Bytes(1 << 30))
    );
    assert_eq!(limits.get("drm/x/vram0"), Some(&Limit::Max));
    assert_eq!(limits.len(), 2);
}

#[test]
fn the_gpus_are_nvidias_vidmem_regions_in_pci_order() {
    assert_eq!(
        gpu_regions(CAPACITY),
        ["nvidia/0000:1a:00.0/vidmem", "nvidia/0000:3b:00.0/vidmem"]
    );
}

#[test]
fn no_controller_or_no_nvidia_region_is_no_tier() {
    let dir = gpuwarden_test_support::scratch("dmem-none");
    assert!(DmemTree::open(dir.path()).is_none(), "no dmem.capacity");
    std::fs::write(
        dir.path().join("dmem.capacity"),
        "drm/0000:03:00.0/vram0 1\n",
    )
    .unwrap();
    assert!(DmemTree::open(dir.path()).is_none(), "no NVIDIA region");
}

#[test]
fn a_limit_is_set_per_gpu_region_and_lifted() {
    let (dir, cgroup) = tree();
    let mut dmem = DmemTree::open(dir.path()).unwrap();
    let set = dmem.set(&cgroup, &[(1, 2 << 30), (7, 1 << 30)]).unwrap();
    assert_eq!(set, [1], "GPU 7 has no region");
    let max = dmem.max(&cgroup).unwrap();
    assert_eq!(
        max.get("nvidia/0000:3b:00.0/vidmem"),
        Some(&Limit::Bytes(2 << 30))
    );
    assert_eq!(max.get("nvidia/0000:1a:00.0/vidmem"), Some(&Limit::Max));
    assert_eq!(
        max.get("drm/0000:03:00.0/vram0"),
        Some(&Limit::Max),
        "others untouched"
    );
    // The controller is enabled on every ancestor, so the cgroup has its files.
    for at in [dir.path().to_owned(), dir.path().join("a")] {
        let control = std::fs::read_to_string(at.join("cgroup.subtree_control")).unwrap();
        assert_eq!(control.trim(), "+dmem", "{}", at.display());
    }

    dmem.lift(&cgroup, &[1]).unwrap();
    let max = dmem.max(&cgroup).unwrap();
    assert!(max.values().all(|l| *l == Limit::Max), "{max:?}");
    // A cgroup that is gone has nothing left to lift.
    std::fs::remove_dir_all(dir.path().join("a")).unwrap();
    dmem.lift(&cgroup, &[1]).unwrap();
}

#[test]
fn a_cgroup_outside_the_root_is_refused() {
    let (dir, _) = tree();
    let mut dmem = DmemTree::open(dir.path()).unwrap();
    let err = dmem.set(Path::new("/elsewhere"), &[(0, 1)]).unwrap_err();
    assert!(matches!(err, DmemError::OutsideRoot { .. }), "{err}");
}
