//! Attribution: which container, pod or systemd unit a cgroup id belongs to.
//!
//! The programs report `bpf_get_current_cgroup_id()`, the inode number of the process's cgroup v2
//! directory. [`Attributor`] finds that directory under the cgroup v2 mount (`/sys/fs/cgroup`, or
//! `/sys/fs/cgroup/unified` in hybrid mode) and [`parse_cgroup_path`] reads the container runtime,
//! container id, pod UID and QoS class from the path's shape. Results are cached and forgotten
//! when the directory goes away.
//!
//! The parser only names a container id where a runtime's layout puts one: an unknown layout
//! yields the path and no id, never a wrong id.
//!
//! # Example
//!
//! ```
//! use gpuwarden_agent::attribution::{Runtime, parse_cgroup_path};
//!
//! let w = parse_cgroup_path("/system.slice/nvidia-persistenced.service");
//! assert_eq!(w.runtime, Runtime::Systemd);
//! assert_eq!(w.unit.as_deref(), Some("nvidia-persistenced.service"));
//! ```

pub mod kubelet;

use std::{
    collections::HashMap,
    fmt, fs, io,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use serde::{Serialize, Serializer};

/// Where process information is read by an [`Attributor::detect`]ed attributor.
const PROC: &str = "/proc";

/// How long an id that a walk didn't find is answered `None` without walking again.
///
/// Cgroup ids are not reused on 64-bit kernels, so a miss is final for a real cgroup; the limit
/// keeps the set small and heals a walk that raced a rename.
const MISS_TTL: Duration = Duration::from_secs(10);

/// Errors finding cgroups.
#[derive(Debug, thiserror::Error)]
pub enum AttributionError {
    /// The mount table could not be read.
    #[error("cannot read the mount table {path}: {source}")]
    ReadMountinfo {
        /// The mount table.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// No cgroup v2 hierarchy is mounted.
    #[error("no cgroup v2 file system is mounted (per {mountinfo})")]
    NoCgroup2 {
        /// The mount table read.
        mountinfo: PathBuf,
    },
    /// A process's cgroup file could not be read (usually: the process is gone).
    #[error("cannot read {path}: {source}")]
    ReadProcCgroup {
        /// The `/proc/<pid>/cgroup` file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The process is not in a cgroup v2 hierarchy.
    #[error("{path} has no cgroup v2 entry (\"0::\")")]
    NoUnifiedEntry {
        /// The `/proc/<pid>/cgroup` file.
        path: PathBuf,
    },
    /// The cgroup path climbs above the root (a process in another cgroup namespace shows as
    /// `/../..`).
    #[error("cgroup {cgroup} lies outside the cgroup root {root}")]
    OutsideRoot {
        /// The cgroup path asked for.
        cgroup: String,
        /// The cgroup v2 mount.
        root: PathBuf,
    },
    /// The cgroup directory could not be examined (usually: it was removed).
    #[error("cannot stat cgroup {path}: {source}")]
    Stat {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The path names something other than a directory.
    #[error("{path} is not a cgroup directory")]
    NotACgroup {
        /// The path.
        path: PathBuf,
    },
}

/// A container runtime, as told by the cgroup layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Runtime {
    /// A host process (the root cgroup).
    Host,
    /// A systemd unit (service, scope, slice) that is not a container.
    Systemd,
    /// Docker.
    Docker,
    /// containerd (its CRI plugin names scopes `cri-containerd-<id>.scope`).
    Containerd,
    /// Some CRI runtime: the kubelet's cgroupfs layout (`pod<uid>/<id>`) doesn't say which, and
    /// pod-level cgroups belong to no container.
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

impl fmt::Display for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Runtime {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
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
    /// Stable name (part of the snapshot interface; also the kubelet's name for the level).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "guaranteed",
            Self::Burstable => "burstable",
            Self::BestEffort => "besteffort",
        }
    }
}

impl fmt::Display for QosClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for QosClass {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// Who a cgroup belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Workload {
    /// The cgroup path relative to the cgroup root, normalised: `/` for the root, no trailing or
    /// doubled slashes.
    pub cgroup_path: String,
    /// The runtime.
    pub runtime: Runtime,
    /// The container id (64 lowercase hex digits), where the layout names one.
    pub container_id: Option<String>,
    /// The pod UID (canonical: lowercase, with dashes), under `kubepods`.
    pub pod_uid: Option<String>,
    /// The pod's QoS class, under `kubepods`.
    pub qos: Option<QosClass>,
    /// The innermost systemd unit on the path, where systemd manages the cgroups: every level
    /// from the root down to it is a unit (`.slice`, `.service`, `.scope`, ...).
    pub unit: Option<String>,
}

/// Reads runtime, container id, pod UID, QoS class and systemd unit from a cgroup path: a v2 path,
/// or the path part of a v1 `/proc/<pid>/cgroup` line (`12:memory:/docker/<id>` gives
/// `/docker/<id>`), which has the same shapes.
///
/// A process in a sub-cgroup of a container (systemd inside it, podman's `container` child) is
/// attributed to that container.
#[must_use]
pub fn parse_cgroup_path(path: &str) -> Workload {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let mut workload = Workload {
        cgroup_path: format!("/{}", components.join("/")),
        runtime: Runtime::Unknown,
        container_id: None,
        pod_uid: None,
        qos: None,
        unit: systemd_unit(&components).map(str::to_owned),
    };
    if components.is_empty() {
        workload.runtime = Runtime::Host;
        return workload;
    }

    // Kubernetes: the kubepods level may sit under a prefix (kind, k3s, a kubelet --cgroup-root),
    // even inside a container (a kind node); the first one is the cluster the path belongs to.
    if let Some(i) = components.iter().position(|c| is_kubepods(c)) {
        parse_kubepods(components[i], &components[i + 1..], &mut workload);
        return workload;
    }

    // The innermost container wins (docker-in-docker names the inner one).
    for (i, component) in components.iter().enumerate().rev() {
        let found = runtime_cgroup(component).or_else(|| {
            // Docker's cgroupfs driver: `docker/<id>`.
            let docker = i > 0 && components[i - 1] == "docker";
            docker
                .then(|| container_id(component))
                .flatten()
                .map(|id| (Runtime::Docker, Some(id)))
        });
        if let Some((runtime, id)) = found {
            workload.runtime = runtime;
            workload.container_id = id;
            return workload;
        }
    }

    if workload.unit.is_some() {
        workload.runtime = Runtime::Systemd;
    }
    workload
}

/// `s`, if it is a container id as runtimes write them: 64 lowercase hex digits. Uppercase is
/// rejected on purpose: no runtime writes it, so such a name is not a runtime's.
fn container_id(s: &str) -> Option<String> {
    is_lower_hex(s, 64).then(|| s.to_owned())
}

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A cgroup a runtime names after a container: `(runtime, container id)`.
fn runtime_cgroup(component: &str) -> Option<(Runtime, Option<String>)> {
    const MONITORS: [(&str, Runtime); 2] = [
        ("crio-conmon-", Runtime::CriO),
        ("libpod-conmon-", Runtime::Podman),
    ];
    // (prefix, runtime, whether the systemd `.scope` suffix is required). CRI-O and podman use the
    // same names with their cgroupfs managers, minus `.scope`; docker and containerd don't.
    const CONTAINERS: [(&str, Runtime, bool); 4] = [
        ("cri-containerd-", Runtime::Containerd, true),
        ("crio-", Runtime::CriO, false),
        ("libpod-", Runtime::Podman, false),
        ("docker-", Runtime::Docker, true),
    ];
    let (stem, scoped) = match component.strip_suffix(".scope") {
        Some(stem) => (stem, true),
        None => (component, false),
    };
    // Monitors first: their prefixes extend the containers'. conmon watches the container from its
    // own cgroup, outside it: the runtime is known, but its processes aren't the container's, so
    // they get no container id.
    for (prefix, runtime) in MONITORS {
        if let Some(id) = stem.strip_prefix(prefix) {
            return container_id(id).map(|_| (runtime, None));
        }
    }
    CONTAINERS
        .iter()
        .find_map(|&(prefix, runtime, needs_scope)| {
            let id = container_id(stem.strip_prefix(prefix)?)?;
            (scoped || !needs_scope).then_some((runtime, Some(id)))
        })
}

/// The kubelet's top level: `kubepods` (cgroupfs), `kubepods.slice` or `<prefix>-kubepods.slice`
/// (systemd, under a `<prefix>.slice`).
fn is_kubepods(component: &str) -> bool {
    component == "kubepods"
        || component == "kubepods.slice"
        || component.ends_with("-kubepods.slice")
}

/// The levels below kubepods: `[qos level] pod<uid> [container [descendants]]`.
fn parse_kubepods(kubepods: &str, rest: &[&str], workload: &mut Workload) {
    workload.runtime = Runtime::Cri;
    // The systemd driver spells each level as its parent's name plus a suffix.
    let stem = kubepods.strip_suffix(".slice");
    let (qos, rest) = match rest.split_first() {
        Some((first, tail)) => match qos_level(first, stem) {
            Some(qos) => (Some(qos), tail),
            None => (None, rest),
        },
        None => (None, rest),
    };
    let Some((pod, rest)) = rest.split_first() else {
        // kubepods or a QoS level itself: no pod.
        workload.qos = qos;
        return;
    };
    let Some(uid) = pod_uid(pod, stem, qos) else {
        workload.runtime = Runtime::Unknown;
        return;
    };
    workload.pod_uid = Some(uid);
    workload.qos = Some(qos.unwrap_or(QosClass::Guaranteed));
    let Some(container) = rest.first() else {
        // The pod's own cgroup: a pod, no container.
        return;
    };
    // Deeper levels are inside this container, so they share its id.
    if let Some((runtime, id)) = runtime_cgroup(container) {
        workload.runtime = runtime;
        workload.container_id = id;
    } else if let Some(id) = container_id(container) {
        // cgroupfs driver: a bare id, whichever CRI runtime made it (containerd, dockershim, ...).
        workload.container_id = Some(id);
    } else {
        // In the pod, but not a container layout we know: keep the pod, claim no container.
        workload.runtime = Runtime::Unknown;
    }
}

/// The QoS class a level below kubepods names: `burstable` (cgroupfs) or
/// `<kubepods stem>-burstable.slice` (systemd), and the same for `besteffort`.
fn qos_level(component: &str, stem: Option<&str>) -> Option<QosClass> {
    let level = match stem {
        Some(stem) => component
            .strip_prefix(stem)?
            .strip_prefix('-')?
            .strip_suffix(".slice")?,
        None => component,
    };
    match level {
        "burstable" => Some(QosClass::Burstable),
        "besteffort" => Some(QosClass::BestEffort),
        _ => None,
    }
}

/// The canonical pod UID a pod level names: `pod<uid>` (cgroupfs) or
/// `<kubepods stem>[-<qos>]-pod<uid with _ for ->.slice` (systemd; `-` separates slice levels).
fn pod_uid(component: &str, stem: Option<&str>, qos: Option<QosClass>) -> Option<String> {
    let (raw, separator) = match stem {
        Some(stem) => {
            let parent = match qos {
                Some(qos) => format!("{stem}-{}", qos.as_str()),
                None => stem.to_owned(),
            };
            let raw = component
                .strip_prefix(parent.as_str())?
                .strip_prefix("-pod")?
                .strip_suffix(".slice")?;
            (raw, '_')
        }
        None => (component.strip_prefix("pod")?, '-'),
    };
    // Static pods' UIDs are a bare 32-digit hash of the manifest.
    if is_lower_hex(raw, 32) {
        return Some(raw.to_owned());
    }
    let groups: Vec<&str> = raw.split(separator).collect();
    let uuid = groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| is_lower_hex(g, len));
    uuid.then(|| groups.join("-"))
}

/// The innermost unit of the leading run of systemd unit names.
fn systemd_unit<'a>(components: &[&'a str]) -> Option<&'a str> {
    components
        .iter()
        .take_while(|c| is_unit_name(c))
        .last()
        .copied()
}

/// Whether `component` is named like a systemd unit that can own a cgroup.
fn is_unit_name(component: &str) -> bool {
    [".slice", ".service", ".scope", ".socket", ".mount", ".swap"]
        .iter()
        .any(|suffix| {
            component
                .strip_suffix(suffix)
                .is_some_and(|s| !s.is_empty())
        })
}

/// A cached answer, with the directory it came from (to tell when it's gone).
#[derive(Debug)]
struct Entry {
    dir: PathBuf,
    workload: Arc<Workload>,
}

/// Resolves cgroup ids to workloads, with a cache.
///
/// A miss walks the whole cgroup tree once and caches every directory it sees, so later lookups
/// hit. Cached answers stay until [`Attributor::forget_dead`] finds their directory gone.
#[derive(Debug)]
pub struct Attributor {
    cgroup_root: PathBuf,
    proc_root: PathBuf,
    cache: HashMap<u64, Entry>,
    /// Ids no walk found, and when: asked again soon, they don't cost another walk.
    missing: HashMap<u64, Instant>,
}

impl Attributor {
    /// Finds the cgroup v2 mount from `/proc/self/mountinfo`; processes are read from `/proc`.
    ///
    /// # Errors
    /// The mount table can't be read, or lists no cgroup v2 file system.
    pub fn detect() -> Result<Self, AttributionError> {
        let mountinfo = PathBuf::from(gpuwarden_runtime::mountinfo::SELF);
        let text =
            fs::read_to_string(&mountinfo).map_err(|source| AttributionError::ReadMountinfo {
                path: mountinfo.clone(),
                source,
            })?;
        let root = gpuwarden_runtime::mountinfo::cgroup2_mount(&text)
            .ok_or(AttributionError::NoCgroup2 { mountinfo })?;
        Ok(Self::with_roots(root, PathBuf::from(PROC)))
    }

    /// Uses `cgroup_root` as the cgroup v2 mount and `proc_root` as `/proc`.
    #[must_use]
    pub fn with_roots(cgroup_root: PathBuf, proc_root: PathBuf) -> Self {
        Self {
            cgroup_root,
            proc_root,
            cache: HashMap::new(),
            missing: HashMap::new(),
        }
    }

    /// The cgroup v2 mount.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.cgroup_root
    }

    /// The workload of cgroup `id`, or `None` if no cgroup has that id (any more).
    ///
    /// A miss walks the tree at most once per call; an id that walk didn't find is answered
    /// `None` without walking for a few seconds after.
    pub fn resolve(&mut self, id: u64) -> Option<Arc<Workload>> {
        if let Some(entry) = self.cache.get(&id) {
            return Some(Arc::clone(&entry.workload));
        }
        if self
            .missing
            .get(&id)
            .is_some_and(|at| at.elapsed() < MISS_TTL)
        {
            return None;
        }
        let started = Instant::now();
        self.walk();
        let found = self.cache.get(&id).map(|e| Arc::clone(&e.workload));
        if found.is_none() {
            self.missing.insert(id, started);
        }
        found
    }

    /// Caches every directory under the root. Iterative, doesn't follow symlinks, and skips what
    /// vanishes meanwhile (cgroups come and go during the walk).
    fn walk(&mut self) {
        let Ok(meta) = fs::metadata(&self.cgroup_root) else {
            return;
        };
        let root = self.cgroup_root.clone();
        self.remember(meta.ino(), &root, "/");
        let mut stack = vec![(root, String::new())];
        while let Some((dir, rel)) = stack.pop() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                // DirEntry::metadata doesn't follow symlinks.
                let Ok(meta) = entry.metadata() else {
                    continue;
                };
                let child_rel = format!("{rel}/{}", entry.file_name().to_string_lossy());
                let child = entry.path();
                self.remember(meta.ino(), &child, &child_rel);
                stack.push((child, child_rel));
            }
        }
    }

    fn remember(&mut self, id: u64, dir: &Path, rel: &str) {
        if self.cache.get(&id).is_some_and(|e| e.dir == dir) {
            return;
        }
        let entry = Entry {
            dir: dir.to_owned(),
            workload: Arc::new(parse_cgroup_path(rel)),
        };
        self.cache.insert(id, entry);
    }

    /// Drops cached entries whose directory is gone or has another inode now, and expired misses.
    pub fn forget_dead(&mut self) {
        self.cache.retain(|id, entry| {
            fs::symlink_metadata(&entry.dir).is_ok_and(|m| m.is_dir() && m.ino() == *id)
        });
        self.missing.retain(|_, at| at.elapsed() < MISS_TTL);
    }

    /// The cgroup v2 id of the directory at `rel` (relative to the root; `/` is the root).
    ///
    /// # Errors
    /// `rel` climbs above the root, or names no directory.
    pub fn cgroup_id_of_path(&self, rel: &str) -> Result<u64, AttributionError> {
        let mut path = self.cgroup_root.clone();
        for component in rel.split('/').filter(|c| !c.is_empty() && *c != ".") {
            if component == ".." {
                return Err(AttributionError::OutsideRoot {
                    cgroup: rel.to_owned(),
                    root: self.cgroup_root.clone(),
                });
            }
            path.push(component);
        }
        let meta = fs::metadata(&path).map_err(|source| AttributionError::Stat {
            path: path.clone(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(AttributionError::NotACgroup { path });
        }
        Ok(meta.ino())
    }

    /// The cgroup v2 id of process `pid`, from its `0::` line in `/proc/<pid>/cgroup`.
    ///
    /// # Errors
    /// The process is gone, not in a cgroup v2 hierarchy, in a cgroup outside the root (another
    /// cgroup namespace), or in a cgroup removed since (a zombie's line ends in ` (deleted)`).
    pub fn cgroup_id_of_pid(&self, pid: u32) -> Result<u64, AttributionError> {
        let path = self.proc_root.join(pid.to_string()).join("cgroup");
        let text =
            fs::read_to_string(&path).map_err(|source| AttributionError::ReadProcCgroup {
                path: path.clone(),
                source,
            })?;
        let cgroup = text
            .lines()
            .find_map(unified_path)
            .ok_or(AttributionError::NoUnifiedEntry { path })?;
        self.cgroup_id_of_path(cgroup)
    }
}

/// The path of a `/proc/<pid>/cgroup` line for the v2 hierarchy (`0::<path>`; paths may hold
/// colons).
fn unified_path(line: &str) -> Option<&str> {
    let mut fields = line.splitn(3, ':');
    let v2 = fields.next()? == "0" && fields.next()?.is_empty();
    v2.then(|| fields.next()).flatten()
}

#[cfg(test)]
mod tests {
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
    #[allow(clippy::too_many_lines)]
    fn reads_each_runtime_layout() {
        use QosClass::{BestEffort, Burstable, Guaranteed};
        use Runtime::{Containerd, Cri, CriO, Docker, Host, Podman, Systemd, Unknown};
        let k8s_sd_burstable =
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice");
        let k8s_sd_besteffort = format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
        );
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
                format!(
                    "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"
                ),
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

    fn ino(path: &Path) -> u64 {
        fs::symlink_metadata(path).unwrap().ino()
    }

    #[test]
    fn resolves_ids_through_a_cached_walk() {
        let tmp = gpuwarden_test_support::scratch("walk");
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
        let tmp = gpuwarden_test_support::scratch("noroot");
        let mut attributor =
            Attributor::with_roots(tmp.path().join("absent"), tmp.path().to_owned());
        assert!(attributor.resolve(1).is_none());
        assert!(attributor.resolve(1).is_none());
        attributor.forget_dead();
    }

    #[test]
    fn finds_the_cgroup_of_a_pid() {
        let tmp = gpuwarden_test_support::scratch("pid");
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
}
