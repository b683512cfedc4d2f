//! Attribution: which container, pod or unit a cgroup id belongs to.
//!
//! The programs report `bpf_get_current_cgroup_id()`, the inode number of the process's cgroup v2
//! directory. [`Attributor`] finds that directory under the cgroup v2 mount (`/sys/fs/cgroup`,
//! or `/sys/fs/cgroup/unified` in hybrid mode) and [`parse_cgroup_path`] reads the container
//! runtime, container id, pod UID and QoS class from the path's shape. Results are cached and
//! forgotten when the directory goes away.
//!
//! The parser only names a container id where a runtime's layout puts one: an unknown layout
//! yields the path and no id, never a wrong id.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::Serialize;

/// Errors finding cgroups.
#[derive(Debug, thiserror::Error)]
pub enum AttributionError {
    /// No cgroup v2 hierarchy is mounted.
    #[error("no cgroup v2 file system is mounted (looked in {mountinfo})")]
    NoCgroup2 {
        /// The mount table read.
        mountinfo: PathBuf,
    },
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The process is not in a cgroup v2 hierarchy.
    #[error("{path} has no cgroup v2 entry (\"0::\")")]
    NoUnifiedEntry {
        /// The `/proc/<pid>/cgroup` file.
        path: PathBuf,
    },
}

/// A container runtime, as told by the cgroup layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Runtime {
    /// A host process (the root cgroup).
    Host,
    /// A systemd unit (service, scope, slice).
    Systemd,
    /// Docker.
    Docker,
    /// containerd (its CRI plugin names scopes `cri-containerd-<id>`).
    Containerd,
    /// Some CRI runtime, under the kubelet's cgroupfs layout, which doesn't say which.
    Cri,
    /// CRI-O.
    CriO,
    /// Podman.
    Podman,
    /// A layout gpuwarden doesn't know.
    Unknown,
}

impl Runtime {
    /// Stable name (part of the snapshot interface).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::Systemd => "systemd",
            Self::Docker => "docker",
            Self::Containerd => "containerd",
            Self::Cri => "cri",
            Self::CriO => "cri-o",
            Self::Podman => "podman",
            Self::Unknown => "unknown",
        }
    }
}

/// Kubernetes QoS class of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// No QoS level in the path.
    Guaranteed,
    /// `burstable`.
    Burstable,
    /// `besteffort`.
    BestEffort,
}

impl QosClass {
    /// Stable name (part of the snapshot interface).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "guaranteed",
            Self::Burstable => "burstable",
            Self::BestEffort => "besteffort",
        }
    }
}

/// Who a cgroup belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Workload {
    /// The cgroup path, relative to the cgroup root (`/` for the root).
    pub cgroup_path: String,
    /// The runtime.
    #[serde(serialize_with = "as_str_runtime")]
    pub runtime: Runtime,
    /// The container id, where the layout names one.
    pub container_id: Option<String>,
    /// The pod UID (canonical, with dashes), under `kubepods`.
    pub pod_uid: Option<String>,
    /// The pod's QoS class, under `kubepods`.
    #[serde(serialize_with = "as_str_qos")]
    pub qos: Option<QosClass>,
    /// The systemd unit, for systemd layouts.
    pub unit: Option<String>,
}

fn as_str_runtime<S: serde::Serializer>(r: &Runtime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(r.as_str())
}

fn as_str_qos<S: serde::Serializer>(q: &Option<QosClass>, s: S) -> Result<S::Ok, S::Error> {
    match q {
        Some(q) => s.serialize_str(q.as_str()),
        None => s.serialize_none(),
    }
}

/// A 64-character lowercase hex container id.
fn container_id(s: &str) -> Option<String> {
    (s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then(|| s.to_owned())
}

/// A pod UID as the kubelet writes it (`pod<uid>`, with `_` for `-` under systemd), canonical.
fn pod_uid(component: &str) -> Option<String> {
    let uid = component.strip_prefix("pod")?.replace('_', "-");
    let groups: Vec<&str> = uid.split('-').collect();
    let shape_ok = groups.len() == 5
        && groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && uid.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit());
    shape_ok.then(|| uid.to_ascii_lowercase())
}

/// The id in `<prefix><id>.scope`.
fn scoped_id<'a>(component: &'a str, prefix: &str) -> Option<&'a str> {
    component.strip_prefix(prefix)?.strip_suffix(".scope")
}

/// Reads runtime, container id, pod UID and QoS class from a cgroup path (v2, or the path part
/// of a v1 `/proc/<pid>/cgroup` line).
#[must_use]
pub fn parse_cgroup_path(path: &str) -> Workload {
    let trimmed = path.trim_end_matches('/');
    let cgroup_path = if trimmed.is_empty() {
        "/".to_owned()
    } else {
        trimmed.to_owned()
    };
    let components: Vec<&str> = trimmed.split('/').filter(|c| !c.is_empty()).collect();
    let mut workload = Workload {
        cgroup_path,
        runtime: Runtime::Unknown,
        container_id: None,
        pod_uid: None,
        qos: None,
        unit: None,
    };
    if components.is_empty() {
        workload.runtime = Runtime::Host;
        return workload;
    }

    // Kubernetes: find the kubepods level wherever it sits (kind and k3s nest it under a prefix).
    if let Some(kube) = components
        .iter()
        .position(|c| *c == "kubepods" || *c == "kubepods.slice" || c.ends_with("-kubepods.slice"))
    {
        return parse_kubepods(&components[kube + 1..], workload);
    }

    // Podman nests the container's processes in a `container` child on cgroup v2.
    let leaf_index = match components.as_slice() {
        [.., parent, "container"] if parent.starts_with("libpod-") => components.len() - 2,
        _ => components.len() - 1,
    };
    let leaf = components[leaf_index];
    if let Some(id) = scoped_id(leaf, "docker-").and_then(container_id) {
        workload.runtime = Runtime::Docker;
        workload.container_id = Some(id);
    } else if components.len() == 2 && components[0] == "docker" {
        if let Some(id) = container_id(leaf) {
            workload.runtime = Runtime::Docker;
            workload.container_id = Some(id);
        }
    } else if scoped_id(leaf, "libpod-conmon-").is_some() {
        // conmon monitors the container from outside it: runtime known, not the container.
        workload.runtime = Runtime::Podman;
        workload.unit = Some(leaf.to_owned());
    } else if let Some(id) = scoped_id(leaf, "libpod-").and_then(container_id) {
        workload.runtime = Runtime::Podman;
        workload.container_id = Some(id);
    } else if scoped_id(leaf, "crio-conmon-").is_some() {
        workload.runtime = Runtime::CriO;
        workload.unit = Some(leaf.to_owned());
    } else if let Some(id) = scoped_id(leaf, "crio-").and_then(container_id) {
        workload.runtime = Runtime::CriO;
        workload.container_id = Some(id);
    } else if let Some(id) = scoped_id(leaf, "cri-containerd-").and_then(container_id) {
        workload.runtime = Runtime::Containerd;
        workload.container_id = Some(id);
    } else if [".service", ".scope", ".slice"]
        .iter()
        .any(|s| leaf.ends_with(s))
    {
        workload.runtime = Runtime::Systemd;
        workload.unit = Some(leaf.to_owned());
    }
    workload
}

/// The part of a path below the kubepods level: `[qos level] pod<uid> [container]`.
fn parse_kubepods(rest: &[&str], mut workload: Workload) -> Workload {
    let mut rest = rest;
    workload.runtime = Runtime::Cri;
    workload.qos = Some(QosClass::Guaranteed);
    if let Some(first) = rest.first() {
        let level = first.trim_end_matches(".slice");
        let level = level.rsplit("kubepods-").next().unwrap_or(level);
        let qos = match level {
            "burstable" => Some(QosClass::Burstable),
            "besteffort" => Some(QosClass::BestEffort),
            _ => None,
        };
        if let Some(qos) = qos {
            workload.qos = Some(qos);
            rest = &rest[1..];
        }
    }
    let Some(pod) = rest.first() else {
        // The kubepods or QoS slice itself: no pod.
        workload.qos = None;
        return workload;
    };
    // systemd: kubepods-<qos>-pod<uid>.slice; cgroupfs: pod<uid>.
    let pod = pod.trim_end_matches(".slice");
    let pod_component = pod.rfind("-pod").map_or(pod, |i| &pod[i + 1..]);
    let Some(uid) = pod_uid(pod_component) else {
        workload.runtime = Runtime::Unknown;
        workload.qos = None;
        return workload;
    };
    workload.pod_uid = Some(uid);
    let Some(container) = rest.get(1) else {
        return workload;
    };
    if rest.len() > 2 {
        // Deeper than a container: not a layout we know.
        return workload;
    }
    if let Some(id) = scoped_id(container, "cri-containerd-").and_then(container_id) {
        workload.runtime = Runtime::Containerd;
        workload.container_id = Some(id);
    } else if let Some(id) = scoped_id(container, "crio-").and_then(container_id) {
        workload.runtime = Runtime::CriO;
        workload.container_id = Some(id);
    } else if let Some(id) = scoped_id(container, "docker-").and_then(container_id) {
        workload.runtime = Runtime::Docker;
        workload.container_id = Some(id);
    } else if scoped_id(container, "crio-conmon-").is_some() {
        workload.runtime = Runtime::CriO;
    } else if let Some(id) = container_id(container) {
        // cgroupfs driver: the leaf is the id, whichever CRI runtime made it.
        workload.container_id = Some(id);
    }
    workload
}

/// Resolves cgroup ids to workloads, with a cache.
#[derive(Debug)]
pub struct Attributor {
    cgroup_root: PathBuf,
    proc_root: PathBuf,
    cache: HashMap<u64, Arc<Workload>>,
}

impl Attributor {
    /// Finds the cgroup v2 mount from `/proc/self/mountinfo`.
    ///
    /// # Errors
    /// No cgroup v2 file system is mounted.
    pub fn detect() -> Result<Self, AttributionError> {
        let mountinfo = PathBuf::from("/proc/self/mountinfo");
        let text = std::fs::read_to_string(&mountinfo).map_err(|source| AttributionError::Io {
            path: mountinfo.clone(),
            source,
        })?;
        let root = cgroup2_mount(&text).ok_or(AttributionError::NoCgroup2 { mountinfo })?;
        Ok(Self::with_roots(root, PathBuf::from("/proc")))
    }

    /// Uses `cgroup_root` as the cgroup v2 mount and `proc_root` as `/proc`.
    #[must_use]
    pub fn with_roots(cgroup_root: PathBuf, proc_root: PathBuf) -> Self {
        Self {
            cgroup_root,
            proc_root,
            cache: HashMap::new(),
        }
    }

    /// The cgroup v2 mount.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.cgroup_root
    }

    /// The workload of cgroup `id`, or `None` if no cgroup has that id (any more).
    pub fn resolve(&mut self, id: u64) -> Option<Arc<Workload>> {
        if let Some(w) = self.cache.get(&id) {
            return Some(Arc::clone(w));
        }
        // One walk fills the cache with every directory, so later misses are rare.
        let mut stack = vec![self.cgroup_root.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(meta) = std::fs::symlink_metadata(&dir) else {
                continue;
            };
            if !self.cache.contains_key(&meta.ino()) {
                let rel = dir.strip_prefix(&self.cgroup_root).unwrap_or(Path::new(""));
                let workload = parse_cgroup_path(&format!("/{}", rel.display()));
                self.cache.insert(meta.ino(), Arc::new(workload));
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
        }
        self.cache.get(&id).map(Arc::clone)
    }

    /// Drops cached entries whose directory is gone or has another inode now.
    pub fn forget_dead(&mut self) {
        let root = self.cgroup_root.clone();
        self.cache.retain(|id, w| {
            let dir = root.join(w.cgroup_path.trim_start_matches('/'));
            std::fs::symlink_metadata(dir).is_ok_and(|m| m.ino() == *id)
        });
    }

    /// The cgroup v2 id of the directory at `rel` (relative to the root).
    ///
    /// # Errors
    /// The directory doesn't exist.
    pub fn cgroup_id_of_path(&self, rel: &str) -> Result<u64, AttributionError> {
        let path = self.cgroup_root.join(rel.trim_start_matches('/'));
        std::fs::metadata(&path)
            .map(|m| m.ino())
            .map_err(|source| AttributionError::Io { path, source })
    }

    /// The cgroup v2 id of process `pid`, from its `0::` line in `/proc/<pid>/cgroup`.
    ///
    /// # Errors
    /// The process is gone or not in a cgroup v2 hierarchy.
    pub fn cgroup_id_of_pid(&self, pid: u32) -> Result<u64, AttributionError> {
        let path = self.proc_root.join(pid.to_string()).join("cgroup");
        let text = std::fs::read_to_string(&path).map_err(|source| AttributionError::Io {
            path: path.clone(),
            source,
        })?;
        let rel = text
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .ok_or(AttributionError::NoUnifiedEntry { path })?;
        self.cgroup_id_of_path(rel.trim())
    }
}

/// The mount point of the first cgroup2 file system in a mountinfo table.
fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        let mount_point = left.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(mount_point))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f1c2b9d8e7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c";
    const UID: &str = "0d6e4a3b-1c2d-4e5f-8a9b-0c1d2e3f4a5b";
    const UID_: &str = "0d6e4a3b_1c2d_4e5f_8a9b_0c1d2e3f4a5b";

    struct Row {
        path: String,
        runtime: Runtime,
        id: bool,
        pod: bool,
        qos: Option<QosClass>,
    }

    fn row(path: String, runtime: Runtime, id: bool, pod: bool, qos: Option<QosClass>) -> Row {
        Row {
            path,
            runtime,
            id,
            pod,
            qos,
        }
    }

    #[test]
    fn reads_each_runtime_layout() {
        use QosClass::{BestEffort, Burstable, Guaranteed};
        use Runtime::*;
        let rows = vec![
            // Host and systemd.
            row("/".into(), Host, false, false, None),
            row("".into(), Host, false, false, None),
            row(
                "/system.slice/sshd.service".into(),
                Systemd,
                false,
                false,
                None,
            ),
            row(
                "/user.slice/user-1000.slice/session-3.scope".into(),
                Systemd,
                false,
                false,
                None,
            ),
            row(
                "/system.slice/containerd.service".into(),
                Systemd,
                false,
                false,
                None,
            ),
            // Docker: cgroupfs (v1 and v2) and systemd drivers.
            row(format!("/docker/{ID}"), Docker, true, false, None),
            row(format!("/docker/{ID}/"), Docker, true, false, None),
            row(
                format!("/system.slice/docker-{ID}.scope"),
                Docker,
                true,
                false,
                None,
            ),
            // Podman, with the v2 `container` child, conmon, and rootless.
            row(
                format!("/machine.slice/libpod-{ID}.scope"),
                Podman,
                true,
                false,
                None,
            ),
            row(
                format!("/machine.slice/libpod-{ID}.scope/container"),
                Podman,
                true,
                false,
                None,
            ),
            row(
                format!("/machine.slice/libpod-conmon-{ID}.scope"),
                Podman,
                false,
                false,
                None,
            ),
            row(
                format!(
                    "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"
                ),
                Podman,
                true,
                false,
                None,
            ),
            // CRI-O outside Kubernetes.
            row(
                format!("/machine.slice/crio-{ID}.scope"),
                CriO,
                true,
                false,
                None,
            ),
            row(
                format!("/machine.slice/crio-conmon-{ID}.scope"),
                CriO,
                false,
                false,
                None,
            ),
            // Kubernetes, systemd driver.
            row(
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"
                ),
                Containerd,
                true,
                true,
                Some(Burstable),
            ),
            row(
                format!("/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope"),
                Containerd,
                true,
                true,
                Some(Guaranteed),
            ),
            row(
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{ID}.scope"
                ),
                CriO,
                true,
                true,
                Some(BestEffort),
            ),
            row(
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-conmon-{ID}.scope"
                ),
                CriO,
                false,
                true,
                Some(BestEffort),
            ),
            row(
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{ID}.scope"
                ),
                Docker,
                true,
                true,
                Some(Burstable),
            ),
            // Kubernetes, cgroupfs driver (v1 and v2 look alike): the runtime is not told.
            row(
                format!("/kubepods/besteffort/pod{UID}/{ID}"),
                Cri,
                true,
                true,
                Some(BestEffort),
            ),
            row(
                format!("/kubepods/burstable/pod{UID}/{ID}"),
                Cri,
                true,
                true,
                Some(Burstable),
            ),
            row(
                format!("/kubepods/pod{UID}/{ID}"),
                Cri,
                true,
                true,
                Some(Guaranteed),
            ),
            // Pod-level cgroups: a pod, no container.
            row(
                format!("/kubepods/besteffort/pod{UID}"),
                Cri,
                false,
                true,
                Some(BestEffort),
            ),
            row(
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
                ),
                Cri,
                false,
                true,
                Some(Burstable),
            ),
            // kind / k3s nest kubepods under a prefix.
            row(
                format!("/kubelet/kubepods/burstable/pod{UID}/{ID}"),
                Cri,
                true,
                true,
                Some(Burstable),
            ),
            row(
                format!(
                    "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope"
                ),
                Containerd,
                true,
                true,
                Some(BestEffort),
            ),
            // Not ids: too short, not hex, uppercase; unknown layouts.
            row(
                format!("/docker/{}", &ID[..63]),
                Unknown,
                false,
                false,
                None,
            ),
            row(
                format!("/system.slice/docker-{}x.scope", &ID[..63]),
                Systemd,
                false,
                false,
                None,
            ),
            row(
                format!("/docker/{}", ID.to_uppercase()),
                Unknown,
                false,
                false,
                None,
            ),
            row(
                format!("/kubepods/besteffort/pod{UID}/{}", &ID[..40]),
                Cri,
                false,
                true,
                Some(BestEffort),
            ),
            row(format!("/default/{ID}"), Unknown, false, false, None),
            row(
                "/kubepods/besteffort/podnot-a-uid/x".into(),
                Unknown,
                false,
                false,
                None,
            ),
            row("/kubepods.slice".into(), Cri, false, false, None),
            row("/lxc/c1".into(), Unknown, false, false, None),
        ];
        for r in rows {
            let w = parse_cgroup_path(&r.path);
            assert_eq!(w.runtime, r.runtime, "runtime of {}", r.path);
            assert_eq!(
                w.container_id.as_deref(),
                r.id.then_some(ID),
                "id of {}",
                r.path
            );
            assert_eq!(
                w.pod_uid.as_deref(),
                r.pod.then_some(UID),
                "pod of {}",
                r.path
            );
            assert_eq!(w.qos, r.qos, "qos of {}", r.path);
        }
    }

    #[test]
    fn keeps_the_path_and_names_units() {
        let w = parse_cgroup_path("/system.slice/nvidia-persistenced.service/");
        assert_eq!(w.cgroup_path, "/system.slice/nvidia-persistenced.service");
        assert_eq!(w.unit.as_deref(), Some("nvidia-persistenced.service"));
        let json = serde_json::to_value(&w).unwrap();
        assert_eq!(json["runtime"], "systemd");
        assert_eq!(json["qos"], serde_json::Value::Null);
    }

    #[test]
    fn finds_the_cgroup2_mount() {
        let hybrid = "35 24 0:30 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(unified),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(cgroup2_mount("22 1 0:21 / /proc rw - proc proc rw\n"), None);
    }

    #[test]
    fn resolves_ids_through_a_cached_walk() {
        let base = std::env::temp_dir().join(format!("gpuwarden-attr-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let cgroups = base.join("cgroup");
        let leaf = cgroups.join(format!("system.slice/docker-{ID}.scope"));
        std::fs::create_dir_all(&leaf).unwrap();
        let proc_dir = base.join("proc/42");
        std::fs::create_dir_all(&proc_dir).unwrap();
        std::fs::write(
            proc_dir.join("cgroup"),
            format!("1:name=systemd:/\n0::/system.slice/docker-{ID}.scope\n"),
        )
        .unwrap();

        let mut attributor = Attributor::with_roots(cgroups.clone(), base.join("proc"));
        let id = std::fs::metadata(&leaf).unwrap().ino();
        assert_eq!(attributor.cgroup_id_of_pid(42).unwrap(), id);
        let w = attributor.resolve(id).unwrap();
        assert_eq!(w.runtime, Runtime::Docker);
        assert_eq!(w.container_id.as_deref(), Some(ID));

        // Cached: still answers after the directory is gone, until forget_dead.
        std::fs::remove_dir(&leaf).unwrap();
        assert!(attributor.resolve(id).is_some());
        attributor.forget_dead();
        assert!(attributor.resolve(id).is_none());
        assert!(matches!(
            attributor.cgroup_id_of_pid(7),
            Err(AttributionError::Io { .. })
        ));
        std::fs::remove_dir_all(&base).unwrap();
    }
}
