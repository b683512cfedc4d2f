//! Attribution: which container, pod or systemd unit a cgroup id belongs to.
//!
//! The programs report `bpf_get_current_cgroup_id()`, the inode number of the process's cgroup v2
//! directory. [`Attributor`] finds that directory under the cgroup v2 mount (`/sys/fs/cgroup`, or
//! `/sys/fs/cgroup/unified` in hybrid mode) and [`parse_cgroup_path`] reads the container runtime,
//! container id, pod UID and `QoS` class from the path's shape. Results are cached and forgotten
//! when the directory goes away. [`kubelet`] adds a pod's name and namespace to its UID.
//!
//! - [`cgroup_path`]: the pure path parser;
//! - [`attributor`]: cgroup id → directory → workload, cached;
//! - [`kubelet`]: pod UID → name and namespace, from the node's kubelet.
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

pub mod attributor;
pub mod cgroup_path;
pub mod kubelet;

pub use attributor::{AttributionError, Attributor};
pub use cgroup_path::{QosClass, Runtime, Workload, parse_cgroup_path};
