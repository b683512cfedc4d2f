//! TEMPORARY stub until the real module lands.
#![allow(missing_docs)]
use std::{collections::HashMap, os::unix::fs::MetadataExt, path::PathBuf, sync::Arc};

#[derive(Debug, thiserror::Error)]
pub enum AttributionError {
    #[error("no cgroup2")]
    NoCgroup2,
    #[error("io {0}")]
    Io(#[from] std::io::Error),
}
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime { Host, Unknown }
impl Runtime { pub fn as_str(self) -> &'static str { match self { Self::Host => "host", Self::Unknown => "unknown" } } }
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass { Guaranteed }
impl QosClass { pub fn as_str(self) -> &'static str { "guaranteed" } }
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload { pub cgroup_path: String, pub runtime: Runtime, pub container_id: Option<String>, pub pod_uid: Option<String>, pub qos: Option<QosClass>, pub unit: Option<String> }
pub struct Attributor { root: PathBuf, cache: HashMap<u64, Arc<Workload>> }
impl Attributor {
    pub fn detect() -> Result<Self, AttributionError> { Ok(Self { root: PathBuf::from("/sys/fs/cgroup/unified"), cache: HashMap::new() }) }
    pub fn resolve(&mut self, id: u64) -> Option<Arc<Workload>> {
        if let Some(w) = self.cache.get(&id) { return Some(w.clone()); }
        let mut stack = vec![self.root.clone()];
        while let Some(d) = stack.pop() {
            if let Ok(m) = std::fs::metadata(&d) { if m.ino() == id {
                let rel = format!("/{}", d.strip_prefix(&self.root).ok()?.display());
                let w = Arc::new(Workload { cgroup_path: rel, runtime: Runtime::Unknown, container_id: None, pod_uid: None, qos: None, unit: None });
                self.cache.insert(id, w.clone()); return Some(w);
            }}
            if let Ok(rd) = std::fs::read_dir(&d) { for e in rd.flatten() { if e.file_type().map(|t| t.is_dir()).unwrap_or(false) { stack.push(e.path()); } } }
        }
        None
    }
    pub fn forget_dead(&mut self) {}
    pub fn cgroup_id_of_pid(&self, pid: u32) -> Result<u64, AttributionError> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
        let p = s.lines().find_map(|l| l.strip_prefix("0::")).ok_or(AttributionError::NoCgroup2)?;
        Ok(std::fs::metadata(self.root.join(p.trim_start_matches('/')))?.ino())
    }
}
