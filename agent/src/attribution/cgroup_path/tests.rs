use super::*;

const ID: &str = "3f1c2b9d8e7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c";
const ID2: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";
const UID: &str = "0d6e4a3b-1c2d-4e5f-8a9b-0c1d2e3f4a5b";
const UID_: &str = "0d6e4a3b_1c2d_4e5f_8a9b_0c1d2e3f4a5b";
/// A static pod's UID: the manifest's hash.
const HASH: &str = "6b2b2fc5e3c3d6e4fb4a5d9a7c0e1f2a";

struct Row {
    path: String,
    runtime: Runtime,
    id: Option<&'static str>,
    pod: Option<&'static str>,
    qos: Option<QosClass>,
    unit: Option<String>,
}

fn row(
    path: impl Into<String>,
    runtime: Runtime,
    id: Option<&'static str>,
    pod: Option<&'static str>,
    qos: Option<QosClass>,
    unit: Option<&str>,
) -> Row {
    Row {
        path: path.into(),
        runtime,
        id,
        pod,
        qos,
        unit: unit.map(str::to_owned),
    }
}

/// The path part of a cgroup v1 `/proc/<pid>/cgroup` line.
fn v1(line: &str) -> String {
    line.splitn(3, ':').nth(2).unwrap().to_owned()
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario or one wiring, read top to bottom"
)]
fn reads_each_runtime_layout() {
    use QosClass::{BestEffort, Burstable, Guaranteed};
    use Runtime::{Containerd, Cri, CriO, Docker, Host, Podman, Systemd, Unknown};
    let k8s_sd_burstable =
        format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice");
    let k8s_sd_besteffort =
        format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice");
    let rows = vec![
        // Host and systemd.
        row("/", Host, None, None, None, None),
        row("", Host, None, None, None, None),
        row(
            "/system.slice/sshd.service",
            Systemd,
            None,
            None,
            None,
            Some("sshd.service"),
        ),
        row(
            "/user.slice/user-1000.slice/session-3.scope",
            Systemd,
            None,
            None,
            None,
            Some("session-3.scope"),
        ),
        row("/init.scope", Systemd, None, None, None, Some("init.scope")),
        row(
            "/system.slice/containerd.service",
            Systemd,
            None,
            None,
            None,
            Some("containerd.service"),
        ),
        row(
            "/user.slice/user-1000.slice/user@1000.service/app.slice/foo.service",
            Systemd,
            None,
            None,
            None,
            Some("foo.service"),
        ),
        // A delegated subtree belongs to its service.
        row(
            "/system.slice/foo.service/worker",
            Systemd,
            None,
            None,
            None,
            Some("foo.service"),
        ),
        row(
            "/system.slice/nvidia-persistenced.service/",
            Systemd,
            None,
            None,
            None,
            Some("nvidia-persistenced.service"),
        ),
        // Docker: cgroupfs (v1 and v2) and systemd drivers.
        row(format!("/docker/{ID}"), Docker, Some(ID), None, None, None),
        row(
            v1(&format!("12:memory:/docker/{ID}")),
            Docker,
            Some(ID),
            None,
            None,
            None,
        ),
        row(format!("/docker/{ID}/"), Docker, Some(ID), None, None, None),
        row(
            format!("//docker//{ID}"),
            Docker,
            Some(ID),
            None,
            None,
            None,
        ),
        row(
            format!("/system.slice/docker-{ID}.scope"),
            Docker,
            Some(ID),
            None,
            None,
            Some(&format!("docker-{ID}.scope")),
        ),
        row(
            v1(&format!("4:cpu,cpuacct:/system.slice/docker-{ID}.scope")),
            Docker,
            Some(ID),
            None,
            None,
            Some(&format!("docker-{ID}.scope")),
        ),
        // systemd inside a container; docker-in-docker names the inner container.
        row(
            format!("/system.slice/docker-{ID}.scope/init.scope"),
            Docker,
            Some(ID),
            None,
            None,
            Some("init.scope"),
        ),
        row(
            format!("/docker/{ID}/docker/{ID2}"),
            Docker,
            Some(ID2),
            None,
            None,
            None,
        ),
        // Podman: systemd (with the v2 `container` child), conmon, rootless, cgroupfs, pods.
        row(
            format!("/machine.slice/libpod-{ID}.scope"),
            Podman,
            Some(ID),
            None,
            None,
            Some(&format!("libpod-{ID}.scope")),
        ),
        row(
            format!("/machine.slice/libpod-{ID}.scope/container"),
            Podman,
            Some(ID),
            None,
            None,
            Some(&format!("libpod-{ID}.scope")),
        ),
        row(
            format!("/machine.slice/libpod-conmon-{ID}.scope"),
            Podman,
            None,
            None,
            None,
            Some(&format!("libpod-conmon-{ID}.scope")),
        ),
        row(
            format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"),
            Podman,
            Some(ID),
            None,
            None,
            Some(&format!("libpod-{ID}.scope")),
        ),
        row(
            format!("/libpod_parent/libpod-{ID}"),
            Podman,
            Some(ID),
            None,
            None,
            None,
        ),
        row(
            format!("/machine.slice/machine-libpod_pod_{ID2}.slice/libpod-{ID}.scope"),
            Podman,
            Some(ID),
            None,
            None,
            Some(&format!("libpod-{ID}.scope")),
        ),
        // CRI-O outside Kubernetes.
        row(
            format!("/machine.slice/crio-{ID}.scope"),
            CriO,
            Some(ID),
            None,
            None,
            Some(&format!("crio-{ID}.scope")),
        ),
        row(
            format!("/machine.slice/crio-conmon-{ID}.scope"),
            CriO,
            None,
            None,
            None,
            Some(&format!("crio-conmon-{ID}.scope")),
        ),
        // Kubernetes, systemd driver.
        row(
            format!("{k8s_sd_burstable}/cri-containerd-{ID}.scope"),
            Containerd,
            Some(ID),
            Some(UID),
            Some(Burstable),
            Some(&format!("cri-containerd-{ID}.scope")),
        ),
        row(
            format!("/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope"),
            Containerd,
            Some(ID),
            Some(UID),
            Some(Guaranteed),
            Some(&format!("cri-containerd-{ID}.scope")),
        ),
        row(
            format!("{k8s_sd_burstable}/cri-containerd-{ID}.scope/sub"),
            Containerd,
            Some(ID),
            Some(UID),
            Some(Burstable),
            Some(&format!("cri-containerd-{ID}.scope")),
        ),
        row(
            format!("{k8s_sd_besteffort}/crio-{ID}.scope"),
            CriO,
            Some(ID),
            Some(UID),
            Some(BestEffort),
            Some(&format!("crio-{ID}.scope")),
        ),
        row(
            format!("{k8s_sd_besteffort}/crio-conmon-{ID}.scope"),
            CriO,
            None,
            Some(UID),
            Some(BestEffort),
            Some(&format!("crio-conmon-{ID}.scope")),
        ),
        // cri-dockerd with the systemd driver.
        row(
            format!("{k8s_sd_burstable}/docker-{ID}.scope"),
            Docker,
            Some(ID),
            Some(UID),
            Some(Burstable),
            Some(&format!("docker-{ID}.scope")),
        ),
        // Kubernetes, cgroupfs driver (v1 and v2 alike): containerd and dockershim look the
        // same, so the runtime is only "cri"; CRI-O prefixes its ids.
        row(
            format!("/kubepods/besteffort/pod{UID}/{ID}"),
            Cri,
            Some(ID),
            Some(UID),
            Some(BestEffort),
            None,
        ),
        row(
            v1(&format!("11:devices:/kubepods/burstable/pod{UID}/{ID}")),
            Cri,
            Some(ID),
            Some(UID),
            Some(Burstable),
            None,
        ),
        row(
            format!("/kubepods/pod{UID}/{ID}"),
            Cri,
            Some(ID),
            Some(UID),
            Some(Guaranteed),
            None,
        ),
        row(
            format!("/kubepods/burstable/pod{UID}/crio-{ID}"),
            CriO,
            Some(ID),
            Some(UID),
            Some(Burstable),
            None,
        ),
        // Pod-level cgroups: a pod, no container.
        row(
            format!("/kubepods/besteffort/pod{UID}/"),
            Cri,
            None,
            Some(UID),
            Some(BestEffort),
            None,
        ),
        row(
            k8s_sd_burstable.clone(),
            Cri,
            None,
            Some(UID),
            Some(Burstable),
            Some(&format!("kubepods-burstable-pod{UID_}.slice")),
        ),
        // Static pods: the UID is a bare hash.
        row(
            format!("/kubepods/burstable/pod{HASH}/{ID}"),
            Cri,
            Some(ID),
            Some(HASH),
            Some(Burstable),
            None,
        ),
        row(
            format!("/kubepods.slice/kubepods-pod{HASH}.slice/cri-containerd-{ID}.scope"),
            Containerd,
            Some(ID),
            Some(HASH),
            Some(Guaranteed),
            Some(&format!("cri-containerd-{ID}.scope")),
        ),
        // kind / k3s / --cgroup-root: kubepods under a prefix, even inside a node container.
        row(
            format!("/kubelet/kubepods/burstable/pod{UID}/{ID}"),
            Cri,
            Some(ID),
            Some(UID),
            Some(Burstable),
            None,
        ),
        row(
            format!(
                "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope"
            ),
            Containerd,
            Some(ID),
            Some(UID),
            Some(BestEffort),
            Some(&format!("cri-containerd-{ID}.scope")),
        ),
        row(
            format!(
                "/system.slice/docker-{ID2}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope"
            ),
            Containerd,
            Some(ID),
            Some(UID),
            Some(Guaranteed),
            Some(&format!("cri-containerd-{ID}.scope")),
        ),
        row(
            format!("/docker/{ID2}/kubelet/kubepods/pod{UID}/{ID}"),
            Cri,
            Some(ID),
            Some(UID),
            Some(Guaranteed),
            None,
        ),
        // kubepods levels without a pod.
        row(
            "/kubepods.slice",
            Cri,
            None,
            None,
            None,
            Some("kubepods.slice"),
        ),
        row(
            "/kubepods/burstable",
            Cri,
            None,
            None,
            Some(Burstable),
            None,
        ),
        // Not ids: too short, too long, not hex, uppercase; ids outside a known layout.
        row(
            format!("/docker/{}", &ID[..63]),
            Unknown,
            None,
            None,
            None,
            None,
        ),
        row(format!("/docker/{ID}0"), Unknown, None, None, None, None),
        row(
            format!("/docker/{}", ID.to_uppercase()),
            Unknown,
            None,
            None,
            None,
            None,
        ),
        row(
            format!("/system.slice/docker-{}x.scope", &ID[..63]),
            Systemd,
            None,
            None,
            None,
            Some(&format!("docker-{}x.scope", &ID[..63])),
        ),
        row(
            format!("/system.slice/docker-{ID}"),
            Systemd,
            None,
            None,
            None,
            Some("system.slice"),
        ),
        row(
            format!("/kubepods/besteffort/pod{UID}/{}", &ID[..40]),
            Unknown,
            None,
            Some(UID),
            Some(BestEffort),
            None,
        ),
        row(
            format!(
                "{k8s_sd_burstable}/cri-containerd-{}.scope",
                ID.to_uppercase()
            ),
            Unknown,
            None,
            Some(UID),
            Some(Burstable),
            Some(&format!("cri-containerd-{}.scope", ID.to_uppercase())),
        ),
        row(format!("/default/{ID}"), Unknown, None, None, None, None),
        row(format!("/foo/{ID}"), Unknown, None, None, None, None),
        row(
            format!("/kubepods/besteffort/podnot-a-uid/{ID}"),
            Unknown,
            None,
            None,
            None,
            None,
        ),
        // Each driver spells the UID its own way; uppercase is no kubelet's.
        row(
            format!("/kubepods/besteffort/pod{UID_}/{ID}"),
            Unknown,
            None,
            None,
            None,
            None,
        ),
        row(
            format!("/kubepods/besteffort/pod{}/{ID}", UID.to_uppercase()),
            Unknown,
            None,
            None,
            None,
            None,
        ),
        row("/lxc/c1", Unknown, None, None, None, None),
    ];
    assert!(rows.len() >= 25);
    for r in rows {
        let w = parse_cgroup_path(&r.path);
        assert_eq!(w.runtime, r.runtime, "runtime of {}", r.path);
        assert_eq!(w.container_id.as_deref(), r.id, "id of {}", r.path);
        assert_eq!(w.pod_uid.as_deref(), r.pod, "pod of {}", r.path);
        assert_eq!(w.qos, r.qos, "qos of {}", r.path);
        assert_eq!(w.unit, r.unit, "unit of {}", r.path);
    }
}

#[test]
fn normalises_the_path_and_serialises_lowercase_names() {
    assert_eq!(parse_cgroup_path("").cgroup_path, "/");
    assert_eq!(parse_cgroup_path("//").cgroup_path, "/");
    let w = parse_cgroup_path(&format!(
        "kubepods.slice//kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope/"
    ));
    assert_eq!(
        w.cgroup_path,
        format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"
        )
    );
    let json = serde_json::to_value(&w).unwrap();
    assert_eq!(json["runtime"], "containerd");
    assert_eq!(json["container_id"], ID);
    assert_eq!(json["pod_uid"], UID);
    assert_eq!(json["qos"], "burstable");
    let json = serde_json::to_value(parse_cgroup_path("/lxc/c1")).unwrap();
    assert_eq!(json["runtime"], "unknown");
    assert_eq!(json["container_id"], serde_json::Value::Null);
    assert_eq!(json["qos"], serde_json::Value::Null);
    let names: Vec<&str> = [
        Runtime::Host,
        Runtime::Systemd,
        Runtime::Docker,
        Runtime::Containerd,
        Runtime::Cri,
        Runtime::CriO,
        Runtime::Podman,
        Runtime::Unknown,
    ]
    .iter()
    .map(|r| r.as_str())
    .collect();
    assert_eq!(
        names,
        [
            "host",
            "systemd",
            "docker",
            "containerd",
            "cri",
            "cri-o",
            "podman",
            "unknown"
        ]
    );
    assert_eq!(QosClass::BestEffort.to_string(), "besteffort");
    assert_eq!(QosClass::Guaranteed.as_str(), "guaranteed");
}

#[test]
fn reads_the_unified_line() {
    assert_eq!(unified_path("0::/a:b"), Some("/a:b"));
    assert_eq!(unified_path("0::/"), Some("/"));
    assert_eq!(unified_path("12:memory:/docker/x"), None);
    assert_eq!(unified_path("1:name=systemd:/"), None);
    assert_eq!(unified_path(""), None);
}
