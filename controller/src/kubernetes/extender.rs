//! The kube-scheduler extender (`k8s.io/kube-scheduler/extender/v1`): `filter` and
//! `prioritize` for a pod's gpuwarden ask, answered from the controller's view of the nodes.
//!
//! The Go types carry no JSON tags, so the keys are their field names: `ExtenderArgs{Pod,
//! Nodes, NodeNames}` in, `ExtenderFilterResult{Nodes, NodeNames, FailedNodes,
//! FailedAndUnresolvableNodes, Error}` or `HostPriorityList` (`[{Host, Score}]`, scores 0–10)
//! out. `Nodes` (a `NodeList`) comes when the extender is not `nodeCacheCapable`, `NodeNames`
//! when it is; the answer uses the same one.
//!
//! A pod's ask is what the webhook recorded in its annotations (or its limits, where no webhook
//! ran); its class is its `gpuwarden.io/class` label or its owner ([`pod::workload_class`]).
//! Kubernetes node names are the agents' node ids (the agent registers under `spec.nodeName`).
//!
//! - `filter` drops nodes whose agent is unknown or not ready, or whose GPUs can't hold the
//!   ask now (the same `can_fit` the controller's own placements use).
//! - `prioritize` scores each node that fits with the `interference-aware` scorer and the
//!   learned profiles the controller uses for sessions, so a busy workload is kept away from
//!   nodes whose GPUs already run busy tenants. The weighted totals map onto 0–10 over the
//!   candidates: those under the packing cap onto 5–10 (best 10), those over it onto 1–4,
//!   nodes that can't hold it 0.
//!
//! Pods that ask nothing of gpuwarden pass every node and score 0 everywhere (neutral).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::pod;
use crate::scheduler::{NodeFit, Scheduler};

/// The highest score (`MaxExtenderPriority`).
pub const MAX_SCORE: i64 = 10;

/// `ExtenderArgs`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderArgs {
    /// The pod being scheduled (`*v1.Pod`).
    #[serde(default)]
    pub pod: Option<Value>,
    /// Candidate nodes (`*v1.NodeList`), when not node-cache capable.
    #[serde(default)]
    pub nodes: Option<Value>,
    /// Candidate node names, when node-cache capable.
    #[serde(default)]
    pub node_names: Option<Vec<String>>,
}

/// `ExtenderFilterResult`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ExtenderFilterResult {
    /// The nodes that pass, as a `NodeList` (when they came as one).
    pub nodes: Option<Value>,
    /// The names of the nodes that pass (when they came as names).
    pub node_names: Option<Vec<String>>,
    /// Nodes filtered out, with why.
    pub failed_nodes: BTreeMap<String, String>,
    /// Nodes filtered out that preemption would not help.
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    /// An error for the whole call.
    pub error: String,
}

/// `HostPriority`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct HostPriority {
    /// The node.
    pub host: String,
    /// 0–10, higher is better.
    pub score: i64,
}

impl ExtenderArgs {
    /// The candidate names, from `NodeNames` or the `NodeList`'s items.
    #[must_use]
    pub fn candidates(&self) -> Vec<String> {
        if let Some(names) = &self.node_names {
            return names.clone();
        }
        self.nodes
            .as_ref()
            .and_then(|list| list.get("items"))
            .and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter_map(|n| n.pointer("/metadata/name").and_then(Value::as_str))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The pod's ask and class; `Ok(None)` when it asks nothing of gpuwarden.
fn asked(args: &ExtenderArgs) -> Result<Option<(pod::GpuAsk, String)>, String> {
    let Some(p) = args.pod.as_ref() else {
        return Ok(None);
    };
    match pod::read_ask(p) {
        Ok(Some(ask)) => Ok(Some((ask, pod::workload_class(p)))),
        Ok(None) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// Why a node doesn't pass, and whether preemption could change that.
fn failure(fit: &NodeFit, ask: &pod::GpuAsk) -> Option<(String, bool)> {
    match fit {
        NodeFit::Fits(_) => None,
        NodeFit::Unknown => Some(("no gpuwarden agent reports this node".to_owned(), false)),
        NodeFit::NotReady(state) => Some((format!("gpuwarden agent is {}", state.as_str()), false)),
        // Evicting pods there could free their GPU parts.
        NodeFit::NoRoom => Some((format!("gpuwarden: no GPU here can hold {ask} now"), true)),
    }
}

/// `filter`: the candidates that can hold the pod's ask.
#[must_use]
pub fn filter(args: &ExtenderArgs, scheduler: &Scheduler) -> ExtenderFilterResult {
    let candidates = args.candidates();
    let everyone = || ExtenderFilterResult {
        nodes: args.nodes.clone(),
        node_names: args.node_names.clone(),
        ..ExtenderFilterResult::default()
    };
    let (ask, class) = match asked(args) {
        Ok(Some(found)) => found,
        Ok(None) => return everyone(),
        Err(e) => {
            return ExtenderFilterResult {
                error: format!("gpuwarden: the pod's GPU ask does not read: {e}"),
                ..ExtenderFilterResult::default()
            };
        }
    };
    let fits = scheduler.fit_nodes(&class, &ask.to_request(), &candidates);
    let mut result = ExtenderFilterResult::default();
    let mut passing = Vec::new();
    for (name, fit) in candidates.iter().zip(&fits) {
        match failure(fit, &ask) {
            None => passing.push(name.clone()),
            Some((why, true)) => {
                result.failed_nodes.insert(name.clone(), why);
            }
            Some((why, false)) => {
                result
                    .failed_and_unresolvable_nodes
                    .insert(name.clone(), why);
            }
        }
    }
    if args.node_names.is_some() {
        result.node_names = Some(passing);
    } else if let Some(list) = &args.nodes {
        let mut list = list.clone();
        if let Some(items) = list.get_mut("items").and_then(Value::as_array_mut) {
            items.retain(|n| {
                n.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .is_some_and(|name| passing.iter().any(|p| p == name))
            });
        }
        result.nodes = Some(list);
    }
    result
}

/// `prioritize`: a 0–10 score per candidate for the pod's ask (0 everywhere for a pod that asks
/// nothing of gpuwarden, or whose ask doesn't read).
#[must_use]
pub fn prioritize(args: &ExtenderArgs, scheduler: &Scheduler) -> Vec<HostPriority> {
    let candidates = args.candidates();
    let Ok(Some((ask, class))) = asked(args) else {
        return candidates
            .into_iter()
            .map(|host| HostPriority { host, score: 0 })
            .collect();
    };
    let fits = scheduler.fit_nodes(&class, &ask.to_request(), &candidates);
    let scored: Vec<Option<(bool, f64)>> = fits
        .iter()
        .map(|fit| match fit {
            NodeFit::Fits(c) => Some((c.over_cap, c.total)),
            _ => None,
        })
        .collect();
    let band = |over_cap: bool| {
        let totals = scored
            .iter()
            .flatten()
            .filter(|(o, _)| *o == over_cap)
            .map(|(_, t)| *t);
        let (lo, hi) = totals.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), t| {
            (lo.min(t), hi.max(t))
        });
        (lo, hi)
    };
    let under = band(false);
    let over = band(true);
    candidates
        .into_iter()
        .zip(scored)
        .map(|(host, scored)| {
            let score = match scored {
                None => 0,
                Some((false, total)) => scale(total, under, 5, MAX_SCORE),
                Some((true, total)) => scale(total, over, 1, 4),
            };
            HostPriority { host, score }
        })
        .collect()
}

/// `total` within `(lo, hi)` onto `[low, high]`, the lowest total getting `high`.
fn scale(total: f64, (lo, hi): (f64, f64), low: i64, high: i64) -> i64 {
    let spread = hi - lo;
    if !spread.is_finite() || spread <= f64::EPSILON {
        return high;
    }
    let better = ((hi - total) / spread).clamp(0.0, 1.0);
    #[expect(
        clippy::cast_possible_truncation,
        reason = "at most 9 steps: exact in f64, nothing to truncate"
    )]
    let step = (better * (high - low) as f64).round() as i64;
    low + step
}
