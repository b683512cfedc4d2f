//! The graph read from small crates held in memory: each test writes the modules a reader would
//! draw by hand and checks the circles and up-arrows found against that drawing.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use super::{
    Allow,
    graph::{self, View},
    scan,
};

/// A crate of `files` (path under `src/`, text), rooted at `src/lib.rs`.
fn krate(files: &[(&str, &str)]) -> scan::Crate {
    let files: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|(p, t)| (Path::new("src").join(p), (*t).to_owned()))
        .collect();
    scan::read_crate(Path::new("src/lib.rs"), &mut |p| {
        files
            .get(p)
            .cloned()
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
    })
    .expect("the test crate reads")
}

fn circles(krate: &scan::Crate, parent: &[&str]) -> Vec<Vec<String>> {
    let parent: Vec<String> = parent.iter().map(|s| (*s).to_owned()).collect();
    View::new(&parent, &graph::edges(krate)).circles()
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn two_modules_that_use_each_other_are_a_circle() {
    let k = krate(&[
        ("lib.rs", "mod store; mod scheduler;"),
        (
            "store.rs",
            "use crate::scheduler::QuotaConfig;\npub struct Store;",
        ),
        (
            "scheduler/mod.rs",
            "pub struct QuotaConfig;\nfn f(s: &crate::store::Store) {}",
        ),
    ]);
    assert_eq!(circles(&k, &[]), vec![names(&["scheduler", "store"])]);
    // The arrow store -> scheduler is the `use` on line 1 of store.rs.
    let edges = graph::edges(&k);
    let site = edges
        .iter()
        .find(|e| e.from == names(&["store"]) && e.to == names(&["scheduler"]))
        .expect("store uses scheduler");
    assert_eq!(
        (site.file.as_path(), site.line),
        (Path::new("src/store.rs"), 1)
    );
}

#[test]
fn moving_the_shared_noun_down_breaks_the_circle() {
    let k = krate(&[
        ("lib.rs", "mod quota; mod store; mod scheduler;"),
        ("quota.rs", "pub struct QuotaConfig;"),
        (
            "store.rs",
            "use crate::quota::QuotaConfig;\npub struct Store;",
        ),
        (
            "scheduler/mod.rs",
            "pub use crate::quota::QuotaConfig;\nfn f(s: &crate::store::Store) {}",
        ),
    ]);
    assert!(circles(&k, &[]).is_empty());
}

#[test]
fn a_circle_round_three_siblings_through_super_is_found_one_level_down() {
    let k = krate(&[
        ("lib.rs", "pub mod scheduler;"),
        (
            "scheduler/mod.rs",
            "mod gang; mod pass; mod reclaim; mod fit;\npub struct Scheduler;",
        ),
        ("scheduler/gang.rs", "use super::reclaim::Reclaim;"),
        (
            "scheduler/reclaim.rs",
            "pub struct Reclaim;\nfn f() { super::pass::run(); }",
        ),
        (
            "scheduler/pass.rs",
            "use super::{gang, fit::Verdict};\npub fn run() { gang::Tried::new(); }",
        ),
        ("scheduler/fit.rs", "pub struct Verdict;"),
    ]);
    assert_eq!(
        circles(&k, &["scheduler"]),
        vec![names(&[
            "scheduler/gang",
            "scheduler/pass",
            "scheduler/reclaim"
        ])]
    );
    // At the top, the scheduler is one node: nothing to close a circle with.
    assert!(circles(&k, &[]).is_empty());
}

#[test]
fn a_parent_using_its_children_is_no_circle_and_a_child_using_the_parent_is_an_up_arrow() {
    let k = krate(&[
        ("lib.rs", "pub mod server;"),
        (
            "server/mod.rs",
            "mod app; mod config;\npub use app::App;\npub use config::Config;\npub struct ServeError;",
        ),
        (
            "server/app.rs",
            "use super::{ServeError, config::Config};\npub struct App;",
        ),
        ("server/config.rs", "pub struct Config;"),
    ]);
    let edges = graph::edges(&k);
    let view = View::new(&names(&["server"]), &edges);
    assert!(view.circles().is_empty());
    let up: Vec<&String> = view.up_arrows().into_iter().map(|(from, _)| from).collect();
    assert_eq!(up, vec!["server/app"]);
}

#[test]
fn a_name_re_exported_by_the_parent_is_an_arrow_to_the_child_that_defines_it() {
    // `config` reaches `App` through the parent's `pub use`, so config -> app: with app ->
    // config that closes a circle the re-export would otherwise hide.
    let k = krate(&[
        ("lib.rs", "pub mod server;"),
        ("server/mod.rs", "mod app; mod config;\npub use app::*;"),
        (
            "server/app.rs",
            "use super::config::Config;\npub struct App;",
        ),
        (
            "server/config.rs",
            "pub struct Config;\nfn f() -> super::App { todo!() }",
        ),
    ]);
    assert_eq!(
        circles(&k, &["server"]),
        vec![names(&["server/app", "server/config"])]
    );
}

#[test]
fn test_code_macros_and_other_crates_draw_no_arrow() {
    let k = krate(&[
        ("lib.rs", "mod a; mod b;"),
        (
            "a.rs",
            "use crate::b::B;\npub struct A;\n#[cfg(test)]\nmod tests;",
        ),
        (
            "b.rs",
            "pub struct B;\n#[cfg(test)]\nfn helper() { crate::a::A; }\n\
             #[cfg(test)]\nmod inline { use crate::a::A; }\n\
             fn g() { println!(\"{:?}\", crate::a::A); let _ = std::mem::size_of::<u8>(); }\n\
             pub(in crate::b) fn h() {}",
        ),
        // Never read: a test module.
        ("a/tests.rs", "use crate::b::B;"),
    ]);
    assert!(circles(&k, &[]).is_empty());
    assert!(!k.modules.contains_key(&names(&["a", "tests"])));
}

#[test]
fn an_alias_used_in_code_counts_where_it_lands() {
    let k = krate(&[
        ("lib.rs", "mod a; mod b;"),
        ("a.rs", "use crate::b as other;\nfn f() { other::g(); }"),
        ("b.rs", "pub fn g() {}\nfn h() { crate::a::f(); }"),
    ]);
    assert_eq!(circles(&k, &[]), vec![names(&["a", "b"])]);
}

#[test]
fn tarjan_finds_each_component() {
    // 0 -> 1 -> 2 -> 0, 2 -> 3, 3 -> 4 -> 3, 5 alone with a self-loop.
    let successors = vec![vec![1], vec![2], vec![0, 3], vec![4], vec![3], vec![5]];
    let mut components: Vec<Vec<usize>> = graph::tarjan(&successors)
        .into_iter()
        .map(|mut c| {
            c.sort_unstable();
            c
        })
        .collect();
    components.sort();
    assert_eq!(components, vec![vec![0, 1, 2], vec![3, 4], vec![5]]);
}

#[test]
fn the_allow_list_wants_a_reason_and_ignores_spacing() {
    let allow = Allow::parse("# header\n\ncrate:  a   b # too big for now\n").expect("parses");
    assert!(allow.entries.contains("crate: a b"));
    assert!(Allow::parse("crate: a b\n").is_err());
    assert!(Allow::parse("crate: a b #  \n").is_err());
}
