use gpuwarden_types::target::{Target, TargetScope};

use super::*;
use crate::enforcement::quota::{ComputePolicy, MemoryPolicy, QuotaSpec};

const POD: &str = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod123e4567_e89b_12d3_a456_426614174000.slice";
const CONTAINER: &str =
    "/system.slice/docker-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope";

fn quota(session: &str, target: Target, scope: TargetScope) -> QuotaSpec {
    QuotaSpec {
        session_id: session.into(),
        target,
        scope,
        memory_policy: MemoryPolicy::Kill,
        compute_policy: ComputePolicy::Hard,
        devices: vec![],
    }
}

fn admin(path: &str, unconfined: bool) -> QuotaSpec {
    quota(
        "s",
        Target::CgroupPath(path.into()),
        TargetScope::admin(unconfined),
    )
}

#[test]
fn session_ids_that_could_name_another_directory_are_refused() {
    for ok in ["s-1", "k8s-123e4567-e89b-12d3-a456-426614174000", "a.b_c"] {
        assert_eq!(check_session_id(ok), Ok(()), "{ok}");
    }
    for bad in [
        "",
        ".",
        "..",
        "../../system.slice",
        "a/b",
        "x\0y",
        &"a".repeat(129),
    ] {
        let err = check_session_id(bad).expect_err(bad).to_string();
        assert!(err.starts_with("session id"), "{err}");
    }
}

#[test]
fn the_root_and_system_cgroups_are_refused_whoever_asks() {
    for path in [
        "/",
        "/system.slice",
        "/user.slice",
        "/init.scope",
        "/kubepods.slice",
        "/kubepods.slice/kubepods-burstable.slice",
        "/kubepods/besteffort",
        "/gpuwarden",
    ] {
        let err = check_allocation(&admin(path, true), [], None).expect_err(path);
        assert!(
            matches!(err, Refusal::Root | Refusal::System { .. }),
            "{path}: {err}"
        );
    }
}

#[test]
fn a_cgroup_that_is_no_workloads_needs_an_admins_word_or_a_granted_prefix() {
    let err = check_allocation(&admin("/h1victim.slice", false), [], None).expect_err("no word");
    assert!(matches!(err, Refusal::NotWorkload { .. }), "{err}");
    assert_eq!(
        check_allocation(&admin("/h1victim.slice", true), [], None),
        Ok(())
    );
    assert_eq!(
        check_allocation(&admin("/system.slice/my.service", true), [], None),
        Ok(())
    );
    // Workloads need no word.
    for path in [POD, CONTAINER, "/gpuwarden/s-1"] {
        assert_eq!(
            check_allocation(&admin(path, false), [], None),
            Ok(()),
            "{path}"
        );
    }
    // A user inside its granted prefix: the grant is the admin's word.
    let granted = TargetScope {
        cgroup_prefixes: vec!["/tenants/alice.slice".into()],
        ..TargetScope::default()
    };
    let mine = quota(
        "s",
        Target::CgroupPath("/tenants/alice.slice/job".into()),
        granted.clone(),
    );
    assert_eq!(check_allocation(&mine, [], None), Ok(()));
    // Outside it (a controller that let it through): refused here all the same.
    let theirs = quota("s", Target::CgroupPath(CONTAINER.into()), granted);
    let err = check_allocation(&theirs, [], None).expect_err("outside the scope");
    assert!(matches!(err, Refusal::OutsideScope(_)), "{err}");
}

#[test]
fn the_agents_own_cgroup_and_those_above_it_are_refused() {
    let agent = Some("/system.slice/gpuwarden-agent.service");
    for path in [
        "/system.slice/gpuwarden-agent.service",
        "/system.slice/gpuwarden-agent.service/",
    ] {
        let err = check_allocation(&admin(path, true), [], agent).expect_err(path);
        assert!(matches!(err, Refusal::HoldsAgent { .. }), "{err}");
    }
    // A sibling is fine.
    assert_eq!(
        check_allocation(&admin("/system.slice/other.service", true), [], agent),
        Ok(())
    );
}

#[test]
fn a_target_overlapping_a_held_one_is_refused() {
    let held = [
        quota(
            "a",
            Target::CgroupPath("/jobs/a".into()),
            TargetScope::admin(true),
        ),
        quota("p", Target::PodUid("u".into()), TargetScope::admin(false)),
    ];
    for (target, other) in [
        (Target::CgroupPath("/jobs/a/inner".into()), "a"),
        (Target::CgroupPath("/jobs".into()), "a"),
        (Target::PodUid("u".into()), "p"),
    ] {
        let new = quota("b", target.clone(), TargetScope::admin(true));
        let err = check_allocation(&new, &held, None).expect_err(&target.to_string());
        assert!(
            matches!(&err, Refusal::Overlap { other: o, .. } if o == other),
            "{target}: {err}"
        );
    }
    // The same session again (a re-sent allocation) is no overlap.
    let again = quota(
        "a",
        Target::CgroupPath("/jobs/a".into()),
        TargetScope::admin(true),
    );
    assert_eq!(check_allocation(&again, &held, None), Ok(()));
    // Nor is a sibling.
    let sibling = quota(
        "c",
        Target::CgroupPath("/jobs/ab".into()),
        TargetScope::admin(true),
    );
    assert_eq!(check_allocation(&sibling, &held, None), Ok(()));
}

#[test]
fn a_users_container_outside_any_pod_is_refused_at_binding() {
    let rules = Rules::default();
    let spec = quota(
        "s",
        Target::ContainerId("0123".into()),
        TargetScope {
            namespaces: vec!["team-a".into()],
            ..TargetScope::default()
        },
    );
    assert!(matches!(
        rules.check_bind(&spec, CONTAINER, []),
        Verdict::Refuse(Refusal::NotInPod { .. })
    ));
    // A pod, but no kubelet to ask: refused, naming the setting.
    let pod = quota(
        "s",
        Target::PodUid("123e4567-e89b-12d3-a456-426614174000".into()),
        spec.scope.clone(),
    );
    let Verdict::Refuse(r) = rules.check_bind(&pod, POD, []) else {
        panic!("bound without a kubelet");
    };
    assert!(r.to_string().contains("[kubelet]"), "{r}");
    // An admin's pod needs no namespace.
    let admins = quota("s", pod.target.clone(), TargetScope::admin(false));
    assert_eq!(rules.check_bind(&admins, POD, []), Verdict::Bind);
}

const MINE: &str = "123e4567-e89b-12d3-a456-426614174000";
const THEIRS_UID: &str = "223e4567-e89b-12d3-a456-426614174000";
const LATER: &str = "323e4567-e89b-12d3-a456-426614174000";

/// A kubelet that knows two pods: `mine` in team-a, `theirs` in team-b.
struct TwoPods;

impl PodNamespaces for TwoPods {
    fn lookup(&self, uid: &str) -> PodLookup {
        let known = |namespace: &str, name: &str| PodLookup::Known {
            namespace: namespace.into(),
            name: name.into(),
        };
        match uid {
            MINE => known("team-a", "train-0"),
            THEIRS_UID => known("team-b", "victim"),
            _ => PodLookup::Unknown,
        }
    }
}

fn alice(session: &str, target: Target) -> QuotaSpec {
    quota(
        session,
        target,
        TargetScope {
            namespaces: vec!["team-a".into()],
            ..TargetScope::default()
        },
    )
}

#[test]
fn a_users_pod_outside_its_namespaces_is_refused_on_arrival_naming_nothing_of_it() {
    let err = authorize_at_arrival(&alice("s", Target::PodUid(THEIRS_UID.into())), &TwoPods)
        .expect_err("another namespace's pod");
    let text = err.to_string();
    assert!(matches!(err, Refusal::Namespace { .. }), "{text}");
    assert!(
        text.contains(THEIRS_UID) && text.contains("team-a"),
        "{text}"
    );
    assert!(
        !text.contains("team-b") && !text.contains("victim"),
        "{text}"
    );
    assert_eq!(
        authorize_at_arrival(&alice("s", Target::PodUid(MINE.into())), &TwoPods),
        Ok(())
    );
    // Not known yet: held, authorized at binding.
    assert_eq!(
        authorize_at_arrival(&alice("s", Target::PodUid(LATER.into())), &TwoPods),
        Ok(())
    );
    // No kubelet: nothing could ever authorize it.
    assert!(matches!(
        authorize_at_arrival(&alice("s", Target::PodUid(MINE.into())), &NoPods),
        Err(Refusal::NoKubelet { .. })
    ));
    // An admin's pod needs no namespace.
    let admins = quota(
        "s",
        Target::PodUid(THEIRS_UID.into()),
        TargetScope::admin(false),
    );
    assert_eq!(authorize_at_arrival(&admins, &NoPods), Ok(()));
}

#[test]
fn a_users_unauthorized_holding_stands_in_nobodys_way() {
    let admins = |uid: &str| quota("adm", Target::PodUid(uid.into()), TargetScope::admin(false));
    let pending = alice("squat", Target::PodUid(LATER.into()));
    let authorized = alice("own", Target::PodUid(MINE.into()));
    let container = alice("c", Target::ContainerId("0123".into()));
    // The squatter's pod is not known to be alice's: it counts for nobody.
    assert!(!counts_at_arrival(&admins(LATER), &pending, &TwoPods));
    assert!(!counts_at_arrival(
        &alice("x", Target::PodUid(LATER.into())),
        &pending,
        &TwoPods
    ));
    assert!(!counts_at_arrival(
        &alice("x", container.target.clone()),
        &container,
        &TwoPods
    ));
    // Alice's own pod counts for another user's quota, never for an admin's.
    assert!(counts_at_arrival(
        &alice("x", Target::PodUid(MINE.into())),
        &authorized,
        &TwoPods
    ));
    assert!(!counts_at_arrival(&admins(MINE), &authorized, &TwoPods));
    // An admin's holding counts for everyone.
    assert!(counts_at_arrival(&pending, &admins(LATER), &TwoPods));
    assert!(counts_at_arrival(&admins(LATER), &admins(LATER), &TwoPods));
}

#[test]
fn a_users_pod_is_authorized_before_overlap_is_judged_at_binding() {
    const THEIRS: &str = "/kubepods.slice/kubepods-pod223e4567_e89b_12d3_a456_426614174000.slice";
    let rules = Rules::new(None, Box::new(TwoPods));
    let spec = alice("s", Target::PodUid(THEIRS_UID.into()));
    // Another session is bound there: the refusal is about the namespace, not the other.
    let Verdict::Refuse(r) = rules.check_bind(&spec, THEIRS, [("s-other", THEIRS)]) else {
        panic!("bound in another namespace");
    };
    assert!(matches!(r, Refusal::Namespace { .. }), "{r}");
    // An overlap names neither the other session nor its cgroup.
    let admins = quota(
        "s",
        Target::PodUid(THEIRS_UID.into()),
        TargetScope::admin(false),
    );
    let Verdict::Refuse(r) = rules.check_bind(&admins, THEIRS, [("s-other", THEIRS)]) else {
        panic!("bound over another session");
    };
    assert!(matches!(r, Refusal::Overlap { .. }), "{r}");
    assert!(!r.to_string().contains("s-other"), "{r}");
}
