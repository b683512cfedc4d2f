//! From the paths a crate's modules name to the edges "module A uses module B", the views that
//! collapse them to one level of the tree, and the circles (strongly connected components) in a
//! view.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
};

use super::scan::{Crate, ModPath};

/// How deep re-exports and aliases are followed (a `use` cycle would otherwise never end).
const MAX_HOPS: u8 = 8;

/// "Module `from` uses module `to`", written at `file:line`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    /// The module that names the path.
    pub from: ModPath,
    /// The module whose item (or submodule) the path reaches.
    pub to: ModPath,
    /// Where the path is written.
    pub file: PathBuf,
    /// Its line.
    pub line: usize,
}

/// Every edge between two different modules of `krate`, sorted and one per site.
pub fn edges(krate: &Crate) -> Vec<Edge> {
    let mut out = BTreeSet::new();
    for (path, module) in &krate.modules {
        for r in &module.refs {
            let Some(abs) = absolute(krate, path, &r.segments, 0) else {
                continue;
            };
            let Some(to) = target(krate, &abs, 0) else {
                continue;
            };
            if &to != path {
                out.insert(Edge {
                    from: path.clone(),
                    to,
                    file: module.file.clone(),
                    line: r.line,
                });
            }
        }
    }
    out.into_iter().collect()
}

/// `segments` as named in `module`, made absolute (after `crate::`); `None` for a path into
/// another crate, `Self`, or a local name that is no module or import.
fn absolute(krate: &Crate, module: &ModPath, segments: &[String], hops: u8) -> Option<ModPath> {
    let (first, rest) = segments.split_first()?;
    let here = krate.modules.get(module)?;
    match first.as_str() {
        "crate" => Some(rest.to_vec()),
        "self" => Some(joined(module, rest)),
        "super" => {
            let mut base = module.clone();
            let mut rest = segments;
            while let Some(("super", tail)) = rest.split_first().map(|(s, t)| (s.as_str(), t)) {
                base.pop()?;
                rest = tail;
            }
            Some(joined(&base, rest))
        }
        name if here.children.contains(name) => Some(joined(module, segments)),
        name => {
            let alias = here.aliases.get(name)?;
            if hops >= MAX_HOPS || alias.first() == Some(first) && alias.len() == 1 {
                return None;
            }
            let base = absolute(krate, module, alias, hops + 1)?;
            Some(joined(&base, rest))
        }
    }
}

/// The module an absolute path lands in: the deepest module on it, following re-exports (`pub
/// use`, and any `use` a child reaches with `super::`) and glob imports to where the item is
/// defined. `None` when it leads out of the crate.
fn target(krate: &Crate, path: &[String], hops: u8) -> Option<ModPath> {
    let mut at: ModPath = Vec::new();
    for (i, segment) in path.iter().enumerate() {
        let module = krate.modules.get(&at)?;
        if module.children.contains(segment) {
            at.push(segment.clone());
            continue;
        }
        if module.items.contains(segment) || hops >= MAX_HOPS {
            return Some(at);
        }
        if let Some(alias) = module.aliases.get(segment) {
            let base = absolute(krate, &at, alias, 0)?;
            return target(krate, &joined(&base, &path[i + 1..]), hops + 1);
        }
        for glob in &module.globs {
            let Some(base) = absolute(krate, &at, glob, 0) else {
                continue;
            };
            let Some(source) = krate.modules.get(&base) else {
                continue;
            };
            if source.items.contains(segment)
                || source.children.contains(segment)
                || source.aliases.contains_key(segment)
            {
                return target(krate, &joined(&base, &path[i..]), hops + 1);
            }
        }
        return Some(at);
    }
    Some(at)
}

fn joined(base: &[String], rest: &[String]) -> ModPath {
    base.iter().chain(rest).cloned().collect()
}

/// The edges among the children of one module, each child standing for itself and everything
/// below it; the module's own items (its `mod.rs`) are a node of their own.
#[derive(Debug)]
pub struct View {
    /// The module whose children are the nodes (`[]`: the crate's top-level modules).
    pub parent: ModPath,
    /// `from → to → the sites of that arrow`.
    pub arrows: BTreeMap<String, BTreeMap<String, Vec<Edge>>>,
}

/// The name of the parent's own node in a view: its path with `/` (`crate` for the root).
pub fn own_node(parent: &ModPath) -> String {
    if parent.is_empty() {
        "crate".to_owned()
    } else {
        parent.join("/")
    }
}

/// The name of a child's node in the view below `parent` (`store`, `server/app`).
pub fn child_node(parent: &ModPath, child: &str) -> String {
    if parent.is_empty() {
        child.to_owned()
    } else {
        format!("{}/{child}", parent.join("/"))
    }
}

impl View {
    /// The view one level below `parent`.
    pub fn new(parent: &ModPath, edges: &[Edge]) -> Self {
        let node = |m: &ModPath| -> Option<String> {
            if !m.starts_with(parent) {
                return None;
            }
            Some(
                m.get(parent.len())
                    .map_or_else(|| own_node(parent), |child| child_node(parent, child)),
            )
        };
        let mut arrows: BTreeMap<String, BTreeMap<String, Vec<Edge>>> = BTreeMap::new();
        for edge in edges {
            let (Some(from), Some(to)) = (node(&edge.from), node(&edge.to)) else {
                continue;
            };
            if from != to {
                arrows
                    .entry(from)
                    .or_default()
                    .entry(to)
                    .or_default()
                    .push(edge.clone());
            }
        }
        Self {
            parent: parent.clone(),
            arrows,
        }
    }

    /// The circles: each strongly connected component of more than one node, its nodes sorted.
    /// The parent's own node takes no part: its arrows down are the tree, its arrows up are
    /// [`View::up_arrows`].
    pub fn circles(&self) -> Vec<Vec<String>> {
        let own = own_node(&self.parent);
        let mut nodes: BTreeSet<&str> = BTreeSet::new();
        for (from, tos) in &self.arrows {
            nodes.insert(from);
            nodes.extend(tos.keys().map(String::as_str));
        }
        nodes.remove(own.as_str());
        let index: BTreeMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let names: Vec<&str> = nodes.into_iter().collect();
        let successors: Vec<Vec<usize>> = names
            .iter()
            .map(|n| {
                self.arrows
                    .get(*n)
                    .map(|tos| {
                        tos.keys()
                            .filter_map(|t| index.get(t.as_str()).copied())
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .collect();
        let mut circles: Vec<Vec<String>> = tarjan(&successors)
            .into_iter()
            .filter(|scc| scc.len() > 1)
            .map(|scc| {
                let mut members: Vec<String> =
                    scc.into_iter().map(|i| names[i].to_owned()).collect();
                members.sort();
                members
            })
            .collect();
        circles.sort();
        circles
    }

    /// The arrows from a child up to the parent's own items: a child that needs what its parent
    /// defines (rather than a sibling, or something lower) reaches back up the tree.
    pub fn up_arrows(&self) -> Vec<(&String, &[Edge])> {
        let own = own_node(&self.parent);
        self.arrows
            .iter()
            .filter_map(|(from, tos)| tos.get(&own).map(|sites| (from, sites.as_slice())))
            .collect()
    }

    /// The arrows inside `circle`, each with its sites.
    pub fn arrows_within<'a>(
        &'a self,
        circle: &'a [String],
    ) -> Vec<(&'a str, &'a str, &'a [Edge])> {
        let mut out = Vec::new();
        for (from, tos) in &self.arrows {
            if !circle.contains(from) {
                continue;
            }
            for (to, sites) in tos {
                if circle.contains(to) {
                    out.push((from.as_str(), to.as_str(), sites.as_slice()));
                }
            }
        }
        out
    }
}

/// Tarjan's strongly connected components of the graph `successors` (node `i` points to
/// `successors[i]`), iteratively (no recursion depth to run out of).
pub fn tarjan(successors: &[Vec<usize>]) -> Vec<Vec<usize>> {
    const UNSEEN: usize = usize::MAX;
    let n = successors.len();
    let mut index = vec![UNSEEN; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut next = 0;
    let mut components = Vec::new();
    for start in 0..n {
        if index[start] != UNSEEN {
            continue;
        }
        // (node, how many of its successors are done)
        let mut work = vec![(start, 0)];
        while let Some(&mut (v, ref mut done)) = work.last_mut() {
            if *done == 0 && index[v] == UNSEEN {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = successors[v].get(*done) {
                *done += 1;
                if index[w] == UNSEEN {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}
