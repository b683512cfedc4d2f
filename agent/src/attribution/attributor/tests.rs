use std::path::Path;

use super::*;
use crate::attribution::cgroup_path::{QosClass, Runtime};

const ID: &str = "3f1c2b9d8e7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c";
const UID: &str = "0d6e4a3b-1c2d-4e5f-8a9b-0c1d2e3f4a5b";

fn ino(path: &Path) -> u64 {
    fs::symlink_metadata(path).unwrap().ino()
}

#[test]
fn resolves_ids_through_a_cached_walk() {
    let tmp = gpuwarden_test_support::scratch("attribution-walk");
    let cgroups = tmp.path().join("cgroup");
    let docker = cgroups.join(format!("system.slice/docker-{ID}.scope"));
    let pod = cgroups.join(format!("kubepods/burstable/pod{UID}"));
    let container = pod.join(ID);
    fs::create_dir_all(&docker).unwrap();
    fs::create_dir_all(&container).unwrap();
    fs::write(cgroups.join("cgroup.procs"), "").unwrap();
    // A loop the walk must not follow.
    std::os::unix::fs::symlink("..", cgroups.join("system.slice/loop")).unwrap();

    let mut attributor = Attributor::with_roots(cgroups.clone(), tmp.path().join("proc"));
    assert_eq!(attributor.root(), cgroups);

    let root = attributor.resolve(ino(&cgroups)).unwrap();
    assert_eq!(root.runtime, Runtime::Host);
    assert_eq!(root.cgroup_path, "/");

    let w = attributor.resolve(ino(&container)).unwrap();
    assert_eq!(w.runtime, Runtime::Cri);
    assert_eq!(w.cgroup_path, format!("/kubepods/burstable/pod{UID}/{ID}"));
    assert_eq!(w.container_id.as_deref(), Some(ID));
    assert_eq!(w.pod_uid.as_deref(), Some(UID));
    assert_eq!(w.qos, Some(QosClass::Burstable));
    assert!(
        !attributor
            .cache
            .values()
            .any(|e| e.workload.cgroup_path.contains("loop")),
        "the walk followed a symlink"
    );

    // A new directory is found by the next miss. (Made before anything is removed: on the
    // temp file system inode numbers are reused, unlike cgroup ids.)
    let new = cgroups.join("system.slice/new.service");
    fs::create_dir(&new).unwrap();
    let w = attributor.resolve(ino(&new)).unwrap();
    assert_eq!(w.unit.as_deref(), Some("new.service"));

    // The walk cached every directory: the docker one answers after it is removed, until
    // forget_dead.
    let docker_id = ino(&docker);
    fs::remove_dir(&docker).unwrap();
    let w = attributor.resolve(docker_id).unwrap();
    assert_eq!(w.runtime, Runtime::Docker);
    assert_eq!(w.container_id.as_deref(), Some(ID));
    attributor.forget_dead();
    assert!(attributor.resolve(docker_id).is_none());
    assert!(attributor.missing.contains_key(&docker_id));

    // A directory whose inode changed is forgotten, and its old id found where it went.
    let pod_id = ino(&pod);
    let moved = cgroups.join("kubepods/burstable/moved");
    fs::rename(&pod, &moved).unwrap();
    fs::create_dir(&pod).unwrap();
    assert_ne!(ino(&pod), pod_id);
    attributor.forget_dead();
    assert!(!attributor.cache.contains_key(&pod_id));
    let w = attributor.resolve(pod_id).unwrap();
    assert_eq!(w.cgroup_path, "/kubepods/burstable/moved");
    assert_eq!(w.runtime, Runtime::Unknown);
    assert_eq!(w.pod_uid, None);
}

#[test]
fn a_missing_root_resolves_nothing() {
    let tmp = gpuwarden_test_support::scratch("attribution-noroot");
    let mut attributor = Attributor::with_roots(tmp.path().join("absent"), tmp.path().to_owned());
    assert!(attributor.resolve(1).is_none());
    assert!(attributor.resolve(1).is_none());
    attributor.forget_dead();
}

#[test]
fn finds_the_cgroup_of_a_pid() {
    let tmp = gpuwarden_test_support::scratch("attribution-pid");
    let cgroups = tmp.path().join("cgroup");
    let scope = cgroups.join(format!("system.slice/docker-{ID}.scope"));
    fs::create_dir_all(&scope).unwrap();
    fs::write(scope.join("cgroup.procs"), "42\n").unwrap();
    let procs = tmp.path().join("proc");
    let write = |pid: u32, text: String| {
        let dir = procs.join(pid.to_string());
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("cgroup"), text).unwrap();
    };
    write(
        42,
        format!(
            "12:memory:/docker/{ID}\n1:name=systemd:/system.slice/docker-{ID}.scope\n0::/system.slice/docker-{ID}.scope\n"
        ),
    );
    write(43, "12:memory:/\n1:name=systemd:/\n".to_owned());
    write(44, "0::/../../user.slice\n".to_owned());
    write(45, "0::/system.slice/gone.service (deleted)\n".to_owned());
    write(46, "0::/\n".to_owned());
    write(
        47,
        format!("0::/system.slice/docker-{ID}.scope/cgroup.procs\n"),
    );

    let mut attributor = Attributor::with_roots(cgroups.clone(), procs);
    let id = attributor.cgroup_id_of_pid(42).unwrap();
    assert_eq!(id, ino(&scope));
    assert_eq!(
        attributor
            .cgroup_id_of_path(&format!("system.slice/docker-{ID}.scope/"))
            .unwrap(),
        id
    );
    assert_eq!(
        attributor.resolve(id).unwrap().container_id.as_deref(),
        Some(ID)
    );
    assert_eq!(attributor.cgroup_id_of_pid(46).unwrap(), ino(&cgroups));

    let err = attributor.cgroup_id_of_pid(7).unwrap_err();
    assert!(matches!(err, AttributionError::ReadProcCgroup { .. }));
    assert!(err.to_string().contains("/proc/7/cgroup"), "{err}");
    assert!(matches!(
        attributor.cgroup_id_of_pid(43),
        Err(AttributionError::NoUnifiedEntry { .. })
    ));
    let err = attributor.cgroup_id_of_pid(44).unwrap_err();
    assert!(matches!(err, AttributionError::OutsideRoot { .. }));
    assert!(err.to_string().contains("/../../user.slice"), "{err}");
    assert!(matches!(
        attributor.cgroup_id_of_pid(45),
        Err(AttributionError::Stat { .. })
    ));
    assert!(matches!(
        attributor.cgroup_id_of_pid(47),
        Err(AttributionError::NotACgroup { .. })
    ));
}
