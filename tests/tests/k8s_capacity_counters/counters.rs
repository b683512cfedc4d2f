//! kube-scheduler's counter arithmetic for partitionable devices (KEP-4815), transcribed as a
//! test oracle: how a pool's slices become counter sets and devices, and whether a device may
//! be allocated given what is allocated already.
//!
//! Source: `k8s.io/dynamic-resource-allocation` (staging in kubernetes/kubernetes), tag
//! `v0.35.6` (Kubernetes 1.35.6):
//! - `structured/internal/experimental/pools_experimental.go`: `GatherPools` (a slice with
//!   `sharedCounters` skipped when `PartitionableDevices` is off; slices of a pool at a lower
//!   generation than the highest dropped (`addSlice`); a pool with fewer slices than its
//!   `resourceSliceCount` incomplete, never allocated from), `buildPool` (slices with
//!   `sharedCounters` are counter slices, the others device slices),
//!   `getAndValidateCounterSets` (a counter set name twice: pool invalid),
//!   `validateDeviceCounterConsumption` (a consumption naming a set or counter not there: pool
//!   invalid);
//! - `structured/internal/experimental/allocator_experimental.go`: `allocateDevice` (a device
//!   consuming counters is refused when `PartitionableDevices` is off; a device in use is
//!   refused), `checkAvailableCounters` (available = the sets' counters less what allocated
//!   devices consume, computed once per pool; the device's consumption is added to what the
//!   devices being allocated consume; refused, and its consumption taken back, when any counter
//!   of any set is then consumed beyond what is available), `deallocateCountersForDevice`.
//!
//! Tag `v0.36.2` (`structured/internal/incubating/allocator_incubating.go`) has the same
//! `checkAvailableCounters` but for how "allocated" is asked (`internal.IsDeviceAllocated`).
//! Quantities are held exactly in micro-units, signed (available may go below zero upstream:
//! "we just treat it as no counters available").

use std::collections::{BTreeMap, BTreeSet};

use gpuwarden_types::quantity::Quantity;
use serde_json::Value;

/// Counter values by counter set, then counter.
pub type CounterSets = BTreeMap<String, BTreeMap<String, i128>>;

fn micros(v: &Value) -> i128 {
    let text = v["value"].as_str().expect("a counter's value");
    let q = Quantity::parse(text).expect("a quantity");
    let m = i128::try_from(q.micros()).expect("fits");
    if q.is_negative() { -m } else { m }
}

/// A device as the allocator sees it.
#[derive(Debug, Clone)]
pub struct Device {
    pub name: String,
    pub value: Value,
    /// `consumesCounters`: set → counter → amount.
    pub consumes: CounterSets,
}

/// A pool as `GatherPools` leaves it.
#[derive(Debug, Clone)]
pub enum Pool {
    /// Not every slice of the highest generation seen.
    Incomplete,
    /// Refused by `buildPool`.
    Invalid(String),
    /// Usable.
    Ready {
        counter_sets: CounterSets,
        devices: Vec<Device>,
    },
}

/// `GatherPools` + `buildPool` for one pool (`slices` are its ResourceSlice objects, all of one
/// driver and pool name).
pub fn gather(slices: &[Value], partitionable: bool) -> Pool {
    let kept: Vec<&Value> = slices
        .iter()
        .filter(|s| {
            partitionable
                || s["spec"]["sharedCounters"]
                    .as_array()
                    .is_none_or(Vec::is_empty)
        })
        .collect();
    let Some(top) = kept
        .iter()
        .filter_map(|s| s["spec"]["pool"]["generation"].as_i64())
        .max()
    else {
        return Pool::Incomplete;
    };
    let current: Vec<&Value> = kept
        .into_iter()
        .filter(|s| s["spec"]["pool"]["generation"].as_i64() == Some(top))
        .collect();
    let count = current[0]["spec"]["pool"]["resourceSliceCount"]
        .as_i64()
        .unwrap_or(0);
    if i64::try_from(current.len()).expect("few slices") != count {
        return Pool::Incomplete;
    }
    let mut counter_sets = CounterSets::new();
    let mut devices = Vec::new();
    for s in &current {
        let shared = s["spec"]["sharedCounters"].as_array();
        if partitionable && shared.is_some_and(|c| !c.is_empty()) {
            for set in shared.expect("a well-formed slice") {
                let name = set["name"]
                    .as_str()
                    .expect("a well-formed slice")
                    .to_owned();
                if counter_sets.contains_key(&name) {
                    return Pool::Invalid(format!("duplicate counter set name {name}"));
                }
                let counters = set["counters"]
                    .as_object()
                    .expect("a well-formed slice")
                    .iter()
                    .map(|(k, v)| (k.clone(), micros(v)))
                    .collect();
                counter_sets.insert(name, counters);
            }
            continue;
        }
        for d in s["spec"]["devices"].as_array().into_iter().flatten() {
            let mut consumes = CounterSets::new();
            for c in d["consumesCounters"].as_array().into_iter().flatten() {
                let set = c["counterSet"]
                    .as_str()
                    .expect("a well-formed slice")
                    .to_owned();
                let counters = c["counters"]
                    .as_object()
                    .expect("a well-formed slice")
                    .iter()
                    .map(|(k, v)| (k.clone(), micros(v)))
                    .collect();
                consumes.insert(set, counters);
            }
            devices.push(Device {
                name: d["name"].as_str().expect("a well-formed slice").to_owned(),
                value: d.clone(),
                consumes,
            });
        }
    }
    let mut names = BTreeSet::new();
    for d in &devices {
        if !names.insert(d.name.clone()) {
            return Pool::Invalid(format!("duplicate device name {}", d.name));
        }
    }
    if partitionable {
        for d in &devices {
            for (set, counters) in &d.consumes {
                let Some(have) = counter_sets.get(set) else {
                    return Pool::Invalid(format!("counter set {set} not found"));
                };
                if let Some(c) = counters.keys().find(|c| !have.contains_key(*c)) {
                    return Pool::Invalid(format!("counter {c} not found in counter set {set}"));
                }
            }
        }
    }
    Pool::Ready {
        counter_sets,
        devices,
    }
}

/// One scheduling pass: devices allocated before (`allocated`, other claims') and those being
/// allocated now.
pub struct Allocator<'a> {
    counter_sets: &'a CounterSets,
    devices: &'a [Device],
    partitionable: bool,
    allocated: BTreeSet<String>,
    allocating: BTreeSet<String>,
    available: Option<CounterSets>,
    consumed: CounterSets,
}

impl<'a> Allocator<'a> {
    pub fn new(pool: &'a Pool, allocated: &[&str], partitionable: bool) -> Self {
        let Pool::Ready {
            counter_sets,
            devices,
        } = pool
        else {
            panic!("no allocation from a pool not ready: {pool:?}");
        };
        Self {
            counter_sets,
            devices,
            partitionable,
            allocated: allocated.iter().map(|s| (*s).to_owned()).collect(),
            allocating: BTreeSet::new(),
            available: None,
            consumed: CounterSets::new(),
        }
    }

    fn device(&self, name: &str) -> &'a Device {
        self.devices
            .iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| panic!("no device {name} in the pool"))
    }

    /// `allocateDevice`, the part about use and counters: whether `name` may be added.
    pub fn allocate(&mut self, name: &str) -> bool {
        let device = self.device(name);
        if self.allocated.contains(name) || self.allocating.contains(name) {
            return false;
        }
        if !self.partitionable && !device.consumes.is_empty() {
            return false;
        }
        if !device.consumes.is_empty() && !self.check_available_counters(device) {
            return false;
        }
        self.allocating.insert(name.to_owned());
        true
    }

    /// `checkAvailableCounters`.
    fn check_available_counters(&mut self, device: &Device) -> bool {
        if self.available.is_none() {
            let mut available = self.counter_sets.clone();
            for d in self
                .devices
                .iter()
                .filter(|d| self.allocated.contains(&d.name))
            {
                for (set, counters) in &d.consumes {
                    let Some(have) = available.get_mut(set) else {
                        continue;
                    };
                    for (name, c) in counters {
                        if let Some(existing) = have.get_mut(name) {
                            *existing -= c;
                        }
                    }
                }
            }
            self.available = Some(available);
        }
        for (set, counters) in &device.consumes {
            let consumed = self.consumed.entry(set.clone()).or_default();
            for (name, c) in counters {
                *consumed.entry(name.clone()).or_insert(0) += c;
            }
        }
        let available = self.available.as_ref().expect("computed above");
        for (set, counters) in available {
            let consumed = self.consumed.get(set);
            for (name, have) in counters {
                let used = consumed.and_then(|c| c.get(name)).copied().unwrap_or(0);
                if *have < used {
                    self.deallocate_counters(device);
                    return false;
                }
            }
        }
        true
    }

    /// `deallocateCountersForDevice`.
    fn deallocate_counters(&mut self, device: &Device) {
        for (set, counters) in &device.consumes {
            let consumed = self.consumed.entry(set.clone()).or_default();
            for (name, c) in counters {
                *consumed.entry(name.clone()).or_insert(0) -= c;
            }
        }
    }

    /// The allocation's rollback of a device (upstream's rollback func): its counters given
    /// back.
    pub fn release(&mut self, name: &str) {
        if self.allocating.remove(name) {
            let device = self.device(name);
            if self.partitionable && !device.consumes.is_empty() {
                self.deallocate_counters(device);
            }
        }
    }
}
