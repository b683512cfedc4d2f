//! Reading who a cgroup belongs to from its path alone: runtime, container id, pod UID, `QoS`
//! class and systemd unit. Pure: no file system, no state.

use std::fmt;

use serde::{Serialize, Serializer};

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

/// Kubernetes `QoS` class of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// No `QoS` level in the path.
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
    /// The pod's `QoS` class, under `kubepods`.
    pub qos: Option<QosClass>,
    /// The innermost systemd unit on the path, where systemd manages the cgroups: every level
    /// from the root down to it is a unit (`.slice`, `.service`, `.scope`, ...).
    pub unit: Option<String>,
}

/// Reads runtime, container id, pod UID, `QoS` class and systemd unit from a cgroup path: a v2 path,
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

/// The `QoS` class a level below kubepods names: `burstable` (cgroupfs) or
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

/// The path of a `/proc/<pid>/cgroup` line for the v2 hierarchy (`0::<path>`; paths may hold
/// colons).
pub(crate) fn unified_path(line: &str) -> Option<&str> {
    let mut fields = line.splitn(3, ':');
    let v2 = fields.next()? == "0" && fields.next()?.is_empty();
    v2.then(|| fields.next()).flatten()
}

#[cfg(test)]
mod tests;
