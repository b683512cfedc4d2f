//! kube-scheduler's consumable-capacity arithmetic, transcribed as a test oracle (not a copy of
//! the allocator: only what decides whether a claim's request fits a shared device, and what
//! it is charged).
//!
//! Source: `k8s.io/dynamic-resource-allocation` (staging in kubernetes/kubernetes), tag
//! `v0.35.6` (Kubernetes 1.35.6), `structured/internal/experimental/consumable_capacity.go`:
//! `CmpRequestOverCapacity`, `calculateConsumedCapacity`, `fillEmptyRequest`, `roundUpRange`,
//! `roundUpValidValues`, `GetConsumedCapacityFromRequest`, `violatesPolicy`,
//! `violateValidRange`, `violateValidValues`; and `allocator_experimental.go`,
//! `allocateDevice` (a device without `allowMultipleAllocations`, or with the
//! `DRAConsumableCapacity` gate off, is held whole by one claim and its result carries no
//! `consumedCapacity`). Tag `v0.36.2` (`structured/internal/incubating/`) has the same file
//! but for the package name; `v0.34.x` the same functions.
//!
//! Quantities are held exactly (micro-units, [`Quantity`]); `Quantity.Value()` in Go is the
//! value rounded up to a whole number ([`value`]), which is where fractions get lost.

use std::collections::BTreeMap;

use gpuwarden_types::quantity::Quantity;
use serde_json::Value;

/// Micro-units in a unit.
const MICROS: u128 = 1_000_000;

/// A quantity in micro-units (every quantity here is non-negative).
pub type Micros = u128;

fn parse(v: &Value) -> Micros {
    let text = v.as_str().expect("a quantity string");
    let q = Quantity::parse(text).expect("a quantity");
    assert!(!q.is_negative(), "{text}: negative");
    q.micros()
}

/// Go's `Quantity.Value()`: the value rounded up to a whole number.
fn value(q: Micros) -> u128 {
    q.div_ceil(MICROS)
}

/// `resource.NewQuantity(v, resource.BinarySI)` in micro-units.
fn whole(v: u128) -> Micros {
    v * MICROS
}

/// `CapacityRequestPolicyRange`.
#[derive(Debug, Clone)]
pub struct Range {
    pub min: Option<Micros>,
    pub max: Option<Micros>,
    pub step: Option<Micros>,
}

/// `CapacityRequestPolicy`.
#[derive(Debug, Clone)]
pub struct Policy {
    pub default: Option<Micros>,
    pub valid_range: Option<Range>,
    pub valid_values: Vec<Micros>,
}

/// `DeviceCapacity`.
#[derive(Debug, Clone)]
pub struct Capacity {
    pub value: Micros,
    pub policy: Option<Policy>,
}

/// A device of a ResourceSlice as the allocator reads it.
#[derive(Debug, Clone)]
pub struct Device {
    pub name: String,
    pub allow_multiple: bool,
    pub capacity: BTreeMap<String, Capacity>,
}

impl Device {
    /// One entry of a ResourceSlice's `spec.devices` (JSON as the API serves it).
    pub fn from_slice(device: &Value) -> Self {
        let capacity = device["capacity"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(name, c)| {
                        let opt = |v: &Value| (!v.is_null()).then(|| parse(v));
                        let policy = c.get("requestPolicy").map(|p| Policy {
                            default: opt(&p["default"]),
                            valid_range: p.get("validRange").map(|r| Range {
                                min: opt(&r["min"]),
                                max: opt(&r["max"]),
                                step: opt(&r["step"]),
                            }),
                            valid_values: p["validValues"]
                                .as_array()
                                .map(|vs| vs.iter().map(parse).collect())
                                .unwrap_or_default(),
                        });
                        (
                            name.clone(),
                            Capacity {
                                value: parse(&c["value"]),
                                policy,
                            },
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            name: device["name"].as_str().expect("a name").to_owned(),
            allow_multiple: device["allowMultipleAllocations"] == Value::Bool(true),
            capacity,
        }
    }
}

/// What a consumed quantity is serialized as: the request's own text when the allocator copies
/// it, else `NewQuantity(v, BinarySI).String()` (the largest power of 1024 that divides it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumed {
    pub micros: Micros,
    pub text: String,
}

fn binary_si(v: u128) -> String {
    if v < 1024 {
        return v.to_string();
    }
    let mut n = v;
    let mut suffix = 0;
    while n.is_multiple_of(1024) && suffix < 6 {
        n /= 1024;
        suffix += 1;
    }
    format!("{n}{}", ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][suffix])
}

fn copied(q: Micros, text: &str) -> Consumed {
    Consumed {
        micros: q,
        text: text.to_owned(),
    }
}

/// `calculateConsumedCapacity`: what a request of `requested` (or none) is charged.
fn calculate(requested: Option<(Micros, &str)>, cap: &Capacity, raw: &Value) -> Consumed {
    let Some((req, text)) = requested else {
        return fill_empty_request(cap, raw);
    };
    let Some(policy) = &cap.policy else {
        return copied(req, text);
    };
    if let Some(range) = &policy.valid_range
        && let Some(min) = range.min
    {
        return round_up_range(req, text, range, min, raw);
    }
    if !policy.valid_values.is_empty() {
        // `roundUpValidValues`: the first valid value ≥ the request, else the request.
        let vals = raw["requestPolicy"]["validValues"]
            .as_array()
            .expect("values");
        for (v, t) in policy.valid_values.iter().zip(vals) {
            if req <= *v {
                return copied(*v, t.as_str().expect("text"));
            }
        }
    }
    copied(req, text)
}

/// `fillEmptyRequest`: the policy's default, else the whole capacity.
fn fill_empty_request(cap: &Capacity, raw: &Value) -> Consumed {
    match cap.policy.as_ref().and_then(|p| p.default) {
        Some(d) => copied(d, raw["requestPolicy"]["default"].as_str().expect("text")),
        None => copied(cap.value, raw["value"].as_str().expect("text")),
    }
}

/// `roundUpRange`: below `min` is `min`; without a step the request as it is; with one,
/// `min + step × ⌈(Value(req) − Value(min)) / Value(step)⌉` — on `Value()`, whole numbers.
fn round_up_range(req: Micros, text: &str, range: &Range, min: Micros, raw: &Value) -> Consumed {
    if req < min {
        return copied(
            min,
            raw["requestPolicy"]["validRange"]["min"]
                .as_str()
                .expect("text"),
        );
    }
    let Some(step) = range.step else {
        return copied(req, text);
    };
    let (requested, step, min) = (value(req), value(step), value(min));
    let added = requested - min;
    let steps = added / step + u128::from(!added.is_multiple_of(step));
    let charged = min + step * steps;
    Consumed {
        micros: whole(charged),
        text: binary_si(charged),
    }
}

/// `violatesPolicy`: a charged amount the policy refuses. (Go compares it with the default by
/// `==` on the struct; equal values here.)
fn violates_policy(q: Micros, policy: Option<&Policy>) -> bool {
    let Some(policy) = policy else {
        return false;
    };
    if policy.default == Some(q) {
        return false;
    }
    if let Some(range) = &policy.valid_range {
        if range.max.is_some_and(|max| q > max) {
            return true;
        }
        if let Some(step) = range.step {
            let min = value(range.min.unwrap_or(0));
            // `(Value(q) − Value(min)) % Value(step) != 0`, in Go's signed arithmetic.
            let added =
                i128::try_from(value(q)).expect("fits") - i128::try_from(min).expect("fits");
            return added % i128::try_from(value(step)).expect("fits") != 0;
        }
        return false;
    }
    if !policy.valid_values.is_empty() {
        return !policy.valid_values.contains(&q);
    }
    false
}

/// One node's devices as kube-scheduler sees them, with what allocated claims hold.
#[derive(Debug, Clone)]
pub struct Pool {
    /// The devices, with their raw JSON (for the quantities' texts).
    devices: Vec<(Device, Value)>,
    /// `DRAConsumableCapacity` on in kube-scheduler.
    gate: bool,
    /// Consumed capacity per device (shared devices).
    consumed: BTreeMap<String, BTreeMap<String, Micros>>,
    /// Devices held whole.
    in_use: std::collections::BTreeSet<String>,
}

/// An allocation result: the device and its `consumedCapacity` (empty when held whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocated {
    pub device: String,
    pub consumed: BTreeMap<String, Consumed>,
}

impl Allocated {
    /// `consumedCapacity` as the claim's status carries it.
    pub fn consumed_capacity(&self) -> Value {
        self.consumed
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.text.clone())))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

impl Pool {
    /// The devices of a ResourceSlice's `spec.devices`, with the gate on or off.
    pub fn new(slice_devices: &[Value], gate: bool) -> Self {
        Self {
            devices: slice_devices
                .iter()
                .map(|d| (Device::from_slice(d), d.clone()))
                .collect(),
            gate,
            consumed: BTreeMap::new(),
            in_use: std::collections::BTreeSet::new(),
        }
    }

    /// Allocates one device for a request of `requests` (a claim's
    /// `exactly.capacity.requests`, `None` when it has none), trying devices in order as the
    /// allocator does; `None` when no device can take it.
    pub fn allocate(&mut self, requests: Option<&Value>) -> Option<Allocated> {
        let requests: BTreeMap<String, (Micros, String)> = requests
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), (parse(v), v.as_str().expect("text").to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        for (device, raw) in &self.devices {
            let multiple = self.gate && device.allow_multiple;
            if !multiple
                && (self.in_use.contains(&device.name) || self.consumed.contains_key(&device.name))
            {
                continue;
            }
            if !self.gate {
                // Without the gate no capacity is looked at: the device is taken whole.
                self.in_use.insert(device.name.clone());
                return Some(Allocated {
                    device: device.name.clone(),
                    consumed: BTreeMap::new(),
                });
            }
            // `requestsContainNonExistCapacity`.
            if requests.keys().any(|k| !device.capacity.contains_key(k)) {
                continue;
            }
            let held = if multiple {
                self.consumed.get(&device.name).cloned().unwrap_or_default()
            } else {
                BTreeMap::new()
            };
            let mut charged = BTreeMap::new();
            let fits = device.capacity.iter().all(|(name, cap)| {
                let req = requests.get(name).map(|(q, t)| (*q, t.as_str()));
                let c = calculate(req, cap, &raw["capacity"][name]);
                if violates_policy(c.micros, cap.policy.as_ref()) {
                    return false;
                }
                let total = held.get(name).copied().unwrap_or(0) + c.micros;
                charged.insert(name.clone(), c);
                total <= cap.value
            });
            if !fits {
                continue;
            }
            if multiple {
                let entry = self.consumed.entry(device.name.clone()).or_default();
                for (name, c) in &charged {
                    *entry.entry(name.clone()).or_default() += c.micros;
                }
                return Some(Allocated {
                    device: device.name.clone(),
                    consumed: charged,
                });
            }
            self.in_use.insert(device.name.clone());
            return Some(Allocated {
                device: device.name.clone(),
                consumed: BTreeMap::new(),
            });
        }
        None
    }
}
