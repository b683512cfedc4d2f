use std::path::Path;

use gpuwarden_types::{
    policy::{ComputePolicy, MemoryPolicy, QuotaPolicy},
    target::{Target, TargetScope},
};

use super::{Grants, TargetDenied, authorize};
use crate::auth::principal::{Caller, ClientRole, Credential};

fn caller(name: &str, role: ClientRole) -> Caller {
    Caller {
        name: name.to_owned(),
        role,
        credential: Credential::Token,
        denials: std::sync::Arc::default(),
    }
}

fn policy(memory: MemoryPolicy) -> QuotaPolicy {
    QuotaPolicy {
        memory,
        compute: ComputePolicy::Hard,
    }
}

const FILE: &str = r#"
[[grants]]
owner = "alice"
cgroup_prefixes = ["/tenants/alice.slice/"]
namespaces = ["team-a"]

[[grants]]
owner = "carol"
memory_policies = ["report"]
"#;

fn grants() -> Grants {
    Grants::parse(FILE, Path::new("grants.toml")).expect("parses")
}

const POD: &str = "123e4567-e89b-12d3-a456-426614174000";

#[test]
fn a_user_without_a_grant_binds_only_what_the_system_vouches_for() {
    let bob = caller("bob", ClientRole::User);
    let g = grants();
    let kill = policy(MemoryPolicy::Kill);
    assert_eq!(
        authorize(&bob, "bob", &Target::Managed, kill, false, &g),
        Ok(TargetScope::default())
    );
    assert!(authorize(&bob, "bob", &Target::None, kill, false, &g).is_ok());
    for target in [
        Target::CgroupPath("/h1victim.slice".into()),
        Target::CgroupPath("/kubepods.slice".into()),
        Target::PodUid(POD.into()),
        Target::ContainerId("ab12".into()),
    ] {
        let err = authorize(&bob, "bob", &target, kill, false, &g).expect_err("no grant");
        let words = err.to_string();
        assert!(matches!(err, TargetDenied::NotGranted { .. }), "{words}");
        assert!(
            words.contains("\"bob\"") && words.contains(&target.to_string()),
            "{words}"
        );
    }
}

#[test]
fn a_user_binds_inside_its_grants_and_nowhere_else() {
    let alice = caller("alice", ClientRole::User);
    let g = grants();
    let kill = policy(MemoryPolicy::Kill);
    let scope = authorize(
        &alice,
        "alice",
        &Target::CgroupPath("/tenants/alice.slice/job-1".into()),
        kill,
        false,
        &g,
    )
    .expect("inside the prefix");
    assert_eq!(scope.cgroup_prefixes, ["/tenants/alice.slice"]);
    assert_eq!(scope.namespaces, ["team-a"]);
    assert!(!scope.admin);
    let err = authorize(
        &alice,
        "alice",
        &Target::CgroupPath("/tenants/alice.slice2".into()),
        kill,
        false,
        &g,
    )
    .expect_err("a sibling with the same start");
    assert!(err.to_string().contains("outside the granted"), "{err}");
    // A pod target is admitted here; its namespace is checked on the node.
    assert!(
        authorize(
            &alice,
            "alice",
            &Target::PodUid(POD.into()),
            kill,
            false,
            &g
        )
        .is_ok()
    );
    let err = authorize(&alice, "alice", &Target::Managed, kill, true, &g)
        .expect_err("users are never unconfined");
    assert!(matches!(err, TargetDenied::Unconfined { .. }), "{err}");
}

#[test]
fn a_user_picks_only_the_memory_policies_it_was_granted() {
    let g = grants();
    let bob = caller("bob", ClientRole::User);
    let err = authorize(
        &bob,
        "bob",
        &Target::Managed,
        policy(MemoryPolicy::Report),
        false,
        &g,
    )
    .expect_err("report is not granted by default");
    assert!(err.to_string().contains("report") && err.to_string().contains("kill, stop"));
    assert!(
        authorize(
            &bob,
            "bob",
            &Target::Managed,
            policy(MemoryPolicy::Stop),
            false,
            &g
        )
        .is_ok()
    );
    let carol = caller("carol", ClientRole::User);
    assert!(
        authorize(
            &carol,
            "carol",
            &Target::Managed,
            policy(MemoryPolicy::Report),
            false,
            &g
        )
        .is_ok()
    );
    assert!(
        authorize(
            &carol,
            "carol",
            &Target::Managed,
            policy(MemoryPolicy::Kill),
            false,
            &g
        )
        .is_err()
    );
}

#[test]
fn an_admin_binds_anything_and_says_when_it_is_not_a_workload() {
    let ops = caller("ops", ClientRole::Admin);
    let g = grants();
    let scope = authorize(
        &ops,
        "bob",
        &Target::CgroupPath("/system.slice/x.service".into()),
        policy(MemoryPolicy::Report),
        true,
        &g,
    )
    .expect("admin");
    assert_eq!(scope, TargetScope::admin(true));
}

#[test]
fn bad_grant_files_are_refused_with_the_entry() {
    for (text, words) in [
        ("[[grants]]\nowner = \"a b\"\n", "entry 1: owner"),
        (
            "[[grants]]\nowner = \"a\"\ncgroup_prefixes = [\"rel\"]\n",
            "not absolute",
        ),
        (
            "[[grants]]\nowner = \"a\"\ncgroup_prefixes = [\"/\"]\n",
            "every cgroup",
        ),
        (
            "[[grants]]\nowner = \"a\"\nnamespaces = [\"Team_A\"]\n",
            "not a DNS label",
        ),
        (
            "[[grants]]\nowner = \"a\"\n[[grants]]\nowner = \"a\"\n",
            "entry 2: owner \"a\" has an earlier entry",
        ),
        (
            "[[grants]]\nowner = \"a\"\nmemory_policies = [\"maybe\"]\n",
            "maybe",
        ),
        ("[[grants]]\nowner = \"a\"\nroot = true\n", "root"),
    ] {
        let err = Grants::parse(text, Path::new("g.toml"))
            .expect_err(text)
            .to_string();
        assert!(
            err.contains("g.toml") && err.contains(words),
            "{text}: {err}"
        );
    }
}
