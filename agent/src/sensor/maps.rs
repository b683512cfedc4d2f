//! The sensor's maps as the agent's logic sees them: [`KernelMap`], a narrow view of one BPF
//! hash map, implemented by aya's maps here and by `fake::FakeMap` in unit tests, so map
//! upkeep and enforcement run without a kernel (docs/architecture.md, "The code shows the data
//! path").

use aya::maps::{HashMap, MapData, PerCpuArray, PerCpuHashMap};
use gpuwarden_agent_common::maps::{
    Allocation, CgroupDeviceKey, ClientInfo, FdInfo, FdKey, FileId, FileRefs, GpuNode, HandleKey,
    IoctlKey, Mapping, MappingKey, ObjectInfo, PathKey, ProcInfo, Quota, TableReleased, TableUse,
};

/// `BPF_NOEXIST`: insert only where the key is absent.
const NOEXIST: u64 = 1;

/// A map write or removal the kernel refused.
#[derive(Debug, thiserror::Error)]
#[error("map {map}: {source}")]
pub(crate) struct MapError {
    /// The map.
    pub map: &'static str,
    /// Why.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// One BPF map, as the agent's logic uses it.
pub(crate) trait KernelMap<K, V>: Send {
    /// The value at `key`; `None` when absent (or unreadable, which the caller can't tell apart
    /// and treats the same).
    fn get(&self, key: &K) -> Option<V>;
    /// Every entry now (the kernel may change the map meanwhile).
    fn entries(&self) -> Vec<(K, V)>;
    /// Every key now.
    fn keys(&self) -> Vec<K> {
        self.entries().into_iter().map(|(k, _)| k).collect()
    }
    /// Sets `key` to `value`.
    ///
    /// # Errors
    /// The kernel refused (a full map, a read-only map).
    fn insert(&mut self, key: K, value: V) -> Result<(), MapError>;
    /// Sets `key` to `value` where it is absent (the programs may have added it meanwhile).
    ///
    /// # Errors
    /// The key is present, or the kernel refused.
    fn insert_new(&mut self, key: K, value: V) -> Result<(), MapError>;
    /// Removes `key`.
    ///
    /// # Errors
    /// The key is absent, or the kernel refused.
    fn remove(&mut self, key: &K) -> Result<(), MapError>;
}

/// An aya map with its name, for errors.
pub(crate) struct Named<M> {
    name: &'static str,
    map: M,
}

impl<M> Named<M> {
    pub(crate) fn new(name: &'static str, map: M) -> Self {
        Self { name, map }
    }

    fn err(&self, e: aya::maps::MapError) -> MapError {
        MapError {
            map: self.name,
            source: Box::new(e),
        }
    }
}

impl<K, V> KernelMap<K, V> for Named<HashMap<MapData, K, V>>
where
    K: aya::Pod + Send,
    V: aya::Pod + Send,
{
    fn get(&self, key: &K) -> Option<V> {
        self.map.get(key, 0).ok()
    }

    fn entries(&self) -> Vec<(K, V)> {
        self.map.iter().flatten().collect()
    }

    fn keys(&self) -> Vec<K> {
        self.map.keys().flatten().collect()
    }

    fn insert(&mut self, key: K, value: V) -> Result<(), MapError> {
        self.map.insert(key, value, 0).map_err(|e| self.err(e))
    }

    fn insert_new(&mut self, key: K, value: V) -> Result<(), MapError> {
        self.map
            .insert(key, value, NOEXIST)
            .map_err(|e| self.err(e))
    }

    fn remove(&mut self, key: &K) -> Result<(), MapError> {
        self.map.remove(key).map_err(|e| self.err(e))
    }
}

/// A per-CPU counter map, read as the sum over CPUs; only the kernel writes it.
impl<K> KernelMap<K, u64> for Named<PerCpuHashMap<MapData, K, u64>>
where
    K: aya::Pod + Send,
{
    fn get(&self, key: &K) -> Option<u64> {
        self.map
            .get(key, 0)
            .ok()
            .map(|per_cpu| per_cpu.iter().sum())
    }

    fn entries(&self) -> Vec<(K, u64)> {
        self.map
            .iter()
            .flatten()
            .map(|(k, per_cpu)| (k, per_cpu.iter().sum()))
            .collect()
    }

    fn keys(&self) -> Vec<K> {
        self.map.keys().flatten().collect()
    }

    fn insert(&mut self, _key: K, _value: u64) -> Result<(), MapError> {
        Err(read_only(self.name))
    }

    fn insert_new(&mut self, _key: K, _value: u64) -> Result<(), MapError> {
        Err(read_only(self.name))
    }

    fn remove(&mut self, key: &K) -> Result<(), MapError> {
        self.map.remove(key).map_err(|e| self.err(e))
    }
}

/// A per-CPU statistics array, read as the sum over CPUs; only the kernel writes it.
impl KernelMap<u32, u64> for Named<PerCpuArray<MapData, u64>> {
    fn get(&self, index: &u32) -> Option<u64> {
        self.map
            .get(index, 0)
            .ok()
            .map(|per_cpu| per_cpu.iter().sum())
    }

    fn entries(&self) -> Vec<(u32, u64)> {
        (0..self.map.len())
            .filter_map(|i| self.get(&i).map(|v| (i, v)))
            .collect()
    }

    fn insert(&mut self, _key: u32, _value: u64) -> Result<(), MapError> {
        Err(read_only(self.name))
    }

    fn insert_new(&mut self, _key: u32, _value: u64) -> Result<(), MapError> {
        Err(read_only(self.name))
    }

    fn remove(&mut self, _key: &u32) -> Result<(), MapError> {
        Err(read_only(self.name))
    }
}

fn read_only(map: &'static str) -> MapError {
    MapError {
        map,
        source: "only the kernel side writes this map".into(),
    }
}

/// A boxed map.
pub(crate) type Map<K, V> = Box<dyn KernelMap<K, V>>;

/// The maps telemetry reads and tidies (the quota maps belong to enforcement).
pub(crate) struct TelemetryMaps {
    /// GPU device-node paths to track (kernels without BTF).
    pub gpu_paths: Map<PathKey, GpuNode>,
    /// GPU device nodes by what identifies the opened file.
    pub gpu_files: Map<FileId, GpuNode>,
    /// Open GPU fds.
    pub gpu_fds: Map<FdKey, FdInfo>,
    /// Open GPU files: tracked fds on each, and the clients made through it.
    pub files: Map<u64, FileRefs>,
    /// Managed-memory mappings of the UVM node.
    pub mappings: Map<MappingKey, Mapping>,
    /// Processes holding GPU fds.
    pub procs: Map<u32, ProcInfo>,
    /// RM clients holding counted memory.
    pub clients: Map<u32, ClientInfo>,
    /// Counted allocations.
    pub allocations: Map<HandleKey, Allocation>,
    /// GPU index of device objects.
    pub object_devices: Map<HandleKey, ObjectInfo>,
    /// Video memory by (cgroup, GPU).
    pub cgroup_memory: Map<CgroupDeviceKey, u64>,
    /// ioctl counts by (cgroup, device, family, command), summed over CPUs.
    pub ioctl_counts: Map<IoctlKey, u64>,
    /// Statistics, summed over CPUs.
    pub stats: Map<u32, u64>,
    /// Each cgroup's entries in the tables it can grow, and its refusals past their budgets.
    pub cgroup_tables: Map<u64, TableUse>,
    /// Each cgroup's entries the agent removed itself.
    pub cgroup_tables_released: Map<u64, TableReleased>,
}

/// The maps enforcement writes (taken from the sensor once, by the enforcer): quotas by bound cgroup id, the quota each cgroup counts against,
/// and (read only) what each cgroup holds.
pub(crate) struct QuotaMaps {
    /// Quotas by the id of the cgroup they are bound at.
    pub quotas: Map<u64, Quota>,
    /// cgroup id → the key of the quota it counts against.
    pub cgroup_quota: Map<u64, u64>,
    /// GPU memory by (cgroup, GPU), as the programs count it.
    pub cgroup_memory: Map<CgroupDeviceKey, u64>,
}

/// In-memory maps for unit tests.
#[cfg(test)]
pub(crate) mod fake {
    use std::{
        collections::HashMap,
        sync::{Arc, Mutex},
    };

    use std::hash::Hash;

    use super::{KernelMap, MapError};

    /// A map in memory; clones share their entries, so a test keeps one to look at what the
    /// code under test wrote.
    #[derive(Debug)]
    pub(crate) struct FakeMap<K, V>(pub Arc<Mutex<HashMap<K, V>>>);

    impl<K, V> Clone for FakeMap<K, V> {
        fn clone(&self) -> Self {
            Self(Arc::clone(&self.0))
        }
    }

    impl<K, V> Default for FakeMap<K, V> {
        fn default() -> Self {
            Self(Arc::default())
        }
    }

    impl<K: Hash + Eq + Copy, V: Copy> FakeMap<K, V> {
        /// A boxed clone, for the code under test.
        pub(crate) fn boxed(&self) -> Box<dyn KernelMap<K, V>>
        where
            K: Send + 'static,
            V: Send + 'static,
        {
            Box::new(self.clone())
        }

        /// The value at `key`.
        pub(crate) fn at(&self, key: &K) -> Option<V> {
            self.0.lock().unwrap().get(key).copied()
        }

        /// How many entries.
        pub(crate) fn len(&self) -> usize {
            self.0.lock().unwrap().len()
        }
    }

    fn missing() -> MapError {
        MapError {
            map: "fake",
            source: "no such key".into(),
        }
    }

    impl<K: Hash + Eq + Copy + Send, V: Copy + Send> KernelMap<K, V> for FakeMap<K, V> {
        fn get(&self, key: &K) -> Option<V> {
            self.at(key)
        }

        fn entries(&self) -> Vec<(K, V)> {
            self.0
                .lock()
                .unwrap()
                .iter()
                .map(|(k, v)| (*k, *v))
                .collect()
        }

        fn insert(&mut self, key: K, value: V) -> Result<(), MapError> {
            self.0.lock().unwrap().insert(key, value);
            Ok(())
        }

        fn insert_new(&mut self, key: K, value: V) -> Result<(), MapError> {
            let mut map = self.0.lock().unwrap();
            if map.contains_key(&key) {
                return Err(MapError {
                    map: "fake",
                    source: "key exists".into(),
                });
            }
            map.insert(key, value);
            Ok(())
        }

        fn remove(&mut self, key: &K) -> Result<(), MapError> {
            self.0
                .lock()
                .unwrap()
                .remove(key)
                .map(|_| ())
                .ok_or_else(missing)
        }
    }
}
