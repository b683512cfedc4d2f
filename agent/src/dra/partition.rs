//! Partitionable devices (KEP-4815, `DRAPartitionableDevices`): a GPU whose MIG layout the
//! operator lets gpuwarden change (`mig_reconfigurable`, docs/mig.md) is published as a counter
//! set of its memory and compute slices, and each profile at each free placement as a device
//! consuming the slices it would take. A scheduler that honours the counters then never
//! allocates two overlapping instances of one GPU.
//!
//! The counters follow the placement rules of [`crate::devices::placement`]:
//! - `memory-slice-<i>` (value 1) for each of the GPU's 8 memory slices, 0 where an instance
//!   holds it now; a device consumes 1 of each slice its placement covers;
//! - `compute-slices`: the GPU's compute slices (the `g` of its whole-GPU profile, 7), less those
//!   of the instances there; a device consumes its profile's `g`;
//! - `profile-<id>-instances` for a profile allowed fewer instances than it has starts (`+me`:
//!   one per GPU), less those there; a device of it consumes 1.
//!
//! Only placements free now ([`Layout::free_placements`]) become devices; the counters make the
//! same refusals again, so a set of devices the scheduler accepts is a layout the hardware takes
//! (shown against kube-scheduler's counter arithmetic in `tests/tests/k8s_capacity_counters.rs`).
//!
//! Shape (`resource.k8s.io/v1` as of Kubernetes 1.35, the vendored schema): counter sets and the
//! devices consuming them sit in different ResourceSlices of one pool; at most 8 counter sets per
//! slice, 32 counters per set, 64 devices per slice when they consume counters, 2 counter
//! consumptions per device. The pool is one of its own (`<node>/mig`), apart from the node's
//! pool of instances and whole GPUs, so that a partition slice missing or behind (the pool
//! incomplete or invalid for a moment) never takes the node's other devices with it.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{DRIVER_NAME, slice};
use crate::devices::placement::{GiProfile, Layout, MEMORY_SLICES, Placement};

/// The counter of compute slices.
pub const COMPUTE_SLICES: &str = "compute-slices";

/// Counter sets one ResourceSlice may hold (`ResourceSliceSpec.sharedCounters`).
pub const MAX_COUNTER_SETS_PER_SLICE: usize = 8;

/// Devices one ResourceSlice may hold when they consume counters (`ResourceSliceSpec.devices`).
pub const MAX_DEVICES_PER_SLICE: usize = 64;

/// Counters one counter set may hold (`CounterSet.counters`).
pub const MAX_COUNTERS_PER_SET: usize = 32;

/// The counter of memory slice `i`.
#[must_use]
pub fn memory_slice(i: u32) -> String {
    format!("memory-slice-{i}")
}

/// The counter bounding how many instances of profile `id` a GPU holds.
#[must_use]
pub fn instances_counter(id: u32) -> String {
    format!("profile-{id}-instances")
}

/// The partition pool of `node`.
#[must_use]
pub fn pool_name(node: &str) -> String {
    format!("{node}/mig")
}

/// The counter set of GPU `index` (a DNS label).
#[must_use]
pub fn counter_set_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The device of `profile` at `placement` on GPU `index` (a DNS label: `gpu-0-1g-18gb-me-at-3`).
#[must_use]
pub fn device_name(index: u32, profile: &GiProfile, placement: Placement) -> String {
    let profile: String = profile
        .name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("gpu-{index}-{profile}-at-{}", placement.start)
}

/// Whether a profile needs an instance counter: it may be placed at more starts than it may
/// have instances.
fn counted(profile: &GiProfile) -> bool {
    usize::try_from(profile.max_instances).is_ok_and(|m| m < profile.starts.len())
}

/// One reconfigurable GPU as the pool shows it.
#[derive(Debug, Clone)]
pub struct PartitionedGpu {
    /// Its UUID.
    pub uuid: String,
    /// Its index on the node.
    pub index: u32,
    /// Its instances now.
    pub layout: Layout,
}

impl PartitionedGpu {
    /// The counter set: what of the GPU is free now.
    #[must_use]
    pub fn counter_set(&self) -> Value {
        let held = self.layout.occupied();
        let mut counters = BTreeMap::new();
        for i in 0..MEMORY_SLICES {
            let free = u32::from(held & (1 << i) == 0);
            counters.insert(memory_slice(i), json!({ "value": free.to_string() }));
        }
        let whole = self.layout.model.compute_slices();
        let used: u32 = self
            .layout
            .instances
            .iter()
            .filter_map(|(p, _)| p.compute_slices())
            .sum();
        counters.insert(
            COMPUTE_SLICES.to_owned(),
            json!({ "value": whole.saturating_sub(used).to_string() }),
        );
        for p in self.layout.model.profiles.iter().filter(|p| counted(p)) {
            let there = self
                .layout
                .instances
                .iter()
                .filter(|(q, _)| q.id == p.id)
                .count();
            let left = usize::try_from(p.max_instances)
                .unwrap_or(0)
                .saturating_sub(there);
            counters.insert(
                instances_counter(p.id),
                json!({ "value": left.to_string() }),
            );
        }
        json!({ "name": counter_set_name(self.index), "counters": counters })
    }

    /// A device per profile and placement free now, each consuming its slices.
    #[must_use]
    pub fn devices(&self, model_name: &str) -> Vec<Value> {
        let mut out = Vec::new();
        for profile in self.layout.model.profiles {
            let Some(g) = profile.compute_slices() else {
                continue;
            };
            for placement in self.layout.free_placements(profile) {
                let mut consumes = BTreeMap::new();
                for i in placement.start..placement.start + placement.size {
                    consumes.insert(memory_slice(i), json!({ "value": "1" }));
                }
                consumes.insert(COMPUTE_SLICES.to_owned(), json!({ "value": g.to_string() }));
                if counted(profile) {
                    consumes.insert(instances_counter(profile.id), json!({ "value": "1" }));
                }
                out.push(json!({
                    "name": device_name(self.index, profile, placement),
                    "attributes": {
                        "mig": { "bool": true },
                        "migProfile": { "string": profile.name },
                        "migProfileId": { "int": profile.id },
                        "parentUUID": { "string": self.uuid },
                        "parentIndex": { "int": self.index },
                        "model": { "string": model_name.chars().take(64).collect::<String>() },
                        "memorySliceStart": { "int": placement.start },
                        "memorySlices": { "int": placement.size },
                        "computeSlices": { "int": g },
                        "multiprocessors": { "int": profile.sm_count },
                    },
                    "capacity": {
                        slice::MEMORY: {
                            "value": slice::binary_quantity(profile.memory_mib * slice::MIB),
                        },
                    },
                    "consumesCounters": [{
                        "counterSet": counter_set_name(self.index),
                        "counters": consumes,
                    }],
                }));
            }
        }
        out
    }
}

/// What one slice of the partition pool holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    /// Counter sets.
    Counters(Vec<Value>),
    /// Devices consuming them.
    Devices(Vec<Value>),
}

/// One slice of the partition pool: its name and content.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionSlice {
    /// The object's name.
    pub name: String,
    /// What it holds.
    pub content: Content,
}

/// The name of the `k`th counter slice of `node`.
#[must_use]
pub fn counter_slice_name(node: &str, k: usize) -> String {
    format!("{}-mig-counters-{k}", slice::slice_name(node))
}

/// The name of the `k`th device slice of `node`.
#[must_use]
pub fn device_slice_name(node: &str, k: usize) -> String {
    format!("{}-mig-devices-{k}", slice::slice_name(node))
}

/// The slices of the partition pool of `node` for `gpus` (each GPU's model name alongside):
/// counter sets 8 to a slice, devices 64 to a slice; none when there is no GPU.
#[must_use]
pub fn slices(node: &str, gpus: &[(PartitionedGpu, String)]) -> Vec<PartitionSlice> {
    let sets: Vec<Value> = gpus.iter().map(|(g, _)| g.counter_set()).collect();
    let devices: Vec<Value> = gpus.iter().flat_map(|(g, m)| g.devices(m)).collect();
    let mut out: Vec<PartitionSlice> = sets
        .chunks(MAX_COUNTER_SETS_PER_SLICE)
        .enumerate()
        .map(|(k, c)| PartitionSlice {
            name: counter_slice_name(node, k),
            content: Content::Counters(c.to_vec()),
        })
        .collect();
    out.extend(
        devices
            .chunks(MAX_DEVICES_PER_SLICE)
            .enumerate()
            .map(|(k, c)| PartitionSlice {
                name: device_slice_name(node, k),
                content: Content::Devices(c.to_vec()),
            }),
    );
    out
}

/// The whole object of `part`, in a pool of `count` slices at `generation`.
#[must_use]
pub fn object(
    node: &str,
    part: &PartitionSlice,
    generation: i64,
    count: usize,
    resource_version: Option<&str>,
    owner: Option<&Value>,
) -> Value {
    let mut metadata = json!({ "name": part.name });
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    if let Some(owner) = owner {
        metadata["ownerReferences"] = json!([owner]);
    }
    let mut spec = json!({
        "driver": DRIVER_NAME,
        "nodeName": node,
        "pool": { "name": pool_name(node), "generation": generation, "resourceSliceCount": count },
    });
    match &part.content {
        Content::Counters(sets) => spec["sharedCounters"] = json!(sets),
        Content::Devices(devices) => spec["devices"] = json!(devices),
    }
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": spec,
    })
}

/// The Kubernetes version from the API server's `/version` answer (`gitVersion` `v1.35.2`,
/// or `major`/`minor` with a provider's `+`), as (major, minor).
#[must_use]
pub fn kube_version(answer: &Value) -> Option<(u32, u32)> {
    if let Some(git) = answer["gitVersion"].as_str() {
        let mut parts = git.trim_start_matches('v').split('.');
        let major = parts.next()?.parse().ok()?;
        let minor: String = parts
            .next()?
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        return Some((major, minor.parse().ok()?));
    }
    let digits = |v: &Value| -> Option<u32> {
        v.as_str()?
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .ok()
    };
    Some((digits(&answer["major"])?, digits(&answer["minor"])?))
}

/// Whether Kubernetes `version` has the partition shape published here: counter sets in slices
/// of their own, from 1.35 (1.33 and 1.34 kept them in the consuming devices' slice, and their
/// scheduler looks for them there).
#[must_use]
pub fn version_supported(version: (u32, u32)) -> bool {
    version >= (1, 35)
}

/// Why partitions are not published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsupported {
    /// The API server is older than 1.35 (or its version unreadable).
    Version(Option<(u32, u32)>),
    /// The API server dropped `sharedCounters` from a counter slice: `DRAPartitionableDevices`
    /// is off in kube-apiserver.
    GateOff,
}

/// What [`publish`] left in the API server.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The pool is as desired at this generation; `changed` when something was written.
    Published {
        /// The pool's generation.
        generation: i64,
        /// Whether a slice was written.
        changed: bool,
    },
    /// Nothing published (and what had been, deleted).
    Unsupported(Unsupported),
}

/// Whether the API server kept the counters of a written slice: a counter slice its
/// `sharedCounters`, a device slice every device's `consumesCounters` (both dropped where
/// `DRAPartitionableDevices` is off, `dropDisabledDRAPartitionableDevicesFields`).
#[must_use]
pub fn kept_counters(written: &PartitionSlice, returned: &Value) -> bool {
    match &written.content {
        Content::Counters(sets) => {
            sets.is_empty()
                || returned
                    .pointer("/spec/sharedCounters")
                    .and_then(Value::as_array)
                    .is_some_and(|s| !s.is_empty())
        }
        Content::Devices(devices) => {
            let returned = returned.pointer("/spec/devices").and_then(Value::as_array);
            returned.is_some_and(|r| {
                r.len() == devices.len()
                    && r.iter().all(|d| {
                        d["consumesCounters"]
                            .as_array()
                            .is_some_and(|c| !c.is_empty())
                    })
            })
        }
    }
}

/// The content of a slice the API server returned, in the form written.
fn returned_content(object: &Value) -> Value {
    match object.pointer("/spec/sharedCounters") {
        Some(sets) if !sets.is_null() => sets.clone(),
        _ => slice::as_published(&object["spec"]["devices"]),
    }
}

fn content_value(part: &PartitionSlice) -> Value {
    match &part.content {
        Content::Counters(v) | Content::Devices(v) => Value::Array(v.clone()),
    }
}

/// How a slice of the pool is named from the node and its number.
type SliceName = fn(&str, usize) -> String;

/// Deletes the slices of the partition pool past those wanted: the counter and device slices
/// numbered from `counters` and `devices` on, until one is missing.
async fn delete_from(
    api: &super::apiserver::ApiServer,
    node: &str,
    counters: usize,
    devices: usize,
) -> Result<(), super::apiserver::ApiError> {
    let names: [(SliceName, usize); 2] =
        [(counter_slice_name, counters), (device_slice_name, devices)];
    for (name_of, from) in names {
        for k in from.. {
            let path = format!("{}/{}", slice::SLICES, name_of(node, k));
            let answer = api.request(http::Method::DELETE, &path, None).await?;
            if answer.status == 404 {
                break;
            }
            if !answer.is_success() {
                return Err(super::apiserver::ApiError::status(&answer, "DELETE", &path));
            }
        }
    }
    Ok(())
}

/// Makes the API server's partition pool of `node` hold `wanted`: all its slices written at a
/// new generation when any is missing or differs, the slices past them deleted. Counter slices
/// go first: where the API server drops their `sharedCounters` (the gate off), nothing is
/// published and what was written is deleted. With `wanted` empty the pool is deleted.
///
/// # Errors
/// The API server refused or could not be reached.
pub async fn publish(
    api: &super::apiserver::ApiServer,
    node: &str,
    wanted: &[PartitionSlice],
    owner: Option<&Value>,
    last_generation: i64,
) -> Result<Outcome, super::apiserver::ApiError> {
    use super::apiserver;
    let counters = wanted
        .iter()
        .filter(|p| matches!(p.content, Content::Counters(_)))
        .count();
    let devices = wanted.len() - counters;
    // What is there now.
    let mut existing = Vec::with_capacity(wanted.len());
    for part in wanted {
        let path = format!("{}/{}", slice::SLICES, part.name);
        let answer = api
            .request(
                http::Method::GET,
                &format!("{path}?resourceVersion=0"),
                None,
            )
            .await?;
        existing.push(match answer.status {
            404 => None,
            _ => Some(apiserver::json::<Value>(&answer, "GET", &path)?),
        });
    }
    let generations: Vec<i64> = existing
        .iter()
        .flatten()
        .filter_map(|o| o.pointer("/spec/pool/generation").and_then(Value::as_i64))
        .collect();
    let top = generations
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(last_generation);
    let count = i64::try_from(wanted.len()).unwrap_or(i64::MAX);
    let as_wanted = wanted.iter().zip(&existing).all(|(part, old)| {
        old.as_ref().is_some_and(|o| {
            slice::same(&returned_content(o), &content_value(part))
                && o["spec"]["nodeName"] == json!(node)
                && o.pointer("/spec/pool/generation").and_then(Value::as_i64) == Some(top)
                && o.pointer("/spec/pool/resourceSliceCount")
                    .and_then(Value::as_i64)
                    == Some(count)
                && o.pointer("/spec/pool/name") == Some(&json!(pool_name(node)))
        })
    });
    if wanted.is_empty() || as_wanted {
        if wanted.is_empty() {
            delete_from(api, node, 0, 0).await?;
        }
        return Ok(Outcome::Published {
            generation: top,
            changed: false,
        });
    }
    let generation = top + 1;
    for (part, old) in wanted.iter().zip(&existing) {
        let rv = old
            .as_ref()
            .and_then(|o| o["metadata"]["resourceVersion"].as_str());
        let body = object(node, part, generation, wanted.len(), rv, owner);
        let (method, path) = match old {
            Some(_) => (
                http::Method::PUT,
                format!("{}/{}", slice::SLICES, part.name),
            ),
            None => (http::Method::POST, slice::SLICES.to_owned()),
        };
        let answer = api.request(method.clone(), &path, Some(&body)).await?;
        let written: Value = apiserver::json(&answer, method.as_str(), &path)?;
        if !kept_counters(part, &written) {
            delete_from(api, node, 0, 0).await?;
            return Ok(Outcome::Unsupported(Unsupported::GateOff));
        }
    }
    delete_from(api, node, counters, devices).await?;
    Ok(Outcome::Published {
        generation,
        changed: true,
    })
}

/// Asks the API server its version and whether partitions can be published there.
///
/// # Errors
/// The API server could not be reached.
pub async fn supported(
    api: &super::apiserver::ApiServer,
) -> Result<Result<(), Unsupported>, super::apiserver::ApiError> {
    let answer = api.request(http::Method::GET, "/version", None).await?;
    let version = if answer.is_success() {
        super::apiserver::json::<Value>(&answer, "GET", "/version")
            .ok()
            .as_ref()
            .and_then(kube_version)
    } else {
        None
    };
    Ok(match version {
        Some(v) if version_supported(v) => Ok(()),
        v => Err(Unsupported::Version(v)),
    })
}

#[cfg(test)]
mod tests;
