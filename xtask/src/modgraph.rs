//! `cargo xtask modgraph`: the import circles between the modules of each
//! workspace crate, read from the sources (part of `test`).
//!
//! An edge "A uses B" is any path A names that lands in B: `use crate::…`, `use super::…`, `use
//! self::…`, a child module's name, and such paths in code (`crate::x::f()`), followed through
//! re-exports and globs to the module that defines the item. Test code is not read (tests may
//! reach anywhere), nor macro bodies.
//!
//! The edges are judged in views, one per module that has submodules (the crate root included):
//! in the view below module `P`, each child `P/x` stands for itself and everything under it, and
//! `P`'s own items (its `mod.rs`) are the node `P`.
//!
//! - A **circle** is a strongly connected component (Tarjan) of more than one child: siblings
//!   that reach each other, directly or round a ring. Each fails the check unless
//!   `xtask/modgraph.allow` lists it with a reason; an entry that no longer matches fails too,
//!   so the list only shrinks. The parent's node takes no part: a parent using its children
//!   (`pub use x::Thing`) is the tree itself.
//! - An **up-arrow** is a child using its parent's own items (`use super::Thing`, `Thing`
//!   defined in `P/mod.rs`): the common Rust shape of a type whose `impl` is spread over child
//!   files, so it is counted, and listed with `--up`, but does not fail the check.
//!
//! Not seen: method calls (`self.pass_gang()` on a type defined elsewhere) and paths inside macro
//! invocations; both need more than the syntax.

mod graph;
mod scan;
#[cfg(test)]
mod tests;

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};

use crate::{cargo, workspace};

use graph::{Edge, View};

/// The allow-list, beside this crate's manifest.
const ALLOW: &str = "xtask/modgraph.allow";

/// Reads every library and binary of the workspace, prints each circle (and with `up` each
/// up-arrow) with the lines that make it, and fails on a circle the allow-list does not name.
///
/// `root`: another checkout to measure (an older commit, to compare); its allow-list counts
/// when it has one. Default: this workspace.
pub fn run(up: bool, root: Option<&Path>) -> anyhow::Result<()> {
    let root = root.map_or_else(workspace, Path::to_owned);
    let allow_text = match std::fs::read_to_string(root.join(ALLOW)) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && root != workspace() => String::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {ALLOW}")),
    };
    let allow = Allow::parse(&allow_text)?;
    let mut findings = Vec::new();
    for (name, src) in targets(&root)? {
        let krate = scan::read_crate(&src, &mut |p| std::fs::read_to_string(p))
            .with_context(|| format!("reading {name}"))?;
        findings.extend(check(&name, &krate, &root));
    }
    let mut report = String::new();
    let mut failed = 0;
    for finding in &findings {
        let verdict = match finding.kind {
            Kind::UpArrow if !up => continue,
            Kind::UpArrow => "counted",
            Kind::Circle if allow.entries.contains(&finding.key) => "allowed",
            Kind::Circle => {
                failed += 1;
                "NEW"
            }
        };
        let _ = writeln!(report, "{}: {} ({verdict})", finding.kind, finding.key);
        report.push_str(&finding.detail);
    }
    let found: BTreeSet<&String> = findings
        .iter()
        .filter(|f| f.kind == Kind::Circle)
        .map(|f| &f.key)
        .collect();
    let stale: Vec<&String> = allow
        .entries
        .iter()
        .filter(|e| !found.contains(e))
        .collect();
    for entry in &stale {
        let _ = writeln!(
            report,
            "stale: {entry} is in {ALLOW} but no longer found: remove it"
        );
    }
    print!("{report}");
    println!(
        "modgraph: {} circles ({} allowed in {ALLOW}), {} up-arrows (child to parent; --up lists them)",
        found.len(),
        found.len() - failed,
        findings.iter().filter(|f| f.kind == Kind::UpArrow).count(),
    );
    if failed > 0 || !stale.is_empty() {
        bail!(
            "{failed} new import circle(s), {} stale allow-list entr(y/ies): move the shared \
             noun down to a module both sides can use (see xtask/src/modgraph.rs)",
            stale.len()
        );
    }
    Ok(())
}

/// What a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Circle,
    UpArrow,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Circle => "circle",
            Kind::UpArrow => "up-arrow",
        })
    }
}

/// One circle or up-arrow.
#[derive(Debug)]
struct Finding {
    kind: Kind,
    /// How the allow-list names it: `crate: a b c` (a circle's nodes, sorted); `crate: a -> b`.
    key: String,
    /// The arrows that make it, with the first line of each (and how many more).
    detail: String,
}

/// The circles and up-arrows of `krate` (named `name`) in every view; files shown relative to
/// `root`.
fn check(name: &str, krate: &scan::Crate, root: &Path) -> Vec<Finding> {
    let edges = graph::edges(krate);
    let mut findings = Vec::new();
    for (parent, module) in &krate.modules {
        if module.children.is_empty() {
            continue;
        }
        let view = View::new(parent, &edges);
        for circle in view.circles() {
            let mut detail = String::new();
            for (from, to, sites) in view.arrows_within(&circle) {
                let _ = writeln!(detail, "  {from} -> {to}  {}", sites_text(sites, root));
            }
            findings.push(Finding {
                kind: Kind::Circle,
                key: format!("{name}: {}", circle.join(" ")),
                detail,
            });
        }
        for (from, sites) in view.up_arrows() {
            let to = graph::own_node(parent);
            findings.push(Finding {
                kind: Kind::UpArrow,
                key: format!("{name}: {from} -> {to}"),
                detail: format!("  {from} -> {to}  {}\n", sites_text(sites, root)),
            });
        }
    }
    findings
}

/// `file:line` of the first site, and how many others there are.
fn sites_text(sites: &[Edge], root: &Path) -> String {
    let Some(first) = sites.first() else {
        return String::new();
    };
    let file = first.file.strip_prefix(root).unwrap_or(&first.file);
    match sites.len() {
        1 => format!("{}:{}", file.display(), first.line),
        n => format!("{}:{} (+{} more)", file.display(), first.line, n - 1),
    }
}

/// The allow-list: `crate: a b c  # reason` (a circle's nodes, sorted), one a line.
#[derive(Debug, Default)]
struct Allow {
    entries: BTreeSet<String>,
}

impl Allow {
    fn parse(text: &str) -> anyhow::Result<Self> {
        let mut entries = BTreeSet::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((key, reason)) = line.split_once('#') else {
                bail!("{ALLOW}:{}: an entry needs a reason after `#`", i + 1);
            };
            if reason.trim().is_empty() {
                bail!("{ALLOW}:{}: an entry needs a reason after `#`", i + 1);
            }
            let key = key.split_whitespace().collect::<Vec<_>>().join(" ");
            entries.insert(key);
        }
        Ok(Self { entries })
    }
}

/// The libraries and binaries of the workspace at `root`: `(name, root file)`.
fn targets(root: &Path) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let out = cargo()
        .current_dir(root)
        .args(["metadata", "--no-deps", "--format-version=1", "--offline"])
        .output()
        .context("cannot run cargo metadata")?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let mut targets = Vec::new();
    for package in meta["packages"].as_array().into_iter().flatten() {
        for target in package["targets"].as_array().into_iter().flatten() {
            let kinds: Vec<&str> = target["kind"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(serde_json::Value::as_str)
                .collect();
            if !kinds
                .iter()
                .any(|k| matches!(*k, "lib" | "bin" | "proc-macro"))
            {
                continue;
            }
            let (Some(name), Some(src)) = (target["name"].as_str(), target["src_path"].as_str())
            else {
                continue;
            };
            let label = if kinds.contains(&"bin") {
                format!("{} (bin {name})", package["name"].as_str().unwrap_or(name))
            } else {
                package["name"].as_str().unwrap_or(name).to_owned()
            };
            targets.push((label, PathBuf::from(src)));
        }
    }
    targets.sort();
    Ok(targets)
}
