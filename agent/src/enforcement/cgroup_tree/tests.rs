use super::*;

#[test]
fn targets_find_the_shallowest_matching_cgroup() {
    let scratch = gpuwarden_test_support::scratch("cgroup-tree");
    let root = scratch.path().join("cgroup");
    let id = "a".repeat(64);
    let pod = "0b5e5b2c-1d7e-4c1e-9d7a-2f9b5d3c4e6f";
    let pod_dir = root.join(format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        pod.replace('-', "_")
    ));
    let container = pod_dir.join(format!("cri-containerd-{id}.scope"));
    std::fs::create_dir_all(container.join("child")).unwrap();
    let tree = CgroupTree::host(root.clone());

    let found = tree.find(&Target::ContainerId(id.clone()), "s").unwrap();
    assert_eq!(found.as_deref(), Some(container.as_path()));
    let found = tree.find(&Target::PodUid(pod.to_owned()), "s").unwrap();
    assert_eq!(found.as_deref(), Some(pod_dir.as_path()));
    assert_eq!(
        tree.find(&Target::ContainerId("b".repeat(64)), "s")
            .unwrap(),
        None
    );
    let rel = tree.relative(&container);
    let found = tree.find(&Target::CgroupPath(rel.clone()), "s").unwrap();
    assert_eq!(found.as_deref(), Some(container.as_path()));
    assert!(rel.starts_with("/kubepods.slice/"), "{rel}");

    // The pod's members: itself, its container and the container's child.
    assert_eq!(tree.members(&pod_dir).len(), 3);
    let managed = tree.find(&Target::Managed, "s-42").unwrap().unwrap();
    assert_eq!(managed, root.join("gpuwarden/s-42"));
    assert!(managed.is_dir());
    std::fs::remove_dir_all(&root).unwrap();
    assert!(tree.members(&pod_dir).is_empty());
    drop(scratch);
}

#[test]
fn a_process_is_found_in_its_cgroup_through_proc() {
    let scratch = gpuwarden_test_support::scratch("cgroup-tree-pid");
    let root = scratch.path().join("cgroup");
    let proc_root = scratch.path().join("proc");
    std::fs::create_dir_all(root.join("a/b")).unwrap();
    std::fs::create_dir_all(proc_root.join("42")).unwrap();
    std::fs::write(proc_root.join("42/cgroup"), "1:name=systemd:/x\n0::/a/b\n").unwrap();
    let tree = CgroupTree::new(root.clone(), Box::new(HostCgroups::new(proc_root)));
    let id = std::fs::metadata(root.join("a/b")).unwrap().ino();
    assert_eq!(tree.cgroup_id_of_pid(42), Some(id));
    assert_eq!(tree.cgroup_id_of_pid(43), None);
}
